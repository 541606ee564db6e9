//! Contract §15's worked checks, and the properties its sums and tables
//! promise.

use super::*;
use crate::engine::reputation::damped_step;
use crate::engine::reputation::pairs::PairSums;
use crate::engine::score::moments;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6
}

macro_rules! assert_close {
    ($a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        assert!(close(a, b), "{} = {a}, expected {b}", stringify!($a));
    }};
}

/// The worked checks' hour 0 on rubric `safety`: (a, b, c, l) per item.
const HOUR_ZERO: [[f64; 4]; 5] = [
    [1.0, 1.0, 1.0, 1.0],
    [0.0, 0.0, 0.0, 1.0],
    [0.0, 0.0, 0.0, 1.0],
    [0.0, 0.0, 0.0, 0.0],
    [0.0, 0.0, 1.0, 1.0],
];
const VOTERS: [&str; 4] = ["a", "b", "c", "l"];

/// Each reviewer's sums over `units`, taken in the order given.
fn sums_of(units: &[[f64; 4]]) -> FxHashMap<Id, ConfusionTerms> {
    let mut sums: FxHashMap<Id, ConfusionTerms> = FxHashMap::default();
    for unit in units {
        let terms = unit_terms(unit).expect("a unit");
        for (voter, t) in VOTERS.iter().zip(terms) {
            sums.entry(Id::from(*voter)).or_default().add(&t);
        }
    }
    sums
}

fn table() -> ConfusionTable {
    ConfusionTable::build(&ConfusionParams::default(), sums_of(&HOUR_ZERO)).expect("a table")
}

#[test]
fn check_1_sums() {
    let sums = sums_of(&HOUR_ZERO);
    let expect = [
        ("a", 2.333333, 1.0, 2.666667),
        ("b", 2.333333, 1.0, 2.666667),
        ("c", 2.0, 1.333333, 2.333333),
        ("l", 1.333333, 1.333333, 1.0),
    ];
    for (voter, p, a, b) in expect {
        let t = sums[voter];
        assert_eq!(t.c, 5, "{voter}");
        assert_close!(unfix(t.p), p);
        assert_close!(unfix(t.a), a);
        assert_close!(unfix(t.b), b);
    }
    // The first item: every o is 1, so p 1, a 1 and b 0 exactly, and
    // every pair of others passed with each reviewer (t3 1).
    let first = unit_terms(&HOUR_ZERO[0]).unwrap();
    let all_pass = ConfusionTerms {
        c: 1,
        p: 1 << 40,
        a: 1 << 40,
        b: 0,
        c3: 1,
        t3: 1 << 40,
    };
    assert!(first.iter().all(|t| *t == all_pass));
    for voter in VOTERS {
        assert_eq!((sums[voter].c3, sums[voter].t3), (5, 1 << 40), "{voter}");
    }
    // A unit with a graded value adds nothing; a unit of two no triples.
    assert_eq!(unit_terms(&[1.0, 0.7, 0.0]), None);
    assert!(unit_terms(&[1.0, 0.0])
        .unwrap()
        .iter()
        .all(|t| t.c3 == 0 && t.t3 == 0));
}

#[test]
fn check_2_table() {
    let t = table();
    // V·√C = 0.328 < 1: the moments do not identify the rates.
    assert_eq!(moment_rates(&t.totals, 0.02), None);
    assert_eq!(t.rates_from, RatesFrom::Mean);
    assert_eq!(t.totals.c, 20);
    assert_close!(t.base_rate, 0.4);
    assert_close!(t.sensitivity, 0.583333);
    assert_close!(t.specificity, 0.722222);
    assert_close!(t.evidence_scale, 0.675172);
    let expect = [
        ("a", 0.534091, 0.818841, 1.601354, 0.835193),
        ("b", 0.534091, 0.818841, 1.601354, 0.835193),
        ("c", 0.607143, 0.743056, 1.273608, 0.943945),
        ("l", 0.671053, 0.532051, 0.533922, 0.712177),
    ];
    for (voter, se, sp, pass, flag) in expect {
        let s = t.sides(voter);
        assert_eq!(s.votes, 5);
        assert_close!(s.sensitivity, se);
        assert_close!(s.specificity, sp);
        assert_close!(s.pass_weight, pass);
        assert_close!(s.flag_weight, flag);
    }
    // λ⁺ of a: ln(se/(1 − sp)).
    assert_close!(t.sides("a").pass_weight * t.evidence_scale, 1.081189);
    // π′ = 10.5/25 = 0.42: a flag of weight |ln(0.42/0.58)|/s.
    assert_eq!(t.prior.0, 0.0);
    assert_close!(t.prior.1, 0.478061);
    // n, not in the table: the rubric's rates.
    let n = t.sides("n");
    assert_eq!(n.votes, 0);
    assert_close!(n.sensitivity, 0.583333);
    assert_close!(n.specificity, 0.722222);
    assert_close!(n.pass_weight, 1.098887);
}

