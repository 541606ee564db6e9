//! How a commit cycle reaches the broker (`kafka.delivery`): one
//! [`Protocol`] per mode, each with its commit order in one function.
//!
//! The steps they share are methods of [`Session`] below. In every mode
//! RocksDB is written only after the changelog is durable, together with
//! the changelog position it reflects, and the input offsets are committed
//! last (or inside the transaction).

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer as _;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use super::changelog::{seal_cycle, CHANGELOG_POS, CYCLE_KEY};
use super::client::{send, Out, Tp};
use super::context::Consumer;
use super::error::{Result, ServiceError};
use super::reconcile::origin;
use super::session::Session;
use crate::config::Delivery;
use crate::state::{encode_value, SWEEP_LIMIT};

/// A delivery mode.
pub trait Protocol: Send + Sync {
    /// Commits the open cycle in this mode's order. On error the caller
    /// aborts the cycle and rebuilds the session.
    fn commit(&self, s: &mut Session, consumer: &Consumer) -> Result<()>;
    /// Opens a cycle, before its first record.
    fn begin(&self, _: &Session) -> Result<()> {
        Ok(())
    }
    /// Whether the cycle's events wait in an outbox (published after the
    /// changelog holds them) instead of being sent as they are emitted.
    fn holds_events(&self) -> bool {
        false
    }
    /// Drops the open cycle.
    fn abort(&self, _: &Session) {}
    /// Before partitions are handed over, and at shutdown.
    fn hand_over(&self, _: &mut Session) -> Result<()> {
        Ok(())
    }
}

/// The protocol of a delivery mode.
pub fn protocol(d: Delivery) -> &'static dyn Protocol {
    match d {
        Delivery::ExactlyOnce => &Transactional,
        Delivery::ExactlyOnceOutbox => &Outbox,
        Delivery::AtLeastOnce => &AtLeastOnce,
    }
}

/// `exactly_once`: one Kafka transaction per cycle holds the events (sent
/// as emitted), the changelog records and the input offsets.
pub struct Transactional;

impl Protocol for Transactional {
    fn begin(&self, s: &Session) -> Result<()> {
        s.producer
            .begin_transaction()
            .map_err(|e| ServiceError::kafka_txn("begin transaction", e))
    }

    fn commit(&self, s: &mut Session, consumer: &Consumer) -> Result<()> {
        let t = Phases::start();
        let sealed = s.send_changelog()?;
        let offsets = s.offset_list()?;
        if offsets.count() > 0 {
            let meta = consumer
                .group_metadata()
                .ok_or_else(|| ServiceError::internal("no consumer group metadata"))?;
            s.producer
                .send_offsets_to_transaction(&offsets, &meta, s.step_timeout())
                .map_err(|e| ServiceError::kafka_txn("send offsets to transaction", e))?;
        }
        s.producer
            .commit_transaction(s.step_timeout())
            .map_err(|e| ServiceError::kafka_txn("commit transaction", e))?;
        s.in_cycle = false;
        s.producer.poll(Duration::ZERO);
        if let Some(f) = s.producer.context().take_failure() {
            // Committed means every message was acknowledged; a report of
            // a failure here is from an earlier aborted cycle.
            tracing::debug!("stale delivery failure after commit: {f}");
        }
        let t = t.next("changelog_ms");
        s.apply_to_store(&sealed)?;
        s.offsets.clear();
        t.next("store_ms").log();
        Ok(())
    }

    fn abort(&self, s: &Session) {
        if let Err(e) = s.producer.abort_transaction(s.step_timeout()) {
            tracing::error!("abort transaction failed: {e}");
        }
    }
}

/// `exactly_once_outbox`: the changelog first (state, the cycle's events as
/// outbox chunks, the cycle marker), acknowledged → RocksDB → the events,
/// acknowledged → group offsets. Whoever restores an interrupted cycle
/// publishes its missing events (see [`super::reconcile`]).
pub struct Outbox;

impl Protocol for Outbox {
    fn holds_events(&self) -> bool {
        true
    }

