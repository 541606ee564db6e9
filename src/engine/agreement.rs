//! Reviewer agreement (contract §11): Krippendorff's α with the interval
//! metric per rubric, and each reviewer's squared deviation from the other
//! votes of the same batch: the arithmetic (pure functions of a unit's
//! values), and below it the engine's agreement state (`query_index`).
//!
//! The units are scored batches with m ≥ 2 counted votes, taken
//! unweighted. A rubric keeps four additive sums (n, Σv, Σv², W) and a
//! unit count; a reviewer keeps their rated votes and the sum of their
//! squared deviations. Every sum is a fixed-point integer ([`fixed`], as
//! the leaderboard's): adding the sums of partitions, instances or replays
//! in any order gives the same integers, so α for a whole consumer group is
//! exactly α of one pass.

use crate::input::Id;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::board::{fixed, FIXED_ONE};
use super::{Change, Engine, Entry};

/// One rubric's agreement sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RubricSums {
    /// Units (batches with ≥ 2 counted votes).
    pub units: u64,
    /// n = Σ m: the pairable votes.
    pub pairable: u64,
    /// Σ fixed(v).
    pub sum: i128,
    /// Σ fixed(v²).
    pub square_sum: i128,
    /// Σ_units fixed(W_u), W_u = (m·Σv² − (Σv)²)/(m − 1).
    pub within: i128,
}

/// The agreement sums already counted by the metrics' agreement counters,
/// per partition and rubric: a partition's sums are counted from when it
/// is taken into service ([`Counted::baseline`]; what was committed before
/// counts where it happened), and after each commit by what was committed
/// since ([`Counted::committed`]), so a cycle that is aborted and redone
/// counts once and PromQL α over the group's counters equals α of the
/// committed sums.
#[derive(Debug, Default)]
pub struct Counted {
    partitions: std::collections::HashMap<String, FxHashMap<Id, RubricSums>>,
}

impl Counted {
    /// A partition's sums as it is taken into service.
    pub fn baseline(&mut self, partition: &str, sums: &FxHashMap<Id, RubricSums>) {
        let base = sums.iter().map(|(k, v)| (k.clone(), *v)).collect();
        self.partitions.insert(partition.to_owned(), base);
    }

    /// A partition's sums after a commit: per rubric that moved, what to add
    /// to the counters (n, S1, S2, W, each ≥ 0).
    pub fn committed(
        &mut self,
        partition: &str,
        sums: &FxHashMap<Id, RubricSums>,
    ) -> Vec<(Id, [f64; 4])> {
        let folded = self.partitions.entry(partition.to_owned()).or_default();
        let mut out = Vec::new();
        for (rubric, now) in sums {
            let before = folded.get(rubric).copied().unwrap_or_default();
            if *now == before {
                continue;
            }
            out.push((
                rubric.clone(),
                [
                    now.pairable.saturating_sub(before.pairable) as f64,
                    (now.sum - before.sum).max(0) as f64 / FIXED_ONE,
                    (now.square_sum - before.square_sum).max(0) as f64 / FIXED_ONE,
                    (now.within - before.within).max(0) as f64 / FIXED_ONE,
                ],
            ));
            folded.insert(rubric.clone(), *now);
        }
        out
    }

    /// A partition went away.
    pub fn forget(&mut self, partition: &str) {
        self.partitions.remove(partition);
    }
}

/// A denominator n·S2 − S1² at or below this fraction of n·S2 is the
/// rounding of equal votes, not a spread: α is then undefined (null). The
/// sums are exact to 2⁻⁶⁴ per vote, but the subtraction runs in f64, whose
/// rounding of two nearly equal products is ~1e-16 of them.
const DEGENERATE: f64 = 1e-12;

impl RubricSums {
    pub fn add(&mut self, o: &RubricSums) {
        self.units += o.units;
        self.pairable += o.pairable;
        self.sum += o.sum;
        self.square_sum += o.square_sum;
        self.within += o.within;
    }

