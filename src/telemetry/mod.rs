//! Metrics (contract §8): the one place that names every metric and the
//! label-cardinality cap. It only measures: the metrics live in a
//! `prometheus-client` registry, [`Metrics::render`] writes them in the
//! Prometheus text format 0.0.4 ([`CONTENT_TYPE`]), and the HTTP server
//! that exposes them is [`crate::server`].
//!
//! Each labelled family has a typed label set (`#[derive(EncodeLabelSet)]`);
//! its children are keyed by the label values themselves, so values that
//! run together alike (`{topic="votes",partition="12"}` and
//! `{topic="votes1",partition="2"}`) stay two series. Counters are
//! registered without their `_total` suffix (the encoder appends it), and
//! help texts without their final period (the registry appends it), so
//! that names and help texts are exactly those below.

pub mod connect;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::engine::{Counters, ScoreUpdate};

mod names;
pub use names::*;

mod register;
mod reputation;
use reputation::ReputationMetrics;

const FRESHNESS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0,
];
const SCORE_BUCKETS: &[f64] = &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
const BATCH_VOTE_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 1000.0];
const VARIANCE_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25];
/// Finer where a reviewer could notice (tens to hundreds of milliseconds).
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0,
];
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A float gauge (the integer ones are `Gauge`).
type FloatGauge = Gauge<f64, AtomicU64>;
/// A float counter (sums of data values).
type FloatCounter = Counter<f64, AtomicU64>;
/// A family of histograms, made with the family's buckets.
type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

mod labels;
pub use labels::VOTE_SOURCES;
use labels::*;

/// Registers `metric` as `name` with `help`, both as they appear in the
/// exposition: the registry appends the period to the help text, the
/// encoder `_total` to a counter's name.
fn register(registry: &mut Registry, name: &str, help: &str, metric: impl Metric, counter: bool) {
    let name = if counter {
        name.strip_suffix("_total")
            .expect("a counter's name ends in _total")
    } else {
        name
    };
    let help = help
        .strip_suffix('.')
        .expect("a help text ends with a period");
    registry.register(name, help, metric);
}

fn histogram(buckets: &[f64]) -> Histogram {
    Histogram::new(buckets.iter().copied())
}

/// The process's panics ([`PANICS`]): counted by the hook
/// [`count_panics`] installs, exported by every registry.
static PANIC_COUNT: std::sync::LazyLock<Counter> = std::sync::LazyLock::new(Counter::default);

/// Counts every panic of the process in [`PANICS`], then reports it as
/// the hook installed before did.
pub fn count_panics() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANIC_COUNT.inc();
        report(info);
    }));
}

/// `jurystream_build_info{version="…"} 1`, and [`PANICS`]: what every
/// registry of the process exports.
fn build_info(registry: &mut Registry) {
    register(
        registry,
        PANICS,
        "Panics in any thread of the process (each is a bug).",
        PANIC_COUNT.clone(),
        true,
    );
    let info = Family::<VersionLabel, Gauge>::default();
    info.get_or_create(&VersionLabel {
        version: env!("CARGO_PKG_VERSION"),
    })
    .set(1);
    register(
        registry,
        BUILD_INFO,
        "Build information (always 1).",
        info,
        false,
    );
}

/// The registry in the text format 0.0.4 ([`CONTENT_TYPE`]).
fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, registry) {
        // Writing into a String cannot fail.
        tracing::error!(error = %e, "cannot encode the metrics");
    }
    out
}

/// Locks, ignoring poisoning (a panic elsewhere must not stop the metrics).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The leaderboard gauges (contract §8, §13).
struct Board {
    scores: Family<ModelRubric, FloatGauge>,
    squares: Family<ModelRubric, FloatGauge>,
    series: Family<ModelRubric, Gauge>,
    /// The label pairs exported now.
    exported: FxHashSet<ModelRubric>,
}

