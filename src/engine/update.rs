//! What the engine reports per vote and per scored batch.

use super::persisted::{Entry, SeriesKey};
use super::RubricParams;
use crate::input::{Id, Rejection};
use crate::time::Nanos;

/// What happened to one vote.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Accepted,
    Duplicate,
    Late(Rejection),
}

/// A batch's score update (contract §5 `score_updated`, plus the flag data).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreUpdate {
    pub series: SeriesKey,
    pub model_id: Option<Id>,
    pub update_seq: u64,
    pub score: f64,
    pub previous_score: f64,
    /// The series' previous scored batch's mean vote (None on the first
    /// update, and after an update stored before format 5).
    pub previous_mean_vote: Option<f64>,
    /// The series' counted votes in all its scored batches, this one
    /// included.
    pub series_votes: u64,
    pub alpha: f64,
    pub delta_t_seconds: f64,
    pub ambiguous: bool,
    pub params: RubricParams,
    pub window_seconds: f64,
    pub window_start: Nanos,
    pub window_end: Option<Nanos>,
    pub first_vote_at: Nanos,
    pub last_vote_at: Nanos,
    pub abstentions: u32,
    pub superseded: u32,
    pub weight_sum: f64,
    pub mean_vote: f64,
    pub aggregate: f64,
    pub variance: f64,
    /// The counted votes in `vote_ids` order.
    pub votes: Vec<Entry>,
    /// contract §13: the evidence behind `score` as a number of votes, and
    /// its 95 % interval (None while there is none).
    pub effective_votes: Option<f64>,
    pub score_interval: Option<(f64, f64)>,
    /// The interval of `previous_score` (the backtest's coverage check).
    pub previous_interval: Option<(f64, f64)>,
    /// The same update under each of [`EngineConfig::companions`].
    pub companions: Vec<Forecast>,
    /// `learned` mode (contract §14): the weights and step applied.
    pub learned: Option<Learned>,
}

/// What `learned` mode applied to a batch (contract §14 "Outputs").
#[derive(Debug, Clone, PartialEq)]
pub struct Learned {
    /// ω of each counted vote, in `votes` order (each vote's applied
    /// weight is its `weight` × this). Inline up to four: most batches
    /// hold one or two votes, and an allocation made here and freed by
    /// the event encoder's thread was a visible part of what `learned`
    /// mode adds to a replay.
    pub weights: smallvec::SmallVec<[f64; 4]>,
    /// β, the damped step.
    pub step: f64,
    /// (k − 1)·E: the end of the newest epoch T_k holds.
    pub table_until: Nanos,
    /// A rubric whose model is `confusion` (contract §15): what each vote
    /// counted as; `weights` are then its g_i.
    pub confusion: Option<Counted>,
}

/// What contract §15's model made of a batch's votes.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    /// y_i of each counted vote, in `votes` order: its value, or 1 − its
    /// value for a side worse than chance.
    pub values: smallvec::SmallVec<[f64; 4]>,
    /// The prior (y₀, w₀), when it entered the mean.
    pub prior: Option<(f64, f64)>,
    /// Whether the votes were weighed by side (a batch of 0/1 values with
    /// a table); else each counted as itself with ω, or 1 without a table.
    pub by_side: bool,
}

impl ScoreUpdate {
    /// The update's scores under the engine's own decay.
    pub fn forecast(&self) -> Forecast {
        Forecast {
            previous_score: self.previous_score,
            score: self.score,
            previous_interval: self.previous_interval,
        }
    }
}

/// A series' score before and after an update under one decay, and the
/// interval of the score before it: what the backtest judges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    pub previous_score: f64,
    pub score: f64,
    pub previous_interval: Option<(f64, f64)>,
}
