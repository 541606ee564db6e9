//! The changelog protocol shared by every delivery mode: each commit cycle
//! of an input partition ends with a [`CycleMarker`] in that partition's
//! changelog, after the cycle's state records (and, in
//! `exactly_once_outbox` mode, its events as outbox chunks). Restore applies
//! records one whole cycle at a time, when the marker arrives
//! ([`CycleApplier`]), so an interrupted cycle is never half applied.
//!
//! Keys (beside the state keys of [`crate::state`], which ignores these):
//! - `c` → [`CycleMarker`]
//! - `o` index (u32 BE) → [`OutboxChunk`]
//!
//! Their values are laid out by the state format
//! (`crate::state::format::StoredMarker`, `encode_outbox_chunk`), like
//! every stored value; the types here convert to and from those layouts
//! (a route as its code, [`Route::stored`]).
//!
//! The live service keeps its last cycle's outbox chunks in a file of the
//! partition's directory ([`OUTBOX_FILE`]) instead of RocksDB, where every
//! cycle's events would be written, flushed and compacted again; a restore
//! from the changelog applies them to RocksDB like any record.
//! [`read_outbox`] takes them from the file when it holds the marker's
//! cycle, else from RocksDB.
//!
//! Everything here but [`read_marker`], [`read_outbox`] and the outbox
//! file is pure.

use std::path::Path;

use crate::output::Route;
use crate::state::format::{self, StoredChunk, StoredEvent, StoredEventRef, StoredMarker};
use crate::state::{FormatError, Record, Store, StoreError};

/// The header every changelog record carries: the state format of its
/// value (a record without it was written before format 7).
pub const CHANGELOG_HEADER: (&str, &[u8]) = (format::HEADER, format::HEADER_VALUE);

/// Key of the [`CycleMarker`].
pub const CYCLE_KEY: &[u8] = b"c";

/// Position name (in RocksDB) of the next changelog offset the store reflects.
pub const CHANGELOG_POS: &str = "changelog";

/// Outbox changelog records hold at most this many event bytes (one larger
/// event gets a record of its own).
pub const CHUNK_BYTES: usize = 256 * 1024;

/// The record that seals one commit cycle of a partition in its changelog
/// (stored as [`StoredMarker`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleMarker {
    /// Cycle number, per partition, from 1.
    pub seq: u64,
    /// The next input offset to process (every earlier record is reflected
    /// in the state); -1 when unknown.
    pub next_offset: i64,
    /// How many outbox chunks (`o0`, `o1`, …) hold this cycle's events.
    pub outbox_chunks: u32,
    /// Whether every event of this cycle is known to be in the output topics.
    pub delivered: bool,
    /// Per output (route, partition): an offset at or below the first
    /// event this cycle wrote there, from earlier acknowledgements.
    pub floors: Vec<(Route, i32, i64)>,
}

impl CycleMarker {
    /// The marker of a partition that has never committed a cycle.
    pub fn initial() -> CycleMarker {
        CycleMarker {
            next_offset: -1,
            delivered: true,
            ..CycleMarker::default()
        }
    }

    /// The marker's value (`state::format::encode_marker`).
    pub fn encode(&self) -> Vec<u8> {
        format::encode_marker(&StoredMarker {
            seq: self.seq,
            next_offset: self.next_offset,
            outbox_chunks: self.outbox_chunks,
            delivered: self.delivered,
            floors: self
                .floors
                .iter()
                .map(|&(route, partition, offset)| (route.stored(), partition, offset))
                .collect(),
        })
    }

    /// A marker's value read back.
    fn decode(v: &[u8]) -> Result<CycleMarker, FormatError> {
        let m = format::decode_marker(v)?;
        let floors = m
            .floors
            .into_iter()
            .map(|(code, partition, offset)| route(code).map(|r| (r, partition, offset)))
            .collect::<Result<Vec<_>, FormatError>>()?;
        Ok(CycleMarker {
            seq: m.seq,
            next_offset: m.next_offset,
            outbox_chunks: m.outbox_chunks,
            delivered: m.delivered,
            floors,
        })
    }
}

