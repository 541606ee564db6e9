use super::upgrade::{FORMAT_VERSION, UPGRADING_POS};
use super::*;
use crate::engine::score::Evidence;
use crate::engine::{Change, Meta, Voted, Wants};

/// A series' value without open values.
fn series_value(s: &SeriesState) -> Vec<u8> {
    format::encode_series(s, std::iter::empty())
}

#[test]
fn series_keys_round_trip_and_prefix_by_inference() {
    let k = SeriesKey {
        inference_id: "a\u{0}b".into(),
        voter_prompt_id: "rubric".into(),
    };
    let bytes = series_key_bytes(&k);
    assert_eq!(parse_series_key(&bytes), Some(k.clone()));
    assert!(bytes.starts_with(&series_prefix("a\u{0}b")));
    // "a" must not prefix-match the series of "a\0b".
    assert!(!bytes.starts_with(&series_prefix("a")));
}

fn id_record(id: u128, at: Nanos) -> Record {
    (identity_key(id), Some(format::encode_identity(at, None)))
}

/// An untagged (format ≤ 6) series record, read as the upgrade reads it.
fn legacy_series(bytes: &[u8]) -> SeriesState {
    format::decode_series(&legacy::upgrade(b"s", bytes).unwrap()).unwrap()
}

thread_local! {
    /// Set: [`Store::scans_identities`] answers this.
    pub(super) static SCAN_IDENTITIES: std::cell::Cell<Option<bool>> =
        const { std::cell::Cell::new(None) };
}

fn keys(store: &Store, prefix: &[u8]) -> usize {
    store.prefix(prefix).count()
}

#[test]
fn time_index_keys_sort_by_vote_time_including_negative_times() {
    let id = [0u8; 16];
    let ts = [-5 * 10i128.pow(18), -1, 0, 1, 10i128.pow(18)];
    for w in ts.windows(2) {
        assert!(time_index_key(w[0], &id) < time_index_key(w[1], &id));
    }
}

fn reused_record(id: u128, at: Nanos, before: Nanos) -> Vec<Record> {
    let mut out = Vec::new();
    encode_change(Change::Dedupe(id, at, Some(before), None), &mut out);
    out
}

#[test]
fn sweep_forgets_identities_past_the_horizon_and_keeps_reused_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // 1 and 2 old, 3 new; 2 accepted again later (its old index entry goes).
    store
        .apply(
            &[id_record(1, 10), id_record(2, 20), id_record(3, 100)],
            &[],
        )
        .unwrap();
    store.apply(&reused_record(2, 90, 20), &[]).unwrap();
    assert_eq!(keys(&store, b"t"), 3);
    let swept = store.sweep(50, usize::MAX).unwrap();
    // d1 and t1 deleted; 2 stays; the sweep's start moves past t1.
    let t1 = time_index_key(10, &identity_key(1)[1..]);
    let h50 = time_index_key(50, &[]);
    assert_eq!(
        swept,
        vec![
            (identity_key(1), None),
            (t1, None),
            (SWEEP_KEY.to_vec(), Some(format::encode_sweep(&h50)))
        ]
    );
    store.apply(&swept, &[]).unwrap();
    assert_eq!(keys(&store, b"d"), 2);
    assert_eq!(keys(&store, b"t"), 2);
    assert!(store.sweep(50, usize::MAX).unwrap().is_empty());
    // The start is kept across restarts.
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(*store.sweep_from.lock().unwrap(), h50);
    // The limit bounds one call's work.
    assert_eq!(store.sweep(1000, 1).unwrap().len(), 3);
    // An identity put with a vote time before where the sweep got to
    // (a retention shorter than a window) is still found.
    store.apply(&[id_record(4, 5)], &[]).unwrap();
    let swept = store.sweep(50, usize::MAX).unwrap();
    assert!(swept.contains(&(identity_key(4), None)), "{swept:?}");
}

#[test]
fn an_old_directory_gets_its_time_index_rebuilt_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        // As a format-2 directory: 2 was accepted again and its old index
        // entry stayed behind; 1 has no entry at all (format 1).
        // (Untagged values, as formats before 7 stored them.)
        let mut wb = WriteBatch::default();
        for (id, at) in [(1u128, 10i128), (2, 90)] {
            wb.put(identity_key(id), at.to_le_bytes());
        }
        wb.put(time_index_key(20, &identity_key(2)[1..]), []);
        wb.put(time_index_key(90, &identity_key(2)[1..]), []);
        wb.put(position_key(FORMAT_POS), 2i64.to_le_bytes());
        store.db.write(wb).unwrap();
        assert_eq!(keys(&store, b"t"), 2);
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(keys(&store, b"t"), 2);
    assert_eq!(store.position(FORMAT_POS).unwrap(), Some(FORMAT_VERSION));
    // Only 1 is past 50: 2's stale entry (20) is gone.
    let swept = store.sweep(50, usize::MAX).unwrap();
    assert_eq!(swept.len(), 3);
    assert!(swept.contains(&(identity_key(1), None)));
}

#[test]
fn load_reads_open_batches_and_their_series_only() {
    let cfg = crate::config::Config::load(None).unwrap().engine();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (mut engine, stats) = store.load(cfg.clone()).unwrap();
    assert!(engine.is_complete());
    assert_eq!(stats.series, 0);
    let opts = crate::config::Config::load(None).unwrap().decode_options();
    let mut out = Vec::new();
    for line in [
        r#"{"inference_id":"a","voter_id":"v","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-01T00:00:00Z"}"#,
        r#"{"inference_id":"b","voter_id":"v","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-01T00:10:00Z"}"#,
    ] {
        let v = crate::input::decode_vote(line.as_bytes(), &opts).unwrap();
        engine.process(&v, &mut out);
    }
    store.write_bulk(&mut engine, true).unwrap();
    let (engine, stats) = store.load(cfg).unwrap();
    // Series "a" was scored and closed: it stays on disk.
    assert_eq!((stats.series, stats.batches), (1, 1));
    assert_eq!(engine.cached(), (1, 0));
    assert!(!engine.is_complete());
    // A vote on "a" wants its series and identity from the store.
    let v = crate::input::decode_vote(
        br#"{"inference_id":"a","voter_id":"v","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-01T00:00:00Z"}"#,
        &opts,
    )
    .unwrap();
    let wants = engine.wants(&v);
    assert!(wants.series.is_some() && wants.identity.is_some());
    let mut engine = engine;
    store.provide(&mut engine, &[wants]).unwrap();
    assert_eq!(engine.cached(), (2, 1));
    assert_eq!(engine.wants(&v), Wants::default());
}

