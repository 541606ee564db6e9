//! Partition state in RocksDB: one database per input partition.
//!
//! The engine reports its changes; [`Store::encode_changes`] turns them into
//! key/value records (the same records the service writes to its changelog
//! topic), and [`Store::apply`] writes a set of records and the source
//! position they reflect in one atomic `WriteBatch`.
//!
//! The store is the state; the engine caches part of it. Only the
//! partition values and open batches are loaded at start ([`Store::load`]);
//! series and identities are read when a vote needs them
//! ([`Store::provide`]).
//!
//! How values are stored, and which format wrote them, is [`format`]'s
//! (formats before 7 are read by `legacy` only, to upgrade them).
//!
//! Key layout (first byte is the record kind):
//! - `m`                         → [`Meta`]
//! - `s` len(inf) inf vp         → [`SeriesState`] (prefix-scannable by
//!   inference), then (format 10) its contract §14 open values of every epoch:
//!   (epoch, reviewer, vote time, value) each
//! - `b` postcard([`BatchKey`])  → [`Batch`]
//! - `d` identity (16 bytes BE)  → vote time (i128 LE), then (format 9,
//!   `query_index`) postcard(inf, vp, voter) of the vote
//! - `t` time key (16) identity  → empty: local index of `d` by vote time,
//!   written by [`Store::apply`] with every `d` put, never sent anywhere;
//!   [`Store::sweep`] walks it to forget identities past the retention
//! - `v` len(inf) inf len(vp) vp voter → empty: the series' voters (query
//!   API); format 9 on, written by [`Store::apply`] with every `d` put that
//!   carries its vote's series and voter, and sent by [`Store::sweep`] only
//!   when it forgets that identity
//! - `l` postcard(`BoardKey`)   → `BoardRow`: the partition's leaderboard (`board.rs`)
//! - `e` postcard(epoch, inf, vp, voter) → contract §14 open value (vote time, value),
//!   format 8; read while the series' value is older than 10, deleted at
//!   the epoch's seal
//! - `h` postcard(epoch, inf, vp) → contract §14 a series' open values of an
//!   epoch: (reviewer, vote time, value) each (format 9; read while the
//!   series' value is older than 10, deleted at the epoch's seal)
//! - `j` epoch (16, order-preserving) len(inf) inf vp → empty: local index
//!   of the series values that hold open values of an epoch (format 10),
//!   derived by [`Store::apply`] from every such series put, never sent;
//!   an epoch's entries go as one range when a watermark seals it
//! - `u` postcard(vp, epoch, voter) → contract §14 sealed delta of this partition (n, q, h)
//! - `x` close order (u64 BE)    → contract §14 closed batch waiting at the barrier
//! - `p` name                    → shell positions (input offset, changelog offset)
//! - `c`, `o`…                   → the service's cycle marker and outbox
//!   (`crate::service::changelog`); laid out by `format` (`format/service.rs`),
//!   never interpreted here

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rocksdb::{
    BlockBasedOptions, Cache, Direction, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteBufferManager, WriteOptions, DB,
};
use thiserror::Error;

use crate::engine::agreement::{ReviewerStats, RubricSums};
use crate::engine::{Batch, BatchKey, Engine, SeriesKey, SeriesState};
use crate::time::Nanos;
use index::{Derived, Epochs};

mod board;
mod bulk;
pub mod format;
mod index;
mod keys;
mod legacy;
mod load;
pub use load::{Loaded, RestoreStats};
mod query;
mod strip;
mod upgrade;
pub use bulk::BulkWrite;
pub use format::FormatError;
pub use keys::META_KEY;
use keys::*;
use upgrade::{FORMAT_POS, TAGGED_VERSION};

/// A state-store failure. All of them are fatal for the partition: the
/// process stops without committing anything partial.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("RocksDB error at {path}")]
    Rocks {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
    #[error("cannot write {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt state record in {path} (key {key:?}): {why}")]
    Corrupt {
        path: PathBuf,
        key: Vec<u8>,
        why: String,
    },
}

/// Every state-store failure is the store's and is not retried: the
/// process stops without committing anything partial (a directory held by
/// another process is free again once it exits).
impl crate::error::Classify for StoreError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::Store
    }

    fn retry(&self) -> crate::error::RetryHint {
        crate::error::RetryHint::NoRetry
    }
}

/// A stored key and value, as RocksDB's iterator returns them.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// One state record: key and value (`None` deletes).
pub type Record = (Vec<u8>, Option<Vec<u8>>);

