//! The process's HTTP server (`run`'s and `connect`'s): `/metrics`,
//! `/healthz`, `/readyz` (contract §8) of any [`Exposition`] on axum, one small
//! tokio runtime on a background thread; [`serve`] merges in the routes it
//! is given (the query API's, `crate::api::http`; `connect`'s). Every
//! answer axum makes from 400 up is JSON (`{"error": …}`), the limit
//! layers' included; an oversized request head is refused by hyper itself
//! (`431`, no body) before any route sees it.
//!
//! Limits (a slow or hostile client cannot exhaust the process):
//! - at most [`MAX_CONNECTIONS`] connections at a time; further ones wait
//!   in the kernel's accept backlog until one closes;
//! - the request line and headers: at most [`MAX_HEADER_BYTES`] bytes and
//!   [`MAX_HEADERS`] headers, else `431` (hyper's, then the connection is
//!   closed); they must arrive within [`HEADER_READ_TIMEOUT`], else the
//!   connection is closed;
//! - a body of at most [`MAX_BODY_BYTES`], else `413`;
//! - a request is answered within [`REQUEST_TIMEOUT`], else `408`;
//! - a connection is closed (after its current request) once it is
//!   [`CONNECTION_MAX_AGE`] old, so idle keep-alive clients give their slot
//!   back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::telemetry::connect::ConnectMetrics;
use crate::telemetry::{Metrics, CONTENT_TYPE};

/// Connections served at the same time.
pub const MAX_CONNECTIONS: usize = 64;
/// Request line plus headers, in bytes.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Headers per request.
pub const MAX_HEADERS: usize = 64;
/// Request body, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Time for a client to send the request line and headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time to answer one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Lifetime of one (keep-alive) connection.
pub const CONNECTION_MAX_AGE: Duration = Duration::from_secs(60);

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in
/// constant time (`subtle`: timing does not reveal a prefix).
pub fn bearer_matches(headers: &axum::http::HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())))
}

/// What `/metrics` and `/readyz` show: the service's metrics, or
/// `connect`'s.
pub trait Exposition: Send + Sync + 'static {
    /// The metrics in the text format ([`CONTENT_TYPE`]).
    fn render(&self) -> String;
    fn is_ready(&self) -> bool;
}

impl Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }

    fn is_ready(&self) -> bool {
        Metrics::is_ready(self)
    }
}

impl Exposition for ConnectMetrics {
    fn render(&self) -> String {
        ConnectMetrics::render(self)
    }

    fn is_ready(&self) -> bool {
        ConnectMetrics::is_ready(self)
    }
}

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub metrics: Arc<dyn Exposition>,
}

/// A server's request limits (the query API's are the defaults; `connect`
/// takes larger bodies and waits for the broker).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub body_bytes: usize,
    pub request_timeout: Duration,
    /// Tokio worker threads (0: one current-thread runtime).
    pub workers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: MAX_BODY_BYTES,
            request_timeout: REQUEST_TIMEOUT,
            workers: 0,
        }
    }
}

/// Every route (with `extra`'s), with the body limit and request timeout.
/// Unknown paths are `404`; a known path with another method is `405`.
pub fn router(state: AppState, extra: Router, limits: Limits) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
        .merge(extra)
        .fallback(not_found)
        // The configured limit, not axum's own 2 MiB default for a body
        // read whole (`Bytes`, `Json`), which would apply on top of it.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(limits.body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.request_timeout,
        ))
        .layer(axum::middleware::map_response(json_errors))
}

/// An error answer without a JSON body of its own (a `405`, `408`, or
/// axum's plain-text `413` "length limit exceeded") gets a JSON one.
async fn json_errors(r: Response) -> Response {
    let s = r.status();
    let json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if (s.is_client_error() || s.is_server_error()) && !json {
        let (mut parts, _) = r.into_parts();
        let body = json_error_body(s);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, body.into());
    }
    r
}

fn json_error_body(s: StatusCode) -> String {
    serde_json::json!({ "error": s.canonical_reason().unwrap_or("error") }).to_string()
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], s.metrics.render())
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, &'static str) {
    if s.metrics.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    let body = serde_json::json!({ "error": format!("no route {}", uri.path()) }).to_string();
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// A running server: its bound address, and a way to stop it that lets
/// the requests in progress finish. Dropping it leaves the server running
/// (until the process exits).
pub struct Serving {
    pub addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

impl Serving {
    /// Stops accepting connections, lets every request already received
    /// finish (each connection closes after its answer; idle ones at
    /// once), and returns once they have, or after the request timeout.
    pub fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

/// Serves [`router`] on `addr` from a background thread. Binds before it
/// returns (a bind error is returned) and answers the bound address (port 0
/// picks one). Usable from synchronous code.
pub fn serve(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    extra: Router,
) -> std::io::Result<Serving> {
    serve_with(addr, metrics, extra, Limits::default())
}

/// [`serve`] with other [`Limits`].
pub fn serve_with(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    extra: Router,
    limits: Limits,
) -> std::io::Result<Serving> {
    let listener = std::net::TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let rt = if limits.workers == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(limits.workers)
            .thread_name("http-worker")
            .enable_io()
            .enable_time()
            .build()?
    };
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let app = router(AppState { metrics }, extra, limits);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || rt.block_on(accept_loop(listener, app, limits.request_timeout, stopped)))?;
    Ok(Serving {
        addr: bound,
        stop,
        thread,
    })
}

