//! `changelog.rs`'s unit tests.

use super::*;

fn ev(i: u8, bytes: usize) -> OutEvent {
    OutEvent {
        route: Route::ALL[(i % 3) as usize],
        partition: i32::from(i % 2),
        key: Some(vec![i]),
        payload: vec![b'x'; bytes],
    }
}

#[test]
fn a_cycle_without_events_is_one_delivered_marker() {
    let prev = CycleMarker::initial();
    let (records, m) = seal_cycle(&prev, 17, &[], |_, _| Some(5));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].0, CYCLE_KEY);
    assert_eq!(
        m,
        CycleMarker {
            seq: 1,
            next_offset: 17,
            outbox_chunks: 0,
            delivered: true,
            floors: vec![],
        }
    );
}

#[test]
fn outbox_chunks_are_bounded_and_floors_come_from_acks() {
    let prev = CycleMarker {
        seq: 4,
        ..CycleMarker::initial()
    };
    // Three events of 100 KiB: two fit a chunk, the third starts another.
    let events = vec![ev(0, 100 << 10), ev(1, 100 << 10), ev(3, 100 << 10)];
    let acked = |r: Route, p: i32| (r == Route::Scores && p == 0).then_some(41);
    let (records, m) = seal_cycle(&prev, 9, &events, acked);
    assert_eq!(m.seq, 5);
    assert_eq!(m.outbox_chunks, 2);
    assert!(!m.delivered);
    // Floors: one per (route, partition) that has an acknowledgement.
    assert_eq!(m.floors, vec![(Route::Scores, 0, 42)]);
    let keys: Vec<&[u8]> = records.iter().map(|r| r.0.as_slice()).collect();
    assert_eq!(
        keys,
        vec![&outbox_key(0)[..], &outbox_key(1)[..], CYCLE_KEY]
    );
    let first = OutboxChunk::decode(records[0].1.as_ref().unwrap()).unwrap();
    assert_eq!(first.events, events[..2]);
    assert_eq!(first.seq, 5);
    // One event larger than a chunk gets a record of its own.
    let (records, m) = seal_cycle(&prev, 9, &[ev(0, CHUNK_BYTES * 2)], |_, _| None);
    assert_eq!((records.len(), m.outbox_chunks), (2, 1));
}

#[test]
fn records_are_applied_only_at_their_marker() {
    let mut a = CycleApplier::default();
    assert_eq!(a.push(b"s1", Some(b"v")), None);
    assert_eq!(a.push(b"d1", None), None);
    let cycle = a.push(CYCLE_KEY, Some(b"m")).expect("a whole cycle");
    assert_eq!(cycle.len(), 3);
    assert_eq!(cycle[1], (b"d1".to_vec(), None));
    // An interrupted cycle at the end: never applied, its keys reported.
    assert_eq!(a.push(b"s2", Some(b"x")), None);
    assert_eq!(a.push(b"s1", Some(b"y")), None);
    assert_eq!(a.push(b"s2", Some(b"z")), None);
    assert_eq!(a.applied(), 3);
    assert_eq!(a.leftover_keys(), vec![b"s1".to_vec(), b"s2".to_vec()]);
}

/// The live path: chunks in the outbox file, the marker in RocksDB.
/// A file of another cycle, or a torn one, is never used: the chunks
/// then come from RocksDB (where a restore from the changelog puts
/// them), and are an error when RocksDB lacks them too.
#[test]
fn the_outbox_file_holds_the_last_cycle_and_a_bad_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let events: Vec<OutEvent> = (0..5).map(|i| ev(i, CHUNK_BYTES / 2)).collect();
    let (records, marker) = seal_cycle(&CycleMarker::initial(), 7, &events, |_, _| None);
    assert!(marker.outbox_chunks >= 3, "{marker:?}");
    let mut rest = records.clone();
    let values = take_cycle_chunks(&mut rest, marker.outbox_chunks as usize);
    assert_eq!(values.len(), marker.outbox_chunks as usize);
    write_cycle(&store, &values, &rest, &[]).unwrap();
    assert_eq!(read_outbox(&store, &marker).unwrap(), events);
    // Another cycle's file: not taken, and RocksDB has no chunks.
    let next = CycleMarker {
        seq: marker.seq + 1,
        ..marker.clone()
    };
    assert!(matches!(
        read_outbox(&store, &next),
        Err(StoreError::Corrupt { .. })
    ));
    // A torn file (a byte short) is not taken either; chunks restored
    // into RocksDB are.
    let path = store.path().join(OUTBOX_FILE);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    assert!(read_outbox(&store, &marker).is_err());
    store.apply(&records, &[]).unwrap();
    assert_eq!(read_outbox(&store, &marker).unwrap(), events);
    // A flipped byte fails the checksum.
    let mut flipped = bytes.clone();
    flipped[9] ^= 1;
    std::fs::write(&path, &flipped).unwrap();
    assert_eq!(read_outbox_file(store.path()), None);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(read_outbox_file(store.path()).unwrap(), values);
}

