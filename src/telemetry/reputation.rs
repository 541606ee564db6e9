//! contract §14's metrics (named in `mod.rs` with the others), registered on
//! `run`'s registry in modes `shadow` and `learned` only (no label carries
//! a voter id).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{RubricSide, SideMetrics};
use super::{
    histogram, register, FloatGauge, HistogramFamily, PartitionLabel, Rubric,
    REPUTATION_INVERTED as INVERTED, REPUTATION_OPEN_VALUES as OPEN_VALUES,
    REPUTATION_PENDING as PENDING, REPUTATION_SEALED as SEALED,
    REPUTATION_SIDE_WEIGHT as SIDE_WEIGHT, REPUTATION_TABLE as TABLE, REPUTATION_WEIGHT as WEIGHT,
};

const WEIGHT_BUCKETS: &[f64] = &[0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0];
/// contract §15's g: 0 (no evidence) up to `confusion_max_weight` (10).
const SIDE_WEIGHT_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0];

pub(super) struct ReputationMetrics {
    pub sealed: Family<PartitionLabel, FloatGauge>,
    pub table: FloatGauge,
    pub open_values: Gauge,
    pub pending: Gauge,
    pub weight: HistogramFamily<Rubric>,
    pub side_weight: HistogramFamily<RubricSide>,
    pub inverted: Family<Rubric, Counter>,
}

impl ReputationMetrics {
    pub fn register(r: &mut Registry) -> ReputationMetrics {
        let m = ReputationMetrics {
            sealed: Family::default(),
            table: FloatGauge::default(),
            open_values: Gauge::default(),
            pending: Gauge::default(),
            weight: HistogramFamily::new_with_constructor(|| histogram(WEIGHT_BUCKETS)),
            side_weight: HistogramFamily::new_with_constructor(|| histogram(SIDE_WEIGHT_BUCKETS)),
            inverted: Family::default(),
        };
        register(
            r,
            SEALED,
            "End of the newest epoch each partition of this instance has sealed (Unix seconds; contract §14).",
            m.sealed.clone(),
            false,
        );
        register(
            r,
            TABLE,
            "End of the newest epoch every input partition has sealed: batches of the epoch after next use the tables up to it (Unix seconds).",
            m.table.clone(),
            false,
        );
        register(
            r,
            OPEN_VALUES,
            "Reviewers' latest votes per series held for epochs not yet sealed.",
            m.open_values.clone(),
            false,
        );
        register(
            r,
            PENDING,
            "Closed batches waiting until every input partition has sealed their epoch minus two (learned mode).",
            m.pending.clone(),
            false,
        );
        register(
            r,
            WEIGHT,
            "Learned weight of each counted vote scored, per rubric (learned mode).",
            m.weight.clone(),
            false,
        );
        register(
            r,
            SIDE_WEIGHT,
            "Model confusion: the evidence each counted pass or flag was weighed with, in votes' worth, per rubric and the vote's side (learned mode, batches of 0/1 votes with a table).",
            m.side_weight.clone(),
            false,
        );
        register(
            r,
            INVERTED,
            "Model confusion: votes counted for the other side, their reviewer's side being worse than chance (learned mode).",
            m.inverted.clone(),
            true,
        );
        m
    }

    /// A rubric's contract §15 metrics (`rubric` is the capped label).
    pub fn sides(&self, rubric: &str) -> SideMetrics {
        let side = |side| {
            self.side_weight.get_or_create_owned(&RubricSide {
                side,
                voter_prompt_id: rubric.to_owned(),
            })
        };
        SideMetrics {
            pass: side("pass"),
            flag: side("flag"),
            inverted: self.inverted.get_or_create_owned(&Rubric {
                voter_prompt_id: rubric.to_owned(),
            }),
        }
    }
}
