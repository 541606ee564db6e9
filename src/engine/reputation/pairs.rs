//! A rubric's two-class rates fitted to per-pair co-vote counts, pure
//! (contract §15, "The reviewers' rates from pair counts"): what a
//! `confusion` table's rates come from whenever its sealed deltas hold a
//! pair observation.
//!
//! The counts ([`PairSums`]): per unordered pair of reviewers (a, b) that
//! voted in the same unit of 0/1 values, how often they voted (0, 0),
//! (0, 1), (1, 0) and (1, 1). They are integers, so they add up the same
//! in any order and partitioning, like §14's and §15's sums.
//!
//! The fit is pairwise (composite-likelihood) EM: every co-vote is one
//! observation of a latent class, P(v | 1) = se or 1 − se, P(v | 0) =
//! 1 − sp or sp. A fixed number of rounds from a fixed start, in a fixed
//! order (pairs as given, sorted by (a, b); reviewers by index), so the
//! result is a function of the counts alone. No fused multiply-add.
//!
//! Pairs give two moments for three unknowns (π, x, y), so they do not
//! identify a crowd of alike reviewers on their own: the fit starts at the
//! agreement moments' (x, y, π) when those identify them
//! ([`super::confusion::moment_rates`]) and shrinks each reviewer towards
//! them; without them, towards the reviewer's own balanced accuracy (one
//! coin while their votes are few, two as they grow).

use std::collections::BTreeMap;

use crate::input::Id;

/// One pair's co-vote counts by `voter_id`: (a, b), `counts[2·v_a + v_b]`
/// ([`PairCount`]; stored with a < b in byte order).
pub type VoterPair = (Id, Id, [u64; 4]);

/// (x + n₀·prior) / (n + n₀) clamped to [ε, 1 − ε], or the prior clamped
/// when the denominator is 0.
pub(super) fn shrunk(x: f64, n: f64, n0: f64, prior: f64, eps: f64) -> f64 {
    let r = if n + n0 == 0.0 {
        prior
    } else {
        (x + n0 * prior) / (n + n0)
    };
    r.clamp(eps, 1.0 - eps)
}

/// A unit of more values than this adds no pair counts (its m(m − 1)/2
/// increments would dominate a seal, and the rows a delta record); its
/// values' other §15 sums count as always.
pub const MAX_PAIR_UNIT: usize = 64;

/// Pair counts by `voter_id`: (a, b) with a < b in byte order →
/// `counts[2·v_a + v_b]`. Integers, so any split of the units into parts,
/// added in any order, gives the same sums.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PairSums(BTreeMap<(Id, Id), [u64; 4]>);

impl PairSums {
    /// Adds one unit's values (one per reviewer, in any order): every pair
    /// of them once, when there are 2..=[`MAX_PAIR_UNIT`] and all are 0 or
    /// 1 (the units §15's sums count); else nothing.
    pub fn add_unit(&mut self, unit: &[(&Id, f64)]) {
        let m = unit.len();
        if !(2..=MAX_PAIR_UNIT).contains(&m) || !unit.iter().all(|&(_, v)| v == 0.0 || v == 1.0) {
            return;
        }
        for (i, &(a, va)) in unit.iter().enumerate() {
            for &(b, vb) in &unit[i + 1..] {
                let ((a, va), (b, vb)) = if a < b {
                    ((a, va), (b, vb))
                } else {
                    ((b, vb), (a, va))
                };
                let cell = 2 * usize::from(va == 1.0) + usize::from(vb == 1.0);
                let counts = self.0.entry((a.clone(), b.clone())).or_default();
                counts[cell] = counts[cell].saturating_add(1);
            }
        }
    }

    /// Adds another part's sums (tests: the engine adds rows).
    #[cfg(test)]
    pub fn merge(&mut self, other: &PairSums) {
        for (key, add) in &other.0 {
            let counts = self.0.entry(key.clone()).or_default();
            *counts = add_counts(*counts, add);
        }
    }

