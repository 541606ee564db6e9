use super::*;
use crate::engine::reputation::confusion::ConfusionTerms;
use crate::engine::reputation::pairs::PairRow;
use crate::engine::Models;

fn tp(p: i32) -> Tp {
    ("votes".into(), p)
}

fn terms(n: u64) -> Terms {
    Terms {
        n,
        q: n as u128 * 7,
        h: n as u128 * 3,
        confusion: ConfusionTerms {
            c: n,
            p: n as u128 * 5,
            a: n as u128 * 2,
            b: n as u128,
            c3: n,
            t3: n as u128 * 3,
        },
        pairs: PairRow(vec![("zz".into(), [n, 0, 1, n])]),
    }
}

#[test]
fn records_round_trip_and_deltas_come_before_the_seal() {
    let deltas = vec![
        (("tone".into(), 5, "b".into()), terms(1)),
        (("help".into(), 5, "z".into()), terms(2)),
        (("help".into(), 5, "a".into()), terms(3)),
    ];
    let recs = records_of(&tp(3), deltas, Some(5));
    assert_eq!(recs.len(), 3);
    assert!(matches!(&recs[2], TopicRecord::Sealed { epoch: 5, .. }));
    let TopicRecord::Delta { rubric, rows, .. } = &recs[0] else {
        panic!("{recs:?}")
    };
    assert_eq!(&**rubric, "help");
    assert_eq!(rows[0].0, "a", "reviewers in byte order");
    for r in recs {
        let (k, v) = r.encode();
        assert_eq!(TopicRecord::decode(&k, &v).unwrap(), r);
    }
    assert!(TopicRecord::decode(b"q", b"").is_err());
    assert!(TopicRecord::decode(b"s", &[8, 1]).is_err());
}

#[test]
fn one_input_partition_goes_to_one_topic_partition() {
    for p in 0..8 {
        let a = topic_partition(&tp(p), 3);
        assert!((0..3).contains(&a));
        assert_eq!(a, topic_partition(&tp(p), 3));
    }
    assert_eq!(topic_partition(&tp(5), 1), 0);
}

#[test]
fn the_group_counts_a_delta_once_and_waits_for_every_partition() {
    let params = crate::config::Config::load(None)
        .unwrap()
        .engine()
        .reputation;
    let mut g = Group::new(params, Models::default(), vec![tp(0), tp(1)]);
    let rec = TopicRecord::Delta {
        rubric: "help".into(),
        epoch: 4,
        tp: tp(0),
        rows: vec![("a".into(), terms(2)), ("b".into(), terms(2))],
    };
    g.apply(rec.clone());
    g.apply(rec);
    assert_eq!(g.take_fresh().len(), 2);
    assert!(g.take_fresh().is_empty());
    g.apply(TopicRecord::Sealed {
        tp: tp(0),
        epoch: 4,
    });
    assert_eq!(g.group_sealed(), None);
    assert!(g.newest().is_none());
    g.apply(TopicRecord::Sealed {
        tp: tp(1),
        epoch: 6,
    });
    g.apply(TopicRecord::Sealed {
        tp: tp(1),
        epoch: 5,
    });
    assert_eq!(g.group_sealed(), Some(4));
    g.apply(TopicRecord::Sealed {
        tp: tp(0),
        epoch: 9,
    });
    assert_eq!(g.group_sealed(), Some(6), "a seal never goes back");
    let w = g.newest().unwrap();
    assert_eq!(w.table_until, g.params().start_of(7));
    assert!(w.tables.contains_key("help"));
    let exported: u64 = g.export().iter().map(|(_, t)| t.n).sum();
    assert_eq!(exported, 4);
}

mod view {
    //! The group's view against the replay's tables: sealed-sum records
    //! delivered twice, interleaved across the topic's partitions, a seal
    //! said again by a new owner or late by an old one, partitions taken
    //! on (from the group's export, or by reading the topic again).

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    const PARTS: i32 = 3;
    const EPOCHS: Epoch = 10;
    const TOPIC_PARTITIONS: i32 = 2;

