//! Bulk writes (replay): the engine's changes written in bounded batches
//! without the write-ahead log, between a start marker and a final flush,
//! in two halves so that the write can run on another thread.

use rocksdb::{WriteBatch, WriteOptions};

use super::{encode_change, position_key, Store, StoreError, INCOMPLETE};
use crate::engine::Engine;
use crate::time::Nanos;

/// Records per write batch of a bulk write.
const BULK_CHUNK: usize = 50_000;

/// A bulk write prepared by [`Store::prepare_bulk`].
pub struct BulkWrite {
    /// Sweep identities before this vote time first.
    horizon: Option<Nanos>,
    batches: Vec<WriteBatch>,
    /// The earliest identity index entry of `batches`.
    earliest: Option<Vec<u8>>,
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
    /// into write batches. The engine's entries are clean afterwards but
    /// must not be evicted before [`Store::write_prepared`] has returned
    /// (replay runs that half on another thread meanwhile).
    pub fn prepare_bulk(&self, engine: &mut Engine, sweep: bool) -> Result<BulkWrite, StoreError> {
        let mut bulk = BulkWrite {
            horizon: engine.identity_horizon().filter(|_| sweep),
            batches: Vec::new(),
            earliest: None,
        };
        let mut wb = WriteBatch::default();
        let mut err = None;
        let mut records = Vec::with_capacity(2);
        self.provide_reviewers(engine)?;
        engine.drain_changes(|c| {
            if err.is_some() {
                return;
            }
            records.clear();
            encode_change(c, &mut records);
            match self.batch_records(&mut wb, &records) {
                Err(e) => err = Some(e),
                Ok(Some(t)) if bulk.earliest.as_ref().is_none_or(|e| t < *e) => {
                    bulk.earliest = Some(t)
                }
                Ok(_) => {}
            }
            if wb.len() >= BULK_CHUNK {
                bulk.batches.push(std::mem::take(&mut wb));
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        bulk.batches.push(wb);
        Ok(bulk)
    }

    /// The second half of [`Store::write_bulk`]: the sweep, then the
    /// prepared batches, in order.
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
                let mut wb = WriteBatch::default();
                self.batch_records(&mut wb, &swept)?;
                self.db.write_opt(wb, opts).map_err(|e| self.rocks(e))?;
            }
        }
        let mut batches = bulk.batches;
        let last = batches.pop().unwrap_or_default();
        for wb in batches {
            self.db.write_opt(wb, opts).map_err(|e| self.rocks(e))?;
        }
        self.write_lowering(last, bulk.earliest, opts)
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
            return self.flush();
        }
        self.write_with(bulk, &WriteOptions::default())?;
        self.db
            .delete(position_key(INCOMPLETE))
            .map_err(|e| self.rocks(e))?;
        self.db.flush_wal(true).map_err(|e| self.rocks(e))
    }
}
