//! `jurystream run`: the Kafka service (SPEC §7).
//!
//! One consumer group member, one transactional producer. Each commit cycle
//! is one Kafka transaction holding the cycle's output events, its state
//! changes (written to a compacted changelog topic, one partition per input
//! partition) and the input offsets (`send_offsets_to_transaction`). Only
//! after the commit succeeds is RocksDB updated, in one atomic write that
//! also records how far into the changelog it reflects. On start, and on
//! every assignment, a partition's state is RocksDB plus the changelog
//! records after that position, so a crash at any instant loses nothing and
//! doubles nothing. Any failed transaction is aborted and the session is
//! rebuilt from committed state.

pub mod produce;
mod topics;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::config::{Config, Delivery};
use crate::engine::time::{format_timestamp, Nanos, NANOS_PER_SEC};
use crate::engine::{Engine, Outcome, ScoreUpdate};
use crate::input::{decode_vote, dlq_payload, DecodeOptions, Reason, Rejection};
use crate::output::{ambiguity_flagged_json, score_updated_json, vote_rejected_json, Source};
use crate::replay::wall_clock;
use crate::state::{
    encode_changes, encode_value, outbox_key, CycleMarker, OutEvent, OutboxChunk, Record, Store,
    CYCLE_KEY,
};
use crate::telemetry::Metrics;
use std::sync::Arc;

/// Position name (in RocksDB) of the next changelog offset the store reflects.
const CHANGELOG_POS: &str = "changelog";

/// An error that ends the process (no retry helps).
#[derive(Debug)]
pub struct Fatal(pub String);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fatal {}

/// Names the service derives from the configuration.
#[derive(Clone)]
pub struct Names {
    pub changelog_base: String,
    pub transactional_id: String,
}

impl Names {
    pub fn new(cfg: &Config) -> Names {
        let k = &cfg.kafka;
        let changelog_base = if k.changelog_topic.is_empty() {
            format!("{}-changelog", k.group_id)
        } else {
            k.changelog_topic.clone()
        };
        let prefix = if k.transactional_id_prefix.is_empty() {
            k.group_id.clone()
        } else {
            k.transactional_id_prefix.clone()
        };
        let instance = std::env::var("JURYSTREAM_INSTANCE_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(hostname)
            .unwrap_or_else(|| "0".into());
        Names {
            changelog_base,
            transactional_id: format!("{prefix}-{instance}"),
        }
    }

    /// The changelog topic of one input topic.
    pub fn changelog(&self, input_topic: &str) -> String {
        format!("{}.{}", self.changelog_base, input_topic)
    }
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Librdkafka settings shared by every client: brokers, then the user's
/// pass-through properties (they win).
pub fn client_config(cfg: &Config) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.kafka.brokers);
    for (k, v) in cfg.kafka_properties() {
        c.set(k, v);
    }
    c
}

/// How a commit cycle reaches the broker (`kafka.delivery`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One Kafka transaction per cycle.
    Transactional,
    /// Changelog first (state, the cycle's events, a cycle marker), then the
    /// events; an interrupted cycle is completed by whoever restores it.
    Outbox,
    /// Events first, then the changelog; an interrupted cycle is redone.
    AtLeastOnce,
}

impl Mode {
    fn of(cfg: &Config) -> Mode {
        match cfg.kafka.delivery {
            Delivery::ExactlyOnceOutbox => Mode::Outbox,
            Delivery::AtLeastOnce => Mode::AtLeastOnce,
            Delivery::ExactlyOnce => Mode::Transactional,
        }
    }
}

/// Header on every output event: `<input topic>/<partition>/<cycle>/<index>`,
/// the input partition, the cycle that emitted it and its place in that
/// cycle. It makes each event traceable and lets a restoring instance see
/// which events of an interrupted cycle already reached the broker.
pub const ORIGIN_HEADER: &str = "jurystream-origin";

/// Outbox changelog records hold at most this many event bytes (one larger
/// event gets a record of its own).
const CHUNK_BYTES: usize = 256 * 1024;

/// A cycle is committed early once its outbox holds this many bytes.
const MAX_CYCLE_BYTES: usize = 16 * 1024 * 1024;

/// Output topics by index: 0 scores, 1 flags, 2 DLQ.
const SCORES: u8 = 0;
const FLAGS: u8 = 1;
const DLQ: u8 = 2;

fn origin(tp: &Tp, seq: u64, idx: u32) -> String {
    format!("{}{idx}", origin_prefix(tp, seq))
}