    fn commit(&self, s: &mut Session, consumer: &Consumer) -> Result<()> {
        let t = Phases::start();
        let sealed = s.send_changelog()?;
        s.flush_acked("flush changelog")?;
        s.in_cycle = false;
        let t = t.next("changelog_ms");
        s.apply_to_store(&sealed)?;
        let t = t.next("store_ms");
        s.publish_outboxes(&sealed)?;
        s.flush_acked("flush events")?;
        let t = t.next("publish_ms");
        s.commit_group_offsets(consumer)?;
        t.next("offsets_ms").log();
        Ok(())
    }

    /// Marks each partition's last cycle delivered, so the next owner need
    /// not check the output topics.
    fn hand_over(&self, s: &mut Session) -> Result<()> {
        let tps: Vec<Tp> = s
            .parts
            .iter()
            .filter(|(_, p)| !p.marker.delivered)
            .map(|(tp, _)| tp.clone())
            .collect();
        s.write_delivered(&tps)
    }
}

/// `at_least_once`: events acknowledged → changelog acknowledged → RocksDB
/// → group offsets. A crash repeats the interrupted cycle's events.
pub struct AtLeastOnce;

impl Protocol for AtLeastOnce {
    fn commit(&self, s: &mut Session, consumer: &Consumer) -> Result<()> {
        let t = Phases::start();
        s.flush_acked("flush events")?;
        let t = t.next("events_ms");
        let sealed = s.send_changelog()?;
        s.flush_acked("flush changelog")?;
        s.in_cycle = false;
        let t = t.next("changelog_ms");
        s.apply_to_store(&sealed)?;
        let t = t.next("store_ms");
        s.commit_group_offsets(consumer)?;
        t.next("offsets_ms").log();
        Ok(())
    }
}

/// Per-phase durations of one cycle, logged at debug level.
struct Phases {
    at: Instant,
    done: Vec<(&'static str, f64)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            at: Instant::now(),
            done: Vec::new(),
        }
    }

    fn next(mut self, name: &'static str) -> Phases {
        let now = Instant::now();
        self.done.push((name, (now - self.at).as_secs_f64() * 1e3));
        self.at = now;
        self
    }

    fn log(self) {
        tracing::debug!(phases = ?self.done, "cycle phases");
    }
}

impl Session {
    /// Sends, for every partition the cycle touched, its state records and
    /// the records that seal the cycle (outbox chunks, marker) to its
    /// changelog partition. Returns the partitions sealed.
    fn send_changelog(&mut self) -> Result<Vec<Tp>> {
        let acked = self.producer.context().acked();
        let mut sealed = Vec::new();
        for (tp, part) in self.parts.iter_mut() {
            let mark = part.pending.len();
            part.store
                .encode_changes(&mut part.engine, &mut part.pending)?;
            if !part.dirty && part.pending.is_empty() {
                continue;
            }
            // Identities past the retention, forgotten before this cycle's
            // changes (so that one accepted again in this cycle stays).
            if let Some(horizon) = part.engine.identity_horizon() {
                let swept = part.store.sweep(horizon, SWEEP_LIMIT)?;
                part.pending.splice(mark..mark, swept);
            }
            let outputs = &self.outputs;
            let (records, marker) =
                seal_cycle(&part.marker, part.next_offset, &part.out, |r, p| {
                    acked.get(&(outputs.topic(r).to_owned(), p)).copied()
                });
            part.pending.extend(records);
            let topic = self.names.changelog(&tp.0);
            for (k, v) in &part.pending {
                send(
                    &self.producer,
                    Out {
                        topic: &topic,
                        key: Some(k),
                        payload: v.as_deref(),
                        partition: Some(tp.1),
                        origin: None,
                    },
                )?;
            }
            part.marker = marker;
            sealed.push(tp.clone());
        }
        Ok(sealed)
    }