/// A batch of (voter, value, r) scored with `t` from S = 0.5 after
/// Δt = 3600 s at λ = 0.01/s: (m, σ², step, score).
fn score(t: &ConfusionTable, votes: &[(&str, f64, f64)]) -> (f64, f64, f64, f64) {
    let counted: Vec<(f64, f64)> = votes
        .iter()
        .map(|&(voter, x, r)| {
            let (y, g) = t.counted(voter, x, 1.0);
            (y, r * g)
        })
        .collect();
    let binary = votes.iter().all(|&(_, x, _)| x == 0.0 || x == 1.0);
    let m = mean_with_prior(&counted, binary.then_some(t.prior)).expect("evidence");
    let r: f64 = votes.iter().map(|v| v.2).sum();
    let applied = moments(&counted);
    let alpha = (-0.01f64 * 3600.0).exp();
    let (kappa, beta) = damped_step(alpha, r, applied.weight_sum);
    (m, applied.variance, beta, kappa * 0.5 + beta * m)
}

#[test]
fn check_3_lone_votes() {
    let t = table();
    let (m, _, step, s) = score(&t, &[("a", 1.0, 1.0)]);
    assert_close!(m, 0.770098);
    assert_eq!(step, 1.0 - (-36f64).exp());
    assert_close!(s, 0.770098);
    let (m, _, step, s) = score(&t, &[("l", 1.0, 1.0)]);
    assert_close!(m, 0.527600);
    assert_close!(step, 0.533922);
    assert_close!(s, 0.514736);
    let (m, _, _, s) = score(&t, &[("n", 1.0, 1.0)]);
    assert_close!(m, 0.696844);
    assert_close!(s, 0.696844);
}

#[test]
fn check_4_two_votes() {
    let t = table();
    let (m, var, step, s) = score(&t, &[("a", 0.0, 1.0), ("l", 1.0, 1.0)]);
    assert_close!(var, 0.237895);
    assert_close!(m, 0.289048);
    assert_close!(step, 0.684557);
    assert_close!(s, 0.355591);
    let (m, _, step, s) = score(&t, &[("c", 0.0, 1.0), ("l", 1.0, 2.0)]);
    assert_close!(m, 0.428879);
    assert_close!(step, 0.670596);
    assert_close!(s, 0.452306);
}

#[test]
fn empty_tables() {
    let p = ConfusionParams::default();
    assert!(ConfusionTable::build(&p, []).is_none(), "C = 0");
    // Everyone always passes: o = 1 everywhere, F = 0.
    let all_pass = sums_of(&[[1.0; 4], [1.0; 4]]);
    assert!(ConfusionTable::build(&p, all_pass).is_none(), "F = 0");
    let all_flag = sums_of(&[[0.0; 4], [0.0; 4]]);
    assert!(ConfusionTable::build(&p, all_flag).is_none(), "P = 0");
    // Two reviewers who always disagree: every side is at or below chance,
    // so no vote carries positive evidence (s = 0).
    let mut sums: FxHashMap<Id, ConfusionTerms> = FxHashMap::default();
    for unit in [[1.0, 0.0], [0.0, 1.0]] {
        for (voter, t) in ["x", "y"].iter().zip(unit_terms(&unit).unwrap()) {
            sums.entry(Id::from(*voter)).or_default().add(&t);
        }
    }
    assert!(ConfusionTable::build(&p, sums).is_none(), "s = 0");
}

