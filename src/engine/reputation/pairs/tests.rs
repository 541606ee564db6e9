use super::*;

fn pair(a: usize, b: usize, counts: [u64; 4]) -> PairCount {
    PairCount { a, b, counts }
}

fn close(x: f64, y: f64, tol: f64) -> bool {
    (x - y).abs() <= tol
}

/// Four reviewers (the fourth turned around) and a fifth in no pair.
fn crowd() -> Vec<PairCount> {
    vec![
        pair(0, 1, [20, 3, 2, 9]),
        pair(0, 2, [15, 6, 1, 7]),
        pair(0, 3, [4, 10, 12, 3]),
        pair(1, 2, [18, 2, 4, 8]),
        pair(1, 3, [6, 9, 11, 2]),
        pair(2, 3, [7, 8, 9, 1]),
    ]
}

#[test]
fn one_round_by_hand() {
    // Start se = sp = 0.8, π = 0.5. Cell (0, 0): l₁ = 0.2·0.2, l₀ =
    // 0.8·0.8, g = 1/17; cell (1, 1): g = 16/17. Three (0, 0) and one
    // (1, 1): class 1 = 3/17 + 16/17 = 19/17 of 4, π = 19/68. Each
    // reviewer: n₁ = 19/17, U = 16/17, n₀ = 49/17, V = 48/17; with no
    // shrinkage se = 16/19, sp = 48/49, and so are the rubric's.
    let params = PairParams {
        rounds: 1,
        prior_pairs: 0.0,
        rate_floor: 0.02,
    };
    let f = fit(2, &[pair(0, 1, [3, 0, 0, 1])], None, &params).unwrap();
    assert!(close(f.base_rate, 19.0 / 68.0, 1e-15), "{f:?}");
    assert!(close(f.sensitivity, 16.0 / 19.0, 1e-15), "{f:?}");
    assert!(close(f.specificity, 48.0 / 49.0, 1e-15), "{f:?}");
    for &(se, sp) in &f.rates {
        assert!(close(se, 16.0 / 19.0, 1e-15) && close(sp, 48.0 / 49.0, 1e-15));
    }
}

#[test]
fn no_pair_observation_no_fit() {
    let p = PairParams::default();
    assert_eq!(fit(3, &[], None, &p), None);
    assert_eq!(
        fit(3, &[pair(0, 1, [0; 4])], Some((0.9, 0.1, 0.3)), &p),
        None
    );
}

/// `pairs.py`'s `pair_em(K, 100, 10.0, anchor)` on the same counts (K
/// holding every pair both ways round); numpy sums in another order, so
/// the two agree to rounding, not bit for bit.
#[test]
fn agrees_with_the_simulation() {
    let cases: [(Option<(f64, f64, f64)>, f64, f64, f64, [(f64, f64); 5]); 2] = [
        (
            None,
            0.39725471073540397,
            0.6664114374866367,
            0.7971438863716767,
            [
                (0.844625652964284, 0.9247480652565448),
                (0.9139218815311796, 0.9155487763045266),
                (0.8332935453981186, 0.8724805563814929),
                (0.16338173232064626, 0.35284134862333066),
                (0.7317776619291567, 0.7317776619291567),
            ],
        ),
        (
            Some((0.85, 0.1, 0.3)),
            0.40629888048609475,
            0.67885197112794,
            0.8127191440644584,
            [
                (0.8312397953440435, 0.9418734432554114),
                (0.893337176040224, 0.9181580425187587),
                (0.8476714309986267, 0.8944606113532365),
                (0.3164110760536064, 0.4942625006393673),
                (0.85, 0.9),
            ],
        ),
    ];
    for (anchor, pi, se, sp, rates) in cases {
        let f = fit(5, &crowd(), anchor, &PairParams::default()).unwrap();
        assert!(close(f.base_rate, pi, 1e-12), "{anchor:?}: {f:?}");
        assert!(close(f.sensitivity, se, 1e-12), "{anchor:?}: {f:?}");
        assert!(close(f.specificity, sp, 1e-12), "{anchor:?}: {f:?}");
        for (got, want) in f.rates.iter().zip(rates) {
            assert!(
                close(got.0, want.0, 1e-12) && close(got.1, want.1, 1e-12),
                "{anchor:?}: {got:?} against {want:?}"
            );
        }
    }
}

