//! The metrics of `jurystream connect` (contract §12), on its own listener:
//! a registry of their own (the service's families are not exported by
//! `connect`). The names are those of [`super`]; every label value comes
//! from a fixed set, never from the data.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::*;

/// `result`, `source` (in the order of their names, as always exported).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VoteLabels {
    result: &'static str,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

// The enums' label values are written by hand (`as_str`):
// prometheus-client's `EncodeLabelValue` derive writes a variant's name as
// it is (`AtCap`, not `at_cap`) and takes no rename.

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
    votes: Family<VoteLabels, Counter>,
    webhooks: Family<ActionLabel, Counter>,
    sync_runs: Family<ResultLabel, Counter>,
    last_sync: Gauge<f64, AtomicU64>,
    routing: Family<ResultLabel, Counter>,
    produce: Histogram,
}

impl std::fmt::Debug for ConnectMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectMetrics")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl ConnectMetrics {
    pub fn new() -> Arc<ConnectMetrics> {
        let mut registry = Registry::default();
        let r = &mut registry;
        // Every label value of the fixed sets at 0 from the start, so that
        // rate() and increase() see a series' first increment.
        let votes = Family::<VoteLabels, Counter>::default();
        for source in [Source::Api, Source::Webhook, Source::Sync] {
            for result in [
                VoteResult::Produced,
                VoteResult::Rejected,
                VoteResult::Failed,
            ] {
                votes.get_or_create_owned(&VoteLabels {
                    result: result.as_str(),
                    source: source.as_str(),
                });
            }
        }
        register(
            r,
            CONNECT_VOTES,
            "Votes that came in, by source (api, webhook, sync) and result (produced, rejected, failed).",
            votes.clone(),
            true,
        );
        let webhooks = Family::<ActionLabel, Counter>::default();
        for action in WEBHOOK_ACTIONS.iter().chain(&["other"]) {
            webhooks.get_or_create_owned(&ActionLabel { action });
        }
        register(
            r,
            CONNECT_WEBHOOKS,
            "Label Studio webhooks received, by action.",
            webhooks.clone(),
            true,
        );
        let sync_runs = Family::<ResultLabel, Counter>::default();
        for result in ["ok", "error"] {
            sync_runs.get_or_create_owned(&ResultLabel { result });
        }
        register(
            r,
            CONNECT_SYNC_RUNS,
            "Sync passes over Label Studio's API, by result (ok, error).",
            sync_runs.clone(),
            true,
        );
        let last_sync = Gauge::<f64, AtomicU64>::default();
        register(
            r,
            CONNECT_LAST_SYNC,
            "When the last sync pass succeeded (Unix seconds; 0 before one).",
            last_sync.clone(),
            false,
        );
        let routing = Family::<ResultLabel, Counter>::default();
        for result in [
            Routing::Requested,
            Routing::AtCap,
            Routing::TaskMissing,
            Routing::Skipped,
            Routing::Error,
        ] {
            routing.get_or_create_owned(&ResultLabel {
                result: result.as_str(),
            });
        }
        register(
            r,
            CONNECT_ROUTING,
            "Ambiguity flags routed back to Label Studio, by result.",
            routing.clone(),
            true,
        );
        let produce = histogram(SECONDS_BUCKETS);
        register(
            r,
            CONNECT_PRODUCE_DURATION,
            "Time from a request's first produce to the broker's last acknowledgement.",
            produce.clone(),
            false,
        );
        build_info(r);
        Arc::new(ConnectMetrics {
            registry,
            ready: AtomicBool::new(false),
            votes,
            webhooks,
            sync_runs,
            last_sync,
            routing,
            produce,
        })
    }

    pub fn votes(&self, source: Source, result: VoteResult, n: u64) {
        if n > 0 {
            self.votes
                .get_or_create(&VoteLabels {
                    result: result.as_str(),
                    source: source.as_str(),
                })
                .inc_by(n);
        }
    }

    pub fn webhook(&self, action: &str) {
        let action = WEBHOOK_ACTIONS
            .iter()
            .find(|a| **a == action)
            .copied()
            .unwrap_or("other");
        self.webhooks.get_or_create(&ActionLabel { action }).inc();
    }

    pub fn sync_run(&self, ok: bool, now_seconds: f64) {
        let result = if ok { "ok" } else { "error" };
        self.sync_runs.get_or_create(&ResultLabel { result }).inc();
        if ok {
            self.last_sync.set(now_seconds);
        }
    }

    pub fn routing(&self, r: Routing) {
        self.routing
            .get_or_create(&ResultLabel { result: r.as_str() })
            .inc();
    }

    pub fn produce_duration(&self, seconds: f64) {
        self.produce.observe(seconds);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The metrics in the text format 0.0.4 ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        render(&self.registry)
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
        m.routing(Routing::AtCap);
        m.produce_duration(0.01);
        let text = m.render();
        for line in [
            "jurystream_connect_votes_total{result=\"rejected\",source=\"api\"} 2",
            "jurystream_connect_votes_total{result=\"produced\",source=\"sync\"} 0",
            "jurystream_connect_webhooks_total{action=\"other\"} 1",
            "jurystream_connect_sync_runs_total{result=\"ok\"} 1",
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
