//! Bulk writes (replay): the engine's changes written in bounded batches
//! without the write-ahead log, between a start marker and a final flush,
//! in two halves so that the write can run on another thread.

use rocksdb::{WriteBatch, WriteOptions};

use super::{encode_change, position_key, put_all, sort_puts, Put, Store, StoreError, INCOMPLETE};
use crate::engine::Engine;
use crate::time::Nanos;

/// Records per write batch of a bulk write, and bytes at most.
const BULK_CHUNK: usize = 50_000;
const CHUNK_BYTES: usize = 32 << 20;

/// A bulk write prepared by [`Store::prepare_bulk`].
pub struct BulkWrite {
    /// Sweep identities before this vote time first.
    horizon: Option<Nanos>,
    chunks: Vec<Chunk>,
    /// The newest epoch sealed (see [`super::index::Derived`]).
    sealed: Option<crate::engine::reputation::Epoch>,
}

/// One write batch of a bulk write, its records in a flat buffer (the
/// thread that writes them frees one allocation, not one per key and
/// value); sorted by key only when written, so what a bulk holds beyond
/// its bytes is 8 per record.
#[derive(Default)]
struct Chunk {
    bytes: Vec<u8>,
    /// Per record: its key's and its value's length (`DELETE`: none);
    /// records follow one another in `bytes`.
    lens: Vec<(u32, u32)>,
}

const DELETE: u32 = u32::MAX;

impl BulkWrite {
    fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        let chunk = match self.chunks.last_mut() {
            Some(c) if c.lens.len() < BULK_CHUNK && c.bytes.len() < CHUNK_BYTES => c,
            _ => {
                self.chunks.push(Chunk::default());
                self.chunks.last_mut().expect("just pushed")
            }
        };
        chunk.bytes.extend_from_slice(key);
        chunk.bytes.extend_from_slice(value.unwrap_or_default());
        // Keys and values are far below 4 GiB (a value is one record).
        chunk
            .lens
            .push((key.len() as u32, value.map_or(DELETE, |v| v.len() as u32)));
    }
}

impl Chunk {
    /// The records as (key, value) slices, in the order pushed.
    fn puts(&self) -> Vec<Put<'_>> {
        let mut at = 0;
        self.lens
            .iter()
            .map(|&(k, v)| {
                let key = &self.bytes[at..at + k as usize];
                at += k as usize;
                let value = (v != DELETE).then(|| {
                    at += v as usize;
                    &self.bytes[at - v as usize..at]
                });
                (key, value)
            })
            .collect()
    }
}

impl Store {
    /// Marks the start of a bulk write (replay): until [`Store::finish_bulk`],
    /// [`Store::load`] refuses the directory, since bulk writes skip the
    /// write-ahead log and an interrupted one leaves half-written state.
    pub fn begin_bulk(&self) -> Result<(), StoreError> {
        self.apply(&[], &[(INCOMPLETE, 1)])
    }

    /// Writes the identities `sweep` forgets and then the engine's pending
    /// changes, in bounded batches without the write-ahead log (between
    /// [`Store::begin_bulk`] and [`Store::finish_bulk`], or for a temporary
    /// state).
    pub fn write_bulk(&self, engine: &mut Engine, sweep: bool) -> Result<(), StoreError> {
        let bulk = self.prepare_bulk(engine, sweep)?;
        self.write_prepared(bulk)
    }

