//! Restore on assignment: each partition's RocksDB, then the committed
//! changelog cycles after its position (read for all of them by one
//! reader, applied one whole cycle at a time), then adoption into the
//! session: the interrupted cycle's records are overwritten, outbox cycles
//! not known to be delivered are reconciled, and the consumer continues at
//! the offset the restored state records.
//!
//! The reading and applying runs on a thread of its own ([`RestoreJob`])
//! while the partitions are paused, so the poll loop keeps the member in
//! the group however long the changelog is; adoption runs on the poll
//! loop once the thread is done.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::changelog::{read_marker, CycleApplier, CHANGELOG_POS};
use super::client::{reader_config, Names, QuietEof, Tp};
use super::context::Consumer;
use super::error::{Result, ServiceError};
use super::session::{partition_dir, Part, Session};
use crate::config::Config;
use crate::state::Store;

/// A restored partition and the keys of changelog records after its last
/// cycle marker (an interrupted cycle's, never applied).
pub struct Restored {
    pub tp: Tp,
    pub part: Part,
    pub leftover: Vec<Vec<u8>>,
}

/// Partition databases present under state.dir for the input topics.
pub fn local_partitions(cfg: &Config) -> Vec<Tp> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&cfg.state.dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((topic, p)) = name.rsplit_once('-') {
            if let (true, Ok(p)) = (cfg.kafka.input_topics.iter().any(|t| t == topic), p.parse()) {
                out.push((topic.to_owned(), p));
            }
        }
    }
    out
}

/// Restores partitions: each one's RocksDB, then the committed changelog
/// cycles after its position. Stops with a retriable error when `cancel`
/// is set (what was applied stays applied).
pub fn restore_partitions(
    cfg: &Config,
    names: &Names,
    tps: &[Tp],
    cancel: &AtomicBool,
) -> Result<Vec<Restored>> {
    let started = Instant::now();
    let mut stores = Vec::new();
    for tp in tps {
        let dir = partition_dir(cfg, tp);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ServiceError::io(format!("cannot create {}", dir.display()), e))?;
        let store = Store::open(&dir)?;
        let from = store.position(CHANGELOG_POS)?.unwrap_or(0);
        stores.push((tp.clone(), store, from));
    }
    let caught = catch_up(cfg, names, &stores, cancel)?;
    let mut out = Vec::new();
    for ((tp, store, _), applier) in stores.into_iter().zip(caught) {
        let (engine, stats) = store.load(cfg.engine())?;
        let marker = read_marker(&store)?;
        tracing::info!(
            topic = %tp.0,
            partition = tp.1,
            changelog_records = applier.applied(),
            open_batches = stats.batches,
            series = stats.series,
            next_offset = marker.as_ref().map_or(-1, |m| m.next_offset),
            // Outbox mode: a last cycle with events not marked delivered,
            // which `Session::adopt` completes.
            in_doubt = marker.as_ref().is_some_and(|m| !m.delivered && m.outbox_chunks > 0),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "partition state restored"
        );
        out.push(Restored {
            tp,
            part: Part::new(store, engine, marker),
            leftover: applier.leftover_keys(),
        });
    }
    Ok(out)
}

