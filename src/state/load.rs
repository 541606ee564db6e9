//! What a partition reads from its store: its open state at a restore
//! ([`Store::load`]), and the series and identities the engine asks for
//! ([`Store::read`], [`Store::provide`]).

use crate::engine::reputation::{Epoch, OpenKey, OpenValue, Terms, TermsKey};
use crate::engine::{Engine, EngineConfig, Meta, SeriesKey, SeriesState, Wants};
use crate::engine::{Held, OpenFold};
use crate::time::Nanos;

use super::index::Epochs;
use super::keys::*;
use super::{format, Store, StoreError, INCOMPLETE, META_KEY};

/// What a load read, for logs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreStats {
    /// Series loaded (those of open batches).
    pub series: u64,
    pub batches: u64,
}

/// Series states and identity times read by [`Store::read`] (`None`: not
/// stored).
#[derive(Debug, Default)]
pub struct Loaded {
    pub(super) series: Vec<(SeriesKey, Option<SeriesState>)>,
    pub(super) identities: Vec<(u128, Option<Nanos>)>,
    /// Keys looked up in RocksDB (series and identities).
    pub keys_read: usize,
}

impl Loaded {
    /// Hands the values to the engine; entries it has cached meanwhile win.
    pub fn provide(self, engine: &mut Engine) {
        for (k, state) in self.series {
            engine.provide_series(k, state);
        }
        for (id, at) in self.identities {
            engine.provide_identity(id, at);
        }
    }
}

/// Keys per RocksDB multi-get (see [`Store::multi_get`]).
pub(super) const MULTI_GET: usize = 256;

impl Store {
    /// Loads what a partition needs in memory: its values, its open batches
    /// and their series. Series and identities stay on disk until a vote
    /// needs them, so this is O(open state), not O(history).
    pub fn load(&self, mut cfg: EngineConfig) -> Result<(Engine, RestoreStats), StoreError> {
        // What the query API reads is kept in every state but a temporary
        // one (a replay without --state-dir), which nobody can query.
        cfg.query_index = self.time_index;
        if self.position(INCOMPLETE)?.is_some() {
            return Err(self.corrupt(
                INCOMPLETE.as_bytes(),
                "a previous run stopped while writing this state; delete the directory and replay again",
            ));
        }
        let meta = match self.get(META_KEY)? {
            Some(v) => self.decoded(META_KEY, &v, format::decode_meta)?,
            None => Meta::default(),
        };
        let mut batches = Vec::new();
        let mut series = Vec::new();
        // The series loaded so far: a waiting batch's series is looked up
        // here (by the hundred thousand after a backlog, so not in `series`).
        let mut loaded = std::collections::HashSet::new();
        for item in self.prefix(b"b") {
            let (k, v) = item?;
            let key = format::parse_batch_key(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            let b = self.decoded(&k, &v, format::decode_batch)?;
            if series
                .last()
                .is_none_or(|(s, _): &(SeriesKey, _)| *s != key.series)
            {
                let sk = series_key_bytes(&key.series);
                let state = self
                    .get(&sk)?
                    .ok_or_else(|| self.corrupt(&sk, "an open batch's series is missing"))?;
                let state = self.decoded(&sk, &state, format::decode_series)?;
                loaded.insert(key.series.clone());
                series.push((key.series.clone(), state));
            }
            batches.push((key, b));
        }
        let mut waiting = Vec::new();
        for item in self.prefix(b"x") {
            let (k, v) = item?;
            let order = k
                .get(1..9)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| self.corrupt(&k, "a pending batch key is not 9 bytes"))?;
            let p = self.decoded(&k, &v, format::decode_pending)?;
            if loaded.insert(p.key.series.clone()) {
                let sk = series_key_bytes(&p.key.series);
                let state = self
                    .get(&sk)?
                    .ok_or_else(|| self.corrupt(&sk, "a pending batch's series is missing"))?;
                series.push((
                    p.key.series.clone(),
                    self.decoded(&sk, &state, format::decode_series)?,
                ));
            }
            waiting.push((order, p));
        }
        let empty = self.prefix(b"s").next().is_none() && self.prefix(b"d").next().is_none();
        let stats = RestoreStats {
            series: series.len() as u64,
            batches: batches.len() as u64,
        };
        let (board, agreement) = if cfg.query_index {
            (self.board_for_load()?, self.agreement()?)
        } else {
            Default::default()
        };
        let (values, deltas) = self.reputation(&cfg, &meta)?;
        let mut engine = Engine::restore(cfg, meta, series, batches, empty);
        engine.restore_reputation(values, deltas, waiting);
        engine.restore_board(board);
        engine.restore_agreement(
            agreement
                .into_iter()
                .map(|(k, s)| (crate::input::Id::from(k), s)),
        );
        Ok((engine, stats))
    }