/// A series created here, with nothing stored, has all its identities in
/// the cache until an eviction of identities reaches it: a new vote on it
/// needs no store read, but once one of its identities was evicted, a
/// repeat is read back (and found a duplicate). A series the store lacks
/// means its identities are not read either.
#[test]
fn identities_of_a_series_born_here_are_read_only_after_an_eviction() {
    let cfg = crate::config::Config::load(None).unwrap().engine();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (mut engine, _) = store.load(cfg).unwrap();
    let opts = crate::config::Config::load(None).unwrap().decode_options();
    let vote = |id: &str, inf: &str| {
        let line = format!(
            r#"{{"vote_id":"{id}","inference_id":"{inf}","voter_id":"v{id}","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-01T00:00:00Z"}}"#
        );
        crate::input::decode_vote(line.as_bytes(), &opts).unwrap()
    };
    let mut out = Vec::new();
    let process = |engine: &mut Engine, v: &crate::input::Vote, out: &mut Vec<_>| {
        let wants = engine.wants(v);
        store.provide(engine, std::slice::from_ref(&wants)).unwrap();
        (wants, engine.process(v, out))
    };
    // A first eviction, so the cache is no longer the whole partition.
    let (_, o) = process(&mut engine, &vote("0", "old"), &mut out);
    assert!(matches!(o, crate::engine::Outcome::Accepted));
    store.write_bulk(&mut engine, true).unwrap();
    engine.evict(0);
    assert!(!engine.is_complete());
    // "a" is new: its series and identity are wanted, and the store's lack
    // of the series answers both.
    let (wants, o) = process(&mut engine, &vote("1", "a"), &mut out);
    assert!(wants.series.is_some() && wants.identity.is_some());
    assert!(matches!(o, crate::engine::Outcome::Accepted));
    assert_eq!(
        store
            .read(std::slice::from_ref(&engine.wants(&vote("1", "b"))))
            .unwrap()
            .identities
            .len(),
        0,
        "no identity read for a series the store lacks"
    );
    // A second vote on "a": the cache answers.
    let (wants, o) = process(&mut engine, &vote("2", "a"), &mut out);
    assert_eq!(wants, Wants::default());
    assert!(matches!(o, crate::engine::Outcome::Accepted));
    // Written and evicted: the open batch keeps "a" cached, its identities go.
    store.write_bulk(&mut engine, true).unwrap();
    engine.evict(0);
    let (wants, o) = process(&mut engine, &vote("1", "a"), &mut out);
    assert!(wants.series.is_none() && wants.identity.is_some());
    assert!(
        matches!(o, crate::engine::Outcome::Duplicate),
        "a repeat after eviction is a duplicate"
    );
    let (wants, o) = process(&mut engine, &vote("3", "a"), &mut out);
    assert!(wants.identity.is_some());
    assert!(matches!(o, crate::engine::Outcome::Accepted));
}

/// Untagged series records of every earlier layout still decode (postcard
/// is not self-describing; `legacy` tries the newest layout first).
#[test]
fn series_records_of_earlier_layouts_decode() {
    #[derive(serde::Serialize)]
    struct V4 {
        v1: SeriesStateV1Fixture,
        ambiguous: bool,
        pending: u64,
    }
    let v1 = SeriesStateV1Fixture {
        model_id: Some("m".into()),
        score: 0.25,
        last_vote_at: Some(7),
        update_seq: 3,
        abstentions: 1,
        votes: 5,
    };
    let s = legacy_series(&postcard::to_allocvec(&v1).unwrap());
    assert_eq!(
        (s.score, s.update_seq, s.votes, s.ambiguous),
        (0.25, 3, 5, false)
    );
    assert_eq!((s.pending, s.last_mean_vote), (0, None));
    let v4 = V4 {
        v1,
        ambiguous: true,
        pending: 2,
    };
    let s = legacy_series(&postcard::to_allocvec(&v4).unwrap());
    assert_eq!((s.ambiguous, s.pending, s.last_mean_vote), (true, 2, None));
    assert_eq!(s.model_id.as_deref(), Some("m"));
    #[derive(serde::Serialize)]
    struct V5 {
        v4: V4,
        last_mean_vote: Option<f64>,
    }
    let v5 = V5 {
        v4,
        last_mean_vote: Some(0.5),
    };
    let s = legacy_series(&postcard::to_allocvec(&v5).unwrap());
    assert_eq!((s.pending, s.last_mean_vote), (2, Some(0.5)));
    assert!(s.companion_scores.is_empty());
    // Format ≤ 5 (before the evidence): a scored series is read as one
    // vote's worth, all from votes (docs/decisions.md).
    #[derive(serde::Serialize)]
    struct V6 {
        v5: V5,
        companion_scores: Vec<f64>,
    }
    let v6 = V6 {
        v5,
        companion_scores: vec![0.3],
    };
    let s = legacy_series(&postcard::to_allocvec(&v6).unwrap());
    assert_eq!((s.update_seq, &*s.companion_scores), (3, &[0.3][..]));
    assert_eq!(s.evidence, Evidence { v: 1.0, q: 1.0 });
    assert_eq!(s.evidence.effective_votes(), Some(1.0));
    assert!(s.companion_evidence.is_empty());
    let unscored = legacy_series(&postcard::to_allocvec(&SeriesStateV1Fixture::default()).unwrap());
    assert_eq!(unscored.evidence, Evidence::default());
    let mut now = s.clone();
    now.last_mean_vote = Some(0.75);
    now.companion_scores = vec![0.1, 0.2].into();
    now.evidence = Evidence { v: 0.9, q: 0.2 };
    now.companion_evidence = vec![Evidence { v: 0.5, q: 0.1 }; 2].into();
    let back = format::decode_series(&series_value(&now)).unwrap();
    assert_eq!(back, now);
}

/// A format-5 directory: its leaderboard rows (without squares) are
/// rebuilt from its series at open, and a row of the old layout that
/// arrives later (an older version's changelog) is rebuilt at load.
#[test]
fn a_format_5_directory_gets_leaderboard_squares() {
    use crate::engine::board::{fixed, fixed_square, BoardKey};
    #[derive(serde::Serialize)]
    struct RowV5 {
        series: u64,
        score_sum: i128,
        ambiguous: u64,
        votes: u64,
    }
    let series = |inf: &str, score: f64| {
        let k = SeriesKey {
            inference_id: inf.into(),
            voter_prompt_id: "r".into(),
        };
        let v1 = SeriesStateV1Fixture {
            model_id: Some("m".into()),
            score,
            last_vote_at: Some(7),
            update_seq: 1,
            abstentions: 0,
            votes: 2,
        };
        (series_key_bytes(&k), postcard::to_allocvec(&v1).unwrap())
    };
    let key = BoardKey {
        model_id: Some("m".into()),
        voter_prompt_id: "r".into(),
    };
    // Untagged, as format 5 stored it; or as a restore of such a changelog
    // record stores it now.
    let old_row = |wb: &mut WriteBatch, restored: bool| {
        let row = RowV5 {
            series: 2,
            score_sum: fixed(0.2) + fixed(0.6),
            ambiguous: 0,
            votes: 4,
        };
        let k = board_key(&key);
        let v = postcard::to_allocvec(&row).unwrap();
        if restored {
            wb.put(&k, current_value(&k, &v, None).unwrap());
        } else {
            wb.put(&k, v);
        }
    };
    let want_squares = fixed_square(0.2) + fixed_square(0.6);
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let mut wb = WriteBatch::default();
        for (k, v) in [series("a", 0.2), series("b", 0.6)] {
            wb.put(k, v);
        }
        old_row(&mut wb, false);
        wb.put(position_key(FORMAT_POS), 5i64.to_le_bytes());
        store.db.write(wb).unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.position(FORMAT_POS).unwrap(), Some(FORMAT_VERSION));
    let board = store.board().unwrap();
    assert_eq!(board.len(), 1);
    assert_eq!(
        (board[0].1.series, board[0].1.score_squares),
        (2, want_squares)
    );
    let sd = board[0].1.score_sd().unwrap();
    assert!((sd - (0.08f64).sqrt()).abs() < 1e-12, "{sd}");

    // An old-layout row written after the upgrade (a restored changelog).
    let mut wb = WriteBatch::default();
    old_row(&mut wb, true);
    store.db.write(wb).unwrap();
    assert_eq!(
        store.board().unwrap()[0].1.score_squares,
        legacy::SQUARES_UNKNOWN
    );
    let cfg = crate::config::Config::load(None).unwrap().engine();
    let (engine, _) = store.load(cfg).unwrap();
    let rows: Vec<_> = engine.board().iter().collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1.score_squares, want_squares);
    assert_eq!(store.board().unwrap()[0].1.score_squares, want_squares);
}

