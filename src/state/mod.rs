//! Partition state in RocksDB: one database per input partition.
//!
//! The engine reports its changes; [`encode_changes_into`] turns them into
//! key/value records (the same records the service writes to its changelog
//! topic), and [`Store::apply`] writes a set of records and the source
//! position they reflect in one atomic `WriteBatch`.
//!
//! Key layout (first byte is the record kind):
//! - `m`                         → [`Meta`]
//! - `s` len(inf) inf vp         → [`SeriesState`] (prefix-scannable by inference)
//! - `b` postcard([`BatchKey`])  → [`Batch`]
//! - `d` identity (16 bytes BE)  → vote time (i128 LE)
//! - `p` name                    → shell positions (input offset, changelog offset)
//! - `c`, `o`…                   → the service's cycle marker and outbox
//!   (`crate::service::changelog`); stored here, never interpreted here

use std::path::{Path, PathBuf};

use rocksdb::{Direction, IteratorMode, Options, WriteBatch, DB};
use thiserror::Error;

use crate::engine::{Batch, BatchKey, Change, Engine, EngineConfig, Meta, SeriesKey, SeriesState};
use crate::time::Nanos;

/// A state-store failure. All of them are fatal for the partition: the
/// process stops without committing anything partial.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("RocksDB error at {path}: {source}")]
    Rocks {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
    #[error("corrupt state record in {path} (key {key:?}): {why}")]
    Corrupt {
        path: PathBuf,
        key: Vec<u8>,
        why: String,
    },
}

/// One state record: key and value (`None` deletes).
pub type Record = (Vec<u8>, Option<Vec<u8>>);

pub const META_KEY: &[u8] = b"m";

/// Serialises a value the way every state record is stored.
pub fn encode_value<T: serde::Serialize>(v: &T) -> Vec<u8> {
    enc(v)
}

fn series_key_bytes(k: &SeriesKey) -> Vec<u8> {
    let inf = k.inference_id.as_bytes();
    let mut out = Vec::with_capacity(5 + inf.len() + k.voter_prompt_id.len());
    out.push(b's');
    out.extend_from_slice(&(inf.len() as u32).to_be_bytes());
    out.extend_from_slice(inf);
    out.extend_from_slice(k.voter_prompt_id.as_bytes());
    out
}

fn series_prefix(inference_id: &str) -> Vec<u8> {
    let inf = inference_id.as_bytes();
    let mut out = Vec::with_capacity(5 + inf.len());
    out.push(b's');
    out.extend_from_slice(&(inf.len() as u32).to_be_bytes());
    out.extend_from_slice(inf);
    out
}

fn parse_series_key(key: &[u8]) -> Option<SeriesKey> {
    let len = u32::from_be_bytes(key.get(1..5)?.try_into().ok()?) as usize;
    let inf = std::str::from_utf8(key.get(5..5 + len)?).ok()?;
    let vp = std::str::from_utf8(key.get(5 + len..)?).ok()?;
    Some(SeriesKey {
        inference_id: inf.into(),
        voter_prompt_id: vp.into(),
    })
}

fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // postcard only fails on writer errors, which a Vec never has.
    postcard::to_allocvec(v).unwrap_or_default()
}

fn encode_change(c: Change<'_>) -> Record {
    match c {
        Change::Series(k, s) => (series_key_bytes(k), Some(enc(s))),
        Change::Batch(k, b) => {
            let mut key = vec![b'b'];
            key.extend_from_slice(&enc(k));
            (key, b.map(enc))
        }
        Change::Dedupe(id, at) => {
            let mut key = Vec::with_capacity(17);
            key.push(b'd');
            key.extend_from_slice(&id.to_be_bytes());
            (key, at.map(|t| t.to_le_bytes().to_vec()))
        }
        Change::Meta(m) => (META_KEY.to_vec(), Some(enc(m))),
    }
}

/// Turns the engine's pending changes into records, appended to `out`.
pub fn encode_changes_into(engine: &mut Engine, out: &mut Vec<Record>) {
    engine.drain_changes(|c| out.push(encode_change(c)));
}

/// Position name marking a large write in progress (see [`Store::write_all_changes`]).
const INCOMPLETE: &str = "incomplete_write";

/// Progress of a restore, for logs and metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreStats {
    pub series: u64,
    pub batches: u64,
    pub dedupe: u64,
}

