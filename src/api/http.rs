//! The query API's routes (contract §9), merged into the one HTTP server of
//! `run` (`server`):
//!
//! - `GET /v1/inferences/{id}` and `GET /v1/leaderboard[?voter_prompt_id=R]`
//!   answer for the whole group: this instance's partitions plus what the
//!   peers (`api.peers`) hold;
//! - `GET /v1/rubrics`, `GET /v1/voters/{voter_id}` and
//!   `GET /v1/voters?voter_prompt_id=R[&order=deviation|voter_id][&limit=N]`
//!   (contract §11) the same way;
//! - `GET /v1/local/…` (inferences, leaderboard, rubrics, voters) answer
//!   for this instance's partitions only, per partition: what peers ask
//!   each other.
//!
//! Every `/v1/*` route needs `Authorization: Bearer <api.token>` when a
//! token is configured. Ids come from axum's `Path` ([`Id`]), query
//! parameters from axum's `Query` into one struct per route that refuses
//! unknown parameters ([`Params`]); both are strict about `%` escapes.
//! The group's routes share one fan-out ([`fan_out`]). Errors, the
//! extractors' rejections included, are `{"error": …}`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::agreement::VoterRow;
use crate::error::Chain;

use super::merge::{merge_board, merge_inference, merge_rubrics, merge_voters};
pub use super::params::{
    canonical_query, error, params, Id, LeaderboardParams, NoParams, Params, RubricParams,
    VotersParams, VOTERS_DEFAULT_LIMIT, VOTERS_MAX_LIMIT,
};
use super::{percent_encode, GroupWeights, Holdings, LocalAnswer, Unavailable, VoterOrder};

/// Largest peer answer read.
const MAX_PEER_ANSWER: usize = 64 << 20;

/// Store reads of the query API running at a time.
const STORE_READERS: usize = 4;

/// Runs a read of this instance's stores on tokio's blocking pool, at most
/// [`STORE_READERS`] at a time, so that the runtime thread that answers
/// `/healthz`, `/readyz` and `/metrics` never waits for RocksDB (a long
/// scan used to stall a liveness probe). A store error is its answer.
async fn off_runtime<T: Send + 'static>(
    api: &Arc<Api>,
    read: impl FnOnce(&Holdings) -> Result<T, crate::state::StoreError> + Send + 'static,
) -> Result<T, Response> {
    let Ok(permit) = api.readers.clone().acquire_owned().await else {
        return Err(error(StatusCode::SERVICE_UNAVAILABLE, "shutting down"));
    };
    let holdings = api.holdings.clone();
    match tokio::task::spawn_blocking(move || {
        let _permit = permit;
        read(&holdings)
    })
    .await
    {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(store_error(e)),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("store read failed: {e}"),
        )),
    }
}