#[test]
fn the_inference_prefix_covers_series_and_voter_keys_only() {
    let k = SeriesKey {
        inference_id: "inf-1".into(),
        voter_prompt_id: "safety".into(),
    };
    let s = series_key_bytes(&k);
    let v = [voter_prefix(&k), b"rev-1".to_vec()].concat();
    let p = series_prefix("inf-1");
    assert_eq!(inference_prefix(&s), &p[..]);
    assert_eq!(&inference_prefix(&v)[1..], &p[1..]);
    assert_eq!(inference_prefix(&p), &p[..], "a prefix is its own prefix");
    assert!(in_inference_domain(&s) && in_inference_domain(&v) && in_inference_domain(&p));
    for other in [
        &identity_key(7)[..],
        b"b",
        b"s",
        b"s\0\0\0\x09ab",
        b"l",
        b"p:format",
    ] {
        assert!(!in_inference_domain(other), "{other:?}");
    }
    assert_eq!(prefix_end(b"s\x01"), Some(b"s\x02".to_vec()));
    assert_eq!(prefix_end(b"s\xff"), Some(b"t".to_vec()));
    assert_eq!(prefix_end(b"\xff\xff"), None);
}

#[test]
fn voters_of_an_inference_come_per_rubric_in_one_scan_with_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let key = |inf: &str, vp: &str| SeriesKey {
        inference_id: inf.into(),
        voter_prompt_id: vp.into(),
    };
    let voter = |k: &SeriesKey, v: &str| -> Record {
        (
            [voter_prefix(k), v.as_bytes().to_vec()].concat(),
            Some(Vec::new()),
        )
    };
    let (a, b) = (key("inf", "a"), key("inf", "b"));
    let mut records = Vec::new();
    for v in ["v3", "v1", "v2", "v4"] {
        records.push(voter(&a, v));
    }
    records.push(voter(&b, "only"));
    // neighbours that share bytes with the inference id
    records.push(voter(&key("in", "fa"), "x"));
    records.push(voter(&key("inf\u{0}", "a"), "y"));
    store.apply(&records, &[]).unwrap();
    let got = store.voters_of("inf", 3).unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got["a"],
        (vec!["v1".into(), "v2".into(), "v3".into()], true)
    );
    assert_eq!(got["b"], (vec!["only".to_owned()], false));
    assert_eq!(store.voters_of("inf", 10).unwrap()["a"].0.len(), 4);
    assert!(store.voters_of("none", 10).unwrap().is_empty());
    assert_eq!(
        store.voters_of("in", 10).unwrap()["fa"].0,
        vec!["x".to_owned()]
    );
}

/// Prefix filters never hide a series or a voter: in memtables, in files,
/// and in both at once, for ids that share bytes.
#[test]
fn prefix_filters_find_every_inference_in_memtables_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let cfg = crate::config::Config::load(None).unwrap().engine();
    let state = SeriesState::new(None, &cfg);
    let ids: Vec<String> = (0..3000).map(|i| format!("inf-{i}")).collect();
    for (round, chunk) in ids.chunks(1000).enumerate() {
        let mut records = Vec::new();
        for id in chunk {
            let k = SeriesKey {
                inference_id: id.as_str().into(),
                voter_prompt_id: "r".into(),
            };
            records.push((series_key_bytes(&k), Some(series_value(&state))));
            records.push(([voter_prefix(&k), b"v".to_vec()].concat(), Some(Vec::new())));
        }
        store.apply(&records, &[]).unwrap();
        if round < 2 {
            store.flush().unwrap();
        }
    }
    for id in &ids {
        assert_eq!(store.series_of(id).unwrap().len(), 1, "{id}");
        assert_eq!(
            store.voters_of(id, 10).unwrap()["r"].0,
            vec!["v".to_owned()],
            "{id}"
        );
    }
    for missing in ["inf-3000", "inf-", "inf-10000", "", "inf-1\u{0}"] {
        assert!(store.series_of(missing).unwrap().is_empty(), "{missing}");
        assert!(
            store.voters_of(missing, 10).unwrap().is_empty(),
            "{missing}"
        );
    }
}

/// A directory written before the prefix extractor (files without prefix
/// filters) still answers every inference after an upgrade.
#[test]
fn files_written_without_the_prefix_extractor_are_still_found() {
    let dir = tempfile::tempdir().unwrap();
    let k = SeriesKey {
        inference_id: "old-1".into(),
        voter_prompt_id: "r".into(),
    };
    {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        let db = DB::open(&opts, dir.path()).unwrap();
        db.put(
            series_key_bytes(&k),
            postcard::to_allocvec(&SeriesStateV1Fixture::default()).unwrap(),
        )
        .unwrap();
        db.put([voter_prefix(&k), b"rev".to_vec()].concat(), b"")
            .unwrap();
        db.flush().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.series_of("old-1").unwrap().len(), 1);
    assert_eq!(
        store.voters_of("old-1", 5).unwrap()["r"].0,
        vec!["rev".to_owned()]
    );
    assert!(store.series_of("old-2").unwrap().is_empty());
}

/// A series record as format 3 and before wrote it.
#[derive(serde::Serialize, Default)]
struct SeriesStateV1Fixture {
    model_id: Option<Box<str>>,
    score: f64,
    last_vote_at: Option<i128>,
    update_seq: u64,
    abstentions: u64,
    votes: u64,
}

