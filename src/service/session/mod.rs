//! One consumer-group session: the assigned partitions ([`Part`]), the
//! producer, and the open commit cycle (whether one is open, its input
//! offsets, whether the session must be rebuilt). Only this file writes
//! those three; the commit order is `cycle::plan`'s, driven by
//! `cycle::commit`; rebalances reach the session through
//! `rebalance`.

pub mod overlap;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, Producer as _};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::{Config, Delivery, TRANSACTION_MARGIN_MS};
use crate::engine::ScoreUpdate;
use crate::input::DecodeOptions;
use crate::kafka::property;
use crate::service::client::{
    cleanup_due, partition_dir, send, Names, Out, Outputs, ProduceCtx, Tp, ORIGIN_HEADER,
};
use crate::service::error::{Result, ServiceError};
use crate::service::partition::restore::RestoreJob;
use crate::service::partition::Part;
use crate::service::session::overlap::{AgreementSums, Deferred, InFlight, Overlap};
use crate::state::Store;
use crate::telemetry::Metrics;
use crate::time::Nanos;

/// How long one step of a commit cycle may take outside a rebalance.
const CYCLE_STEP_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Session {
    pub cfg: Config,
    pub names: Names,
    pub decode: DecodeOptions,
    /// `input.max_future_skew_seconds` in nanoseconds.
    pub max_skew: Nanos,
    /// Shared with an overlapped commit's thread (`session::overlap`).
    pub producer: Arc<BaseProducer<ProduceCtx>>,
    pub delivery: Delivery,
    pub outputs: Outputs,
    pub metrics: Arc<Metrics>,
    /// The agreement sums the metrics have counted, per partition.
    pub agreement_counted: std::sync::Mutex<crate::engine::agreement::Counted>,
    pub parts: HashMap<Tp, Part>,
    /// Whether a cycle is open, and since when.
    in_cycle: bool,
    cycle_started: Instant,
    /// `exactly_once`: whether the open cycle's transaction has begun (it
    /// begins only once the cycle before it has committed).
    txn_open: bool,
    /// The cycle before the open one, committing off the poll loop, and
    /// the open cycle's events waiting for its transaction to begin.
    pub overlap: Overlap,
    /// When each input record of the open cycle was read.
    read_at: Vec<Instant>,
    /// Input offsets to commit with the open cycle.
    offsets: HashMap<Tp, i64>,
    /// Set when the session must be rebuilt (a failed commit, a lost assignment).
    broken: Option<ServiceError>,
    /// Reused buffer for the engine's score updates.
    pub updates: Vec<ScoreUpdate>,
    /// Whether a partition assignment (possibly empty) has been received.
    pub assigned_once: bool,
    /// Local partition databases not owned now, and since when.
    pub unowned: HashMap<Tp, Instant>,
    /// Assigned partitions whose state is still to be restored (paused).
    pub to_restore: Vec<Tp>,
    /// The restore running off the poll loop, if any.
    pub restoring: Option<RestoreJob>,
    /// While partitions are handed over: when the open cycle must be
    /// finished (or aborted) by. Outside a rebalance each step of a cycle
    /// may take [`CYCLE_STEP_TIMEOUT`].
    pub deadline: Option<Instant>,
    /// What the query API sees: the assigned partitions, ready or restoring.
    pub holdings: Arc<crate::api::Holdings>,
    /// `exactly_once`: how long after a cycle opens its steps must have
    /// ended (its transaction's timeout less [`TRANSACTION_MARGIN_MS`]).
    txn_budget: Option<Duration>,
    /// contract §14 (modes `shadow` and `learned`): the reputation topic's
    /// reader and the group's view.
    pub reputation: Option<crate::service::reputation::Reputation>,
}

