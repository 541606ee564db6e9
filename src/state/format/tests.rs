//! The bytes of every stored layout, pinned per format: one representative
//! value of each layout (values, keys, and the service's records) is
//! encoded, decoded back, and its bytes compared with
//! `tests/fixtures/layouts/format-{FORMAT}.txt` (a line per layout: its
//! name and its bytes in hex).
//!
//! A layout whose bytes change while [`FORMAT`] stays fails here: a
//! changed layout needs a new format number (docs/decisions.md, "State
//! format"), and a new format needs its fixture. The fixture is written by
//! this test, never by hand: when the current format's file is missing the
//! test writes it and fails, saying so (a new fixture is looked at and
//! committed, it does not pass unseen); with `JURYSTREAM_WRITE_LAYOUTS=1`
//! it writes it and passes.

use std::path::PathBuf;

use super::*;
use crate::engine::reputation::confusion::ConfusionTerms;
use crate::engine::reputation::pairs::PairRow;
use crate::engine::reputation::{OpenKey, Terms, TermsKey};
use crate::state::keys;

/// The environment variable that rewrites the current format's fixture.
const WRITE_LAYOUTS: &str = "JURYSTREAM_WRITE_LAYOUTS";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The fixture of the current format.
fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/layouts")
        .join(format!("format-{FORMAT}.txt"))
}