    /// The rows of the pairs' first reviewers: (a, its pairs' counts by b),
    /// in byte order (what the sealed deltas of (rubric, epoch, a) hold).
    pub fn into_rows(self) -> Vec<(Id, PairRow)> {
        let mut rows: Vec<(Id, PairRow)> = Vec::new();
        for ((a, b), counts) in self.0 {
            match rows.last_mut() {
                Some((last, row)) if *last == a => row.0.push((b, counts)),
                _ => rows.push((a, PairRow(vec![(b, counts)]))),
            }
        }
        rows
    }

    /// The pairs in (a, b) byte order, as
    /// [`super::confusion::ConfusionTable::build_with_pairs`] takes them.
    #[cfg(test)]
    pub fn to_vec(&self) -> Vec<VoterPair> {
        self.0
            .iter()
            .map(|((a, b), counts)| (a.clone(), b.clone(), *counts))
            .collect()
    }
}

/// A reviewer a's pair counts as a sealed delta holds them: (b, counts)
/// for every pair (a, b) with a < b in byte order, sorted by b.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PairRow(pub Vec<(Id, [u64; 4])>);

impl PairRow {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A row from (partner, counts) in any order: sorted by partner, a
    /// partner given twice once with its counts added.
    pub fn normalized(mut row: Vec<(Id, [u64; 4])>) -> PairRow {
        if row.is_sorted_by(|x, y| x.0 < y.0) {
            return PairRow(row);
        }
        row.sort_by(|x, y| x.0.cmp(&y.0));
        row.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = add_counts(kept.1, &later.1);
            }
            same
        });
        PairRow(row)
    }

    /// Adds another row of the same reviewer (a sorted merge: partners
    /// in both add their counts).
    pub fn add(&mut self, o: &PairRow) {
        if o.0.is_empty() {
            return;
        }
        if self.0.is_empty() {
            self.0.clone_from(&o.0);
            return;
        }
        let mine = std::mem::take(&mut self.0);
        let mut out = Vec::with_capacity(mine.len().max(o.0.len()));
        let mut theirs = o.0.iter().peekable();
        for (b, counts) in mine {
            while let Some((ob, oc)) = theirs.next_if(|(ob, _)| *ob < b) {
                out.push((ob.clone(), *oc));
            }
            match theirs.next_if(|(ob, _)| *ob == b) {
                Some((_, oc)) => out.push((b, add_counts(counts, oc))),
                None => out.push((b, counts)),
            }
        }
        out.extend(theirs.cloned());
        self.0 = out;
    }
}

fn add_counts(mut c: [u64; 4], o: &[u64; 4]) -> [u64; 4] {
    for (c, o) in c.iter_mut().zip(o) {
        *c = c.saturating_add(*o);
    }
    c
}

/// How often two reviewers (indices `a` < `b`) voted each way on the same
/// units: `counts[2·v_a + v_b]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairCount {
    pub a: usize,
    pub b: usize,
    pub counts: [u64; 4],
}

/// The fit's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairParams {
    /// EM rounds (no early stop).
    pub rounds: u32,
    /// n₀ᵖ: the shrinkage, in pair observations (a vote in a unit of m
    /// values makes m − 1 of them).
    pub prior_pairs: f64,
    /// ε: every rate is clamped to [ε, 1 − ε].
    pub rate_floor: f64,
}

impl Default for PairParams {
    fn default() -> Self {
        PairParams {
            rounds: 100,
            prior_pairs: 10.0,
            rate_floor: 0.02,
        }
    }
}

/// What the fit gives.
#[derive(Debug, Clone, PartialEq)]
pub struct PairFit {
    /// π: the share of class 1 among the pair observations.
    pub base_rate: f64,
    /// The rubric's se and sp (clamped to [ε, 1 − ε]).
    pub sensitivity: f64,
    pub specificity: f64,
    /// (se_u, sp_u) per reviewer index (a reviewer in no pair: the target
    /// its shrinkage pulls towards).
    pub rates: Vec<(f64, f64)>,
}

