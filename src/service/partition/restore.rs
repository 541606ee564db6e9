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
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::{reader_config, QuietEof};
use crate::service::client::{partition_dir, Names, Tp};
use crate::service::error::{Result, ServiceError};
use crate::service::partition::changelog::{
    read_marker, read_outbox, CycleApplier, OutEvent, CHANGELOG_POS,
};
use crate::service::partition::reconcile::{undelivered, Cycle};
use crate::service::partition::{wait_released, Part};
use crate::state::{self, format, Store, StoreError};

/// A restored partition, the keys of changelog records after its last
/// cycle marker (an interrupted cycle's, never applied), and (outbox mode)
/// its last cycle's events missing from the outputs, when that cycle is
/// not known to be delivered.
pub struct Restored {
    pub tp: Tp,
    pub part: Part,
    pub leftover: Vec<Vec<u8>>,
    pub undelivered: Option<Undelivered>,
    /// Changelog records the restore applied.
    pub changelog_records: u64,
}

/// An interrupted outbox cycle's events that are not in the outputs, with
/// their index in the cycle.
pub struct Undelivered {
    pub seq: u64,
    /// Events of the cycle in all.
    pub total: usize,
    pub events: Vec<(u32, OutEvent)>,
}

fn cancelled() -> ServiceError {
    ServiceError::broker("restore cancelled by a rebalance")
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
        if cancel.load(Ordering::SeqCst) {
            return Err(cancelled());
        }
        let dir = partition_dir(cfg, tp);
        // An earlier owner's write (or restore) may still hold it.
        wait_released(&dir, cancel)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| ServiceError::io(format!("cannot create {}", dir.display()), e))?;
        let store = Store::open(&dir)?;
        let from = store.position(CHANGELOG_POS)?.unwrap_or(0);
        stores.push((tp.clone(), store, from));
    }
    let caught = catch_up(cfg, names, &stores, cancel)?;
    let mut out = Vec::new();
    for ((tp, store, _), applier) in stores.into_iter().zip(caught) {
        if cancel.load(Ordering::SeqCst) {
            return Err(cancelled());
        }
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
            // checked against the outputs below.
            in_doubt = marker.as_ref().is_some_and(|m| !m.delivered && m.outbox_chunks > 0),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "partition state restored"
        );
        out.push(Restored {
            tp,
            part: Part::new(store, engine, marker),
            changelog_records: applier.applied(),
            leftover: applier.leftover_keys(),
            undelivered: None,
        });
    }
    check_outputs(cfg, &mut out, cancel)?;
    Ok(out)
}

/// Outbox mode: for each restored partition whose last cycle is not known
/// to be delivered, finds the events of that cycle missing from the
/// outputs (by their origin headers).
fn check_outputs(cfg: &Config, restored: &mut [Restored], cancel: &AtomicBool) -> Result<()> {
    let mut cycles = Vec::new();
    let mut at = Vec::new();
    for (i, r) in restored.iter().enumerate() {
        if r.part.in_doubt() {
            let marker = r.part.marker().clone();
            let events = read_outbox(r.part.store(), &marker)?;
            cycles.push(Cycle {
                tp: r.tp.clone(),
                marker,
                events,
            });
            at.push(i);
        }
    }
    if cycles.is_empty() {
        return Ok(());
    }
    let missing = undelivered(cfg, &cycles, cancel)?;
    for ((cycle, todo), i) in cycles.into_iter().zip(missing).zip(at) {
        let total = cycle.events.len();
        let mut events: Vec<Option<OutEvent>> = cycle.events.into_iter().map(Some).collect();
        restored[i].undelivered = Some(Undelivered {
            seq: cycle.marker.seq,
            total,
            events: todo
                .into_iter()
                .filter_map(|j| events.get_mut(j as usize)?.take().map(|ev| (j, ev)))
                .collect(),
        });
    }
    Ok(())
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
        let high = high_watermark(&consumer, &topic, tp.1, cancel)?;
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
            return Err(cancelled());
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
                let value = m
                    .payload()
                    .map(|v| state::current_value(key, v, format_header(&m)))
                    .transpose()
                    .map_err(|e| {
                        ServiceError::from(StoreError::Corrupt {
                            path: stores[i].1.path().to_owned(),
                            key: key.to_vec(),
                            why: format!(
                                "changelog {} [{}] offset {}: {e}",
                                m.topic(),
                                m.partition(),
                                m.offset()
                            ),
                        })
                    })?;
                if let Some(cycle) = appliers[i].push(key, value.as_deref()) {
                    stores[i]
                        .1
                        .apply(&cycle, &[(CHANGELOG_POS, m.offset() + 1)])?;
                }
            }
        }
    }
    Ok(appliers)
}

