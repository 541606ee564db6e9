//! One assigned input partition: its engine, its store, its open cycle and
//! the thread writing its last committed cycle to RocksDB. Fields are
//! private: the session drives a partition through these methods only.
//!
//! A thread that still holds a partition's database when its owner lets
//! go (a write past the revoke deadline, a cancelled restore) is not
//! waited for there: it is registered as *lingering* under the
//! directories it holds, and whoever opens one of them next waits for it
//! ([`wait_released`]), cancellably.

pub mod changelog;
pub mod reconcile;
pub mod restore;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engine::reputation::{Epoch, Terms, TermsKey};
use crate::engine::{vote_identity, Engine, Outcome, ScoreUpdate, Wants};
use crate::input::Vote;
use crate::output::Route;
use crate::service::client::Tp;
use crate::service::error::{Result, ServiceError};
use crate::service::partition::changelog::{
    seal_cycle, take_cycle_chunks, write_cycle, CycleMarker, OutEvent, CHANGELOG_POS, CYCLE_KEY,
};
use crate::state::{Record, Store, StoreError, SWEEP_LIMIT};
use crate::time::Nanos;

/// A committed cycle's RocksDB write in flight.
struct Write {
    done: mpsc::Receiver<std::result::Result<(), StoreError>>,
    thread: JoinHandle<()>,
}

/// One assigned input partition.
pub struct Part {
    /// Shared with the query API (`crate::api::Holdings`).
    store: Arc<Store>,
    engine: Engine,
    last_accepted: Instant,
    /// Changelog records of the open cycle, applied to RocksDB after commit.
    pending: Vec<Record>,
    /// The last cycle marker written or restored.
    marker: CycleMarker,
    /// The next input offset; records below it are already in the state.
    next_offset: i64,
    /// Events of the open cycle (kept here in outbox mode only).
    held: Vec<OutEvent>,
    held_bytes: usize,
    /// Events the open cycle emitted (the next one's index in its origin).
    emitted: u32,
    /// Whether the open cycle changed anything of this partition.
    dirty: bool,
    skip_logged: bool,
    writing: Option<Write>,
}

