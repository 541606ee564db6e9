//! One consumer-group session's state: the assigned partitions (engine,
//! store, open cycle), the producer, and the open commit cycle. Everything
//! a commit touches lives here; the rebalance callbacks reach it through
//! the consumer context ([`super::context::Ctx`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, Producer as _};

use super::changelog::{take_cycle_chunks, write_cycle, CycleMarker, OutEvent};
use super::client::{property, Names, Tp};
use super::context::ProduceCtx;
use super::delivery::Protocol;
use super::error::{Result, ServiceError};
use crate::config::Config;
use crate::engine::{Engine, ScoreUpdate};
use crate::input::DecodeOptions;
use crate::output::Route;
use crate::state::{Record, Store, StoreError};
use crate::telemetry::Metrics;
use crate::time::Nanos;

/// How long one step of a commit cycle may take outside a rebalance.
const CYCLE_STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// One assigned input partition.
pub struct Part {
    /// Shared with the query API (`crate::api::Holdings`).
    pub store: Arc<Store>,
    pub engine: Engine,
    pub last_record: Instant,
    /// Changelog records of the open cycle, applied to RocksDB after commit.
    pub pending: Vec<Record>,
    /// The last cycle marker written or restored.
    pub marker: CycleMarker,
    /// The next input offset; records below it are already in the state.
    pub next_offset: i64,
    /// Events of the open cycle (kept here in outbox mode only).
    pub out: Vec<OutEvent>,
    pub out_count: u32,
    pub out_bytes: usize,
    /// Whether the open cycle changed anything of this partition.
    pub dirty: bool,
    pub skip_logged: bool,
    /// The last committed cycle's RocksDB write, on a thread of its own so
    /// that the poll loop goes on meanwhile (see [`Part::finish_write`]).
    pub writing: Option<std::thread::JoinHandle<std::result::Result<(), StoreError>>>,
}

impl Part {
    pub fn new(store: Store, engine: Engine, marker: Option<CycleMarker>) -> Part {
        let marker = marker.unwrap_or_else(CycleMarker::initial);
        Part {
            store: Arc::new(store),
            engine,
            last_record: Instant::now(),
            pending: Vec::new(),
            next_offset: marker.next_offset,
            marker,
            out: Vec::new(),
            out_count: 0,
            out_bytes: 0,
            dirty: false,
            skip_logged: false,
            writing: None,
        }
    }

    /// Writes a committed cycle's `records` to RocksDB on a thread of its
    /// own, after the write before it; the cycle's `outbox_chunks` outbox
    /// chunks go to the outbox file instead ([`write_cycle`]).
    pub fn start_write(
        &mut self,
        mut records: Vec<Record>,
        outbox_chunks: usize,
        positions: Vec<(&'static str, i64)>,
        budget: usize,
    ) -> Result<()> {
        self.finish_write(budget)?;
        let store = self.store.clone();
        let chunks = take_cycle_chunks(&mut records, outbox_chunks);
        let handle = std::thread::Builder::new()
            .name("state-write".into())
            .spawn(move || write_cycle(&store, &chunks, &records, &positions))
            .map_err(|e| ServiceError::internal(format!("cannot start a state write: {e}")))?;
        self.writing = Some(handle);
        Ok(())
    }

    /// Waits for the RocksDB write in flight, if any, then evicts the cache
    /// down to `budget`: an entry may go only once its records are in
    /// RocksDB, where a later vote reads it back.
    pub fn finish_write(&mut self, budget: usize) -> Result<()> {
        if let Some(handle) = self.writing.take() {
            handle
                .join()
                .unwrap_or_else(|_| Err(panicked_write(&self.store)))?;
            self.engine.evict(budget);
        }
        Ok(())
    }

    /// Forgets the open cycle's changelog records and events.
    fn drop_cycle(&mut self) {
        self.pending.clear();
        self.out.clear();
        self.out_bytes = 0;
    }
}

fn panicked_write(store: &Store) -> StoreError {
    StoreError::Corrupt {
        path: store.path().to_owned(),
        key: Vec::new(),
        why: "the thread writing a committed cycle panicked".into(),
    }
}

impl Drop for Part {
    /// A partition's database is never closed (or opened again) while a
    /// write to it runs.
    fn drop(&mut self) {
        if let Some(handle) = self.writing.take() {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!("state write failed: {e}"),
                Err(_) => tracing::error!("{}", panicked_write(&self.store)),
            }
        }
    }
}

