//! The live side of a commit cycle: [`commit`] runs the delivery mode's
//! plan (`cycle::plan`, pure) over [`Live`], whose steps talk to Kafka
//! and start the RocksDB writes; the outbox's publishing and delivered
//! markers are here too. In every mode RocksDB is written only after the
//! changelog holds the cycle, with the changelog position it reflects.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::TopicPartitionList;

use crate::config::Delivery;
use crate::service::client::{send, Out, ProduceCtx, Tp, ORIGIN_HEADER};
use crate::service::cycle::plan::{drive, drive_part, overlap, Step, Steps};
use crate::service::error::{Result, ServiceError};
use crate::service::partition::changelog::{OutEvent, CHANGELOG_HEADER, CYCLE_KEY};
use crate::service::partition::reconcile::origin;
use crate::service::partition::restore::Undelivered;
use crate::service::session::overlap::CommitHold;
use crate::service::session::Session;

/// Ends the open cycle in the delivery mode's order and waits for its
/// commit (a rebalance, the shutdown); on failure aborts what of it is not
/// durable (the session is then rebuilt).
pub fn commit<C: ConsumerContext>(s: &mut Session, consumer: &BaseConsumer<C>) -> Result<()> {
    commit_cycle(s, consumer, false)
}

/// The poll loop's commit: as [`commit`], except that where the mode allows
/// (`cycle::plan::overlap`) the commit's wait runs off the poll loop, which goes
/// on with the next cycle; [`land`] takes its answer.
pub fn commit_overlapped<C: ConsumerContext>(
    s: &mut Session,
    consumer: &BaseConsumer<C>,
) -> Result<()> {
    commit_cycle(s, consumer, true)
}

fn commit_cycle<C: ConsumerContext>(
    s: &mut Session,
    consumer: &BaseConsumer<C>,
    overlapped: bool,
) -> Result<()> {
    // The cycle before lands first: the producer takes one transaction
    // at a time, and this cycle's records rest on that one's.
    let wait = s.step_timeout();
    land(s, consumer, Some(wait))?;
    if !s.in_cycle() {
        return Ok(());
    }
    let started = Instant::now();
    let split = overlap(s.delivery).filter(|_| overlapped);
    // The previous cycle's RocksDB writes land before this cycle's
    // changelog: its sweep and reviewer reads must see them.
    let result = s.finish_writes().and_then(|()| {
        let mut live = Live {
            s: &mut *s,
            consumer,
            sealed: Vec::new(),
            phases: Phases::start(),
        };
        match split {
            None => drive(live.s.delivery, &mut live)?,
            Some(split) => {
                drive_part(live.s.delivery, split.on_loop, &mut live)?;
                let sealed = std::mem::take(&mut live.sealed);
                detach(live.s, consumer, split.off_loop, sealed, started)?;
            }
        }
        live.phases.log();
        Ok(())
    });
    match result {
        Ok(()) if split.is_some() => Ok(()),
        Ok(()) => {
            s.committed(started, &s.agreement_sums());
            Ok(())
        }
        Err(e) => {
            s.abort();
            Err(e)
        }
    }
}

/// Hands the open cycle's remaining steps (`off_loop`: its offsets into the
/// transaction, the commit) to a committer thread.
fn detach<C: ConsumerContext>(
    s: &mut Session,
    consumer: &BaseConsumer<C>,
    off_loop: &'static [Step],
    sealed: Vec<Tp>,
    started: Instant,
) -> Result<()> {
    let mut committer = Committer {
        producer: s.producer.clone(),
        offsets: s.offset_list()?,
        meta: consumer.group_metadata(),
        timeout: s.step_timeout(),
        hold: s.overlap.hold,
    };
    let mode = s.delivery;
    let (tx, done) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("txn-commit".into())
        .spawn(move || {
            let _ = tx.send(drive_part(mode, off_loop, &mut committer));
        })
        .map_err(|e| ServiceError::thread("the transaction's committer", e))?;
    s.detach(done, thread, sealed, started);
    Ok(())
}