#[test]
fn most_values_from_reviewers_worse_than_chance_make_no_table() {
    // Every unit: a and b pass exactly when c flags, and d agrees with c.
    // Against the others' mean everyone looks worse than chance: the
    // sides would all be turned around, so there is no table.
    let p = ConfusionParams::default();
    let mut sums: FxHashMap<Id, ConfusionTerms> = FxHashMap::default();
    for i in 0..40 {
        let t = if i % 2 == 0 { 1.0 } else { 0.0 };
        for (voter, term) in ["a", "b", "c", "d"]
            .iter()
            .zip(unit_terms(&[t, 1.0 - t, t, 1.0 - t]).unwrap())
        {
            sums.entry(Id::from(*voter)).or_default().add(&term);
        }
    }
    assert!(ConfusionTable::build(&p, sums).is_none());
}

#[test]
fn a_side_worse_than_chance_counts_for_the_other() {
    // Three who agree with the truth and one who always says the opposite.
    let units: Vec<[f64; 4]> = (0..40)
        .map(|i| {
            let truth = if i % 4 == 0 { 1.0 } else { 0.0 };
            [truth, truth, truth, 1.0 - truth]
        })
        .collect();
    let t = ConfusionTable::build(&ConfusionParams::default(), sums_of(&units)).unwrap();
    let adversary = t.sides("l");
    assert!(
        adversary.pass_weight < 0.0 && adversary.flag_weight < 0.0,
        "{adversary:?}"
    );
    let (y, g) = t.counted("l", 1.0, 1.0);
    assert_eq!(y, 0.0);
    assert_eq!(g, -adversary.pass_weight);
    let (y, g) = t.counted("l", 0.0, 1.0);
    assert_eq!((y, g), (1.0, -adversary.flag_weight));
    // The honest sides are positive, the prior a flag (a quarter pass).
    assert!(t.sides("a").pass_weight > 0.0 && t.sides("a").flag_weight > 0.0);
    assert_eq!(t.prior.0, 0.0);
}

#[test]
fn graded_values_keep_the_noise_weight() {
    let t = table();
    assert_eq!(t.counted("l", 0.7, 1.25), (0.7, 1.25));
    assert_eq!(t.counted("n", 0.3, 0.5), (0.3, 0.5));
}

#[test]
fn no_evidence_no_mean() {
    assert_eq!(
        mean_with_prior(&[(1.0, 0.0), (0.0, 0.0)], Some((0.0, 0.4))),
        None
    );
    assert_eq!(mean_with_prior(&[(1.0, 2.0)], Some((0.0, 0.0))), Some(1.0));
    assert_eq!(mean_with_prior(&[(1.0, 1.0)], None), Some(1.0));
}

#[test]
fn the_table_does_not_depend_on_order() {
    // The units in reverse order and the reviewers' sums offered in
    // reverse give the same sums, bit for bit, and so the same table.
    let forward = sums_of(&HOUR_ZERO);
    let mut reversed_units = HOUR_ZERO;
    reversed_units.reverse();
    let backward = sums_of(&reversed_units);
    assert_eq!(forward, backward);
    let p = ConfusionParams::default();
    let mut rows: Vec<(Id, ConfusionTerms)> = forward.into_iter().collect();
    let a = ConfusionTable::build(&p, rows.clone()).unwrap();
    rows.reverse();
    let b = ConfusionTable::build(&p, rows).unwrap();
    assert_eq!(a, b);
}

#[test]
fn rates_stay_inside_the_floor() {
    let p = ConfusionParams {
        prior_votes: 0.0,
        ..ConfusionParams::default()
    };
    let units: Vec<[f64; 4]> = (0..10)
        .map(|i| if i % 2 == 0 { [1.0; 4] } else { [0.0; 4] })
        .collect();
    let t = ConfusionTable::build(&p, sums_of(&units)).unwrap();
    let s = t.sides("a");
    assert_eq!((s.sensitivity, s.specificity), (0.98, 0.98));
    // Everyone alike and perfect: each side carries the mean evidence.
    assert_close!(s.pass_weight, 1.0);
    assert_close!(s.flag_weight, 1.0);
    assert!(s.pass_weight <= p.max_weight);
}

