//! SPEC §14 through the engine: properties over generated logs.

use proptest::prelude::*;

use super::super::reputation::{Mode, TermsKey};
use super::super::tests::{cfg, Model};
use super::*;
use crate::input::Vote;

/// Two-minute epochs of 10 s windows, grace 5 s, n₀ = 1,
/// so that a short log spans many epochs and tables.
fn cfg_in(mode: Mode) -> EngineConfig {
    let mut c = cfg();
    c.window_ns = 10 * NANOS_PER_SEC;
    c.window_seconds = 10.0;
    c.grace_ns = 5 * NANOS_PER_SEC;
    c.max_votes = 3;
    c.reputation.mode = mode;
    c.reputation.epoch_ns = 120 * NANOS_PER_SEC;
    c.reputation.prior_votes = 1.0;
    c
}

/// A vote: (item 0..4, rubric 0..2, reviewer 0..5, value, seconds after
/// the previous vote, back in time by, reputation).
type Gen = (u8, u8, u8, Option<u8>, u16, u16, bool);

fn votes_of(gen: &[Gen]) -> Vec<Vote> {
    let mut t = 1_700_000_000i128 * NANOS_PER_SEC;
    gen.iter()
        .map(|&(item, rubric, voter, value, gap, back, heavy)| {
            t += i128::from(gap) * NANOS_PER_SEC / 4;
            Vote {
                inference_id: format!("i{item}").into(),
                voter_id: format!("v{voter}").into(),
                voter_prompt_id: ["r", "s"][usize::from(rubric % 2)].into(),
                value: value.map(|v| f64::from(v % 3) / 2.0),
                timestamp: t - i128::from(back % 8) * NANOS_PER_SEC,
                vote_id: None,
                model_id: None,
                weight: if heavy { 2.0 } else { 1.0 },
                inference_time: None,
            }
        })
        .collect()
}

fn gen() -> impl Strategy<Value = Vec<Gen>> {
    prop::collection::vec(
        (
            0u8..4,
            0u8..2,
            0u8..5,
            prop::option::weighted(0.9, any::<u8>()),
            0u16..120,
            0u16..40,
            prop::bool::weighted(0.1),
        ),
        1..160,
    )
}

/// Every event and the final terms of one engine over `votes`.
fn whole(mode: Mode, votes: &[Vote]) -> (Vec<ScoreUpdate>, Model) {
    let mut e = Engine::new(cfg_in(mode));
    let mut out = Vec::new();
    for v in votes {
        e.process(v, &mut out);
    }
    e.close_all(&mut out);
    let mut m = Model::default();
    m.persist(&mut e);
    (out, m)
}

fn terms(m: &Model) -> Vec<(TermsKey, Terms)> {
    m.terms.iter().map(|(k, t)| (k.clone(), *t)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// `shadow` scores and emits exactly what `off` does.
    #[test]
    fn shadow_is_off(g in gen()) {
        let votes = votes_of(&g);
        let (off, _) = whole(Mode::Off, &votes);
        let (shadow, _) = whole(Mode::Shadow, &votes);
        prop_assert_eq!(off, shadow);
    }

    /// Restarts from the persisted state (every open value, delta and
    /// batch) and an empty cache change no event and no delta.
    #[test]
    fn restarts_and_evictions_change_nothing(g in gen(), every in 1usize..7) {
        let votes = votes_of(&g);
        let (want, want_m) = whole(Mode::Learned, &votes);
        let mut m = Model::default();
        let mut e = Engine::new(cfg_in(Mode::Learned));
        let mut got = Vec::new();
        for (i, v) in votes.iter().enumerate() {
            m.load(&mut e, v);
            e.process(v, &mut got);
            m.persist(&mut e);
            e.evict(0);
            if i % every == 0 {
                e = m.restore_with(cfg_in(Mode::Learned));
            }
        }
        e.close_all(&mut got);
        m.persist(&mut e);
        prop_assert_eq!(got, want);
        prop_assert_eq!(terms(&m), terms(&want_m));
        prop_assert_eq!(&m.open, &want_m.open);
    }

    /// Split by item into partitions, in time order (nothing late), the
    /// partitions' deltas add up to one engine's, in any order.
    #[test]
    fn partitions_seal_the_same_terms(g in gen(), parts in 1usize..4) {
        let mut votes = votes_of(&g);
        votes.sort_by_key(|v| v.timestamp);
        let (_, one) = whole(Mode::Shadow, &votes);
        let mut sums: BTreeMap<TermsKey, Terms> = BTreeMap::new();
        for p in 0..parts {
            let mine: Vec<Vote> = votes
                .iter()
                .filter(|v| v.inference_id.as_bytes()[1] as usize % parts == p)
                .cloned()
                .collect();
            let (_, m) = whole(Mode::Shadow, &mine);
            for (k, t) in m.terms.iter().rev() {
                sums.entry(k.clone()).or_default().add(t);
            }
        }
        let mut one_sums: BTreeMap<TermsKey, Terms> = BTreeMap::new();
        for (k, t) in &one.terms {
            one_sums.entry(k.clone()).or_default().add(t);
        }
        // A partition's last epochs stay open (the end of input does not
        // seal): compare the epochs every run sealed.
        let sealed = |m: &BTreeMap<TermsKey, Terms>, upto: Epoch| -> Vec<(TermsKey, Terms)> {
            m.iter().filter(|(k, _)| k.1 <= upto).map(|(k, t)| (k.clone(), *t)).collect()
        };
        let upto = one.open.keys().map(|k| k.0).min().unwrap_or(Epoch::MAX) - 3;
        prop_assert_eq!(sealed(&sums, upto), sealed(&one_sums, upto));
    }
}

/// `learned` leaves the events of a log whose every table is empty as
/// `off` makes them, but for the learned fields.
#[test]
fn learned_without_tables_scores_as_off() {
    let votes = votes_of(&[
        (0, 0, 0, Some(2), 1, 0, false),
        (0, 0, 1, Some(0), 1, 0, true),
    ]);
    let (off, _) = whole(Mode::Off, &votes);
    let (learned, _) = whole(Mode::Learned, &votes);
    assert_eq!(off.len(), 1);
    let l = learned[0].learned.clone().unwrap();
    assert_eq!(l.weights, vec![1.0, 1.0]);
    assert_eq!(l.step, 1.0 - off[0].alpha);
    assert_eq!(
        ScoreUpdate {
            learned: None,
            ..learned[0].clone()
        },
        off[0]
    );
}