/// Every value the store writes starts with its format byte; a value of a
/// format this build does not know is refused, never guessed.
#[test]
fn values_carry_their_format_and_unknown_ones_are_refused() {
    use crate::engine::agreement::{ReviewerStats, RubricSums};
    use crate::engine::board::BoardRow;
    let cfg = crate::config::Config::load(None).unwrap().engine();
    let mut s = SeriesState::new(Some("model"), &cfg);
    s.update_seq = 2;
    s.last_vote_at = Some(-5);
    s.companion_scores = vec![0.25, 0.5].into();
    s.evidence = Evidence { v: 0.5, q: 0.25 };
    s.companion_evidence = vec![Evidence { v: 0.1, q: 0.2 }; 2].into();
    let v = series_value(&s);
    assert_eq!(v[0], format::FORMAT);
    assert_eq!(format::decode_series(&v).unwrap(), s);
    let mut newer = v.clone();
    newer[0] = format::FORMAT + 1;
    assert!(matches!(
        format::decode_series(&newer),
        Err(FormatError::Unknown(f)) if f == format::FORMAT + 1
    ));
    // Format 7's, 8's and 9's values read as they are (10 added the open
    // values at the end, 11 moved them to the front).
    let state = &v[2..];
    assert_eq!(v[1], 0, "no open values: an empty sequence");
    for older in [7, 8, 9] {
        let old = [&[older][..], state].concat();
        assert_eq!(format::decode_series(&old).unwrap(), s);
        assert!(format::decode_series_open(&old).unwrap().is_none());
    }
    let ten = [&[10][..], state, &[0][..]].concat();
    assert_eq!(format::decode_series(&ten).unwrap(), s);
    assert_eq!(format::decode_series_open(&ten).unwrap(), Some(Vec::new()));
    assert!(matches!(
        format::decode_series(&[]),
        Err(FormatError::Empty)
    ));
    assert!(matches!(
        format::decode_series(&v[..v.len() - 1]),
        Err(FormatError::Layout { format, .. }) if format == format::FORMAT
    ));

    let entry = crate::engine::Entry {
        voter_id: "rev".into(),
        vote_id: "vote-1".into(),
        value: Some(0.75),
        weight: 1.5,
        timestamp: 1_700_000_000_000_000_001,
        inference_time: None,
        live: true,
    };
    let b = Batch::stored(vec![entry.clone(), entry], 2);
    let back = format::decode_batch(&format::encode_batch(&b)).unwrap();
    assert_eq!((back.entries, back.counted), (b.entries, 2));
    let m = Meta {
        watermark: Some(-3),
        next_batch_seq: 9,
        swept_before: None,
    };
    assert_eq!(format::decode_meta(&format::encode_meta(&m)).unwrap(), m);
    assert_eq!(
        format::decode_identity(&format::encode_identity(-7, None)).unwrap(),
        -7
    );
    let row = BoardRow {
        series: 3,
        score_sum: -1 << 70,
        ambiguous: 1,
        votes: 7,
        score_squares: 1 << 90,
    };
    assert_eq!(
        format::decode_board_row(&format::encode_board_row(&row)).unwrap(),
        row
    );
    let sums = RubricSums {
        units: 1,
        pairable: 2,
        sum: 3,
        square_sum: 4,
        within: 5,
    };
    assert_eq!(
        format::decode_rubric_sums(&format::encode_rubric_sums(&sums)).unwrap(),
        sums
    );
    let r = ReviewerStats {
        rated: 4,
        sq_dev: 1 << 66,
    };
    assert_eq!(
        format::decode_reviewer(&format::encode_reviewer(&r)).unwrap(),
        r
    );
}

/// The format-7 layouts are format 6's with the format byte in front: an
/// untagged record of every kind upgrades to exactly what this build
/// writes for the same value.
#[test]
fn untagged_records_upgrade_to_what_this_build_writes() {
    let cfg = crate::config::Config::load(None).unwrap().engine();
    let mut s = SeriesState::new(Some("model"), &cfg);
    s.update_seq = 1;
    s.evidence = Evidence { v: 0.5, q: 0.25 };
    let tagged = series_value(&s);
    // Format 6's layout: format 11's without the open values in front.
    let untagged = &tagged[2..];
    assert_eq!(legacy::upgrade(b"s", untagged).unwrap(), tagged);
    let at = format::encode_identity(42, None);
    assert_eq!(legacy::upgrade(b"d", &42i128.to_le_bytes()).unwrap(), at);
    let meta = format::encode_meta(&Meta::default());
    assert_eq!(legacy::upgrade(META_KEY, &meta[1..]).unwrap(), meta);
    assert!(legacy::upgrade(b"v", b"").unwrap().is_empty());
    // A changelog record: as it is with the header, upgraded without.
    assert_eq!(
        &*current_value(b"s", &tagged, Some(format::HEADER_VALUE)).unwrap(),
        &tagged[..]
    );
    assert_eq!(&*current_value(b"s", untagged, None).unwrap(), &tagged[..]);
    assert_eq!(
        &*current_value(b"s", &tagged, Some(b"7")).unwrap(),
        &tagged[..]
    );
    let newer = (format::FORMAT + 1).to_string();
    assert!(matches!(
        current_value(b"s", &tagged, Some(newer.as_bytes())),
        Err(FormatError::Header(_))
    ));
}

fn voted<'a>(series: &'a SeriesKey, voter: &'a str, open: Option<Option<f64>>) -> Voted<'a> {
    Voted {
        series,
        voter,
        open,
    }
}

/// Format 11's identity may end with its vote's value (contract §14): an
/// abstention and a value read back as written, and format 9's and 10's
/// layout (none) reads as none.
#[test]
fn an_identity_carries_its_open_value_from_format_11() {
    let series = SeriesKey {
        inference_id: "inf-1".into(),
        voter_prompt_id: "rubric".into(),
    };
    for open in [None, Some(None), Some(Some(0.25)), Some(Some(1.0))] {
        let v = format::encode_identity(7, Some(voted(&series, "rev", open)));
        let got = format::decode_identity_vote(&v).unwrap().unwrap();
        assert_eq!(got, (series.clone(), "rev".into(), open));
        assert_eq!(format::decode_identity(&v).unwrap(), 7);
        assert_eq!(
            format::decode_identity_voter(&v).unwrap(),
            Some((series.clone(), "rev".into()))
        );
        if let Some(Some(_)) = open {
            // Cut inside the value: corrupt.
            assert!(format::decode_identity_vote(&v[..v.len() - 1]).is_err());
        }
    }
    let without = format::encode_identity(7, Some(voted(&series, "rev", None)));
    for older in [9, 10] {
        let mut old = without.clone();
        old[0] = older;
        let got = format::decode_identity_vote(&old).unwrap().unwrap();
        assert_eq!(got.2, None);
    }
}