    /// contract §14's open values (each with where the store holds it besides
    /// its series' value) and this partition's sealed deltas. Tells the
    /// store the epochs (`shadow`, `learned`), and deletes the `j` entries
    /// of the epochs `meta`'s watermark sealed: a changelog restore derives
    /// entries from every series value it applies, sealed values included.
    #[allow(clippy::type_complexity)]
    fn reputation(
        &self,
        cfg: &EngineConfig,
        meta: &Meta,
    ) -> Result<(Vec<(OpenKey, OpenValue, Held)>, Vec<(TermsKey, Terms)>), StoreError> {
        let p = &cfg.reputation;
        // A temporary store's series values carry no open values.
        let indexed = p.collects() && self.time_index;
        let sealed = meta.watermark.filter(|_| indexed).map(|wm| p.sealed_by(wm));
        *self.epochs() = if indexed {
            Epochs::On(p.clone(), sealed.unwrap_or(Epoch::MIN))
        } else {
            Epochs::Off
        };
        if let Some(sealed) = sealed {
            // Synced: a changelog restore just before may have written the
            // meta that seals these epochs, and only a durable seal lets
            // compaction drop their open values (`strip`).
            let mut wb = rocksdb::WriteBatch::default();
            wb.delete_range(&b"j"[..], &open_index_from(sealed + 1)[..]);
            let mut opts = rocksdb::WriteOptions::default();
            opts.set_sync(true);
            self.db.write_opt(wb, &opts).map_err(|e| self.rocks(e))?;
            self.seal_durable();
        }
        // Each unit (a series' values of an epoch) an older record holds,
        // with its values: a format-8 `e` record holds one, a format-9 `h`
        // record all; a `j` entry says the series' value (format 10) holds
        // some. The older records are read while their series' value is
        // older than format 10, which holds them all once written.
        type Older = Vec<(crate::input::Id, OpenValue, Held)>;
        let mut units: std::collections::BTreeMap<(Epoch, SeriesKey), Older> = Default::default();
        for item in self.prefix(b"e") {
            let (k, v) = item?;
            let (epoch, series, voter) =
                format::parse_open_value_key(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            let value = self.decoded(&k, &v, format::decode_open_value)?;
            let unit = units.entry((epoch, series)).or_default();
            unit.push((voter, value, Held::Value));
        }
        for item in self.prefix(b"h") {
            let (k, v) = item?;
            let (epoch, series) =
                format::parse_open_unit_key(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            let held = self.decoded(&k, &v, format::decode_open_unit)?;
            let unit = units.entry((epoch, series)).or_default();
            unit.extend(
                held.into_iter()
                    .flatten()
                    .map(|(voter, v)| (voter, v, Held::Unit)),
            );
        }
        for item in self.prefix(b"j") {
            let (k, _) = item?;
            let unit = parse_open_index_key(&k)
                .ok_or_else(|| self.corrupt(&k, "an open index key is not epoch and series"))?;
            units.entry(unit).or_default();
        }
        let mut series_at = rustc_hash::FxHashMap::default();
        let mut keys = Vec::new();
        for (_, series) in units.keys() {
            series_at.entry(series.clone()).or_insert_with(|| {
                keys.push(series_key_bytes(series));
                keys.len() - 1
            });
        }
        let mut held = Vec::with_capacity(keys.len());
        self.multi_get(&keys, |i, v| {
            let v = v.ok_or_else(|| self.corrupt(&keys[i], "an open unit's series is missing"))?;
            held.push(self.decoded(&keys[i], v, format::decode_series_open)?);
            Ok(())
        })?;
        let mut fold = OpenFold::default();
        for ((epoch, series), older) in units {
            match &held[series_at[&series]] {
                // Each still goes at the seal if an older record holds it.
                Some(all) => {
                    for (_, voter, value) in all.iter().filter(|(e, ..)| *e == epoch) {
                        let kind = older
                            .iter()
                            .find(|(v, ..)| v == voter)
                            .map_or(Held::Series, |&(.., kind)| kind);
                        fold.record((epoch, series.clone(), voter.clone()), *value, kind);
                    }
                }
                None if !older.is_empty() => {
                    for (voter, value, kind) in older {
                        fold.record((epoch, series.clone(), voter), value, kind);
                    }
                }
                None => {
                    return Err(self.corrupt(
                        &series_key_bytes(&series),
                        "a series with open values (a `j` entry) is of a format before 10",
                    ))
                }
            }
        }
        if indexed {
            let from = sealed.map(|s| p.start_of(s + 1));
            self.identities_open(cfg, from, &mut fold)?;
        }
        let values = fold.finish().collect();
        let mut deltas = Vec::new();
        for item in self.prefix(b"u") {
            let (k, v) = item?;
            let key = format::parse_terms_key(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            deltas.push((key, self.decoded(&k, &v, format::decode_terms)?));
        }
        Ok((values, deltas))
    }

    /// The open values the identities of votes at or after `from` (every
    /// vote of an open epoch, and only those: a vote's epoch is its
    /// window's, which starts at or before it, and the retention sweep
    /// keeps them, `Engine::identity_horizon`) hold, into `fold`. Found by
    /// the `t` index and read in multi-gets of [`MULTI_GET`], or, when
    /// they are most of the stored identities ([`Store::scans_identities`]),
    /// by one scan of them all.
    fn identities_open(
        &self,
        cfg: &EngineConfig,
        from: Option<Nanos>,
        fold: &mut OpenFold,
    ) -> Result<(), StoreError> {
        let start = from.map_or_else(|| b"t".to_vec(), |at| time_index_key(at, &[]));
        let mut add = |key: &[u8], v: &[u8]| {
            let at = self.identity_time(key, v)?;
            if from.is_some_and(|from| at < from) {
                // (Only a scan meets these.)
                return Ok(());
            }
            let vote = self.decoded(key, v, format::decode_identity_vote)?;
            if let Some((series, voter, Some(value))) = vote {
                let epoch = cfg.reputation.epoch_of(cfg.window_start(at));
                let value = OpenValue {
                    timestamp: at,
                    value,
                };
                fold.identity((epoch, series, voter), value);
            }
            Ok::<_, StoreError>(())
        };
        if self.scans_identities(&start) {
            for item in self.prefix(b"d") {
                let (k, v) = item?;
                add(&k, &v)?;
            }
            return Ok(());
        }
        let mut keys = Vec::with_capacity(MULTI_GET);
        let mut read = |keys: &mut Vec<Vec<u8>>| {
            // An identity accepted again since (its `t` entry goes in the
            // same write) or swept: nothing here.
            self.multi_get(keys, |i, v| v.map_or(Ok(()), |v| add(&keys[i], v)))?;
            keys.clear();
            Ok::<_, StoreError>(())
        };
        for k in self.time_index(&start, b"u") {
            let k = k?;
            keys.push([&b"d"[..], &k[17..]].concat());
            if keys.len() == MULTI_GET {
                read(&mut keys)?;
            }
        }
        read(&mut keys)
    }

    /// Whether the identities from the `t` key `start` on are so large a
    /// share of all (by RocksDB's estimate of the `t` index's files) that
    /// one sequential scan of every identity reads them faster than a
    /// point read each: a point read costs five to six times a scanned
    /// record's (docs/PERFORMANCE.md, "Format 11"), so scan from a quarter
    /// on. A store restored within a few epochs of its start, or with a
    /// retention near the epoch's length, scans; one with the default 30
    /// days of identities behind day-long epochs reads points. (Files
    /// only: what a restart replays from the log into the memtable is
    /// not counted, a small store's either way.)
    fn scans_identities(&self, start: &[u8]) -> bool {
        #[cfg(test)]
        if let Some(scan) = super::tests::SCAN_IDENTITIES.get() {
            return scan;
        }
        let sizes = self.db.get_approximate_sizes(&[
            rocksdb::Range::new(b"t", start),
            rocksdb::Range::new(start, b"u"),
        ]);
        let (older, open) = (sizes[0], sizes[1]);
        older <= 3 * open
    }

    /// Hands the engine what `wants` name, read from the store (one
    /// multi-get per kind). Keys are deduplicated by the caller or not: a
    /// second provide of the same key is ignored. Returns how many keys
    /// were looked up in RocksDB.
    pub fn provide(&self, engine: &mut Engine, wants: &[Wants]) -> Result<usize, StoreError> {
        let loaded = self.read(wants)?;
        let keys = loaded.keys_read;
        loaded.provide(engine);
        Ok(keys)
    }

    /// What `wants` name, read from the store (see [`Loaded::provide`]).
    /// Series first, each once: the identity of a vote whose series the
    /// store lacks is not read, since a stored identity implies its stored
    /// series (an accepted vote creates its series, and a cycle writes
    /// both) and the shell asks only for series the cache lacks.
    pub fn read(&self, wants: &[Wants]) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded::default();
        let mut unique = rustc_hash::FxHashSet::default();
        let series: Vec<&SeriesKey> = wants
            .iter()
            .filter_map(|w| w.series.as_ref())
            .filter(|k| unique.insert(*k))
            .collect();
        let keys: Vec<Vec<u8>> = series.iter().map(|k| series_key_bytes(k)).collect();
        let mut absent = rustc_hash::FxHashSet::default();
        self.multi_get(&keys, |i, v| {
            match v {
                Some(v) => {
                    let state = self.decoded(&keys[i], v, format::decode_series)?;
                    loaded.series.push((series[i].clone(), Some(state)));
                }
                None => {
                    absent.insert(series[i]);
                }
            }
            Ok(())
        })?;
        let ids: Vec<u128> = wants
            .iter()
            .filter(|w| !w.series.as_ref().is_some_and(|k| absent.contains(k)))
            .filter_map(|w| w.identity)
            .collect();
        let keys: Vec<Vec<u8>> = ids.iter().map(|&id| identity_key(id)).collect();
        loaded.keys_read = series.len() + keys.len();
        self.multi_get(&keys, |i, v| {
            let at = v.map(|v| self.identity_time(&keys[i], v)).transpose()?;
            loaded.identities.push((ids[i], at));
            Ok(())
        })?;
        Ok(loaded)
    }

    /// Looks `keys` up in slices of [`MULTI_GET`] and calls `f(index,
    /// value)` for each in order. One multi-get over many keys pins a data
    /// block per key until it returns: a sweep of 100 000 identities pinned
    /// 60 MiB past the block cache's budget.
    pub(super) fn multi_get(
        &self,
        keys: &[Vec<u8>],
        mut f: impl FnMut(usize, Option<&[u8]>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        for (c, slice) in keys.chunks(MULTI_GET).enumerate() {
            for (j, v) in self.db.multi_get(slice).into_iter().enumerate() {
                f(c * MULTI_GET + j, v.map_err(|e| self.rocks(e))?.as_deref())?;
            }
        }
        Ok(())
    }
}
