//! Metrics and health (SPEC §8): the one place that names every metric and
//! the label-cardinality cap. The metrics live in a `prometheus` registry
//! and are exposed in the Prometheus text format 0.0.4 by [`http::serve`]
//! (`/metrics`, `/healthz`, `/readyz`).
//!
//! The labelled families whose label values come from the data
//! (`model_id`/`voter_prompt_id`, `topic`/`partition`, `partition`) are kept
//! in [`family`]: their children are keyed by the label values themselves,
//! not by the crate's `MetricVec` hash (see there why).

pub mod family;
pub mod http;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::engine::agreement::RubricSums;
use crate::engine::board::FIXED_ONE;
use crate::engine::{Counters, ScoreUpdate};
use family::{CounterFamily, GaugeFamily, SeriesCollector, SeriesTable};
use rustc_hash::FxHashMap;

pub use http::{serve, Exposition};

pub mod connect;

/// A registry in the text format 0.0.4 ([`CONTENT_TYPE`]).
fn render(registry: &Registry) -> String {
    TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap_or_else(|e| {
            // Cannot happen with the metrics of this module.
            tracing::error!(error = %e, "cannot encode the metrics");
            String::new()
        })
}

impl Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }

    fn is_ready(&self) -> bool {
        Metrics::is_ready(self)
    }
}

// Every metric name, in one place (dashboards and alert rules use them).
pub const VOTES_ACCEPTED: &str = "jurystream_votes_accepted_total";
pub const VOTES_DUPLICATE: &str = "jurystream_votes_duplicate_total";
pub const VOTES_SUPERSEDED: &str = "jurystream_votes_superseded_total";
pub const VOTES_REJECTED: &str = "jurystream_votes_rejected_total";
pub const ABSTENTIONS: &str = "jurystream_abstentions_total";
pub const SCORE_UPDATES: &str = "jurystream_score_updates_total";
pub const AMBIGUITY_FLAGS: &str = "jurystream_ambiguity_flags_total";
pub const FRESHNESS: &str = "jurystream_freshness";
pub const SCORE: &str = "jurystream_score";
pub const LAST_FRESHNESS: &str = "jurystream_last_freshness";
pub const LAST_SCORE_UPDATE: &str = "jurystream_last_score_update_timestamp_seconds";
pub const BATCH_VOTES: &str = "jurystream_batch_votes";
pub const BATCH_VARIANCE: &str = "jurystream_batch_variance";
pub const OPEN_BATCHES: &str = "jurystream_open_batches";
pub const CACHE_BYTES: &str = "jurystream_state_cache_bytes";
pub const WATERMARK: &str = "jurystream_watermark_timestamp_seconds";
/// Per input partition this instance holds: 1 ready, 0 being restored.
pub const PARTITION_READY: &str = "jurystream_partition_ready";
pub const CONSUMER_LAG: &str = "jurystream_consumer_lag_messages";
pub const COMMIT_DURATION: &str = "jurystream_commit_duration_seconds";
pub const RESTORE_DURATION: &str = "jurystream_state_restore_duration_seconds";
pub const BUILD_INFO: &str = "jurystream_build_info";
/// Changelog records the restores of this process applied.
pub const RESTORED_RECORDS: &str = "jurystream_state_restored_records_total";
/// Consumer group rebalances of this process, by `event` (`assigned`,
/// `revoked`, `lost`).
pub const REBALANCES: &str = "jurystream_rebalances_total";
/// Time to hand over revoked partitions (finish or abort the open cycle,
/// release the state).
pub const REVOKE_DURATION: &str = "jurystream_revoke_duration_seconds";
/// Outbox mode: cycles a restore found not marked delivered, whose
/// missing events it published (`jurystream_outbox_republished_events_total`).
pub const OUTBOX_RECOVERED_CYCLES: &str = "jurystream_outbox_recovered_cycles_total";
pub const OUTBOX_REPUBLISHED: &str = "jurystream_outbox_republished_events_total";
/// The delivery mode of `run` (`mode` label, value 1).
pub const DELIVERY_MODE: &str = "jurystream_delivery_mode";
/// SPEC §8 (v3 name; v2's `jurystream_model_score_sum` broke Prometheus'
/// rule that a `_sum` suffix belongs to a histogram or summary).
pub const MODEL_SCORES: &str = "jurystream_model_scores";
/// SPEC §13: with the two beside it, PromQL gives the leaderboard's
/// `score_sd` over every instance.
pub const MODEL_SCORE_SQUARES: &str = "jurystream_model_score_squares";
pub const MODEL_SERIES: &str = "jurystream_model_series";
/// Reviewer agreement sums (SPEC §11), per rubric; α over any range is
/// 1 − (n − 1)·W / (n·S2 − S1²) of their `increase()`s.
pub const AGREEMENT_PAIRABLE: &str = "jurystream_agreement_pairable_votes_total";
pub const AGREEMENT_SUM: &str = "jurystream_agreement_vote_sum_total";
pub const AGREEMENT_SQUARE_SUM: &str = "jurystream_agreement_vote_square_sum_total";
pub const AGREEMENT_WITHIN: &str = "jurystream_agreement_within_unit_total";