/// Position name marking a bulk write in progress (see [`Store::begin_bulk`]).
const INCOMPLETE: &str = "incomplete_write";

/// Most identities one [`Store::sweep`] call forgets (bounds a cycle's work).
pub const SWEEP_LIMIT: usize = 10_000;

/// RocksDB's memory, one budget for the process: the block cache shared by
/// every partition's database (index, filter and data blocks) is also
/// charged the memtables of all of them (see [`write_buffers`]), so that
/// neither grows with the number of partitions.
const ROCKSDB_MEMORY: usize = 32 << 20;
/// Memtables of all partitions: a flush starts once they reach this.
const MEMTABLES: usize = 16 << 20;

fn block_cache() -> &'static Cache {
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| Cache::new_lru_cache(ROCKSDB_MEMORY))
}

/// Memtables of every partition, charged to [`block_cache`]. Not stalling
/// writes: a flush starts early instead, and each database still holds at
/// most `max_write_buffer_number` memtables.
fn write_buffers() -> &'static WriteBufferManager {
    static WBM: std::sync::OnceLock<WriteBufferManager> = std::sync::OnceLock::new();
    WBM.get_or_init(|| {
        WriteBufferManager::new_write_buffer_manager_with_cache(
            MEMTABLES,
            false,
            block_cache().clone(),
        )
    })
}

/// Options of a partition database: bloom filters so that looking up a
/// new vote's identity (the common case, a miss) rarely reads a block;
/// small memtables so that memory stays flat with many partitions.
fn options(temporary: bool, sealed: &strip::Sealed) -> Options {
    let mut bb = BlockBasedOptions::default();
    bb.set_bloom_filter(10.0, false);
    bb.set_whole_key_filtering(true);
    bb.set_cache_index_and_filter_blocks(true);
    // Partitioned filters and index: a lookup reads one small filter
    // partition (cached, high priority) instead of the whole filter block
    // of a large file. Whole filter blocks did not stay in the cache and
    // were read and checksummed from disk on every lookup, which made a long
    // replay slower the larger its state.
    bb.set_partition_filters(true);
    bb.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    bb.set_pin_top_level_index_and_filter(true);
    bb.set_cache_index_and_filter_blocks_with_high_priority(true);
    bb.set_pin_l0_filter_and_index_blocks_in_cache(true);
    bb.set_block_cache(block_cache());
    let mut opts = Options::default();
    opts.create_if_missing(true);
    // A temporary state (replay without --state-dir) lives for one run:
    // compressing what is read back and deleted soon is CPU for nothing.
    opts.set_compression_type(if temporary {
        rocksdb::DBCompressionType::None
    } else {
        rocksdb::DBCompressionType::Lz4
    });
    opts.increase_parallelism(2);
    opts.set_block_based_table_factory(&bb);
    // Prefix blooms (memtable and files) on the inference of series and
    // voter keys: the query API asks every partition for an inference, and
    // the partitions without it answer from their filters. Point lookups
    // keep their whole-key filters; every other scan is a total-order one
    // (`Store::scan`).
    opts.set_prefix_extractor(rocksdb::SliceTransform::create(
        "jurystream.inference.v1",
        inference_prefix,
        Some(in_inference_domain),
    ));
    // The memtable's bloom is sized by `write_buffer_size` (here 2 %: 335
    // KiB, over 20 bits a key even for a full memtable) and counted in
    // MEMTABLES: at 10 % four partitions' blooms took 6.4 of its 16 MiB, so
    // memtables were flushed small and compacted often, and every new one
    // cleared 1.6 MiB (docs/PERFORMANCE.md, "What made it fast").
    opts.set_memtable_prefix_bloom_ratio(0.02);
    opts.set_memtable_whole_key_filtering(true);
    opts.set_write_buffer_size(16 << 20);
    opts.set_max_write_buffer_number(3);
    // Memtables are flushed small (a few MiB: every partition shares
    // MEMTABLES) and each level-0 compaction rewrites the level below
    // whole, so compacting every 8 files instead of 4 halves that rewrite
    // (docs/PERFORMANCE.md, "What made it fast"). Lookups check at most 8 level-0
    // filters, which stay pinned in the cache.
    opts.set_level_zero_file_num_compaction_trigger(8);
    opts.set_write_buffer_manager(write_buffers());
    // A temporary state's series values carry no open values.
    if !temporary {
        opts.set_compaction_filter_factory(strip::StripFactory(sealed.clone()));
    }
    opts
}