/// The route a stored code names; an unknown code is a corrupt record.
fn route(code: u8) -> Result<Route, FormatError> {
    Route::from_stored(code).ok_or(FormatError::Code {
        what: "output route",
        code,
    })
}

/// One event waiting in the outbox: its route, explicit output partition,
/// key and bytes (stored as [`StoredEvent`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OutEvent {
    pub route: Route,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

impl OutEvent {
    /// The event's stored layout, borrowed.
    fn stored(&self) -> StoredEventRef<'_> {
        StoredEventRef {
            route: self.route.stored(),
            partition: self.partition,
            key: self.key.as_deref(),
            payload: &self.payload,
        }
    }

    fn from_stored(e: StoredEvent) -> Result<OutEvent, FormatError> {
        Ok(OutEvent {
            route: route(e.route)?,
            partition: e.partition,
            key: e.key,
            payload: e.payload,
        })
    }
}

/// A slice of one cycle's outbox (stored as [`StoredChunk`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxChunk {
    pub seq: u64,
    pub events: Vec<OutEvent>,
}

impl OutboxChunk {
    /// A chunk's value read back.
    fn decode(v: &[u8]) -> Result<OutboxChunk, FormatError> {
        let StoredChunk { seq, events } = format::decode_outbox_chunk(v)?;
        let events = events
            .into_iter()
            .map(OutEvent::from_stored)
            .collect::<Result<Vec<_>, FormatError>>()?;
        Ok(OutboxChunk { seq, events })
    }
}

/// The value of an outbox chunk of cycle `seq` holding `events`
/// (`state::format::encode_outbox_chunk`), encoded from the slice.
fn encode_chunk(seq: u64, events: &[OutEvent]) -> Vec<u8> {
    format::encode_outbox_chunk(seq, events.iter().map(OutEvent::stored))
}

/// Key of outbox chunk `i`.
pub fn outbox_key(i: u32) -> Vec<u8> {
    let mut k = vec![b'o'];
    k.extend_from_slice(&i.to_be_bytes());
    k
}

/// The file, in a partition's state directory, with the outbox chunks of
/// the last cycle the live service committed (chunk values in the state
/// format, `.7` for the format that tagged them).
pub const OUTBOX_FILE: &str = "jurystream-outbox.7";

/// [`OUTBOX_FILE`] as builds before state format 7 wrote it (untagged
/// chunk values): read when the new one is missing, removed once the new
/// one is written.
const LEGACY_OUTBOX_FILE: &str = "jurystream-outbox";

/// Whether a record is an outbox chunk.
fn is_outbox_key(k: &[u8]) -> bool {
    k.len() == 5 && k[0] == b'o'
}