    /// The sums as floats: (n, S1, S2, W).
    fn floats(&self) -> (f64, f64, f64, f64) {
        (
            self.pairable as f64,
            self.sum as f64 / FIXED_ONE,
            self.square_sum as f64 / FIXED_ONE,
            self.within as f64 / FIXED_ONE,
        )
    }

    /// α = 1 − (n − 1)·W / (n·S2 − S1²); `None` when n < 2 or every
    /// pairable vote is the same value.
    pub fn alpha(&self) -> Option<f64> {
        let (n, s1, s2, w) = self.floats();
        if n < 2.0 {
            return None;
        }
        let expected = n * s2 - s1 * s1;
        if expected <= n * s2 * DEGENERATE {
            return None;
        }
        Some(1.0 - (n - 1.0) * w / expected)
    }
}

/// One reviewer's agreement numbers for one rubric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReviewerStats {
    /// Their counted votes in units.
    pub rated: u64,
    /// Σ fixed((v − mean of the unit's other votes)²).
    pub sq_dev: i128,
}

impl ReviewerStats {
    pub fn add(&mut self, o: &ReviewerStats) {
        self.rated += o.rated;
        self.sq_dev += o.sq_dev;
    }

    pub fn is_zero(&self) -> bool {
        self.rated == 0 && self.sq_dev == 0
    }

    /// The mean squared deviation (`None` without rated votes).
    pub fn mean_sq_deviation(&self) -> Option<f64> {
        (self.rated > 0).then(|| self.sq_dev as f64 / FIXED_ONE / self.rated as f64)
    }
}

/// A unit's contribution to its rubric's sums and, in the order of
/// `values`, what each vote adds to its reviewer; `None` when there are
/// fewer than two values (not a unit).
pub fn unit(values: &[f64]) -> Option<(RubricSums, Vec<ReviewerStats>)> {
    let m = values.len();
    if m < 2 {
        return None;
    }
    let total: f64 = values.iter().sum();
    let mean = total / m as f64;
    // m·Σv² − (Σv)² = m·Σ(v − mean)²: the centred form cannot go below 0
    // by rounding, and is exactly 0 when every vote is the same.
    let centred: f64 = values.iter().map(|v| (v - mean) * (v - mean)).sum();
    let within = m as f64 * centred / (m - 1) as f64;
    let sums = RubricSums {
        units: 1,
        pairable: m as u64,
        sum: values.iter().map(|&v| fixed(v)).sum(),
        square_sum: values.iter().map(|&v| fixed(v * v)).sum(),
        within: fixed(within),
    };
    let deviations = values
        .iter()
        .map(|&v| {
            // The distance to the mean of the unit's other m − 1 votes.
            let d = v - (total - v) / (m - 1) as f64;
            ReviewerStats {
                rated: 1,
                sq_dev: fixed(d * d),
            }
        })
        .collect();
    Some((sums, deviations))
}

/// The counted values of a closed batch, in its order.
pub fn values(counted: &[Entry]) -> Vec<f64> {
    counted
        .iter()
        .map(|e| e.value.unwrap_or_default())
        .collect()
}

/// One rubric's row (contract §11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RubricRow {
    pub voter_prompt_id: String,
    pub units: u64,
    pub pairable_votes: u64,
    pub alpha: Option<f64>,
}

impl RubricRow {
    pub fn of(voter_prompt_id: &str, s: &RubricSums) -> Self {
        RubricRow {
            voter_prompt_id: voter_prompt_id.to_owned(),
            units: s.units,
            pairable_votes: s.pairable,
            alpha: s.alpha(),
        }
    }
}

/// One reviewer's row for one rubric (contract §11).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VoterRow {
    pub voter_id: String,
    pub voter_prompt_id: String,
    pub rated_votes: u64,
    pub mean_sq_deviation: Option<f64>,
}