/// Format 9's identity carries its vote's series and voter; 7's and 8's
/// (the vote time alone) read as before, without one, and an 8 with more
/// bytes is corrupt.
#[test]
fn an_identity_carries_its_voter_from_format_9() {
    let series = SeriesKey {
        inference_id: "inf-1".into(),
        voter_prompt_id: "rubric".into(),
    };
    let with = format::encode_identity(-42, Some(voted(&series, "rev-7", None)));
    assert_eq!(with[0], format::FORMAT);
    assert_eq!(format::decode_identity(&with).unwrap(), -42);
    assert_eq!(
        format::decode_identity_voter(&with).unwrap(),
        Some((series.clone(), "rev-7".into()))
    );
    let without = format::encode_identity(5, None);
    assert_eq!(without.len(), 17);
    assert_eq!(format::decode_identity_voter(&without).unwrap(), None);
    let mut eight = without.clone();
    eight[0] = 8;
    assert_eq!(format::decode_identity(&eight).unwrap(), 5);
    let mut eight_longer = with.clone();
    eight_longer[0] = 8;
    assert!(matches!(
        format::decode_identity(&eight_longer),
        Err(FormatError::Identity)
    ));
    assert!(matches!(
        format::decode_identity(&with[..10]),
        Err(FormatError::Identity)
    ));
    assert!(format::decode_identity_voter(&with[..with.len() - 1]).is_err());
}

/// A voter's `v` key is derived from the identities that carry it, when
/// a cycle is applied (as a restore applies the changelog), and a sweep
/// that forgets such an identity writes the key as a record of its own.
#[test]
fn voter_keys_come_from_identities_and_outlive_their_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let series = SeriesKey {
        inference_id: "inf-1".into(),
        voter_prompt_id: "rubric".into(),
    };
    let mut records = Vec::new();
    encode_change(
        Change::Dedupe(1, 10, None, Some(voted(&series, "rev-a", None))),
        &mut records,
    );
    encode_change(Change::Dedupe(2, 20, None, None), &mut records);
    assert_eq!(records.len(), 2, "no record of its own for the voter");
    store.apply(&records, &[]).unwrap();
    let voter = voter_key(&series, "rev-a");
    assert_eq!(store.get(&voter).unwrap().as_deref(), Some(&[][..]));
    let voters = store.voters_of("inf-1", 10).unwrap();
    assert_eq!(voters["rubric"].0, ["rev-a"]);

    let swept = store.sweep(15, 100).unwrap();
    assert!(
        swept.contains(&(voter.clone(), Some(Vec::new()))),
        "{swept:?}"
    );
    assert!(swept.contains(&(identity_key(1), None)));
    assert!(
        !swept.contains(&(identity_key(2), None)),
        "20 is after the horizon"
    );
    store.apply(&swept, &[]).unwrap();
    assert_eq!(store.get(&identity_key(1)).unwrap(), None);
    assert_eq!(store.voters_of("inf-1", 10).unwrap()["rubric"].0, ["rev-a"]);
}

/// An upgrade stopped halfway (a crash) resumes after the last key it
/// recorded: values before it are not upgraded twice.
#[test]
fn an_interrupted_upgrade_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        let db = DB::open(&opts, dir.path()).unwrap();
        db.put(identity_key(1), format::encode_identity(10, None))
            .unwrap();
        db.put(identity_key(2), 20i128.to_le_bytes()).unwrap();
        db.put(identity_key(3), 30i128.to_le_bytes()).unwrap();
        db.put(position_key(FORMAT_POS), 6i64.to_le_bytes())
            .unwrap();
        db.put(position_key(UPGRADING_POS), identity_key(1))
            .unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    for id in 1..=3u128 {
        let v = store.get(&identity_key(id)).unwrap().unwrap();
        assert_eq!(format::decode_identity(&v).unwrap(), id as i128 * 10);
    }
    assert_eq!(store.position(FORMAT_POS).unwrap(), Some(FORMAT_VERSION));
    assert_eq!(store.get(&position_key(UPGRADING_POS)).unwrap(), None);
    // Format 6 kept its index: the upgrade did not rebuild it.
    assert!(store.prefix(b"t").next().is_none());
}

/// A directory a later version wrote is refused with a message that says
/// so, and left as it is.
#[test]
fn a_directory_of_a_later_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    Store::open(dir.path())
        .unwrap()
        .apply(&[], &[(FORMAT_POS, FORMAT_VERSION + 1)])
        .unwrap();
    let e = Store::open(dir.path()).err().expect("refused");
    assert!(e.to_string().contains("newer version"), "{e}");
}

/// `inspect` opens read-only, so it cannot upgrade: it reads an older
/// directory's untagged values as they are.
#[test]
fn a_read_only_look_reads_a_directory_not_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let k = SeriesKey {
        inference_id: "old-1".into(),
        voter_prompt_id: "r".into(),
    };
    {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        let db = DB::open(&opts, dir.path()).unwrap();
        let v1 = SeriesStateV1Fixture {
            score: 0.75,
            update_seq: 1,
            ..Default::default()
        };
        db.put(series_key_bytes(&k), postcard::to_allocvec(&v1).unwrap())
            .unwrap();
        db.put(position_key(FORMAT_POS), 6i64.to_le_bytes())
            .unwrap();
    }
    let store = Store::open_read_only(dir.path()).unwrap();
    let series = store.series_of("old-1").unwrap();
    assert_eq!(series.len(), 1);
    assert_eq!((series[0].1.score, series[0].1.update_seq), (0.75, 1));
}

/// The reviewers whose open values of `epoch` the series record of
/// `series` among `records` carries (format 10).
fn open_voters(
    records: &[Record],
    series: &SeriesKey,
    epoch: crate::engine::reputation::Epoch,
) -> Vec<crate::input::Id> {
    let key = series_key_bytes(series);
    let (_, v) = records
        .iter()
        .find(|(k, _)| *k == key)
        .expect("the series is written");
    format::decode_series_open(v.as_deref().unwrap())
        .unwrap()
        .expect("format 10")
        .into_iter()
        .filter(|(e, ..)| *e == epoch)
        .map(|(_, voter, _)| voter)
        .collect()
}

/// Processes one vote line (read from `store` as the shell does) and
/// returns the records of the engine's changes.
fn vote_and_encode(
    store: &Store,
    engine: &mut Engine,
    opts: &crate::input::DecodeOptions,
    line: &[u8],
) -> Vec<Record> {
    let v = crate::input::decode_vote(line, opts).unwrap();
    let wants = engine.wants(&v);
    store.provide(engine, &[wants]).unwrap();
    engine.process(&v, &mut Vec::new());
    let mut records = Vec::new();
    store.encode_changes(engine, &mut records).unwrap();
    records
}

/// `learned` mode with one epoch per window, a state directory, 2024-01-01
/// (the first vote time of the tests below) and its epoch.
fn learned_setup() -> (
    crate::engine::EngineConfig,
    crate::input::DecodeOptions,
    tempfile::TempDir,
    Nanos,
    crate::engine::reputation::Epoch,
) {
    let mut cfg = crate::config::Config::load(None).unwrap().engine();
    cfg.reputation.mode = crate::engine::reputation::Mode::Learned;
    cfg.reputation.epoch_ns = cfg.window_ns;
    let opts = crate::config::Config::load(None).unwrap().decode_options();
    let t0: Nanos = 1_704_067_200_000_000_000;
    let epoch = cfg.reputation.epoch_of(t0 - t0.rem_euclid(cfg.window_ns));
    (cfg, opts, tempfile::tempdir().unwrap(), t0, epoch)
}