    /// The first half of [`Store::write_bulk`]: drains the engine's changes
    /// into a [`BulkWrite`]. The engine's entries are clean afterwards but
    /// must not be evicted before [`Store::write_prepared`] has returned
    /// (replay runs that half on another thread meanwhile).
    pub fn prepare_bulk(&self, engine: &mut Engine, sweep: bool) -> Result<BulkWrite, StoreError> {
        let mut bulk = BulkWrite {
            horizon: engine.identity_horizon().filter(|_| sweep),
            chunks: Vec::new(),
            sealed: None,
        };
        let mut records = Vec::with_capacity(2);
        let mut index = super::index::Derived::default();
        let mut err = None;
        self.provide_reviewers(engine)?;
        engine.drain_changes(|c| {
            records.clear();
            encode_change(c, &mut records);
            for (key, value) in &records {
                bulk.push(key, value.as_deref());
                if let Some(v) = value {
                    index.puts.clear();
                    match self.index_entries(key, v, &mut index) {
                        Ok(()) => index.puts.iter().for_each(|t| bulk.push(t, Some(&[]))),
                        Err(e) => err = Some(e),
                    }
                }
            }
        });
        bulk.sealed = index.sealed;
        match err {
            Some(e) => Err(e),
            None => Ok(bulk),
        }
    }

    /// The second half of [`Store::write_bulk`]: the sweep, then the
    /// prepared records, in key order.
    pub fn write_prepared(&self, bulk: BulkWrite) -> Result<(), StoreError> {
        let mut no_wal = WriteOptions::default();
        no_wal.disable_wal(true);
        self.unlogged
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.write_with(bulk, &no_wal)
    }

    fn write_with(&self, bulk: BulkWrite, opts: &WriteOptions) -> Result<(), StoreError> {
        if let Some(h) = bulk.horizon {
            loop {
                let swept = self.sweep(h, BULK_CHUNK / 2)?;
                if swept.is_empty() {
                    break;
                }
                let puts: Vec<Put<'_>> =
                    swept.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
                let mut wb = WriteBatch::default();
                put_all(&mut wb, &puts);
                self.db.write_opt(wb, opts).map_err(|e| self.rocks(e))?;
            }
        }
        // Each chunk in key order, freed once written; the earliest index
        // entry of all lowers the sweep's start in the last write.
        let mut earliest: Option<Vec<u8>> = None;
        let mut chunks = bulk.chunks.into_iter().peekable();
        while let Some(chunk) = chunks.next() {
            // The batch's bytes: every key and value, and a few bytes of
            // tag and lengths each (sized once, not grown record by record).
            let wb_bytes = chunk.bytes.len() + 12 * chunk.lens.len() + 64;
            let mut puts = chunk.puts();
            if let Some(t) = sort_puts(&mut puts) {
                if earliest.as_ref().is_none_or(|e| t < *e) {
                    earliest = Some(t);
                }
            }
            let mut wb = WriteBatch::with_capacity_bytes(wb_bytes);
            put_all(&mut wb, &puts);
            if chunks.peek().is_none() {
                self.clear_sealed(&mut wb, bulk.sealed);
                return self.write_lowering(wb, earliest, opts);
            }
            self.db.write_opt(wb, opts).map_err(|e| self.rocks(e))?;
        }
        let mut wb = WriteBatch::default();
        self.clear_sealed(&mut wb, bulk.sealed);
        self.write_lowering(wb, earliest, opts)
    }

    /// Ends a bulk write with the engine's remaining changes (and the
    /// sweep), then removes the marker. If every earlier write of the bulk
    /// went to the write-ahead log (a replay that fit in the cache), so do
    /// these, and the log is synced instead of flushing the memtables: a
    /// flush per short replay would add a level-0 file per run, and every
    /// few runs a compaction of the whole state that the exit waits for.
    pub fn finish_bulk(&self, engine: &mut Engine) -> Result<(), StoreError> {
        let bulk = self.prepare_bulk(engine, true)?;
        if self.unlogged.load(std::sync::atomic::Ordering::Relaxed) {
            self.write_prepared(bulk)?;
            self.flush()?;
            self.db
                .delete(position_key(INCOMPLETE))
                .map_err(|e| self.rocks(e))?;
            self.flush()?;
        } else {
            self.write_with(bulk, &WriteOptions::default())?;
            self.db
                .delete(position_key(INCOMPLETE))
                .map_err(|e| self.rocks(e))?;
            self.db.flush_wal(true).map_err(|e| self.rocks(e))?;
        }
        // Durable now: compaction may drop the sealed epochs' open values.
        self.seal_durable();
        Ok(())
    }
}