/// Per-partition bookkeeping behind the engine counters and `open_batches`.
#[derive(Debug, Default)]
struct Partitions {
    /// The engine counters already folded in, per partition (kept when a
    /// partition goes away: its counts stay).
    folded: HashMap<String, Counters>,
    /// Open batches and cache bytes per partition; the gauges are sums.
    open: HashMap<String, (u64, u64)>,
}

/// The process's metrics. Cheap to share (`Arc`). Counters and histograms
/// are atomics; a score update takes one uncontended lock (label cap and
/// the cached children of its label pair).
pub struct Metrics {
    registry: Registry,
    /// contract §14 (`shadow` and `learned` only).
    reputation: Option<ReputationMetrics>,
    ready: AtomicBool,
    /// [`VOTES_ACCEPTED`] by source, in [`VOTE_SOURCES`] order (counted per
    /// vote by the service, which reads the header).
    accepted: [Counter; 5],
    duplicate: Counter,
    superseded: Counter,
    abstentions: Counter,
    rejected: Family<ReasonLabel, Counter>,
    families: SeriesFamilies,
    series: Mutex<SeriesTable>,
    batch_votes: Histogram,
    batch_variance: Histogram,
    open_batches: Gauge,
    cache_bytes: Gauge,
    watermark: Family<PartitionLabel, FloatGauge>,
    partition_ready: Family<PartitionLabel, Gauge>,
    /// The partitions `partition_ready` lists now.
    held: Mutex<FxHashSet<PartitionLabel>>,
    lag: Family<TopicPartition, Gauge>,
    commit: Histogram,
    vote_latency: Histogram,
    commit_in_flight: Gauge,
    restore: Histogram,
    restored_records: Counter,
    rebalances: Family<EventLabel, Counter>,
    revoke: Histogram,
    outbox_recovered: Counter,
    outbox_republished: Counter,
    delivery_mode: Family<ModeLabel, Gauge>,
    board: Mutex<Board>,
    /// n, S1, S2, W of contract §11.
    agreement: [Family<Rubric, FloatCounter>; 4],
    /// New agreement series: exported at 0 by the next render, given these
    /// sums after it (see [`Metrics::agreement`]). Held while rendering.
    agreement_pending: Mutex<FxHashMap<Rubric, [f64; 4]>>,
    partitions: Mutex<Partitions>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// A rejection (any reason, `late` included).
    /// A vote accepted at step (4), by its source: an index in
    /// [`VOTE_SOURCES`] ([`crate::kafka::vote_source`]).
    pub fn vote_accepted(&self, source: usize) {
        self.accepted[source.min(VOTE_SOURCES.len() - 1)].inc();
    }

    pub fn rejected(&self, reason: crate::input::Reason) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Folds a partition engine's counters in (duplicates, superseded,
    /// abstentions; accepted votes are counted by [`Metrics::vote_accepted`]);
    /// call after each processed record or cycle.
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
            self.watermark
                .get_or_create(&PartitionLabel {
                    partition: partition.to_owned(),
                })
                .set(wm as f64 / 1e9);
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

    /// The label values (`model_id`, `voter_prompt_id`) a model and rubric
    /// are exported under, after the label cap (a missing model is
    /// [`UNKNOWN_MODEL`]).
    pub fn pair_labels(&self, model: Option<&str>, rubric: &str) -> (String, String) {
        let mut t = lock(&self.series);
        (
            t.models.map(model.unwrap_or(UNKNOWN_MODEL)).to_owned(),
            t.rubrics.map(rubric).to_owned(),
        )
    }