/// Every layout this build writes, by name, in a fixed order: one
/// representative value each, encoded, each checked to decode back to
/// that value.
fn layouts() -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let at: Nanos = 1_700_000_000_123_456_789;
    let epoch: Epoch = 19_675;
    let series = SeriesKey {
        inference_id: "inf-1".into(),
        voter_prompt_id: "rubric-a".into(),
    };

    // ------------------------------------------------------------ values

    let s = SeriesState {
        model_id: Some("model-1".into()),
        score: 0.625,
        last_vote_at: Some(at),
        update_seq: 3,
        abstentions: 1,
        votes: 5,
        ambiguous: true,
        pending: 2,
        last_mean_vote: Some(0.5),
        companion_scores: vec![0.25, 0.75].into(),
        evidence: Evidence { v: 1.5, q: 0.5 },
        companion_evidence: vec![Evidence { v: 1.0, q: 0.25 }, Evidence { v: 2.0, q: 1.0 }].into(),
    };
    let v = encode_series(&s, std::iter::empty());
    assert_eq!(decode_series(&v).unwrap(), s);
    assert_eq!(decode_series_open(&v).unwrap(), Some(Vec::new()));
    out.push(("series", v));

    let open: SeriesOpen = vec![
        (
            epoch,
            "rev-1".into(),
            OpenValue {
                timestamp: at,
                value: Some(0.25),
            },
        ),
        (
            epoch + 1,
            "rev-2".into(),
            OpenValue {
                timestamp: at + 1,
                value: None,
            },
        ),
    ];
    let v = encode_series(&s, open.iter().map(|(e, voter, o)| (*e, voter, *o)));
    assert_eq!(decode_series(&v).unwrap(), s);
    assert_eq!(decode_series_open(&v).unwrap(), Some(open.clone()));
    out.push(("series_open_values", v));

    let entry = |voter: &str, value: Option<f64>, live: bool| Entry {
        voter_id: voter.into(),
        vote_id: format!("vote-{voter}").into(),
        value,
        weight: 1.5,
        timestamp: at,
        inference_time: Some(at - 1_000),
        live,
    };
    let batch = Batch::stored(
        vec![
            entry("rev-1", Some(0.75), true),
            entry("rev-2", None, true),
            entry("rev-3", Some(0.0), false),
        ],
        1,
    );
    let v = encode_batch(&batch);
    assert_eq!(decode_batch(&v).unwrap(), batch);
    out.push(("batch", v));

    let batch_key_value = BatchKey {
        window_start: at - 123_456_789,
        series: series.clone(),
        seq: 7,
    };
    let pending = Pending {
        key: batch_key_value.clone(),
        batch: batch.clone(),
        model_id: Some("model-1".into()),
    };
    let v = encode_pending(&pending);
    assert_eq!(decode_pending(&v).unwrap(), pending);
    out.push(("pending_batch", v));

    let meta = Meta {
        watermark: Some(at),
        next_batch_seq: 9,
        swept_before: None,
    };
    let v = encode_meta(&meta);
    assert_eq!(decode_meta(&v).unwrap(), meta);
    out.push(("meta", v));

    let v = encode_identity(at, None);
    assert_eq!(decode_identity(&v).unwrap(), at);
    assert_eq!(decode_identity_vote(&v).unwrap(), None);
    out.push(("identity", v));
    for (name, open) in [
        ("identity_voter", None),
        ("identity_vote", Some(Some(0.75))),
        ("identity_abstention", Some(None)),
    ] {
        let voted = Voted {
            series: &series,
            voter: "rev-1",
            open,
        };
        let v = encode_identity(at, Some(voted));
        assert_eq!(decode_identity(&v).unwrap(), at);
        assert_eq!(
            decode_identity_vote(&v).unwrap(),
            Some((series.clone(), "rev-1".into(), open))
        );
        out.push((name, v));
    }

    let row = BoardRow {
        series: 3,
        score_sum: -1 << 70,
        ambiguous: 1,
        votes: 7,
        score_squares: 1 << 90,
    };
    let v = encode_board_row(&row);
    assert_eq!(decode_board_row(&v).unwrap(), row);
    out.push(("board_row", v));

    let sums = RubricSums {
        units: 4,
        pairable: 9,
        sum: 1 << 66,
        square_sum: -(1 << 65),
        within: 12_345,
    };
    let v = encode_rubric_sums(&sums);
    assert_eq!(decode_rubric_sums(&v).unwrap(), sums);
    out.push(("rubric_sums", v));

    let reviewer = ReviewerStats {
        rated: 4,
        sq_dev: 1 << 66,
    };
    let v = encode_reviewer(&reviewer);
    assert_eq!(decode_reviewer(&v).unwrap(), reviewer);
    out.push(("reviewer", v));

    let t_key = keys::time_index_key(at, &keys::identity_key(42)[1..]);
    let v = encode_sweep(&t_key);
    assert_eq!(decode_sweep(&v).unwrap(), t_key);
    out.push(("sweep_position", v));

    let open_value = OpenValue {
        timestamp: at,
        value: Some(-0.5),
    };
    let v = encode_open_value(&open_value);
    assert_eq!(decode_open_value(&v).unwrap(), open_value);
    out.push(("open_value", v));

    let terms = Terms {
        pairs: PairRow(vec![
            ("rev-2".into(), [4, 0, 1, 2]),
            ("rev-3".into(), [0, 0, 0, 1 << 40]),
        ]),
        ..terms_without_pairs()
    };
    let v = encode_terms(&terms);
    assert_eq!(decode_terms(&v).unwrap(), terms);
    out.push(("terms", v));

    // ----------------------------------------------- keys (after the kind)

    let k = batch_key(&batch_key_value);
    assert_eq!(parse_batch_key(&k).unwrap(), batch_key_value);
    out.push(("batch_key", k));

    for (name, model_id) in [
        ("board_key", Some(Id::from("model-1"))),
        ("board_key_without_model", None),
    ] {
        let board = BoardKey {
            model_id,
            voter_prompt_id: "rubric-a".into(),
        };
        let k = board_key(&board);
        assert_eq!(parse_board_key(&k).unwrap(), board);
        out.push((name, k));
    }

    let open_key: OpenKey = (epoch, series.clone(), "rev-1".into());
    let k = open_value_key(&open_key);
    assert_eq!(parse_open_value_key(&k).unwrap(), open_key);
    out.push(("open_value_key", k));

    let k = open_unit_key(epoch, &series);
    assert_eq!(parse_open_unit_key(&k).unwrap(), (epoch, series.clone()));
    out.push(("open_unit_key", k));

    let terms_key_value: TermsKey = ("rubric-a".into(), epoch, "rev-1".into());
    let k = terms_key(&terms_key_value);
    assert_eq!(parse_terms_key(&k).unwrap(), terms_key_value);
    out.push(("terms_key", k));

    // ------------------------------------------ whole keys (`state/keys.rs`)

    out.push(("meta_key", keys::META_KEY.to_vec()));
    out.push(("sweep_key", keys::SWEEP_KEY.to_vec()));
    let k = keys::series_key_bytes(&series);
    assert_eq!(keys::parse_series_key(&k), Some(series.clone()));
    out.push(("series_key_whole", k.clone()));
    let j = keys::open_index_key(epoch, &k);
    assert_eq!(
        keys::parse_open_index_key(&j),
        Some((epoch, series.clone()))
    );
    out.push(("open_index_key_whole", j));
    out.push(("batch_key_whole", keys::batch_key(&batch_key_value)));
    out.push((
        "board_key_whole",
        keys::board_key(&BoardKey {
            model_id: Some("model-1".into()),
            voter_prompt_id: "rubric-a".into(),
        }),
    ));
    out.push(("identity_key_whole", keys::identity_key(42)));
    out.push(("time_index_key_whole", t_key));
    out.push(("voter_key_whole", keys::voter_key(&series, "rev-1")));
    out.push((
        "reviewer_key_whole",
        keys::reviewer_key("rubric-a", "rev-1"),
    ));
    out.push(("pending_key_whole", keys::pending_key(7)));
    out.push(("position_key_whole", keys::position_key("changelog")));

    // ------------------------------------------------- the service's records

    out.push(("changelog_header", HEADER_VALUE.to_vec()));

    let marker = StoredMarker {
        seq: 12,
        next_offset: 345,
        outbox_chunks: 2,
        delivered: false,
        floors: vec![(0, 0, 41), (3, 2, 7)],
    };
    let v = encode_marker(&marker);
    assert_eq!(decode_marker(&v).unwrap(), marker);
    out.push(("cycle_marker", v));
    let initial = StoredMarker {
        next_offset: -1,
        delivered: true,
        ..StoredMarker::default()
    };
    let v = encode_marker(&initial);
    assert_eq!(decode_marker(&v).unwrap(), initial);
    out.push(("cycle_marker_initial", v));

    let chunk = StoredChunk {
        seq: 12,
        events: vec![
            StoredEvent {
                route: 0,
                partition: 1,
                key: Some(b"inf-1".to_vec()),
                payload: br#"{"type":"score_updated"}"#.to_vec(),
            },
            StoredEvent {
                route: 2,
                partition: 0,
                key: None,
                payload: b"{}".to_vec(),
            },
        ],
    };
    let v = encode_outbox_chunk(chunk.seq, chunk.events.iter().map(StoredEvent::borrowed));
    assert_eq!(decode_outbox_chunk(&v).unwrap(), chunk);
    out.push(("outbox_chunk", v));

    let k = topic_delta_key("rubric-a", epoch, "votes", 3);
    assert_eq!(
        parse_topic_key(&k).unwrap(),
        Some(TopicKey::Delta {
            rubric: "rubric-a".into(),
            epoch,
            topic: "votes".into(),
            partition: 3,
        })
    );
    out.push(("topic_delta_key", k));
    let rows: Vec<(Id, Terms)> = vec![
        ("rev-1".into(), terms.clone()),
        ("rev-2".into(), Terms::default()),
    ];
    let v = encode_topic_delta(&rows);
    assert_eq!(decode_topic_delta(&v).unwrap(), rows);
    out.push(("topic_delta", v));
    let k = topic_seal_key("votes", 3);
    assert_eq!(
        parse_topic_key(&k).unwrap(),
        Some(TopicKey::Seal {
            topic: "votes".into(),
            partition: 3,
        })
    );
    out.push(("topic_seal_key", k));
    let v = encode_topic_seal(epoch);
    assert_eq!(decode_topic_seal(&v).unwrap(), epoch);
    out.push(("topic_seal", v));

    out
}