/// Writes the outbox chunk values `chunks` (in order) to `dir`'s outbox
/// file: a temporary file renamed over it, so a crash leaves the old file
/// or the new one; a CRC-32 at the end finds a torn one. Layout: count
/// (u32 LE), then each chunk's length (u32 LE) and bytes, then the CRC-32
/// of all that (u32 LE). Not synced: like the RocksDB write beside it
/// (no sync either), it survives a process crash, and the changelog holds
/// the chunks for anything worse.
pub fn write_outbox_file(dir: &Path, chunks: &[Vec<u8>]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = dir.join(format!("{OUTBOX_FILE}.tmp"));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let mut crc = crc32fast::Hasher::new();
    let mut put = |bytes: &[u8]| {
        crc.update(bytes);
        file.write_all(bytes)
    };
    put(&(chunks.len() as u32).to_le_bytes())?;
    for c in chunks {
        put(&(c.len() as u32).to_le_bytes())?;
        put(c)?;
    }
    file.write_all(&crc.finalize().to_le_bytes())?;
    file.into_inner().map_err(|e| e.into_error())?;
    std::fs::rename(&tmp, dir.join(OUTBOX_FILE))?;
    match std::fs::remove_file(dir.join(LEGACY_OUTBOX_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes a committed cycle to `store`: its outbox chunks (`chunks`, see
/// [`take_cycle_chunks`]) to the outbox file first, then `records` with
/// `positions` in one RocksDB write, so RocksDB never holds a marker whose
/// chunks are not stored.
pub fn write_cycle(
    store: &Store,
    chunks: &[Vec<u8>],
    records: &[Record],
    positions: &[(&str, i64)],
) -> Result<(), StoreError> {
    if !chunks.is_empty() {
        write_outbox_file(store.path(), chunks).map_err(|source| StoreError::Io {
            path: store.path().join(OUTBOX_FILE),
            source,
        })?;
    }
    store.apply(records, positions)
}

/// Takes a sealed cycle's `n` outbox chunk values out of its records: the
/// `n` records before the marker, the last record (as [`seal_cycle`] ends
/// a cycle). Anything else (no chunks, another layout) leaves the records
/// whole, chunks included, for RocksDB, where [`read_outbox`] finds them
/// too. Outbox records earlier in the list (an interrupted cycle's,
/// rewritten with their committed values) stay for RocksDB.
pub fn take_cycle_chunks(records: &mut Vec<Record>, n: usize) -> Vec<Vec<u8>> {
    let Some(end) = records.len().checked_sub(1) else {
        return Vec::new();
    };
    let Some(start) = end.checked_sub(n) else {
        return Vec::new();
    };
    let layout = records[end].0 == CYCLE_KEY
        && records[start..end]
            .iter()
            .all(|(k, v)| is_outbox_key(k) && v.is_some());
    if n == 0 || !layout {
        return Vec::new();
    }
    records.drain(start..end).filter_map(|(_, v)| v).collect()
}

/// The chunk values of `dir`'s outbox file, in the current state format;
/// `None` when there is none or it does not check out.
fn read_outbox_file(dir: &Path) -> Option<Vec<Vec<u8>>> {
    if let Some(chunks) = read_chunk_file(&dir.join(OUTBOX_FILE)) {
        return Some(chunks);
    }
    let chunks = read_chunk_file(&dir.join(LEGACY_OUTBOX_FILE))?;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let key = outbox_key(i as u32);
            crate::state::current_value(&key, &v, None)
                .ok()
                .map(|v| v.into_owned())
        })
        .collect()
}

/// The chunk values of one outbox file as they are.
fn read_chunk_file(path: &Path) -> Option<Vec<Vec<u8>>> {
    let buf = std::fs::read(path).ok()?;
    let (body, crc) = buf.split_at_checked(buf.len().checked_sub(4)?)?;
    if crc32fast::hash(body).to_le_bytes() != crc {
        return None;
    }
    let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
        let s = body.get(*at..at.checked_add(n)?)?;
        *at += n;
        Some(s)
    };
    let u32_at = |at: &mut usize| -> Option<usize> {
        Some(u32::from_le_bytes(take(at, 4)?.try_into().ok()?) as usize)
    };
    let mut at = 0;
    let count = u32_at(&mut at)?;
    let mut chunks = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let n = u32_at(&mut at)?;
        chunks.push(take(&mut at, n)?.to_vec());
    }
    (at == body.len()).then_some(chunks)
}