    /// One delta row: input partition, epoch, rubric, voter, n.
    type Row = (i32, Epoch, u8, u8, u64);

    fn rubric(r: u8) -> Id {
        ["help", "tone"][usize::from(r % 2)].into()
    }

    fn key(r: &Row) -> TermsKey {
        (rubric(r.2), r.1, format!("v{}", r.3).into())
    }

    /// The replay's sums: every partition's deltas of the epochs ≤ `through`.
    fn oracle(rows: &[Row], rubric_id: &str, through: Epoch) -> BTreeMap<Id, Terms> {
        let mut out: BTreeMap<Id, Terms> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.1 <= through) {
            let (rb, _, voter) = key(r);
            if &*rb == rubric_id {
                out.entry(voter).or_default().add(&terms(r.4));
            }
        }
        out
    }

    /// What one input partition's owners publish, in its topic partition's
    /// order: a cycle per seal point (its new epochs' deltas, then the
    /// seal), some published twice (a redone cycle), some followed by the
    /// seal said again (a new owner's first cycle) or an older seal (an
    /// old owner's record after the new one's).
    fn published(p: i32, rows: &[Row], cuts: &[Epoch], doubles: &[u8]) -> Vec<TopicRecord> {
        let mut points: Vec<Epoch> = cuts.iter().map(|c| c % EPOCHS).collect();
        points.push(EPOCHS - 1);
        points.sort_unstable();
        points.dedup();
        let mut out = Vec::new();
        let mut prev: Option<Epoch> = None;
        for (i, &s) in points.iter().enumerate() {
            let deltas: Vec<(TermsKey, Terms)> = rows
                .iter()
                .filter(|r| r.0 == p && prev.is_none_or(|q| r.1 > q) && r.1 <= s)
                .map(|r| (key(r), terms(r.4)))
                .collect();
            // Rows of one key add up, as a seal sums a reviewer's units.
            let mut summed: BTreeMap<TermsKey, Terms> = BTreeMap::new();
            for (k, t) in deltas {
                summed.entry(k).or_default().add(&t);
            }
            let cycle = records_of(&tp(p), summed.into_iter().collect(), Some(s));
            out.extend(cycle.iter().cloned());
            match doubles.get(i).copied().unwrap_or(0) % 4 {
                1 => out.extend(cycle),
                2 => out.push(TopicRecord::Sealed {
                    tp: tp(p),
                    epoch: s,
                }),
                3 => out.push(TopicRecord::Sealed {
                    tp: tp(p),
                    epoch: prev.unwrap_or(0),
                }),
                _ => {}
            }
            prev = Some(s);
        }
        out
    }

    /// A partition held by the instance: the oldest epoch a batch of it
    /// may still have, and its tables.
    struct Held {
        needed: Epoch,
        tables: Tables,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn the_group_view_gives_every_batch_the_replays_table(
            rows in prop::collection::vec(
                (0..PARTS, 0..EPOCHS, 0u8..2, 0u8..4, 1u64..5), 0..60),
            cuts in prop::collection::vec(prop::collection::vec(0..EPOCHS, 0..6), PARTS as usize),
            doubles in prop::collection::vec(prop::collection::vec(any::<u8>(), 8), PARTS as usize),
            turns in prop::collection::vec((any::<u8>(), any::<u8>()), 0..300),
        ) {
            let params = crate::config::Config::load(None).unwrap().engine().reputation;
            let expected: Vec<Tp> = (0..PARTS).map(tp).collect();
            // The topic: each input partition's records in order, the
            // partitions sharing a topic partition interleaved by `turns`.
            let mut queues: Vec<Vec<TopicRecord>> = (0..PARTS)
                .map(|p| published(p, &rows, &cuts[p as usize], &doubles[p as usize]))
                .collect();
            let mut topic: Vec<Vec<TopicRecord>> = vec![Vec::new(); TOPIC_PARTITIONS as usize];
            let mut picks = turns.iter().map(|t| t.0).cycle();
            while queues.iter().any(|q| !q.is_empty()) {
                let left: Vec<usize> = (0..queues.len()).filter(|&i| !queues[i].is_empty()).collect();
                let i = left[usize::from(picks.next().unwrap_or(0)) % left.len()];
                let r = queues[i].remove(0);
                topic[topic_partition(&tp(i as i32), TOPIC_PARTITIONS) as usize].push(r);
            }
            let mut group = Group::new(params.clone(), Models::default(), expected.clone());
            let mut read = vec![0usize; topic.len()];
            let mut held: BTreeMap<i32, Held> = BTreeMap::new();
            let mut turns = turns.into_iter();
            loop {
                // Once the turns are used up, the reader reads the rest.
                let (a, b) = turns.next().unwrap_or((2, 0));
                let unread: Vec<usize> = (0..topic.len()).filter(|&i| read[i] < topic[i].len()).collect();
                match a % 8 {
                    // A partition taken on, needing epochs from `b` on.
                    0 => {
                        let p = i32::from(b) % PARTS;
                        let needed = Epoch::from(b / 4) % EPOCHS;
                        if group.can_serve(Some(needed)) {
                            let mut tables = Tables::default();
                            for ((r, e, v), t) in group.export() {
                                tables.add(&r, e, &v, &t);
                            }
                            held.insert(p, Held { needed, tables });
                        } else {
                            // Read the topic again: every partition's
                            // tables start again with it.
                            group = Group::new(params.clone(), Models::default(), expected.clone());
                            read.iter_mut().for_each(|r| *r = 0);
                            held.insert(p, Held { needed, tables: Tables::default() });
                            for h in held.values_mut() {
                                h.tables = Tables::default();
                            }
                        }
                    }
                    // A held partition's batches move on (never past what
                    // the group has sealed + 2: later ones wait).
                    1 => {
                        let n = held.len().max(1);
                        if let Some(h) = held.values_mut().nth(usize::from(b) % n) {
                            let cap = group.group_sealed().map_or(h.needed, |g| (g + 2).max(h.needed));
                            h.needed = (h.needed + Epoch::from(b % 3)).min(cap);
                            h.tables.fold_through(h.needed - 2);
                        }
                    }
                    _ if unread.is_empty() => {
                        if turns.len() == 0 {
                            break;
                        }
                        continue;
                    }
                    // The reader: the next record of a topic partition.
                    _ => {
                        let i = unread[usize::from(b) % unread.len()];
                        group.apply(topic[i][read[i]].clone());
                        read[i] += 1;
                        let fresh = group.take_fresh();
                        for h in held.values_mut() {
                            for ((r, e, v), t) in &fresh {
                                h.tables.add(r, *e, v, t);
                            }
                        }
                        group.fold(held.values().map(|h| h.needed).min());
                    }
                }
                // Every batch the barrier lets through gets the replay's
                // table: epoch k ≥ needed with k − 2 ≤ the group's seal.
                let Some(g) = group.group_sealed() else { continue };
                for (p, h) in &held {
                    for k in h.needed..=g + 2 {
                        for r in 0..2u8 {
                            let want = oracle(&rows, &rubric(r), k - 2);
                            let have: BTreeMap<Id, Terms> = h
                                .tables
                                .sums(&rubric(r), k - 2)
                                .into_iter()
                                .filter(|(_, t)| t.n > 0)
                                .collect();
                            prop_assert_eq!(&have, &want, "partition {} epoch {} rubric {}", p, k, r);
                        }
                    }
                }
            }
            // Everything read: every partition sealed the last epoch.
            prop_assert_eq!(group.group_sealed(), Some(EPOCHS - 1));
        }
    }
}
