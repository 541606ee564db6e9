//! Partitions coming and going: the session's answer to rebalances (the
//! [`Rebalance`] interface the consumer context calls), and the restore's
//! adoption on the poll loop: take restored partitions into service,
//! publish an interrupted outbox cycle's missing events, seek, resume.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::{Offset, TopicPartitionList};

use crate::service::client::context::{Ctx, Rebalance};
use crate::service::client::lanes::Lanes;
use crate::service::client::Tp;
use crate::service::cycle::commit::{commit, complete_delivery, hand_over};
use crate::service::error::{Result, ServiceError};
use crate::service::partition::restore::{RestoreJob, Restored};
use crate::service::session::Session;

/// The service's consumer.
pub type Consumer = BaseConsumer<Ctx<Session>>;

impl Rebalance for Session {
    fn revoke(&mut self, consumer: &Consumer, revoked: &[Tp], lost: bool, started: Instant) {
        let limit = self.revoke_timeout();
        let until = started + limit;
        // A restore in progress stops (its applied cycles are kept); the
        // partitions still assigned afterwards are restored again.
        let interrupted = self.cancel_restore();
        self.to_restore.extend(interrupted);
        self.to_restore.retain(|tp| !revoked.contains(tp));
        self.metrics
            .rebalance(if lost { "lost" } else { "revoked" });
        if lost {
            tracing::warn!("partitions lost: aborting the open cycle without committing");
            self.abort();
        } else {
            // Finish the open cycle within the revoke deadline, or abort it
            // (nothing partial is committed; the next owner restores).
            self.deadline = Some(until);
            let result = commit(self, consumer).and_then(|()| hand_over(self));
            self.deadline = None;
            if let Err(e) = result {
                tracing::error!(
                    deadline_ms = limit.as_millis() as u64,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "commit before revoke failed (the cycle was aborted): {}",
                    crate::error::Chain(&e)
                );
                self.fail(e);
            }
        }
        self.release(revoked, until);
        self.metrics
            .revoke_duration(started.elapsed().as_secs_f64());
        tracing::info!(partitions = ?revoked, lost, elapsed_ms = started.elapsed().as_millis() as u64,
            deadline_ms = limit.as_millis() as u64, "partitions handed over");
    }

    fn assign(&mut self, consumer: &Consumer, tps: Vec<Tp>) {
        tracing::info!(partitions = ?tps, "partitions assigned");
        self.metrics.rebalance("assigned");
        self.assigned_once = true;
        // Paused until restored (an application pause survives a revoke
        // and reassignment, so every restore ends in resume).
        let mut tpl = TopicPartitionList::new();
        for tp in &tps {
            tpl.add_partition(&tp.0, tp.1);
            self.unowned.remove(tp);
        }
        if let Err(e) = consumer.pause(&tpl) {
            self.fail(ServiceError::kafka("pause partitions to restore", e));
        }
        self.to_restore.extend(tps);
        self.publish_holdings();
    }
}

/// Starts restoring the queued partitions when no restore runs, and takes
/// a finished restore into service: adopt, seek, resume.
pub fn drive_restore(
    s: &mut Session,
    consumer: &Arc<Consumer>,
    lanes: &mut Lanes<Ctx<Session>>,
) -> Result<()> {
    if let Some(result) = s.restoring.as_mut().and_then(RestoreJob::try_finish) {
        let job = s.restoring.take().expect("checked above");
        let restored = result?;
        let started = Instant::now();
        adopt(s, restored)?;
        for tp in &job.tps {
            if let Some(p) = s.parts.get(tp) {
                s.agreement_counted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .baseline(&format!("{}-{}", tp.0, tp.1), p.engine().agreement());
            }
        }
        seek_to_state(s, consumer, &job.tps)?;
        let mut tpl = TopicPartitionList::new();
        for tp in &job.tps {
            tpl.add_partition(&tp.0, tp.1);
            // Restores kept no partition from polling: none was idle.
            if let Some(p) = s.parts.get_mut(tp) {
                p.touch();
                // Its own queue before it is resumed, so that none of its
                // records can be in the main queue.
                lanes.split(consumer, tp, p.next_offset())?;
            }
        }
        consumer
            .resume(&tpl)
            .map_err(|e| ServiceError::kafka("resume restored partitions", e))?;
        let secs = job.started.elapsed().as_secs_f64() / job.tps.len().max(1) as f64;
        for _ in &job.tps {
            s.metrics.restore_duration(secs);
        }
        tracing::info!(partitions = ?job.tps, elapsed_ms = job.started.elapsed().as_millis() as u64,
            adopt_ms = started.elapsed().as_millis() as u64, "restored partitions resumed");
        s.publish_holdings();
        s.refresh_gauges();
    }
    if s.restoring.is_none() && !s.to_restore.is_empty() {
        let mut tps = std::mem::take(&mut s.to_restore);
        tps.sort();
        tps.dedup();
        tps.retain(|tp| !s.parts.contains_key(tp));
        if !tps.is_empty() {
            s.restoring = Some(RestoreJob::start(&s.cfg, &s.names, tps)?);
            s.publish_holdings();
        }
    }
    Ok(())
}

