//! Learned reviewer reputation (contract §14), pure: epochs, the terms a
//! sealed series-epoch adds, the tables built from them and the weights a
//! table gives, and the damped step of `learned` mode.
//!
//! The engine keeps each open epoch's latest vote per series and reviewer
//! ([`OpenValue`]); sealing an epoch turns its units into [`Terms`] (exact
//! integers, so that their sum does not depend on order or partitioning),
//! which the [`Tables`] add up per rubric and reviewer. What is stored and
//! how is the state store's; what is published is the service's.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::input::Id;
use crate::time::{div_euclid, Nanos};

pub mod confusion;
pub mod pairs;

use confusion::ConfusionTerms;
use pairs::{PairRow, PairSums, VoterPair};

/// `reputation.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No values, terms or tables (v3).
    Off,
    /// Everything computed and shown; scoring and events as `Off`.
    Shadow,
    /// Scores with the learned weights and the damped step.
    Learned,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Shadow => "shadow",
            Mode::Learned => "learned",
        }
    }
}

/// `reputation.model` and `rubrics.<id>.reputation_model`: which model a
/// rubric's learned weights come from (contract §14 or §15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Model {
    /// One weight per reviewer, from how far they fall from the others.
    #[default]
    Noise,
    /// A weight per reviewer and side, from how often their pass and their
    /// flag agree with the others.
    Confusion,
}

impl Model {
    pub fn as_str(self) -> &'static str {
        match self {
            Model::Noise => "noise",
            Model::Confusion => "confusion",
        }
    }
}

/// An epoch's number: floor(t / E) over Unix time in nanoseconds.
pub type Epoch = i128;

/// The `[reputation]` settings the engine uses, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ReputationParams {
    pub mode: Mode,
    /// E in nanoseconds (> 0).
    pub epoch_ns: i128,
    /// n₀.
    pub prior_votes: f64,
    /// f.
    pub noise_floor: f64,
    pub min_weight: f64,
    pub max_weight: f64,
    /// contract §15's options (used by the rubrics whose model is
    /// `confusion`).
    pub confusion: confusion::ConfusionParams,
}

impl ReputationParams {
    /// The epoch of a window starting at `start` (of an instant, W = 0).
    pub fn epoch_of(&self, start: Nanos) -> Epoch {
        div_euclid(start, self.epoch_ns)
    }

    /// Where epoch `e` starts.
    pub fn start_of(&self, e: Epoch) -> Nanos {
        e.saturating_mul(self.epoch_ns)
    }

    /// The newest epoch a watermark `wm` has sealed: e with (e + 1)·E ≤ wm.
    pub fn sealed_by(&self, wm: Nanos) -> Epoch {
        div_euclid(wm, self.epoch_ns) - 1
    }

    /// Whether values are collected and epochs sealed (`shadow`, `learned`).
    pub fn collects(&self) -> bool {
        self.mode != Mode::Off
    }

    pub fn learned(&self) -> bool {
        self.mode == Mode::Learned
    }
}

/// A reviewer's latest vote of a series in an open epoch: `value` None is
/// an abstention (the reviewer has no value).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpenValue {
    pub timestamp: Nanos,
    pub value: Option<f64>,
}

/// A reviewer's latest vote of a series in an epoch, as keyed in the
/// engine and the store: (epoch, series, reviewer).
pub type OpenKey = (Epoch, super::SeriesKey, Id);

/// A sealed delta's key: (rubric, epoch, reviewer).
pub type TermsKey = (Id, Epoch, Id);

/// What a reviewer's values in sealed units add up to: `n` values, `q` =
/// Σ fix(d²), `h` = Σ fix(1 / (m − 1)) (contract §14), and the sums of
/// contract §15 (`confusion`, zero in a delta sealed before they existed;
/// `pairs`, the co-vote counts of the pairs this reviewer is first of in
/// `voter_id` byte order, empty in a delta sealed before they existed).
/// Exact integers (2⁻⁴⁰ fixed point), so sums are the same in any order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terms {
    pub n: u64,
    pub q: u128,
    pub h: u128,
    pub confusion: ConfusionTerms,
    pub pairs: PairRow,
}

impl Terms {
    /// §14's sums only (a delta of the formats before §15's sums).
    pub fn noise(n: u64, q: u128, h: u128) -> Terms {
        Terms {
            n,
            q,
            h,
            confusion: ConfusionTerms::default(),
            pairs: PairRow::default(),
        }
    }