/// A store of format 8 holds contract §14's open values as `e` records, one
/// per reviewer: they are read while their series' record is older than
/// format 10, then ride in it (new values are in their identities, format
/// 11), indexed locally (`j`, one entry per series and epoch, an epoch's
/// deleted as one range at its seal), and the `e` records go at the seal.
#[test]
fn format_8_values_ride_in_their_series_record_until_the_seal() {
    use crate::engine::reputation::OpenValue;
    let (cfg, opts, dir, t0, epoch) = learned_setup();
    let store = Store::open(dir.path()).unwrap();
    let series = |inf: &str| SeriesKey {
        inference_id: inf.into(),
        voter_prompt_id: "r".into(),
    };
    // What each series' record carries: format 8's values, not the new
    // ones (their identities hold them).
    let open_want = |s: &SeriesKey| -> Vec<crate::input::Id> {
        let want: &[&str] = if *s == series("i1") { &[] } else { &["c", "d"] };
        want.iter().map(|&v| v.into()).collect()
    };
    // Format 8's records of two series' values in the epoch.
    let legacy = |inf: &str, voter: &str| {
        let key = [
            &b"e"[..],
            &format::open_value_key(&(epoch, series(inf), voter.into())),
        ]
        .concat();
        let mut value = format::encode_open_value(&OpenValue {
            timestamp: t0,
            value: Some(1.0),
        });
        value[0] = 8;
        (key, Some(value))
    };
    let old = [legacy("i2", "c"), legacy("i2", "d"), legacy("i3", "c")];
    store.apply(&old, &[]).unwrap();
    let now = series_value(&SeriesState::new(None, &cfg));
    let series_8 = [&[8][..], &now[2..]].concat();
    for inf in ["i2", "i3"] {
        let put = (series_key_bytes(&series(inf)), Some(series_8.clone()));
        store.apply(&[put], &[]).unwrap();
    }

    let (mut engine, _) = store.load(cfg.clone()).unwrap();
    assert_eq!(engine.open_values(), 3);
    let mut out = Vec::new();
    for (inf, voter, at) in [("i1", "a", 0), ("i1", "b", 1), ("i2", "e", 2)] {
        let line = format!(
            r#"{{"inference_id":"{inf}","voter_id":"{voter}","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-01T00:00:0{at}Z"}}"#
        );
        let v = crate::input::decode_vote(line.as_bytes(), &opts).unwrap();
        let wants = engine.wants(&v);
        store.provide(&mut engine, &[wants]).unwrap();
        engine.process(&v, &mut out);
    }
    let mut records = Vec::new();
    store.encode_changes(&mut engine, &mut records).unwrap();
    assert!(
        records.iter().all(|(k, _)| k[0] != b'h' && k[0] != b'j'),
        "no record of their own: {records:?}"
    );
    for s in [series("i1"), series("i2")] {
        let mut got = open_voters(&records, &s, epoch);
        got.sort();
        assert_eq!(got, open_want(&s), "{s:?}");
    }
    // The format-8 records stay until the seal; i2's record now holds its
    // values and is read instead.
    assert!(records.iter().all(|(k, _)| k[0] != b'e'));
    store.apply(&records, &[]).unwrap();
    assert_eq!(keys(&store, b"e"), 3);
    assert_eq!(
        keys(&store, b"j"),
        1,
        "the store indexes the epoch of i2's record"
    );
    let (mut engine, _) = store.load(cfg.clone()).unwrap();
    assert_eq!(engine.open_values(), 6);

    // A vote a day later seals the epoch: its index entries (one range)
    // and the format-8 records go.
    let line = br#"{"inference_id":"i9","voter_id":"z","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-02T00:00:00Z"}"#;
    let records = vote_and_encode(&store, &mut engine, &opts, line);
    store.apply(&records, &[]).unwrap();
    assert_eq!(keys(&store, b"e"), 0);
    assert_eq!(
        keys(&store, b"j"),
        0,
        "the new day's value is its identity's"
    );
    let (engine, _) = store.load(cfg).unwrap();
    assert_eq!(engine.open_values(), 1);
}

/// Format 9 held a series' open values of an epoch in its `h` record: they
/// are read while the series' record is older than format 10, and once a
/// vote writes the series its record holds them (the old `h` record is not
/// rewritten; it goes at the seal); the new vote's value is its identity's.
#[test]
fn format_9_units_are_read_until_their_series_is_written() {
    let (cfg, opts, dir, t0, epoch) = learned_setup();
    let store = Store::open(dir.path()).unwrap();
    let k = SeriesKey {
        inference_id: "i1".into(),
        voter_prompt_id: "r".into(),
    };
    let now = series_value(&SeriesState::new(None, &cfg));
    let series_9 = [&[9][..], &now[2..]].concat();
    let unit: Vec<(&str, Nanos, Option<f64>)> = vec![("a", t0, Some(1.0)), ("b", t0, Some(0.0))];
    let unit_9 = postcard::to_extend(&unit, vec![9]).unwrap();
    let h_key = [&b"h"[..], &format::open_unit_key(epoch, &k)].concat();
    store
        .apply(
            &[
                (series_key_bytes(&k), Some(series_9)),
                (h_key.clone(), Some(unit_9.clone())),
            ],
            &[],
        )
        .unwrap();
    let (mut engine, _) = store.load(cfg.clone()).unwrap();
    assert_eq!(engine.open_values(), 2);

    let line = br#"{"inference_id":"i1","voter_id":"c","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-01T00:00:01Z"}"#;
    let records = vote_and_encode(&store, &mut engine, &opts, line);
    assert!(
        records.iter().all(|(k, _)| k[0] != b'h'),
        "the old unit stays"
    );
    let voters: Vec<crate::input::Id> = ["a", "b"].map(Into::into).into();
    assert_eq!(open_voters(&records, &k, epoch), voters);
    store.apply(&records, &[]).unwrap();
    assert_eq!(store.get(&h_key).unwrap().as_deref(), Some(&unit_9[..]));
    let (mut engine, _) = store.load(cfg.clone()).unwrap();
    assert_eq!(
        engine.open_values(),
        3,
        "the series' record, not the old unit"
    );

    // A vote a day later seals the epoch: the old unit goes.
    let line = br#"{"inference_id":"i9","voter_id":"z","voter_prompt_id":"r","vote":1,"timestamp":"2024-01-02T00:00:00Z"}"#;
    let records = vote_and_encode(&store, &mut engine, &opts, line);
    assert!(records.contains(&(h_key.clone(), None)));
    store.apply(&records, &[]).unwrap();
    assert_eq!(store.get(&h_key).unwrap(), None);
    let (engine, _) = store.load(cfg).unwrap();
    assert_eq!(engine.open_values(), 1, "the new day's");
}