/// Checks 6 and 10: rubric `format`, the votes of a, b and c on 40
/// items, each unit with how many items voted so.
const FORMAT_ITEMS: [([f64; 3], usize); 8] = [
    ([1.0, 1.0, 1.0], 6),
    ([1.0, 1.0, 0.0], 1),
    ([1.0, 0.0, 1.0], 1),
    ([0.0, 1.0, 1.0], 1),
    ([1.0, 0.0, 0.0], 2),
    ([0.0, 1.0, 0.0], 2),
    ([0.0, 0.0, 1.0], 2),
    ([0.0, 0.0, 0.0], 25),
];

/// Check 6: rubric `format`, a, b and c on 40 items.
#[test]
fn check_6_rates_from_the_moments() {
    let mut sums: FxHashMap<Id, ConfusionTerms> = FxHashMap::default();
    for (unit, n) in FORMAT_ITEMS {
        for _ in 0..n {
            for (voter, t) in ["a", "b", "c"].iter().zip(unit_terms(&unit).unwrap()) {
                sums.entry(Id::from(*voter)).or_default().add(&t);
            }
        }
    }
    let a = sums["a"];
    assert_eq!((a.c, a.c3), (40, 40));
    assert_close!(unfix(a.p), 10.0);
    assert_close!(unfix(a.a), 7.0);
    assert_close!(unfix(a.b), 27.0);
    assert_close!(unfix(a.t3), 6.0);
    let t = ConfusionTable::build(&ConfusionParams::default(), sums).unwrap();
    assert_eq!(t.rates_from, RatesFrom::Moments);
    assert_format_table(&t);
}

/// Checks 6 and 10's table: every reviewer at the moments' rates, and a's
/// lone pass in hour 2.
fn assert_format_table(t: &ConfusionTable) {
    assert_close!(t.base_rate, 0.223842);
    assert_close!(t.sensitivity, 0.874569);
    assert_close!(t.specificity, 0.930124);
    assert_close!(t.evidence_scale, 2.120731);
    for voter in ["a", "b", "c"] {
        let s = t.sides(voter);
        assert_close!(s.sensitivity, 0.874569);
        assert_close!(s.specificity, 0.930124);
        assert_close!(s.pass_weight, 1.191576);
        assert_close!(s.flag_weight, 0.944750);
    }
    assert_eq!(t.prior.0, 0.0);
    assert_close!(t.prior.1, 0.556841);
    let (m, _, _, s) = score(t, &[("a", 1.0, 1.0)]);
    assert_close!(m, 0.681517);
    assert_close!(s, 0.681517);
}

/// Check 10: rubric `format` with its pair counts. The moments identify
/// the rates, so the fit starts there; their point reproduces every cell
/// share, so the fit stays: check 6's numbers, from the pairs.
#[test]
fn check_10_the_anchored_pair_fit_stays_at_the_moments() {
    let voters = [Id::from("a"), Id::from("b"), Id::from("c")];
    let mut sums: FxHashMap<Id, ConfusionTerms> = FxHashMap::default();
    let mut pairs = PairSums::default();
    for (unit, n) in FORMAT_ITEMS {
        for _ in 0..n {
            for (voter, t) in voters.iter().zip(unit_terms(&unit).unwrap()) {
                sums.entry(voter.clone()).or_default().add(&t);
            }
            let values: Vec<(&Id, f64)> = voters.iter().zip(unit).collect();
            pairs.add_unit(&values);
        }
    }
    let pairs = pairs.to_vec();
    assert!(pairs.iter().all(|p| p.2 == [27, 3, 3, 7]), "{pairs:?}");
    let t =
        ConfusionTable::build_with_pairs(&ConfusionParams::default(), sums, Some(&pairs)).unwrap();
    assert_eq!(t.rates_from, RatesFrom::Pairs);
    assert_format_table(&t);
}