/// `jurystream connect` (SPEC §12; its own `/metrics`). Votes in, by
/// `source` (`api`: `POST /v1/votes`; `webhook`: Label Studio's webhooks;
/// `sync`: the periodic read of Label Studio's API) and `result`
/// (`produced`: acknowledged by the broker, including mapped votes `run`
/// will reject to its DLQ; `rejected`: refused by the §1 rules, never
/// produced; `failed`: not acknowledged in time, the request answered 503).
pub const CONNECT_VOTES: &str = "jurystream_connect_votes_total";
/// Label Studio webhooks received, by `action` (`ANNOTATION_CREATED`,
/// `ANNOTATION_UPDATED`, `ANNOTATIONS_DELETED`, else `other`).
pub const CONNECT_WEBHOOKS: &str = "jurystream_connect_webhooks_total";
/// Sync passes over Label Studio's API, by `result` (`ok`, `error`).
pub const CONNECT_SYNC_RUNS: &str = "jurystream_connect_sync_runs_total";
/// Votes a sync produced that no webhook had brought to this instance
/// (a webhook lost while `connect` was down or unreachable).
pub const CONNECT_SYNC_MISSED: &str = "jurystream_connect_sync_missed_votes_total";
/// When the last sync pass succeeded (Unix seconds).
pub const CONNECT_LAST_SYNC: &str = "jurystream_connect_last_sync_timestamp_seconds";
/// Flags routed back to Label Studio, by `result` (`requested`: the task's
/// overlap raised and the task unlabelled; `at_cap`: already at
/// `label_studio.max_annotations`; `task_missing`: the task is gone;
/// `skipped`: no Label Studio vote in the flag; `error`: a Label Studio
/// call failed, retried).
pub const CONNECT_ROUTING: &str = "jurystream_connect_routing_total";
/// Time from a request's produce to the broker's last acknowledgement.
pub const CONNECT_PRODUCE_DURATION: &str = "jurystream_connect_produce_duration_seconds";
/// Label names of the connect metrics.
pub const SOURCE: &str = "source";
pub const RESULT: &str = "result";
pub const ACTION: &str = "action";

/// The label names (SPEC §8). No label ever carries an inference or voter id.
pub const MODEL_ID: &str = "model_id";
pub const VOTER_PROMPT_ID: &str = "voter_prompt_id";
pub const REASON: &str = "reason";
pub const PARTITION: &str = "partition";
pub const TOPIC: &str = "topic";
pub const VERSION: &str = "version";
/// The `model_id` of a score update without one.
pub const UNKNOWN_MODEL: &str = "unknown";
/// What a label value becomes once its label has `metrics.max_label_values`
/// distinct values.
pub const OTHER: &str = "other";

/// The content type of [`Metrics::render`]'s text (format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

const FRESHNESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0,
];
const SCORE_BUCKETS: &[f64] = &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
const BATCH_VOTE_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 1000.0];
const VARIANCE_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25];
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The (model_id, voter_prompt_id) families: name, help, and for the
/// histograms their buckets. [`family::SeriesTable`] creates one child of
/// each per label pair.
pub(crate) mod series {
    pub const SCORE_UPDATES_HELP: &str = "score_updated events emitted.";
    pub const AMBIGUITY_FLAGS_HELP: &str = "ambiguity_flagged events emitted.";
    pub const FRESHNESS_HELP: &str = "Freshness (1 - alpha) of score updates.";
    pub const SCORE_HELP: &str = "Scores after update.";
    pub const LAST_FRESHNESS_HELP: &str = "Freshness of the latest score update.";
    pub const LAST_SCORE_UPDATE_HELP: &str =
        "Wall-clock time of the latest score update (Unix seconds).";
    pub const FRESHNESS_BUCKETS: &[f64] = super::FRESHNESS_BUCKETS;
    pub const SCORE_BUCKETS: &[f64] = super::SCORE_BUCKETS;
}

