//! Labelled metric families keyed by their label values, and the label cap.
//!
//! `prometheus`' `MetricVec` keys its children by an FNV-64 hash of the label
//! values written one after the other, with nothing between them, and never
//! compares the values themselves: `{topic="votes",partition="12"}` and
//! `{topic="votes1",partition="2"}` (or model "ab" with rubric "c" and model
//! "a" with rubric "bc") would share one child, and the second series would
//! silently count into the first. These label values come from the data and
//! the configuration, so the families below keep their children in maps
//! keyed by the values themselves. Each child is an ordinary metric of the
//! crate with its labels as const labels; the collectors hand them to the
//! registry. (`reason` has a fixed set of values and uses a `MetricVec`.)

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus::core::{Collector, Desc, Metric};
use prometheus::proto::{MetricFamily, MetricType};
use prometheus::{Counter, Gauge, Histogram, HistogramOpts, IntCounter, Opts};
use rustc_hash::{FxHashMap, FxHashSet};

use super::series::*;
use super::{
    lock, AMBIGUITY_FLAGS, FRESHNESS, LAST_FRESHNESS, LAST_SCORE_UPDATE, MODEL_ID, OTHER, SCORE,
    SCORE_UPDATES, VOTER_PROMPT_ID,
};

/// Keeps at most `max` distinct values of one label; the rest become
/// [`OTHER`] (SPEC §8, `metrics.max_label_values`).
#[derive(Debug)]
pub(crate) struct LabelCap {
    max: usize,
    seen: FxHashSet<Box<str>>,
}

impl LabelCap {
    pub(crate) fn new(max: usize) -> LabelCap {
        LabelCap {
            max,
            seen: FxHashSet::default(),
        }
    }

    /// The value to export for `v`.
    pub(crate) fn map<'a>(&mut self, v: &'a str) -> &'a str {
        if self.seen.contains(v) {
            return v;
        }
        if self.seen.len() < self.max {
            self.seen.insert(v.into());
            return v;
        }
        OTHER
    }
}

fn family(name: &str, help: &str, kind: MetricType) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    f
}

fn desc(name: &str, help: &str, labels: &[&str]) -> Desc {
    Desc::new(
        name.to_owned(),
        help.to_owned(),
        labels.iter().map(|l| (*l).to_owned()).collect(),
        HashMap::new(),
    )
    .expect("valid metric name and labels")
}

/// The metrics of one (model_id, voter_prompt_id) pair.
pub(crate) struct Series {
    model: Box<str>,
    rubric: Box<str>,
    pub updates: IntCounter,
    /// Created by the pair's first flag (as before: a pair that was never
    /// flagged has no `ambiguity_flags_total` series).
    flags: OnceLock<IntCounter>,
    pub freshness: Histogram,
    pub score: Histogram,
    pub last_freshness: Gauge,
    pub last_update: Gauge,
}

fn series_opts(name: &str, help: &str, model: &str, rubric: &str) -> Opts {
    Opts::new(name, help)
        .const_label(MODEL_ID, model)
        .const_label(VOTER_PROMPT_ID, rubric)
}

impl Series {
    fn new(model: &str, rubric: &str) -> Series {
        let opts = |name: &str, help: &str| series_opts(name, help, model, rubric);
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            let o = opts(name, help);
            Histogram::with_opts(HistogramOpts {
                common_opts: o,
                buckets: buckets.to_vec(),
            })
            .expect("valid histogram")
        };
        Series {
            model: model.into(),
            rubric: rubric.into(),
            updates: IntCounter::with_opts(opts(SCORE_UPDATES, SCORE_UPDATES_HELP))
                .expect("valid metric"),
            flags: OnceLock::new(),
            freshness: hist(FRESHNESS, FRESHNESS_HELP, FRESHNESS_BUCKETS),
            score: hist(SCORE, SCORE_HELP, SCORE_BUCKETS),
            last_freshness: Gauge::with_opts(opts(LAST_FRESHNESS, LAST_FRESHNESS_HELP))
                .expect("valid metric"),
            last_update: Gauge::with_opts(opts(LAST_SCORE_UPDATE, LAST_SCORE_UPDATE_HELP))
                .expect("valid metric"),
        }
    }

    /// Counts one ambiguity flag.
    pub(crate) fn flag(&self) {
        self.flags
            .get_or_init(|| {
                let o = series_opts(
                    AMBIGUITY_FLAGS,
                    AMBIGUITY_FLAGS_HELP,
                    &self.model,
                    &self.rubric,
                );
                IntCounter::with_opts(o).expect("valid metric")
            })
            .inc();
    }
}

/// Every (model_id, voter_prompt_id) pair's metrics, after the label cap.
pub(crate) struct SeriesTable {
    models: LabelCap,
    rubrics: LabelCap,
    /// model_id → voter_prompt_id → metrics; both keys are capped values, so
    /// at most (max + 1)² entries.
    series: FxHashMap<Box<str>, FxHashMap<Box<str>, Series>>,
}

