//! The pure core (contract §2–§4): windows, watermark, batches, supersede,
//! duplicates and scoring for one input partition.
//!
//! Time is always an argument: nothing here reads a clock, touches RocksDB,
//! Kafka or tokio. The shells (`replay`, `service`) feed votes in, take the
//! events out, and persist what [`Engine::drain_changes`] reports.

pub mod agreement;
pub mod board;
mod cache;
mod identity;
mod memory;

pub use cache::Wants;
pub mod score;

pub use identity::{derived_vote_id, vote_identity};

mod close;
mod learn;
mod persisted;
pub mod reputation;

pub use persisted::{Batch, BatchKey, Entry, Meta, Pending, SeriesKey, SeriesState};
mod changes;
mod config;
mod update;
pub use changes::{Change, Voted};
pub use config::{Decay, EngineConfig, Models, RubricParams};
pub use update::{Counted, Forecast, Learned, Outcome, ScoreUpdate};

use crate::input::Id;
use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::input::{Reason, Rejection, Vote};
use crate::time::{format_timestamp, Nanos, NANOS_PER_SEC};
use agreement::{ReviewerKey, RubricSums};
use board::{BoardKey, BoardRow, Placement};
use cache::{IdKey, IdentityEntry, SeriesEntry};
pub use learn::{Held, InSeries, OpenFold, OpenValues};
use learn::{PendingSlot, Shared};
use reputation::{Epoch, OpenKey, OpenValue, Tables, Terms, TermsKey};

/// An open batch with its key.
struct OpenBatch {
    key: BatchKey,
    batch: Batch,
}

/// Adds an open batch to `batches` and to its window's list.
fn insert_batch<'a>(
    batches: &'a mut FxHashMap<u64, OpenBatch>,
    windows: &mut BTreeMap<Nanos, Vec<u64>>,
    key: BatchKey,
    batch: Batch,
) -> &'a mut Batch {
    let seq = key.seq;
    windows.entry(key.window_start).or_default().push(seq);
    &mut batches.entry(seq).or_insert(OpenBatch { key, batch }).batch
}

/// Summary counters, for metrics and progress.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    pub accepted: u64,
    pub duplicates: u64,
    pub superseded: u64,
    pub late: u64,
    pub abstentions: u64,
    pub score_updates: u64,
    pub flags: u64,
}

