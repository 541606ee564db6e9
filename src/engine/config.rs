//! What an engine is configured with: the scoring parameters, per rubric
//! where overridden, and the decay (contract §2–§3, §6).

use std::collections::HashMap;

use super::reputation::{Model, ReputationParams};
use super::score::{Aggregator, TimeUnit};
use crate::time::{div_euclid, Nanos};

/// The scoring parameters a rubric may override.
#[derive(Debug, Clone, PartialEq)]
pub struct RubricParams {
    pub lambda: f64,
    pub time_unit: TimeUnit,
    pub variance_threshold: f64,
    pub aggregator: Aggregator,
    pub temperature: f64,
    /// The rubric's reputation model (contract §15).
    pub reputation_model: Model,
}

/// A decay setting scored alongside the configured one (the backtest's
/// other λ of a window, contract §10): (lambda, time unit) by default and per
/// rubric that sets its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Decay {
    pub defaults: (f64, TimeUnit),
    pub rubrics: HashMap<String, (f64, TimeUnit)>,
}

impl Decay {
    /// The decay of `cfg` (its default and its rubrics').
    pub fn of(cfg: &EngineConfig) -> Decay {
        let pair = |p: &RubricParams| (p.lambda, p.time_unit);
        Decay {
            defaults: pair(&cfg.defaults),
            rubrics: cfg
                .rubrics
                .iter()
                .map(|(k, p)| (k.clone(), pair(p)))
                .collect(),
        }
    }

    pub(super) fn params(&self, voter_prompt_id: &str) -> (f64, TimeUnit) {
        *self.rubrics.get(voter_prompt_id).unwrap_or(&self.defaults)
    }
}

/// Everything the engine needs from the configuration, already validated.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Window length in nanoseconds; 0 means one window per instant.
    pub window_ns: i128,
    /// `batching.window_seconds` as configured (echoed in `params`).
    pub window_seconds: f64,
    pub grace_ns: i128,
    pub max_votes: u32,
    pub initial_score: f64,
    pub initial_gap_ns: i128,
    pub min_votes: u32,
    pub retention_ns: i128,
    pub defaults: RubricParams,
    pub rubrics: HashMap<String, RubricParams>,
    /// Keep what the query API reads (contract §9): each series' voters and
    /// the partition's leaderboard rows. Off for a temporary replay state,
    /// which nobody queries (nor reopens: contract §14's open values are not
    /// written to it either).
    pub query_index: bool,
    /// Other decays whose scores every series also keeps (the backtest;
    /// empty otherwise): [`ScoreUpdate::companions`].
    pub companions: Vec<Decay>,
    /// contract §14.
    pub reputation: ReputationParams,
}

/// Each rubric's reputation model (contract §15): the default and the
/// rubrics that set their own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Models {
    pub default: Model,
    pub rubrics: HashMap<String, Model>,
}

impl Models {
    pub fn of(&self, voter_prompt_id: &str) -> Model {
        *self.rubrics.get(voter_prompt_id).unwrap_or(&self.default)
    }
}

impl EngineConfig {
    pub fn params(&self, voter_prompt_id: &str) -> &RubricParams {
        self.rubrics.get(voter_prompt_id).unwrap_or(&self.defaults)
    }

    /// Each rubric's reputation model.
    pub fn models(&self) -> Models {
        Models {
            default: self.defaults.reputation_model,
            rubrics: self
                .rubrics
                .iter()
                .map(|(k, p)| (k.clone(), p.reputation_model))
                .collect(),
        }
    }

    /// Start of the window holding `ts`.
    pub fn window_start(&self, ts: Nanos) -> Nanos {
        if self.window_ns == 0 {
            ts
        } else {
            div_euclid(ts, self.window_ns) * self.window_ns
        }
    }

    /// Whether the window starting at `start` is closed under `watermark`.
    pub fn is_closed(&self, start: Nanos, watermark: Option<Nanos>) -> bool {
        match watermark {
            None => false,
            Some(wm) if self.window_ns == 0 => wm > start,
            Some(wm) => wm >= start + self.window_ns,
        }
    }
}
