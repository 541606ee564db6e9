//! The query API (contract §9): answers from the partition states in RocksDB.
//!
//! - [`Holdings`]: which input partitions this instance holds, ready (its
//!   store) or restoring, and how many partitions each input topic has.
//!   The service updates it on assignment, restore and revoke.
//! - An instance answers for its own partitions ([`Holdings::inference`],
//!   [`Holdings::board`], one answer per partition); [`merge_inference`]
//!   and [`merge_board`] (pure) combine the answers of every instance and
//!   refuse (503) when a partition of the group is held ready by none.
//! - `http.rs`: the routes, the token, the peers.
//!
//! An answer reflects the last committed cycle of each partition (what is
//! in RocksDB), the same state the emitted events reflect.

pub mod client;
pub mod http;
pub mod merge;
mod params;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use crate::engine::agreement::{ReviewerStats, RubricRow, RubricSums, VoterRow};
use crate::state::{Store, StoreError};
use crate::time::format_timestamp;

/// Most voters listed per series (`voters_truncated` says there are more).
pub const MAX_VOTERS: usize = 1000;

/// An input partition: topic and number.
pub type Tp = (String, i32);

struct Inner {
    /// Input topic → partition count (from the broker, at session start).
    topics: BTreeMap<String, i32>,
    /// Held partitions: `Some` ready, `None` restoring.
    held: BTreeMap<Tp, Option<Arc<Store>>>,
}

/// The partitions this instance holds. Cheap to share (`Arc`).
pub struct Holdings {
    inner: RwLock<Inner>,
    /// `scoring.initial_score`: the part of a score its interval does not
    /// cover (contract §13).
    initial_score: f64,
    /// contract §14: the group's newest tables (None in mode `off`, and until
    /// every partition has sealed an epoch).
    reputation: RwLock<Option<Arc<GroupWeights>>>,
}

/// The group's newest tables, T_{k*+2} per rubric, and (k* + 1)·E.
#[derive(Debug)]
pub struct GroupWeights {
    pub table_until: crate::time::Nanos,
    pub tables: HashMap<String, Arc<crate::engine::reputation::Table>>,
    /// Each rubric's model (contract §15).
    pub models: crate::engine::Models,
}

impl GroupWeights {
    /// ω of `voter` for `rubric`: 1 when the table does not hold them.
    pub fn weight(&self, rubric: &str, voter: &str) -> f64 {
        self.tables.get(rubric).map_or(1.0, |t| t.weight(voter))
    }

    /// contract §15's (w⁺, w⁻) of `voter` for `rubric`: the rubric's rates'
    /// for one not in the table; None while the rubric's `confusion` table
    /// is empty.
    pub fn sides(&self, rubric: &str, voter: &str) -> Option<(f64, f64)> {
        let t = self.tables.get(rubric)?.confusion.as_ref()?;
        let s = t.sides(voter);
        Some((s.pass_weight, s.flag_weight))
    }
}

impl Holdings {
    pub fn new(initial_score: f64) -> Holdings {
        Holdings {
            inner: RwLock::new(Inner {
                topics: BTreeMap::new(),
                held: BTreeMap::new(),
            }),
            initial_score,
            reputation: RwLock::new(None),
        }
    }

    pub fn set_reputation(&self, w: Option<GroupWeights>) {
        *self.reputation.write().unwrap_or_else(|e| e.into_inner()) = w.map(Arc::new);
    }

    pub fn reputation(&self) -> Option<Arc<GroupWeights>> {
        self.reputation
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One partition in an instance's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartAnswer<T> {
    pub topic: String,
    pub partition: i32,
    /// False while the partition restores (then `data` is empty).
    pub ready: bool,
    pub data: Vec<T>,
}

/// One instance's answer: the partitions it holds and their input topics'
/// sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalAnswer<T> {
    pub topics: BTreeMap<String, i32>,
    pub partitions: Vec<PartAnswer<T>>,
}

/// One series of an inference (contract §9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesOut {
    pub voter_prompt_id: String,
    pub model_id: Option<String>,
    pub score: Option<f64>,
    pub update_seq: u64,
    pub last_vote_at: Option<String>,
    pub votes: u64,
    pub abstentions: u64,
    pub ambiguous: bool,
    pub pending_votes: u64,
    pub voters: Vec<String>,
    pub voters_truncated: bool,
    /// contract §13 (null before the first update).
    pub effective_votes: Option<f64>,
    pub score_interval: Option<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferenceOut {
    pub inference_id: String,
    pub series: Vec<SeriesOut>,
}

