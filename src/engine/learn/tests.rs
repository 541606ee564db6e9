//! contract §14 through the engine: properties over generated logs.

use proptest::prelude::*;

use super::super::reputation::{Mode, TermsKey};
use super::super::tests::{cfg, Model};
use super::*;
use crate::input::Vote;

/// Two-minute epochs of 10 s windows, grace 5 s, n₀ = 1,
/// so that a short log spans many epochs and tables; rubric `s` under
/// contract §15's model `confusion` (n₀ᶜ = 1), `r` under §14's `noise`, so
/// that every property holds of both.
fn cfg_in(mode: Mode) -> EngineConfig {
    let mut c = cfg();
    let mut s = c.defaults.clone();
    s.reputation_model = super::super::reputation::Model::Confusion;
    c.rubrics.insert("s".into(), s);
    c.reputation.confusion.prior_votes = 1.0;
    c.window_ns = 10 * NANOS_PER_SEC;
    c.window_seconds = 10.0;
    c.grace_ns = 5 * NANOS_PER_SEC;
    c.max_votes = 3;
    c.reputation.mode = mode;
    c.reputation.epoch_ns = 120 * NANOS_PER_SEC;
    c.reputation.prior_votes = 1.0;
    c
}

/// A vote: (item 0..4, rubric 0..2, reviewer 0..5, value, quarter seconds
/// after the previous vote (none a fifth of the time, so that votes of one
/// time are common), back in time by, reputation, vote id of 4: one
/// reviewer's two votes of one time are then not one identity, and
/// one vote id names votes of several reviewers and times).
type Gen = (u8, u8, u8, Option<u8>, u16, u16, bool, Option<u8>);

fn votes_of(gen: &[Gen]) -> Vec<Vote> {
    let mut t = 1_700_000_000i128 * NANOS_PER_SEC;
    gen.iter()
        .map(|&(item, rubric, voter, value, gap, back, heavy, id)| {
            t += i128::from(gap) * NANOS_PER_SEC / 4;
            Vote {
                inference_id: format!("i{item}").into(),
                voter_id: format!("v{voter}").into(),
                voter_prompt_id: ["r", "s"][usize::from(rubric % 2)].into(),
                value: value.map(|v| f64::from(v % 3) / 2.0),
                timestamp: t - i128::from(back % 8) * NANOS_PER_SEC,
                vote_id: id.map(|id| format!("k{}", id % 4).into()),
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
            prop::option::weighted(0.8, 1u16..120).prop_map(|g| g.unwrap_or(0)),
            0u16..40,
            prop::bool::weighted(0.1),
            prop::option::weighted(0.3, any::<u8>()),
        ),
        1..160,
    )
}

/// [`cfg_in`] `learned`, identities forgotten after 50 s: some are
/// accepted again while their votes' epoch is open (format 11 then keeps
/// the old vote's value in its series' record, `Spare::pin`). (Which
/// votes are duplicates then depends on the partition's watermark, so
/// not for the partition properties.)
fn cfg_forgetting() -> EngineConfig {
    let mut c = cfg_in(Mode::Learned);
    c.retention_ns = 50 * NANOS_PER_SEC;
    c
}

/// Every event and the final terms of one engine over `votes`.
fn whole(mode: Mode, votes: &[Vote]) -> (Vec<ScoreUpdate>, Model) {
    whole_with(cfg_in(mode), votes)
}

fn whole_with(cfg: EngineConfig, votes: &[Vote]) -> (Vec<ScoreUpdate>, Model) {
    let mut e = Engine::new(cfg);
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
    m.terms
        .iter()
        .map(|(k, t)| (k.clone(), t.clone()))
        .collect()
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
        let (want, want_m) = whole_with(cfg_forgetting(), &votes);
        let mut m = Model::default();
        let mut e = Engine::new(cfg_forgetting());
        let mut got = Vec::new();
        for (i, v) in votes.iter().enumerate() {
            m.load(&mut e, v);
            e.process(v, &mut got);
            m.persist(&mut e);
            e.evict(0);
            if i % every == 0 {
                e = m.restore_with(cfg_forgetting());
            }
        }
        e.close_all(&mut got);
        m.persist(&mut e);
        prop_assert_eq!(got, want);
        prop_assert_eq!(terms(&m), terms(&want_m));
        let c = cfg_forgetting();
        prop_assert_eq!(m.open(&c), want_m.open(&c));
    }

    /// Split by item into partitions, in time order (nothing late), the
    /// partitions' deltas add up to one engine's, in any order.
    #[test]
    fn partitions_seal_the_same_terms(g in gen(), parts in 1usize..4) {
        let mut votes = votes_of(&g);
        votes.sort_by_key(|v| v.timestamp);
        let (_, one) = whole(Mode::Shadow, &votes);
        let rp = cfg_in(Mode::Shadow).reputation;
        // A partition's last epochs stay open (the end of input does not
        // seal): compare the epochs every run sealed.
        let mut upto = one.meta.watermark.map_or(Epoch::MIN, |wm| rp.sealed_by(wm));
        let mut sums: BTreeMap<TermsKey, Terms> = BTreeMap::new();
        for p in 0..parts {
            let mine: Vec<Vote> = votes
                .iter()
                .filter(|v| v.inference_id.as_bytes()[1] as usize % parts == p)
                .cloned()
                .collect();
            let (_, m) = whole(Mode::Shadow, &mine);
            upto = upto.min(m.meta.watermark.map_or(Epoch::MIN, |wm| rp.sealed_by(wm)));
            for (k, t) in m.terms.iter().rev() {
                sums.entry(k.clone()).or_default().add(t);
            }
        }
        let mut one_sums: BTreeMap<TermsKey, Terms> = BTreeMap::new();
        for (k, t) in &one.terms {
            one_sums.entry(k.clone()).or_default().add(t);
        }
        let sealed = |m: &BTreeMap<TermsKey, Terms>| -> Vec<(TermsKey, Terms)> {
            m.iter().filter(|(k, _)| k.1 <= upto).map(|(k, t)| (k.clone(), t.clone())).collect()
        };
        prop_assert_eq!(sealed(&sums), sealed(&one_sums));
    }
}

