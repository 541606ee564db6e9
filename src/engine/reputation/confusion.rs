//! Contract §15's model `confusion`, pure: the sums a unit adds (c, p, a,
//! b: soft counts against the others' unweighted mean), the table they
//! give per rubric (sensitivity, specificity, the evidence of each side,
//! the prior), and what a vote counts for in a batch scored with it.
//!
//! Sums are exact integers (the 2⁻⁴⁰ fixed point of §14's [`fix`]), so
//! they add up the same in any order and partitioning; every f64 step is
//! written in the contract's order, without fused multiply-add.

use rustc_hash::FxHashMap;

use std::cmp::Ordering;

use super::pairs::{shrunk, PairCount, PairFit, PairParams, VoterPair};

use super::{fix, unfix};
use crate::input::Id;

/// What a reviewer's values in sealed units of 0/1 values add up to under
/// §15: `c` values, `p` = Σ fix(o), `a` = Σ fix(o·v),
/// `b` = Σ fix((1 − o)(1 − v)), o being the others' unweighted mean, and
/// over the units of three or more: `c3` values and `t3` = Σ fix(v·r), r
/// the share of the pairs of others who both passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConfusionTerms {
    pub c: u64,
    pub p: u128,
    pub a: u128,
    pub b: u128,
    pub c3: u64,
    pub t3: u128,
}

impl ConfusionTerms {
    pub fn add(&mut self, o: &ConfusionTerms) {
        self.c = self.c.saturating_add(o.c);
        self.p = self.p.saturating_add(o.p);
        self.a = self.a.saturating_add(o.a);
        self.b = self.b.saturating_add(o.b);
        self.c3 = self.c3.saturating_add(o.c3);
        self.t3 = self.t3.saturating_add(o.t3);
    }

    /// F = c·2⁴⁰ − p: the expected true flags, in fixed point.
    fn flags(&self) -> u128 {
        (u128::from(self.c) << 40).saturating_sub(self.p)
    }
}

/// Whether a unit's values make §15 terms: all 0 or 1.
pub fn counts(values: &[f64]) -> bool {
    values.iter().all(|&v| v == 0.0 || v == 1.0)
}

/// The §15 terms of one value `v` in a unit of `m` ≥ 2 values, all 0 or
/// 1 ([`counts`]), whose sum (in `voter_id` byte order, §14) is `s`.
pub fn value_terms(s: f64, m: usize, v: f64) -> ConfusionTerms {
    let k = s - v;
    let o = (k / (m - 1) as f64).clamp(0.0, 1.0);
    let (c3, t3) = if m >= 3 {
        let pairs = ((m - 1) * (m - 2)) as f64;
        (1, fix(v * ((k * (k - 1.0)) / pairs)))
    } else {
        (0, 0)
    };
    ConfusionTerms {
        c: 1,
        p: fix(o),
        a: fix(o * v),
        b: fix((1.0 - o) * (1.0 - v)),
        c3,
        t3,
    }
}

/// The §15 terms of one unit's values, given in `voter_id` byte order:
/// one per value, or none when fewer than two or not all 0 or 1 (tests;
/// the engine seals both models' terms in one pass, `reputation::unit_terms`).
#[cfg(test)]
pub fn unit_terms(values: &[f64]) -> Option<Vec<ConfusionTerms>> {
    let m = values.len();
    if m < 2 || !counts(values) {
        return None;
    }
    let mut s = 0.0;
    for &v in values {
        s += v;
    }
    Some(values.iter().map(|&v| value_terms(s, m, v)).collect())
}

/// `reputation.confusion_*`, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfusionParams {
    /// n₀ᶜ (finite, ≥ 0).
    pub prior_votes: f64,
    /// ε (in (0, 0.5)).
    pub rate_floor: f64,
    /// M (finite, ≥ 1).
    pub max_weight: f64,
    /// Whether a table's rates are fitted to its pair counts when it holds
    /// any (`confusion_pair_fit`).
    pub pair_fit: bool,
}

impl Default for ConfusionParams {
    fn default() -> Self {
        ConfusionParams {
            prior_votes: 5.0,
            rate_floor: 0.02,
            max_weight: 10.0,
            pair_fit: true,
        }
    }
}

