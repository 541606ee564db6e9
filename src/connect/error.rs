//! `connect`'s one error type. Whose fault a failure is and whether trying
//! again helps are the crate's [`Fault`] and [`RetryHint`] ([`Classify`]);
//! the cause (the Kafka client's error, the HTTP client's, the I/O error)
//! is its [`source`](std::error::Error::source).

use std::net::{AddrParseError, SocketAddr};

pub use crate::error::{Classify, Fault, KafkaCause, RetryHint};

/// A failure of `connect`: at start (returned by [`crate::connect::run`];
/// `main` exits with status 2 for the user's, 1 otherwise), of a request's
/// produce (a 503 answer), or of a Label Studio call of the sync or the
/// routing (logged; the call is tried again).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A configured address that is not one (`connect.listen`): the
    /// user's. Not retriable.
    #[error("{key}")]
    Address {
        key: &'static str,
        #[source]
        source: AddrParseError,
    },
    /// `connect.listen` cannot be bound (in use, no permission): the
    /// user's. Not retriable.
    #[error("cannot listen on connect.listen {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The Kafka producer cannot be created: a property librdkafka
    /// rejects (`kafka.properties`), the user's. Not retriable.
    #[error("cannot create the Kafka producer")]
    Client(#[source] KafkaCause),
    /// The input topic does not exist: the user's (or `run` has not
    /// created it yet). Not retriable as it is.
    #[error(
        "topic {topic} does not exist (create it, or start `jurystream run` with kafka.create_topics)"
    )]
    MissingTopic { topic: String },
    /// The broker did not take or acknowledge votes in time, or is
    /// unreachable: the broker's. Retriable (`run` drops the votes it
    /// already has).
    #[error("{what}")]
    Broker {
        what: String,
        #[source]
        source: Option<KafkaCause>,
    },
    /// A thread cannot be started (the process is out of threads or
    /// memory): this process's. Retriable: the limit may be free later.
    #[error("cannot start the {thread} thread")]
    Thread {
        thread: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A Label Studio call got no answer (refused, reset, timed out):
    /// the server's or the network's. Retriable.
    #[error("{call}")]
    Unanswered {
        /// "METHOD URL".
        call: String,
        #[source]
        source: Box<ureq::Error>,
    },
    /// Label Studio answered `call` with an error status: a 5xx or 429 is
    /// the server's and retriable; any other (a refused token, a bad
    /// request, a URL that is not Label Studio's API: a 404 where a list
    /// was expected) the configuration's, not retriable.
    #[error("{call}: {status} {body}")]
    Answer {
        call: String,
        status: u16,
        /// The answer's start.
        body: String,
    },
    /// `label_studio.token`, a personal access token, was refused when
    /// exchanged for an access token: the configuration's (not
    /// retriable), unless Label Studio answered a 5xx (retriable).
    #[error("label_studio.token: the personal access token was refused ({status}): {body}")]
    TokenRefused { status: u16, body: String },
}

impl ConnectError {
    /// A broker failure with the client's error.
    pub fn broker(what: impl Into<String>, e: rdkafka::error::KafkaError) -> Self {
        ConnectError::Broker {
            what: what.into(),
            source: Some(e.into()),
        }
    }

    /// A broker failure the client did not report as an error (a full
    /// queue, no acknowledgement in time).
    pub fn broker_without_cause(what: impl Into<String>) -> Self {
        ConnectError::Broker {
            what: what.into(),
            source: None,
        }
    }

    /// A Label Studio call without an answer.
    pub fn unanswered(call: impl Into<String>, e: ureq::Error) -> Self {
        ConnectError::Unanswered {
            call: call.into(),
            source: Box::new(e),
        }
    }
}

/// Whether Label Studio's error `status` is the server's (retriable).
fn server_status(status: u16) -> bool {
    status >= 500 || status == 429
}

impl Classify for ConnectError {
    fn fault(&self) -> Fault {
        match self {
            ConnectError::Address { .. }
            | ConnectError::Listen { .. }
            | ConnectError::Client(_)
            | ConnectError::MissingTopic { .. } => Fault::Usage,
            ConnectError::Broker { .. } => Fault::Broker,
            ConnectError::Thread { .. } => Fault::Internal,
            ConnectError::Unanswered { .. } => Fault::Server,
            ConnectError::Answer { status, .. } | ConnectError::TokenRefused { status, .. } => {
                if server_status(*status) {
                    Fault::Server
                } else {
                    Fault::Usage
                }
            }
        }
    }

