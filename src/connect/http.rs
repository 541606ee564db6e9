//! `connect`'s routes (contract §12): `POST /v1/votes` and
//! `POST /hooks/label-studio`, behind the bearer token when one is set.
//! `/metrics`, `/healthz` and `/readyz` come from the shared server
//! (`crate::server`), which also limits the body (413).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use super::intake::{self, BodyKind, Rules};
use super::mapping::{annotation_votes, MappedVote, Mapping, Project};
use super::produce::Producer;
use crate::input::DecodeOptions;
use crate::server::bearer_matches;
use crate::telemetry::connect::{ConnectMetrics, Source, VoteResult};
use crate::time::{wall_clock, Nanos};

/// What the handlers share.
pub struct Intake {
    pub producer: Producer,
    pub metrics: Arc<ConnectMetrics>,
    pub token: Option<String>,
    pub decode: DecodeOptions,
    pub max_skew: Nanos,
    pub mapping: Mapping,
    /// `label_studio.projects` (empty: any).
    pub projects: Vec<i64>,
}

pub fn routes(intake: Arc<Intake>) -> Router {
    Router::new()
        .route("/v1/votes", post(votes))
        .route("/hooks/label-studio", post(label_studio))
        .route("/v1/openapi.json", axum::routing::get(openapi))
        .route_layer(axum::middleware::from_fn_with_state(intake.clone(), auth))
        .with_state(intake)
}

/// These routes as an OpenAPI 3 document (`src/connect/openapi.json`;
/// checked against a running instance by schemathesis, tests/connect.rs).
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({ "error": message.into() }).to_string(),
    )
        .into_response()
}

fn ok(body: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn auth(State(s): State<Arc<Intake>>, req: Request, next: Next) -> Response {
    if let Some(token) = &s.token {
        if !bearer_matches(req.headers(), token) {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer <connect.token>)",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

async fn votes(State(s): State<Arc<Intake>>, headers: HeaderMap, body: Bytes) -> Response {
    let kind = BodyKind::of_content_type(
        headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let rules = Rules {
        decode: s.decode.clone(),
        now: wall_clock(),
        max_skew: s.max_skew,
    };
    let checked = match intake::check(&body, kind, &rules) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.0),
    };
    s.metrics.votes(
        Source::Api,
        VoteResult::Rejected,
        checked.refused.len() as u64,
    );
    let n = checked.valid.len() as u64;
    let started = Instant::now();
    let pairs: Vec<(&str, &[u8])> = checked
        .valid
        .iter()
        .map(|v| (v.key.as_str(), v.bytes))
        .collect();
    let sent = s.producer.send_all(Source::Api, &pairs).await;
    if let Err(e) = sent {
        s.metrics.votes(Source::Api, VoteResult::Failed, n);
        return unavailable(&crate::error::chain(&e));
    }
    s.metrics.produce_duration(started.elapsed().as_secs_f64());
    s.metrics.votes(Source::Api, VoteResult::Produced, n);
    ok(json!({ "accepted": n, "rejected": checked.refused }))
}

fn unavailable(why: &str) -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the broker did not acknowledge the votes; nothing is lost by sending the same request again: {why}"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    r
}

/// The votes a webhook body carries (none for an action without an
/// annotation, or a project not configured).
pub fn webhook_votes(body: &Value, mapping: &Mapping, projects: &[i64]) -> Vec<MappedVote> {
    let action = body["action"].as_str().unwrap_or_default();
    if !matches!(action, "ANNOTATION_CREATED" | "ANNOTATION_UPDATED") {
        return Vec::new();
    }
    let project = Project::of(&body["project"]);
    if !projects.is_empty() && !projects.contains(&project.id) {
        return Vec::new();
    }
    annotation_votes(mapping, &project, &body["task"], &body["annotation"])
}

async fn label_studio(State(s): State<Arc<Intake>>, body: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the body is not a Label Studio webhook (JSON)",
        );
    };
    let action = body["action"].as_str().unwrap_or_default();
    s.metrics.webhook(action);
    let votes = webhook_votes(&body, &s.mapping, &s.projects);
    if votes.is_empty() {
        return ok(json!({ "produced": 0 }));
    }
    let n = votes.len() as u64;
    let started = Instant::now();
    let pairs: Vec<(&str, &[u8])> = votes
        .iter()
        .map(|v| (v.key.as_str(), v.json.as_bytes()))
        .collect();
    let sent = s.producer.send_all(Source::Webhook, &pairs).await;
    if let Err(e) = sent {
        s.metrics.votes(Source::Webhook, VoteResult::Failed, n);
        return unavailable(&crate::error::chain(&e));
    }
    s.metrics.produce_duration(started.elapsed().as_secs_f64());
    s.metrics.votes(Source::Webhook, VoteResult::Produced, n);
    ok(json!({ "produced": n }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::mapping::fixtures::{fields, fixture};

    #[test]
    fn webhooks_give_votes_for_annotations_of_configured_projects_only() {
        let map = fields();
        let created = fixture("002_ANNOTATION_CREATED.json");
        assert!(!webhook_votes(&created, &map, &[]).is_empty());
        assert!(!webhook_votes(&created, &map, &[1]).is_empty());
        assert!(webhook_votes(&created, &map, &[2]).is_empty());
        let updated = fixture("004_ANNOTATION_UPDATED.json");
        assert_eq!(webhook_votes(&updated, &map, &[]).len(), 4);
        // A deletion carries no annotation to vote with.
        let deleted = fixture("006_ANNOTATIONS_DELETED.json");
        assert!(webhook_votes(&deleted, &map, &[]).is_empty());
    }
}