/// A reviewer's rates and side weights in a [`ConfusionTable`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sides {
    /// C_u (0 for a reviewer not in the table: the rubric's rates).
    pub votes: u64,
    pub sensitivity: f64,
    pub specificity: f64,
    /// w⁺: what a pass counts for (< 0: for a flag).
    pub pass_weight: f64,
    /// w⁻: what a flag counts for (< 0: for a pass).
    pub flag_weight: f64,
}

/// Where a table's rates come from (contract §15 "Tables").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatesFrom {
    /// The agreement moments identified them.
    Moments,
    /// The others' mean, when the moments do not.
    Mean,
    /// Fitted to per-pair co-vote counts ([`super::pairs`]), whenever the
    /// table holds a pair observation.
    Pairs,
}

impl RatesFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            RatesFrom::Moments => "moments",
            RatesFrom::Mean => "mean",
            RatesFrom::Pairs => "pairs",
        }
    }
}

/// One rubric's non-empty §15 table.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfusionTable {
    pub totals: ConfusionTerms,
    pub rates_from: RatesFrom,
    /// π.
    pub base_rate: f64,
    /// The rubric's se and sp.
    pub sensitivity: f64,
    pub specificity: f64,
    /// s: the mean positive evidence of one vote.
    pub evidence_scale: f64,
    /// The prior pseudo-vote: (y₀, w₀).
    pub prior: (f64, f64),
    /// Every reviewer with C_u ≥ 1.
    pub voters: FxHashMap<Id, Sides>,
    /// What a reviewer not in the table gets.
    pub unseen: Sides,
}

/// A reviewer's shrunk, clamped rates and their λ⁺ and λ⁻.
struct Rates {
    se: f64,
    sp: f64,
    pass: f64,
    flag: f64,
}

impl Rates {
    fn of(se: f64, sp: f64) -> Rates {
        Rates {
            se,
            sp,
            pass: (se / (1.0 - sp)).ln(),
            flag: (sp / (1.0 - se)).ln(),
        }
    }
}

/// The rubric's rates from the agreement moments (contract §15): (x, y,
/// π) with x = se and y = 1 − sp, or None when they are not identified.
pub fn moment_rates(totals: &ConfusionTerms, eps: f64) -> Option<(f64, f64, f64)> {
    if totals.c3 == 0 {
        return None;
    }
    let c = totals.c as f64;
    let m1 = unfix(totals.p) / c;
    let m2 = unfix(totals.a) / c;
    let m3 = unfix(totals.t3) / totals.c3 as f64;
    let v = m2 - m1 * m1;
    if !(v > 0.0 && v * c.sqrt() >= 1.0) {
        return None;
    }
    let e1 = (m3 - m1 * m2) / v;
    let e2 = (m1 * m3 - m2 * m2) / v;
    let d = e1 * e1 - 4.0 * e2;
    if !(d > 0.0) {
        return None;
    }
    let r = d.sqrt();
    let (x, y) = ((e1 + r) / 2.0, (e1 - r) / 2.0);
    if !(y >= -0.05 && x <= 1.05) {
        return None;
    }
    let (x, y) = (x.clamp(eps, 1.0 - eps), y.clamp(eps, 1.0 - eps));
    if !(x > y) {
        return None;
    }
    let pi = (m1 - y) / (x - y);
    (pi > 0.0 && pi < 1.0).then_some((x, y, pi))
}

impl ConfusionTable {
    /// The table of a rubric's per-reviewer sums without pair counts
    /// (contract §15 "Tables": rates from the moments or the mean), or
    /// None when it is empty (C = 0, P = 0, F = 0, reviewers better than
    /// chance holding at most half the values, or s ≤ 0). The engine
    /// always calls [`ConfusionTable::build_with_pairs`]; the tests check
    /// the rules without pair counts through this.
    #[cfg(test)]
    pub fn build(
        params: &ConfusionParams,
        sums: impl IntoIterator<Item = (Id, ConfusionTerms)>,
    ) -> Option<ConfusionTable> {
        Self::build_with_pairs(params, sums, None)
    }