/// A partition's leaderboard row as instances exchange it: the exact
/// fixed-point sum travels as a decimal string (JSON numbers are f64).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoardRowOut {
    pub model_id: Option<String>,
    pub voter_prompt_id: String,
    pub series: u64,
    pub score_sum_fixed: String,
    pub ambiguous_series: u64,
    pub votes: u64,
    /// Absent from an instance of an older version (then the merged row
    /// has no `score_sd`).
    #[serde(default)]
    pub score_squares_fixed: Option<String>,
}

/// One leaderboard row (contract §9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderRow {
    pub model_id: Option<String>,
    pub voter_prompt_id: String,
    pub series: u64,
    pub mean_score: f64,
    pub ambiguous_series: u64,
    pub votes: u64,
    /// contract §13: the sample sd of the row's scores and the 95 % interval
    /// of `mean_score` (null below two series).
    pub score_sd: Option<f64>,
    pub mean_score_interval: Option<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaderboardOut {
    pub rows: Vec<LeaderRow>,
}

/// A partition's agreement sums as instances exchange them (fixed-point
/// sums as decimal strings, like [`BoardRowOut`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RubricSumsOut {
    pub voter_prompt_id: String,
    pub units: u64,
    pub pairable_votes: u64,
    pub sum_fixed: String,
    pub square_sum_fixed: String,
    pub within_fixed: String,
}

impl RubricSumsOut {
    fn of(voter_prompt_id: String, s: &RubricSums) -> Self {
        RubricSumsOut {
            voter_prompt_id,
            units: s.units,
            pairable_votes: s.pairable,
            sum_fixed: s.sum.to_string(),
            square_sum_fixed: s.square_sum.to_string(),
            within_fixed: s.within.to_string(),
        }
    }

    fn sums(&self) -> Option<RubricSums> {
        Some(RubricSums {
            units: self.units,
            pairable: self.pairable_votes,
            sum: self.sum_fixed.parse().ok()?,
            square_sum: self.square_sum_fixed.parse().ok()?,
            within: self.within_fixed.parse().ok()?,
        })
    }
}

/// A partition's numbers of one reviewer and rubric, as instances exchange
/// them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewerOut {
    pub voter_id: String,
    pub voter_prompt_id: String,
    pub rated_votes: u64,
    pub sq_dev_fixed: String,
}

/// `GET /v1/rubrics` (contract §11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RubricsOut {
    pub rubrics: Vec<RubricRow>,
}

/// `GET /v1/voters/{id}` and `GET /v1/voters?voter_prompt_id=R`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VotersOut {
    pub voters: Vec<VoterRow>,
}

/// The order of `GET /v1/voters?voter_prompt_id=R` (its `order`
/// parameter: `voter_id`, the default, or `deviation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VoterOrder {
    /// `voter_id` byte order.
    #[default]
    VoterId,
    /// `mean_sq_deviation` descending (the reviewers who disagree most
    /// first), then `voter_id`.
    Deviation,
}

/// Why a merged answer cannot be given.
#[derive(Debug, Clone, PartialEq)]
pub enum Unavailable {
    /// No instance knows the input topics yet (none has started a session).
    NoTopics,
    /// Partitions no reachable instance holds ready (restoring, being
    /// reassigned, or on an instance that did not answer).
    Partitions(Vec<Tp>),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::NoTopics => write!(f, "the service has not joined its consumer group yet"),
            Unavailable::Partitions(tps) => {
                let names: Vec<String> = tps.iter().map(|(t, p)| format!("{t}-{p}")).collect();
                write!(
                    f,
                    "partitions not ready on any reachable instance (restoring or being reassigned): {}",
                    names.join(", ")
                )
            }
        }
    }
}

impl Holdings {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The input topics' partition counts.
    pub fn set_topics(&self, topics: BTreeMap<String, i32>) {
        self.write().topics = topics;
    }

    /// Replaces the held partitions (`None`: restoring).
    pub fn set_held(&self, held: BTreeMap<Tp, Option<Arc<Store>>>) {
        self.write().held = held;
    }

    /// Whether `tp` is held ready, restoring, or not held.
    pub fn status(&self, tp: &Tp) -> Option<bool> {
        self.read().held.get(tp).map(Option::is_some)
    }

    /// Applies `f` to each held partition (ready ones with their store).
    fn answer<T>(
        &self,
        mut f: impl FnMut(&Store) -> Result<Vec<T>, StoreError>,
    ) -> Result<LocalAnswer<T>, StoreError> {
        let (topics, held) = {
            let g = self.read();
            (g.topics.clone(), g.held.clone())
        };
        let mut partitions = Vec::with_capacity(held.len());
        for ((topic, partition), store) in held {
            let data = match &store {
                Some(s) => f(s)?,
                None => Vec::new(),
            };
            partitions.push(PartAnswer {
                topic,
                partition,
                ready: store.is_some(),
                data,
            });
        }
        Ok(LocalAnswer { topics, partitions })
    }