/// Output topic names and partition counts, by [`Route`].
pub struct Outputs {
    pub topics: [String; 3],
    pub partitions: [i32; 3],
}

impl Outputs {
    pub fn topic(&self, r: Route) -> &str {
        &self.topics[r.index()]
    }

    pub fn partitions(&self, r: Route) -> i32 {
        self.partitions[r.index()]
    }
}

pub struct Session {
    pub cfg: Config,
    pub names: Names,
    pub decode: DecodeOptions,
    /// `input.max_future_skew_seconds` in nanoseconds.
    pub max_skew: Nanos,
    pub producer: BaseProducer<ProduceCtx>,
    pub protocol: &'static dyn Protocol,
    pub outputs: Outputs,
    pub metrics: Arc<Metrics>,
    pub parts: HashMap<Tp, Part>,
    /// Whether a cycle is open, and since when.
    pub in_cycle: bool,
    pub cycle_started: Instant,
    /// Input offsets to commit with the open cycle.
    pub offsets: HashMap<Tp, i64>,
    /// Set when the session must be rebuilt (a failed commit, a lost assignment).
    pub broken: Option<ServiceError>,
    /// Reused buffer for the engine's score updates.
    pub updates: Vec<ScoreUpdate>,
    /// Whether a partition assignment (possibly empty) has been received.
    pub assigned_once: bool,
    /// Local partition databases not owned now, and since when.
    pub unowned: HashMap<Tp, Instant>,
    /// Assigned partitions whose state is still to be restored (paused).
    pub to_restore: Vec<Tp>,
    /// The restore running off the poll loop, if any.
    pub restoring: Option<super::restore::RestoreJob>,
    /// While partitions are handed over: when the open cycle must be
    /// finished (or aborted) by. Outside a rebalance each step of a cycle
    /// may take [`CYCLE_STEP_TIMEOUT`].
    pub deadline: Option<Instant>,
    /// What the query API sees: the assigned partitions, ready or restoring.
    pub holdings: Arc<crate::api::Holdings>,
}

/// The deadline for finishing (or aborting) the open cycle when partitions
/// are revoked: 2/3 of `session.timeout.ms` (from `kafka.properties`,
/// librdkafka's default 45 s), at least 1 s, so the member is not expelled
/// while it hands its partitions over.
pub fn revoke_timeout(session_timeout_ms: Option<&str>) -> Duration {
    let session_ms = session_timeout_ms
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(45_000);
    Duration::from_millis((session_ms.saturating_mul(2) / 3).max(1_000))
}

/// The error for a partition that should be assigned and is not.
pub fn not_assigned(tp: &Tp) -> ServiceError {
    ServiceError::internal(format!("partition {}-{} is not assigned", tp.0, tp.1))
}

/// Where one partition's RocksDB lives.
pub fn partition_dir(cfg: &Config, tp: &Tp) -> PathBuf {
    PathBuf::from(&cfg.state.dir).join(format!("{}-{}", tp.0, tp.1))
}

/// Partitions of `unowned` to delete at `now`: not owned for `grace`.
pub fn cleanup_due(
    unowned: &HashMap<Tp, Instant>,
    owned: impl Fn(&Tp) -> bool,
    now: Instant,
    grace: Duration,
) -> Vec<Tp> {
    let mut due: Vec<Tp> = unowned
        .iter()
        .filter(|(tp, since)| now.saturating_duration_since(**since) >= grace && !owned(tp))
        .map(|(tp, _)| tp.clone())
        .collect();
    due.sort();
    due
}

impl Session {
    /// How long the next step of the cycle may take.
    pub fn step_timeout(&self) -> Duration {
        match self.deadline {
            None => CYCLE_STEP_TIMEOUT,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        }
    }

    /// The revoke deadline for this configuration.
    pub fn revoke_timeout(&self) -> Duration {
        revoke_timeout(property(&self.cfg, "session.timeout.ms").as_deref())
    }