/// Applies, for every store, the committed changelog cycles from its
/// position to the end.
fn catch_up(
    cfg: &Config,
    names: &Names,
    stores: &[(Tp, Store, i64)],
    cancel: &AtomicBool,
) -> Result<Vec<CycleApplier>> {
    let mut appliers: Vec<CycleApplier> = stores.iter().map(|_| CycleApplier::default()).collect();
    if stores.is_empty() {
        return Ok(appliers);
    }
    let consumer: BaseConsumer<QuietEof> = reader_config(cfg, "restore")
        .create_with_context(QuietEof)
        .map_err(|e| ServiceError::kafka("create the changelog reader", e))?;
    // Read to the end (EOF) rather than trusting watermarks: the end a
    // read_committed reader sees is the last stable offset.
    let mut tpl = TopicPartitionList::new();
    let mut index: HashMap<Tp, usize> = HashMap::new();
    // PartitionEOF names only the partition number: count them per number.
    let mut want: HashMap<i32, usize> = HashMap::new();
    for (i, (tp, _, from)) in stores.iter().enumerate() {
        let topic = names.changelog(&tp.0);
        // Nothing at or after `from` (a new partition, or a store that
        // holds its whole changelog, as after a clean restart): skip the
        // read, whose end-of-partition answer can take a fetch wait.
        let (_, high) = consumer
            .fetch_watermarks(&topic, tp.1, Duration::from_secs(10))
            .map_err(|e| ServiceError::kafka("changelog watermarks", e))?;
        if high <= *from {
            tracing::debug!(topic = %topic, partition = tp.1, from, high, "changelog has nothing to restore");
            continue;
        }
        *want.entry(tp.1).or_insert(0) += 1;
        let start = if *from > 0 {
            Offset::Offset(*from)
        } else {
            Offset::Beginning
        };
        tracing::debug!(topic = %topic, partition = tp.1, from, "reading the changelog");
        tpl.add_partition_offset(&topic, tp.1, start)
            .map_err(|e| ServiceError::kafka("changelog reader partitions", e))?;
        index.insert((topic, tp.1), i);
    }
    if want.is_empty() {
        return Ok(appliers);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| ServiceError::kafka("assign the changelog", e))?;
    let mut eofs: HashMap<i32, usize> = HashMap::new();
    // Give up only when the changelog stops delivering, never because it
    // is long.
    const STALLED: Duration = Duration::from_secs(300);
    let started = Instant::now();
    let mut last_progress = started;
    let mut logged = started;
    let mut records = 0u64;
    while want
        .iter()
        .any(|(p, n)| eofs.get(p).copied().unwrap_or(0) < *n)
    {
        if cancel.load(Ordering::SeqCst) {
            return Err(ServiceError::broker("restore cancelled by a rebalance"));
        }
        if logged.elapsed() >= Duration::from_secs(2) {
            logged = Instant::now();
            tracing::info!(
                partitions = stores.len(),
                changelog_records = records,
                elapsed_s = started.elapsed().as_secs(),
                "restoring from the changelog"
            );
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if last_progress.elapsed() > STALLED {
                    return Err(ServiceError::broker(
                        "changelog restore stalled: nothing read for 300 s",
                    ));
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                tracing::debug!(partition = p, "changelog end reached");
                *eofs.entry(p).or_insert(0) += 1
            }
            Some(Err(e)) => return Err(ServiceError::kafka("changelog reader", e)),
            Some(Ok(m)) => {
                last_progress = Instant::now();
                records += 1;
                let Some(&i) = index.get(&(m.topic().to_owned(), m.partition())) else {
                    continue;
                };
                let key = m.key().unwrap_or_default();
                if let Some(cycle) = appliers[i].push(key, m.payload()) {
                    stores[i]
                        .1
                        .apply(&cycle, &[(CHANGELOG_POS, m.offset() + 1)])?;
                }
            }
        }
    }
    Ok(appliers)
}

impl Session {
    /// Takes restored partitions into service: overwrites the records of an
    /// interrupted cycle left at the changelog's end, and (outbox mode)
    /// completes the delivery of each one's last cycle.
    pub fn adopt(&mut self, restored: Vec<Restored>) -> Result<()> {
        let mut in_doubt = Vec::new();
        for Restored {
            tp,
            mut part,
            leftover,
        } in restored
        {
            self.unowned.remove(&tp);
            if !leftover.is_empty() {
                tracing::warn!(
                    topic = %tp.0,
                    partition = tp.1,
                    records = leftover.len(),
                    "the changelog ends with records of an interrupted cycle: ignored, and \
                     overwritten with the committed values in the next cycle"
                );
                for k in leftover {
                    let v = part.store.get(&k)?;
                    part.pending.push((k, v));
                }
                part.dirty = true;
            }
            if !part.marker.delivered && part.marker.outbox_chunks > 0 {
                in_doubt.push(tp.clone());
            }
            // The group offset can lag the marker by a cycle (a crash
            // between the changelog and the group commit): commit the
            // marker's position in the next cycle, so consumer lag reads
            // right even when no further record arrives on this partition.
            let catch_up_offset = part.next_offset >= 0;
            if catch_up_offset {
                self.offsets.insert(tp.clone(), part.next_offset);
            }
            let dirty = part.dirty;
            self.parts.insert(tp, part);
            if dirty || catch_up_offset {
                self.ensure_cycle()?;
            }
        }
        if !in_doubt.is_empty() {
            self.reconcile(&in_doubt)?;
        }
        Ok(())
    }

    /// Points the consumer at the restored state's next input offset: the
    /// changelog's cycle marker, not the group's committed offset (which a
    /// crash can leave behind), says where each partition continues.
    pub fn seek_to_state(&mut self, consumer: &Consumer, tps: &[Tp]) -> Result<()> {
        for tp in tps {
            let Some(part) = self.parts.get(tp) else {
                continue;
            };
            if part.next_offset < 0 {
                continue;
            }
            consumer
                .seek(
                    &tp.0,
                    tp.1,
                    Offset::Offset(part.next_offset),
                    Duration::from_secs(10),
                )
                .map_err(|e| {
                    ServiceError::kafka(
                        &format!("seek {}-{} to {}", tp.0, tp.1, part.next_offset),
                        e,
                    )
                })?;
            tracing::debug!(topic = %tp.0, partition = tp.1, offset = part.next_offset, "continuing from the restored state");
        }
        Ok(())
    }

