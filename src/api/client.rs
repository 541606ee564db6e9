//! `jurystream query`: the query API's command-line client, one GET of
//! a route with the bearer token, the answer pretty-printed.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{StatusCode, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::http::{http_get, GetError};
use crate::error::{Classify, Fault, RetryHint};

/// A failure of `jurystream query`.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The client's runtime cannot start (the process is out of threads
    /// or file descriptors): this process's. Retriable.
    #[error("cannot start the HTTP client")]
    Runtime(#[source] std::io::Error),
    /// `--url` is not an `http://host:port` URL: the user's. Not
    /// retriable.
    #[error("{url}: not an http://HOST:PORT URL")]
    BadUrl {
        url: String,
        #[source]
        source: Option<axum::http::uri::InvalidUri>,
    },
    /// The request failed: no connection (refused, reset), a broken
    /// answer. The service's or the network's; retriable.
    #[error("{url}")]
    Request {
        url: String,
        #[source]
        source: GetError,
    },
    /// No answer within 30 s: the service's (overloaded) or the
    /// network's. Retriable.
    #[error("{url}: no answer within 30 s")]
    Timeout { url: String },
    /// An error answer, `body` its JSON pretty-printed (the message is
    /// what the command prints). A 4xx (400 a bad id, 401 a wrong token,
    /// 404 an unknown inference) is the user's and not retriable; a 5xx
    /// the service's, retriable when it says so (503 while a partition
    /// restores, 502, 504; and 429).
    #[error("{url}: {status}\n{body}")]
    Answer {
        url: String,
        status: StatusCode,
        body: String,
    },
}

impl Classify for QueryError {
    fn fault(&self) -> Fault {
        match self {
            QueryError::Runtime(_) => Fault::Internal,
            QueryError::BadUrl { .. } => Fault::Usage,
            QueryError::Request { .. } | QueryError::Timeout { .. } => Fault::Server,
            QueryError::Answer { status, .. } if status.is_client_error() => Fault::Usage,
            QueryError::Answer { .. } => Fault::Server,
        }
    }

    /// Whether asking again (later) can help: see each variant.
    fn retry(&self) -> RetryHint {
        RetryHint::from_bool(match self {
            QueryError::Runtime(_) | QueryError::Request { .. } | QueryError::Timeout { .. } => {
                true
            }
            QueryError::BadUrl { .. } => false,
            QueryError::Answer { status, .. } => matches!(
                *status,
                StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::BAD_GATEWAY
                    | StatusCode::GATEWAY_TIMEOUT
                    | StatusCode::TOO_MANY_REQUESTS
            ),
        })
    }
}

/// `jurystream query`: one GET, the answer pretty-printed on stdout; an
/// error status is an error (its JSON on stderr).
pub fn query(url: &str, path: &str, token: Option<&str>) -> Result<String, QueryError> {
    let full = format!("{}{path}", url.trim_end_matches('/'));
    match full.parse::<Uri>() {
        Ok(u) if u.scheme_str() == Some("http") && u.authority().is_some() => {}
        Ok(_) => {
            return Err(QueryError::BadUrl {
                url: full,
                source: None,
            })
        }
        Err(e) => {
            return Err(QueryError::BadUrl {
                url: full,
                source: Some(e),
            })
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(QueryError::Runtime)?;
    rt.block_on(async {
        let client: Client<HttpConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let (status, body) =
            match tokio::time::timeout(Duration::from_secs(30), http_get(&client, &full, token))
                .await
            {
                Err(_) => return Err(QueryError::Timeout { url: full }),
                Ok(Err(source)) => return Err(QueryError::Request { url: full, source }),
                Ok(Ok(answer)) => answer,
            };
        let pretty = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        if status.is_success() {
            Ok(pretty)
        } else {
            Err(QueryError::Answer {
                url: full,
                status,
                body: pretty,
            })
        }
    })
}

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn error_answers_print_url_status_and_body_and_are_classified_by_status() {
        let missing = QueryError::Answer {
            url: "http://127.0.0.1:9464/v1/inferences/x".into(),
            status: StatusCode::NOT_FOUND,
            body: "{\n  \"error\": \"unknown inference\"\n}".into(),
        };
        assert_eq!(
            missing.to_string(),
            "http://127.0.0.1:9464/v1/inferences/x: 404 Not Found\n{\n  \"error\": \"unknown inference\"\n}"
        );
        assert_eq!(missing.fault(), Fault::Usage);
        assert!(!missing.is_retriable());

        let restoring = QueryError::Answer {
            url: "u".into(),
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: String::new(),
        };
        assert_eq!(restoring.fault(), Fault::Server);
        assert!(restoring.is_retriable());

        let slow = QueryError::Timeout {
            url: "http://h:1/v1/rubrics".into(),
        };
        assert_eq!(
            slow.to_string(),
            "http://h:1/v1/rubrics: no answer within 30 s"
        );
        assert!(slow.is_retriable());
    }

    #[test]
    fn a_bad_url_is_the_users_and_a_refused_connection_retriable() {
        let err = query("https://127.0.0.1:1", "/v1/rubrics", None).unwrap_err();
        assert!(matches!(err, QueryError::BadUrl { .. }), "{err:?}");
        assert_eq!(err.fault(), Fault::Usage);
        assert!(!err.is_retriable());
        assert!(
            err.to_string()
                .starts_with("https://127.0.0.1:1/v1/rubrics: not an http://HOST:PORT URL"),
            "{err}"
        );

        // Nothing listens on port 1.
        let err = query("http://127.0.0.1:1/", "/v1/rubrics", None).unwrap_err();
        assert!(matches!(err, QueryError::Request { .. }), "{err:?}");
        assert_eq!(err.fault(), Fault::Server);
        assert!(err.is_retriable());
        // The cause is the request's, kept as the error's source.
        assert_eq!(err.to_string(), "http://127.0.0.1:1/v1/rubrics");
        let text = crate::error::chain(&err);
        assert!(
            text.starts_with("http://127.0.0.1:1/v1/rubrics: request failed: "),
            "{text}"
        );
    }
}
