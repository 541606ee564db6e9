//! The live side of a commit cycle: [`commit`] runs the delivery mode's
//! plan (`super::cycle`, pure) over [`Live`], whose steps talk to Kafka
//! and start the RocksDB writes; the outbox's publishing and delivered
//! markers are here too. In every mode RocksDB is written only after the
//! changelog holds the cycle, with the changelog position it reflects.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext};
use rdkafka::producer::Producer;

use super::changelog::{OutEvent, CHANGELOG_HEADER, CYCLE_KEY};
use super::client::{send, Out, Tp, ORIGIN_HEADER};
use super::cycle::{drive, Step, Steps};
use super::error::{Result, ServiceError};
use super::reconcile::origin;
use super::session::Session;
use crate::config::Delivery;

/// Ends the open cycle in the delivery mode's order; on failure aborts
/// what of it is not durable (the session is then rebuilt).
pub fn commit<C: ConsumerContext>(s: &mut Session, consumer: &BaseConsumer<C>) -> Result<()> {
    if !s.in_cycle() {
        return Ok(());
    }
    let started = Instant::now();
    // The previous cycle's RocksDB writes land before this cycle's
    // changelog: its sweep and reviewer reads must see them.
    let result = s.finish_writes().and_then(|()| {
        let mut live = Live {
            s: &mut *s,
            consumer,
            sealed: Vec::new(),
            phases: Phases::start(),
        };
        drive(live.s.delivery, &mut live)?;
        live.phases.log();
        Ok(())
    });
    match result {
        Ok(()) => {
            s.committed(started);
            Ok(())
        }
        Err(e) => {
            s.abort();
            Err(e)
        }
    }
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
                let offsets = s.offset_list()?;
                if offsets.count() > 0 {
                    let meta = self
                        .consumer
                        .group_metadata()
                        .ok_or_else(|| ServiceError::internal("no consumer group metadata"))?;
                    s.producer
                        .send_offsets_to_transaction(&offsets, &meta, s.step_timeout())
                        .map_err(|e| ServiceError::kafka_txn("send offsets to transaction", e))?;
                }
            }
            Step::CommitTransaction => {
                s.producer
                    .commit_transaction(s.step_timeout())
                    .map_err(|e| ServiceError::kafka_txn("commit transaction", e))?;
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

/// Sends, for every partition the cycle touched, its state records and
/// the records that seal the cycle (outbox chunks, marker) to its
/// changelog partition. Returns the partitions sealed.
fn send_changelog(s: &mut Session) -> Result<Vec<Tp>> {
    // SPEC §14: what the partitions sealed goes with their cycle.
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
pub fn publish_outboxed(s: &Session, tp: &Tp, seq: u64, idx: u32, ev: &OutEvent) -> Result<()> {
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

/// Writes the cycle marker of `tps` again with `delivered` set, to the
/// changelog and then RocksDB.
pub fn write_delivered(s: &mut Session, tps: &[Tp]) -> Result<()> {
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
