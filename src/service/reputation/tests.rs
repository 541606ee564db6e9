use super::*;

fn tp(p: i32) -> Tp {
    ("votes".into(), p)
}

fn terms(n: u64) -> Terms {
    Terms {
        n,
        q: n as u128 * 7,
        h: n as u128 * 3,
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
    let mut g = Group::new(params, vec![tp(0), tp(1)]);
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