/// A seal leaves its epoch's open values in the series records it does
/// not rewrite; compaction takes them out once the seal is durable, keeps
/// the series' state byte for byte and every open epoch's values. (Each
/// vote here ties with another of the same reviewer and time, so that
/// its series' record carries it, format 11.)
#[test]
fn compaction_drops_sealed_open_values_and_keeps_the_rest() {
    // Hour-long epochs: a batch closes (its series written) long before
    // its epoch is sealed.
    let (mut cfg, opts, dir, t0, _) = learned_setup();
    cfg.reputation.epoch_ns = 3600 * 1_000_000_000;
    let epoch = cfg.reputation.epoch_of(t0);
    let store = Store::open(dir.path()).unwrap();
    let (mut engine, _) = store.load(cfg.clone()).unwrap();
    let mut tie = |inf: &str, voter: &str, at: &str| -> Vec<Record> {
        let mut records = Vec::new();
        for id in ["x1", "x2"] {
            let line = format!(
                r#"{{"inference_id":"{inf}","voter_id":"{voter}","voter_prompt_id":"r","vote":1,"vote_id":"{voter}{id}","timestamp":"2024-01-0{at}Z"}}"#
            );
            records.extend(vote_and_encode(&store, &mut engine, &opts, line.as_bytes()));
        }
        records
    };
    for (inf, voter, at) in [
        ("i1", "a", "1T00:00:01"),
        ("i1", "b", "1T00:00:02"),
        ("i2", "a", "1T00:00:03"),
        // Closes the batches of i1 and i2, whose epoch stays open.
        ("i3", "a", "1T00:10:00"),
    ] {
        let records = tie(inf, voter, at);
        store.apply(&records, &[]).unwrap();
    }
    let stored = |inf: &str| {
        store
            .get(&stored_key(inf))
            .unwrap()
            .expect("the series is stored")
    };
    let epochs_of = |v: &[u8]| -> Vec<_> {
        let open = format::decode_series_open(v).unwrap().expect("format 10");
        open.into_iter().map(|(e, ..)| e).collect()
    };
    let compact = || store.db.compact_range::<&[u8], &[u8]>(None, None);

    // Not sealed yet: compaction keeps every value.
    compact();
    assert_eq!(epochs_of(&stored("i1")), [epoch, epoch]);

    // A vote a day later seals the epoch; i1 is not written again.
    let records = tie("i2", "c", "2T00:00:01");
    assert!(records.iter().all(|(k, _)| *k != stored_key("i1")));
    store.apply(&records, &[]).unwrap();
    let before = stored("i1");
    assert_eq!(
        epochs_of(&before),
        [epoch, epoch],
        "a seal does not rewrite"
    );
    let i2 = epochs_of(&stored("i2"));
    assert!(
        i2.len() == 1 && i2[0] > epoch,
        "i2 holds only its open epoch's value: {i2:?}"
    );

    compact();
    let after = stored("i1");
    assert!(epochs_of(&after).is_empty(), "the sealed values are gone");
    assert!(after.len() < before.len());
    assert_eq!(
        after,
        series_value(&format::decode_series(&before).unwrap()),
        "the state is kept as it was"
    );
    assert_eq!(
        epochs_of(&stored("i2")),
        i2,
        "an open epoch's value is kept"
    );
    let (engine, _) = store.load(cfg).unwrap();
    assert_eq!(engine.open_values(), 1, "i2's of the new day");
}

fn stored_key(inf: &str) -> Vec<u8> {
    series_key_bytes(&SeriesKey {
        inference_id: inf.into(),
        voter_prompt_id: "r".into(),
    })
}

/// Compacting after every write (so that sealed values leave as early as
/// they can) changes nothing a partition does: two stores get the same
/// votes over six hour-long epochs, one compacted after each write, and
/// both engines are reloaded from their stores every few votes (the open
/// values then come from the identities and from the series records
/// compaction rewrote). Their
/// events, learned weights included, are the same.
#[test]
fn compaction_after_every_write_changes_no_event() {
    let (mut cfg, opts, _, t0, _) = learned_setup();
    cfg.reputation.epoch_ns = 3600 * 1_000_000_000;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let stores = dirs.each_ref().map(|d| Store::open(d.path()).unwrap());
    // The first never compacts: RocksDB's own compactions follow the
    // flushes, which the process-wide write buffer manager forces sooner
    // when other tests' stores run beside this one (it did in CI once).
    stores[0]
        .db
        .set_options(&[("disable_auto_compactions", "true")])
        .unwrap();
    let mut engines = stores.each_ref().map(|s| s.load(cfg.clone()).unwrap().0);
    let mut events: [Vec<String>; 2] = Default::default();
    let mut weighed = false;
    for n in 0..600u32 {
        // Every 30 s, item n / 4 (four reviewers each, one a contrarian).
        let (voter, item) = (n % 4, n / 4);
        let value = if voter == 3 { item % 2 } else { (item + 1) % 2 };
        let (h, m, s) = (n / 120, (n / 2) % 60, (n % 2) * 30);
        // Every fifth vote ties with another of its reviewer and time
        // (its slot then rides in its series' record, format 11).
        let ties = if n % 5 == 0 { 2 } else { 1 };
        for j in 0..ties {
            let value = (value + j) % 2;
            let line = format!(
                r#"{{"inference_id":"i{item}","voter_id":"v{voter}","voter_prompt_id":"r","vote":{value},"vote_id":"n{n}-{j}","timestamp":"2024-01-01T{h:02}:{m:02}:{s:02}Z"}}"#
            );
            let v = crate::input::decode_vote(line.as_bytes(), &opts).unwrap();
            for i in 0..2 {
                let wants = engines[i].wants(&v);
                stores[i].provide(&mut engines[i], &[wants]).unwrap();
                let mut out = Vec::new();
                engines[i].process(&v, &mut out);
                events[i].extend(out.iter().map(|u| format!("{u:?}")));
                weighed |= out.iter().any(|u| {
                    u.learned
                        .as_ref()
                        .is_some_and(|l| l.weights.iter().any(|&w| w != 1.0))
                });
                let mut records = Vec::new();
                stores[i]
                    .encode_changes(&mut engines[i], &mut records)
                    .unwrap();
                stores[i].apply(&records, &[]).unwrap();
            }
        }
        stores[1].db.compact_range::<&[u8], &[u8]>(None, None);
        if n % 37 == 36 {
            engines = stores.each_ref().map(|s| s.load(cfg.clone()).unwrap().0);
            assert_eq!(
                engines[0].open_values(),
                engines[1].open_values(),
                "vote {n}"
            );
        }
    }
    assert_eq!(events[0], events[1]);
    assert!(weighed, "a table weighed a vote other than 1");
    // The first hour's values, long sealed, stay in the series records of
    // the store never compacted, and are gone from the other.
    let first = cfg.reputation.epoch_of(t0);
    let lingering = |store: &Store| {
        let mut n = 0;
        for item in store.prefix(b"s") {
            let (_, v) = item.unwrap();
            let open = format::decode_series_open(&v).unwrap().expect("format 10");
            n += open.iter().filter(|(e, ..)| *e == first).count();
        }
        n
    };
    assert!(lingering(&stores[0]) > 0);
    assert_eq!(lingering(&stores[1]), 0);
}