    /// Sets the leaderboard gauges: one row per label pair
    /// ([`Metrics::pair_labels`]; the caller merges the rows a cap
    /// joins, `engine::board::gauge_rows`): ((`model_id`,
    /// `voter_prompt_id`), sum of scores, sum of squared scores, scored
    /// series). Pairs not given disappear.
    pub fn model_board(&self, rows: impl IntoIterator<Item = ((String, String), f64, f64, u64)>) {
        let mut b = lock(&self.board);
        let mut now = FxHashSet::default();
        for ((model_id, voter_prompt_id), scores, squares, series) in rows {
            let labels = ModelRubric {
                model_id,
                voter_prompt_id,
            };
            b.scores.get_or_create(&labels).set(scores);
            b.squares.get_or_create(&labels).set(squares);
            b.series.get_or_create(&labels).set(series as i64);
            now.insert(labels);
        }
        for gone in b.exported.difference(&now) {
            b.scores.remove(gone);
            b.squares.remove(gone);
            b.series.remove(gone);
        }
        b.exported = now;
    }

    /// Adds to a rubric's agreement counters (n, S1, S2, W of contract §11;
    /// each ≥ 0). A new series is first exported at 0 and gets its value
    /// from the next render on: `increase()` takes a series' first sample
    /// as its start, so a counter born with its first increment would lose
    /// it (all of it, for a burst that never moves the counter again).
    pub fn agreement(&self, rubric: &str, sums: [f64; 4]) {
        let labels = Rubric {
            voter_prompt_id: lock(&self.series).rubrics.map(rubric).to_owned(),
        };
        let mut pending = lock(&self.agreement_pending);
        if let Some(p) = pending.get_mut(&labels) {
            for (p, v) in p.iter_mut().zip(sums) {
                *p += v;
            }
        } else if self.agreement[0].get(&labels).is_some() {
            for (family, v) in self.agreement.iter().zip(sums) {
                family.get_or_create(&labels).inc_by(v);
            }
        } else {
            for family in &self.agreement {
                family.get_or_create_owned(&labels);
            }
            pending.insert(labels, sums);
        }
    }

    /// The input partitions this instance holds now (`partition`, ready),
    /// replacing the last set.
    pub fn partitions_held(&self, held: impl IntoIterator<Item = (String, bool)>) {
        let mut exported = lock(&self.held);
        let mut now = FxHashSet::default();
        for (partition, ready) in held {
            let labels = PartitionLabel { partition };
            self.partition_ready
                .get_or_create(&labels)
                .set(i64::from(ready));
            now.insert(labels);
        }
        for gone in exported.difference(&now) {
            self.partition_ready.remove(gone);
        }
        *exported = now;
    }

    /// A partition went away (revoked): its gauges go, its counts stay.
    pub fn forget_partition(&self, partition: &str) {
        let mut g = lock(&self.partitions);
        g.open.remove(partition);
        self.set_partition_sums(&g);
        self.watermark.remove(&PartitionLabel {
            partition: partition.to_owned(),
        });
    }

    /// One emitted score update; `now_seconds` is the wall clock.
    pub fn score_update(&self, u: &ScoreUpdate, now_seconds: f64) {
        let model = u.model_id.as_deref().unwrap_or(UNKNOWN_MODEL);
        let freshness = 1.0 - u.alpha;
        {
            let mut t = lock(&self.series);
            let s = t.get(&self.families, model, &u.series.voter_prompt_id);
            s.updates.inc();
            if u.ambiguous {
                let flags = &self.families.flags;
                let labels = &s.labels;
                s.flags
                    .get_or_insert_with(|| flags.get_or_create_owned(labels))
                    .inc();
            }
            s.freshness.observe(freshness);
            s.score.observe(u.score);
            s.last_freshness.set(freshness);
            s.last_update.set(now_seconds);
            if let (Some(r), Some(l)) = (&self.reputation, &u.learned) {
                // (The entry's rubric label is the capped one.)
                let labels = &s.labels;
                match l.confusion.as_ref().filter(|c| c.by_side) {
                    // contract §15: each vote's evidence on its own side.
                    Some(c) => {
                        let m = s
                            .sides
                            .get_or_insert_with(|| Box::new(r.sides(&labels.voter_prompt_id)));
                        for ((e, &g), &y) in u.votes.iter().zip(&l.weights).zip(&c.values) {
                            let cast = e.value.unwrap_or_default();
                            if cast == 1.0 { &m.pass } else { &m.flag }.observe(g);
                            if y != cast {
                                m.inverted.inc();
                            }
                        }
                    }
                    None => {
                        let h = s.weight.get_or_insert_with(|| {
                            r.weight.get_or_create_owned(&Rubric {
                                voter_prompt_id: labels.voter_prompt_id.clone(),
                            })
                        });
                        for &w in &l.weights {
                            h.observe(w);
                        }
                    }
                }
            }
        }
        self.batch_votes.observe(u.votes.len() as f64);
        self.batch_variance.observe(u.variance);
    }