/// A changelog record's state format header, if it has one.
fn format_header<'a>(m: &'a BorrowedMessage<'_>) -> Option<&'a [u8]> {
    m.headers()?
        .iter()
        .find(|h| h.key == format::HEADER)
        .and_then(|h| h.value)
}

/// The changelog partition's high watermark, asked for in tries of half a
/// second so that a cancellation is noticed within one (10 s in all, as
/// librdkafka's metadata timeout).
fn high_watermark(
    consumer: &BaseConsumer<QuietEof>,
    topic: &str,
    partition: i32,
    cancel: &AtomicBool,
) -> Result<i64> {
    const TRY: Duration = Duration::from_millis(500);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if cancel.load(Ordering::SeqCst) {
            return Err(cancelled());
        }
        match consumer.fetch_watermarks(topic, partition, TRY) {
            Ok((_, high)) => return Ok(high),
            Err(e) if Instant::now() >= end => {
                return Err(ServiceError::kafka("changelog watermarks", e))
            }
            Err(e) => tracing::debug!(topic, partition, "changelog watermarks, trying again: {e}"),
        }
    }
}

/// A restore running on its own thread. Cancelling it does not wait: the
/// thread notices within a second, and until it ends it lingers as the
/// holder of its partitions' directories (`partition::linger`).
pub struct RestoreJob {
    pub tps: Vec<Tp>,
    pub started: Instant,
    dirs: Vec<PathBuf>,
    cancel: Arc<AtomicBool>,
    done: mpsc::Receiver<Result<Vec<Restored>>>,
    thread: JoinHandle<()>,
}

impl RestoreJob {
    pub fn start(cfg: &Config, names: &Names, tps: Vec<Tp>) -> Result<RestoreJob> {
        tracing::info!(partitions = ?tps, "restoring partition state (partitions paused meanwhile)");
        let cancel = Arc::new(AtomicBool::new(false));
        let (cfg, names, todo, flag) = (cfg.clone(), names.clone(), tps.clone(), cancel.clone());
        let dirs = tps.iter().map(|tp| partition_dir(&cfg, tp)).collect();
        let (tx, done) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("restore".into())
            .spawn(move || {
                let _ = tx.send(restore_partitions(&cfg, &names, &todo, &flag));
            })
            .map_err(|e| ServiceError::thread("the restore thread", e))?;
        Ok(RestoreJob {
            tps,
            started: Instant::now(),
            dirs,
            cancel,
            done,
            thread,
        })
    }

    /// The restore's result once its thread is done.
    pub fn try_finish(&mut self) -> Option<Result<Vec<Restored>>> {
        match self.done.try_recv() {
            Ok(result) => Some(result),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => {
                Some(Err(ServiceError::internal("the restore thread panicked")))
            }
        }
    }

    /// Stops the restore (what it applied stays applied) without waiting
    /// for it; returns its partitions.
    pub fn cancel(self) -> Vec<Tp> {
        self.cancel.store(true, Ordering::SeqCst);
        crate::service::partition::linger(self.dirs, self.thread);
        self.tps
    }
}