impl SeriesTable {
    pub(crate) fn new(max_label_values: usize) -> SeriesTable {
        SeriesTable {
            models: LabelCap::new(max_label_values),
            rubrics: LabelCap::new(max_label_values),
            series: FxHashMap::default(),
        }
    }

    /// The exported label values of (`model`, `rubric`), after the cap.
    pub(crate) fn capped(&mut self, model: &str, rubric: &str) -> (String, String) {
        (
            self.models.map(model).to_owned(),
            self.rubrics.map(rubric).to_owned(),
        )
    }

    /// The exported value of a rubric (the cap shared with the pairs).
    pub(crate) fn capped_rubric(&mut self, rubric: &str) -> String {
        self.rubrics.map(rubric).to_owned()
    }

    /// Runs `f` on the metrics of (`model`, `rubric`), created on first use.
    /// No allocation unless the pair is new.
    pub(crate) fn with<R>(&mut self, model: &str, rubric: &str, f: impl FnOnce(&Series) -> R) -> R {
        // A pair already exported under its own values has passed the cap
        // (a key is a capped value, and the cap keeps what it has let in).
        if let Some(s) = self.series.get(model).and_then(|m| m.get(rubric)) {
            return f(s);
        }
        let model = self.models.map(model);
        let rubric = self.rubrics.map(rubric);
        if let Some(s) = self.series.get(model).and_then(|m| m.get(rubric)) {
            return f(s);
        }
        let s = Series::new(model, rubric);
        let r = f(&s);
        self.series
            .entry(model.into())
            .or_default()
            .insert(rubric.into(), s);
        r
    }
}

/// The (model_id, voter_prompt_id) families, as one collector.
pub(crate) struct SeriesCollector {
    table: Arc<Mutex<SeriesTable>>,
    descs: Vec<Desc>,
}

/// Name, help and type of the families a [`Series`] feeds, in the order
/// [`SeriesCollector::collect`] fills them.
const SERIES_FAMILIES: [(&str, &str, MetricType); 6] = [
    (SCORE_UPDATES, SCORE_UPDATES_HELP, MetricType::COUNTER),
    (AMBIGUITY_FLAGS, AMBIGUITY_FLAGS_HELP, MetricType::COUNTER),
    (FRESHNESS, FRESHNESS_HELP, MetricType::HISTOGRAM),
    (SCORE, SCORE_HELP, MetricType::HISTOGRAM),
    (LAST_FRESHNESS, LAST_FRESHNESS_HELP, MetricType::GAUGE),
    (LAST_SCORE_UPDATE, LAST_SCORE_UPDATE_HELP, MetricType::GAUGE),
];

impl SeriesCollector {
    pub(crate) fn new(table: Arc<Mutex<SeriesTable>>) -> SeriesCollector {
        let descs = SERIES_FAMILIES
            .iter()
            .map(|(name, help, _)| desc(name, help, &[MODEL_ID, VOTER_PROMPT_ID]))
            .collect();
        SeriesCollector { table, descs }
    }
}

impl Collector for SeriesCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut out: Vec<MetricFamily> = SERIES_FAMILIES
            .iter()
            .map(|(name, help, kind)| family(name, help, *kind))
            .collect();
        let t = lock(&self.table);
        for s in t.series.values().flat_map(|m| m.values()) {
            let metrics = [
                Some(s.updates.metric()),
                s.flags.get().map(|c| c.metric()),
                Some(s.freshness.metric()),
                Some(s.score.metric()),
                Some(s.last_freshness.metric()),
                Some(s.last_update.metric()),
            ];
            for (f, m) in out.iter_mut().zip(metrics) {
                f.mut_metric().extend(m);
            }
        }
        out
    }
}

/// A family whose series come and go (a partition's watermark, a
/// partition's consumer lag; gauges or counters), keyed by its label
/// values. Clones share it.
pub(crate) struct Family<M> {
    inner: Arc<FamilyInner<M>>,
}

impl<M> Clone for Family<M> {
    fn clone(&self) -> Self {
        Family {
            inner: self.inner.clone(),
        }
    }
}

struct FamilyInner<M> {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    desc: Desc,
    kind: MetricType,
    make: fn(Opts) -> prometheus::Result<M>,
    children: Mutex<BTreeMap<Vec<String>, M>>,
    /// Counters only: what new series get once they have been collected
    /// at 0 (see [`CounterFamily::inc_by`]).
    pending: Mutex<BTreeMap<Vec<String>, f64>>,
}

pub(crate) type GaugeFamily = Family<Gauge>;
/// Float counters (sums of data values) per label values.
pub(crate) type CounterFamily = Family<Counter>;

impl GaugeFamily {
    pub(crate) fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Family::with_kind(name, help, labels, MetricType::GAUGE, Gauge::with_opts)
    }

    /// Sets the series `values` (one per label) to `v`.
    pub(crate) fn set(&self, values: &[&str], v: f64) {
        self.with_child(values, |g| g.set(v));
    }

    /// Replaces every series with `values` (label values → value).
    pub(crate) fn replace_all(&self, values: impl IntoIterator<Item = (Vec<String>, f64)>) {
        let mut next = BTreeMap::new();
        let mut c = lock(&self.inner.children);
        for (key, v) in values {
            assert_eq!(key.len(), self.inner.labels.len(), "one value per label");
            let g = c.remove(&key).unwrap_or_else(|| self.make(&key));
            g.set(v);
            next.insert(key, g);
        }
        *c = next;
    }
}