impl VoterRow {
    pub fn of(voter_id: &str, voter_prompt_id: &str, s: &ReviewerStats) -> Self {
        VoterRow {
            voter_id: voter_id.to_owned(),
            voter_prompt_id: voter_prompt_id.to_owned(),
            rated_votes: s.rated,
            mean_sq_deviation: s.mean_sq_deviation(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// α by the textbook definition: D_o over pairs within units, D_e over
    /// all pairs of pairable values.
    fn pairwise(units: &[Vec<f64>]) -> Option<f64> {
        let units: Vec<&Vec<f64>> = units.iter().filter(|u| u.len() >= 2).collect();
        let all: Vec<f64> = units.iter().flat_map(|u| u.iter().copied()).collect();
        let n = all.len() as f64;
        let mut d_o = 0.0;
        for u in &units {
            let mut s = 0.0;
            for (i, a) in u.iter().enumerate() {
                for (j, b) in u.iter().enumerate() {
                    if i != j {
                        s += (a - b) * (a - b);
                    }
                }
            }
            d_o += s / (u.len() - 1) as f64;
        }
        d_o /= n;
        let mut d_e = 0.0;
        for (i, a) in all.iter().enumerate() {
            for (j, b) in all.iter().enumerate() {
                if i != j {
                    d_e += (a - b) * (a - b);
                }
            }
        }
        d_e /= n * (n - 1.0);
        (d_e > 0.0).then(|| 1.0 - d_o / d_e)
    }

    fn sums(units: &[Vec<f64>]) -> RubricSums {
        let mut s = RubricSums::default();
        for u in units {
            if let Some((c, _)) = unit(u) {
                s.add(&c);
            }
        }
        s
    }

    #[test]
    fn krippendorff_interval_example() {
        // Krippendorff (2011), "Computing Krippendorff's alpha-reliability",
        // 4 observers × 12 units, values 1–5 (missing omitted); interval
        // α = 0.849. α is invariant to the linear map onto [0, 1].
        let raw: [&[f64]; 12] = [
            &[1., 1., 1.],
            &[2., 2., 3., 2.],
            &[3., 3., 3., 3.],
            &[3., 3., 3., 3.],
            &[2., 2., 2., 2.],
            &[1., 2., 3., 4.],
            &[4., 4., 4., 4.],
            &[1., 1., 2., 1.],
            &[2., 2., 2., 2.],
            &[5., 5., 5.],
            &[1., 1.],
            &[3.],
        ];
        let units: Vec<Vec<f64>> = raw
            .iter()
            .map(|u| u.iter().map(|v| (v - 1.0) / 4.0).collect())
            .collect();
        let a = sums(&units).alpha().unwrap();
        assert!((a - 0.849).abs() < 0.0005, "{a}");
        assert!((a - pairwise(&units).unwrap()).abs() < 1e-12);
        assert_eq!(sums(&units).units, 11);
        assert_eq!(sums(&units).pairable, 40);
    }

    #[test]
    fn equal_votes_and_too_few_are_null() {
        assert_eq!(sums(&[vec![0.7, 0.7], vec![0.7, 0.7, 0.7]]).alpha(), None);
        assert_eq!(sums(&[vec![0.3]]).alpha(), None);
        assert_eq!(RubricSums::default().alpha(), None);
        // One unit with a spread: α is defined (and negative-free here).
        let one = sums(&[vec![0.0, 1.0]]);
        assert_eq!(one.alpha(), pairwise(&[vec![0.0, 1.0]]));
    }

    #[test]
    fn deviation_is_distance_to_the_others_mean() {
        let (_, d) = unit(&[0.0, 0.5, 1.0]).unwrap();
        assert_eq!(d[0].rated, 1);
        // 0 against the mean of 0.5 and 1.0; 0.5 against 0.5.
        assert!((d[0].mean_sq_deviation().unwrap() - 0.5625).abs() < 1e-15);
        assert_eq!(d[1].mean_sq_deviation(), Some(0.0));
    }
}

// ---- The engine's agreement state (`query_index` only) ----------------

/// A reviewer's row identity: (voter_prompt_id, voter_id), in the store's
/// key order (a rubric's reviewers are one prefix).
pub type ReviewerKey = (Id, Id);

/// A reviewer's cached numbers. `base` is what the store holds (`None`:
/// not read yet; the shell reads it before the next drain, see
/// [`Engine::reviewers_unknown`]), `delta` what closed units added since
/// the last drain (dirty while not zero).
#[derive(Debug, Clone, Copy)]
pub(super) struct ReviewerEntry {
    pub base: Option<ReviewerStats>,
    pub delta: ReviewerStats,
    pub used: u64,
}

/// Approximate memory of a cached reviewer: its slot and the voter id's
/// heap block (the rubric's is shared with the series).
pub(super) fn reviewer_bytes(voter_id: &Id) -> usize {
    super::memory::slot::<(ReviewerKey, ReviewerEntry)>() + super::memory::id_block(voter_id)
}

impl Engine {
    /// Adds a closed batch's counted votes to its rubric's sums and its
    /// reviewers, when they form a unit (≥ 2 votes).
    pub(super) fn note_unit(&mut self, rubric: &Id, counted: &[Entry]) {
        if counted.len() < 2 {
            return;
        }
        let Some((sums, deviations)) = unit(&values(counted)) else {
            return;
        };
        self.agreement.entry(rubric.clone()).or_default().add(&sums);
        self.dirty_agreement.push(rubric.clone());
        let base = self.complete.then(ReviewerStats::default);
        for (e, dev) in counted.iter().zip(deviations) {
            let key = (rubric.clone(), e.voter_id.clone());
            match self.reviewers.entry(key) {
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    if o.get().delta.is_zero() {
                        self.dirty_reviewers.push(o.key().clone());
                    }
                    let r = o.get_mut();
                    r.delta.add(&dev);
                    r.used = self.tick;
                }
                std::collections::hash_map::Entry::Vacant(slot) => {
                    self.cache_bytes += reviewer_bytes(&e.voter_id);
                    self.dirty_reviewers.push(slot.key().clone());
                    slot.insert(ReviewerEntry {
                        base,
                        delta: dev,
                        used: self.tick,
                    });
                }
            }
        }
    }

    /// Reviewers with changes whose stored numbers the engine has not
    /// seen: the shell reads them ([`Engine::provide_reviewer`]) before
    /// draining, since a drained reviewer record is the whole value.
    pub fn reviewers_unknown(&self) -> Vec<ReviewerKey> {
        self.dirty_reviewers
            .iter()
            .filter(|k| self.reviewers.get(*k).is_some_and(|e| e.base.is_none()))
            .cloned()
            .collect()
    }

    /// A reviewer's stored numbers (`None`: the store has none).
    pub fn provide_reviewer(&mut self, key: &ReviewerKey, stored: Option<ReviewerStats>) {
        if let Some(e) = self.reviewers.get_mut(key) {
            e.base.get_or_insert(stored.unwrap_or_default());
        }
    }

    /// Sets the agreement sums read from the store (after [`Engine::restore`]).
    pub fn restore_agreement(&mut self, rows: impl IntoIterator<Item = (Id, RubricSums)>) {
        self.agreement = rows.into_iter().collect();
    }

    /// The partition's agreement sums per rubric (`query_index` only).
    pub fn agreement(&self) -> &FxHashMap<Id, RubricSums> {
        &self.agreement
    }

    /// Hands the changed agreement rows and reviewers to `sink`. A reviewer
    /// whose stored numbers were not provided stays dirty (it goes with a
    /// later drain; nothing is lost).
    pub(super) fn drain_agreement(&mut self, sink: &mut impl FnMut(Change<'_>)) {
        if !self.dirty_agreement.is_empty() {
            self.dirty_agreement.sort_unstable();
            self.dirty_agreement.dedup();
            for k in self.dirty_agreement.drain(..) {
                if let Some(s) = self.agreement.get(&k) {
                    sink(Change::Agreement(&k, s));
                }
            }
        }
        let mut kept = Vec::new();
        for k in self.dirty_reviewers.drain(..) {
            let Some(e) = self.reviewers.get_mut(&k) else {
                continue;
            };
            let Some(mut full) = e.base else {
                kept.push(k);
                continue;
            };
            if e.delta.is_zero() {
                continue;
            }
            full.add(&e.delta);
            e.base = Some(full);
            e.delta = ReviewerStats::default();
            sink(Change::Reviewer(&k, &full));
        }
        self.dirty_reviewers = kept;
    }
}
