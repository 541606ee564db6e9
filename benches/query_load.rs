//! Open-loop HTTP load generator for the query API (scripts/bench-query.sh),
//! built from the project's own dependencies:
//!
//!   query_load BASE_URL IDS_FILE RATE SECONDS [CONNECTIONS | --connections N]
//!              [--leaderboard | --path PATH] [--label TEXT] [--timeline]
//!
//! - BASE_URL: `http://host:port` of `jurystream run`'s `[metrics] listen`.
//! - IDS_FILE: inference ids, one per line (blank lines skipped); each
//!   request is `GET /v1/inferences/{id}` with the id percent-encoded (every
//!   byte except ASCII letters, digits and `-._~`). Ignored (pass `-`) with
//!   `--leaderboard`, which sends `GET /v1/leaderboard` instead, or with
//!   `--path PATH`, which sends `GET PATH` (e.g. `/healthz`: the cost of
//!   the HTTP stack alone).
//! - RATE: target requests per second, over all connections.
//! - SECONDS: how long to send; SIGTERM or SIGINT stops it earlier (the
//!   requests in flight are finished, then the results are printed).
//! - CONNECTIONS: keep-alive HTTP/1.1 connections (default 32), one task
//!   each; a connection the server closes is reopened.
//! - `--timeline`: also print, per second of the schedule, the requests
//!   completed, how many took over 5 ms, and the slowest (ms).
//!
//! Open loop: connection task `i` of `C` sends its requests on a fixed
//! schedule, one every `C / RATE` seconds, the tasks' schedules staggered
//! evenly; ids cycle through the file, task `i` starting at `i * len / C`.
//! A task has one request in flight at a time: when an answer comes late
//! the next request goes out at once, and its latency is measured from its
//! SCHEDULED send time to the end of the answer's body, so a slow server
//! is charged for the requests it delayed (no coordinated omission).
//! Requests whose slot passed before the end but that could not be sent
//! are counted as `unsent` (a sign that the server, or this generator,
//! could not keep up).
//!
//! Prints one JSON line: target and achieved rate (completed / elapsed),
//! counts by status (200, 404, 503, other) and of errors by kind, latency
//! percentiles in ms from the scheduled time (`p50_ms` … `max_ms`) and from
//! the actual send (`service_p50_ms` …), reconnects, and this process's
//! CPU seconds.
//!
//! It runs on a tokio current-thread runtime: one thread does everything,
//! so it uses at most one core (the project's tokio has no multi-thread
//! scheduler feature; a multi-thread runtime with one worker would be the
//! same thing with an extra thread).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{header, Request};
use hyper_util::rt::TokioIo;
use jurystream::api::percent_encode;

/// Longest wait for one answer before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

struct Args {
    authority: String,
    ids_file: String,
    rate: f64,
    seconds: f64,
    connections: usize,
    /// A fixed path instead of the ids (`--leaderboard`, `--path`).
    path: Option<String>,
    label: Option<String>,
    timeline: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: query_load BASE_URL IDS_FILE RATE SECONDS [CONNECTIONS] [--leaderboard | --path PATH] [--label TEXT] [--timeline]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut pos = Vec::new();
    let mut path = None;
    let mut label = None;
    let mut connections = None;
    let mut timeline = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {}
            "--leaderboard" => path = Some("/v1/leaderboard".to_owned()),
            "--path" => path = Some(it.next().unwrap_or_else(|| usage())),
            "--timeline" => timeline = true,
            "--label" => label = Some(it.next().unwrap_or_else(|| usage())),
            "--connections" => connections = Some(it.next().unwrap_or_else(|| usage())),
            _ if a.starts_with("--") => usage(),
            _ => pos.push(a),
        }
    }
    if let Some(c) = connections {
        pos.truncate(4);
        pos.push(c);
    }
    if pos.len() < 4 || pos.len() > 5 {
        usage();
    }
    let base = pos[0].trim_end_matches('/');
    let authority = base
        .strip_prefix("http://")
        .unwrap_or_else(|| {
            eprintln!("query_load: BASE_URL must be http://host:port");
            std::process::exit(2)
        })
        .to_owned();
    let num = |s: &str| -> f64 { s.parse().unwrap_or_else(|_| usage()) };
    let a = Args {
        authority,
        ids_file: pos[1].clone(),
        rate: num(&pos[2]),
        seconds: num(&pos[3]),
        connections: pos
            .get(4)
            .map_or(32, |c| c.parse().unwrap_or_else(|_| usage())),
        path,
        label,
        timeline,
    };
    if !(a.rate > 0.0 && a.seconds > 0.0 && a.connections > 0) {
        usage();
    }
    a
}