/// The state and rules of one input partition.
///
/// Series states and vote identities are a bounded cache over the state
/// store (see `cache.rs`); open batches and the watermark are always in
/// memory. Before each vote the shell provides what [`Engine::wants`]
/// names; after persisting [`Engine::drain_changes`] it may call
/// [`Engine::evict`]. No answer depends on what the cache holds.
pub struct Engine {
    cfg: EngineConfig,
    meta: Meta,
    /// Boxed: a table's empty slots then cost a pointer, not an entry, and
    /// doubling it copies pointers (both tables are alive meanwhile).
    series: FxHashMap<SeriesKey, Box<SeriesEntry>>,
    /// Every open batch by its seq (unique in the partition): a vote finds
    /// its batch with one small-key lookup, and nothing is moved in an
    /// ordered map per vote.
    batches: FxHashMap<u64, OpenBatch>,
    /// The seqs of the batches opened in each window (closed ones stay
    /// until their window closes), for the close step: windows in order,
    /// and a window's batches sorted by (series, seq) once, when it closes.
    windows: BTreeMap<Nanos, Vec<u64>>,
    dedupe: FxHashMap<IdKey, IdentityEntry>,
    dirty_series: Vec<SeriesKey>,
    /// Seqs of the batches changed since the last drain.
    dirty_batches: Vec<u64>,
    /// Closed batches the store holds.
    deleted_batches: Vec<BatchKey>,
    dirty_dedupe: Vec<u128>,
    /// Stored vote times of identities accepted again since the last drain.
    replaced_dedupe: FxHashMap<u128, Nanos>,
    meta_dirty: bool,
    /// The partition's leaderboard (`query_index` only; one row per model
    /// and rubric, so bounded by those, not by the series).
    board: FxHashMap<BoardKey, BoardRow>,
    dirty_board: Vec<BoardKey>,
    /// The series and voter of each identity accepted since the last drain
    /// and, when contract §14 collects, the vote's value (`query_index` only;
    /// counted in `cache_bytes` so that a replay writes them out when it
    /// fills).
    identity_voters: FxHashMap<u128, (SeriesKey, Id, Option<Option<f64>>)>,
    /// Agreement sums per rubric (`query_index` only; as many as rubrics).
    agreement: FxHashMap<Id, RubricSums>,
    dirty_agreement: Vec<Id>,
    /// Reviewers' agreement numbers per rubric: a cache like the series'
    /// (`query_index` only).
    reviewers: FxHashMap<ReviewerKey, agreement::ReviewerEntry>,
    dirty_reviewers: Vec<ReviewerKey>,
    /// contract §14: each open epoch's latest vote per series and reviewer
    /// (modes `shadow` and `learned`) is kept in the series' cache entry
    /// (a vote finds it with its series), and here while the series is
    /// not cached (evicted, or restored without it).
    parked_values: BTreeMap<Epoch, FxHashMap<SeriesKey, learn::Unit>>,
    /// The cached series with values of each open epoch (some may have
    /// been evicted since, or be listed twice: the seal skips them).
    open_series: BTreeMap<Epoch, Vec<SeriesKey>>,
    /// The epochs any open value has (at most a few).
    open_epochs: std::collections::BTreeSet<Epoch>,
    /// Emptied value vectors for series' next values (`learn::Spare`).
    spare_values: learn::Spare,
    /// Open values held, cached and parked.
    open_count: usize,
    /// Format-9 units (a series' values of an epoch in a record of their
    /// own) of epochs sealed since the last drain.
    deleted_open: Vec<(Epoch, SeriesKey)>,
    /// Format-8 records of values sealed since the last drain.
    deleted_legacy_open: Vec<OpenKey>,
    /// Deltas sealed since the last drain.
    sealed: Vec<(TermsKey, Terms)>,
    /// The tables the partition's batches are scored with.
    tables: Tables,
    /// Closed batches waiting at the barrier, in close order (`learned`).
    pending: std::collections::VecDeque<(u64, PendingSlot)>,
    /// How many of them have each epoch: the oldest is what the tables
    /// must keep apart, asked at every watermark advance (a scan of the
    /// waiting batches there made `run` quadratic in them).
    pending_epochs: BTreeMap<Epoch, usize>,
    /// The next pending batch's place in the close order.
    next_pending: u64,
    dirty_pending: Vec<u64>,
    deleted_pending: Vec<u64>,
    /// `run`: the tables are every partition's, fed by the shell, and a
    /// batch of epoch k waits until the group has sealed k − 2 (None: not
    /// known yet). A replay (`None` here) is one partition and never waits.
    shared: Option<Shared>,
    /// Approximate bytes of the cached series and identities.
    cache_bytes: usize,
    /// Use counter for least-recently-used eviction.
    tick: u64,
    /// The highest `used` tick of an identity evicted so far (see
    /// `SeriesEntry::born`).
    identity_cut: u64,
    /// The cache holds every series and identity of the partition (a new
    /// partition before its first eviction): nothing needs loading.
    complete: bool,
    /// The first state met that the engine's own rules exclude, for the
    /// shell to stop on ([`Engine::take_inconsistency`]).
    inconsistency: Option<Inconsistency>,
    pub counters: Counters,
}

/// A state the engine's own rules exclude (a bug, or state that was wrong
/// when loaded), met while processing: the engine goes on without the
/// affected step, and the shell stops with a fatal store error that names
/// the series (`Store::inconsistent`) before anything of it is committed.
#[derive(Debug, Clone, PartialEq)]
pub struct Inconsistency {
    pub series: SeriesKey,
    pub what: String,
}