#[test]
fn every_stored_layout_round_trips_and_keeps_its_bytes_within_its_format() {
    let layouts = layouts();
    let mut names: Vec<&str> = layouts.iter().map(|(name, _)| *name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), layouts.len(), "layout names are unique");
    let text: String = std::iter::once(format!(
        "# State format {FORMAT}: every stored layout's bytes (name, hex), \
         written by src/state/format/tests.rs ({WRITE_LAYOUTS}=1); never edited by hand\n"
    ))
    .chain(
        layouts
            .iter()
            .map(|(name, bytes)| format!("{name} {}\n", hex(bytes))),
    )
    .collect();

    let path = fixture();
    let write = std::env::var(WRITE_LAYOUTS).is_ok_and(|v| v == "1");
    if write || !path.exists() {
        std::fs::create_dir_all(path.parent().expect("a parent")).unwrap();
        std::fs::write(&path, &text).unwrap();
        assert!(
            write,
            "wrote {} (there was none for format {FORMAT}): check its layouts and commit it",
            path.display()
        );
        return;
    }

    let pinned = std::fs::read_to_string(&path).unwrap();
    let pinned: Vec<(&str, &str)> = pinned
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(' ').unwrap_or((l, "")))
        .collect();
    let mut problems = Vec::new();
    for (name, bytes) in &layouts {
        let now = hex(bytes);
        match pinned.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("{name}: not in the fixture")),
            Some((_, was)) if *was != now => problems.push(format!("{name}: was {was}, now {now}")),
            Some(_) => {}
        }
    }
    for (name, _) in &pinned {
        if !layouts.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name}: in the fixture, no longer built"));
        }
    }
    assert!(
        problems.is_empty(),
        "stored layouts differ from {} while FORMAT is {FORMAT}:\n  {}\n\
         A changed layout needs a new FORMAT (and the reading of the old one; \
         docs/decisions.md, \"State format\"), whose fixture this test writes. \
         A layout only added to this test: rewrite the fixture with {WRITE_LAYOUTS}=1.",
        path.display(),
        problems.join("\n  ")
    );
}