    /// [`ConfusionTable::build`], with the reviewers' rates fitted to
    /// `pairs` (any order and split) when given and they hold a pair
    /// observation
    /// ([`super::pairs::fit`], anchored at the moments when those identify
    /// the rates); pairs naming a reviewer without sums are left out.
    pub fn build_with_pairs(
        params: &ConfusionParams,
        sums: impl IntoIterator<Item = (Id, ConfusionTerms)>,
        pairs: Option<&[VoterPair]>,
    ) -> Option<ConfusionTable> {
        let mut sums: Vec<(Id, ConfusionTerms)> =
            sums.into_iter().filter(|(_, t)| t.c > 0).collect();
        // s is summed in `voter_id` byte order.
        sums.sort_unstable_by(|x, y| x.0.cmp(&y.0));
        let mut totals = ConfusionTerms::default();
        for (_, t) in &sums {
            totals.add(t);
        }
        let flags = totals.flags();
        if totals.c == 0 || totals.p == 0 || flags == 0 {
            return None;
        }
        let n0 = params.prior_votes;
        let eps = params.rate_floor;
        let c = totals.c as f64;
        let anchor = moment_rates(&totals, eps);
        let fitted = pairs.and_then(|pairs| fit_pairs(params, &sums, pairs, anchor));
        let (rates_from, pi, se, sp, prior_rate, rated): (_, _, _, _, _, Vec<(Id, u64, Rates)>) =
            match (fitted, anchor) {
                (Some(fit), _) => {
                    let rated = sums
                        .into_iter()
                        .zip(fit.rates)
                        .map(|((v, t), (se_u, sp_u))| (v, t.c, Rates::of(se_u, sp_u)))
                        .collect();
                    let pi = fit.base_rate;
                    if !(pi > 0.0 && pi < 1.0) {
                        return None;
                    }
                    let prior_rate = (c * pi + n0 / 2.0) / (c + n0);
                    (
                        RatesFrom::Pairs,
                        pi,
                        fit.sensitivity,
                        fit.specificity,
                        prior_rate,
                        rated,
                    )
                }
                (None, Some((x, y, pi))) => {
                    let d = x - y;
                    let rated = sums
                        .into_iter()
                        .map(|(v, t)| {
                            let c_u = t.c as f64;
                            let (p_u, a_u, b_u) = (unfix(t.p), unfix(t.a), unfix(t.b));
                            let n1 = ((p_u - c_u * y) / d).clamp(0.0, c_u);
                            let n0_u = c_u - n1;
                            let right_passes =
                                (((a_u - n0_u * y) * (1.0 - y) + y * (b_u - n1 * (1.0 - x))) / d)
                                    .clamp(0.0, n1);
                            let right_flags =
                                ((x * (b_u - n1 * (1.0 - x)) + (1.0 - x) * (a_u - n0_u * y)) / d)
                                    .clamp(0.0, n0_u);
                            let se_u = shrunk(right_passes, n1, n0, x, eps);
                            let sp_u = shrunk(right_flags, n0_u, n0, 1.0 - y, eps);
                            (v, t.c, Rates::of(se_u, sp_u))
                        })
                        .collect();
                    let prior_rate = (c * pi + n0 / 2.0) / (c + n0);
                    (RatesFrom::Moments, pi, x, 1.0 - y, prior_rate, rated)
                }
                (None, None) => {
                    let p_bar = unfix(totals.p);
                    let pi = totals.p as f64 / (u128::from(totals.c) << 40) as f64;
                    let se = unfix(totals.a) / p_bar;
                    let sp = unfix(totals.b) / unfix(flags);
                    let rated = sums
                        .into_iter()
                        .map(|(v, t)| {
                            let se_u = shrunk(unfix(t.a), unfix(t.p), n0, se, eps);
                            let sp_u = shrunk(unfix(t.b), unfix(t.flags()), n0, sp, eps);
                            (v, t.c, Rates::of(se_u, sp_u))
                        })
                        .collect();
                    let prior_rate = (p_bar + n0 / 2.0) / (c + n0);
                    (RatesFrom::Mean, pi, se, sp, prior_rate, rated)
                }
            };
        // Most of the rubric's values must come from reviewers better than
        // chance: else the sides would be turned around wholesale (a first
        // table of a few items, a crowd at odds with itself), the label
        // switching every latent-class model has to rule out.
        let better: u64 = rated
            .iter()
            .filter(|(_, _, r)| r.se + r.sp > 1.0)
            .map(|(_, c_u, _)| *c_u)
            .sum();
        if better.saturating_mul(2) <= totals.c {
            return None;
        }
        let mut s = 0.0;
        for (_, c_u, r) in &rated {
            s += *c_u as f64 * (pi * f64::max(r.pass, 0.0) + (1.0 - pi) * f64::max(r.flag, 0.0));
        }
        let s = s / c;
        if !(s > 0.0) {
            return None;
        }
        let m = params.max_weight;
        let sides = |votes: u64, r: &Rates| Sides {
            votes,
            sensitivity: r.se,
            specificity: r.sp,
            pass_weight: (r.pass / s).clamp(-m, m),
            flag_weight: (r.flag / s).clamp(-m, m),
        };
        let unseen = sides(
            0,
            &Rates::of(se.clamp(eps, 1.0 - eps), sp.clamp(eps, 1.0 - eps)),
        );
        let voters = rated
            .iter()
            .map(|(v, c, r)| (v.clone(), sides(*c, r)))
            .collect();
        let prior = (
            if prior_rate > 0.5 { 1.0 } else { 0.0 },
            f64::min((prior_rate / (1.0 - prior_rate)).ln().abs() / s, m),
        );
        Some(ConfusionTable {
            totals,
            rates_from,
            base_rate: pi,
            sensitivity: se,
            specificity: sp,
            evidence_scale: s,
            prior,
            voters,
            unseen,
        })
    }