    /// contract §14: the end of the newest epoch `partition` has sealed.
    pub fn reputation_sealed(&self, partition: &str, at_seconds: f64) {
        if let Some(r) = &self.reputation {
            r.sealed
                .get_or_create(&PartitionLabel {
                    partition: partition.to_owned(),
                })
                .set(at_seconds);
        }
    }

    /// contract §14: the end of the newest epoch the whole group has sealed.
    pub fn reputation_table(&self, at_seconds: Option<f64>) {
        if let (Some(r), Some(at)) = (&self.reputation, at_seconds) {
            r.table.set(at);
        }
    }

    /// contract §14: open values and waiting batches over this instance's
    /// partitions.
    pub fn reputation_gauges(&self, open_values: usize, pending: usize) {
        if let Some(r) = &self.reputation {
            r.open_values.set(open_values as i64);
            r.pending.set(pending as i64);
        }
    }

    pub fn commit_duration(&self, seconds: f64) {
        self.commit.observe(seconds);
    }

    /// A cycle committed at `at`: each of its records' latency from its read.
    pub fn vote_commit_latency(&self, read_at: &[std::time::Instant], at: std::time::Instant) {
        for t in read_at {
            self.vote_latency
                .observe(at.saturating_duration_since(*t).as_secs_f64());
        }
    }

    pub fn commit_in_flight(&self, on: bool) {
        self.commit_in_flight.set(i64::from(on));
    }

    pub fn restore_duration(&self, seconds: f64) {
        self.restore.observe(seconds);
    }

    /// Changelog records a restore applied.
    pub fn restored_records(&self, n: u64) {
        self.restored_records.inc_by(n);
    }

    /// A rebalance event: `assigned`, `revoked` or `lost`.
    pub fn rebalance(&self, event: &'static str) {
        self.rebalances.get_or_create(&EventLabel { event }).inc();
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

    /// The delivery mode `run` uses (`kafka.delivery`).
    pub fn set_delivery_mode(&self, mode: &'static str) {
        self.delivery_mode.get_or_create(&ModeLabel { mode }).set(1);
    }

    /// A revoked partition's lag is no longer this instance's to report.
    pub fn forget_lag(&self, topic: &str, partition: i32) {
        self.lag.remove(&TopicPartition {
            partition: partition.to_string(),
            topic: topic.to_owned(),
        });
    }

    pub fn consumer_lag(&self, topic: &str, partition: i32, lag: i64) {
        self.lag
            .get_or_create(&TopicPartition {
                partition: partition.to_string(),
                topic: topic.to_owned(),
            })
            .set(lag);
    }

    /// Prometheus text exposition format 0.0.4 ([`CONTENT_TYPE`]). A
    /// labelled family appears once it has a series.
    pub fn render(&self) -> String {
        // Held throughout: a new agreement series is rendered at 0 exactly
        // once before it gets its value.
        let mut pending = lock(&self.agreement_pending);
        let text = render(&self.registry);
        for (labels, sums) in pending.drain() {
            for (family, v) in self.agreement.iter().zip(sums) {
                family.get_or_create(&labels).inc_by(v);
            }
        }
        text
    }
}

#[cfg(test)]
mod tests;