    /// Opens a cycle if none is open.
    pub fn ensure_cycle(&mut self) -> Result<()> {
        if !self.in_cycle {
            self.protocol.begin(self)?;
            self.in_cycle = true;
            self.cycle_started = Instant::now();
        }
        Ok(())
    }

    pub fn part_mut(&mut self, tp: &Tp) -> Result<&mut Part> {
        self.parts.get_mut(tp).ok_or_else(|| not_assigned(tp))
    }

    /// Waits until everything queued is acknowledged.
    pub fn flush_acked(&self, what: &str) -> Result<()> {
        super::produce::flush_now(&self.producer, self.step_timeout())
            .map_err(|e| ServiceError::kafka(what, e))?;
        self.producer.poll(Duration::ZERO);
        match self.producer.context().take_failure() {
            Some(e) => Err(ServiceError::delivery(what, &e)),
            None => Ok(()),
        }
    }

    /// Ends the open cycle in the delivery mode's order; on failure aborts it.
    pub fn commit(&mut self, consumer: &super::context::Consumer) -> Result<()> {
        if !self.in_cycle {
            return Ok(());
        }
        let started = Instant::now();
        // The previous cycle's RocksDB writes land before this cycle's
        // changelog: its sweep and reviewer reads must see them.
        let result = self
            .finish_writes()
            .and_then(|()| self.protocol.commit(self, consumer));
        match result {
            Ok(()) => {
                self.metrics
                    .commit_duration(started.elapsed().as_secs_f64());
                self.refresh_gauges();
                for (tp, part) in &self.parts {
                    self.metrics.agreement_committed(
                        &format!("{}-{}", tp.0, tp.1),
                        part.engine.agreement(),
                    );
                }
                Ok(())
            }
            Err(e) => {
                self.abort();
                Err(e)
            }
        }
    }

    /// Waits for every partition's RocksDB write in flight (and evicts).
    pub fn finish_writes(&mut self) -> Result<()> {
        let budget = self.cache_share();
        for part in self.parts.values_mut() {
            part.finish_write(budget)?;
        }
        Ok(())
    }

    /// Each partition's share of `state.cache_mb`.
    pub fn cache_share(&self) -> usize {
        self.cfg.cache_bytes() / self.parts.len().max(1)
    }

    /// Before partitions are handed over or at shutdown.
    pub fn hand_over(&mut self) -> Result<()> {
        self.protocol.hand_over(self)
    }

    /// Drops the open cycle; the in-memory state now runs ahead of what was
    /// committed, so the session is marked for a rebuild.
    pub fn abort(&mut self) {
        if self.in_cycle {
            self.protocol.abort(self);
            self.in_cycle = false;
        }
        self.offsets.clear();
        for p in self.parts.values_mut() {
            p.drop_cycle();
        }
        self.broken.get_or_insert_with(|| {
            ServiceError::internal("cycle aborted; rebuilding state from the last commit")
        });
    }

    /// Bytes of events waiting in outboxes.
    pub fn outbox_bytes(&self) -> usize {
        self.parts.values().map(|p| p.out_bytes).sum()
    }

    /// Folds every partition's engine counters and gauges into the metrics.
    pub fn refresh_gauges(&self) {
        for (tp, part) in &self.parts {
            self.metrics
                .observe_engine(&format!("{}-{}", tp.0, tp.1), &part.engine);
        }
        self.metrics
            .model_board(self.parts.values().flat_map(|p| p.engine.board()));
    }

    /// Tells the query API which partitions are ready (their stores) and
    /// which are queued or restoring.
    pub fn publish_holdings(&self) {
        let mut held: std::collections::BTreeMap<Tp, Option<Arc<Store>>> = self
            .parts
            .iter()
            .map(|(tp, p)| (tp.clone(), Some(p.store.clone())))
            .collect();
        let restoring = self.restoring.iter().flat_map(|j| j.tps.iter());
        for tp in self.to_restore.iter().chain(restoring) {
            held.entry(tp.clone()).or_insert(None);
        }
        self.holdings.set_held(held);
    }