/// The `terms` layout's value, but for its pair row (format 12's value).
fn terms_without_pairs() -> Terms {
    Terms {
        confusion: ConfusionTerms {
            c: 3,
            p: 1 << 41,
            a: 1 << 40,
            b: 77,
            c3: 2,
            t3: 1 << 39,
        },
        ..Terms::noise(3, 1 << 80, 12_345)
    }
}

/// Bytes from hex (a layouts fixture's).
fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// Format 11's sealed deltas (the bytes of its layouts fixture) are read
/// with contract §15's sums zero: their epochs count for §14 only.
#[test]
fn format_11_deltas_have_no_confusion_sums() {
    reads_old_deltas(
        "0b03808080808080808080808008b960",
        "0b02057265762d3103808080808080808080808008b960057265762d32000000",
        Terms::noise(3, 1 << 80, 12_345),
    );
}

/// An older format's `terms` and `topic_delta` bytes (its layouts
/// fixture's: rev-1's terms, then rev-2's zero) read as `terms`.
fn reads_old_deltas(terms_hex: &str, delta_hex: &str, terms: Terms) {
    assert_eq!(decode_terms(&unhex(terms_hex)).unwrap(), terms);
    assert_eq!(
        decode_topic_delta(&unhex(delta_hex)).unwrap(),
        vec![("rev-1".into(), terms), ("rev-2".into(), Terms::default())]
    );
}

/// Format 12's sealed deltas (the bytes of its layouts fixture) are read
/// with their §15 sums and no pair counts.
#[test]
fn format_12_deltas_have_no_pair_counts() {
    let terms = terms_without_pairs();
    reads_old_deltas(
        "0c03808080808080808080808008b960038080808080408080808080204d02808080808010",
        "0c02057265762d3103808080808080808080808008b960038080808080408080808080204d02808080808010057265762d32000000000000000000",
        terms,
    );
}

/// A stored pair row out of order, or naming a partner twice, is read in
/// order with the partner's counts added (a reader never trusts a stored
/// order: the tables merge rows by partner).
#[test]
fn a_pair_row_is_read_in_order() {
    let stored = Terms {
        pairs: PairRow(vec![
            ("rev-3".into(), [1, 0, 0, 0]),
            ("rev-2".into(), [0, 1, 0, 0]),
            ("rev-3".into(), [0, 0, 0, 2]),
        ]),
        ..Terms::noise(1, 0, 0)
    };
    let read = decode_terms(&encode_terms(&stored)).unwrap();
    assert_eq!(
        read.pairs,
        PairRow(vec![
            ("rev-2".into(), [0, 1, 0, 0]),
            ("rev-3".into(), [1, 0, 0, 2])
        ])
    );
}
