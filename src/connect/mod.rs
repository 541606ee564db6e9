//! `jurystream connect` (contract §12): the front door between labelling tools
//! and Kafka. Stateless: any number of instances behind one address.
//!
//! - [`http`]: `POST /v1/votes` (any tool that can call a URL; votes
//!   checked by [`intake`], pure) and `POST /hooks/label-studio` (Label
//!   Studio's webhooks, mapped by [`mapping`], pure); both answer after the
//!   broker acknowledged every vote ([`produce`]: idempotent, `acks=all`).
//! - [`sync`]: Label Studio never retries a failed webhook, so the
//!   annotations updated since the last pass are read through its API
//!   ([`ls`]) and produced again; `run` drops the duplicates.
//! - [`routing`]: `ambiguity_flagged` events back to Label Studio: the
//!   disputed task asks for more reviews.
//!
//! Threads: the HTTP server's runtime (two workers), the sync, the routing
//! consumer; the main thread waits for SIGTERM/SIGINT.

pub mod error;
pub mod http;
pub mod intake;
pub mod ls;
pub mod mapping;
pub mod produce;
pub mod routing;
pub mod sync;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use error::ConnectError;

use crate::config::Config;
use crate::error::Chain;
use crate::input::DecodeOptions;
use crate::server::{serve_with, Limits};
use crate::telemetry::connect::ConnectMetrics;

/// Runs `connect` until `stop` is set.
pub fn run(cfg: Config, stop: &AtomicBool) -> Result<(), ConnectError> {
    let metrics = ConnectMetrics::new();
    let producer = produce::Producer::new(&cfg)?;
    let ls = &cfg.label_studio;
    let mapping = mapping::Mapping::of(ls);
    let sync_every = Duration::from_secs_f64(ls.sync_interval_seconds);
    let lookback = Duration::from_secs_f64(ls.sync_lookback_seconds);
    let intake = Arc::new(http::Intake {
        producer,
        metrics: metrics.clone(),
        token: (!cfg.connect.token.is_empty()).then(|| cfg.connect.token.clone()),
        decode: DecodeOptions {
            max_message_bytes: cfg.input.max_message_bytes as usize,
            default_voter_prompt_id: cfg.input.default_voter_prompt_id.clone(),
        },
        max_skew: crate::config::seconds_to_ns(cfg.input.max_future_skew_seconds),
        mapping: mapping.clone(),
        projects: ls.projects.clone(),
    });
    let addr: std::net::SocketAddr =
        cfg.connect
            .listen
            .parse()
            .map_err(|source| ConnectError::Address {
                key: "connect.listen",
                source,
            })?;
    let produce_timeout = Duration::from_millis(cfg.connect.produce_timeout_ms as u64);
    let limits = Limits {
        body_bytes: cfg.connect.max_body_bytes as usize,
        // The broker's wait, and time to read a large body.
        request_timeout: produce_timeout + Duration::from_secs(30),
        workers: 2,
    };
    let server = serve_with(addr, metrics.clone(), http::routes(intake.clone()), limits)
        .map_err(|source| ConnectError::Listen { addr, source })?;
    let bound = server.addr;
    tracing::info!(%bound, topic = intake.producer.topic(), token = intake.token.is_some(),
        "connect: serving POST /v1/votes, POST /hooks/label-studio, /metrics, /healthz, /readyz");

    // Ready once the broker answers with the input topic.
    let mut wait = Duration::from_millis(200);
    loop {
        match intake.producer.check_topic() {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %Chain(&e), "connect: not ready yet");
                if stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
    metrics.set_ready(true);

    let client = (!ls.url.is_empty()).then(|| Arc::new(ls::Client::new(&ls.url, &ls.token)));
    std::thread::scope(|scope| -> Result<(), ConnectError> {
        if let Some(client) = &client {
            if ls.sync_interval_seconds > 0.0 {
                let s = sync::Syncer {
                    client: client.clone(),
                    mapping: mapping.clone(),
                    projects: ls.projects.clone(),
                    interval: sync_every,
                    lookback,
                };
                let (producer, metrics) = (&intake.producer, &*metrics);
                std::thread::Builder::new()
                    .name("ls-sync".into())
                    .spawn_scoped(scope, move || s.run(producer, metrics, stop))
                    .map_err(|source| ConnectError::Thread {
                        thread: "sync",
                        source,
                    })?;
            }
            if ls.extra_reviews > 0 {
                let r = routing::Router {
                    client: client.clone(),
                    extra: ls.extra_reviews as u64,
                    max: ls.max_annotations as u64,
                    projects: ls.projects.clone(),
                };
                let (cfg, metrics) = (&cfg, &*metrics);
                std::thread::Builder::new()
                    .name("ls-routing".into())
                    .spawn_scoped(scope, move || r.run(cfg, metrics, stop))
                    .map_err(|source| ConnectError::Thread {
                        thread: "routing",
                        source,
                    })?;
            }
        } else {
            tracing::info!("connect: label_studio.url is empty: no sync and no routing");
        }
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    })?;
    // contract §12 (v4): out of rotation first, then serve on for the drain
    // time (a load balancer's health check notices the 503 meanwhile),
    // then finish every request received.
    metrics.set_ready(false);
    let drain = Duration::from_secs_f64(cfg.connect.drain_seconds);
    tracing::info!(
        drain_seconds = cfg.connect.drain_seconds,
        "connect: draining (/readyz answers 503)"
    );
    std::thread::sleep(drain);
    server.shutdown();
    intake.producer.flush();
    tracing::info!("connect: stopped");
    Ok(())
}
