//! What the engine keeps per partition and the state store persists:
//! series, batches and their entries, the partition values. Plain structs:
//! how they are stored is the state store's (`crate::state::format`).

use super::score::Evidence;
use super::EngineConfig;
use crate::input::Id;
use crate::time::Nanos;

/// A series: one inference under one rubric.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub inference_id: Id,
    pub voter_prompt_id: Id,
}

/// What is remembered of a series between batches.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesState {
    pub model_id: Option<Id>,
    pub score: f64,
    /// T of the most recently scored batch (None before the first update).
    pub last_vote_at: Option<Nanos>,
    pub update_seq: u64,
    /// Abstentions (not superseded) in every closed batch.
    pub abstentions: u64,
    /// Counted votes in every scored batch.
    pub votes: u64,
    /// The last update's ambiguity flag (false before one).
    pub ambiguous: bool,
    /// Accepted votes in the series' open batches.
    pub pending: u64,
    /// The last scored batch's mean vote (None before the first update):
    /// the backtest's naive forecast of the next batch (contract §10).
    pub last_mean_vote: Option<f64>,
    /// The score under each of [`EngineConfig::companions`] (empty
    /// without them).
    pub companion_scores: Box<[f64]>,
    /// The evidence behind the score (contract §13).
    pub evidence: Evidence,
    /// The evidence behind each companion score (empty without them).
    pub companion_evidence: Box<[Evidence]>,
}

impl SeriesState {
    /// A series before its first vote: the initial score, nothing counted;
    /// its companion scores sized now, so that its bytes in the cache never
    /// change.
    pub fn new(model_id: Option<&str>, cfg: &EngineConfig) -> SeriesState {
        SeriesState {
            model_id: model_id.map(Into::into),
            score: cfg.initial_score,
            last_vote_at: None,
            update_seq: 0,
            abstentions: 0,
            votes: 0,
            ambiguous: false,
            pending: 0,
            last_mean_vote: None,
            companion_scores: vec![cfg.initial_score; cfg.companions.len()].into(),
            evidence: Evidence::default(),
            companion_evidence: vec![Evidence::default(); cfg.companions.len()].into(),
        }
    }
}

/// A batch's place in the close order: (window start, series, opening order).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchKey {
    pub window_start: Nanos,
    pub series: SeriesKey,
    pub seq: u64,
}

/// One accepted vote inside an open batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub voter_id: Id,
    pub vote_id: Id,
    pub value: Option<f64>,
    pub weight: f64,
    pub timestamp: Nanos,
    pub inference_time: Option<Nanos>,
    /// False once another vote of the same voter replaced it.
    pub live: bool,
}

/// An open batch; entries are in arrival order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    pub entries: Vec<Entry>,
    /// Live, non-null entries.
    pub counted: u32,
    pub(super) dirty: bool,
    /// Whether the store holds a version of this batch (so that closing it
    /// needs a delete; a batch opened and closed between two writes never
    /// reaches the store at all).
    pub(super) stored: bool,
}

impl Batch {
    /// A batch read back from the store.
    pub fn stored(entries: Vec<Entry>, counted: u32) -> Batch {
        Batch {
            entries,
            counted,
            dirty: false,
            stored: true,
        }
    }
}

/// A closed batch waiting at `learned` mode's barrier (contract §14), with
/// the model id its series had when it closed.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub key: BatchKey,
    pub batch: Batch,
    pub model_id: Option<Id>,
}

impl Meta {
    /// The next batch seq (the partition's opening order).
    pub(super) fn take_batch_seq(&mut self) -> u64 {
        let seq = self.next_batch_seq;
        self.next_batch_seq += 1;
        seq
    }
}

/// Partition-wide values.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Meta {
    pub watermark: Option<Nanos>,
    pub next_batch_seq: u64,
    /// Unused since vote identities expire in the state store (kept so
    /// that stored `Meta` records keep their layout).
    pub swept_before: Option<Nanos>,
}