    /// This instance's series of `inference_id`, per held partition.
    pub fn inference(&self, inference_id: &str) -> Result<LocalAnswer<SeriesOut>, StoreError> {
        self.answer(|store| series_of(store, inference_id, self.initial_score))
    }

    /// This instance's leaderboard rows, per held partition.
    pub fn board(&self) -> Result<LocalAnswer<BoardRowOut>, StoreError> {
        self.answer(|store| {
            Ok(store
                .board()?
                .into_iter()
                .map(|(k, r)| BoardRowOut {
                    model_id: k.model_id.as_deref().map(str::to_owned),
                    voter_prompt_id: k.voter_prompt_id.to_string(),
                    series: r.series,
                    score_sum_fixed: r.score_sum.to_string(),
                    ambiguous_series: r.ambiguous,
                    votes: r.votes,
                    score_squares_fixed: Some(r.score_squares.to_string()),
                })
                .collect())
        })
    }
}

impl Holdings {
    /// This instance's agreement sums, per held partition.
    pub fn rubrics(&self) -> Result<LocalAnswer<RubricSumsOut>, StoreError> {
        self.answer(|store| {
            Ok(store
                .agreement()?
                .into_iter()
                .map(|(r, s)| RubricSumsOut::of(r, &s))
                .collect())
        })
    }

    /// One reviewer's numbers per rubric, per held partition.
    pub fn voter(&self, voter_id: &str) -> Result<LocalAnswer<ReviewerOut>, StoreError> {
        self.answer(|store| {
            Ok(store
                .reviewer(voter_id)?
                .into_iter()
                .map(|(r, s)| reviewer_out(voter_id.to_owned(), r, &s))
                .collect())
        })
    }

    /// Every reviewer of one rubric, per held partition.
    pub fn voters_of(&self, rubric: &str) -> Result<LocalAnswer<ReviewerOut>, StoreError> {
        self.answer(|store| {
            Ok(store
                .reviewers_of(rubric)?
                .into_iter()
                .map(|(v, s)| reviewer_out(v, rubric.to_owned(), &s))
                .collect())
        })
    }
}

fn reviewer_out(voter_id: String, voter_prompt_id: String, s: &ReviewerStats) -> ReviewerOut {
    ReviewerOut {
        voter_id,
        voter_prompt_id,
        rated_votes: s.rated,
        sq_dev_fixed: s.sq_dev.to_string(),
    }
}

fn series_of(
    store: &Store,
    inference_id: &str,
    initial_score: f64,
) -> Result<Vec<SeriesOut>, StoreError> {
    let series = store.series_of(inference_id)?;
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let mut voters_of = store.voters_of(inference_id, MAX_VOTERS)?;
    let mut out = Vec::new();
    for (k, s) in series {
        let (voters, voters_truncated) = voters_of.remove(&*k.voter_prompt_id).unwrap_or_default();
        let scored = s.update_seq >= 1;
        out.push(SeriesOut {
            voter_prompt_id: k.voter_prompt_id.to_string(),
            model_id: s.model_id.as_deref().map(str::to_owned),
            score: scored.then_some(s.score),
            update_seq: s.update_seq,
            last_vote_at: s.last_vote_at.filter(|_| scored).map(format_timestamp),
            votes: s.votes,
            abstentions: s.abstentions,
            ambiguous: s.ambiguous,
            pending_votes: s.pending,
            voters,
            voters_truncated,
            effective_votes: s.evidence.effective_votes(),
            score_interval: s.evidence.interval(s.score, initial_score),
        });
    }
    Ok(out)
}

/// What an id or a rubric is percent-encoded against in a URL: every byte
/// but RFC 3986's unreserved ones (letters, digits, `-._~`), so that one
/// encoding is both a path segment and a query value (a space is `%20`, a
/// `+` is `%2B`).
pub const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` percent-encoded as one path segment or query value ([`COMPONENT`]):
/// how an instance names an id or a rubric to its peers, and `query` to
/// the service.
pub fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

/// The byte offset of the first `%` in `raw` that is not followed by two
/// hex digits. `percent-encoding`'s decoder (and so axum's `Path` and
/// `Query`) passes such a `%` through as is; here it is refused, for a bad
/// id must be a 400, not a lookup of another id.
pub fn malformed_escape(raw: &str) -> Option<usize> {
    let b = raw.as_bytes();
    let hex = |i: usize| b.get(i).is_some_and(u8::is_ascii_hexdigit);
    (0..b.len()).find(|&i| b[i] == b'%' && !(hex(i + 1) && hex(i + 2)))
}

#[cfg(test)]
mod tests;