/// Per-partition bookkeeping behind the engine counters and `open_batches`.
#[derive(Debug, Default)]
struct Partitions {
    /// The engine counters already folded in, per partition (kept when a
    /// partition goes away: its counts stay).
    folded: HashMap<String, Counters>,
    /// Open batches and cache bytes per partition; the gauges are sums.
    open: HashMap<String, (u64, u64)>,
    /// Agreement sums already counted, per partition and rubric (set when
    /// a partition is taken into service, moved after each commit).
    agreement: HashMap<String, HashMap<crate::input::Id, RubricSums>>,
}

/// The process's metrics. Cheap to share (`Arc`). Counters and histograms
/// are atomics; a score update takes one uncontended lock (label cap and
/// the cached children of its label pair).
pub struct Metrics {
    registry: Registry,
    ready: AtomicBool,
    accepted: IntCounter,
    duplicate: IntCounter,
    superseded: IntCounter,
    abstentions: IntCounter,
    rejected: IntCounterVec,
    series: Arc<Mutex<SeriesTable>>,
    batch_votes: Histogram,
    batch_variance: Histogram,
    open_batches: IntGauge,
    cache_bytes: IntGauge,
    watermark: GaugeFamily,
    partition_ready: GaugeFamily,
    lag: GaugeFamily,
    commit: Histogram,
    restore: Histogram,
    restored_records: IntCounter,
    rebalances: IntCounterVec,
    revoke: Histogram,
    outbox_recovered: IntCounter,
    outbox_republished: IntCounter,
    delivery_mode: prometheus::IntGaugeVec,
    model_scores: GaugeFamily,
    model_score_squares: GaugeFamily,
    model_series: GaugeFamily,
    /// n, S1, S2, W of SPEC §11.
    agreement: [CounterFamily; 4],
    partitions: Mutex<Partitions>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::with_opts(Opts::new(name, help)).expect("valid metric name")
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("valid histogram")
}

fn register(registry: &Registry, c: impl Collector + 'static) {
    registry
        .register(Box::new(c))
        .expect("metric names and label sets are unique");
}