/// CRC-32 (IEEE), as librdkafka's default partitioner hashes keys.
fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    let mut c = !0u32;
    for &b in data {
        c = table[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// Remembers the highest acknowledged offset per topic partition.
#[derive(Default)]
struct ProduceCtx {
    acked: Mutex<HashMap<(String, i32), i64>>,
    failure: Mutex<Option<String>>,
}

impl ProduceCtx {
    /// The first delivery failure since the last call, if any.
    fn take_failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|mut f| f.take())
    }

    fn acked(&self) -> HashMap<(String, i32), i64> {
        self.acked.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

impl ClientContext for ProduceCtx {}

impl ProducerContext for ProduceCtx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                if let Ok(mut map) = self.acked.lock() {
                    let e = map
                        .entry((m.topic().to_owned(), m.partition()))
                        .or_insert(-1);
                    *e = (*e).max(m.offset());
                }
            }
            Err((e, _)) => {
                if let Ok(mut f) = self.failure.lock() {
                    f.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
}

/// One assigned input partition.
struct Part {
    store: Store,
    engine: Engine,
    last_record: Instant,
    /// Changelog records of the open cycle, applied to RocksDB after commit.
    pending: Vec<Record>,
    /// The last cycle marker written or restored.
    marker: CycleMarker,
    /// The next input offset; records below it are already in the state.
    next_offset: i64,
    /// Events of the open cycle (kept here in outbox mode only).
    out: Vec<OutEvent>,
    out_count: u32,
    out_bytes: usize,
    /// Whether the open cycle changed anything of this partition.
    dirty: bool,
    skip_logged: bool,
}

impl Part {
    fn new(store: Store, engine: Engine, marker: Option<CycleMarker>) -> Part {
        let marker = marker.unwrap_or(CycleMarker {
            next_offset: -1,
            delivered: true,
            ..CycleMarker::default()
        });
        Part {
            store,
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
        }
    }
}

type Tp = (String, i32);

/// Everything a commit touches; shared with the rebalance callbacks, which
/// run inside `poll` on the same thread.
struct Inner {
    cfg: Config,
    names: Names,
    decode: DecodeOptions,
    producer: BaseProducer<ProduceCtx>,
    parts: HashMap<Tp, Part>,
    in_txn: bool,
    txn_started: Instant,
    offsets: HashMap<Tp, i64>,
    /// Set when the session must be rebuilt (a failed commit, a lost assignment).
    broken: Option<anyhow::Error>,
    updates: Vec<ScoreUpdate>,
    mode: Mode,
    /// Output topic names and partition counts, by index (scores, flags, DLQ).
    outputs: [String; 3],
    out_partitions: [i32; 3],
    metrics: Arc<Metrics>,
    /// Whether a partition assignment (possibly empty) has been received.
    assigned_once: bool,
    /// Local partition databases not owned now, and since when.
    unowned: HashMap<Tp, Instant>,
    /// Assigned partitions whose state is still to be restored.
    to_restore: Vec<Tp>,
    /// While partitions are handed over: when the open cycle must be
    /// finished (or aborted) by. Outside a rebalance each step of a cycle
    /// (a flush, a transaction commit or abort) may take
    /// [`CYCLE_STEP_TIMEOUT`].
    deadline: Option<Instant>,
}

/// How long one step of a commit cycle may take outside a rebalance.
const CYCLE_STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline for finishing (or aborting) the open cycle when partitions
/// are revoked: shorter than the session timeout (`session.timeout.ms` in
/// `kafka.properties`, librdkafka's default 45 s), so the member is not
/// expelled while it hands its partitions over.
fn revoke_timeout(cfg: &Config) -> Duration {
    let session_ms = cfg
        .kafka_properties()
        .into_iter()
        .find(|(k, _)| k == "session.timeout.ms")
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .unwrap_or(45_000);
    Duration::from_millis((session_ms * 2 / 3).max(1_000))
}

struct Ctx {
    inner: Mutex<Option<Inner>>,
    metrics: Arc<Metrics>,
}

impl ClientContext for Ctx {
    fn stats(&self, stats: rdkafka::Statistics) {
        for (topic, t) in &stats.topics {
            for (p, part) in &t.partitions {
                if *p >= 0 && part.consumer_lag >= 0 {
                    self.metrics.consumer_lag(topic, *p, part.consumer_lag);
                }
            }
        }
    }
}

impl Ctx {
    /// The session state; a panic elsewhere does not make it unusable.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Inner>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut guard = self.lock();
        let Some(inner) = guard.as_mut() else { return };
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let lost = consumer.assignment_lost();
                if lost {
                    tracing::warn!("partitions lost: aborting the open cycle without committing");
                    inner.abort();
                } else {
                    let started = Instant::now();
                    let limit = revoke_timeout(&inner.cfg);
                    inner.deadline = Some(started + limit);
                    let result = inner.commit(consumer).and_then(|_| inner.seal_delivered());
                    inner.deadline = None;
                    if let Err(e) = result {
                        tracing::error!(
                            deadline_ms = limit.as_millis() as u64,
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            "commit before revoke failed (the cycle was aborted): {e:#}"
                        );
                        inner.broken.get_or_insert(e);
                    }
                }
                for el in tpl.elements() {
                    let tp = (el.topic().to_owned(), el.partition());
                    inner
                        .metrics
                        .forget_partition(&format!("{}-{}", tp.0, tp.1));
                    inner.metrics.forget_lag(&tp.0, tp.1);
                    if inner.parts.remove(&tp).is_some() {
                        tracing::info!(topic = %tp.0, partition = tp.1, "partition revoked, state released");
                    }
                    inner.offsets.remove(&tp);
                    inner.unowned.insert(tp, Instant::now());
                }
            }
            Rebalance::Assign(_) | Rebalance::Error(_) => {}
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut guard = self.lock();
        let Some(inner) = guard.as_mut() else { return };
        match rebalance {
            Rebalance::Assign(tpl) => {
                let tps: Vec<Tp> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition()))
                    .collect();
                tracing::info!(partitions = ?tps, "partitions assigned");
                inner.assigned_once = true;
                inner.to_restore.extend(tps);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::error!("rebalance error: {e}"),
        }
    }
}

fn kafka_err(what: &str, e: KafkaError) -> anyhow::Error {
    if e.to_string().contains("not supported by broker") {
        return anyhow!(Fatal(format!(
            "{what}: {e}: this broker does not support Kafka transactions; use one that does \
             (Apache Kafka, Redpanda) or set kafka.delivery = \"exactly_once_outbox\""
        )));
    }
    let fatal = matches!(e, KafkaError::Transaction(ref r) if r.is_fatal())
        || e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal)
        || e.rdkafka_error_code() == Some(RDKafkaErrorCode::ProducerFenced);
    if fatal {
        anyhow!(Fatal(format!(
            "{what}: {e} (this instance was fenced or hit a fatal producer error)"
        )))
    } else {
        anyhow!("{what}: {e}")
    }
}

fn store_fatal(e: crate::state::StoreError) -> anyhow::Error {
    anyhow!(Fatal(format!("state store: {e}")))
}

/// Queues one record, waiting while the producer queue is full.
fn send_record(
    producer: &BaseProducer<ProduceCtx>,
    topic: &str,
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    partition: Option<i32>,
    origin: Option<&str>,
) -> Result<()> {
    let mut rec: BaseRecord<'_, [u8], [u8], ()> = BaseRecord::to(topic);
    if let Some(k) = key {
        rec = rec.key(k);
    }
    if let Some(p) = payload {
        rec = rec.payload(p);
    }
    if let Some(p) = partition {
        rec = rec.partition(p);
    }
    if let Some(o) = origin {
        rec = rec.headers(OwnedHeaders::new().insert(Header {
            key: ORIGIN_HEADER,
            value: Some(o),
        }));
    }
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                producer.poll(Duration::from_millis(50));
            }
            Err((e, _)) => return Err(kafka_err("produce", e)),
        }
    }
}