impl Part {
    pub fn new(store: Store, engine: Engine, marker: Option<CycleMarker>) -> Part {
        let marker = marker.unwrap_or_else(CycleMarker::initial);
        Part {
            store: Arc::new(store),
            engine,
            last_accepted: Instant::now(),
            pending: Vec::new(),
            next_offset: marker.next_offset,
            marker,
            held: Vec::new(),
            held_bytes: 0,
            emitted: 0,
            dirty: false,
            skip_logged: false,
            writing: None,
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The last cycle marker written or restored.
    pub fn marker(&self) -> &CycleMarker {
        &self.marker
    }

    /// The next input offset (−1: none recorded yet).
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    pub fn last_accepted(&self) -> Instant {
        self.last_accepted
    }

    /// Counts the partition as active now (a restore kept it from polling).
    pub fn touch(&mut self) {
        self.last_accepted = Instant::now();
    }

    /// Takes input `offset` into the open cycle; `false` when the state
    /// already holds it (a cycle whose marker was committed but whose group
    /// offsets were not).
    pub fn take_offset(&mut self, tp: &Tp, offset: i64) -> bool {
        if offset < self.next_offset {
            if !self.skip_logged {
                self.skip_logged = true;
                tracing::info!(topic = %tp.0, partition = tp.1, offset, next = self.next_offset,
                    "skipping input records the restored state already holds");
            }
            return false;
        }
        if self.next_offset >= 0 && offset > self.next_offset {
            // Normal after compaction or transaction markers in the input.
            tracing::debug!(topic = %tp.0, partition = tp.1, offset, expected = self.next_offset,
                "input offsets skip ahead");
        }
        self.next_offset = offset + 1;
        self.dirty = true;
        true
    }

    /// One vote through the engine, its series and identity read from
    /// RocksDB when the cache lacks them.
    pub fn process(
        &mut self,
        vote: &Vote,
        updates: &mut Vec<ScoreUpdate>,
    ) -> std::result::Result<Outcome, StoreError> {
        let identity = vote_identity(vote);
        let wants = self.engine.wants_with_identity(vote, identity);
        if wants != Wants::default() {
            self.store.provide(&mut self.engine, &[wants])?;
        }
        let outcome = self.engine.process_with_identity(vote, identity, updates);
        if outcome == Outcome::Accepted {
            // contract §2 (v4): only an accepted vote is activity; duplicates
            // (a sync resending delivered votes) must not hold batches open.
            self.last_accepted = Instant::now();
        }
        self.check()?;
        Ok(outcome)
    }

    /// contract §14: the tables become the group's, starting from `deltas`.
    pub fn share_tables(&mut self, deltas: &[(TermsKey, Terms)]) {
        self.engine.share_tables();
        self.add_deltas(deltas);
    }

    /// Sealed deltas of the group, read from the reputation topic.
    pub fn add_deltas(&mut self, deltas: &[(TermsKey, Terms)]) {
        for ((rubric, epoch, voter), t) in deltas {
            self.engine.add_delta(rubric, *epoch, voter, t);
        }
    }

    /// The group's newest sealed epoch: scores the batches it releases.
    pub fn set_group_sealed(
        &mut self,
        epoch: Option<Epoch>,
        updates: &mut Vec<ScoreUpdate>,
    ) -> std::result::Result<(), StoreError> {
        self.engine.set_group_sealed(epoch, updates);
        self.check()
    }

    pub fn pending_batches(&self) -> usize {
        self.engine.pending_batches()
    }

    /// What this partition sealed since the last call, to publish.
    pub fn take_published(&mut self) -> (Vec<(TermsKey, Terms)>, Option<Epoch>) {
        self.engine.take_published()
    }

    /// Live mode's idle flush: moves the watermark to `to`.
    pub fn advance_watermark(
        &mut self,
        to: Nanos,
        updates: &mut Vec<ScoreUpdate>,
    ) -> std::result::Result<(), StoreError> {
        self.last_accepted = Instant::now();
        self.engine.advance_watermark(to, updates);
        self.check()
    }

    /// An inconsistency the engine met is a fatal store error, before the
    /// cycle that met it commits anything.
    fn check(&mut self) -> std::result::Result<(), StoreError> {
        match self.engine.take_inconsistency() {
            Some(i) => Err(self.store.inconsistent(i)),
            None => Ok(()),
        }
    }

    /// Counts one event of the open cycle: its index and the cycle's number
    /// (for its origin header).
    pub fn next_event(&mut self) -> (u64, u32) {
        let idx = self.emitted;
        self.emitted += 1;
        self.dirty = true;
        (self.marker.seq + 1, idx)
    }

    /// Holds an event of the open cycle for the outbox.
    pub fn hold(&mut self, mut ev: OutEvent) {
        // Held until the cycle commits, and counted by its length: an event
        // is encoded into a 1 KiB buffer (see `output::to_json`), which
        // glibc shrinks in place.
        ev.payload.shrink_to_fit();
        self.held_bytes += ev.payload.len() + ev.key.as_ref().map_or(0, Vec::len);
        self.held.push(ev);
    }

    /// Bytes of events held for the outbox.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// The open cycle's held events.
    pub fn held(&self) -> &[OutEvent] {
        &self.held
    }

    pub fn clear_held(&mut self) {
        self.held.clear();
        self.held_bytes = 0;
    }

    /// Ends the open cycle's records: the identities the retention forgets,
    /// the engine's changes, then (`seal_cycle`) the outbox chunks of the
    /// held events and the new marker. Returns the records for the
    /// changelog, or `None` when the cycle did not touch this partition.
    /// `acked(route, partition)`: the highest offset acknowledged there.
    pub fn seal(
        &mut self,
        acked: impl Fn(Route, i32) -> Option<i64>,
    ) -> std::result::Result<Option<&[Record]>, StoreError> {
        let mark = self.pending.len();
        self.store
            .encode_changes(&mut self.engine, &mut self.pending)?;
        if !self.dirty && self.pending.is_empty() {
            return Ok(None);
        }
        // Identities past the retention, forgotten before this cycle's
        // changes (so that one accepted again in this cycle stays).
        if let Some(horizon) = self.engine.identity_horizon() {
            let swept = self.store.sweep(horizon, SWEEP_LIMIT)?;
            self.pending.splice(mark..mark, swept);
        }
        let (records, marker) = seal_cycle(&self.marker, self.next_offset, &self.held, acked);
        self.pending.extend(records);
        self.marker = marker;
        // What follows belongs to the next cycle (which, its commit
        // overlapped, runs before this one's write starts).
        self.dirty = false;
        self.emitted = 0;
        Ok(Some(&self.pending))
    }

    /// The changelog holds the sealed cycle up to `changelog_pos`: writes
    /// its records to RocksDB on a thread of its own, after the write
    /// before it (the outbox chunks go to the outbox file, [`write_cycle`]).
    pub fn start_write(
        &mut self,
        tp: &Tp,
        changelog_pos: Option<i64>,
        budget: usize,
        timeout: Duration,
    ) -> Result<()> {
        self.finish_write(budget, timeout)?;
        let mut records = std::mem::take(&mut self.pending);
        tracing::debug!(topic = %tp.0, partition = tp.1, seq = self.marker.seq,
            next_offset = self.marker.next_offset, changelog_pos = ?changelog_pos,
            records = records.len(), events = self.held.len(), "cycle committed");
        let chunks = take_cycle_chunks(&mut records, self.marker.outbox_chunks as usize);
        let positions: Vec<(&'static str, i64)> = changelog_pos
            .map(|p| (CHANGELOG_POS, p))
            .into_iter()
            .collect();
        let store = self.store.clone();
        let (tx, done) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("state-write".into())
            .spawn(move || {
                let _ = tx.send(write_cycle(&store, &chunks, &records, &positions));
            })
            .map_err(|e| ServiceError::thread("a state write", e))?;
        self.writing = Some(Write { done, thread });
        Ok(())
    }

    /// Waits up to `timeout` for the RocksDB write in flight, if any, then
    /// evicts the cache down to `budget`: an entry may go only once its
    /// records are in RocksDB, where a later vote reads it back.
    pub fn finish_write(&mut self, budget: usize, timeout: Duration) -> Result<()> {
        let Some(w) = self.writing.take() else {
            return Ok(());
        };
        match w.done.recv_timeout(timeout) {
            Ok(result) => {
                let _ = w.thread.join();
                result?;
                self.engine.evict(budget);
                Ok(())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.writing = Some(w);
                Err(ServiceError::slow_store(format!(
                    "the state write of {} did not finish within {timeout:?}",
                    self.store.path().display()
                )))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = w.thread.join();
                Err(panicked_write(&self.store).into())
            }
        }
    }

    /// Overwrites, in the next cycle, the records an interrupted cycle left
    /// at the changelog's end with their committed values.
    pub fn rewrite(&mut self, keys: Vec<Vec<u8>>) -> std::result::Result<(), StoreError> {
        for k in keys {
            let v = self.store.get(&k)?;
            self.pending.push((k, v));
        }
        self.dirty = true;
        Ok(())
    }

    /// Whether the cycle changed anything of this partition.
    pub fn dirty(&self) -> bool {
        self.dirty
    }

    /// Outbox mode: whether the last cycle's events may be missing from
    /// the outputs (not known to be delivered).
    pub fn in_doubt(&self) -> bool {
        !self.marker.delivered && self.marker.outbox_chunks > 0
    }

    /// The last marker with `delivered` set, and its record value, when it
    /// is not set yet.
    pub fn delivered_marker(&self) -> Option<(CycleMarker, Vec<u8>)> {
        if self.marker.delivered {
            return None;
        }
        let mut m = self.marker.clone();
        m.delivered = true;
        let v = m.encode();
        Some((m, v))
    }

    /// The changelog holds `m` (its value `v`) up to `changelog_pos`.
    pub fn store_marker(
        &mut self,
        m: CycleMarker,
        v: Vec<u8>,
        changelog_pos: Option<i64>,
    ) -> std::result::Result<(), StoreError> {
        let positions: Vec<(&str, i64)> = changelog_pos
            .map(|p| (CHANGELOG_POS, p))
            .into_iter()
            .collect();
        self.store
            .apply(&[(CYCLE_KEY.to_vec(), Some(v))], &positions)?;
        self.marker = m;
        Ok(())
    }

    /// Forgets the open cycle's changelog records and events.
    pub fn drop_cycle(&mut self) {
        self.pending.clear();
        self.clear_held();
    }

    /// Lets the partition go, waiting for its write until `until` at most;
    /// a write still running then lingers (see the module's comment).
    pub fn release(mut self, until: Instant) {
        if let Some(w) = self.writing.take() {
            let timeout = until.saturating_duration_since(Instant::now());
            match w.done.recv_timeout(timeout) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!("state write failed: {}", crate::error::Chain(&e)),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!(dir = %self.store.path().display(),
                        "a state write outlasts the partition's release: it finishes in the background");
                    linger(vec![self.store.path().to_owned()], w.thread);
                    return;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    tracing::error!("{}", panicked_write(&self.store))
                }
            }
            let _ = w.thread.join();
        }
    }
}

impl Drop for Part {
    /// A write still in flight is never waited for here (a drop has no
    /// deadline to keep): it lingers, and whoever opens the directory next
    /// waits for it.
    fn drop(&mut self) {
        if let Some(w) = self.writing.take() {
            linger(vec![self.store.path().to_owned()], w.thread);
        }
    }
}

fn panicked_write(store: &Store) -> StoreError {
    StoreError::Corrupt {
        path: store.path().to_owned(),
        key: Vec::new(),
        why: "the thread writing a committed cycle panicked".into(),
    }
}

/// Threads holding partition databases after their owner let go, with the
/// directories each holds.
static LINGERING: Mutex<Vec<(Vec<PathBuf>, JoinHandle<()>)>> = Mutex::new(Vec::new());

fn lingering() -> std::sync::MutexGuard<'static, Vec<(Vec<PathBuf>, JoinHandle<()>)>> {
    let mut list = LINGERING.lock().unwrap_or_else(|p| p.into_inner());
    list.retain(|(_, t)| !t.is_finished());
    list
}

