//! The metrics of `jurystream connect` (SPEC §12), on its own listener:
//! a registry of their own (the service's families are not exported by
//! `connect`). The names are those of [`super`]; every label value comes
//! from a fixed set, never from the data.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::*;

/// Where a vote came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Api,
    Webhook,
    Sync,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Api => "api",
            Source::Webhook => "webhook",
            Source::Sync => "sync",
        }
    }
}

/// What became of a vote that came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteResult {
    Produced,
    Rejected,
    Failed,
}

impl VoteResult {
    pub fn as_str(self) -> &'static str {
        match self {
            VoteResult::Produced => "produced",
            VoteResult::Rejected => "rejected",
            VoteResult::Failed => "failed",
        }
    }
}

/// What routing one flag back to Label Studio did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    Requested,
    AtCap,
    TaskMissing,
    Skipped,
    Error,
}

impl Routing {
    pub fn as_str(self) -> &'static str {
        match self {
            Routing::Requested => "requested",
            Routing::AtCap => "at_cap",
            Routing::TaskMissing => "task_missing",
            Routing::Skipped => "skipped",
            Routing::Error => "error",
        }
    }
}

/// The webhook actions counted by name; any other is `other`.
pub const WEBHOOK_ACTIONS: [&str; 3] = [
    "ANNOTATION_CREATED",
    "ANNOTATION_UPDATED",
    "ANNOTATIONS_DELETED",
];

pub struct ConnectMetrics {
    registry: Registry,
    ready: AtomicBool,
    votes: IntCounterVec,
    webhooks: IntCounterVec,
    sync_runs: IntCounterVec,
    sync_missed: IntCounter,
    last_sync: Gauge,
    routing: IntCounterVec,
    produce: Histogram,
}

impl ConnectMetrics {
    pub fn new() -> Arc<ConnectMetrics> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, label: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), label).expect("valid metric")
        };
        let votes = counter(
            CONNECT_VOTES,
            "Votes that came in, by source (api, webhook, sync) and result (produced, rejected, failed).",
            &[SOURCE, RESULT],
        );
        let webhooks = counter(
            CONNECT_WEBHOOKS,
            "Label Studio webhooks received, by action.",
            &[ACTION],
        );
        let sync_runs = counter(
            CONNECT_SYNC_RUNS,
            "Sync passes over Label Studio's API, by result (ok, error).",
            &[RESULT],
        );
        let routing = counter(
            CONNECT_ROUTING,
            "Ambiguity flags routed back to Label Studio, by result.",
            &[RESULT],
        );
        let sync_missed = IntCounter::new(
            CONNECT_SYNC_MISSED,
            "Votes a sync produced that no webhook had brought to this instance.",
        )
        .expect("valid metric");
        let last_sync = Gauge::new(
            CONNECT_LAST_SYNC,
            "When the last sync pass succeeded (Unix seconds; 0 before one).",
        )
        .expect("valid metric");
        let produce = histogram(
            CONNECT_PRODUCE_DURATION,
            "Time from a request's first produce to the broker's last acknowledgement.",
            SECONDS_BUCKETS,
        );
        let build_info = IntGauge::with_opts(
            Opts::new(BUILD_INFO, "Build information (always 1).")
                .const_label(VERSION, env!("CARGO_PKG_VERSION")),
        )
        .expect("valid metric");
        build_info.set(1);
        // Every label value of the fixed sets at 0 from the start, so that
        // rate() and increase() see a series' first increment.
        for source in [Source::Api, Source::Webhook, Source::Sync] {
            for result in [
                VoteResult::Produced,
                VoteResult::Rejected,
                VoteResult::Failed,
            ] {
                votes.with_label_values(&[source.as_str(), result.as_str()]);
            }
        }
        for action in WEBHOOK_ACTIONS.iter().chain(&["other"]) {
            webhooks.with_label_values(&[action]);
        }
        for result in ["ok", "error"] {
            sync_runs.with_label_values(&[result]);
        }
        for r in [
            Routing::Requested,
            Routing::AtCap,
            Routing::TaskMissing,
            Routing::Skipped,
            Routing::Error,
        ] {
            routing.with_label_values(&[r.as_str()]);
        }
        register(&registry, votes.clone());
        register(&registry, webhooks.clone());
        register(&registry, sync_runs.clone());
        register(&registry, sync_missed.clone());
        register(&registry, last_sync.clone());
        register(&registry, routing.clone());
        register(&registry, produce.clone());
        register(&registry, build_info);
        Arc::new(ConnectMetrics {
            registry,
            ready: AtomicBool::new(false),
            votes,
            webhooks,
            sync_runs,
            sync_missed,
            last_sync,
            routing,
            produce,
        })
    }

    pub fn votes(&self, source: Source, result: VoteResult, n: u64) {
        if n > 0 {
            self.votes
                .with_label_values(&[source.as_str(), result.as_str()])
                .inc_by(n);
        }
    }

    pub fn webhook(&self, action: &str) {
        let label = if WEBHOOK_ACTIONS.contains(&action) {
            action
        } else {
            "other"
        };
        self.webhooks.with_label_values(&[label]).inc();
    }

    pub fn sync_run(&self, ok: bool, now_seconds: f64) {
        self.sync_runs
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
        if ok {
            self.last_sync.set(now_seconds);
        }
    }

    pub fn sync_missed(&self, n: u64) {
        self.sync_missed.inc_by(n);
    }

    pub fn routing(&self, r: Routing) {
        self.routing.with_label_values(&[r.as_str()]).inc();
    }

    pub fn produce_duration(&self, seconds: f64) {
        self.produce.observe(seconds);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

impl Exposition for ConnectMetrics {
    fn render(&self) -> String {
        render(&self.registry)
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connect_family_is_exported_with_its_labels() {
        let m = ConnectMetrics::new();
        m.votes(Source::Api, VoteResult::Rejected, 2);
        m.webhook("SOMETHING_ELSE");
        m.sync_run(true, 5.0);
        m.sync_missed(3);
        m.routing(Routing::AtCap);
        m.produce_duration(0.01);
        let text = m.render();
        for line in [
            "jurystream_connect_votes_total{result=\"rejected\",source=\"api\"} 2",
            "jurystream_connect_votes_total{result=\"produced\",source=\"sync\"} 0",
            "jurystream_connect_webhooks_total{action=\"other\"} 1",
            "jurystream_connect_sync_runs_total{result=\"ok\"} 1",
            "jurystream_connect_sync_missed_votes_total 3",
            "jurystream_connect_last_sync_timestamp_seconds 5",
            "jurystream_connect_routing_total{result=\"at_cap\"} 1",
            "jurystream_connect_produce_duration_seconds_count 1",
            "jurystream_build_info{version=",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(!m.is_ready());
        m.set_ready(true);
        assert!(m.is_ready());
    }
}
