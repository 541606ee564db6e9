//! What a query API request's path and query string parse to (contract §9):
//! the strict id extractor ([`Id`]), one query struct per route behind
//! [`Params`], which refuses unknown parameters, and [`canonical_query`]
//! (pure, fuzzed in `fuzz/`). Rejections are the API's JSON 400s
//! ([`error`], every error answer of the API).

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use percent_encoding::percent_decode_str;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::{malformed_escape, VoterOrder};

/// A JSON error answer.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

/// Longest id (contract §1).
const MAX_ID_BYTES: usize = 256;

/// The rejection handler: an extractor's refusal (a bad query string or
/// path parameter: 400) as the API's JSON error, with its status.
pub(super) fn rejected(status: StatusCode, text: String) -> Response {
    error(status, text)
}

pub(super) fn bad_request(message: String) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// The `{inference_id}` or `{voter_id}` of a route: axum's `Path`, strict.
/// An id that is not UTF-8 once decoded is a 400 (axum's rejection), and
/// so is a malformed `%` escape in the raw segment (see
/// [`malformed_escape`]), an empty id or one over 256 bytes (contract §1).
/// Messages name the parameter as the OpenAPI document does.
pub struct Id(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Id, Response> {
        let Path(mut params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|r| rejected(r.status(), r.body_text()))?;
        let (key, id) = match (params.pop(), params.is_empty()) {
            (Some(p), true) => p,
            _ => {
                return Err(error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "a route with an id takes one path parameter",
                ))
            }
        };
        // The id routes end with their one parameter, and it matched one
        // raw segment: the path's last (axum only has it decoded).
        let raw = parts.uri.path().rsplit('/').next().unwrap_or_default();
        if let Some(i) = malformed_escape(raw) {
            return Err(bad_request(format!(
                "{key}: malformed percent-encoding at byte {i}"
            )));
        }
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return Err(bad_request(format!(
                "{key}: must be 1..={MAX_ID_BYTES} bytes once decoded"
            )));
        }
        Ok(Id(id))
    }
}

/// A route's query parameters, `T` one of the query structs below (each
/// `deny_unknown_fields`: any other parameter is a 400): axum's `Query`
/// on [`canonical_query`], its rejection a JSON 400.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Params<T>, Response> {
        params(parts.uri.query().unwrap_or_default()).map(Params)
    }
}

/// [`Params`] on a raw query string (without its `?`). Public for the fuzz
/// targets (`fuzz/`).
#[allow(clippy::result_large_err)]
pub fn params<T: DeserializeOwned>(query: &str) -> Result<T, Response> {
    let bad = |m: String| bad_request(format!("query string: {m}"));
    let canonical = canonical_query(query).map_err(bad)?;
    let uri: Uri = format!("/?{canonical}")
        .parse()
        .map_err(|e| bad(format!("{e}")))?;
    Query::<T>::try_from_uri(&uri)
        .map(|Query(t)| t)
        .map_err(|r| rejected(r.status(), r.body_text()))
}

/// A raw query string as the query structs read it, or what is wrong with
/// it: every `%` escape well-formed and every name and value UTF-8 once
/// decoded (axum's `Query` passes a malformed `%` through and replaces
/// bytes that are not UTF-8, contract §9 wants a 400); each parameter once, at
/// its last value (the OpenAPI document: "when a parameter is repeated the
/// last one counts"; a query struct refuses a repeated field); no empty
/// pair. Pure, public for the fuzz targets (`fuzz/`).
pub fn canonical_query(query: &str) -> Result<String, String> {
    let mut pairs: Vec<(String, &str)> = Vec::new();
    let mut last: HashMap<String, usize> = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        // No `=`: the value is the empty slice at the pair's end (still
        // inside `query`, for the byte offsets below).
        let (name, value) = pair.split_once('=').unwrap_or((pair, &pair[pair.len()..]));
        for part in [name, value] {
            let at = part.as_ptr() as usize - query.as_ptr() as usize;
            if let Some(i) = malformed_escape(part) {
                return Err(format!("malformed percent-encoding at byte {}", at + i));
            }
            if percent_decode_str(part).decode_utf8().is_err() {
                return Err(format!(
                    "the parameter at byte {at} is not UTF-8 once decoded"
                ));
            }
        }
        let name = percent_decode_str(&name.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned();
        last.insert(name.clone(), pairs.len());
        pairs.push((name, pair));
    }
    let kept: Vec<&str> = pairs
        .iter()
        .enumerate()
        .filter(|(i, (name, _))| last[name] == *i)
        .map(|(_, (_, pair))| *pair)
        .collect();
    Ok(kept.join("&"))
}

/// Routes that take no query parameter.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `GET /v1/leaderboard[?voter_prompt_id=R]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaderboardParams {
    pub voter_prompt_id: Option<String>,
}

/// `GET /v1/local/voters?voter_prompt_id=R`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RubricParams {
    pub voter_prompt_id: String,
}

/// `GET /v1/voters?voter_prompt_id=R[&order=voter_id|deviation][&limit=N]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VotersParams {
    /// The rubric whose reviewers to list.
    pub voter_prompt_id: String,
    #[serde(default)]
    pub order: VoterOrder,
    /// 1..=[`VOTERS_MAX_LIMIT`], [`VOTERS_DEFAULT_LIMIT`] when absent.
    #[serde(default = "default_limit", deserialize_with = "limit")]
    pub limit: usize,
}

/// Reviewers listed by `GET /v1/voters` when `limit` is absent, and at most.
pub const VOTERS_DEFAULT_LIMIT: usize = 100;
pub const VOTERS_MAX_LIMIT: usize = 10_000;

fn default_limit() -> usize {
    VOTERS_DEFAULT_LIMIT
}

fn limit<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let l = String::deserialize(d)?;
    l.parse::<usize>()
        .ok()
        .filter(|n| (1..=VOTERS_MAX_LIMIT).contains(n))
        .ok_or_else(|| {
            serde::de::Error::custom(format!("{l:?} is not an integer in 1..={VOTERS_MAX_LIMIT}"))
        })
}