    fn retry(&self) -> RetryHint {
        match self {
            ConnectError::Address { .. }
            | ConnectError::Listen { .. }
            | ConnectError::Client(_)
            | ConnectError::MissingTopic { .. } => RetryHint::NoRetry,
            ConnectError::Broker { .. }
            | ConnectError::Thread { .. }
            | ConnectError::Unanswered { .. } => RetryHint::WithBackoff,
            ConnectError::Answer { status, .. } => RetryHint::from_bool(server_status(*status)),
            // As before: a 429 to the token exchange is not retried.
            ConnectError::TokenRefused { status, .. } => RetryHint::from_bool(*status >= 500),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::chain;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};

    #[test]
    fn start_failures_are_the_users_except_a_thread() {
        let bad = ConnectError::Address {
            key: "connect.listen",
            source: "nope".parse::<SocketAddr>().unwrap_err(),
        };
        assert_eq!(
            (bad.fault(), bad.retry()),
            (Fault::Usage, RetryHint::NoRetry)
        );
        assert_eq!(chain(&bad), "connect.listen: invalid socket address syntax");

        let listen = ConnectError::Listen {
            addr: "127.0.0.1:8080".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(listen.fault(), Fault::Usage);
        assert!(!listen.is_retriable());
        assert_eq!(
            chain(&listen),
            format!(
                "cannot listen on connect.listen 127.0.0.1:8080: {}",
                std::io::Error::from(std::io::ErrorKind::AddrInUse)
            )
        );

        // A thread that cannot start is this process's, and may start later.
        let thread = ConnectError::Thread {
            thread: "sync",
            source: std::io::Error::other("out of threads"),
        };
        assert_eq!(thread.fault(), Fault::Internal);
        assert_eq!(thread.retry(), RetryHint::WithBackoff);
        assert_eq!(
            chain(&thread),
            "cannot start the sync thread: out of threads"
        );

        let client = ConnectError::Client(
            KafkaError::ClientCreation("No such configuration property: \"x\"".into()).into(),
        );
        assert_eq!(client.fault(), Fault::Usage);
        assert!(!client.is_retriable());
        assert!(chain(&client).starts_with("cannot create the Kafka producer: "));
    }

    #[test]
    fn broker_failures_are_retried_and_print_the_cause_once() {
        let cause = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        let e = ConnectError::broker("not acknowledged", cause.clone());
        assert_eq!(e.fault(), Fault::Broker);
        assert_eq!(e.retry(), RetryHint::WithBackoff);
        assert_eq!(e.to_string(), "not acknowledged");
        let text = chain(&e);
        assert_eq!(text, format!("not acknowledged: {cause}"));
        assert_eq!(text.matches("MessageTimedOut").count(), 1, "{text}");

        let full = ConnectError::broker_without_cause("the producer queue stayed full");
        assert!(full.is_retriable());
        assert_eq!(chain(&full), "the producer queue stayed full");
    }

    #[test]
    fn label_studio_answers_are_classified_by_status() {
        let answer = |status| ConnectError::Answer {
            call: "GET http://ls/api/projects/".into(),
            status,
            body: "{}".into(),
        };
        for status in [500, 502, 503, 429] {
            let e = answer(status);
            assert_eq!(
                (e.fault(), e.retry()),
                (Fault::Server, RetryHint::WithBackoff)
            );
        }
        for status in [400, 401, 403, 404] {
            let e = answer(status);
            assert_eq!((e.fault(), e.retry()), (Fault::Usage, RetryHint::NoRetry));
        }
        assert_eq!(
            answer(503).to_string(),
            "GET http://ls/api/projects/: 503 {}"
        );

        let refused = ConnectError::TokenRefused {
            status: 401,
            body: "{\"detail\":\"invalid\"}".into(),
        };
        assert_eq!(refused.fault(), Fault::Usage);
        assert!(!refused.is_retriable());
        let down = ConnectError::TokenRefused {
            status: 502,
            body: String::new(),
        };
        assert_eq!(
            (down.fault(), down.retry()),
            (Fault::Server, RetryHint::WithBackoff)
        );
    }
}