#[derive(Default)]
struct Tally {
    /// From the scheduled send time to the end of the body, µs.
    latency_us: Vec<u32>,
    /// From the actual send to the end of the body, µs.
    service_us: Vec<u32>,
    ok: u64,
    not_found: u64,
    unavailable: u64,
    other_status: BTreeMap<u16, u64>,
    errors: BTreeMap<String, u64>,
    unsent: u64,
    reconnects: u64,
    /// Requests resent on a new connection because the old one closed
    /// before they were written (the keep-alive race; not an error).
    resent: u64,
    last_done: Option<Instant>,
    /// Per second of the schedule: completed, over 5 ms, slowest (µs).
    timeline: Vec<[u32; 3]>,
}

impl Tally {
    fn error(&mut self, kind: impl Into<String>) {
        *self.errors.entry(kind.into()).or_default() += 1;
    }

    fn merge(&mut self, o: Tally) {
        self.latency_us.extend(o.latency_us);
        self.service_us.extend(o.service_us);
        self.ok += o.ok;
        self.not_found += o.not_found;
        self.unavailable += o.unavailable;
        for (k, v) in o.other_status {
            *self.other_status.entry(k).or_default() += v;
        }
        for (k, v) in o.errors {
            *self.errors.entry(k).or_default() += v;
        }
        self.unsent += o.unsent;
        self.reconnects += o.reconnects;
        self.resent += o.resent;
        self.last_done = self.last_done.max(o.last_done);
        if self.timeline.len() < o.timeline.len() {
            self.timeline.resize(o.timeline.len(), [0; 3]);
        }
        for (a, b) in self.timeline.iter_mut().zip(o.timeline) {
            a[0] += b[0];
            a[1] += b[1];
            a[2] = a[2].max(b[2]);
        }
    }
}

fn error_kind(e: &hyper::Error) -> String {
    if e.is_incomplete_message() {
        "connection closed before the answer".into()
    } else if e.is_closed() || e.is_canceled() {
        "connection closed".into()
    } else if e.is_timeout() {
        "timeout".into()
    } else if e.is_parse() {
        "unparsable answer".into()
    } else {
        format!("http: {e}")
    }
}

async fn connect(authority: &str) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request on `conn` (reopened when closed); `Ok(status)` once the
/// whole body is read.
async fn one_request(
    authority: &str,
    path: &str,
    conn: &mut Option<SendRequest<Empty<Bytes>>>,
    t: &mut Tally,
) -> Result<u16, String> {
    let mut resent = false;
    loop {
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            *conn = Some(connect(authority).await?);
            t.reconnects += 1;
        }
        let sender = conn.as_mut().expect("connected");
        if sender.ready().await.is_err() {
            *conn = None;
            continue;
        }
        let req = Request::get(path)
            .header(header::HOST, authority)
            .body(Empty::<Bytes>::new())
            .expect("request");
        match sender.try_send_request(req).await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                resp.into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("body: {}", error_kind(&e)))?;
                return Ok(status);
            }
            Err(mut e) => {
                *conn = None;
                // Not written yet: the connection closed between requests
                // (the server's keep-alive limit); send it on a new one.
                if e.take_message().is_some() && !resent {
                    resent = true;
                    t.resent += 1;
                    continue;
                }
                return Err(error_kind(e.error()));
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection_task(
    authority: Arc<str>,
    paths: Arc<Vec<String>>,
    first: usize,
    t0: Instant,
    start: Instant,
    interval: Duration,
    end: Instant,
    stop: Arc<AtomicBool>,
) -> Tally {
    let mut t = Tally::default();
    let mut conn: Option<SendRequest<Empty<Bytes>>> = None;
    let mut next = start;
    let mut k = first;
    loop {
        let now = Instant::now();
        let limit = if stop.load(Ordering::Relaxed) {
            now
        } else {
            end
        };
        if next >= limit {
            break;
        }
        if now >= limit {
            // Slots in [next, limit) never sent.
            let behind = (limit - next).as_secs_f64() / interval.as_secs_f64();
            t.unsent += behind.ceil() as u64;
            break;
        }
        if next > now {
            tokio::time::sleep_until(next.into()).await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let scheduled = next;
        next += interval;
        let path = &paths[k % paths.len()];
        k += 1;
        let sent = Instant::now();
        let r = tokio::time::timeout(
            REQUEST_TIMEOUT,
            one_request(&authority, path, &mut conn, &mut t),
        )
        .await
        .unwrap_or_else(|_| {
            conn = None;
            Err("timeout (30 s)".into())
        });
        let done = Instant::now();
        t.last_done = Some(done);
        match r {
            Ok(status) => {
                let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
                let lat = us(done - scheduled);
                t.latency_us.push(lat);
                let sec = (scheduled - t0).as_secs() as usize;
                if t.timeline.len() <= sec {
                    t.timeline.resize(sec + 1, [0; 3]);
                }
                let row = &mut t.timeline[sec];
                row[0] += 1;
                row[1] += u32::from(lat > 5000);
                row[2] = row[2].max(lat);
                t.service_us.push(us(done - sent));
                match status {
                    200 => t.ok += 1,
                    404 => t.not_found += 1,
                    503 => t.unavailable += 1,
                    s => *t.other_status.entry(s).or_default() += 1,
                }
            }
            Err(kind) => {
                t.error(kind);
                if conn.is_none() {
                    // A refused connection: do not spin until the next slot.
                    tokio::time::sleep_until(next.into()).await;
                }
            }
        }
    }
    t
}

/// Percentile `p` (0..=1) of sorted microseconds, in ms.
fn pct(sorted: &[u32], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i] as f64 / 1000.0)
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut u) != 0 {
            return f64::NAN;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(u.ru_utime) + tv(u.ru_stime)
    }
}