/// Only the cycle's own chunks, just before its marker, leave the
/// RocksDB write; an interrupted cycle's outbox records rewritten
/// earlier in the list stay, and an unexpected layout keeps all.
#[test]
fn the_cycles_own_chunks_go_to_the_outbox_file() {
    let rec = |k: Vec<u8>| (k, Some(vec![1u8]));
    let mut records = vec![
        rec(outbox_key(0)),
        rec(b"s1".to_vec()),
        rec(outbox_key(0)),
        rec(outbox_key(1)),
        rec(CYCLE_KEY.to_vec()),
    ];
    let chunks = take_cycle_chunks(&mut records, 2);
    assert_eq!(chunks, vec![vec![1u8], vec![1u8]]);
    assert_eq!(
        records,
        vec![
            rec(outbox_key(0)),
            rec(b"s1".to_vec()),
            rec(CYCLE_KEY.to_vec())
        ]
    );
    // No chunks, too many, or no marker last: nothing is taken.
    for (mut r, n) in [
        (records.clone(), 0),
        (records.clone(), 3),
        (vec![rec(outbox_key(0)), rec(b"s1".to_vec())], 1),
        (Vec::new(), 1),
    ] {
        let before = r.clone();
        assert!(take_cycle_chunks(&mut r, n).is_empty());
        assert_eq!(r, before);
    }
}

/// The outbox file of a build before state format 7 (untagged chunk
/// values, its own name) is read when there is no newer one, and goes
/// once a newer one is written.
#[test]
fn an_outbox_file_of_an_earlier_format_is_read_then_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let events = vec![ev(1, 10), ev(2, 20)];
    let (mut records, marker) = seal_cycle(&CycleMarker::initial(), 3, &events, |_, _| None);
    let chunks = take_cycle_chunks(&mut records, marker.outbox_chunks as usize);
    let untagged: Vec<Vec<u8>> = chunks.iter().map(|c| c[1..].to_vec()).collect();
    write_outbox_file(dir.path(), &untagged).unwrap();
    let legacy = dir.path().join(LEGACY_OUTBOX_FILE);
    std::fs::rename(dir.path().join(OUTBOX_FILE), &legacy).unwrap();
    assert_eq!(read_outbox(&store, &marker).unwrap(), events);
    write_outbox_file(dir.path(), &chunks).unwrap();
    assert!(!legacy.exists());
    assert_eq!(read_outbox(&store, &marker).unwrap(), events);
}

#[test]
fn marker_and_outbox_round_trip_and_refuse_a_stale_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(read_marker(&store).unwrap(), None);
    let events = vec![ev(1, 1), ev(2, 2), ev(3, 3)];
    let (records, marker) = seal_cycle(&CycleMarker::initial(), 42, &events, |_, _| None);
    store.apply(&records, &[]).unwrap();
    assert_eq!(read_marker(&store).unwrap(), Some(marker.clone()));
    assert_eq!(read_outbox(&store, &marker).unwrap(), events);
    // The engine load ignores markers and outbox chunks.
    let cfg = crate::config::Config::load(None).unwrap().engine();
    let (_, stats) = store.load(cfg).unwrap();
    assert_eq!(stats.series, 0);
    // A chunk left from an older cycle is never taken for this one.
    let stale = OutboxChunk {
        seq: marker.seq - 1,
        events: vec![ev(4, 4)],
    };
    store
        .apply(
            &[(outbox_key(0), Some(encode_chunk(stale.seq, &stale.events)))],
            &[],
        )
        .unwrap();
    assert!(matches!(
        read_outbox(&store, &marker),
        Err(StoreError::Corrupt { .. })
    ));
    // An outbox event naming a route that does not exist (a corrupt
    // record) is a store error, not an index panic: seq 1, one event,
    // route 7, partition 0, no key, empty payload.
    store
        .apply(
            &[(outbox_key(0), Some(vec![format::FORMAT, 1, 1, 7, 0, 0, 0]))],
            &[],
        )
        .unwrap();
    let one = CycleMarker {
        seq: 1,
        outbox_chunks: 1,
        ..CycleMarker::initial()
    };
    assert!(matches!(
        read_outbox(&store, &one),
        Err(StoreError::Corrupt { .. })
    ));
    store
        .apply(
            &[(outbox_key(0), Some(vec![format::FORMAT, 1, 1, 2, 0, 0, 0]))],
            &[],
        )
        .unwrap();
    assert_eq!(read_outbox(&store, &one).unwrap()[0].route, Route::Dlq);
    // A marker that does not decode is a store error, not a panic.
    store
        .apply(&[(CYCLE_KEY.to_vec(), Some(vec![0xff; 3]))], &[])
        .unwrap();
    assert!(matches!(
        read_marker(&store),
        Err(StoreError::Corrupt { .. })
    ));
}

/// Routes are stored as their codes, which are the variant indices
/// postcard wrote for the enum in formats 7 to 11 (one byte each): a
/// marker with floors of every route, written by hand in that layout,
/// reads as it is and is written the same.
#[test]
fn routes_are_stored_as_the_codes_earlier_builds_wrote() {
    assert_eq!(Route::ALL.map(Route::stored), [0, 1, 2, 3]);
    for r in Route::ALL {
        assert_eq!(Route::from_stored(r.stored()), Some(r));
    }
    assert_eq!(Route::from_stored(4), None);
    let marker = CycleMarker {
        seq: 1,
        next_offset: -1,
        outbox_chunks: 2,
        delivered: false,
        floors: Route::ALL.iter().map(|&r| (r, 2, 5)).collect(),
    };
    // seq, zigzag(-1), chunks, delivered, 4 floors: code, zigzag(2), zigzag(5).
    let mut bytes = vec![format::FORMAT, 1, 1, 2, 0, 4];
    for code in 0u8..4 {
        bytes.extend([code, 4, 10]);
    }
    assert_eq!(marker.encode(), bytes);
    assert_eq!(CycleMarker::decode(&bytes).unwrap(), marker);
    // An unknown route code in a floor is a corrupt record.
    let mut bad = bytes.clone();
    bad[6] = 9;
    assert!(matches!(
        CycleMarker::decode(&bad),
        Err(FormatError::Code { code: 9, .. })
    ));
}