    pub fn add(&mut self, o: &Terms) {
        self.n = self.n.saturating_add(o.n);
        self.q = self.q.saturating_add(o.q);
        self.h = self.h.saturating_add(o.h);
        self.confusion.add(&o.confusion);
        self.pairs.add(&o.pairs);
    }
}

/// 2⁴⁰, the fixed point's scale.
const SCALE: f64 = (1u64 << 40) as f64;

/// fix(x) = x·2⁴⁰ (exact) rounded to the nearest integer, ties to even;
/// `x` ≥ 0.
pub fn fix(x: f64) -> u128 {
    (x * SCALE).round_ties_even() as u128
}

/// float(X)·2⁻⁴⁰: one rounding (to f64), then an exact scaling.
pub fn unfix(x: u128) -> f64 {
    x as f64 / SCALE
}

/// The terms of one series-epoch's values, given in `voter_id` byte
/// order: one per value (both models' sums), or none when fewer than two
/// reviewers have one (not a unit).
pub fn unit_terms(values: &[f64]) -> Option<Vec<Terms>> {
    let m = values.len();
    if m < 2 {
        return None;
    }
    let mut s = 0.0;
    for &v in values {
        s += v;
    }
    let others = (m - 1) as f64;
    let h = fix(1.0 / others);
    let binary = confusion::counts(values);
    Some(
        values
            .iter()
            .map(|&v| {
                let d = v - (s - v) / others;
                Terms {
                    n: 1,
                    q: fix(d * d),
                    h,
                    confusion: if binary {
                        confusion::value_terms(s, m, v)
                    } else {
                        ConfusionTerms::default()
                    },
                    pairs: PairRow::default(),
                }
            })
            .collect(),
    )
}

/// A [`Sealer`] given values one by one (tests).
#[cfg(test)]
pub fn seal<'a>(
    values: impl IntoIterator<Item = (&'a super::SeriesKey, &'a Id, &'a OpenValue)>,
) -> BTreeMap<(Id, Id), Terms> {
    let mut units: FxHashMap<&super::SeriesKey, Vec<(&Id, Option<f64>)>> = FxHashMap::default();
    for (s, v, o) in values {
        units.entry(s).or_default().push((v, o.value));
    }
    let mut sealer = Sealer::default();
    for (series, unit) in units {
        sealer.add(&series.voter_prompt_id, unit);
    }
    sealer.finish()
}

/// Seals one epoch, given its units one by one (each series' reviewers
/// and values, None an abstention, in any order): each unit's terms,
/// added per (rubric, reviewer). Abstentions are dropped; a unit's values
/// are taken in `voter_id` byte order.
#[derive(Debug, Default)]
pub struct Sealer {
    sums: FxHashMap<Id, FxHashMap<Id, Terms>>,
    pairs: FxHashMap<Id, PairSums>,
    unit: Vec<(Id, f64)>,
    values: Vec<f64>,
}

impl Sealer {
    /// Adds a unit of `rubric`.
    pub fn add<'a>(
        &mut self,
        rubric: &Id,
        members: impl IntoIterator<Item = (&'a Id, Option<f64>)>,
    ) {
        self.unit.clear();
        self.unit.extend(
            members
                .into_iter()
                .filter_map(|(v, x)| x.map(|x| (v.clone(), x))),
        );
        if self.unit.len() < 2 {
            return;
        }
        self.unit.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self.values.clear();
        self.values.extend(self.unit.iter().map(|r| r.1));
        let Some(terms) = unit_terms(&self.values) else {
            return;
        };
        if self.unit.len() <= pairs::MAX_PAIR_UNIT && confusion::counts(&self.values) {
            let unit: Vec<(&Id, f64)> = self.unit.iter().map(|(v, x)| (v, *x)).collect();
            match self.pairs.get_mut(rubric) {
                Some(p) => p.add_unit(&unit),
                None => {
                    let mut p = PairSums::default();
                    p.add_unit(&unit);
                    self.pairs.insert(rubric.clone(), p);
                }
            }
        }
        let sums = self.sums.entry(rubric.clone()).or_default();
        for ((voter, _), t) in self.unit.iter().zip(terms) {
            match sums.get_mut(voter) {
                Some(sum) => sum.add(&t),
                None => {
                    sums.insert(voter.clone(), t);
                }
            }
        }
    }