/// One partition's RocksDB.
pub struct Store {
    db: DB,
    path: PathBuf,
    /// Where the next [`Store::sweep`] starts: index entries before it are
    /// deleted (or this store object is dropped with its cycle), and
    /// starting past their tombstones keeps each sweep O(its work).
    sweep_from: std::sync::Mutex<Vec<u8>>,
    /// Whether identity puts are indexed by vote time (`false` for a
    /// temporary state, which is never swept).
    time_index: bool,
    /// Whether a write skipped the write-ahead log (see
    /// [`Store::finish_bulk`]).
    unlogged: std::sync::atomic::AtomicBool,
    /// A read-only look into a directory of a format before 7, which it
    /// cannot upgrade: values are read through `legacy`.
    legacy: bool,
    /// contract §14's epochs, as a load tells them.
    epochs: std::sync::Mutex<Epochs>,
    /// The newest epoch whose seal is durable here: compaction takes the
    /// open values of it and older epochs out of series values.
    sealed: strip::Sealed,
}

impl Store {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, false)
    }

    /// Opens a new database at `path` for the length of one replay, which
    /// removes it afterwards: identities are not indexed for the sweep
    /// (the engine ignores those past the retention either way), and
    /// blocks are not compressed.
    pub fn open_temporary(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, true)
    }

    fn open_with(path: &Path, temporary: bool) -> Result<Store, StoreError> {
        let sealed = strip::Sealed::default();
        let db =
            DB::open(&options(temporary, &sealed), path).map_err(|source| StoreError::Rocks {
                path: path.to_owned(),
                source,
            })?;
        let store = Store {
            db,
            path: path.to_owned(),
            sweep_from: std::sync::Mutex::new(b"t".to_vec()),
            time_index: !temporary,
            unlogged: false.into(),
            legacy: false,
            epochs: Default::default(),
            sealed,
        };
        store.upgrade()?;
        if let Some(v) = store.get(SWEEP_KEY)? {
            let from = store.decoded(SWEEP_KEY, &v, format::decode_sweep)?;
            *store.sweep_from.lock().unwrap_or_else(|p| p.into_inner()) = from;
        }
        Ok(store)
    }

    /// Opens an existing database read-only (for `inspect`).
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        let opts = Options::default();
        let db =
            DB::open_for_read_only(&opts, path, false).map_err(|source| StoreError::Rocks {
                path: path.to_owned(),
                source,
            })?;
        let mut store = Store {
            db,
            path: path.to_owned(),
            sweep_from: std::sync::Mutex::new(b"t".to_vec()),
            time_index: true,
            unlogged: false.into(),
            legacy: false,
            epochs: Default::default(),
            sealed: Default::default(),
        };
        store.legacy = store.position(FORMAT_POS)?.unwrap_or(0) < TAGGED_VERSION;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rocks(&self, source: rocksdb::Error) -> StoreError {
        StoreError::Rocks {
            path: self.path.clone(),
            source,
        }
    }

    /// The fatal error for an inconsistency the engine met (it names the
    /// series' key in this store).
    pub fn inconsistent(&self, i: crate::engine::Inconsistency) -> StoreError {
        self.corrupt(&keys::series_key_bytes(&i.series), i.what)
    }

    fn corrupt(&self, key: &[u8], why: impl ToString) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            key: key.to_vec(),
            why: why.to_string(),
        }
    }

    fn write(&self, wb: WriteBatch) -> Result<(), StoreError> {
        self.db.write(wb).map_err(|e| self.rocks(e))
    }

    /// `v`, stored under `key`, decoded by `f` (a `format::decode_…`).
    /// A read-only look into a directory not upgraded yet reads its values
    /// through `legacy`.
    fn decoded<T>(
        &self,
        key: &[u8],
        v: &[u8],
        f: fn(&[u8]) -> Result<T, FormatError>,
    ) -> Result<T, StoreError> {
        let upgraded;
        let v = if self.legacy {
            upgraded = legacy::upgrade(key, v).map_err(|e| self.corrupt(key, e))?;
            &upgraded[..]
        } else {
            v
        };
        f(v).map_err(|e| self.corrupt(key, e))
    }

    /// Turns the engine's pending changes into records, appended to `out`,
    /// after reading the stored numbers of the reviewers they change (a
    /// reviewer record is a whole value, see [`Engine::reviewers_unknown`]).
    pub fn encode_changes(
        &self,
        engine: &mut Engine,
        out: &mut Vec<Record>,
    ) -> Result<(), StoreError> {
        self.provide_reviewers(engine)?;
        engine.drain_changes(|c| encode_change(c, out));
        Ok(())
    }

    /// Reads the reviewers the engine changed but has not seen stored.
    pub(crate) fn provide_reviewers(&self, engine: &mut Engine) -> Result<(), StoreError> {
        let wanted = engine.reviewers_unknown();
        if wanted.is_empty() {
            return Ok(());
        }
        let keys: Vec<Vec<u8>> = wanted
            .iter()
            .map(|(rubric, voter)| reviewer_key(rubric, voter))
            .collect();
        self.multi_get(&keys, |i, v| {
            let stats = v
                .map(|v| self.decoded(&keys[i], v, format::decode_reviewer))
                .transpose()?;
            engine.provide_reviewer(&wanted[i], stats);
            Ok(())
        })
    }

    /// The partition's agreement sums per rubric, in rubric byte order.
    pub fn agreement(&self) -> Result<Vec<(String, RubricSums)>, StoreError> {
        let mut out = Vec::new();
        for item in self.prefix(b"g") {
            let (k, v) = item?;
            let rubric = std::str::from_utf8(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            let sums = self.decoded(&k, &v, format::decode_rubric_sums)?;
            out.push((rubric.to_owned(), sums));
        }
        Ok(out)
    }

    /// Iterates the records whose key starts with `prefix`, in key order
    /// (a total-order scan bounded by the prefix).
    fn prefix<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = Result<KeyValue, StoreError>> + 'a {
        self.scan(prefix, false)
    }

    /// [`Store::prefix`] for a prefix that extends an inference prefix
    /// (`s`/`v` + id): a partition without that inference answers from its
    /// prefix filters without reading a data block.
    fn inference_scan<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = Result<KeyValue, StoreError>> + 'a {
        debug_assert!(in_inference_domain(prefix));
        self.scan(prefix, true)
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a [u8],
        by_inference: bool,
    ) -> impl Iterator<Item = Result<KeyValue, StoreError>> + 'a {
        let mut opts = ReadOptions::default();
        if by_inference {
            opts.set_prefix_same_as_start(true);
        } else {
            opts.set_total_order_seek(true);
        }
        if let Some(end) = prefix_end(prefix) {
            opts.set_iterate_upper_bound(end);
        }
        self.db
            .iterator_opt(IteratorMode::From(prefix, Direction::Forward), opts)
            .map(|r| r.map_err(|e| self.rocks(e)))
            .take_while(move |r| r.as_ref().map_or(true, |(k, _)| k.starts_with(prefix)))
    }

    fn identity_time(&self, key: &[u8], v: &[u8]) -> Result<Nanos, StoreError> {
        self.decoded(key, v, format::decode_identity)
    }

    /// Writes `records` and the `positions` in one atomic batch (with the
    /// local entries they imply: see [`Store::index_entries`]).
    pub fn apply(&self, records: &[Record], positions: &[(&str, i64)]) -> Result<(), StoreError> {
        let mut derived = Derived::default();
        for (k, v) in records {
            if let Some(v) = v {
                self.index_entries(k, v, &mut derived)?;
            }
        }
        let mut all: Vec<Put<'_>> = records
            .iter()
            .map(|(k, v)| (&k[..], v.as_deref()))
            .chain(derived.puts.iter().map(|t| (&t[..], Some(&[][..]))))
            .collect();
        let earliest = sort_puts(&mut all);
        let mut wb = WriteBatch::default();
        put_all(&mut wb, &all);
        let sealed = self.clear_sealed(&mut wb, derived.sealed);
        for (name, value) in positions {
            wb.put(position_key(name), value.to_le_bytes());
        }
        // The write that seals an epoch (once an epoch) is synced, and only
        // then may compaction drop the epoch's open values (`strip`).
        let mut opts = WriteOptions::default();
        opts.set_sync(sealed.is_some());
        self.write_lowering(wb, earliest, &opts)?;
        if sealed.is_some() {
            self.seal_durable();
        }
        Ok(())
    }

    /// Writes `wb`; an index entry in it before the sweep's start (`earliest`,
    /// a vote time already past the horizon) moves the start back, in the
    /// same write.
    fn write_lowering(
        &self,
        mut wb: WriteBatch,
        earliest: Option<Vec<u8>>,
        opts: &WriteOptions,
    ) -> Result<(), StoreError> {
        let mut from = self.sweep_from.lock().unwrap_or_else(|p| p.into_inner());
        let lower = earliest.filter(|t| *t < *from);
        if let Some(t) = &lower {
            wb.put(SWEEP_KEY, format::encode_sweep(t));
        }
        self.db.write_opt(wb, opts).map_err(|e| self.rocks(e))?;
        if let Some(t) = lower {
            *from = t;
        }
        Ok(())
    }

    /// A position written by [`Store::apply`].
    pub fn position(&self, name: &str) -> Result<Option<i64>, StoreError> {
        let key = position_key(name);
        match self.db.get(&key).map_err(|e| self.rocks(e))? {
            None => Ok(None),
            Some(v) => {
                let arr: [u8; 8] = v
                    .as_slice()
                    .try_into()
                    .map_err(|_| self.corrupt(&key, "position is not 8 bytes"))?;
                Ok(Some(i64::from_le_bytes(arr)))
            }
        }
    }

    /// One raw value.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get(key).map_err(|e| self.rocks(e))
    }

    /// Flushes memtables to disk (before a checkpoint or at shutdown).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| self.rocks(e))
    }

    /// The `t` index keys from `from` up to `to` (excluded), in order,
    /// each checked to be one.
    pub(super) fn time_index<'a>(
        &'a self,
        from: &[u8],
        to: &[u8],
    ) -> impl Iterator<Item = Result<Box<[u8]>, StoreError>> + 'a {
        let mut opts = ReadOptions::default();
        opts.set_total_order_seek(true);
        opts.set_iterate_lower_bound(from);
        opts.set_iterate_upper_bound(to);
        self.db
            .iterator_opt(IteratorMode::From(from, Direction::Forward), opts)
            .map(|item| {
                let (k, _) = item.map_err(|e| self.rocks(e))?;
                if k.len() != 33 || k[0] != b't' {
                    return Err(self.corrupt(&k, "bad identity index key"));
                }
                Ok(k)
            })
    }

    /// Records that forget up to `limit` identities whose vote time is
    /// before `horizon` (contract §4 retention): deletes of the identity and of
    /// its index entry, and, for an identity that carries its vote's series
    /// and voter (format 9), a put of that voter's `v` key: derived from
    /// the identity until now, the key must outlive it on the changelog
    /// (compaction drops the identity's record after its delete). Every
    /// index entry is current (an identity accepted again deletes its old
    /// entry, see [`Change::Dedupe`]). The last record moves the sweep's
    /// start (kept across restarts) past them. Apply them before the
    /// cycle's engine changes, so that an identity accepted again in the
    /// same cycle stays.
    pub fn sweep(&self, horizon: Nanos, limit: usize) -> Result<Vec<Record>, StoreError> {
        let mut from = self.sweep_from.lock().unwrap_or_else(|p| p.into_inner());
        let mut index = Vec::new();
        for k in self
            .time_index(&from, &time_index_key(horizon, &[]))
            .take(limit)
        {
            index.push(k?);
        }
        let identities: Vec<Vec<u8>> = index
            .iter()
            .map(|t| [&b"d"[..], &t[17..]].concat())
            .collect();
        let mut out = Vec::with_capacity(2 * index.len() + 1);
        self.multi_get(&identities, |i, v| {
            if let Some(v) = v {
                if let Some((series, voter)) =
                    self.decoded(&identities[i], v, format::decode_identity_voter)?
                {
                    out.push((voter_key(&series, &voter), Some(Vec::new())));
                }
            }
            Ok(())
        })?;
        // Below the horizon everything is swept unless the limit stopped
        // the walk.
        let next = match index.last() {
            Some(k) if index.len() == limit => k.to_vec(),
            _ => time_index_key(horizon, &[]),
        };
        for (d, t) in identities.into_iter().zip(index) {
            out.push((d, None));
            out.push((t.to_vec(), None));
        }
        if next > *from {
            *from = next.clone();
            out.push((SWEEP_KEY.to_vec(), Some(format::encode_sweep(&next))));
        }
        Ok(out)
    }
}

/// A changelog record's value in this build's format: as it is when its
/// format header ([`format::HEADER`]) says it is tagged, else (a record a
/// build before format 7 wrote, untagged) rewritten by `legacy`.
pub fn current_value<'a>(
    key: &[u8],
    value: &'a [u8],
    header: Option<&[u8]>,
) -> Result<std::borrow::Cow<'a, [u8]>, FormatError> {
    if format::changelog_is_tagged(header)? {
        Ok(std::borrow::Cow::Borrowed(value))
    } else {
        legacy::upgrade(key, value).map(std::borrow::Cow::Owned)
    }
}

/// Whether `dir` is itself a RocksDB database (has a `CURRENT` file).
pub fn is_database(dir: &Path) -> bool {
    dir.join("CURRENT").is_file()
}

#[cfg(test)]
mod tests;