impl CounterFamily {
    pub(crate) fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Family::with_kind(name, help, labels, MetricType::COUNTER, Counter::with_opts)
    }

    /// Adds `v` (≥ 0) to the series `values` (one per label). A new series
    /// is first exported at 0 and gets its value from the next collection
    /// on: `increase()` takes a series' first sample as its start, so a
    /// counter born with its first increment would lose it (all of it, for
    /// a burst that never moves the counter again).
    pub(crate) fn inc_by(&self, values: &[&str], v: f64) {
        let key: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        let mut c = lock(&self.inner.children);
        let mut pending = lock(&self.inner.pending);
        match (c.get(&key), pending.get_mut(&key)) {
            (Some(_), Some(p)) => *p += v,
            (Some(m), None) => m.inc_by(v),
            (None, _) => {
                let m = self.make(&key);
                pending.insert(key.clone(), v);
                c.insert(key, m);
            }
        }
    }
}

impl<M: Metric> Family<M> {
    fn with_kind(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        kind: MetricType,
        make: fn(Opts) -> prometheus::Result<M>,
    ) -> Self {
        Family {
            inner: Arc::new(FamilyInner {
                name,
                help,
                labels,
                desc: desc(name, help, labels),
                kind,
                make,
                children: Mutex::new(BTreeMap::new()),
                pending: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    fn make(&self, key: &[String]) -> M {
        let mut opts = Opts::new(self.inner.name, self.inner.help);
        for (l, v) in self.inner.labels.iter().zip(key) {
            opts = opts.const_label(*l, v.as_str());
        }
        (self.inner.make)(opts).expect("valid metric")
    }

    /// Runs `f` on the series `values` (one per label), created on first use.
    fn with_child(&self, values: &[&str], f: impl FnOnce(&M)) {
        assert_eq!(values.len(), self.inner.labels.len(), "one value per label");
        let key: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        let mut c = lock(&self.inner.children);
        if let Some(m) = c.get(&key) {
            return f(m);
        }
        let m = self.make(&key);
        f(&m);
        c.insert(key, m);
    }

    /// Removes the series `values` (no longer exported).
    pub(crate) fn remove(&self, values: &[&str]) {
        let key: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        lock(&self.inner.children).remove(&key);
    }
}

impl<M: Metric> Family<M> {
    fn collect_family(&self, settle: impl Fn(&M, f64)) -> Vec<MetricFamily> {
        let mut f = family(self.inner.name, self.inner.help, self.inner.kind);
        let c = lock(&self.inner.children);
        for m in c.values() {
            f.mut_metric().push(m.metric());
        }
        // Collected at 0 once: now the new series get their value.
        for (key, v) in std::mem::take(&mut *lock(&self.inner.pending)) {
            if let Some(m) = c.get(&key) {
                settle(m, v);
            }
        }
        vec![f]
    }
}

impl Collector for GaugeFamily {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.inner.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.collect_family(|_, _| {})
    }
}

impl Collector for CounterFamily {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.inner.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.collect_family(|c, v| c.inc_by(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_that_concatenate_alike_stay_apart() {
        let lag = GaugeFamily::new("t_lag", "Lag.", &["topic", "partition"]);
        lag.set(&["votes", "12"], 1.0);
        lag.set(&["votes1", "2"], 2.0);
        let f = &lag.collect()[0];
        assert_eq!(f.get_metric().len(), 2);
        lag.remove(&["votes", "12"]);
        let f = &lag.collect()[0];
        assert_eq!(f.get_metric().len(), 1);
        assert_eq!(f.get_metric()[0].get_label()[1].value(), "votes1");

        let n = CounterFamily::new("t_total", "Sum.", &["rubric"]);
        n.inc_by(&["r"], 2.0);
        n.inc_by(&["r"], 1.0);
        let value = |n: &CounterFamily| n.collect()[0].get_metric()[0].get_counter().get_value();
        assert_eq!(value(&n), 0.0, "a new series is first collected at 0");
        assert_eq!(value(&n), 3.0);
        n.inc_by(&["r"], 1.0);
        assert_eq!(value(&n), 4.0);

        let mut t = SeriesTable::new(10);
        t.with("ab", "c", |s| s.flag());
        t.with("a", "bc", |s| s.flag());
        assert_eq!(t.series.values().map(|m| m.len()).sum::<usize>(), 2);
    }

    #[test]
    fn label_cap_keeps_the_first_values() {
        let mut c = LabelCap::new(2);
        assert_eq!(c.map("a"), "a");
        assert_eq!(c.map("b"), "b");
        assert_eq!(c.map("c"), OTHER);
        assert_eq!(c.map("a"), "a");
    }
}