/// Locks, ignoring poisoning (a panic elsewhere must not stop the metrics).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    pub fn new(max_label_values: usize) -> Arc<Metrics> {
        let registry = Registry::new();
        let accepted = counter(VOTES_ACCEPTED, "Votes accepted into a batch.");
        let duplicate = counter(VOTES_DUPLICATE, "Redelivered votes dropped as duplicates.");
        let superseded = counter(
            VOTES_SUPERSEDED,
            "Votes replaced by a later vote of the same voter in a batch.",
        );
        let rejected = IntCounterVec::new(
            Opts::new(VOTES_REJECTED, "Messages sent to the DLQ, by reason."),
            &[REASON],
        )
        .expect("valid metric");
        // Every reason is exported from the start, at 0.
        for r in crate::input::Reason::ALL {
            rejected.with_label_values(&[r.as_str()]);
        }
        let abstentions = counter(ABSTENTIONS, "Abstentions (null votes) in closed batches.");
        let series = Arc::new(Mutex::new(SeriesTable::new(max_label_values)));
        let batch_votes = histogram(
            BATCH_VOTES,
            "Counted votes per scored batch.",
            BATCH_VOTE_BUCKETS,
        );
        let batch_variance = histogram(
            BATCH_VARIANCE,
            "Weighted vote variance per scored batch.",
            VARIANCE_BUCKETS,
        );
        let open_batches = IntGauge::with_opts(Opts::new(
            OPEN_BATCHES,
            "Batches open (waiting for their window to close).",
        ))
        .expect("valid metric");
        let cache_bytes = IntGauge::with_opts(Opts::new(
            CACHE_BYTES,
            "Approximate bytes of series states and vote identities cached in memory (state.cache_mb bounds it).",
        ))
        .expect("valid metric");
        let watermark = GaugeFamily::new(
            WATERMARK,
            "Event-time watermark per input partition (Unix seconds).",
            &[PARTITION],
        );
        let partition_ready = GaugeFamily::new(
            PARTITION_READY,
            "Input partitions this instance holds: 1 ready (restored, consuming), 0 being restored.",
            &[PARTITION],
        );
        let lag = GaugeFamily::new(
            CONSUMER_LAG,
            "Messages behind the end of each input partition (librdkafka statistics).",
            &[TOPIC, PARTITION],
        );
        let commit = histogram(
            COMMIT_DURATION,
            "Duration of one commit cycle: the wait for the previous cycle's state write, then changelog, events and offsets (the state write itself runs after it, off the poll loop).",
            SECONDS_BUCKETS,
        );
        let restore = histogram(
            RESTORE_DURATION,
            "Duration of one partition state restore.",
            SECONDS_BUCKETS,
        );
        let restored_records = counter(
            RESTORED_RECORDS,
            "Changelog records applied by state restores.",
        );
        let rebalances = IntCounterVec::new(
            Opts::new(
                REBALANCES,
                "Consumer group rebalances, by event (assigned, revoked, lost).",
            ),
            &["event"],
        )
        .expect("valid metric");
        for e in ["assigned", "revoked", "lost"] {
            rebalances.with_label_values(&[e]);
        }
        let revoke = histogram(
            REVOKE_DURATION,
            "Duration of one hand-over of revoked partitions (finish or abort the open cycle, release the state).",
            SECONDS_BUCKETS,
        );
        let outbox_recovered = counter(
            OUTBOX_RECOVERED_CYCLES,
            "Outbox mode: cycles a restore found not marked delivered and completed.",
        );
        let outbox_republished = counter(
            OUTBOX_REPUBLISHED,
            "Outbox mode: events of such cycles missing from the outputs, published by the restore.",
        );
        let delivery_mode = prometheus::IntGaugeVec::new(
            Opts::new(
                DELIVERY_MODE,
                "The delivery mode of run (kafka.delivery): 1 for the mode in use.",
            ),
            &["mode"],
        )
        .expect("valid metric");
        let model_scores = GaugeFamily::new(
            MODEL_SCORES,
            "Sum of the current scores of this instance's scored series, per model and rubric.",
            &[MODEL_ID, VOTER_PROMPT_ID],
        );
        let model_score_squares = GaugeFamily::new(
            MODEL_SCORE_SQUARES,
            "Sum of the squared current scores of this instance's scored series, per model and rubric.",
            &[MODEL_ID, VOTER_PROMPT_ID],
        );
        let model_series = GaugeFamily::new(
            MODEL_SERIES,
            "Scored series (update_seq >= 1) this instance holds, per model and rubric.",
            &[MODEL_ID, VOTER_PROMPT_ID],
        );
        let agreement = [
            (
                AGREEMENT_PAIRABLE,
                "Counted votes in closed batches with at least two (pairable votes n of Krippendorff's alpha), per rubric.",
            ),
            (
                AGREEMENT_SUM,
                "Sum of the pairable votes' values (S1), per rubric.",
            ),
            (
                AGREEMENT_SQUARE_SUM,
                "Sum of the pairable votes' squared values (S2), per rubric.",
            ),
            (
                AGREEMENT_WITHIN,
                "Sum over batches of (m*sum(v^2) - sum(v)^2)/(m-1) (W); alpha = 1 - (n-1)*W/(n*S2 - S1^2), per rubric.",
            ),
        ]
        .map(|(name, help)| CounterFamily::new(name, help, &[VOTER_PROMPT_ID]));
        let build_info = IntGauge::with_opts(
            Opts::new(BUILD_INFO, "Build information (always 1).")
                .const_label(VERSION, env!("CARGO_PKG_VERSION")),
        )
        .expect("valid metric");
        build_info.set(1);

        register(&registry, accepted.clone());
        register(&registry, duplicate.clone());
        register(&registry, superseded.clone());
        register(&registry, rejected.clone());
        register(&registry, abstentions.clone());
        register(&registry, SeriesCollector::new(series.clone()));
        register(&registry, batch_votes.clone());
        register(&registry, batch_variance.clone());
        register(&registry, open_batches.clone());
        register(&registry, cache_bytes.clone());
        register(&registry, watermark.clone());
        register(&registry, partition_ready.clone());
        register(&registry, lag.clone());
        register(&registry, commit.clone());
        register(&registry, restore.clone());
        register(&registry, restored_records.clone());
        register(&registry, rebalances.clone());
        register(&registry, revoke.clone());
        register(&registry, outbox_recovered.clone());
        register(&registry, outbox_republished.clone());
        register(&registry, delivery_mode.clone());
        register(&registry, model_scores.clone());
        register(&registry, model_score_squares.clone());
        register(&registry, model_series.clone());
        for f in &agreement {
            register(&registry, f.clone());
        }
        register(&registry, build_info);

        Arc::new(Metrics {
            registry,
            ready: AtomicBool::new(false),
            accepted,
            duplicate,
            superseded,
            abstentions,
            rejected,
            series,
            batch_votes,
            batch_variance,
            open_batches,
            cache_bytes,
            watermark,
            partition_ready,
            lag,
            commit,
            restore,
            restored_records,
            rebalances,
            revoke,
            outbox_recovered,
            outbox_republished,
            delivery_mode,
            model_scores,
            model_score_squares,
            model_series,
            agreement,
            partitions: Mutex::new(Partitions::default()),
        })
    }

    /// Changelog records a restore applied.
    pub fn restored_records(&self, n: u64) {
        self.restored_records.inc_by(n);
    }

    /// A rebalance event: `assigned`, `revoked` or `lost`.
    pub fn rebalance(&self, event: &'static str) {
        self.rebalances.with_label_values(&[event]).inc();
    }

    pub fn revoke_duration(&self, seconds: f64) {
        self.revoke.observe(seconds);
    }

    /// Outbox mode: an in-doubt cycle completed, `republished` of its
    /// events published by the restore.
    pub fn outbox_recovered(&self, republished: usize) {
        self.outbox_recovered.inc();
        self.outbox_republished.inc_by(republished as u64);
    }

    pub fn set_delivery_mode(&self, mode: &str) {
        self.delivery_mode.with_label_values(&[mode]).set(1);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// A rejection (any reason, `late` included).
    pub fn rejected(&self, reason: crate::input::Reason) {
        self.rejected.with_label_values(&[reason.as_str()]).inc();
    }

    /// Folds a partition engine's counters in (accepted, duplicates,
    /// superseded, abstentions); call after each processed record or cycle.
    pub fn engine_counters(
        &self,
        partition: &str,
        c: &Counters,
        open_batches: usize,
        cache_bytes: usize,
        watermark: Option<i128>,
    ) {
        let mut g = lock(&self.partitions);
        let prev = g.folded.get(partition).copied().unwrap_or_default();
        self.accepted
            .inc_by(c.accepted.saturating_sub(prev.accepted));
        self.duplicate
            .inc_by(c.duplicates.saturating_sub(prev.duplicates));
        self.superseded
            .inc_by(c.superseded.saturating_sub(prev.superseded));
        self.abstentions
            .inc_by(c.abstentions.saturating_sub(prev.abstentions));
        match g.folded.get_mut(partition) {
            Some(f) => *f = *c,
            None => {
                g.folded.insert(partition.to_owned(), *c);
            }
        }
        let now = (open_batches as u64, cache_bytes as u64);
        match g.open.get_mut(partition) {
            Some(n) => *n = now,
            None => {
                g.open.insert(partition.to_owned(), now);
            }
        }
        self.set_partition_sums(&g);
        if let Some(wm) = watermark {
            self.watermark.set(&[partition], wm as f64 / 1e9);
        }
    }

    /// [`Metrics::engine_counters`] for one partition's engine.
    pub fn observe_engine(&self, partition: &str, e: &crate::engine::Engine) {
        self.engine_counters(
            partition,
            &e.counters,
            e.open_batches(),
            e.cache_bytes(),
            e.watermark(),
        );
    }

    fn set_partition_sums(&self, g: &Partitions) {
        let (open, cache) = g
            .open
            .values()
            .fold((0, 0), |(a, b), (o, c)| (a + o, b + c));
        self.open_batches.set(open as i64);
        self.cache_bytes.set(cache as i64);
    }

    /// Sets the leaderboard gauges from the leaderboard rows of every
    /// partition this instance holds (label values capped like the other
    /// model/rubric families; pairs that are gone disappear).
    pub fn model_board<'a>(
        &self,
        rows: impl IntoIterator<
            Item = (
                &'a crate::engine::board::BoardKey,
                &'a crate::engine::board::BoardRow,
            ),
        >,
    ) {
        // Rows merged per label pair (capped labels join rows) first, so
        // that each gauge is one exact fixed-point sum.
        let mut sums: std::collections::BTreeMap<Vec<String>, crate::engine::board::BoardRow> =
            Default::default();
        {
            let mut t = lock(&self.series);
            for (k, r) in rows {
                let model = k.model_id.as_deref().unwrap_or(UNKNOWN_MODEL);
                let (m, v) = t.capped(model, &k.voter_prompt_id);
                sums.entry(vec![m, v]).or_default().add(r);
            }
        }
        let fixed = |x: i128| x as f64 / FIXED_ONE;
        self.model_scores
            .replace_all(sums.iter().map(|(k, r)| (k.clone(), fixed(r.score_sum))));
        self.model_score_squares.replace_all(
            sums.iter()
                .map(|(k, r)| (k.clone(), fixed(r.score_squares))),
        );
        self.model_series
            .replace_all(sums.into_iter().map(|(k, r)| (k, r.series as f64)));
    }

    /// A partition's agreement sums as it is taken into service: counted
    /// from here on (what was committed before counts where it happened).
    pub fn agreement_baseline(
        &self,
        partition: &str,
        sums: &FxHashMap<crate::input::Id, RubricSums>,
    ) {
        let base = sums.iter().map(|(k, v)| (k.clone(), *v)).collect();
        lock(&self.partitions)
            .agreement
            .insert(partition.to_owned(), base);
    }

    /// A partition's agreement sums after a commit: the counters move by
    /// what was committed since the last call (so a cycle that is aborted
    /// and redone counts once, and PromQL α over the group's counters
    /// equals α of the committed sums).
    pub fn agreement_committed(
        &self,
        partition: &str,
        sums: &FxHashMap<crate::input::Id, RubricSums>,
    ) {
        let mut g = lock(&self.partitions);
        let folded = g.agreement.entry(partition.to_owned()).or_default();
        let mut t = lock(&self.series);
        for (rubric, now) in sums {
            let before = folded.get(rubric).copied().unwrap_or_default();
            if *now == before {
                continue;
            }
            let label = t.capped_rubric(rubric);
            let deltas = [
                now.pairable.saturating_sub(before.pairable) as f64,
                (now.sum - before.sum).max(0) as f64 / FIXED_ONE,
                (now.square_sum - before.square_sum).max(0) as f64 / FIXED_ONE,
                (now.within - before.within).max(0) as f64 / FIXED_ONE,
            ];
            for (family, d) in self.agreement.iter().zip(deltas) {
                family.inc_by(&[&label], d);
            }
            folded.insert(rubric.clone(), *now);
        }
    }

    /// A partition went away (revoked): its gauges go, its counts stay.
    /// The input partitions this instance holds now (`partition`, ready),
    /// replacing the last set.
    pub fn partitions_held(&self, held: impl IntoIterator<Item = (String, bool)>) {
        self.partition_ready.replace_all(
            held.into_iter()
                .map(|(p, ready)| (vec![p], if ready { 1.0 } else { 0.0 })),
        );
    }

    pub fn forget_partition(&self, partition: &str) {
        let mut g = lock(&self.partitions);
        g.open.remove(partition);
        g.agreement.remove(partition);
        self.set_partition_sums(&g);
        self.watermark.remove(&[partition]);
    }

    /// One emitted score update; `now_seconds` is the wall clock.
    pub fn score_update(&self, u: &ScoreUpdate, now_seconds: f64) {
        let model = u.model_id.as_deref().unwrap_or(UNKNOWN_MODEL);
        let freshness = 1.0 - u.alpha;
        lock(&self.series).with(model, &u.series.voter_prompt_id, |s| {
            s.updates.inc();
            if u.ambiguous {
                s.flag();
            }
            s.freshness.observe(freshness);
            s.score.observe(u.score);
            s.last_freshness.set(freshness);
            s.last_update.set(now_seconds);
        });
        self.batch_votes.observe(u.votes.len() as f64);
        self.batch_variance.observe(u.variance);
    }

    pub fn commit_duration(&self, seconds: f64) {
        self.commit.observe(seconds);
    }

    pub fn restore_duration(&self, seconds: f64) {
        self.restore.observe(seconds);
    }

    /// A revoked partition's lag is no longer this instance's to report.
    pub fn forget_lag(&self, topic: &str, partition: i32) {
        self.lag.remove(&[topic, &partition.to_string()]);
    }

    pub fn consumer_lag(&self, topic: &str, partition: i32, lag: i64) {
        self.lag.set(&[topic, &partition.to_string()], lag as f64);
    }

    /// Prometheus text exposition format 0.0.4 ([`CONTENT_TYPE`]). A
    /// labelled family appears once it has a series.
    pub fn render(&self) -> String {
        render(&self.registry)
    }

    /// The registry's metric families (for tests and future exporters).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }
}

#[cfg(test)]
mod tests;