/// Per reviewer, one round's expected counts: class-1 observations n₁,
/// of them passes U; class-0 observations n₀, of them flags V.
#[derive(Clone, Copy, Default)]
struct Expected {
    n1: f64,
    u: f64,
    n0: f64,
    v: f64,
}

impl Expected {
    fn add(&mut self, vote: usize, g1: f64, g0: f64) {
        self.n1 += g1;
        self.n0 += g0;
        if vote == 1 {
            self.u += g1;
        } else {
            self.v += g0;
        }
    }
}

/// Fits `reviewers` reviewers' rates to `pairs` (sorted by (a, b), a < b <
/// `reviewers`). `anchor`: the moments' (x, y, π) with x = se, y = 1 − sp,
/// when they identify them. None when there is no pair observation.
pub fn fit(
    reviewers: usize,
    pairs: &[PairCount],
    anchor: Option<(f64, f64, f64)>,
    params: &PairParams,
) -> Option<PairFit> {
    let total: u64 = pairs.iter().flat_map(|p| p.counts).sum();
    if total == 0 {
        return None;
    }
    let (n0, eps) = (params.prior_pairs, params.rate_floor);
    let (start_se, start_sp, mut pi) = match anchor {
        Some((x, y, pi)) => (x, 1.0 - y, pi),
        None => (0.8, 0.8, 0.5),
    };
    let mut rates = vec![(start_se, start_sp); reviewers];
    let (mut se_r, mut sp_r) = (0.8, 0.8);
    let mut expected = vec![Expected::default(); reviewers];
    for _ in 0..params.rounds {
        expected.fill(Expected::default());
        let mut class1 = 0.0;
        for p in pairs {
            let ((se_a, sp_a), (se_b, sp_b)) = (rates[p.a], rates[p.b]);
            for (cell, &n) in p.counts.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                let (va, vb) = (cell >> 1, cell & 1);
                let l1 = if va == 1 { se_a } else { 1.0 - se_a }
                    * if vb == 1 { se_b } else { 1.0 - se_b };
                let l0 = if va == 1 { 1.0 - sp_a } else { sp_a }
                    * if vb == 1 { 1.0 - sp_b } else { sp_b };
                let g = pi * l1 / (pi * l1 + (1.0 - pi) * l0);
                let n = n as f64;
                let g1 = n * g;
                let g0 = n - g1;
                expected[p.a].add(va, g1, g0);
                expected[p.b].add(vb, g1, g0);
                class1 += g1;
            }
        }
        pi = class1 / total as f64;
        let mut sum = Expected::default();
        for e in &expected {
            sum.n1 += e.n1;
            sum.u += e.u;
            sum.n0 += e.n0;
            sum.v += e.v;
        }
        if !(sum.n1 > 0.0 && sum.n0 > 0.0) {
            break;
        }
        se_r = sum.u / sum.n1;
        sp_r = sum.v / sum.n0;
        for (r, e) in rates.iter_mut().zip(&expected) {
            let target = match anchor {
                Some((x, y, _)) => (x, 1.0 - y),
                None => {
                    let own =
                        (shrunk(e.u, e.n1, n0, se_r, 0.0) + shrunk(e.v, e.n0, n0, sp_r, 0.0)) / 2.0;
                    (own, own)
                }
            };
            *r = (
                shrunk(e.u, e.n1, n0, target.0, eps),
                shrunk(e.v, e.n0, n0, target.1, eps),
            );
        }
    }
    Some(PairFit {
        base_rate: pi,
        sensitivity: se_r.clamp(eps, 1.0 - eps),
        specificity: sp_r.clamp(eps, 1.0 - eps),
        rates,
    })
}

#[cfg(test)]
mod tests;