    /// The changelog is durable: RocksDB follows, with the position, on a
    /// thread per partition while the poll loop goes on (the changelog, not
    /// RocksDB, is what a restart restores from; see
    /// [`Session::finish_writes`] for where the writes are waited for).
    fn apply_to_store(&mut self, sealed: &[Tp]) -> Result<()> {
        let acked = self.producer.context().acked();
        let budget = self.cache_share();
        for tp in sealed {
            let pos = acked
                .get(&(self.names.changelog(&tp.0), tp.1))
                .map(|o| o + 1);
            let Some(part) = self.parts.get_mut(tp) else {
                continue;
            };
            let records = std::mem::take(&mut part.pending);
            tracing::debug!(topic = %tp.0, partition = tp.1, seq = part.marker.seq,
                next_offset = part.marker.next_offset, changelog_pos = ?pos,
                records = records.len(), events = part.out.len(), "cycle committed");
            let positions = pos.map(|p| (CHANGELOG_POS, p)).into_iter().collect();
            part.start_write(
                records,
                part.marker.outbox_chunks as usize,
                positions,
                budget,
            )?;
            part.dirty = false;
            part.out_count = 0;
        }
        Ok(())
    }

    /// Publishes the outboxed events of the sealed partitions' cycles.
    fn publish_outboxes(&mut self, sealed: &[Tp]) -> Result<()> {
        for tp in sealed {
            let Some(part) = self.parts.get(tp) else {
                continue;
            };
            for (i, ev) in part.out.iter().enumerate() {
                self.publish_outboxed(tp, part.marker.seq, i as u32, ev)?;
            }
        }
        for part in self.parts.values_mut() {
            part.out.clear();
            part.out_bytes = 0;
        }
        Ok(())
    }

    /// Publishes event `idx` of cycle `seq` of partition `tp` from its outbox.
    pub(super) fn publish_outboxed(
        &self,
        tp: &Tp,
        seq: u64,
        idx: u32,
        ev: &super::changelog::OutEvent,
    ) -> Result<()> {
        send(
            &self.producer,
            Out {
                topic: self.outputs.topic(ev.route),
                key: ev.key.as_deref(),
                payload: Some(&ev.payload),
                partition: Some(ev.partition),
                origin: Some(&origin(tp, seq, idx)),
            },
        )
    }

    /// The open cycle's input offsets.
    fn offset_list(&self) -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in &self.offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(|e| ServiceError::kafka("offset list", e))?;
        }
        Ok(tpl)
    }

    /// Commits the open cycle's input offsets to the consumer group.
    fn commit_group_offsets(&mut self, consumer: &Consumer) -> Result<()> {
        let tpl = self.offset_list()?;
        if tpl.count() > 0 {
            consumer
                .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
                .map_err(|e| ServiceError::kafka("commit offsets", e))?;
        }
        self.offsets.clear();
        Ok(())
    }

    /// Writes the cycle marker of `tps` again with `delivered` set, to the
    /// changelog and then RocksDB.
    pub(super) fn write_delivered(&mut self, tps: &[Tp]) -> Result<()> {
        self.finish_writes()?;
        let mut sealed = Vec::new();
        for tp in tps {
            let Some(part) = self.parts.get(tp) else {
                continue;
            };
            let mut m = part.marker.clone();
            m.delivered = true;
            let v = encode_value(&m);
            send(
                &self.producer,
                Out {
                    topic: &self.names.changelog(&tp.0),
                    key: Some(CYCLE_KEY),
                    payload: Some(&v),
                    partition: Some(tp.1),
                    origin: None,
                },
            )?;
            sealed.push((tp.clone(), m, v));
        }
        if sealed.is_empty() {
            return Ok(());
        }
        self.flush_acked("flush cycle markers")?;
        let acked = self.producer.context().acked();
        for (tp, m, v) in sealed {
            let pos = acked
                .get(&(self.names.changelog(&tp.0), tp.1))
                .map(|o| o + 1);
            if let Some(part) = self.parts.get_mut(&tp) {
                let positions: Vec<(&str, i64)> =
                    pos.map(|p| (CHANGELOG_POS, p)).into_iter().collect();
                part.store
                    .apply(&[(CYCLE_KEY.to_vec(), Some(v))], &positions)?;
                part.marker = m;
            }
        }
        Ok(())
    }
}