impl Engine {
    /// An engine for a partition with no state yet.
    pub fn new(cfg: EngineConfig) -> Self {
        Engine {
            cfg,
            meta: Meta::default(),
            series: FxHashMap::default(),
            batches: FxHashMap::default(),
            windows: BTreeMap::new(),
            dedupe: FxHashMap::default(),
            dirty_series: Vec::new(),
            dirty_batches: Vec::new(),
            deleted_batches: Vec::new(),
            dirty_dedupe: Vec::new(),
            replaced_dedupe: FxHashMap::default(),
            meta_dirty: false,
            board: FxHashMap::default(),
            dirty_board: Vec::new(),
            identity_voters: FxHashMap::default(),
            agreement: FxHashMap::default(),
            dirty_agreement: Vec::new(),
            reviewers: FxHashMap::default(),
            dirty_reviewers: Vec::new(),
            parked_values: BTreeMap::new(),
            open_series: BTreeMap::new(),
            open_epochs: Default::default(),
            spare_values: Default::default(),
            open_count: 0,
            deleted_open: Vec::new(),
            deleted_legacy_open: Vec::new(),
            sealed: Vec::new(),
            tables: Tables::default(),
            pending: Default::default(),
            pending_epochs: BTreeMap::new(),
            next_pending: 0,
            dirty_pending: Vec::new(),
            deleted_pending: Vec::new(),
            shared: None,
            cache_bytes: 0,
            tick: 0,
            identity_cut: 0,
            complete: true,
            inconsistency: None,
            counters: Counters::default(),
        }
    }

    /// The first inconsistency met since the last call (see
    /// [`Inconsistency`]); the shell checks after each vote and cycle.
    pub fn take_inconsistency(&mut self) -> Option<Inconsistency> {
        self.inconsistency.take()
    }

    fn inconsistent(&mut self, series: &SeriesKey, what: String) {
        self.inconsistency.get_or_insert_with(|| Inconsistency {
            series: series.clone(),
            what,
        });
    }

    /// Rebuilds an engine from persisted parts (nothing is marked dirty):
    /// the partition values, the open batches and the series those batches
    /// belong to. `complete` says the store holds no other series or
    /// identity (nothing will need loading).
    pub fn restore(
        cfg: EngineConfig,
        meta: Meta,
        series: impl IntoIterator<Item = (SeriesKey, SeriesState)>,
        batches: impl IntoIterator<Item = (BatchKey, Batch)>,
        complete: bool,
    ) -> Self {
        let mut e = Engine::new(cfg);
        e.meta = meta;
        e.complete = complete;
        for (k, s) in series {
            e.provide_series(k, Some(s));
        }
        let mut recounted = std::collections::HashSet::new();
        for (k, b) in batches {
            if let Some(s) = e.series.get_mut(&k.series) {
                s.open.push(k.seq);
                // Recounted from the batches (a series stored before
                // `pending` existed reads 0).
                if recounted.insert(k.series.clone()) {
                    s.state.pending = 0;
                }
                s.state.pending += b.entries.len() as u64;
            }
            insert_batch(
                &mut e.batches,
                &mut e.windows,
                k,
                Batch { stored: true, ..b },
            );
        }
        e
    }

    /// Sets the leaderboard rows read from the store (after [`Engine::restore`]).
    pub fn restore_board(&mut self, rows: impl IntoIterator<Item = (BoardKey, BoardRow)>) {
        self.board = rows.into_iter().collect();
    }

    /// The partition's leaderboard rows (`query_index` only).
    pub fn board(&self) -> &FxHashMap<BoardKey, BoardRow> {
        &self.board
    }

