//! The label sets of the labelled families, and the label-cardinality
//! cap (`metrics.max_label_values`) with the per-(model, rubric) metrics
//! it guards.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use rustc_hash::{FxHashMap, FxHashSet};

use super::{FloatGauge, HistogramFamily, OTHER};

// The label sets. Fields are in the order of their names, the order the
// labels always had in the exposition.

/// `model_id`, `voter_prompt_id` (after the label cap).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModelRubric {
    pub(super) model_id: String,
    pub(super) voter_prompt_id: String,
}

/// `side`, `voter_prompt_id` (contract §15: a vote's own side).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RubricSide {
    pub(super) side: &'static str,
    pub(super) voter_prompt_id: String,
}

/// `voter_prompt_id` (after the label cap).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Rubric {
    pub(super) voter_prompt_id: String,
}

/// `partition` (`<topic>-<n>`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PartitionLabel {
    pub(super) partition: String,
}

/// `partition` (the number), `topic`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TopicPartition {
    pub(super) partition: String,
    pub(super) topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabel {
    pub(super) source: &'static str,
}

/// The `source` values of [`VOTES_ACCEPTED`] (contract §8, §12 v4): `kafka`
/// (no `jurystream-source` header), `api`, `webhook`, `sync`, `other` (a
/// header `connect` never sets); see [`crate::kafka::vote_source`].
pub const VOTE_SOURCES: [&str; 5] = ["kafka", "api", "webhook", "sync", "other"];

/// `event` of [`REBALANCES`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EventLabel {
    pub(super) event: &'static str,
}

/// `mode` of [`DELIVERY_MODE`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModeLabel {
    pub(super) mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VersionLabel {
    pub(super) version: &'static str,
}

/// Keeps at most `max` distinct values of one label; the rest become
/// [`OTHER`] (contract §8, `metrics.max_label_values`).
#[derive(Debug)]
pub(super) struct LabelCap {
    pub(super) max: usize,
    pub(super) seen: FxHashSet<Box<str>>,
}

impl LabelCap {
    pub(super) fn new(max: usize) -> LabelCap {
        LabelCap {
            max,
            seen: FxHashSet::default(),
        }
    }

    /// The value to export for `v`.
    pub(super) fn map<'a>(&mut self, v: &'a str) -> &'a str {
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

/// The (model_id, voter_prompt_id) families.
pub(super) struct SeriesFamilies {
    pub(super) updates: Family<ModelRubric, Counter>,
    /// A pair's series appears with its first flag.
    pub(super) flags: Family<ModelRubric, Counter>,
    pub(super) freshness: HistogramFamily<ModelRubric>,
    pub(super) score: HistogramFamily<ModelRubric>,
    pub(super) last_freshness: Family<ModelRubric, FloatGauge>,
    pub(super) last_update: Family<ModelRubric, FloatGauge>,
}

/// The metrics of one (model_id, voter_prompt_id) pair, taken from the
/// families once (they share their values with the families' children).
pub(super) struct Series {
    pub(super) labels: ModelRubric,
    pub(super) updates: Counter,
    pub(super) flags: Option<Counter>,
    /// contract §14's learned weights of the rubric, from its first learned
    /// update (one histogram per rubric, shared by its models' entries).
    pub(super) weight: Option<Histogram>,
    /// contract §15's side weights (pass, flag) and inverted votes of the
    /// rubric, from its first update weighed by side.
    pub(super) sides: Option<Box<SideMetrics>>,
    pub(super) freshness: Histogram,
    pub(super) score: Histogram,
    pub(super) last_freshness: FloatGauge,
    pub(super) last_update: FloatGauge,
}

/// A rubric's contract §15 metrics, shared by its models' entries.
pub(super) struct SideMetrics {
    pub(super) pass: Histogram,
    pub(super) flag: Histogram,
    pub(super) inverted: Counter,
}

/// Every (model_id, voter_prompt_id) pair's metrics, after the label cap.
pub(super) struct SeriesTable {
    pub(super) models: LabelCap,
    pub(super) rubrics: LabelCap,
    /// model_id → voter_prompt_id → metrics; both keys are capped values,
    /// so at most (max + 1)² entries.
    pub(super) series: FxHashMap<Box<str>, FxHashMap<Box<str>, Series>>,
}

impl SeriesTable {
    /// The metrics of (`model`, `rubric`), created on first use. No
    /// allocation unless the pair is new.
    pub(super) fn get(&mut self, f: &SeriesFamilies, model: &str, rubric: &str) -> &mut Series {
        let exported =
            |t: &Self, m: &str, r: &str| t.series.get(m).is_some_and(|x| x.contains_key(r));
        // A pair already exported under its own values has passed the cap
        // (a key is a capped value, and the cap keeps what it has let in).
        let (model, rubric) = if exported(self, model, rubric) {
            (model, rubric)
        } else {
            (self.models.map(model), self.rubrics.map(rubric))
        };
        if !exported(self, model, rubric) {
            let labels = ModelRubric {
                model_id: model.to_owned(),
                voter_prompt_id: rubric.to_owned(),
            };
            let s = Series {
                updates: f.updates.get_or_create_owned(&labels),
                flags: None,
                weight: None,
                sides: None,
                freshness: f.freshness.get_or_create_owned(&labels),
                score: f.score.get_or_create_owned(&labels),
                last_freshness: f.last_freshness.get_or_create_owned(&labels),
                last_update: f.last_update.get_or_create_owned(&labels),
                labels,
            };
            self.series
                .entry(model.into())
                .or_default()
                .insert(rubric.into(), s);
        }
        self.series
            .get_mut(model)
            .and_then(|m| m.get_mut(rubric))
            .expect("created above")
    }
}