/// One vote through `engine` and `store` as the service's cycle does it:
/// read what it wants, process, sweep to the engine's horizon, write.
fn cycle(store: &Store, engine: &mut Engine, opts: &crate::input::DecodeOptions, line: &str) {
    let mut records = vote_and_encode(store, engine, opts, line.as_bytes());
    if let Some(h) = engine.identity_horizon() {
        records.splice(0..0, store.sweep(h, usize::MAX).unwrap());
    }
    store.apply(&records, &[]).unwrap();
}

/// The sealed deltas (`u` records) an engine's next drain writes.
fn sealed_records(store: &Store, engine: &mut Engine) -> Vec<Record> {
    let mut records = Vec::new();
    store.encode_changes(engine, &mut records).unwrap();
    records.retain(|(k, _)| k[0] == b'u');
    records.sort();
    records
}

/// Format 11: a series' record carries no open value its votes'
/// identities hold; a restore rebuilds them from the identities of the
/// open epoch (the retention sweep keeps those, with a retention of a
/// minute against an hour-long epoch), a tie between two vote times and
/// an identity a later vote took over pin the slot to the series' record,
/// and the restored engine seals exactly what the one that never stopped
/// seals.
#[test]
fn open_values_come_back_from_identities_with_ties_and_a_short_retention() {
    let (mut cfg, opts, dir, _, _) = learned_setup();
    cfg.reputation.epoch_ns = 3600 * 1_000_000_000;
    cfg.retention_ns = 60 * 1_000_000_000;
    let store = Store::open(dir.path()).unwrap();
    let (mut engine, _) = store.load(cfg.clone()).unwrap();
    let line = |inf: &str, voter: &str, id: &str, vote: u8, at: &str| {
        format!(
            r#"{{"inference_id":"{inf}","voter_id":"{voter}","voter_prompt_id":"r","vote":{vote},"vote_id":"{id}","timestamp":"2024-01-01T{at}Z"}}"#
        )
    };
    let series = |inf: &str| SeriesKey {
        inference_id: inf.into(),
        voter_prompt_id: "r".into(),
    };
    let carried = |inf: &str| -> usize {
        let v = store.get(&series_key_bytes(&series(inf))).unwrap().unwrap();
        format::decode_series_open(&v).unwrap().unwrap().len()
    };
    for l in [
        line("i1", "a", "k1", 1, "00:00:01"),
        line("i1", "b", "k2", 0, "00:00:02"),
        // A tie: b's two votes of one time (the later arrival wins).
        line("i1", "b", "k3", 1, "00:00:02"),
        line("i2", "c", "k4", 1, "00:00:03"),
    ] {
        cycle(&store, &mut engine, &opts, &l);
    }
    assert_eq!(carried("i1"), 1, "b's tie is pinned, a's is not");
    assert_eq!(carried("i2"), 0);
    assert_eq!(keys(&store, b"j"), 1);
    // Ten minutes on: every identity is past the retention, and kept.
    cycle(
        &store,
        &mut engine,
        &opts,
        &line("i3", "d", "k5", 1, "00:10:00"),
    );
    assert_eq!(keys(&store, b"d"), 5, "the open epoch's identities stay");
    // k1 again, now forgotten: accepted, its identity names e's vote,
    // and a's value (the slot of k1's old vote time) is pinned.
    cycle(
        &store,
        &mut engine,
        &opts,
        &line("i1", "e", "k1", 0, "00:10:01"),
    );
    assert_eq!(carried("i1"), 2);
    assert_eq!(engine.open_values(), 5);
    // Restored both ways (a point read of each open identity, a scan of
    // all): the same.
    let restore = |scan: bool| {
        SCAN_IDENTITIES.set(Some(scan));
        let (e, _) = store.load(cfg.clone()).unwrap();
        SCAN_IDENTITIES.set(None);
        e
    };
    let (mut restored, mut scanned) = (restore(false), restore(true));
    assert_eq!(restored.open_values(), 5);
    assert_eq!(scanned.open_values(), 5);
    let want = sealed_records(&store, &mut engine);
    assert_eq!(sealed_records(&store, &mut restored), want);
    assert_eq!(sealed_records(&store, &mut scanned), want);

    // The next epoch seals this one: both seal the same deltas, and the
    // sweep may now forget the identities.
    let next = line("i9", "z", "k9", 1, "01:30:00");
    let v = crate::input::decode_vote(next.as_bytes(), &opts).unwrap();
    let wants = restored.wants(&v);
    store.provide(&mut restored, &[wants]).unwrap();
    restored.process(&v, &mut Vec::new());
    let want = sealed_records(&store, &mut restored);
    let mut records = vote_and_encode(&store, &mut engine, &opts, next.as_bytes());
    store.apply(&records, &[]).unwrap();
    records.retain(|(k, _)| k[0] == b'u');
    records.sort();
    assert!(!want.is_empty());
    assert_eq!(records, want);
    // The sealed epoch's identities are still stored: a scan skips them.
    assert_eq!(keys(&store, b"d"), 6);
    assert_eq!(engine.open_values(), 1);
    assert_eq!(restore(false).open_values(), 1);
    assert_eq!(restore(true).open_values(), 1);
    let h = engine.identity_horizon().unwrap();
    store
        .apply(&store.sweep(h, usize::MAX).unwrap(), &[])
        .unwrap();
    assert_eq!(keys(&store, b"d"), 1, "only the new epoch's vote");
}

#[test]
fn store_errors_print_their_cause_once_and_are_not_retried() {
    use crate::error::Classify as _;
    let e = StoreError::Io {
        path: "/s/outbox".into(),
        source: std::io::Error::other("disk full"),
    };
    assert_eq!(crate::error::chain(&e), "cannot write /s/outbox: disk full");
    assert_eq!(e.fault(), crate::error::Fault::Store);
    assert_eq!(e.retry(), crate::error::RetryHint::NoRetry);
    let rocks = match Store::open(std::path::Path::new("/dev/null/x")) {
        Err(e) => e,
        Ok(_) => panic!("a store under /dev/null"),
    };
    let text = crate::error::chain(&rocks);
    assert!(text.starts_with("RocksDB error at /dev/null/x: "), "{text}");
    let cause = std::error::Error::source(&rocks)
        .expect("the RocksDB error")
        .to_string();
    assert_eq!(text.matches(&cause).count(), 1, "{text}");
}

#[test]
fn the_changelog_header_and_the_tagged_formats_follow_the_format_number() {
    assert_eq!(format::HEADER_VALUE, format::FORMAT.to_string().as_bytes());
    for f in format::FIRST_TAGGED..=format::FORMAT {
        assert_eq!(
            format::changelog_is_tagged(Some(f.to_string().as_bytes())).unwrap(),
            true,
            "{f}"
        );
    }
    assert!(!format::changelog_is_tagged(None).unwrap());
    let newer = (format::FORMAT + 1).to_string();
    let older = (format::FIRST_TAGGED - 1).to_string();
    for bad in [newer.as_str(), older.as_str(), "07", "", "x", "+9"] {
        assert!(
            format::changelog_is_tagged(Some(bad.as_bytes())).is_err(),
            "{bad:?}"
        );
    }
}