    /// Starts restoring the queued partitions when no restore runs, and
    /// takes a finished restore into service: adopt, seek, resume.
    pub fn drive_restore(&mut self, consumer: &Consumer) -> Result<()> {
        if self
            .restoring
            .as_ref()
            .is_some_and(|j| j.handle.is_finished())
        {
            let job = self.restoring.take().expect("checked above");
            let job_started = job.started;
            let (tps, result) = job.join();
            let restored = result?;
            let started = Instant::now();
            self.adopt(restored)?;
            for tp in &tps {
                if let Some(p) = self.parts.get(tp) {
                    self.metrics
                        .agreement_baseline(&format!("{}-{}", tp.0, tp.1), p.engine.agreement());
                }
            }
            self.seek_to_state(consumer, &tps)?;
            let mut tpl = TopicPartitionList::new();
            for tp in &tps {
                tpl.add_partition(&tp.0, tp.1);
                // Restores kept no partition from polling: none was idle.
                if let Some(p) = self.parts.get_mut(tp) {
                    p.last_record = Instant::now();
                }
            }
            consumer
                .resume(&tpl)
                .map_err(|e| ServiceError::kafka("resume restored partitions", e))?;
            let secs = job_started.elapsed().as_secs_f64() / tps.len().max(1) as f64;
            for _ in &tps {
                self.metrics.restore_duration(secs);
            }
            tracing::info!(partitions = ?tps, elapsed_ms = job_started.elapsed().as_millis() as u64,
                adopt_ms = started.elapsed().as_millis() as u64, "restored partitions resumed");
            self.publish_holdings();
            self.refresh_gauges();
        }
        if self.restoring.is_none() && !self.to_restore.is_empty() {
            let mut tps = std::mem::take(&mut self.to_restore);
            tps.sort();
            tps.dedup();
            tps.retain(|tp| !self.parts.contains_key(tp));
            if !tps.is_empty() {
                self.restoring = Some(RestoreJob::start(&self.cfg, &self.names, tps));
                self.publish_holdings();
            }
        }
        Ok(())
    }

    /// Stops a running restore (a rebalance): returns its partitions.
    pub fn cancel_restore(&mut self) -> Vec<Tp> {
        match self.restoring.take() {
            Some(job) => {
                job.cancel.store(true, Ordering::SeqCst);
                let (tps, _) = job.join();
                tps
            }
            None => Vec::new(),
        }
    }

    /// A record of a partition that is not restored yet (fetched before its
    /// pause): it will be read again. A partition without a cycle marker
    /// continues from the consumer's position, so rewind to the record.
    pub fn not_restored(&mut self, consumer: &Consumer, tp: &Tp, offset: i64) {
        let queued = self.restoring.as_ref().is_some_and(|j| j.tps.contains(tp))
            || self.to_restore.contains(tp);
        if !queued {
            let assigned = consumer
                .assignment()
                .is_ok_and(|a| a.find_partition(&tp.0, tp.1).is_some());
            if !assigned {
                tracing::debug!(topic = %tp.0, partition = tp.1, offset, "record of a partition not assigned: ignored");
                return;
            }
            self.unowned.remove(tp);
            self.to_restore.push(tp.clone());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&tp.0, tp.1);
        if let Err(e) = consumer.pause(&tpl) {
            self.broken
                .get_or_insert(ServiceError::kafka("pause a partition", e));
        }
        if let Err(e) = consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::from_secs(10))
        {
            self.broken.get_or_insert(ServiceError::kafka(
                "seek back a partition being restored",
                e,
            ));
        }
    }
}

/// A restore running on its own thread.
pub struct RestoreJob {
    pub tps: Vec<Tp>,
    cancel: Arc<AtomicBool>,
    handle: JoinHandle<Result<Vec<Restored>>>,
    started: Instant,
}

impl RestoreJob {
    fn start(cfg: &Config, names: &Names, tps: Vec<Tp>) -> RestoreJob {
        tracing::info!(partitions = ?tps, "restoring partition state (partitions paused meanwhile)");
        let cancel = Arc::new(AtomicBool::new(false));
        let (cfg, names, todo, flag) = (cfg.clone(), names.clone(), tps.clone(), cancel.clone());
        let handle = std::thread::Builder::new()
            .name("restore".into())
            .spawn(move || restore_partitions(&cfg, &names, &todo, &flag))
            .expect("cannot start the restore thread");
        RestoreJob {
            tps,
            cancel,
            handle,
            started: Instant::now(),
        }
    }

    fn join(self) -> (Vec<Tp>, Result<Vec<Restored>>) {
        let result = self
            .handle
            .join()
            .unwrap_or_else(|_| Err(ServiceError::internal("the restore thread panicked")));
        (self.tps, result)
    }
}

impl Drop for Session {
    /// A session never outlives its restore thread (which holds the
    /// partitions' databases open), and the query API lets go of its
    /// stores, which close with it.
    fn drop(&mut self) {
        self.cancel_restore();
        self.holdings.set_held(Default::default());
    }
}