impl Inner {
    /// How long the next step of the cycle may take.
    fn step_timeout(&self) -> Duration {
        match self.deadline {
            None => CYCLE_STEP_TIMEOUT,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        }
    }

    fn ensure_txn(&mut self) -> Result<()> {
        if !self.in_txn {
            if self.mode == Mode::Transactional {
                self.producer
                    .begin_transaction()
                    .map_err(|e| kafka_err("begin transaction", e))?;
            }
            self.in_txn = true;
            self.txn_started = Instant::now();
        }
        Ok(())
    }

    /// Waits until everything queued is acknowledged.
    fn flush_acked(&self, what: &str) -> Result<()> {
        produce::flush_now(&self.producer, self.step_timeout()).map_err(|e| kafka_err(what, e))?;
        self.producer.poll(Duration::ZERO);
        match self.producer.context().take_failure() {
            Some(f) => Err(anyhow!("{what}: delivery failed: {f}")),
            None => Ok(()),
        }
    }

    /// One output event of partition `tp`'s open cycle: sent now, or kept
    /// for the outbox.
    fn emit(&mut self, tp: &Tp, topic: u8, key: Option<&[u8]>, payload: &[u8]) -> Result<()> {
        let part = self
            .parts
            .get_mut(tp)
            .ok_or_else(|| anyhow!("event for unassigned partition {}-{}", tp.0, tp.1))?;
        let idx = part.out_count;
        part.out_count += 1;
        part.dirty = true;
        if self.mode == Mode::Outbox {
            let n = self.out_partitions[topic as usize].max(1);
            let partition = match key {
                Some(k) if !k.is_empty() => (crc32(k) % n as u32) as i32,
                _ => tp.1 % n,
            };
            part.out_bytes += payload.len() + key.map_or(0, <[u8]>::len);
            part.out.push(OutEvent {
                topic,
                partition,
                key: key.map(<[u8]>::to_vec),
                payload: payload.to_vec(),
            });
            Ok(())
        } else {
            let o = origin(tp, part.marker.seq + 1, idx);
            send_record(
                &self.producer,
                &self.outputs[topic as usize],
                key,
                Some(payload),
                None,
                Some(&o),
            )
        }
    }

    fn emit_updates(&mut self, tp: &Tp, processed_at: &str) -> Result<()> {
        let updates = std::mem::take(&mut self.updates);
        let now_s = wall_clock() as f64 / 1e9;
        for u in &updates {
            self.metrics.score_update(u, now_s);
            let key = u.series.inference_id.as_bytes();
            let s = score_updated_json(u, processed_at);
            self.emit(tp, SCORES, Some(key), s.as_bytes())?;
            if u.ambiguous {
                let f = ambiguity_flagged_json(u, processed_at);
                self.emit(tp, FLAGS, Some(key), f.as_bytes())?;
            }
        }
        self.updates = updates;
        self.updates.clear();
        Ok(())
    }

    fn reject(
        &mut self,
        tp: &Tp,
        r: &Rejection,
        key: Option<&[u8]>,
        payload: &[u8],
        source: &Source,
        processed_at: &str,
    ) -> Result<()> {
        // Reason and source at info; the detail can quote the payload, so debug only.
        tracing::info!(reason = r.reason.as_str(), ?source, "vote rejected");
        tracing::debug!(reason = r.reason.as_str(), detail = %r.detail, ?source, "vote rejected (detail)");
        self.metrics.rejected(r.reason);
        let text = vote_rejected_json(r, &dlq_payload(payload), source, processed_at);
        self.emit(tp, DLQ, key, text.as_bytes())
    }

    /// One input record through the engine.
    fn handle(
        &mut self,
        tp: &Tp,
        offset: i64,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
    ) -> Result<()> {
        let part = self
            .parts
            .get_mut(tp)
            .ok_or_else(|| anyhow!("record for unassigned partition {}-{}", tp.0, tp.1))?;
        if offset < part.next_offset {
            // Already in the state: a cycle whose offsets were not committed
            // to the group but whose changelog marker was.
            if !part.skip_logged {
                part.skip_logged = true;
                tracing::info!(topic = %tp.0, partition = tp.1, offset, next = part.next_offset,
                    "skipping input records the restored state already holds");
            }
            return Ok(());
        }
        if part.next_offset >= 0 && offset > part.next_offset {
            // Normal after compaction or transaction markers in the input.
            tracing::debug!(topic = %tp.0, partition = tp.1, offset, expected = part.next_offset,
                "input offsets skip ahead");
        }
        part.last_record = Instant::now();
        part.next_offset = offset + 1;
        part.dirty = true;
        self.ensure_txn()?;
        let now = wall_clock();
        let payload = payload.unwrap_or(&[]);
        let source = || Source::Kafka {
            topic: tp.0.clone(),
            partition: tp.1,
            offset,
        };
        let skew = (self.cfg.input.max_future_skew_seconds * NANOS_PER_SEC as f64) as Nanos;
        let decoded = decode_vote(payload, &self.decode).and_then(|v| {
            if v.timestamp > now + skew {
                Err(Rejection::new(
                    Reason::InvalidTimestamp,
                    format!(
                        "timestamp: {} is more than input.max_future_skew_seconds ahead of the wall clock",
                        format_timestamp(v.timestamp)
                    ),
                ))
            } else {
                Ok(v)
            }
        });
        match decoded {
            Err(r) => self.reject(tp, &r, key, payload, &source(), &format_timestamp(now))?,
            Ok(vote) => {
                let part = self
                    .parts
                    .get_mut(tp)
                    .ok_or_else(|| anyhow!("partition {}-{} vanished", tp.0, tp.1))?;
                match part.engine.process(&vote, &mut self.updates) {
                    Outcome::Accepted if self.updates.is_empty() => {}
                    Outcome::Accepted => self.emit_updates(tp, &format_timestamp(now))?,
                    Outcome::Duplicate => {}
                    Outcome::Late(r) => {
                        self.reject(tp, &r, key, payload, &source(), &format_timestamp(now))?
                    }
                }
            }
        }
        // Counters and gauges are folded in once per cycle (refresh_gauges).
        match self.offsets.get_mut(tp) {
            Some(o) => *o = offset + 1,
            None => {
                self.offsets.insert(tp.clone(), offset + 1);
            }
        }
        Ok(())
    }