fn main() {
    let a = parse_args();
    let paths: Vec<String> = if let Some(p) = &a.path {
        vec![p.clone()]
    } else {
        let text = std::fs::read_to_string(&a.ids_file).unwrap_or_else(|e| {
            eprintln!("query_load: {}: {e}", a.ids_file);
            std::process::exit(2)
        });
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|id| format!("/v1/inferences/{}", percent_encode(id)))
            .collect()
    };
    if paths.is_empty() {
        eprintln!("query_load: no ids in {}", a.ids_file);
        std::process::exit(2);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).expect("signal handler");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let paths = Arc::new(paths);
    let authority: Arc<str> = a.authority.as_str().into();
    let c = a.connections;
    let interval = Duration::from_secs_f64(c as f64 / a.rate);
    let cpu0 = cpu_seconds();
    let (tally, elapsed) = rt.block_on(async {
        // Connect first, so the schedule starts with every connection open.
        let start = Instant::now() + Duration::from_millis(50);
        let end = start + Duration::from_secs_f64(a.seconds);
        let mut tasks = Vec::with_capacity(c);
        for i in 0..c {
            tasks.push(tokio::spawn(connection_task(
                authority.clone(),
                paths.clone(),
                i * paths.len() / c,
                start,
                start + interval.mul_f64(i as f64 / c as f64),
                interval,
                end,
                stop.clone(),
            )));
        }
        let mut all = Tally::default();
        for t in tasks {
            all.merge(t.await.expect("connection task"));
        }
        let finished = all.last_done.unwrap_or_else(Instant::now).max(start);
        (all, finished.saturating_duration_since(start))
    });
    let cpu = cpu_seconds() - cpu0;
    let mut lat = tally.latency_us;
    lat.sort_unstable();
    let mut svc = tally.service_us;
    svc.sort_unstable();
    let completed = lat.len() as u64;
    let secs = elapsed.as_secs_f64();
    let r2 = |x: Option<f64>| x.map(|v| (v * 1000.0).round() / 1000.0);
    let mut out = serde_json::json!({
        "label": a.label,
        "path": a.path.as_deref().unwrap_or("/v1/inferences/{id}"),
        "connections": c,
        "target_rps": a.rate,
        "elapsed_s": (secs * 1000.0).round() / 1000.0,
        "completed": completed,
        "achieved_rps": if secs > 0.0 { (completed as f64 / secs).round() } else { 0.0 },
        "status": {
            "200": tally.ok,
            "404": tally.not_found,
            "503": tally.unavailable,
            "other": tally.other_status.values().sum::<u64>(),
            "other_by_code": tally.other_status,
        },
        "errors": tally.errors.values().sum::<u64>(),
        "errors_by_kind": tally.errors,
        "unsent": tally.unsent,
        "reconnects": tally.reconnects,
        "resent_after_keepalive_close": tally.resent,
        "p50_ms": r2(pct(&lat, 0.50)),
        "p90_ms": r2(pct(&lat, 0.90)),
        "p99_ms": r2(pct(&lat, 0.99)),
        "p999_ms": r2(pct(&lat, 0.999)),
        "max_ms": r2(lat.last().map(|&v| v as f64 / 1000.0)),
        "service_p50_ms": r2(pct(&svc, 0.50)),
        "service_p99_ms": r2(pct(&svc, 0.99)),
        "service_p999_ms": r2(pct(&svc, 0.999)),
        "generator_cpu_s": (cpu * 100.0).round() / 100.0,
    });
    if a.timeline {
        out["timeline"] = tally
            .timeline
            .iter()
            .enumerate()
            .map(|(s, r)| serde_json::json!([s, r[0], r[1], r[2] as f64 / 1000.0]))
            .collect();
    }
    println!("{out}");
}