/// Takes an overlapped commit's answer once it is in (`wait`: waits that
/// long for it; `None`: only one already there). Committed: the cycle's
/// metrics, its RocksDB writes start, and the open cycle's transaction
/// begins with the events it deferred. Failed: the session aborts.
pub fn land<C: ConsumerContext>(
    s: &mut Session,
    consumer: &BaseConsumer<C>,
    wait: Option<Duration>,
) -> Result<()> {
    let Some((result, landed)) = s.take_landed(wait) else {
        return Ok(());
    };
    let Some(split) = overlap(s.delivery) else {
        return Err(ServiceError::internal(
            "a commit landed in a mode without overlap",
        ));
    };
    let result = result.and_then(|()| {
        s.committed(landed.started, &landed.agreement);
        let mut live = Live {
            s: &mut *s,
            consumer,
            sealed: landed.sealed,
            phases: Phases::start(),
        };
        drive_part(live.s.delivery, split.landed, &mut live)?;
        s.begin_deferred()
    });
    if let Err(e) = result {
        s.abort();
        return Err(e);
    }
    Ok(())
}

/// The committer thread's steps: the transaction's end, off the poll loop.
struct Committer {
    producer: Arc<BaseProducer<ProduceCtx>>,
    offsets: TopicPartitionList,
    meta: Option<rdkafka::consumer::ConsumerGroupMetadata>,
    timeout: Duration,
    hold: Option<CommitHold>,
}

impl Steps for Committer {
    type Error = ServiceError;

    fn run(&mut self, step: Step) -> Result<()> {
        match step {
            Step::SendOffsetsToTransaction => send_offsets(
                &self.producer,
                &self.offsets,
                self.meta.as_ref(),
                self.timeout,
            )?,
            Step::CommitTransaction => {
                if let Some(CommitHold::Before(d)) = self.hold {
                    std::thread::sleep(d);
                }
                commit_transaction(&self.producer, self.timeout)?;
                if let Some(CommitHold::After(d)) = self.hold {
                    std::thread::sleep(d);
                }
            }
            other => {
                return Err(ServiceError::internal(format!(
                    "{other:?} cannot run off the poll loop"
                )))
            }
        }
        Ok(())
    }

    fn durable(&mut self) {}
}

/// Before partitions are handed over, and at shutdown: outbox mode marks
/// each partition's last cycle delivered, so the next owner need not check
/// the output topics.
pub fn hand_over(s: &mut Session) -> Result<()> {
    if s.delivery != Delivery::ExactlyOnceOutbox {
        return Ok(());
    }
    let tps: Vec<Tp> = s
        .parts
        .iter()
        .filter(|(_, p)| !p.marker().delivered)
        .map(|(tp, _)| tp.clone())
        .collect();
    write_delivered(s, &tps)
}

/// One cycle's steps against the broker and the stores.
struct Live<'a, C: ConsumerContext> {
    s: &'a mut Session,
    consumer: &'a BaseConsumer<C>,
    /// The partitions whose cycle went to the changelog.
    sealed: Vec<Tp>,
    phases: Phases,
}

