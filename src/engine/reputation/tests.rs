use super::*;
use crate::engine::SeriesKey;

fn params(prior_votes: f64) -> ReputationParams {
    ReputationParams {
        mode: Mode::Learned,
        epoch_ns: 3_600_000_000_000,
        prior_votes,
        noise_floor: 0.03,
        min_weight: 0.2,
        max_weight: 3.0,
        confusion: confusion::ConfusionParams::default(),
    }
}

fn key(item: &str, rubric: &str) -> SeriesKey {
    SeriesKey {
        inference_id: item.into(),
        voter_prompt_id: rubric.into(),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6
}

/// Worked check 1's hour 0: (1, 1, 0), (0, 0, 1), (1, 1, 0) by a, b, c.
fn hour_zero() -> BTreeMap<(Id, Id), Terms> {
    let mut values = Vec::new();
    for (item, votes) in [
        ("i1", [1.0, 1.0, 0.0]),
        ("i2", [0.0, 0.0, 1.0]),
        ("i3", [1.0, 1.0, 0.0]),
    ] {
        for (voter, v) in ["c", "a", "b"].iter().zip([votes[2], votes[0], votes[1]]) {
            values.push((
                key(item, "helpfulness"),
                Id::from(*voter),
                OpenValue {
                    timestamp: 0,
                    value: Some(v),
                },
            ));
        }
    }
    seal(values.iter().map(|(s, v, o)| (s, v, o)))
}

#[test]
fn worked_check_one_terms_and_weights() {
    let terms = hour_zero();
    let a = &terms[&("helpfulness".into(), "a".into())];
    let c = &terms[&("helpfulness".into(), "c".into())];
    assert_eq!((a.n, a.q, a.h), (3, fix(0.75), fix(1.5)));
    assert_eq!((c.n, c.q, c.h), (3, fix(3.0), fix(1.5)));
    // §15's sums ride along: a sees o = 1/2 in each unit, c sees o = 1, 0, 1.
    assert_eq!(a.confusion.c, 3);
    assert_eq!(c.confusion.p, 2 << 40);
    let table = Table::build(&params(2.0), terms.into_iter().map(|((_, v), t)| (v, t)));
    assert!(close(table.noise_variance, 1.0 / 3.0));
    assert!(close(table.voters["a"].noise_variance, 0.183333));
    assert!(close(table.weight("a"), 1.703125), "{}", table.weight("a"));
    assert!(close(table.weight("b"), 1.703125));
    assert!(close(table.weight("c"), 0.547739));
    assert_eq!(table.weight("nobody"), 1.0);
}

/// Each pair's counts ride in the delta of its first reviewer in byte
/// order: a holds (a, b) and (a, c), b holds (b, c), c none.
#[test]
fn pair_counts_ride_in_the_first_reviewers_delta() {
    let terms = hour_zero();
    let row = |v: &str| terms[&("helpfulness".into(), v.into())].pairs.clone();
    // (a, b) voted (1, 1), (0, 0), (1, 1); (a, c) and (b, c) (1, 0),
    // (0, 1), (1, 0): counts[2·v_first + v_second].
    assert_eq!(
        row("a"),
        PairRow(vec![("b".into(), [1, 0, 0, 2]), ("c".into(), [0, 1, 2, 0])])
    );
    assert_eq!(row("b"), PairRow(vec![("c".into(), [0, 1, 2, 0])]));
    assert!(row("c").is_empty());
    // Added over epochs and partitions as any other sum, per partner.
    let mut tables = Tables::default();
    let r = Id::from("helpfulness");
    for epoch in [10, 11] {
        for ((_, voter), t) in hour_zero() {
            tables.add(&r, epoch, &voter, &t);
        }
    }
    let mut extra = Terms::noise(1, 0, 0);
    extra.pairs = PairRow(vec![
        ("a0".into(), [1, 1, 1, 1]),
        ("c".into(), [0, 0, 0, 5]),
    ]);
    tables.add(&r, 11, &Id::from("a"), &extra);
    assert_eq!(
        tables.sums(&r, 11)[&Id::from("a")].pairs,
        PairRow(vec![
            ("a0".into(), [1, 1, 1, 1]),
            ("b".into(), [2, 0, 0, 4]),
            ("c".into(), [0, 2, 4, 5]),
        ])
    );
    tables.fold_through(11);
    assert_eq!(tables.sums(&r, 11)[&Id::from("a")].pairs.0.len(), 3);
}

#[test]
fn worked_check_four_prior_zero_clamps() {
    let t = Table::build(
        &params(0.0),
        hour_zero().into_iter().map(|((_, v), t)| (v, t)),
    );
    assert_eq!(t.weight("a"), 3.0);
    assert!(close(t.weight("c"), 0.420849));
}

#[test]
fn abstentions_and_lone_values_make_no_unit() {
    let s = key("x", "tone");
    let (d, e, f) = (Id::from("d"), Id::from("e"), Id::from("f"));
    let v = |value| OpenValue {
        timestamp: 0,
        value,
    };
    let vals = [(&s, &d, v(Some(1.0))), (&s, &e, v(None)), (&s, &f, v(None))];
    assert!(seal(vals.iter().map(|(a, b, c)| (*a, *b, c))).is_empty());
    let vals = [
        (&s, &d, v(Some(1.0))),
        (&s, &e, v(None)),
        (&s, &f, v(Some(0.0))),
    ];
    let out = seal(vals.iter().map(|(a, b, c)| (*a, *b, c)));
    assert_eq!(out.len(), 2);
    let d = &out[&("tone".into(), "d".into())];
    assert_eq!((d.n, d.q, d.h), (1, fix(1.0), fix(1.0)));
    // d's 1 against f's 0: o = 0, so nothing towards p or a, and b 0.
    assert_eq!(
        d.confusion,
        confusion::ConfusionTerms {
            c: 1,
            ..Default::default()
        }
    );
}

#[test]
fn an_agreeing_rubric_gives_everyone_one() {
    let terms = [(Id::from("a"), Terms::noise(4, 0, fix(2.0)))];
    assert_eq!(Table::build(&params(2.0), terms).weight("a"), 1.0);
}

#[test]
fn tables_hold_epochs_up_to_k_minus_two_and_fold() {
    let p = params(2.0);
    let mut tables = Tables::default();
    let (r, a, c) = (Id::from("helpfulness"), Id::from("a"), Id::from("c"));
    for ((_, voter), t) in hour_zero() {
        tables.add(&r, 10, &voter, &t);
    }
    assert_eq!(tables.table(&p, &r, 11).weight("a"), 1.0);
    assert!(close(tables.table(&p, &r, 12).weight("c"), 0.547739));
    // A delta of epoch 11 enters T_13, not T_12 (built already).
    tables.add(&r, 11, &c, &Terms::noise(5, fix(0.0), fix(5.0)));
    assert!(close(tables.table(&p, &r, 12).weight("c"), 0.547739));
    let t13 = tables.table(&p, &r, 13);
    assert!(t13.weight("c") > 0.547739);
    tables.fold_through(11);
    assert_eq!(*tables.table(&p, &r, 13), *t13);
    assert_eq!(tables.sums(&r, 11)[&a].n, 3);
    assert_eq!(tables.rubrics(), vec![r]);
}

#[test]
fn the_step_is_the_protocols_when_trusted() {
    let alpha = 0.548812;
    assert_eq!(damped_step(alpha, 2.0, 3.4), (alpha, 1.0 - alpha));
    let (kappa, beta) = damped_step(alpha, 1.0, 0.547739);
    assert!(close(beta, 0.451188 * 0.547739));
    assert!(close(kappa + beta, 1.0));
}

#[test]
fn fix_rounds_ties_to_even() {
    assert_eq!(fix(0.5), 1 << 39);
    let half_ulp = 0.5 / SCALE;
    assert_eq!(fix(half_ulp), 0);
    assert_eq!(fix(3.0 * half_ulp), 2);
    assert_eq!(unfix(fix(0.25)), 0.25);
}