/// `learned` leaves the events of a log whose every table is empty as
/// `off` makes them, but for the learned fields.
#[test]
fn learned_without_tables_scores_as_off() {
    let votes = votes_of(&[
        (0, 0, 0, Some(2), 1, 0, false, None),
        (0, 0, 1, Some(0), 1, 0, true, None),
    ]);
    let (off, _) = whole(Mode::Off, &votes);
    let (learned, _) = whole(Mode::Learned, &votes);
    assert_eq!(off.len(), 1);
    let l = learned[0].learned.clone().unwrap();
    assert_eq!(l.weights.as_slice(), [1.0, 1.0]);
    assert_eq!(l.step, 1.0 - off[0].alpha);
    assert_eq!(
        ScoreUpdate {
            learned: None,
            ..learned[0].clone()
        },
        off[0]
    );
}

/// A seal keeps the vectors of the values it empties for later series,
/// never more than the series it sealed.
#[test]
fn sealed_vectors_are_reused_and_bounded() {
    let mut e = Engine::new(cfg_in(Mode::Shadow));
    let mut out = Vec::new();
    let at = |t: i128, item: u8, voter: u8| Vote {
        inference_id: format!("i{item}").into(),
        voter_id: format!("v{voter}").into(),
        voter_prompt_id: "r".into(),
        value: Some(1.0),
        timestamp: (1_700_000_040 + t) * NANOS_PER_SEC,
        vote_id: None,
        model_id: None,
        weight: 1.0,
        inference_time: None,
    };
    // Epoch 0 (two-minute epochs; one starts at 1 700 000 040 s): four series.
    for item in 0..4 {
        for voter in 0..2 {
            e.process(&at(1, item, voter), &mut out);
        }
    }
    assert!(e.spare_values.0.is_empty());
    // A vote of epoch 2 (its series keeps a value) seals epoch 0: the
    // three other series' vectors are kept.
    e.process(&at(300, 0, 0), &mut out);
    assert_eq!(e.open_values(), 1);
    assert_eq!(e.spare_values.0.len(), 3);
    // A vote of epoch 5 takes one for its series; sealing epoch 2 (one
    // series) keeps at most one.
    e.process(&at(700, 1, 0), &mut out);
    assert_eq!(e.open_values(), 1);
    assert_eq!(e.spare_values.0.len(), 1);
    assert!(
        e.series[&SeriesKey {
            inference_id: "i1".into(),
            voter_prompt_id: "r".into(),
        }]
            .values
            .capacity()
            >= UNIT_CAPACITY
    );
}