impl<C: ConsumerContext> Steps for Live<'_, C> {
    type Error = ServiceError;

    fn run(&mut self, step: Step) -> Result<()> {
        let s = &mut *self.s;
        match step {
            Step::SendChangelog => self.sealed = send_changelog(s)?,
            Step::Flush(f) => s.flush_acked(f.what())?,
            Step::SendOffsetsToTransaction => {
                let meta = self.consumer.group_metadata();
                send_offsets(
                    &s.producer,
                    &s.offset_list()?,
                    meta.as_ref(),
                    s.step_timeout(),
                )?
            }
            Step::CommitTransaction => {
                commit_transaction(&s.producer, s.step_timeout())?;
                s.offsets_committed();
                s.producer.poll(Duration::ZERO);
                if let Some(f) = s.producer.context().take_failure() {
                    // Committed means every message was acknowledged; a
                    // report of a failure here is from an earlier aborted cycle.
                    tracing::debug!("stale delivery failure after commit: {f}");
                }
            }
            Step::WriteState => write_state(s, &self.sealed)?,
            Step::PublishOutbox => publish_outboxes(s, &self.sealed)?,
            Step::CommitOffsets => {
                let tpl = s.offset_list()?;
                if tpl.count() > 0 {
                    self.consumer
                        .commit(&tpl, CommitMode::Sync)
                        .map_err(|e| ServiceError::kafka("commit offsets", e))?;
                }
                s.offsets_committed();
            }
        }
        self.phases.next(step);
        Ok(())
    }

    fn durable(&mut self) {
        self.s.cycle_durable();
    }
}

/// The input `offsets` join the open transaction (none: nothing to send).
fn send_offsets(
    producer: &BaseProducer<ProduceCtx>,
    offsets: &TopicPartitionList,
    meta: Option<&rdkafka::consumer::ConsumerGroupMetadata>,
    timeout: Duration,
) -> Result<()> {
    if offsets.count() == 0 {
        return Ok(());
    }
    let meta = meta.ok_or_else(|| ServiceError::internal("no consumer group metadata"))?;
    producer
        .send_offsets_to_transaction(offsets, meta, timeout)
        .map_err(|e| ServiceError::kafka_txn("send offsets to transaction", e))
}

/// Commits the open transaction: every record acknowledged first with
/// `kafka::flush_now`, since rust-rdkafka's commit flushes in polls of
/// 100 ms that each wait their whole step.
fn commit_transaction(producer: &BaseProducer<ProduceCtx>, timeout: Duration) -> Result<()> {
    crate::kafka::flush_now(producer, timeout)
        .map_err(|e| ServiceError::kafka("flush before commit transaction", e))?;
    producer
        .commit_transaction(timeout)
        .map_err(|e| ServiceError::kafka_txn("commit transaction", e))
}

/// Sends, for every partition the cycle touched, its state records and
/// the records that seal the cycle (outbox chunks, marker) to its
/// changelog partition. Returns the partitions sealed.
fn send_changelog(s: &mut Session) -> Result<Vec<Tp>> {
    // contract §14: what the partitions sealed goes with their cycle.
    s.publish_reputation()?;
    let acked = s.producer.context().acked();
    let mut sealed = Vec::new();
    for (tp, part) in s.parts.iter_mut() {
        let outputs = &s.outputs;
        let Some(records) =
            part.seal(|r, p| acked.get(&(outputs.topic(r).to_owned(), p)).copied())?
        else {
            continue;
        };
        let topic = s.names.changelog(&tp.0);
        for (k, v) in records {
            send(
                &s.producer,
                Out {
                    topic: &topic,
                    key: Some(k),
                    payload: v.as_deref(),
                    partition: Some(tp.1),
                    header: Some(CHANGELOG_HEADER),
                },
            )?;
        }
        sealed.push(tp.clone());
    }
    Ok(sealed)
}

/// The changelog holds the cycle: RocksDB follows, with the position, on a
/// thread per partition while the poll loop goes on (the changelog, not
/// RocksDB, is what a restart restores from; the next commit waits for
/// these writes in `Session::finish_writes`).
fn write_state(s: &mut Session, sealed: &[Tp]) -> Result<()> {
    let acked = s.producer.context().acked();
    let budget = s.cache_share();
    let timeout = s.step_timeout();
    for tp in sealed {
        let pos = acked.get(&(s.names.changelog(&tp.0), tp.1)).map(|o| o + 1);
        if let Some(part) = s.parts.get_mut(tp) {
            part.start_write(tp, pos, budget, timeout)?;
        }
    }
    Ok(())
}