/// How long the next step of a cycle may take at `now`: until the revoke
/// deadline while partitions are handed over, else [`CYCLE_STEP_TIMEOUT`];
/// never past the open transaction's deadline (a step that would run past
/// it fails, and the cycle is aborted, rather than commit a transaction
/// the broker may have aborted); at least 1 ms.
pub fn step_budget(now: Instant, revoke: Option<Instant>, txn: Option<Instant>) -> Duration {
    let left = |d: Instant| d.saturating_duration_since(now);
    let mut t = revoke.map_or(CYCLE_STEP_TIMEOUT, left);
    if let Some(d) = txn {
        t = t.min(left(d));
    }
    t.max(Duration::from_millis(1))
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

impl Session {
    pub fn new(
        cfg: &Config,
        names: &Names,
        producer: BaseProducer<ProduceCtx>,
        outputs: Outputs,
        metrics: &Arc<Metrics>,
        holdings: &Arc<crate::api::Holdings>,
        unowned: Vec<Tp>,
    ) -> Session {
        Session {
            cfg: cfg.clone(),
            names: names.clone(),
            decode: cfg.decode_options(),
            max_skew: crate::config::seconds_to_ns(cfg.input.max_future_skew_seconds),
            producer: Arc::new(producer),
            delivery: cfg.kafka.delivery,
            outputs,
            metrics: metrics.clone(),
            agreement_counted: Default::default(),
            parts: HashMap::new(),
            in_cycle: false,
            cycle_started: Instant::now(),
            txn_open: false,
            overlap: Overlap::new(),
            read_at: Vec::new(),
            offsets: HashMap::new(),
            broken: None,
            updates: Vec::new(),
            assigned_once: false,
            unowned: unowned.into_iter().map(|tp| (tp, Instant::now())).collect(),
            to_restore: Vec::new(),
            restoring: None,
            deadline: None,
            holdings: holdings.clone(),
            txn_budget: cfg.kafka.delivery.transactional().then(|| {
                let ms = cfg.transaction_timeout_ms() - TRANSACTION_MARGIN_MS;
                Duration::from_millis(ms.max(1) as u64)
            }),
            reputation: None,
        }
    }

    /// How long the next step of the cycle may take ([`step_budget`]).
    pub fn step_timeout(&self) -> Duration {
        step_budget(Instant::now(), self.deadline, self.transaction_deadline())
    }

    /// When the open cycle's steps must have ended, in `exactly_once`.
    fn transaction_deadline(&self) -> Option<Instant> {
        let budget = self.txn_budget?;
        self.in_cycle.then(|| self.cycle_started + budget)
    }

    /// The revoke deadline for this configuration.
    pub fn revoke_timeout(&self) -> Duration {
        revoke_timeout(property(&self.cfg, "session.timeout.ms").as_deref())
    }

    /// Opens a cycle if none is open (`exactly_once`: begins its
    /// transaction, unless the cycle before it is still committing: then
    /// [`Session::begin_deferred`] does once it has).
    pub fn ensure_cycle(&mut self) -> Result<()> {
        if !self.in_cycle {
            self.in_cycle = true;
            self.cycle_started = Instant::now();
        }
        if !self.txn_open && !self.overlap.busy() && self.delivery.transactional() {
            self.begin_deferred()?;
        }
        Ok(())
    }

    /// Begins the open cycle's transaction and sends the events it
    /// emitted while the cycle before it committed.
    pub fn begin_deferred(&mut self) -> Result<()> {
        if !self.in_cycle || self.txn_open || !self.delivery.transactional() {
            return Ok(());
        }
        self.producer
            .begin_transaction()
            .map_err(|e| ServiceError::kafka_txn("begin transaction", e))?;
        self.txn_open = true;
        for d in self.overlap.take_deferred() {
            send(
                &self.producer,
                Out {
                    topic: self.outputs.topic(d.route),
                    key: d.key.as_deref(),
                    payload: Some(&d.payload),
                    partition: d.partition,
                    header: Some((ORIGIN_HEADER, d.origin.as_bytes())),
                },
            )?;
        }
        Ok(())
    }

    /// Whether events must wait ([`Session::defer`]): the cycle before the
    /// open one is still committing.
    pub fn defers(&self) -> bool {
        self.overlap.busy()
    }

    /// Keeps an event of the open cycle until its transaction begins.
    pub fn defer(&mut self, ev: Deferred) {
        self.overlap.defer(ev);
    }

    /// An input record of the open cycle was read at `at`.
    pub fn note_read(&mut self, at: Instant) {
        self.read_at.push(at);
    }

    /// The open cycle's transaction now commits off the poll loop
    /// ([`InFlight::new`] of `done`, `thread`, `sealed` and `started`; its
    /// records and marker are sent): the next records open the next cycle.
    pub fn detach(
        &mut self,
        done: std::sync::mpsc::Receiver<Result<()>>,
        thread: std::thread::JoinHandle<()>,
        sealed: Vec<Tp>,
        started: Instant,
    ) {
        let read_at = std::mem::take(&mut self.read_at);
        let agreement = self.agreement_sums();
        self.overlap.start(InFlight::new(
            done, thread, sealed, started, agreement, read_at,
        ));
        self.metrics.commit_in_flight(true);
        self.in_cycle = false;
        self.txn_open = false;
        self.offsets.clear();
    }

    /// The overlapped commit's answer, once it is in (`wait`: as
    /// [`Overlap::answer`]). Committed: its records' commit latency. Failed:
    /// its transaction is aborted (the session is then rebuilt, and a
    /// committer still without an answer is fenced by the next producer).
    pub fn take_landed(&mut self, wait: Option<Duration>) -> Option<(Result<()>, InFlight)> {
        let (result, f) = self.overlap.answer(wait)?;
        self.metrics.commit_in_flight(false);
        if result.is_ok() {
            self.metrics.vote_commit_latency(&f.read_at, Instant::now());
            self.producer.poll(Duration::ZERO);
            if let Some(e) = self.producer.context().take_failure() {
                tracing::debug!("stale delivery failure after commit: {e}");
            }
        } else {
            let timeout = step_budget(Instant::now(), self.deadline, None);
            if let Err(e) = self.producer.abort_transaction(timeout) {
                tracing::warn!("abort of the failed transaction: {e}");
            }
        }
        Some((result, f))
    }

    /// Whether a cycle is open.
    pub fn in_cycle(&self) -> bool {
        self.in_cycle
    }

    /// How long the open cycle has been open.
    pub fn cycle_age(&self) -> Duration {
        self.cycle_started.elapsed()
    }

    /// The open cycle is durable (a restart restores it): no longer open,
    /// and no longer to be aborted.
    pub fn cycle_durable(&mut self) {
        self.in_cycle = false;
        self.txn_open = false;
    }

    /// The open cycle reaches input offset `next` of `tp`.
    pub fn note_offset(&mut self, tp: &Tp, next: i64) {
        match self.offsets.get_mut(tp) {
            Some(o) => *o = next,
            None => {
                self.offsets.insert(tp.clone(), next);
            }
        }
    }

    /// The open cycle's input offsets.
    pub fn offset_list(&self) -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in &self.offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(|e| ServiceError::kafka("offset list", e))?;
        }
        Ok(tpl)
    }

    /// The open cycle's input offsets are committed (with its events).
    pub fn offsets_committed(&mut self) {
        self.offsets.clear();
        self.metrics
            .vote_commit_latency(&self.read_at, Instant::now());
        self.read_at.clear();
    }

    /// Marks the session for a rebuild (the first reason is kept).
    pub fn fail(&mut self, e: ServiceError) {
        self.broken.get_or_insert(e);
    }

    /// Why the session must be rebuilt, if it must.
    pub fn take_broken(&mut self) -> Option<ServiceError> {
        self.broken.take()
    }

    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    pub fn part_mut(&mut self, tp: &Tp) -> Result<&mut Part> {
        self.parts.get_mut(tp).ok_or_else(|| not_assigned(tp))
    }

    /// Waits until everything queued is acknowledged.
    pub fn flush_acked(&self, what: &str) -> Result<()> {
        crate::kafka::flush_now(&self.producer, self.step_timeout())
            .map_err(|e| ServiceError::kafka(what, e))?;
        self.producer.poll(Duration::ZERO);
        match self.producer.context().take_failure() {
            Some(e) => Err(ServiceError::delivery(what, &e)),
            None => Ok(()),
        }
    }

    /// Waits for every partition's RocksDB write in flight (and evicts),
    /// within the step timeout.
    pub fn finish_writes(&mut self) -> Result<()> {
        let budget = self.cache_share();
        let timeout = self.step_timeout();
        for part in self.parts.values_mut() {
            part.finish_write(budget, timeout)?;
        }
        Ok(())
    }

    /// Each partition's share of `state.cache_mb`.
    pub fn cache_share(&self) -> usize {
        self.cfg.cache_bytes() / self.parts.len().max(1)
    }

    /// Drops the open cycle; the in-memory state now runs ahead of what was
    /// committed, so the session is marked for a rebuild.
    pub fn abort(&mut self) {
        // A commit in flight answers first (within the step's time): the
        // producer takes one transaction at a time.
        let wait = step_budget(Instant::now(), self.deadline, None);
        let _ = self.take_landed(Some(wait));
        self.overlap.take_deferred();
        self.read_at.clear();
        if self.in_cycle {
            if self.txn_open {
                self.txn_open = false;
                // Not capped by the transaction's deadline: past it, the
                // abort still tells the broker at once.
                let timeout = step_budget(Instant::now(), self.deadline, None);
                if let Err(e) = self.producer.abort_transaction(timeout) {
                    tracing::error!("abort transaction failed: {e}");
                }
            }
            self.in_cycle = false;
        }
        self.offsets.clear();
        for p in self.parts.values_mut() {
            p.drop_cycle();
        }
        self.fail(ServiceError::internal(
            "cycle aborted; rebuilding state from the last commit",
        ));
    }

    /// Each partition's agreement sums as the engines hold them now (as a
    /// cycle that was just sealed left them).
    pub fn agreement_sums(&self) -> AgreementSums {
        self.parts
            .iter()
            .map(|(tp, part)| {
                (
                    format!("{}-{}", tp.0, tp.1),
                    part.engine().agreement().clone(),
                )
            })
            .collect()
    }

    /// After a commit: the metrics the cycle moved (`sums`: the agreement
    /// sums it committed, [`Session::agreement_sums`] at its seal).
    pub fn committed(&self, started: Instant, sums: &AgreementSums) {
        self.metrics
            .commit_duration(started.elapsed().as_secs_f64());
        self.refresh_gauges();
        let mut counted = self
            .agreement_counted
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (partition, sums) in sums {
            for (rubric, sums) in counted.committed(partition, sums) {
                self.metrics.agreement(&rubric, sums);
            }
        }
    }

    /// Bytes of events waiting in outboxes, or for the open cycle's
    /// transaction to begin.
    pub fn outbox_bytes(&self) -> usize {
        self.overlap.deferred_bytes() + self.parts.values().map(Part::held_bytes).sum::<usize>()
    }

    /// Folds every partition's engine counters and gauges into the metrics.
    pub fn refresh_gauges(&self) {
        for (tp, part) in &self.parts {
            self.metrics
                .observe_engine(&format!("{}-{}", tp.0, tp.1), part.engine());
        }
        let (open, pending) = self.parts.values().fold((0, 0), |(o, p), part| {
            (o + part.engine().open_values(), p + part.pending_batches())
        });
        self.metrics.reputation_gauges(open, pending);
        let rows = crate::engine::board::gauge_rows(
            self.parts.values().flat_map(|p| p.engine().board()),
            |k| {
                self.metrics
                    .pair_labels(k.model_id.as_deref(), &k.voter_prompt_id)
            },
        );
        self.metrics.model_board(rows);
    }

    /// Tells the query API which partitions are ready (their stores) and
    /// which are queued or restoring.
    pub fn publish_holdings(&self) {
        let mut held: std::collections::BTreeMap<Tp, Option<Arc<Store>>> = self
            .parts
            .iter()
            .map(|(tp, p)| (tp.clone(), Some(p.store().clone())))
            .collect();
        let restoring = self.restoring.iter().flat_map(|j| j.tps.iter());
        for tp in self.to_restore.iter().chain(restoring) {
            held.entry(tp.clone()).or_insert(None);
        }
        self.metrics.partitions_held(
            held.iter()
                .map(|(tp, store)| (format!("{}-{}", tp.0, tp.1), store.is_some())),
        );
        self.holdings.set_held(held);
    }

    /// Releases revoked partitions (their state stays on disk for
    /// `state.cleanup_grace_seconds`), waiting for their writes until
    /// `until` at most.
    pub fn release(&mut self, tps: &[Tp], until: Instant) {
        for tp in tps {
            let partition = format!("{}-{}", tp.0, tp.1);
            self.metrics.forget_partition(&partition);
            self.agreement_counted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .forget(&partition);
            self.metrics.forget_lag(&tp.0, tp.1);
            if let Some(part) = self.parts.remove(tp) {
                part.release(until);
                tracing::info!(topic = %tp.0, partition = tp.1, "partition revoked, state released");
            }
            self.offsets.remove(tp);
            self.unowned.insert(tp.clone(), Instant::now());
        }
        self.publish_holdings();
        self.refresh_gauges();
    }

    /// Stops a running restore without waiting for it (a rebalance, the
    /// session's end): returns its partitions. Its thread finishes on its
    /// own; the next open of its directories waits for it.
    pub fn cancel_restore(&mut self) -> Vec<Tp> {
        match self.restoring.take() {
            Some(job) => job.cancel(),
            None => Vec::new(),
        }
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
            let dir = partition_dir(&self.cfg, &tp);
            if crate::service::partition::is_held(&dir) {
                continue; // a write or a cancelled restore still holds it
            }
            self.unowned.remove(&tp);
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

impl Drop for Session {
    /// The query API lets go of the session's stores, which close with it;
    /// a restore still running lingers (see `partition`).
    fn drop(&mut self) {
        self.cancel_restore();
        self.holdings.set_held(Default::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_never_runs_past_the_transaction_deadline() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(step_budget(now, None, None), CYCLE_STEP_TIMEOUT);
        assert_eq!(step_budget(now, Some(now + s(4)), None), s(4));
        assert_eq!(step_budget(now, None, Some(now + s(9))), s(9));
        assert_eq!(step_budget(now, Some(now + s(4)), Some(now + s(9))), s(4));
        assert_eq!(step_budget(now, Some(now + s(30)), Some(now + s(9))), s(9));
        // Past a deadline: 1 ms, so the step fails at once.
        let past = now.checked_sub(s(1)).unwrap_or(now);
        assert_eq!(step_budget(now, None, Some(past)), Duration::from_millis(1));
        assert_eq!(step_budget(now, Some(past), None), Duration::from_millis(1));
    }

    #[test]
    fn revoke_deadline_is_two_thirds_of_the_session_timeout() {
        assert_eq!(revoke_timeout(None), Duration::from_secs(30));
        assert_eq!(revoke_timeout(Some("6000")), Duration::from_secs(4));
        assert_eq!(revoke_timeout(Some(" 900 ")), Duration::from_secs(1));
        assert_eq!(revoke_timeout(Some("soon")), Duration::from_secs(30));
        // No overflow on absurd values.
        assert!(revoke_timeout(Some(&u64::MAX.to_string())) > Duration::from_secs(1));
    }
}