#[test]
fn the_same_counts_give_the_same_bits() {
    let p = PairParams::default();
    let a = fit(5, &crowd(), None, &p).unwrap();
    let b = fit(5, &crowd(), None, &p).unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}

/// Without an anchor the start is symmetric in the classes, so reading
/// every pass as a flag swaps se with sp and π with 1 − π.
#[test]
fn turning_every_vote_around_swaps_the_classes() {
    let p = PairParams::default();
    let turned: Vec<PairCount> = crowd()
        .into_iter()
        .map(|q| {
            let [c00, c01, c10, c11] = q.counts;
            pair(q.a, q.b, [c11, c10, c01, c00])
        })
        .collect();
    let f = fit(5, &crowd(), None, &p).unwrap();
    let g = fit(5, &turned, None, &p).unwrap();
    assert!(close(f.base_rate, 1.0 - g.base_rate, 1e-9), "{f:?} {g:?}");
    assert!(close(f.sensitivity, g.specificity, 1e-9));
    assert!(close(f.specificity, g.sensitivity, 1e-9));
    for (x, y) in f.rates.iter().zip(&g.rates) {
        assert!(
            close(x.0, y.1, 1e-9) && close(x.1, y.0, 1e-9),
            "{x:?} {y:?}"
        );
    }
}

/// Counts as a planted crowd would give them in expectation: the fit
/// finds who errs which way.
#[test]
fn finds_a_lenient_and_a_harsh_reviewer() {
    // (se, sp): two honest, one lenient (passes most negatives), one harsh
    // (flags most positives); π = 0.3, 400 co-votes per pair.
    let truth = [(0.9, 0.9), (0.9, 0.9), (0.95, 0.4), (0.4, 0.95)];
    let pi = 0.3;
    let mut pairs = Vec::new();
    for a in 0..truth.len() {
        for b in a + 1..truth.len() {
            let mut counts = [0u64; 4];
            for (cell, n) in counts.iter_mut().enumerate() {
                let (va, vb) = (cell >> 1, cell & 1);
                let p1 = |(se, _): (f64, f64), v| if v == 1 { se } else { 1.0 - se };
                let p0 = |(_, sp): (f64, f64), v| if v == 1 { 1.0 - sp } else { sp };
                let p = pi * p1(truth[a], va) * p1(truth[b], vb)
                    + (1.0 - pi) * p0(truth[a], va) * p0(truth[b], vb);
                *n = (400.0 * p).round() as u64;
            }
            pairs.push(pair(a, b, counts));
        }
    }
    let f = fit(4, &pairs, None, &PairParams::default()).unwrap();
    assert!(close(f.base_rate, pi, 0.05), "{f:?}");
    for (got, want) in f.rates.iter().zip(truth) {
        assert!(
            close(got.0, want.0, 0.08) && close(got.1, want.1, 0.08),
            "{f:?}"
        );
    }
    // Which side each reviewer's votes mean little on.
    assert!(f.rates[2].1 < 0.6 && f.rates[2].0 > 0.85, "{f:?}");
    assert!(f.rates[3].0 < 0.6 && f.rates[3].1 > 0.85, "{f:?}");
}