/// Registers `thread` as holding the databases of `dirs`.
pub fn linger(dirs: Vec<PathBuf>, thread: JoinHandle<()>) {
    if !thread.is_finished() {
        lingering().push((dirs, thread));
    }
}

/// Whether a lingering thread holds `dir`'s database.
pub fn is_held(dir: &Path) -> bool {
    lingering()
        .iter()
        .any(|(dirs, _)| dirs.iter().any(|d| d == dir))
}

/// Waits until no lingering thread holds `dir`'s database; gives up when
/// `cancel` is set (checked every 10 ms).
pub fn wait_released(dir: &Path, cancel: &AtomicBool) -> Result<()> {
    while is_held(dir) {
        if cancel.load(Ordering::SeqCst) {
            return Err(ServiceError::broker("restore cancelled by a rebalance"));
        }
        // Polled: a finished thread cannot signal a registry it does not know.
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// At shutdown: waits up to `limit` for every lingering thread, so that
/// their databases close cleanly.
pub fn join_lingering(limit: Duration) {
    let end = Instant::now() + limit;
    while !lingering().is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Classify;

    fn part_at(path: &Path) -> Part {
        let cfg = crate::config::Config::load(None).unwrap().engine();
        let store = Store::open(path).unwrap();
        let (engine, _) = store.load(cfg).unwrap();
        Part::new(store, engine, None)
    }

    fn records(n: u32) -> Vec<Record> {
        (0..n)
            .map(|i| (format!("c-test-{i:06}").into_bytes(), Some(vec![7; 64])))
            .collect()
    }

    const LONG: Duration = Duration::from_secs(60);

    /// A cycle's write runs off the caller's thread; waiting for it makes
    /// it visible. A partition dropped or released with its write in flight
    /// does not wait for it: the write lingers, and the directory can be
    /// opened again once [`wait_released`] returns.
    #[test]
    fn a_committed_write_lands_before_the_wait_and_before_the_directory_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        let tp: Tp = ("votes".into(), 0);
        let mut part = part_at(dir.path());
        part.pending = records(20_000);
        part.start_write(&tp, Some(5), 1 << 20, LONG).unwrap();
        part.finish_write(1 << 20, LONG).unwrap();
        assert!(part.writing.is_none());
        assert_eq!(part.store.position(CHANGELOG_POS).unwrap(), Some(5));
        assert_eq!(part.store.get(b"c-test-019999").unwrap(), Some(vec![7; 64]));
        // A second write, then the partition released at once with it in flight.
        part.pending = records(200_000);
        part.start_write(&tp, Some(6), 1 << 20, LONG).unwrap();
        let released = Instant::now();
        part.release(Instant::now());
        assert!(released.elapsed() < Duration::from_secs(5));
        let never = AtomicBool::new(false);
        wait_released(dir.path(), &never).unwrap();
        let again = Store::open(dir.path()).unwrap();
        assert_eq!(again.position(CHANGELOG_POS).unwrap(), Some(6));
        assert!(again.get(b"c-test-199999").unwrap().is_some());
    }

    /// A wait for a write has a deadline: past it the write is still in
    /// flight and the caller gets a retriable error, not a hang.
    #[test]
    fn waiting_for_a_write_gives_up_at_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let tp: Tp = ("votes".into(), 0);
        let mut part = part_at(dir.path());
        part.pending = records(300_000);
        part.start_write(&tp, Some(1), 1 << 20, LONG).unwrap();
        match part.finish_write(1 << 20, Duration::ZERO) {
            // The write may have been that fast; then there is nothing to test.
            Ok(()) => {}
            Err(e) => {
                assert!(e.is_retriable(), "{e}");
                assert!(part.writing.is_some());
                part.finish_write(1 << 20, LONG).unwrap();
            }
        }
        assert_eq!(part.store.position(CHANGELOG_POS).unwrap(), Some(1));
    }

    #[test]
    fn a_cancelled_wait_for_a_held_directory_returns_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        linger(vec![dir.path().to_owned()], holder);
        assert!(is_held(dir.path()));
        let cancel = AtomicBool::new(true);
        assert!(wait_released(dir.path(), &cancel).is_err());
        drop(tx);
        let never = AtomicBool::new(false);
        wait_released(dir.path(), &never).unwrap();
        assert!(!is_held(dir.path()));
    }
}