/// Publishes the held events of the sealed partitions' cycles.
fn publish_outboxes(s: &mut Session, sealed: &[Tp]) -> Result<()> {
    for tp in sealed {
        let Some(part) = s.parts.get(tp) else {
            continue;
        };
        for (i, ev) in part.held().iter().enumerate() {
            publish_outboxed(s, tp, part.marker().seq, i as u32, ev)?;
        }
    }
    for part in s.parts.values_mut() {
        part.clear_held();
    }
    Ok(())
}

/// Publishes event `idx` of cycle `seq` of partition `tp` from its outbox.
fn publish_outboxed(s: &Session, tp: &Tp, seq: u64, idx: u32, ev: &OutEvent) -> Result<()> {
    send(
        &s.producer,
        Out {
            topic: s.outputs.topic(ev.route),
            key: ev.key.as_deref(),
            payload: Some(&ev.payload),
            partition: Some(ev.partition),
            header: Some((ORIGIN_HEADER, origin(tp, seq, idx).as_bytes())),
        },
    )
}

/// Completes the delivery of restored partitions' last cycles that the
/// restore found not marked delivered (outbox mode): publishes the events
/// missing from the outputs, then marks those cycles delivered.
pub fn complete_delivery(s: &mut Session, in_doubt: Vec<(Tp, Undelivered)>) -> Result<()> {
    if in_doubt.is_empty() {
        return Ok(());
    }
    let mut resent = 0usize;
    for (tp, u) in &in_doubt {
        for (idx, ev) in &u.events {
            publish_outboxed(s, tp, u.seq, *idx, ev)?;
            resent += 1;
        }
    }
    if resent > 0 {
        s.flush_acked("re-publish the interrupted cycle's events")?;
    }
    for (tp, u) in &in_doubt {
        s.metrics.outbox_recovered(u.events.len());
        tracing::info!(topic = %tp.0, partition = tp.1, cycle = u.seq, events = u.total,
            published_now = u.events.len(), "completed the delivery of the last cycle before this restore");
    }
    let tps: Vec<Tp> = in_doubt.into_iter().map(|(tp, _)| tp).collect();
    write_delivered(s, &tps)
}

/// Writes the cycle marker of `tps` again with `delivered` set, to the
/// changelog and then RocksDB.
fn write_delivered(s: &mut Session, tps: &[Tp]) -> Result<()> {
    s.finish_writes()?;
    let mut sealed = Vec::new();
    for tp in tps {
        let Some((m, v)) = s.parts.get(tp).and_then(|p| p.delivered_marker()) else {
            continue;
        };
        send(
            &s.producer,
            Out {
                topic: &s.names.changelog(&tp.0),
                key: Some(CYCLE_KEY),
                payload: Some(&v),
                partition: Some(tp.1),
                header: Some(CHANGELOG_HEADER),
            },
        )?;
        sealed.push((tp.clone(), m, v));
    }
    if sealed.is_empty() {
        return Ok(());
    }
    s.flush_acked("flush cycle markers")?;
    let acked = s.producer.context().acked();
    for (tp, m, v) in sealed {
        let pos = acked.get(&(s.names.changelog(&tp.0), tp.1)).map(|o| o + 1);
        if let Some(part) = s.parts.get_mut(&tp) {
            part.store_marker(m, v, pos)?;
        }
    }
    Ok(())
}

/// Per-step durations of one cycle, logged at debug level.
struct Phases {
    at: Instant,
    done: Vec<(Step, f64)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            at: Instant::now(),
            done: Vec::new(),
        }
    }

    fn next(&mut self, step: Step) {
        let now = Instant::now();
        self.done.push((step, (now - self.at).as_secs_f64() * 1e3));
        self.at = now;
    }

    fn log(&self) {
        tracing::debug!(phases_ms = ?self.done, "cycle phases");
    }
}