/// How each pair of `VOTERS` voted together in `units`: (a, b) in
/// `VOTERS` order, `counts[2·v_a + v_b]`.
fn pairs_of(units: &[[f64; 4]]) -> Vec<VoterPair> {
    let mut pairs = Vec::new();
    for a in 0..VOTERS.len() {
        for b in a + 1..VOTERS.len() {
            let mut counts = [0; 4];
            for unit in units {
                counts[2 * unit[a] as usize + unit[b] as usize] += 1;
            }
            pairs.push((Id::from(VOTERS[a]), Id::from(VOTERS[b]), counts));
        }
    }
    pairs
}

/// `pairs.py`'s `table(K, c, 100, 10, None)` on hour 0 (the moments do
/// not identify the rates there, so the fit is not anchored).
#[test]
fn pair_table_agrees_with_the_simulation() {
    let pairs = pairs_of(&HOUR_ZERO);
    assert_eq!(pairs[0].2, [4, 0, 0, 1]);
    assert_eq!(pairs[5].2, [1, 2, 0, 2]);
    let sums = sums_of(&HOUR_ZERO);
    assert_eq!(
        moment_rates(
            &sums.values().fold(ConfusionTerms::default(), |mut t, s| {
                t.add(s);
                t
            }),
            0.02
        ),
        None
    );
    let t = ConfusionTable::build_with_pairs(&ConfusionParams::default(), sums, Some(&pairs))
        .expect("a table");
    assert_eq!(t.rates_from, RatesFrom::Pairs);
    assert_close!(t.base_rate, 0.2237100185061232);
    assert_close!(t.sensitivity, 0.946130307490819);
    assert_close!(t.specificity, 0.757382967844587);
    let expect = [
        ("a", 0.9115285, 0.9520784, 1.5447746, 1.24605773),
        ("b", 0.9115285, 0.9520784, 1.5447746, 1.24605773),
        ("c", 0.88600847, 0.81771051, 0.82921183, 1.033353),
        ("l", 0.79298187, 0.47504417, 0.21632526, 0.43560258),
    ];
    for (voter, se, sp, pass, flag) in expect {
        let s = t.sides(voter);
        assert_eq!(s.votes, 5, "{voter}");
        assert_close!(s.sensitivity, se);
        assert_close!(s.specificity, sp);
        assert_close!(s.pass_weight, pass);
        assert_close!(s.flag_weight, flag);
    }
    assert_eq!(t.prior.0, 0.0);
    assert_close!(t.prior.1, 0.49800332719281587);
}

/// A pair given the other way round, or its counts split over several
/// entries (as partitions hand them over), makes the same table.
#[test]
fn pair_table_is_the_same_however_the_pairs_come() {
    let params = ConfusionParams::default();
    let pairs = pairs_of(&HOUR_ZERO);
    let one = ConfusionTable::build_with_pairs(&params, sums_of(&HOUR_ZERO), Some(&pairs));
    let mut other: Vec<VoterPair> = Vec::new();
    for (a, b, [c00, c01, c10, c11]) in pairs.iter().rev().cloned() {
        other.push((b.clone(), a.clone(), [c00, c10, c01, c11]));
        other.push((a, b, [0, 0, 0, 0]));
    }
    // Hour 0's (a, c) pair as two entries: 2 + 1 times (0, 0).
    other.retain(|(a, b, _)| !(a.as_str() == "c" && b.as_str() == "a"));
    other.push((Id::from("a"), Id::from("c"), [2, 1, 0, 0]));
    other.push((Id::from("c"), Id::from("a"), [1, 0, 0, 1]));
    let two = ConfusionTable::build_with_pairs(&params, sums_of(&HOUR_ZERO), Some(&other));
    assert!(one.is_some());
    assert_eq!(one, two);
}

/// No pair observation (or pairs of reviewers without sums): the table
/// the sums make on their own.
#[test]
fn without_pair_observations_the_sums_decide() {
    let params = ConfusionParams::default();
    let own = ConfusionTable::build(&params, sums_of(&HOUR_ZERO));
    let stray = [(Id::from("x"), Id::from("y"), [3, 0, 0, 3])];
    for pairs in [&[][..], &stray[..]] {
        let t = ConfusionTable::build_with_pairs(&params, sums_of(&HOUR_ZERO), Some(pairs));
        assert_eq!(t, own);
    }
    assert_eq!(own.map(|t| t.rates_from), Some(RatesFrom::Mean));
}