#[test]
fn a_unit_adds_each_pair_once_in_byte_order() {
    let (a, b, c) = (Id::from("a"), Id::from("b"), Id::from("c"));
    let mut sums = PairSums::default();
    sums.add_unit(&[(&c, 1.0), (&a, 0.0), (&b, 1.0)]);
    sums.add_unit(&[(&b, 0.0), (&a, 0.0)]);
    assert_eq!(
        sums.to_vec(),
        vec![
            (a.clone(), b.clone(), [1, 1, 0, 0]),
            (a.clone(), c.clone(), [0, 1, 0, 0]),
            (b.clone(), c.clone(), [0, 0, 0, 1]),
        ]
    );
    // A graded value, a lone value or a unit too large adds nothing.
    let before = sums.clone();
    sums.add_unit(&[(&a, 1.0), (&b, 0.5)]);
    sums.add_unit(&[(&a, 1.0)]);
    let many: Vec<Id> = (0..=MAX_PAIR_UNIT)
        .map(|i| Id::from(format!("v{i:03}")))
        .collect();
    let unit: Vec<(&Id, f64)> = many.iter().map(|v| (v, 1.0)).collect();
    sums.add_unit(&unit);
    assert_eq!(sums, before);
    sums.add_unit(&unit[..MAX_PAIR_UNIT]);
    assert_eq!(
        sums.to_vec().len(),
        3 + MAX_PAIR_UNIT * (MAX_PAIR_UNIT - 1) / 2
    );
}

mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::engine::reputation::confusion::{
        value_terms, ConfusionParams, ConfusionTable, ConfusionTerms,
    };

    /// Units of 2–6 distinct reviewers of ten, each with a 0/1 value, and
    /// a part (0–3) each unit is sealed in.
    fn units() -> impl Strategy<Value = Vec<(Vec<(u8, bool)>, u8)>> {
        let unit = proptest::sample::subsequence((0u8..10).collect::<Vec<_>>(), 2..=6)
            .prop_flat_map(|voters| {
                let n = voters.len();
                (Just(voters), proptest::collection::vec(any::<bool>(), n))
            })
            .prop_map(|(voters, values)| voters.into_iter().zip(values).collect::<Vec<_>>());
        proptest::collection::vec((unit, 0u8..4), 1..40)
    }

    fn id(v: u8) -> Id {
        Id::from(format!("r{v}"))
    }

    /// The pair sums and the §15 per-reviewer sums of `units`, in the
    /// order given.
    fn sums_of<'a>(
        units: impl Iterator<Item = &'a Vec<(u8, bool)>>,
    ) -> (PairSums, BTreeMap<Id, ConfusionTerms>) {
        let mut pairs = PairSums::default();
        let mut terms: BTreeMap<Id, ConfusionTerms> = BTreeMap::new();
        for unit in units {
            let ids: Vec<(Id, f64)> = unit
                .iter()
                .map(|&(v, x)| (id(v), f64::from(u8::from(x))))
                .collect();
            let unit_ref: Vec<(&Id, f64)> = ids.iter().map(|(v, x)| (v, *x)).collect();
            pairs.add_unit(&unit_ref);
            let mut sorted = ids.clone();
            sorted.sort_by(|x, y| x.0.cmp(&y.0));
            let mut s = 0.0;
            for (_, x) in &sorted {
                s += x;
            }
            for (v, x) in &sorted {
                terms
                    .entry(v.clone())
                    .or_default()
                    .add(&value_terms(s, sorted.len(), *x));
            }
        }
        (pairs, terms)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any split of the units into parts, each part's sums merged in
        /// any order, gives the same pair sums and the same table, bit for
        /// bit, as the units taken at once.
        #[test]
        fn any_split_and_order_gives_the_same_table(units in units(), reverse in any::<bool>()) {
            let (whole, terms) = sums_of(units.iter().map(|(u, _)| u));
            let mut parts: Vec<PairSums> = (0..4u8)
                .map(|p| sums_of(units.iter().filter(|(_, q)| *q == p).map(|(u, _)| u)).0)
                .collect();
            if reverse {
                parts.reverse();
            }
            let mut merged = PairSums::default();
            for part in &parts {
                merged.merge(part);
            }
            prop_assert_eq!(&merged, &whole);
            let params = ConfusionParams::default();
            let one = ConfusionTable::build_with_pairs(&params, terms.clone(), Some(&whole.to_vec()));
            let mut shuffled = merged.to_vec();
            shuffled.reverse();
            let two = ConfusionTable::build_with_pairs(&params, terms, Some(&shuffled));
            prop_assert_eq!(format!("{one:?}"), format!("{two:?}"));
        }
    }
}