/// Resolves once `stop` says true (never if its sender is dropped).
async fn stopping(stop: &mut tokio::sync::watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    request_timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS);
    loop {
        let slot = tokio::select! {
            _ = stopping(&mut stop) => break,
            slot = slots.clone().acquire_owned() => slot,
        };
        let Ok(slot) = slot else {
            return; // never closed
        };
        let accepted = tokio::select! {
            _ = stopping(&mut stop) => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::warn!(error = %e, "metrics server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = std::pin::pin!(conn);
            // Closed after CONNECTION_MAX_AGE, or when the server stops:
            // the request in progress (if any) is answered first.
            let done = tokio::select! {
                r = tokio::time::timeout(CONNECTION_MAX_AGE, conn.as_mut()) => r.is_ok(),
                _ = stopping(&mut stop) => false,
            };
            if !done {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(request_timeout, conn).await;
            }
        });
    }
    // Stopping: no new connection; wait for those open to finish.
    drop(listener);
    let all = MAX_CONNECTIONS as u32;
    let _ = tokio::time::timeout(request_timeout, slots.acquire_many(all)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// Sends `request` on a new connection; the status code of the answer.
    fn status(addr: SocketAddr, request: &[u8]) -> u16 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server may answer and close before the whole request is
        // written (an oversized head): a write error is fine then.
        let _ = s.write_all(request);
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        text.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"))
    }

    fn get(addr: SocketAddr, path: &str) -> u16 {
        status(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
    }

    #[test]
    fn routes_limits_and_the_server_keeps_answering() {
        let m = Metrics::new(10);
        let addr = serve("127.0.0.1:0".parse().unwrap(), m.clone(), Router::new())
            .unwrap()
            .addr;
        assert_eq!(get(addr, "/healthz"), 200);
        assert_eq!(get(addr, "/readyz"), 503);
        m.set_ready(true);
        assert_eq!(get(addr, "/readyz"), 200);
        assert_eq!(get(addr, "/metrics"), 200);
        assert_eq!(get(addr, "/metrics?x=1"), 200);
        assert_eq!(get(addr, "/nope"), 404);
        assert_eq!(get(addr, "/v1/scores"), 404);
        assert_eq!(
            status(
                addr,
                b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
            405
        );

        // Oversized head: one header over the limit, and too many headers:
        // hyper's 431. (Kept small enough that the server reads all of it
        // before it answers, so its close is not a reset that could eat the
        // answer.)
        let big = format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
            "a".repeat(MAX_HEADER_BYTES + 512)
        );
        assert_eq!(status(addr, big.as_bytes()), 431);
        // A 10 MB path: refused (the answer may be lost to the reset of a
        // connection closed with unread data), and the server goes on.
        let long = format!(
            "GET /v1/inferences/{} HTTP/1.1\r\nHost: x\r\n\r\n",
            "a".repeat(10 << 20)
        );
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = s.write_all(long.as_bytes());
        let mut text = Vec::new();
        let _ = s.read_to_end(&mut text);
        assert!(!text.starts_with(b"HTTP/1.1 200"), "{text:?}");
        let mut many = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\n");
        for i in 0..(MAX_HEADERS + 10) {
            many.push_str(&format!("X-H{i}: v\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(status(addr, many.as_bytes()), 431);
        // Oversized body, as declared (the body itself is not sent).
        let req = format!(
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            MAX_BODY_BYTES + 1
        );
        assert_eq!(status(addr, req.as_bytes()), 413);
        // Garbage is a 400, not a crash.
        assert_eq!(status(addr, b"\x00\x01 nonsense\r\n\r\n"), 400);

        // Still answering, and the content is today's.
        assert_eq!(get(addr, "/healthz"), 200);
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(
            text.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{text}"
        );
        assert!(text.contains("jurystream_build_info{version="), "{text}");
    }

    /// A body larger than a head's limit after `Expect: 100-continue` (curl
    /// sends it for bodies over 1 MiB) is a body; and a
    /// body over axum's own 2 MiB default but within the configured limit
    /// is read.
    #[test]
    fn a_large_body_after_100_continue_is_read_whole() {
        async fn length(body: axum::body::Bytes) -> String {
            body.len().to_string()
        }
        let limits = Limits {
            body_bytes: 8 << 20,
            ..Limits::default()
        };
        let addr = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            Metrics::new(10),
            Router::new().route("/echo", axum::routing::post(length)),
            limits,
        )
        .unwrap()
        .addr;
        for size in [MAX_HEADER_BYTES + 1024, 3 << 20] {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            write!(
                s,
                "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut interim = [0u8; 25];
            s.read_exact(&mut interim).unwrap();
            assert!(
                interim.starts_with(b"HTTP/1.1 100 Continue"),
                "{:?}",
                String::from_utf8_lossy(&interim)
            );
            s.write_all(&vec![b'a'; size]).unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            assert!(text.starts_with("HTTP/1.1 200 "), "{size}: {text}");
            assert!(text.ends_with(&size.to_string()), "{size}: {text}");
        }
    }

    #[test]
    fn connections_beyond_the_bound_wait_for_a_slot() {
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            Metrics::new(10),
            Router::new(),
        )
        .unwrap()
        .addr;
        // MAX_CONNECTIONS idle connections hold every slot.
        let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut s = TcpStream::connect(addr).unwrap(); // kernel backlog
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").unwrap();
        let mut buf = [0u8; 64];
        assert!(s.read(&mut buf).is_err(), "answered beyond the bound");
        // One slot frees up: the waiting request is answered.
        drop(idle);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.0 200"), "{text}");
    }
}