    /// Releases revoked partitions (their state stays on disk for
    /// `state.cleanup_grace_seconds`).
    pub fn release(&mut self, tps: &[Tp]) {
        for tp in tps {
            self.metrics.forget_partition(&format!("{}-{}", tp.0, tp.1));
            self.metrics.forget_lag(&tp.0, tp.1);
            if self.parts.remove(tp).is_some() {
                tracing::info!(topic = %tp.0, partition = tp.1, "partition revoked, state released");
            }
            self.offsets.remove(tp);
            self.unowned.insert(tp.clone(), Instant::now());
        }
        self.publish_holdings();
        self.refresh_gauges();
    }

    /// Deletes local state of partitions this instance has not owned for
    /// `state.cleanup_grace_seconds` (the changelog still has it).
    pub fn cleanup_unowned(&mut self) {
        if self.unowned.is_empty() {
            return;
        }
        let grace = Duration::from_secs_f64(self.cfg.state.cleanup_grace_seconds);
        let parts = &self.parts;
        let due = cleanup_due(
            &self.unowned,
            |tp| parts.contains_key(tp),
            Instant::now(),
            grace,
        );
        for tp in due {
            self.unowned.remove(&tp);
            let dir = partition_dir(&self.cfg, &tp);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed state of a partition no longer owned")
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(dir = %dir.display(), "cannot remove stale state: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoke_deadline_is_two_thirds_of_the_session_timeout() {
        assert_eq!(revoke_timeout(None), Duration::from_secs(30));
        assert_eq!(revoke_timeout(Some("6000")), Duration::from_secs(4));
        assert_eq!(revoke_timeout(Some(" 900 ")), Duration::from_secs(1));
        assert_eq!(revoke_timeout(Some("soon")), Duration::from_secs(30));
        // No overflow on absurd values.
        assert!(revoke_timeout(Some(&u64::MAX.to_string())) > Duration::from_secs(1));
    }

    /// A cycle's write runs off the caller's thread; waiting for it makes
    /// it visible, and dropping the partition waits for it too, so the
    /// directory can be opened again at once (RocksDB locks it while open).
    #[test]
    fn a_committed_write_lands_before_the_wait_and_before_the_drop() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::load(None).unwrap().engine();
        let part_at = |path: &std::path::Path| {
            let store = Store::open(path).unwrap();
            let (engine, _) = store.load(cfg.clone()).unwrap();
            Part::new(store, engine, None)
        };
        let records = |n: u32| -> Vec<Record> {
            (0..n)
                .map(|i| (format!("c-test-{i:06}").into_bytes(), Some(vec![7; 64])))
                .collect()
        };
        let mut part = part_at(dir.path());
        part.start_write(records(20_000), 0, vec![("test_pos", 5)], 1 << 20)
            .unwrap();
        part.finish_write(1 << 20).unwrap();
        assert!(part.writing.is_none());
        assert_eq!(part.store.position("test_pos").unwrap(), Some(5));
        assert_eq!(part.store.get(b"c-test-019999").unwrap(), Some(vec![7; 64]));
        // A second write, then the partition dropped with it in flight.
        part.start_write(records(200_000), 0, vec![("test_pos", 6)], 1 << 20)
            .unwrap();
        drop(part);
        let again = Store::open(dir.path()).unwrap();
        assert_eq!(again.position("test_pos").unwrap(), Some(6));
        assert!(again.get(b"c-test-199999").unwrap().is_some());
    }

    #[test]
    fn unowned_state_is_removed_after_the_grace_only() {
        let t0 = Instant::now();
        let mut unowned = HashMap::new();
        unowned.insert(("votes".to_string(), 0), t0);
        unowned.insert(("votes".to_string(), 1), t0 + Duration::from_secs(5));
        unowned.insert(("votes".to_string(), 2), t0);
        let owned = |tp: &Tp| tp.1 == 2;
        let grace = Duration::from_secs(10);
        assert!(cleanup_due(&unowned, owned, t0 + Duration::from_secs(9), grace).is_empty());
        assert_eq!(
            cleanup_due(&unowned, owned, t0 + Duration::from_secs(10), grace),
            vec![("votes".to_string(), 0)]
        );
        assert_eq!(
            cleanup_due(&unowned, owned, t0 + Duration::from_secs(15), grace).len(),
            2
        );
    }
}