/// One partition's RocksDB.
pub struct Store {
    db: DB,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.increase_parallelism(2);
        let db = DB::open(&opts, path).map_err(|source| StoreError::Rocks {
            path: path.to_owned(),
            source,
        })?;
        Ok(Store {
            db,
            path: path.to_owned(),
        })
    }

    /// Opens an existing database read-only (for `inspect`).
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        let opts = Options::default();
        let db =
            DB::open_for_read_only(&opts, path, false).map_err(|source| StoreError::Rocks {
                path: path.to_owned(),
                source,
            })?;
        Ok(Store {
            db,
            path: path.to_owned(),
        })
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

    fn corrupt(&self, key: &[u8], why: impl ToString) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            key: key.to_vec(),
            why: why.to_string(),
        }
    }

    /// Writes `records` and the `positions` in one atomic batch.
    pub fn apply(&self, records: &[Record], positions: &[(&str, i64)]) -> Result<(), StoreError> {
        let mut wb = WriteBatch::default();
        for (k, v) in records {
            match v {
                Some(v) => wb.put(k, v),
                None => wb.delete(k),
            }
        }
        for (name, value) in positions {
            let mut key = vec![b'p'];
            key.extend_from_slice(name.as_bytes());
            wb.put(key, value.to_le_bytes());
        }
        self.db.write(wb).map_err(|e| self.rocks(e))
    }

    /// Writes every pending change of `engine` in bounded batches (memory
    /// stays flat however large the state). A marker written first and
    /// removed last makes an interrupted write detectable: [`Store::load`]
    /// refuses such a directory instead of using half-written state.
    pub fn write_all_changes(&self, engine: &mut Engine) -> Result<(), StoreError> {
        const CHUNK: usize = 50_000;
        self.apply(&[], &[(INCOMPLETE, 1)])?;
        let mut wb = WriteBatch::default();
        let mut err = None;
        engine.drain_changes(|c| {
            if err.is_some() {
                return;
            }
            let (k, v) = encode_change(c);
            match v {
                Some(v) => wb.put(&k, &v),
                None => wb.delete(&k),
            }
            if wb.len() >= CHUNK {
                if let Err(e) = self.db.write(std::mem::take(&mut wb)) {
                    err = Some(e);
                }
            }
        });
        if let Some(e) = err {
            return Err(self.rocks(e));
        }
        self.db.write(wb).map_err(|e| self.rocks(e))?;
        let mut key = vec![b'p'];
        key.extend_from_slice(INCOMPLETE.as_bytes());
        self.db.delete(&key).map_err(|e| self.rocks(e))?;
        self.flush()
    }

    /// A position written by [`Store::apply`].
    pub fn position(&self, name: &str) -> Result<Option<i64>, StoreError> {
        let mut key = vec![b'p'];
        key.extend_from_slice(name.as_bytes());
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

    /// Loads the whole partition into an engine. `progress` is called now and
    /// then with the counts so far.
    pub fn load(
        &self,
        cfg: EngineConfig,
        mut progress: impl FnMut(RestoreStats),
    ) -> Result<(Engine, RestoreStats), StoreError> {
        if self.position(INCOMPLETE)?.is_some() {
            return Err(self.corrupt(
                INCOMPLETE.as_bytes(),
                "a previous run stopped while writing this state; delete the directory and replay again",
            ));
        }
        let mut stats = RestoreStats::default();
        let mut meta = Meta::default();
        let mut series = Vec::new();
        let mut batches = Vec::new();
        let mut dedupe = Vec::new();
        for item in self.db.iterator(IteratorMode::Start) {
            let (k, v) = item.map_err(|e| self.rocks(e))?;
            match k.first() {
                Some(b'm') => {
                    meta = postcard::from_bytes(&v).map_err(|e| self.corrupt(&k, e))?;
                }
                Some(b's') => {
                    let key =
                        parse_series_key(&k).ok_or_else(|| self.corrupt(&k, "bad series key"))?;
                    let s: SeriesState =
                        postcard::from_bytes(&v).map_err(|e| self.corrupt(&k, e))?;
                    series.push((key, s));
                    stats.series += 1;
                }
                Some(b'b') => {
                    let key: BatchKey =
                        postcard::from_bytes(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
                    let b: Batch = postcard::from_bytes(&v).map_err(|e| self.corrupt(&k, e))?;
                    batches.push((key, b));
                    stats.batches += 1;
                }
                Some(b'd') => {
                    let id: [u8; 16] = k[1..]
                        .try_into()
                        .map_err(|_| self.corrupt(&k, "bad dedupe key"))?;
                    let at: [u8; 16] = v
                        .as_ref()
                        .try_into()
                        .map_err(|_| self.corrupt(&k, "bad dedupe value"))?;
                    dedupe.push((u128::from_be_bytes(id), Nanos::from_le_bytes(at)));
                    stats.dedupe += 1;
                }
                Some(b'p' | b'c' | b'o') => {}
                _ => return Err(self.corrupt(&k, "unknown record kind")),
            }
            let n = stats.series + stats.batches + stats.dedupe;
            if n % 100_000 == 0 && n > 0 {
                progress(stats);
            }
        }
        progress(stats);
        Ok((Engine::restore(cfg, meta, series, batches, dedupe), stats))
    }

    /// Every stored series of one inference, in voter_prompt_id order.
    pub fn series_of(
        &self,
        inference_id: &str,
    ) -> Result<Vec<(SeriesKey, SeriesState)>, StoreError> {
        let prefix = series_prefix(inference_id);
        let mut out = Vec::new();
        for item in self
            .db
            .iterator(IteratorMode::From(&prefix, Direction::Forward))
        {
            let (k, v) = item.map_err(|e| self.rocks(e))?;
            if !k.starts_with(&prefix) {
                break;
            }
            let key = parse_series_key(&k).ok_or_else(|| self.corrupt(&k, "bad series key"))?;
            if &*key.inference_id != inference_id {
                continue;
            }
            let s: SeriesState = postcard::from_bytes(&v).map_err(|e| self.corrupt(&k, e))?;
            out.push((key, s));
        }
        Ok(out)
    }

    /// The open batches of one inference (for `inspect`).
    pub fn batches_of(&self, inference_id: &str) -> Result<Vec<(BatchKey, Batch)>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator(IteratorMode::From(b"b", Direction::Forward))
        {
            let (k, v) = item.map_err(|e| self.rocks(e))?;
            if k.first() != Some(&b'b') {
                break;
            }
            let key: BatchKey = postcard::from_bytes(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            if &*key.series.inference_id == inference_id {
                let b: Batch = postcard::from_bytes(&v).map_err(|e| self.corrupt(&k, e))?;
                out.push((key, b));
            }
        }
        Ok(out)
    }
}

/// Whether `dir` is itself a RocksDB database (has a `CURRENT` file).
pub fn is_database(dir: &Path) -> bool {
    dir.join("CURRENT").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