    /// The epoch's deltas, by (rubric, reviewer); each pair's counts in
    /// the delta of its first reviewer.
    pub fn finish(mut self) -> BTreeMap<(Id, Id), Terms> {
        for (rubric, pairs) in self.pairs {
            let Some(voters) = self.sums.get_mut(&rubric) else {
                continue;
            };
            for (first, row) in pairs.into_rows() {
                // Every reviewer of a pair has a value of the unit, so a
                // delta.
                voters.entry(first).or_default().pairs = row;
            }
        }
        self.sums
            .into_iter()
            .flat_map(|(r, voters)| voters.into_iter().map(move |(v, t)| ((r.clone(), v), t)))
            .collect()
    }
}

/// One rubric's sums and what they give: τ², and each reviewer's σ̂² and
/// ω (contract §14 "Tables"), and contract §15's table of the same sums
/// (None while it is empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub totals: Terms,
    /// τ² (0 when N = 0).
    pub noise_variance: f64,
    /// Every reviewer with N_u ≥ 1: (sums, σ̂², ω).
    pub voters: FxHashMap<Id, Rated>,
    pub confusion: Option<confusion::ConfusionTable>,
}

/// A reviewer in a [`Table`] (`terms` without its pair counts).
#[derive(Debug, Clone, PartialEq)]
pub struct Rated {
    pub terms: Terms,
    pub noise_variance: f64,
    pub weight: f64,
}

impl Table {
    /// The table of a rubric's per-reviewer sums, in f64 in contract §14's
    /// order (Rust never fuses a multiply-add unless asked).
    pub fn build(p: &ReputationParams, sums: impl IntoIterator<Item = (Id, Terms)>) -> Table {
        let mut sums: Vec<(Id, Terms)> = sums.into_iter().filter(|(_, t)| t.n > 0).collect();
        // The pair counts go to §15's fit; the rubric's totals and each
        // reviewer's row keep the sums.
        let mut pairs: Vec<VoterPair> = Vec::new();
        for (voter, t) in &mut sums {
            for (partner, counts) in std::mem::take(&mut t.pairs).0 {
                pairs.push((voter.clone(), partner, counts));
            }
        }
        let mut totals = Terms::default();
        for (_, t) in &sums {
            totals.add(t);
        }
        let denom = (u128::from(totals.n) << 40).saturating_add(totals.h);
        let tau2 = if totals.n == 0 {
            0.0
        } else {
            totals.q as f64 / denom as f64
        };
        let flat = totals.n == 0 || totals.q == 0;
        let confusion = confusion::ConfusionTable::build_with_pairs(
            &p.confusion,
            sums.iter().map(|(v, t)| (v.clone(), t.confusion)),
            p.confusion.pair_fit.then_some(&pairs[..]),
        );
        let n0 = p.prior_votes;
        let f = p.noise_floor;
        let voters = sums
            .into_iter()
            .map(|(voter, t)| {
                let q_u = unfix(t.q);
                let h_u = unfix(t.h);
                let s2 = f64::max(0.0, (n0 * tau2 + q_u) - tau2 * h_u) / (n0 + t.n as f64);
                let weight = if flat {
                    1.0
                } else {
                    ((tau2 + f) / (s2 + f)).clamp(p.min_weight, p.max_weight)
                };
                let rated = Rated {
                    terms: t,
                    noise_variance: s2,
                    weight,
                };
                (voter, rated)
            })
            .collect();
        Table {
            totals,
            noise_variance: tau2,
            voters,
            confusion,
        }
    }

    /// ω of a reviewer: 1 for one not in the table.
    pub fn weight(&self, voter: &str) -> f64 {
        self.voters.get(voter).map_or(1.0, |r| r.weight)
    }
}

/// Every sealed delta a partition knows (its own, and in `run` every other
/// partition's), summed per rubric and reviewer: epochs up to
/// `base_until` in `base`, later ones per epoch, so that T_k (every epoch
/// ≤ k − 2) can be built for any k a batch may still have. Built tables
/// are kept until a delta of an epoch they hold arrives.
#[derive(Debug, Default)]
pub struct Tables {
    base: FxHashMap<Id, FxHashMap<Id, Terms>>,
    base_until: Option<Epoch>,
    recent: BTreeMap<Epoch, FxHashMap<Id, FxHashMap<Id, Terms>>>,
    built: FxHashMap<(Id, Epoch), Arc<Table>>,
}