/// Each partition's votes, split by item (a series lives in one partition).
fn split(votes: &[Vote], parts: usize) -> Vec<Vec<Vote>> {
    let mut out = vec![Vec::new(); parts];
    for v in votes {
        out[v.inference_id.as_bytes()[1] as usize % parts].push(v.clone());
    }
    out
}

/// What `replay --partition-files` gives (contract §14 "Determinism"): each
/// partition replayed alone, with tables over every partition's sealed
/// deltas and nothing waiting.
fn oracle(parts: &[Vec<Vote>]) -> Vec<Vec<ScoreUpdate>> {
    let deltas: Vec<(TermsKey, Terms)> = parts
        .iter()
        .flat_map(|p| terms(&whole(Mode::Shadow, p).1))
        .collect();
    parts
        .iter()
        .map(|votes| {
            let mut e = Engine::new(cfg_in(Mode::Learned));
            e.share_tables();
            for ((rubric, epoch, voter), t) in &deltas {
                e.add_delta(rubric, *epoch, voter, t);
            }
            let mut out = Vec::new();
            e.set_group_sealed(Some(Epoch::MAX), &mut out);
            for v in votes {
                e.process(v, &mut out);
            }
            e.close_all(&mut out);
            out
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// `run`: partitions whose votes arrive in any interleaving, each
    /// one's sealed deltas reaching every partition's tables as it seals
    /// them, a batch waiting until every partition has sealed its epoch
    /// − 2, restarts from the stored state now and then: each partition
    /// emits what the oracle gives it, and what waits is stored.
    #[test]
    fn shared_tables_give_each_partition_its_replay(
        g in gen(),
        parts in 2usize..4,
        turns in prop::collection::vec(any::<u8>(), 400),
        restart in 0usize..9,
    ) {
        let votes = votes_of(&g);
        let logs = split(&votes, parts);
        let want = oracle(&logs);
        let start = |m: &Model, published: &[(TermsKey, Terms)]| {
            let mut e = m.restore_with(cfg_in(Mode::Learned));
            e.share_tables();
            for ((rubric, epoch, voter), t) in published {
                e.add_delta(rubric, *epoch, voter, t);
            }
            e
        };
        let mut models: Vec<Model> = (0..parts).map(|_| Model::default()).collect();
        let mut engines: Vec<Engine> = models.iter().map(|m| start(m, &[])).collect();
        let mut got: Vec<Vec<ScoreUpdate>> = vec![Vec::new(); parts];
        let mut next = vec![0usize; parts];
        let mut published: Vec<(TermsKey, Terms)> = Vec::new();
        for (turn, pick) in turns.iter().enumerate() {
            let left: Vec<usize> = (0..parts).filter(|&p| next[p] < logs[p].len()).collect();
            let Some(&p) = left.get(usize::from(*pick) % left.len().max(1)) else {
                break;
            };
            let v = &logs[p][next[p]];
            next[p] += 1;
            models[p].load(&mut engines[p], v);
            engines[p].process(v, &mut got[p]);
            let before: Vec<TermsKey> = models[p].terms.keys().cloned().collect();
            models[p].persist(&mut engines[p]);
            for (k, t) in &models[p].terms {
                if !before.contains(k) {
                    published.push((k.clone(), t.clone()));
                    for e in engines.iter_mut() {
                        e.add_delta(&k.0, k.1, &k.2, t);
                    }
                }
            }
            let group = engines
                .iter()
                .map(|e| e.sealed_through())
                .min()
                .flatten();
            for (q, e) in engines.iter_mut().enumerate() {
                e.set_group_sealed(group, &mut got[q]);
                models[q].persist(e);
            }
            if restart > 0 && turn % restart == 0 {
                engines[p] = start(&models[p], &published);
                engines[p].set_group_sealed(group, &mut got[p]);
            }
        }
        for (p, e) in engines.iter_mut().enumerate() {
            for v in &logs[p][next[p]..] {
                models[p].load(e, v);
                e.process(v, &mut got[p]);
            }
            e.set_group_sealed(Some(Epoch::MAX), &mut got[p]);
            e.close_all(&mut got[p]);
            models[p].persist(e);
            prop_assert!(models[p].pending.is_empty());
        }
        for p in 0..parts {
            prop_assert_eq!(&got[p], &want[p], "partition {}", p);
        }
    }
}

/// A batch waits while another partition has not sealed its epoch − 2,
/// is stored while it waits, survives a restart, and is scored with the
/// final table once the group has sealed.
#[test]
fn a_batch_waits_for_the_group_and_survives_a_restart() {
    let at = |s: i128, item: &str, voter: &str, v: f64| Vote {
        timestamp: 1_700_000_400 * NANOS_PER_SEC + s * NANOS_PER_SEC,
        value: Some(v),
        ..super::super::tests::vote(item, voter, None, "2024-01-01T00:00:00Z")
    };
    // Epoch 0 (two minutes from 1_700_000_400): a unit; epoch 2: a batch,
    // closed by a later vote.
    let votes = vec![
        at(1, "i0", "a", 1.0),
        at(2, "i0", "b", 1.0),
        at(3, "i0", "c", 0.0),
        at(250, "i1", "c", 0.0),
        at(300, "i2", "a", 1.0),
    ];
    let want = oracle(&[votes.clone(), Vec::new()]);
    let mut m = Model::default();
    let mut e = Engine::new(cfg_in(Mode::Learned));
    e.share_tables();
    let mut got = Vec::new();
    for v in &votes {
        e.process(v, &mut got);
        m.persist(&mut e);
        for (k, t) in &m.terms {
            e.add_delta(&k.0, k.1, &k.2, t);
        }
        // The other partition has sealed nothing.
        e.set_group_sealed(None, &mut got);
    }
    assert_eq!(e.pending_batches(), 2, "i0's batch and i1's wait");
    assert!(got.is_empty());
    // The oldest waiting batch (epoch 0) keeps its epoch's tables apart.
    let p = cfg_in(Mode::Learned).reputation;
    let epoch0 = p.epoch_of(votes[0].timestamp);
    assert_eq!(e.oldest_epoch_needed(), Some(epoch0));
    m.persist(&mut e);
    assert_eq!(m.pending.len(), 2);
    let mut e = m.restore_with(cfg_in(Mode::Learned));
    e.share_tables();
    for (k, t) in &m.terms {
        e.add_delta(&k.0, k.1, &k.2, t);
    }
    assert_eq!(e.pending_batches(), 2);
    assert_eq!(
        e.oldest_epoch_needed(),
        Some(epoch0),
        "restored batches count"
    );
    // The other partition seals epoch 0: i1's batch (epoch 2) may go.
    e.set_group_sealed(Some(epoch0), &mut got);
    assert_eq!(e.pending_batches(), 0);
    assert!(e.oldest_epoch_needed() > Some(epoch0), "no batch waits");
    e.set_group_sealed(Some(Epoch::MAX), &mut got);
    e.close_all(&mut got);
    m.persist(&mut e);
    assert!(m.pending.is_empty());
    assert_eq!(got, want[0]);
    let c = &got[1];
    assert_eq!(c.series.inference_id, "i1");
    assert!(
        c.learned.as_ref().unwrap().weights[0] < 1.0,
        "{:?}",
        c.learned
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// `run`'s publication path: a partition's sealed deltas reach the
    /// tables only as the shell takes them (`take_published`, at a
    /// cycle's end) and every instance reads them back, and now and then
    /// an instance reads the whole topic again (`share_tables`, then
    /// every published delta), also between a seal and the cycle's end.
    /// Each partition still emits what the oracle gives it: a delta sealed
    /// but not yet taken survives the new start of the tables.
    #[test]
    fn deltas_sealed_before_a_new_start_of_the_tables_are_still_published(
        g in gen(),
        parts in 2usize..4,
        turns in prop::collection::vec((any::<u8>(), 0u8..8), 400),
    ) {
        let votes = votes_of(&g);
        let logs = split(&votes, parts);
        let want = oracle(&logs);
        let mut engines: Vec<Engine> = (0..parts)
            .map(|_| {
                let mut e = Engine::new(cfg_in(Mode::Learned));
                e.share_tables();
                e
            })
            .collect();
        let mut got: Vec<Vec<ScoreUpdate>> = vec![Vec::new(); parts];
        let mut next = vec![0usize; parts];
        // The topic: every published delta, and each partition's seal.
        let mut topic: Vec<(TermsKey, Terms)> = Vec::new();
        let mut seals: Vec<Option<Epoch>> = vec![None; parts];
        let publish = |engines: &mut Vec<Engine>,
                       topic: &mut Vec<(TermsKey, Terms)>,
                       seals: &mut Vec<Option<Epoch>>,
                       got: &mut Vec<Vec<ScoreUpdate>>| {
            for p in 0..engines.len() {
                let (deltas, sealed) = engines[p].take_published();
                for (k, t) in &deltas {
                    for e in engines.iter_mut() {
                        e.add_delta(&k.0, k.1, &k.2, t);
                    }
                }
                topic.extend(deltas);
                if sealed.is_some() {
                    seals[p] = sealed;
                }
            }
            let group = seals.iter().copied().min().flatten();
            for (q, e) in engines.iter_mut().enumerate() {
                e.set_group_sealed(group, &mut got[q]);
            }
        };
        for (pick, action) in &turns {
            let left: Vec<usize> = (0..parts).filter(|&p| next[p] < logs[p].len()).collect();
            let Some(&p) = left.get(usize::from(*pick) % left.len().max(1)) else {
                break;
            };
            let v = &logs[p][next[p]];
            next[p] += 1;
            engines[p].process(v, &mut got[p]);
            match action {
                // The cycle ends: what it sealed is published.
                0..=2 => publish(&mut engines, &mut topic, &mut seals, &mut got),
                // The instance reads the topic again, mid-cycle.
                3 => {
                    let group = seals.iter().copied().min().flatten();
                    for (q, e) in engines.iter_mut().enumerate() {
                        e.share_tables();
                        for ((rubric, epoch, voter), t) in &topic {
                            e.add_delta(rubric, *epoch, voter, t);
                        }
                        e.set_group_sealed(group, &mut got[q]);
                    }
                }
                _ => {}
            }
        }
        for p in 0..parts {
            for v in &logs[p][next[p]..] {
                engines[p].process(v, &mut got[p]);
            }
        }
        publish(&mut engines, &mut topic, &mut seals, &mut got);
        for (p, e) in engines.iter_mut().enumerate() {
            e.set_group_sealed(Some(Epoch::MAX), &mut got[p]);
            e.close_all(&mut got[p]);
        }
        for p in 0..parts {
            prop_assert_eq!(&got[p], &want[p], "partition {}", p);
        }
    }
}

/// The generated logs reach contract §15's side weights (rubric `s`), not
/// only its fallbacks: a long log of them has batches weighed by side.
#[test]
fn generated_logs_weigh_by_side() {
    let mut x: u64 = 7;
    let mut next = move |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % m) as u16
    };
    let g: Vec<Gen> = (0..600)
        .map(|_| {
            (
                next(4) as u8,
                next(2) as u8,
                next(5) as u8,
                Some(next(256) as u8),
                next(120),
                0,
                false,
                None,
            )
        })
        .collect();
    let (out, _) = whole(Mode::Learned, &votes_of(&g));
    let by_side = out
        .iter()
        .filter_map(|u| u.learned.as_ref()?.confusion.as_ref())
        .filter(|c| c.by_side)
        .count();
    assert!(by_side > 10, "{by_side} batches weighed by side");
}