    /// Points the consumer at the restored state's next input offset: the
    /// changelog's cycle marker, not the group's committed offset (which a
    /// crash can leave behind), says where each partition continues.
    fn seek_to_state(&mut self, consumer: &BaseConsumer<Ctx>, tps: &[Tp]) -> Result<()> {
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
                .map_err(|e| anyhow!("seek {}-{} to {}: {e}", tp.0, tp.1, part.next_offset))?;
            tracing::debug!(topic = %tp.0, partition = tp.1, offset = part.next_offset, "continuing from the restored state");
        }
        Ok(())
    }

    /// Publishes event `idx` of cycle `seq` of partition `tp` from its outbox.
    fn publish_outboxed(&self, tp: &Tp, seq: u64, idx: u32, ev: &OutEvent) -> Result<()> {
        send_record(
            &self.producer,
            &self.outputs[ev.topic as usize],
            ev.key.as_deref(),
            Some(&ev.payload),
            Some(ev.partition),
            Some(&origin(tp, seq, idx)),
        )
    }

    /// Bytes of events waiting in outboxes.
    fn outbox_bytes(&self) -> usize {
        self.parts.values().map(|p| p.out_bytes).sum()
    }

    /// Live mode's idle flush: a partition quiet for `idle_flush_seconds`
    /// moves its watermark to now − grace.
    fn idle_flush(&mut self) -> Result<()> {
        let idle = Duration::from_secs_f64(self.cfg.batching.idle_flush_seconds);
        let grace = (self.cfg.batching.grace_seconds * NANOS_PER_SEC as f64) as Nanos;
        let due: Vec<Tp> = self
            .parts
            .iter()
            .filter(|(_, p)| p.last_record.elapsed() >= idle)
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in due {
            self.ensure_txn()?;
            let now = wall_clock();
            if let Some(p) = self.parts.get_mut(&tp) {
                p.last_record = Instant::now();
                p.engine.advance_watermark(now - grace, &mut self.updates);
            }
            if !self.updates.is_empty() {
                tracing::debug!(topic = %tp.0, partition = tp.1, closed = self.updates.len(), "idle flush");
            }
            self.emit_updates(&tp, &format_timestamp(now))?;
        }
        self.refresh_gauges();
        Ok(())
    }

    /// Folds every partition's engine counters and gauges into the metrics.
    fn refresh_gauges(&self) {
        for (tp, part) in &self.parts {
            self.metrics
                .observe_engine(&format!("{}-{}", tp.0, tp.1), &part.engine);
        }
    }

    /// Ends the cycle (see [`Inner::commit_inner`]); on failure aborts it.
    fn commit(&mut self, consumer: &BaseConsumer<Ctx>) -> Result<()> {
        if !self.in_txn {
            return Ok(());
        }
        let result = self.commit_inner(consumer);
        if result.is_err() {
            self.abort();
        }
        result
    }

    /// One commit cycle. Every partition the cycle touched gets its state
    /// records and then a cycle marker in its changelog partition (in
    /// outbox mode also the cycle's events, before the marker).
    /// - transactional: events, changelog and input offsets in one
    ///   transaction;
    /// - outbox: changelog acknowledged → RocksDB → events acknowledged →
    ///   group offsets;
    /// - at-least-once: events acknowledged → changelog acknowledged →
    ///   RocksDB → group offsets.
    ///
    /// RocksDB is written only after the changelog is durable, with the
    /// changelog position it reflects.
    fn commit_inner(&mut self, consumer: &BaseConsumer<Ctx>) -> Result<()> {
        let started = Instant::now();
        let mut sealing: Vec<Tp> = Vec::new();
        for (tp, part) in self.parts.iter_mut() {
            let records = encode_changes(&mut part.engine);
            part.pending.extend(records);
            if part.dirty || !part.pending.is_empty() {
                sealing.push(tp.clone());
            }
        }
        if self.mode == Mode::AtLeastOnce {
            self.flush_acked("flush events")?;
        }
        let t_events = started.elapsed();
        let acked = self.producer.context().acked();
        for tp in &sealing {
            let Some(part) = self.parts.get_mut(tp) else {
                continue;
            };
            let mut chunks = 0u32;
            let mut floors = Vec::new();
            if !part.out.is_empty() {
                let seq = part.marker.seq + 1;
                let mut cur: Vec<OutEvent> = Vec::new();
                let mut bytes = 0usize;
                let mut seen = std::collections::BTreeSet::new();
                for ev in &part.out {
                    if seen.insert((ev.topic, ev.partition)) {
                        let name = &self.outputs[ev.topic as usize];
                        if let Some(o) = acked.get(&(name.clone(), ev.partition)) {
                            floors.push((ev.topic, ev.partition, o + 1));
                        }
                    }
                    if !cur.is_empty() && bytes + ev.payload.len() > CHUNK_BYTES {
                        let chunk = OutboxChunk {
                            seq,
                            events: std::mem::take(&mut cur),
                        };
                        part.pending
                            .push((outbox_key(chunks), Some(encode_value(&chunk))));
                        chunks += 1;
                        bytes = 0;
                    }
                    bytes += ev.payload.len();
                    cur.push(ev.clone());
                }
                let chunk = OutboxChunk { seq, events: cur };
                part.pending
                    .push((outbox_key(chunks), Some(encode_value(&chunk))));
                chunks += 1;
            }
            let marker = CycleMarker {
                seq: part.marker.seq + 1,
                next_offset: part.next_offset,
                outbox_chunks: chunks,
                delivered: chunks == 0,
                floors,
            };
            part.pending
                .push((CYCLE_KEY.to_vec(), Some(encode_value(&marker))));
            let topic = self.names.changelog(&tp.0);
            for (k, v) in &part.pending {
                send_record(
                    &self.producer,
                    &topic,
                    Some(k),
                    v.as_deref(),
                    Some(tp.1),
                    None,
                )?;
            }
            part.marker = marker;
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in &self.offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o))
                .map_err(|e| kafka_err("offset list", e))?;
        }
        if self.mode == Mode::Transactional {
            if tpl.count() > 0 {
                let meta = consumer
                    .group_metadata()
                    .ok_or_else(|| anyhow!("no consumer group metadata"))?;
                self.producer
                    .send_offsets_to_transaction(&tpl, &meta, self.step_timeout())
                    .map_err(|e| kafka_err("send offsets to transaction", e))?;
            }
            self.producer
                .commit_transaction(self.step_timeout())
                .map_err(|e| kafka_err("commit transaction", e))?;
            self.producer.poll(Duration::ZERO);
            if let Some(f) = self.producer.context().take_failure() {
                // Committed means every message was acknowledged; a report of a
                // failure here is from an earlier aborted cycle.
                tracing::debug!("stale delivery failure after commit: {f}");
            }
        } else {
            self.flush_acked("flush changelog")?;
        }
        self.in_txn = false;
        let t_changelog = started.elapsed();
        // The changelog is durable: RocksDB follows, with the position.
        let acked = self.producer.context().acked();
        for tp in &sealing {
            let Some(part) = self.parts.get_mut(tp) else {
                continue;
            };
            let records = std::mem::take(&mut part.pending);
            let pos = acked
                .get(&(self.names.changelog(&tp.0), tp.1))
                .map(|o| o + 1);
            let positions: Vec<(&str, i64)> = pos.map(|p| (CHANGELOG_POS, p)).into_iter().collect();
            part.store
                .apply(&records, &positions)
                .map_err(store_fatal)?;
            tracing::debug!(topic = %tp.0, partition = tp.1, seq = part.marker.seq,
                next_offset = part.marker.next_offset, changelog_pos = ?pos,
                records = records.len(), events = part.out.len(), "cycle written");
            part.dirty = false;
            part.out_count = 0;
        }
        let t_store = started.elapsed();
        if self.mode == Mode::Outbox {
            for tp in &sealing {
                let Some(part) = self.parts.get(tp) else {
                    continue;
                };
                for (i, ev) in part.out.iter().enumerate() {
                    self.publish_outboxed(tp, part.marker.seq, i as u32, ev)?;
                }
            }
            self.flush_acked("flush events")?;
            for part in self.parts.values_mut() {
                part.out.clear();
                part.out_bytes = 0;
            }
        }
        let t_publish = started.elapsed();
        if self.mode != Mode::Transactional && tpl.count() > 0 {
            consumer
                .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
                .map_err(|e| kafka_err("commit offsets", e))?;
        }
        self.offsets.clear();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            events_ms = ms(t_events),
            changelog_ms = ms(t_changelog - t_events),
            store_ms = ms(t_store - t_changelog),
            publish_ms = ms(t_publish - t_store),
            offsets_ms = ms(started.elapsed() - t_publish),
            "cycle phases"
        );
        self.metrics
            .commit_duration(started.elapsed().as_secs_f64());
        self.refresh_gauges();
        Ok(())
    }

    /// Outbox mode, before handing partitions over: marks the last cycle
    /// of each partition delivered, so the next owner need not check.
    fn seal_delivered(&mut self) -> Result<()> {
        if self.mode != Mode::Outbox {
            return Ok(());
        }
        let tps: Vec<Tp> = self
            .parts
            .iter()
            .filter(|(_, p)| !p.marker.delivered)
            .map(|(tp, _)| tp.clone())
            .collect();
        self.write_delivered(&tps)
    }

    /// Writes the cycle marker of `tps` again with `delivered` set, to the
    /// changelog and then RocksDB.
    fn write_delivered(&mut self, tps: &[Tp]) -> Result<()> {
        let mut sealed = Vec::new();
        for tp in tps {
            let Some(part) = self.parts.get(tp) else {
                continue;
            };
            let mut m = part.marker.clone();
            m.delivered = true;
            let v = encode_value(&m);
            send_record(
                &self.producer,
                &self.names.changelog(&tp.0),
                Some(CYCLE_KEY),
                Some(&v),
                Some(tp.1),
                None,
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
                    .apply(&[(CYCLE_KEY.to_vec(), Some(v))], &positions)
                    .map_err(store_fatal)?;
                part.marker = m;
            }
        }
        Ok(())
    }

    /// Takes restored partitions into service: overwrites the records of an
    /// interrupted cycle left at the changelog's end, and (outbox mode)
    /// completes the delivery of each one's last cycle.
    fn adopt(&mut self, restored: Vec<Restored>) -> Result<()> {
        let mut in_doubt = Vec::new();
        for Restored {
            tp,
            mut part,
            garbage,
        } in restored
        {
            self.unowned.remove(&tp);
            if !garbage.is_empty() {
                tracing::warn!(
                    topic = %tp.0,
                    partition = tp.1,
                    records = garbage.len(),
                    "the changelog ends with records of an interrupted cycle: ignored, and \
                     overwritten with the committed values in the next cycle"
                );
                for k in garbage {
                    let v = part.store.get(&k).map_err(store_fatal)?;
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
                self.ensure_txn()?;
            }
        }
        if !in_doubt.is_empty() {
            self.reconcile(&in_doubt)?;
        }
        Ok(())
    }

    /// Outbox mode: publishes the events of each partition's last cycle
    /// that are not in the output topics yet (found by their origin
    /// header), then records that cycle as delivered.
    fn reconcile(&mut self, tps: &[Tp]) -> Result<()> {
        let started = Instant::now();
        // (prefix, events) per partition; scan targets per output topic.
        let mut cycles: Vec<(Tp, u64, Vec<OutEvent>)> = Vec::new();
        let mut targets: std::collections::BTreeMap<u8, HashMap<i32, Offset>> = Default::default();
        for tp in tps {
            let part = self
                .parts
                .get(tp)
                .ok_or_else(|| anyhow!("reconcile of unassigned partition"))?;
            let marker = &part.marker;
            let events = part.store.outbox(marker).map_err(store_fatal)?;
            for ev in &events {
                let floor = marker
                    .floors
                    .iter()
                    .find(|f| f.0 == ev.topic && f.1 == ev.partition)
                    .map_or(Offset::Beginning, |f| Offset::Offset(f.2));
                let slot = targets
                    .entry(ev.topic)
                    .or_default()
                    .entry(ev.partition)
                    .or_insert(floor);
                *slot = match (*slot, floor) {
                    (Offset::Offset(a), Offset::Offset(b)) => Offset::Offset(a.min(b)),
                    _ => Offset::Beginning,
                };
            }
            cycles.push((tp.clone(), marker.seq, events));
        }
        let wanted: HashMap<String, usize> = cycles
            .iter()
            .enumerate()
            .map(|(i, (tp, seq, _))| (origin_prefix(tp, *seq), i))
            .collect();
        let mut present: std::collections::HashSet<(usize, u32)> = Default::default();
        for (t, parts) in &targets {
            scan_origins(
                &self.cfg,
                &self.outputs[*t as usize],
                parts,
                &wanted,
                &mut present,
            )?;
        }
        let mut resent = vec![0usize; cycles.len()];
        for (i, (tp, seq, events)) in cycles.iter().enumerate() {
            for (j, ev) in events.iter().enumerate() {
                if present.contains(&(i, j as u32)) {
                    continue;
                }
                self.publish_outboxed(tp, *seq, j as u32, ev)?;
                resent[i] += 1;
            }
        }
        if resent.iter().any(|n| *n > 0) {
            self.flush_acked("re-publish the interrupted cycle's events")?;
        }
        for (i, (tp, seq, events)) in cycles.iter().enumerate() {
            tracing::info!(
                topic = %tp.0,
                partition = tp.1,
                cycle = seq,
                events = events.len(),
                published_now = resent[i],
                elapsed_ms = started.elapsed().as_millis() as u64,
                "completed the delivery of the last cycle before this restore"
            );
        }
        self.write_delivered(tps)
    }

    /// Deletes local state of partitions this instance has not owned for
    /// `state.cleanup_grace_seconds` (the changelog still has it).
    fn cleanup_unowned(&mut self) {
        let grace = Duration::from_secs_f64(self.cfg.state.cleanup_grace_seconds);
        let due: Vec<Tp> = self
            .unowned
            .iter()
            .filter(|(tp, since)| since.elapsed() >= grace && !self.parts.contains_key(*tp))
            .map(|(tp, _)| tp.clone())
            .collect();
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

    fn abort(&mut self) {
        if self.in_txn {
            if self.mode == Mode::Transactional {
                if let Err(e) = self.producer.abort_transaction(self.step_timeout()) {
                    tracing::error!("abort transaction failed: {e}");
                }
            }
            self.in_txn = false;
        }
        self.offsets.clear();
        for p in self.parts.values_mut() {
            p.pending.clear();
            p.out.clear();
            p.out_bytes = 0;
        }
        // In-memory state now runs ahead of what was committed.
        self.broken
            .get_or_insert_with(|| anyhow!("cycle aborted; rebuilding state from the last commit"));
    }
}

/// `<input topic>/<partition>/<cycle>/`: what every origin header of one
/// cycle starts with.
fn origin_prefix(tp: &Tp, seq: u64) -> String {
    format!("{}/{}/{}/", tp.0, tp.1, seq)
}

/// Reads `topic`'s `partitions` from the given offsets to their end and
/// collects (cycle, index) of the events whose origin header starts with
/// one of the `wanted` prefixes.
fn scan_origins(
    cfg: &Config,
    topic: &str,
    partitions: &HashMap<i32, Offset>,
    wanted: &HashMap<String, usize>,
    present: &mut std::collections::HashSet<(usize, u32)>,
) -> Result<()> {
    let consumer: BaseConsumer<QuietEof> = reader_config(cfg, "reconcile")
        .create_with_context(QuietEof)
        .context("cannot create the output reader")?;
    let mut tpl = TopicPartitionList::new();
    for (p, o) in partitions {
        tpl.add_partition_offset(topic, *p, *o)
            .map_err(|e| anyhow!("{e}"))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| anyhow!("assign {topic}: {e}"))?;
    let mut done = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while done.len() < partitions.len() {
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if Instant::now() > deadline {
                    return Err(anyhow!("reading {topic} to its end timed out"));
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                done.insert(p);
            }
            Some(Err(e)) => return Err(anyhow!("reading {topic}: {e}")),
            Some(Ok(m)) => {
                let Some(headers) = m.headers() else { continue };
                for h in headers.iter() {
                    if h.key != ORIGIN_HEADER {
                        continue;
                    }
                    let Some(v) = h.value.and_then(|v| std::str::from_utf8(v).ok()) else {
                        continue;
                    };
                    let Some((prefix, idx)) = v.rsplit_once('/') else {
                        continue;
                    };
                    // `prefix` lacks the trailing slash the map keys have.
                    let key = format!("{prefix}/");
                    if let (Some(&c), Ok(i)) = (wanted.get(&key), idx.parse::<u32>()) {
                        present.insert((c, i));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A reader that assigns partitions itself, reads committed data only and
/// reports the end of each partition.
fn reader_config(cfg: &Config, purpose: &str) -> ClientConfig {
    let mut c = client_config(cfg);
    c.set("group.id", format!("{}-{purpose}", cfg.kafka.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        // An empty fetch answers at once: reaching the end is what it waits for.
        .set("fetch.wait.max.ms", "10");
    c
}

/// Where one partition's RocksDB lives.
fn partition_dir(cfg: &Config, tp: &Tp) -> PathBuf {
    PathBuf::from(&cfg.state.dir).join(format!("{}-{}", tp.0, tp.1))
}

/// Partition databases present under state.dir for the input topics.
fn local_partitions(cfg: &Config) -> Vec<Tp> {
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

/// A restored partition and the keys of changelog records after its last
/// cycle marker (an interrupted cycle's, never applied).
struct Restored {
    tp: Tp,
    part: Part,
    garbage: Vec<Vec<u8>>,
}

/// Restores partitions: each one's RocksDB, then the committed changelog
/// cycles after its position, read for all of them by one reader.
fn restore_partitions(cfg: &Config, names: &Names, tps: &[Tp]) -> Result<Vec<Restored>> {
    let started = Instant::now();
    let mut stores = Vec::new();
    for tp in tps {
        let dir = partition_dir(cfg, tp);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let store = Store::open(&dir).map_err(store_fatal)?;
        let from = store
            .position(CHANGELOG_POS)
            .map_err(store_fatal)?
            .unwrap_or(0);
        stores.push((tp.clone(), store, from));
    }
    let caught = catch_up(cfg, names, &stores)?;
    let mut out = Vec::new();
    for ((tp, store, _), (applied, garbage)) in stores.into_iter().zip(caught) {
        let (engine, stats) = store.load(cfg.engine(), |_| {}).map_err(store_fatal)?;
        let marker = store.cycle_marker().map_err(store_fatal)?;
        tracing::info!(
            topic = %tp.0,
            partition = tp.1,
            changelog_records = applied,
            series = stats.series,
            open_batches = stats.batches,
            dedupe = stats.dedupe,
            next_offset = marker.as_ref().map_or(-1, |m| m.next_offset),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "partition state restored"
        );
        out.push(Restored {
            tp,
            part: Part::new(store, engine, marker),
            garbage,
        });
    }
    Ok(out)
}

/// A client context that does not report reaching the end of a partition
/// as an error (the restore readers wait for exactly that).
struct QuietEof;

impl ClientContext for QuietEof {
    fn error(&self, error: KafkaError, reason: &str) {
        let eof = matches!(error, KafkaError::PartitionEOF(_))
            || matches!(error, KafkaError::Global(RDKafkaErrorCode::PartitionEOF));
        if !eof {
            tracing::error!("restore reader: {error}: {reason}");
        }
    }
}

impl ConsumerContext for QuietEof {}

/// Applies, for every store, the committed changelog cycles from its
/// position to the end: records are applied when their cycle marker
/// arrives, so those of an interrupted cycle at the end never are. Returns
/// per store how many records were applied and the keys left over.
fn catch_up(
    cfg: &Config,
    names: &Names,
    stores: &[(Tp, Store, i64)],
) -> Result<Vec<(u64, Vec<Vec<u8>>)>> {
    let mut applied = vec![0u64; stores.len()];
    if stores.is_empty() {
        return Ok(Vec::new());
    }
    let consumer: BaseConsumer<QuietEof> = reader_config(cfg, "restore")
        .create_with_context(QuietEof)
        .context("cannot create the changelog reader")?;
    // Read to the end (EOF) rather than trusting watermarks: the end a
    // read_committed reader sees is the last stable offset.
    let mut tpl = TopicPartitionList::new();
    let mut index: HashMap<(String, i32), usize> = HashMap::new();
    for (i, (tp, _, from)) in stores.iter().enumerate() {
        let topic = names.changelog(&tp.0);
        let start = if *from > 0 {
            Offset::Offset(*from)
        } else {
            Offset::Beginning
        };
        tracing::debug!(topic = %topic, partition = tp.1, from, "reading the changelog");
        tpl.add_partition_offset(&topic, tp.1, start)
            .map_err(|e| anyhow!("{e}"))?;
        index.insert((topic, tp.1), i);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| anyhow!("assign changelog: {e}"))?;
    let mut batches: Vec<Vec<Record>> = vec![Vec::new(); stores.len()];
    // PartitionEOF names only the partition number: count them per number.
    let mut want: HashMap<i32, usize> = HashMap::new();
    for (tp, _, _) in stores {
        *want.entry(tp.1).or_insert(0) += 1;
    }
    let mut eofs: HashMap<i32, usize> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while want
        .iter()
        .any(|(p, n)| eofs.get(p).copied().unwrap_or(0) < *n)
    {
        match consumer.poll(Duration::from_millis(500)) {
            None => {
                if Instant::now() > deadline {
                    return Err(anyhow!("changelog restore timed out"));
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                tracing::debug!(partition = p, "changelog end reached");
                *eofs.entry(p).or_insert(0) += 1
            }
            Some(Err(e)) => return Err(anyhow!("changelog reader: {e}")),
            Some(Ok(m)) => {
                let Some(&i) = index.get(&(m.topic().to_owned(), m.partition())) else {
                    continue;
                };
                let key = m.key().unwrap_or_default();
                batches[i].push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
                if key == CYCLE_KEY {
                    applied[i] += batches[i].len() as u64;
                    stores[i]
                        .1
                        .apply(&batches[i], &[(CHANGELOG_POS, m.offset() + 1)])
                        .map_err(store_fatal)?;
                    batches[i].clear();
                }
            }
        }
    }
    Ok(applied
        .into_iter()
        .zip(batches)
        .map(|(n, rest)| {
            let mut keys: Vec<Vec<u8>> = rest.into_iter().map(|(k, _)| k).collect();
            keys.sort();
            keys.dedup();
            (n, keys)
        })
        .collect())
}

/// Runs the service until `stop` is set. Retriable failures rebuild the
/// session with backoff; fatal ones return an error.
pub fn run(cfg: Config, stop: &AtomicBool) -> Result<()> {
    let names = Names::new(&cfg);
    let metrics = Metrics::new(cfg.metrics.max_label_values as usize);
    let addr: std::net::SocketAddr = cfg
        .metrics
        .listen
        .parse()
        .map_err(|e| anyhow!(Fatal(format!("metrics.listen: {e}"))))?;
    let bound = crate::telemetry::serve(addr, metrics.clone()).map_err(|e| {
        anyhow!(Fatal(format!(
            "cannot listen on metrics.listen {addr}: {e}"
        )))
    })?;
    tracing::info!(%bound, "serving /metrics, /healthz, /readyz");
    let mut backoff = Duration::from_millis(500);
    let mut topics_ready = false;
    while !stop.load(Ordering::SeqCst) {
        if !topics_ready {
            match topics::ensure(&cfg, &names) {
                Ok(()) => topics_ready = true,
                Err(e) if e.downcast_ref::<Fatal>().is_some() => return Err(e),
                Err(e) => {
                    tracing::warn!("topic setup failed, retrying in {backoff:?}: {e:#}");
                    sleep_unless(stop, backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            }
        }
        match session(&cfg, &names, stop, &metrics) {
            Ok(()) => return Ok(()),
            Err(e) if e.downcast_ref::<Fatal>().is_some() => return Err(e),
            Err(e) => {
                tracing::warn!(
                    "session ended, restarting from committed state in {backoff:?}: {e:#}"
                );
                sleep_unless(stop, backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
    Ok(())
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn session(cfg: &Config, names: &Names, stop: &AtomicBool, metrics: &Arc<Metrics>) -> Result<()> {
    metrics.set_ready(false);
    let mode = Mode::of(cfg);
    let transactional = mode == Mode::Transactional;
    let outputs = [
        cfg.outputs.scores_topic.clone(),
        cfg.outputs.flags_topic.clone(),
        cfg.outputs.dlq_topic.clone(),
    ];
    let counts = topics::partition_counts(cfg, &outputs)?;
    let mut out_partitions = [0i32; 3];
    for (n, t) in out_partitions.iter_mut().zip(&outputs) {
        *n = *counts
            .get(t)
            .ok_or_else(|| anyhow!("output topic {t} has no partitions"))?;
    }
    let mut pc = client_config(cfg);
    pc.set("enable.idempotence", "true").set("linger.ms", "5");
    if transactional {
        pc.set("transactional.id", &names.transactional_id);
    }
    let producer: BaseProducer<ProduceCtx> = pc
        .create_with_context(ProduceCtx::default())
        .context("cannot create the producer")?;
    if transactional {
        producer
            .init_transactions(Duration::from_secs(30))
            .map_err(|e| kafka_err("init transactions", e))?;
    }
    let ctx = Ctx {
        inner: Mutex::new(Some(Inner {
            cfg: cfg.clone(),
            names: names.clone(),
            decode: cfg.decode_options(),
            producer,
            parts: HashMap::new(),
            in_txn: false,
            txn_started: Instant::now(),
            offsets: HashMap::new(),
            broken: None,
            updates: Vec::new(),
            mode,
            outputs,
            out_partitions,
            metrics: metrics.clone(),
            assigned_once: false,
            unowned: local_partitions(cfg)
                .into_iter()
                .map(|tp| (tp, Instant::now()))
                .collect(),
            to_restore: Vec::new(),
            deadline: None,
        })),
        metrics: metrics.clone(),
    };
    let consumer: BaseConsumer<Ctx> = client_config(cfg)
        .set("group.id", &cfg.kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("statistics.interval.ms", "5000")
        .create_with_context(ctx)
        .context("cannot create the consumer")?;
    let topics: Vec<&str> = cfg.kafka.input_topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).context("subscribe")?;
    tracing::info!(
        group = %cfg.kafka.group_id,
        topics = ?topics,
        delivery = %cfg.kafka.delivery,
        transactional_id = %names.transactional_id,
        "consuming"
    );
    let commit_every = Duration::from_millis(cfg.kafka.commit_interval_ms as u64);
    let result = poll_loop(&consumer, cfg, names, stop, commit_every);
    // Shut down: finish the cycle when healthy, else abort it.
    let mut guard = consumer.context().lock();
    if let Some(inner) = guard.as_mut() {
        if result.is_ok() && inner.broken.is_none() {
            inner.commit(&consumer)?;
            inner.seal_delivered()?;
            for p in inner.parts.values() {
                let _ = p.store.flush();
            }
        } else {
            inner.abort();
        }
    }
    drop(guard);
    consumer.unsubscribe();
    result
}

fn poll_loop(
    consumer: &BaseConsumer<Ctx>,
    cfg: &Config,
    names: &Names,
    stop: &AtomicBool,
    commit_every: Duration,
) -> Result<()> {
    while !stop.load(Ordering::SeqCst) {
        let msg = consumer.poll(Duration::from_millis(50));
        let mut guard = consumer.context().lock();
        let inner = guard
            .as_mut()
            .ok_or_else(|| anyhow!("session state missing"))?;
        if let Some(e) = inner.broken.take() {
            return Err(e);
        }
        let restoring = std::mem::take(&mut inner.to_restore);
        if !restoring.is_empty() {
            inner.metrics.set_ready(false);
            let todo: Vec<Tp> = restoring
                .into_iter()
                .filter(|tp| !inner.parts.contains_key(tp))
                .collect();
            let started = Instant::now();
            let restored = restore_partitions(cfg, names, &todo)?;
            inner.adopt(restored)?;
            inner.seek_to_state(consumer, &todo)?;
            let secs = started.elapsed().as_secs_f64() / todo.len().max(1) as f64;
            for _ in &todo {
                inner.metrics.restore_duration(secs);
            }
            // Restores block polling: no partition was idle meanwhile.
            for p in inner.parts.values_mut() {
                p.last_record = Instant::now();
            }
        }
        let drained = msg.is_none();
        if inner.assigned_once && inner.to_restore.is_empty() && !inner.metrics.is_ready() {
            inner.metrics.set_ready(true);
        }
        match msg {
            None => {}
            Some(Err(e)) => {
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                    return Err(anyhow!(Fatal(format!("consumer: {e}"))));
                }
                tracing::warn!("consumer error: {e}");
            }
            Some(Ok(m)) => {
                let tp: Tp = (m.topic().to_owned(), m.partition());
                if !inner.parts.contains_key(&tp) {
                    let restored = restore_partitions(cfg, names, std::slice::from_ref(&tp))?;
                    inner.adopt(restored)?;
                    inner.seek_to_state(consumer, std::slice::from_ref(&tp))?;
                }
                inner.handle(&tp, m.offset(), m.key(), m.payload())?;
            }
        }
        inner.cleanup_unowned();
        // Idle flush only once the consumer has nothing buffered: a backlog
        // being worked through is not idleness.
        if drained {
            inner.idle_flush()?;
        }
        if inner.in_txn
            && (inner.txn_started.elapsed() >= commit_every
                || inner.outbox_bytes() >= MAX_CYCLE_BYTES)
        {
            inner.commit(consumer)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoke_deadline_is_shorter_than_the_session_timeout() {
        let mut cfg = Config::from_layers(None, &[]).unwrap();
        assert_eq!(revoke_timeout(&cfg), Duration::from_secs(30));
        cfg.kafka.properties.insert(
            "session.timeout.ms".into(),
            toml::Value::String("6000".into()),
        );
        assert_eq!(revoke_timeout(&cfg), Duration::from_secs(4));
        cfg.kafka
            .properties
            .insert("session.timeout.ms".into(), toml::Value::Integer(900));
        assert_eq!(revoke_timeout(&cfg), Duration::from_secs(1));
    }

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        // The standard check value, and librdkafka's partitioner input.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn origin_headers_name_partition_cycle_and_index() {
        let tp: Tp = ("votes".into(), 3);
        assert_eq!(origin(&tp, 12, 0), "votes/3/12/0");
        assert!(origin(&tp, 12, 7).starts_with(&origin_prefix(&tp, 12)));
        // cycle 1 is not a prefix of cycle 12's events
        assert!(!origin(&tp, 12, 7).starts_with(&origin_prefix(&tp, 1)));
    }
}