/// Takes restored partitions into service: overwrites the records of an
/// interrupted cycle left at the changelog's end, and (outbox mode)
/// publishes the events of each one's last cycle that the restore found
/// missing from the outputs, then marks those cycles delivered.
fn adopt(s: &mut Session, restored: Vec<Restored>) -> Result<()> {
    let mut in_doubt = Vec::new();
    for Restored {
        tp,
        mut part,
        leftover,
        undelivered,
        changelog_records,
    } in restored
    {
        s.metrics.restored_records(changelog_records);
        s.unowned.remove(&tp);
        if !leftover.is_empty() {
            tracing::warn!(
                topic = %tp.0,
                partition = tp.1,
                records = leftover.len(),
                "the changelog ends with records of an interrupted cycle: ignored, and \
                 overwritten with the committed values in the next cycle"
            );
            part.rewrite(leftover)?;
        }
        // The group offset can lag the marker by a cycle (a crash between
        // the changelog and the group commit): commit the marker's
        // position in the next cycle, so consumer lag reads right even
        // when no further record arrives on this partition.
        let catch_up_offset = part.next_offset() >= 0;
        if catch_up_offset {
            s.note_offset(&tp, part.next_offset());
        }
        let dirty = part.dirty();
        s.parts.insert(tp.clone(), part);
        if dirty || catch_up_offset {
            s.ensure_cycle()?;
        }
        s.attach_reputation(&tp)?;
        if let Some(u) = undelivered {
            in_doubt.push((tp, u));
        }
    }
    complete_delivery(s, in_doubt)
}

/// Points the consumer at the restored state's next input offset: the
/// changelog's cycle marker, not the group's committed offset (which a
/// crash can leave behind), says where each partition continues.
fn seek_to_state(s: &Session, consumer: &Consumer, tps: &[Tp]) -> Result<()> {
    for tp in tps {
        let Some(next) = s.parts.get(tp).map(|p| p.next_offset()) else {
            continue;
        };
        if next < 0 {
            continue;
        }
        consumer
            .seek(&tp.0, tp.1, Offset::Offset(next), Duration::from_secs(10))
            .map_err(|e| ServiceError::kafka(&format!("seek {}-{} to {next}", tp.0, tp.1), e))?;
        tracing::debug!(topic = %tp.0, partition = tp.1, offset = next, "continuing from the restored state");
    }
    Ok(())
}

/// A record of a partition that is not restored yet (fetched before its
/// pause): it will be read again. A partition without a cycle marker
/// continues from the consumer's position, so rewind to the record.
pub fn not_restored(s: &mut Session, consumer: &Consumer, tp: &Tp, offset: i64) {
    let queued =
        s.restoring.as_ref().is_some_and(|j| j.tps.contains(tp)) || s.to_restore.contains(tp);
    if !queued {
        let assigned = consumer
            .assignment()
            .is_ok_and(|a| a.find_partition(&tp.0, tp.1).is_some());
        if !assigned {
            tracing::debug!(topic = %tp.0, partition = tp.1, offset, "record of a partition not assigned: ignored");
            return;
        }
        s.unowned.remove(tp);
        s.to_restore.push(tp.clone());
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.0, tp.1);
    if let Err(e) = consumer.pause(&tpl) {
        s.fail(ServiceError::kafka("pause a partition", e));
    }
    if let Err(e) = consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::from_secs(10)) {
        s.fail(ServiceError::kafka(
            "seek back a partition being restored",
            e,
        ));
    }
}