/// The records that end a cycle after its state records: the outbox chunks
/// of `events` (none outside outbox mode) and last the new marker, which
/// follows `prev`. `acked(route, partition)` is the highest offset already
/// acknowledged there (the marker's floors for a later reconcile).
pub fn seal_cycle(
    prev: &CycleMarker,
    next_offset: i64,
    events: &[OutEvent],
    acked: impl Fn(Route, i32) -> Option<i64>,
) -> (Vec<Record>, CycleMarker) {
    let seq = prev.seq + 1;
    let mut records = Vec::new();
    let mut floors: Vec<(Route, i32, i64)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    // Chunks are encoded from slices of the events, without copying them.
    let mut first = 0usize;
    let mut bytes = 0usize;
    let mut chunks = 0u32;
    let mut flush = |from: usize, to: usize| {
        records.push((
            outbox_key(chunks),
            Some(encode_chunk(seq, &events[from..to])),
        ));
        chunks += 1;
    };
    for (i, ev) in events.iter().enumerate() {
        if seen.insert((ev.route, ev.partition)) {
            if let Some(o) = acked(ev.route, ev.partition) {
                floors.push((ev.route, ev.partition, o + 1));
            }
        }
        if i > first && bytes + ev.payload.len() > CHUNK_BYTES {
            flush(first, i);
            first = i;
            bytes = 0;
        }
        bytes += ev.payload.len();
    }
    if first < events.len() {
        flush(first, events.len());
    }
    let marker = CycleMarker {
        seq,
        next_offset,
        outbox_chunks: chunks,
        delivered: chunks == 0,
        floors,
    };
    records.push((CYCLE_KEY.to_vec(), Some(marker.encode())));
    (records, marker)
}

/// Collects changelog records in order and hands back a whole cycle when
/// its marker arrives; records after the last marker (an interrupted
/// cycle) are never handed back.
#[derive(Debug, Default)]
pub struct CycleApplier {
    pending: Vec<Record>,
    applied: u64,
}

impl CycleApplier {
    /// One changelog record; `Some(cycle)` when it completes a cycle.
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) -> Option<Vec<Record>> {
        self.pending.push((key.to_vec(), value.map(<[u8]>::to_vec)));
        if key == CYCLE_KEY {
            self.applied += self.pending.len() as u64;
            Some(std::mem::take(&mut self.pending))
        } else {
            None
        }
    }

    /// How many records whole cycles held.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The distinct keys left after the last marker, sorted.
    pub fn leftover_keys(self) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = self.pending.into_iter().map(|(k, _)| k).collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

fn corrupt(store: &Store, key: &[u8], why: impl ToString) -> StoreError {
    StoreError::Corrupt {
        path: store.path().to_owned(),
        key: key.to_vec(),
        why: why.to_string(),
    }
}

/// The last cycle marker in `store`, if any.
pub fn read_marker(store: &Store) -> Result<Option<CycleMarker>, StoreError> {
    match store.get(CYCLE_KEY)? {
        None => Ok(None),
        Some(v) => CycleMarker::decode(&v)
            .map(Some)
            .map_err(|e| corrupt(store, CYCLE_KEY, e)),
    }
}

/// The events of the marker's cycle, in emission order.
pub fn read_outbox(store: &Store, marker: &CycleMarker) -> Result<Vec<OutEvent>, StoreError> {
    if let Some(events) = outbox_from_file(store.path(), marker) {
        return Ok(events);
    }
    let mut out = Vec::new();
    for i in 0..marker.outbox_chunks {
        let key = outbox_key(i);
        let v = store
            .get(&key)?
            .ok_or_else(|| corrupt(store, &key, "outbox chunk missing"))?;
        let chunk = OutboxChunk::decode(&v).map_err(|e| corrupt(store, &key, e))?;
        if chunk.seq != marker.seq {
            return Err(corrupt(
                store,
                &key,
                format!(
                    "outbox chunk of cycle {} under marker {}",
                    chunk.seq, marker.seq
                ),
            ));
        }
        out.extend(chunk.events);
    }
    Ok(out)
}

/// The marker's cycle's events from the outbox file, if it holds that
/// cycle whole.
fn outbox_from_file(dir: &Path, marker: &CycleMarker) -> Option<Vec<OutEvent>> {
    let chunks = read_outbox_file(dir)?;
    if chunks.len() != marker.outbox_chunks as usize {
        return None;
    }
    let mut out = Vec::new();
    for v in chunks {
        let chunk = OutboxChunk::decode(&v).ok()?;
        if chunk.seq != marker.seq {
            return None;
        }
        out.extend(chunk.events);
    }
    Some(out)
}

#[cfg(test)]
mod tests;