    /// Moves a series' contribution from one place on the board to another.
    fn move_on_board(&mut self, from: Placement, to: Placement) {
        if from == to {
            return;
        }
        for ((key, row), add) in [(from, false), (to, true)] {
            let Some(row) = row else { continue };
            let r = self.board.entry(key.clone()).or_default();
            if add {
                r.add(&row);
            } else {
                r.sub(&row);
            }
            self.dirty_board.push(key);
        }
        // Deduplicated when it doubles past the rows (every dirty key is a
        // row until the drain): bounded by the board, not by the updates
        // between drains.
        if self.dirty_board.len() > 2 * self.board.len() + 64 {
            self.dirty_board.sort_unstable();
            self.dirty_board.dedup();
        }
    }

    pub fn watermark(&self) -> Option<Nanos> {
        self.meta.watermark
    }

    pub fn open_batches(&self) -> usize {
        self.batches.len()
    }

    /// A cached series state.
    pub fn series(&self, key: &SeriesKey) -> Option<&SeriesState> {
        self.series.get(key).map(|e| &e.state)
    }

    /// Steps (2)–(6) of contract §2 for a validated vote, then the close step.
    /// Score updates are appended to `out` in emission order.
    pub fn process(&mut self, vote: &Vote, out: &mut Vec<ScoreUpdate>) -> Outcome {
        self.process_with_identity(vote, vote_identity(vote), out)
    }

    /// [`Engine::process`] for a vote whose [`vote_identity`] is known (a
    /// shell may hash it on another thread).
    pub fn process_with_identity(
        &mut self,
        vote: &Vote,
        identity: u128,
        out: &mut Vec<ScoreUpdate>,
    ) -> Outcome {
        let wm = self.meta.watermark;
        self.tick += 1;
        // (2) duplicates, before lateness.
        // The vote time of a forgotten identity accepted again.
        let mut forgotten_at = None;
        if let Some(seen) = self.dedupe.get_mut(&identity.into()) {
            seen.touch(self.tick);
            let seen_at = seen.at;
            if !self.forgotten(seen_at, wm) {
                self.counters.duplicates += 1;
                return Outcome::Duplicate;
            }
            forgotten_at = Some(seen_at);
        }
        // (3) lateness.
        let start = self.cfg.window_start(vote.timestamp);
        if self.cfg.is_closed(start, wm) {
            self.counters.late += 1;
            let wm_text = wm.map(format_timestamp).unwrap_or_default();
            return Outcome::Late(Rejection::new(
                Reason::Late,
                format!(
                    "timestamp: window starting {} is already closed (watermark {})",
                    format_timestamp(start),
                    wm_text
                ),
            ));
        }
        // (4) accept.
        self.counters.accepted += 1;
        self.remember(identity, vote.timestamp);
        let skey = SeriesKey {
            inference_id: vote.inference_id.clone(),
            voter_prompt_id: vote.voter_prompt_id.clone(),
        };
        // A new batch's seq is new: it is not among the batches yet.
        let value = self.cfg.reputation.collects().then(|| {
            let epoch = self.cfg.reputation.epoch_of(start);
            let v = OpenValue {
                timestamp: vote.timestamp,
                value: vote.value,
            };
            (epoch, &vote.voter_id, v)
        });
        let seq = self.accept_into_series(&skey, start, vote.model_id.as_deref(), value);
        if let Some(at) = forgotten_at.filter(|_| self.cfg.reputation.collects()) {
            // The identity now names this vote: the value of the one it
            // named (same series: an identity includes it) stays in the
            // series' record while its epoch is open.
            let epoch = self.cfg.reputation.epoch_of(self.cfg.window_start(at));
            if let Some(e) = self.series.get_mut(&skey) {
                learn::Spare::pin(&mut e.values, epoch, at);
            }
        }
        let batch = match self.batches.get_mut(&seq) {
            Some(open) => &mut open.batch,
            None => {
                let key = BatchKey {
                    window_start: start,
                    series: skey.clone(),
                    seq,
                };
                insert_batch(&mut self.batches, &mut self.windows, key, Batch::default())
            }
        };
        if !batch.dirty {
            batch.dirty = true;
            self.dirty_batches.push(seq);
        }
        let vote_id = match &vote.vote_id {
            Some(id) => id.clone(),
            None => derived_vote_id(vote).into(),
        };
        let mut entry = Entry {
            voter_id: vote.voter_id.clone(),
            vote_id,
            value: vote.value,
            weight: vote.weight,
            timestamp: vote.timestamp,
            inference_time: vote.inference_time,
            live: true,
        };
        // Supersede: one vote per voter per batch; later timestamp wins, ties go to the later arrival.
        let prev = batch
            .entries
            .iter_mut()
            .find(|e| e.live && e.voter_id == entry.voter_id);
        if let Some(prev) = prev {
            self.counters.superseded += 1;
            if entry.timestamp >= prev.timestamp {
                prev.live = false;
                if prev.value.is_some() {
                    batch.counted -= 1;
                }
            } else {
                entry.live = false;
            }
        }
        if entry.live && entry.value.is_some() {
            batch.counted += 1;
        }
        batch.entries.push(entry);
        // (5) full? (It closes below, and leaves its series' list then.)
        let full = batch.counted >= self.cfg.max_votes;
        if self.cfg.query_index {
            self.cache_bytes += cache::voter_bytes(&skey, &vote.voter_id);
            let open = self.cfg.reputation.collects().then_some(vote.value);
            let voted = (skey.clone(), vote.voter_id.clone(), open);
            if let Some((k, v, _)) = self.identity_voters.insert(identity, voted) {
                self.cache_bytes = self.cache_bytes.saturating_sub(cache::voter_bytes(&k, &v));
            }
        }
        // (6) watermark.
        self.advance_to(vote.timestamp - self.cfg.grace_ns);
        self.close_ready(full.then_some(seq), out);
        Outcome::Accepted
    }

