//! Arbitrary requests → the HTTP server's whole router, in process
//! (`server::router` with the query API's routes, as `run`
//! serves them), over a real RocksDB store that holds the scores of
//! `examples/votes.jsonl`.
//!
//! Input: `MODE URI [\n AUTHORIZATION]`. `MODE % 3` picks what the
//! instance holds: its one partition ready (0), restoring (1), or no topic
//! known yet (2); `MODE / 3 % 4` the method (GET, HEAD, POST, DELETE). An
//! URI that `http::Uri` refuses is skipped (hyper answers it 400 before
//! the router).
//!
//! Checked, besides "no panic": no 5xx but 503, and 503 only while the
//! partition is not ready (restoring, or no topic); every `/v1` answer
//! and every error is JSON, an error with an `"error"` string; a request
//! without the token is 401.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode, Uri};
use axum::Router;
use http_body_util::BodyExt;
use jurystream::api::http::{routes, Api};
use jurystream::api::Holdings;
use jurystream::input::{decode_vote, DecodeOptions};
use jurystream::server::{router, AppState, Exposition, Limits};
use jurystream::state::Store;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

const TOKEN: &str = "tok";

struct Metrics;

impl Exposition for Metrics {
    fn render(&self) -> String {
        "# no metrics\n".into()
    }
    fn is_ready(&self) -> bool {
        true
    }
}

struct World {
    rt: tokio::runtime::Runtime,
    /// Ready, restoring, no topic.
    apps: [Router; 3],
    /// `JURYSTREAM_FUZZ_DEBUG` set: every request and its answer on stderr
    /// (to look at a crash input or the seeds).
    debug: bool,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        // The store lives as long as the process; the directory is left
        // behind (scripts/fuzz.sh removes `jurystream-fuzz-*`).
        let dir = tempfile::Builder::new()
            .prefix("jurystream-fuzz-")
            .tempdir()
            .unwrap()
            .keep();
        let store = Store::open(&dir).unwrap();
        let cfg = jurystream::config::Config::load(None).unwrap().engine();
        let (mut engine, _) = store.load(cfg).unwrap();
        let opts = DecodeOptions {
            max_message_bytes: 1 << 20,
            default_voter_prompt_id: None,
        };
        let mut out = Vec::new();
        for line in include_str!("../../examples/votes.jsonl").lines() {
            if let Ok(v) = decode_vote(line.as_bytes(), &opts) {
                engine.process(&v, &mut out);
            }
        }
        engine.close_all(&mut out);
        let mut records = Vec::new();
        store.encode_changes(&mut engine, &mut records).unwrap();
        store.apply(&records, &[]).unwrap();
        let store = Arc::new(store);

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let tp = ("votes".to_owned(), 0);
        let app = |held: Option<Option<Arc<Store>>>| {
            let h = Arc::new(Holdings::new(0.5));
            if let Some(s) = held {
                h.set_topics([("votes".to_owned(), 1)].into());
                h.set_held([(tp.clone(), s)].into());
            }
            let _g = rt.enter();
            let api = Api::new(h, TOKEN, &[], Duration::from_secs(1));
            router(
                AppState {
                    metrics: Arc::new(Metrics),
                },
                routes(api),
                Limits::default(),
            )
        };
        let apps = [app(Some(Some(store))), app(Some(None)), app(None)];
        let debug = std::env::var_os("JURYSTREAM_FUZZ_DEBUG").is_some();
        World { rt, apps, debug }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (target, auth) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let Ok(uri) = Uri::try_from(target) else {
        return;
    };
    let holding = usize::from(mode % 3);
    let method = [Method::GET, Method::HEAD, Method::POST, Method::DELETE]
        [usize::from(mode / 3 % 4)]
    .clone();
    let mut req = Request::builder().method(method.clone()).uri(uri.clone());
    if let Some(a) = auth {
        match header::HeaderValue::from_bytes(a) {
            Ok(v) => req = req.header(header::AUTHORIZATION, v),
            Err(_) => return,
        }
    }
    let req = req.body(Body::empty()).unwrap();
    let authorized = auth.is_some_and(|a| a == format!("Bearer {TOKEN}").as_bytes());

    let w = world();
    let (status, headers, body) = w.rt.block_on(async {
        let resp = w.apps[holding].clone().oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, body)
    });
    if w.debug {
        eprintln!(
            "mode {holding} {method} {uri} auth={authorized}: {status} {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
    }

    assert!(
        !status.is_server_error() || status == StatusCode::SERVICE_UNAVAILABLE,
        "{status} for {method} {uri}: {body:?}"
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        assert_ne!(holding, 0, "503 with the partition ready: {uri}: {body:?}");
        assert!(uri.path().starts_with("/v1/"), "{uri}");
    }
    let api_route = uri.path().starts_with("/v1/");
    if method == Method::GET && (api_route || status.is_client_error() || status.is_server_error())
    {
        let json = headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
        assert!(json, "{status} for {uri} is not JSON: {headers:?}");
        let v: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{status} for {uri}: not JSON ({e}): {body:?}"));
        if !status.is_success() {
            assert!(v["error"].is_string(), "{status} for {uri}: {v}");
        }
    }
    if api_route && !authorized && (method == Method::GET || method == Method::HEAD) {
        // Unknown /v1 paths are 404 before the token is looked at.
        assert!(
            status == StatusCode::UNAUTHORIZED || status == StatusCode::NOT_FOUND,
            "{status} for {uri} without the token"
        );
    }
});