    /// A reviewer's sides: the rubric's rates for one not in the table.
    pub fn sides(&self, voter: &str) -> &Sides {
        self.voters.get(voter).unwrap_or(&self.unseen)
    }

    /// What a vote of value `x` counts for (contract §15 "Scoring"): the
    /// value y and the weight g (before the caller's r). `noise_weight`
    /// is the reviewer's §14 ω, which a value inside (0, 1) keeps.
    pub fn counted(&self, voter: &str, x: f64, noise_weight: f64) -> (f64, f64) {
        let w = if x == 1.0 {
            self.sides(voter).pass_weight
        } else if x == 0.0 {
            self.sides(voter).flag_weight
        } else {
            return (x, noise_weight);
        };
        if w >= 0.0 {
            (x, w)
        } else {
            (1.0 - x, -w)
        }
    }
}

/// The pair fit of `sums`' reviewers (sorted by `voter_id`, as `build`
/// sorts them): indices are their places there, so (a, b) in byte order
/// is (index a, index b) in order.
fn fit_pairs(
    params: &ConfusionParams,
    sums: &[(Id, ConfusionTerms)],
    pairs: &[VoterPair],
    anchor: Option<(f64, f64, f64)>,
) -> Option<PairFit> {
    let index = |v: &Id| sums.binary_search_by(|(u, _)| u.cmp(v)).ok();
    let mut counts: Vec<PairCount> = pairs
        .iter()
        .filter_map(|(a, b, counts)| {
            let (a, b) = (index(a)?, index(b)?);
            let [c00, c01, c10, c11] = *counts;
            match a.cmp(&b) {
                Ordering::Less => Some(PairCount {
                    a,
                    b,
                    counts: *counts,
                }),
                // Given the other way round: the same pair, seen from b.
                Ordering::Greater => Some(PairCount {
                    a: b,
                    b: a,
                    counts: [c00, c10, c01, c11],
                }),
                Ordering::Equal => None,
            }
        })
        .collect();
    counts.sort_unstable_by_key(|p| (p.a, p.b));
    // The same pair given twice counts once with both counts added, so
    // the fit's order never depends on how the input was split.
    counts.dedup_by(|later, kept| {
        let same = (later.a, later.b) == (kept.a, kept.b);
        if same {
            for (k, l) in kept.counts.iter_mut().zip(later.counts) {
                *k = k.saturating_add(l);
            }
        }
        same
    });
    let fit_params = PairParams {
        rate_floor: params.rate_floor,
        ..Default::default()
    };
    super::pairs::fit(sums.len(), &counts, anchor, &fit_params)
}

/// The mean of a batch's counted values (y, r') with the prior (y₀, w₀)
/// when it enters (contract §15): (Y + w₀·y₀) / (R' + w₀), sums in the
/// given (`vote_ids`) order; `None` when there is no evidence at all
/// (R' = 0), which the contract scores as 0.5 without a step.
pub fn mean_with_prior(counted: &[(f64, f64)], prior: Option<(f64, f64)>) -> Option<f64> {
    let mut weight_sum = 0.0;
    let mut weighted = 0.0;
    for &(y, r) in counted {
        weight_sum += r;
        weighted += r * y;
    }
    if weight_sum == 0.0 {
        return None;
    }
    Some(match prior {
        Some((y0, w0)) if w0 > 0.0 => (weighted + w0 * y0) / (weight_sum + w0),
        _ => weighted / weight_sum,
    })
}

#[cfg(test)]
mod tests;