impl Tables {
    /// Adds a sealed delta of (`rubric`, `epoch`, `voter`).
    pub fn add(&mut self, rubric: &Id, epoch: Epoch, voter: &Id, t: &Terms) {
        let into = if self.base_until.is_some_and(|b| epoch <= b) {
            &mut self.base
        } else {
            self.recent.entry(epoch).or_default()
        };
        into.entry(rubric.clone())
            .or_default()
            .entry(voter.clone())
            .or_default()
            .add(t);
        self.built
            .retain(|(r, k), _| r != rubric || *k < epoch.saturating_add(2));
    }

    /// Folds every epoch ≤ `through` into the base: no batch will need a
    /// table without them (the caller knows: T_k with k − 2 ≥ `through`).
    pub fn fold_through(&mut self, through: Epoch) {
        if self.base_until.is_some_and(|b| b >= through) {
            return;
        }
        let later = self.recent.split_off(&(through + 1));
        for (_, rubrics) in std::mem::replace(&mut self.recent, later) {
            for (rubric, voters) in rubrics {
                let base = self.base.entry(rubric).or_default();
                for (voter, t) in voters {
                    base.entry(voter).or_default().add(&t);
                }
            }
        }
        self.base_until = Some(through);
        // Tables of epochs no batch has any more.
        self.built.retain(|(_, k), _| *k >= through + 2);
    }

    /// T_k for `rubric`: every delta of epochs ≤ k − 2.
    pub fn table(&mut self, p: &ReputationParams, rubric: &Id, k: Epoch) -> Arc<Table> {
        if let Some(t) = self.built.get(&(rubric.clone(), k)) {
            return t.clone();
        }
        let t = Arc::new(Table::build(p, self.sums(rubric, k - 2)));
        self.built.insert((rubric.clone(), k), t.clone());
        t
    }

    /// A rubric's sums per reviewer over the epochs ≤ `through` (the base
    /// whole: the caller folds no further than it needs).
    pub fn sums(&self, rubric: &str, through: Epoch) -> FxHashMap<Id, Terms> {
        let mut out = self.base.get(rubric).cloned().unwrap_or_default();
        for (_, rubrics) in self.recent.range(..=through) {
            for (voter, t) in rubrics.get(rubric).into_iter().flatten() {
                out.entry(voter.clone()).or_default().add(t);
            }
        }
        out
    }

    /// Deltas that give the same tables from epoch `base_until + 2` on:
    /// the base as one delta per rubric and reviewer at its last epoch,
    /// the later epochs as they are (`run` hands them to a partition it
    /// starts).
    pub fn export(&self) -> Vec<(TermsKey, Terms)> {
        let mut out = Vec::new();
        if let Some(until) = self.base_until {
            for (rubric, voters) in &self.base {
                for (voter, t) in voters {
                    out.push(((rubric.clone(), until, voter.clone()), t.clone()));
                }
            }
        }
        for (epoch, rubrics) in &self.recent {
            for (rubric, voters) in rubrics {
                for (voter, t) in voters {
                    out.push(((rubric.clone(), *epoch, voter.clone()), t.clone()));
                }
            }
        }
        out
    }

    /// The newest epoch folded into the base (tables before it + 2 can no
    /// longer be built).
    pub fn base_until(&self) -> Option<Epoch> {
        self.base_until
    }

    /// Every rubric with a delta.
    pub fn rubrics(&self) -> Vec<Id> {
        let mut out: Vec<Id> = self.base.keys().cloned().collect();
        for rubrics in self.recent.values() {
            out.extend(rubrics.keys().cloned());
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The damped step of `learned` mode (contract §14): `kappa` and `beta` for
/// decay `alpha` and the batch's caller weights' sum `r` and applied
/// weights' sum `r_learned`. With `r_learned ≥ r` (c = 1) they are α and
/// 1 − α exactly, so such a batch scores bit for bit as §3.
pub fn damped_step(alpha: f64, r: f64, r_learned: f64) -> (f64, f64) {
    let c = f64::min(1.0, r_learned / r);
    let t = 1.0 - alpha;
    (alpha + t * (1.0 - c), t * c)
}

#[cfg(test)]
mod tests;