    /// Moves the watermark to `max(watermark, candidate)` and closes what that
    /// closes (live mode's idle flush).
    pub fn advance_watermark(&mut self, candidate: Nanos, out: &mut Vec<ScoreUpdate>) {
        self.advance_to(candidate);
        self.close_ready(None, out);
    }

    /// Closes every open batch as if the watermark were +∞, without moving
    /// the stored watermark (end of a replay file).
    pub fn close_all(&mut self, out: &mut Vec<ScoreUpdate>) {
        for seq in self.in_close_order(self.batches.keys().copied()) {
            self.close_batch(seq, out);
        }
        self.windows.clear();
    }

    fn forgotten(&self, seen_at: Nanos, wm: Option<Nanos>) -> bool {
        matches!(wm, Some(wm) if wm - seen_at > self.cfg.retention_ns)
    }

    /// Vote time below which a vote identity no longer counts (contract §4
    /// retention): what the state store's sweep may delete.
    ///
    /// With contract §14 collecting into a store that is restored from, no
    /// later than the start of the oldest open epoch: the identities of
    /// open epochs' votes hold their values (format 11), and a restore
    /// reads them. The engine forgets an identity by its time all the same
    /// ([`Engine::process`]); only its record stays a little longer.
    pub fn identity_horizon(&self) -> Option<Nanos> {
        let p = &self.cfg.reputation;
        self.meta.watermark.map(|wm| {
            let horizon = wm - self.cfg.retention_ns;
            if p.collects() && self.cfg.query_index {
                horizon.min(p.start_of(p.sealed_by(wm) + 1))
            } else {
                horizon
            }
        })
    }

    fn advance_to(&mut self, candidate: Nanos) {
        if self.meta.watermark.is_none_or(|wm| candidate > wm) {
            let before = self.meta.watermark.replace(candidate);
            self.meta_dirty = true;
            if self.cfg.reputation.collects() {
                self.seal_through(candidate, before);
            }
        }
    }
}

#[cfg(test)]
mod tests;