/// What the routes share.
pub struct Api {
    holdings: Arc<Holdings>,
    /// Store reads running at a time ([`off_runtime`]).
    readers: Arc<tokio::sync::Semaphore>,
    token: Option<String>,
    peers: Vec<String>,
    peer_timeout: Duration,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Api {
    /// `token` empty means none; `peers` are base URLs (`http://host:port`).
    pub fn new(
        holdings: Arc<Holdings>,
        token: &str,
        peers: &[String],
        peer_timeout: Duration,
    ) -> Arc<Api> {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(peer_timeout));
        connector.set_nodelay(true);
        Arc::new(Api {
            holdings,
            readers: Arc::new(tokio::sync::Semaphore::new(STORE_READERS)),
            token: (!token.is_empty()).then(|| token.to_owned()),
            peers: peers
                .iter()
                .map(|p| p.trim_end_matches('/').to_owned())
                .collect(),
            peer_timeout,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }
}

/// The `/v1/*` routes.
pub fn routes(api: Arc<Api>) -> Router {
    Router::new()
        .route("/v1/inferences/{inference_id}", get(inference))
        .route("/v1/leaderboard", get(leaderboard))
        .route("/v1/local/inferences/{inference_id}", get(local_inference))
        .route("/v1/local/leaderboard", get(local_leaderboard))
        .route("/v1/rubrics", get(rubrics))
        .route("/v1/voters", get(voters))
        .route("/v1/voters/{voter_id}", get(voter))
        .route("/v1/local/rubrics", get(local_rubrics))
        .route("/v1/local/voters", get(local_voters))
        .route("/v1/local/voters/{voter_id}", get(local_voter))
        .route("/v1/openapi.json", get(openapi))
        .route_layer(axum::middleware::from_fn_with_state(api.clone(), auth))
        .with_state(api)
}

/// This API as an OpenAPI 3 document (`src/api/openapi.json`; checked
/// against a running instance by schemathesis, tests/query_api.rs).
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn auth(State(api): State<Arc<Api>>, req: Request, next: Next) -> Response {
    if let Some(token) = &api.token {
        if !crate::server::bearer_matches(req.headers(), token) {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer <api.token>)",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

fn store_error(e: crate::state::StoreError) -> Response {
    tracing::error!("query API: {}", Chain(&e));
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("state store: {}", Chain(&e)),
    )
}

/// A `/v1/local/*` answer, read and encoded off the runtime.
async fn local<T: Serialize>(
    api: &Arc<Api>,
    read: impl FnOnce(&Holdings) -> Result<LocalAnswer<T>, crate::state::StoreError> + Send + 'static,
) -> Response {
    match off_runtime(api, move |h| read(h).map(|a| Json(a).into_response())).await {
        Ok(r) | Err(r) => r,
    }
}

/// Merging the instances' answers and encoding the result, off the runtime
/// too: a voters list of 10 000 rows costs milliseconds of CPU that
/// `/healthz` must not wait for.
async fn settle(api: &Arc<Api>, answer: impl FnOnce() -> Response + Send + 'static) -> Response {
    match off_runtime(api, move |_| Ok(answer())).await {
        Ok(r) | Err(r) => r,
    }
}

async fn local_inference(
    State(api): State<Arc<Api>>,
    Params(NoParams {}): Params<NoParams>,
    Id(id): Id,
) -> Response {
    local(&api, move |h| h.inference(&id)).await
}

async fn local_leaderboard(
    State(api): State<Arc<Api>>,
    Params(NoParams {}): Params<NoParams>,
) -> Response {
    local(&api, |h| h.board()).await
}

async fn local_rubrics(
    State(api): State<Arc<Api>>,
    Params(NoParams {}): Params<NoParams>,
) -> Response {
    local(&api, |h| h.rubrics()).await
}

async fn local_voter(
    State(api): State<Arc<Api>>,
    Params(NoParams {}): Params<NoParams>,
    Id(id): Id,
) -> Response {
    local(&api, move |h| h.voter(&id)).await
}

async fn local_voters(
    State(api): State<Arc<Api>>,
    Params(RubricParams { voter_prompt_id }): Params<RubricParams>,
) -> Response {
    local(&api, move |h| h.voters_of(&voter_prompt_id)).await
}

/// This instance's answer and every peer's (a peer that fails is left
/// out: its partitions then count as unavailable); the peers' errors.
async fn gather<T: DeserializeOwned + Send + 'static>(
    api: &Arc<Api>,
    own: LocalAnswer<T>,
    path: String,
) -> (Vec<LocalAnswer<T>>, Vec<PeerError>) {
    let mut answers = vec![own];
    let mut errors = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for peer in &api.peers {
        let api = api.clone();
        let url = format!("{peer}{path}");
        tasks.spawn(async move {
            let r = tokio::time::timeout(api.peer_timeout, fetch::<T>(&api, &url)).await;
            match r {
                Ok(r) => r.map_err(|why| PeerError::Peer { url, why }),
                Err(_) => Err(PeerError::Timeout { url }),
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(a)) => answers.push(a),
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(PeerError::Task(e)),
        }
    }
    (answers, errors)
}

/// Why a GET failed before an answer was whole (peers' and `jurystream
/// query`'s requests).
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("bad URL")]
    Url(#[source] axum::http::Error),
    #[error("request failed")]
    Request(#[source] hyper_util::client::legacy::Error),
    #[error("reading the answer failed")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What went wrong with one peer's answer (a 503 names each, with its
/// causes: `error::Chain`).
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("{url}")]
    Peer {
        url: String,
        #[source]
        why: FetchError,
    },
    #[error("{url}: no answer within api.peer_timeout_ms")]
    Timeout { url: String },
    #[error("peer request failed")]
    Task(#[source] tokio::task::JoinError),
}

/// A peer's answer that is not a usable one.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Get(#[from] GetError),
    #[error("{status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("unreadable answer")]
    Decode(#[source] serde_json::Error),
    #[error("decoding the answer failed")]
    Join(#[source] tokio::task::JoinError),
}

/// `GET url` with the bearer token if any: the status and the body (at
/// most [`MAX_PEER_ANSWER`] bytes). Peers and the `query` client
/// (`client.rs`) use it.
pub(super) async fn http_get(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    token: Option<&str>,
) -> Result<(StatusCode, Bytes), GetError> {
    let mut req = hyper::Request::get(url);
    if let Some(t) = token.filter(|t| !t.is_empty()) {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(Empty::new()).map_err(GetError::Url)?;
    let resp = client.request(req).await.map_err(GetError::Request)?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_PEER_ANSWER)
        .collect()
        .await
        .map_err(GetError::Body)?
        .to_bytes();
    Ok((status, body))
}

async fn fetch<T: DeserializeOwned + Send + 'static>(
    api: &Api,
    url: &str,
) -> Result<LocalAnswer<T>, FetchError> {
    let (status, body) = http_get(&api.client, url, api.token.as_deref()).await?;
    if !status.is_success() {
        let body = String::from_utf8_lossy(&body).into_owned();
        return Err(FetchError::Status { status, body });
    }
    // Decoded off the runtime (a peer's voters list can be megabytes).
    tokio::task::spawn_blocking(move || serde_json::from_slice(&body).map_err(FetchError::Decode))
        .await
        .map_err(FetchError::Join)?
}

fn unavailable(why: impl std::fmt::Display, peer_errors: &[PeerError]) -> Response {
    let mut msg = why.to_string();
    if !peer_errors.is_empty() {
        msg.push_str("; peers: ");
        let named: Vec<String> = peer_errors.iter().map(|e| crate::error::chain(e)).collect();
        msg.push_str(&named.join("; "));
    }
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, msg);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// The one fan-out of the group's routes: this instance's answer (`read`,
/// off the runtime), every peer's answer to `peer_path` (a
/// `/v1/local/*` route, [`gather`]), then `merge` of them all (off the
/// runtime too). When `merge` finds a partition held ready by no one, the
/// answer is a 503 that names the peers' errors.
async fn fan_out<T: DeserializeOwned + Send + 'static>(
    api: &Arc<Api>,
    read: impl FnOnce(&Holdings) -> Result<LocalAnswer<T>, crate::state::StoreError> + Send + 'static,
    peer_path: String,
    merge: impl FnOnce(Vec<LocalAnswer<T>>) -> Result<Response, Unavailable> + Send + 'static,
) -> Response {
    let own = match off_runtime(api, read).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (answers, errors) = gather(api, own, peer_path).await;
    settle(api, move || {
        merge(answers).unwrap_or_else(|why| unavailable(why, &errors))
    })
    .await
}

async fn inference(
    State(api): State<Arc<Api>>,
    Params(NoParams {}): Params<NoParams>,
    Id(id): Id,
) -> Response {
    let read = id.clone();
    let path = format!("/v1/local/inferences/{}", percent_encode(&id));
    fan_out(
        &api,
        move |h| h.inference(&read),
        path,
        move |answers| {
            Ok(match merge_inference(&id, answers)? {
                Some(out) => Json(out).into_response(),
                None => error(
                    StatusCode::NOT_FOUND,
                    format!("no series of inference {id:?}"),
                ),
            })
        },
    )
    .await
}

async fn leaderboard(
    State(api): State<Arc<Api>>,
    Params(LeaderboardParams { voter_prompt_id }): Params<LeaderboardParams>,
) -> Response {
    fan_out(
        &api,
        |h| h.board(),
        "/v1/local/leaderboard".into(),
        move |answers| Ok(Json(merge_board(answers, voter_prompt_id.as_deref())?).into_response()),
    )
    .await
}

async fn rubrics(State(api): State<Arc<Api>>, Params(NoParams {}): Params<NoParams>) -> Response {
    fan_out(
        &api,
        |h| h.rubrics(),
        "/v1/local/rubrics".into(),
        |answers| Ok(Json(merge_rubrics(answers)?).into_response()),
    )
    .await
}

async fn voter(
    State(api): State<Arc<Api>>,
    Params(NoParams {}): Params<NoParams>,
    Id(id): Id,
) -> Response {
    let read = id.clone();
    let path = format!("/v1/local/voters/{}", percent_encode(&id));
    let weights = api.holdings.reputation();
    fan_out(&api, move |h| h.voter(&read), path, move |answers| {
        let out = merge_voters(answers, VoterOrder::VoterId, usize::MAX)?;
        Ok(if out.voters.is_empty() {
            error(
                StatusCode::NOT_FOUND,
                format!("no rated votes of voter {id:?} (a vote counts once its batch closes with another vote)"),
            )
        } else {
            Json(WeightedVoters::of(out.voters, weights.as_deref())).into_response()
        })
    })
    .await
}

/// `GET /v1/voters/{voter_id}`'s answer: contract §11's rows with §14's
/// learned weight (null without tables: mode `off`, or before every
/// partition has sealed an epoch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightedVoters {
    pub voters: Vec<WeightedVoter>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightedVoter {
    #[serde(flatten)]
    pub row: VoterRow,
    pub weight: Option<f64>,
    pub table_until: Option<String>,
    /// contract §15: the rubric's model and the reviewer's side weights
    /// (null without a table, and the side weights while the rubric's
    /// `confusion` table is empty).
    pub model: Option<String>,
    pub pass_weight: Option<f64>,
    pub flag_weight: Option<f64>,
}

impl WeightedVoters {
    fn of(rows: Vec<VoterRow>, weights: Option<&GroupWeights>) -> WeightedVoters {
        let voters = rows
            .into_iter()
            .map(|row| {
                let sides = weights.and_then(|w| w.sides(&row.voter_prompt_id, &row.voter_id));
                WeightedVoter {
                    weight: weights.map(|w| w.weight(&row.voter_prompt_id, &row.voter_id)),
                    table_until: weights.map(|w| crate::time::format_timestamp(w.table_until)),
                    model: weights.map(|w| w.models.of(&row.voter_prompt_id).as_str().to_owned()),
                    pass_weight: sides.map(|s| s.0),
                    flag_weight: sides.map(|s| s.1),
                    row,
                }
            })
            .collect();
        WeightedVoters { voters }
    }
}

async fn voters(
    State(api): State<Arc<Api>>,
    Params(VotersParams {
        voter_prompt_id: rubric,
        order,
        limit,
    }): Params<VotersParams>,
) -> Response {
    let read = rubric.clone();
    let path = format!(
        "/v1/local/voters?voter_prompt_id={}",
        percent_encode(&rubric)
    );
    fan_out(
        &api,
        move |h| h.voters_of(&read),
        path,
        move |answers| Ok(Json(merge_voters(answers, order, limit)?).into_response()),
    )
    .await
}

#[cfg(test)]
mod fan_out_tests {
    use super::*;
    use crate::api::merge::covering;
    use crate::api::PartAnswer;

    /// An answer holding one partition of a two-partition topic.
    fn holding(partition: i32, data: Vec<u64>) -> LocalAnswer<u64> {
        LocalAnswer {
            topics: [("votes".to_owned(), 2)].into(),
            partitions: vec![PartAnswer {
                topic: "votes".into(),
                partition,
                ready: true,
                data,
            }],
        }
    }

    /// A peer that answers `GET /v1/local/things` (with the token) for
    /// partition 1; its base URL.
    async fn peer() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/v1/local/things",
            get(|headers: axum::http::HeaderMap| async move {
                assert_eq!(headers[header::AUTHORIZATION], "Bearer tok");
                Json(holding(1, vec![3, 4]))
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    async fn body(r: Response) -> (StatusCode, Option<HeaderValue>, serde_json::Value) {
        let status = r.status();
        let retry = r.headers().get(header::RETRY_AFTER).cloned();
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, retry, serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn fan_out_merges_this_instance_and_its_peers_answers() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let peer = peer().await;
            let api = Api::new(
                Arc::new(Holdings::new(0.5)),
                "tok",
                std::slice::from_ref(&peer),
                Duration::from_secs(5),
            );
            // Each partition's data once, in partition order.
            let merge = |answers: Vec<LocalAnswer<u64>>| {
                Ok(Json(covering(answers)?.concat()).into_response())
            };
            let own = || move |_: &Holdings| Ok(holding(0, vec![1, 2]));

            let r = fan_out(&api, own(), "/v1/local/things".into(), merge).await;
            let (status, _, json) = body(r).await;
            assert_eq!(status, StatusCode::OK, "{json}");
            assert_eq!(json, serde_json::json!([1, 2, 3, 4]));

            // A peer route that fails and a peer that is down: partition 1
            // is held by no one, a 503 that names both peers' errors.
            let api = Api::new(
                Arc::new(Holdings::new(0.5)),
                "tok",
                &[peer, "http://127.0.0.1:1".into()],
                Duration::from_secs(5),
            );
            let r = fan_out(&api, own(), "/v1/local/nothing".into(), merge).await;
            let (status, retry, json) = body(r).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
            assert_eq!(retry.unwrap(), "1");
            let msg = json["error"].as_str().unwrap();
            assert!(msg.contains("votes-1"), "{msg}");
            assert!(msg.contains("/v1/local/nothing: 404"), "{msg}");
            assert!(
                msg.contains("http://127.0.0.1:1/v1/local/nothing: "),
                "{msg}"
            );
        });
    }
}
