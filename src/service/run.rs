//! The run loop: topic setup and sessions, rebuilt with backoff after a
//! retriable failure; one session = one consumer group member and one
//! producer, polling until stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer as _;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::api::http::Api;
use crate::api::Holdings;
use crate::config::{Config, Delivery};
use crate::engine::reputation::Mode;
use crate::error::Chain;
use crate::kafka::client_config;
use crate::output::Route;
use crate::service::client::context::Ctx;
use crate::service::client::lanes::{Lanes, Pick};
use crate::service::client::topics;
use crate::service::client::{
    check_outbox_partitioner, Names, Outputs, ProduceCtx, StateDirLock, Tp,
};
use crate::service::cycle::commit::{commit, commit_overlapped, hand_over, land};
use crate::service::error::{Classify, Result, ServiceError};
use crate::service::partition::join_lingering;
use crate::service::partition::restore::local_partitions;
use crate::service::rebalance::{drive_restore, not_restored, Consumer};
use crate::service::reputation::Reputation;
use crate::service::session::Session;
use crate::telemetry::Metrics;

/// A cycle is committed early once its outbox holds this many bytes.
const MAX_CYCLE_BYTES: usize = 16 * 1024 * 1024;

/// The backoff after the `n`-th consecutive failure (from 0): 0.5 s
/// doubling up to 30 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1u64 << n.min(16))).min(Duration::from_secs(30))
}

/// Runs the service until `stop` is set. Retriable failures rebuild the
/// session with backoff; fatal ones are returned.
pub fn run(cfg: Config, stop: &AtomicBool) -> Result<()> {
    // Held until the process ends: no other process can use state.dir.
    let state_dir = StateDirLock::acquire(std::path::Path::new(&cfg.state.dir))?;
    let names = Names::with_instance(&cfg, Some(&state_dir.instance_id));
    tracing::info!(transactional_id = %names.transactional_id, state_dir = %cfg.state.dir,
        "instance identity");
    let metrics = Metrics::with_reputation(
        cfg.metrics.max_label_values as usize,
        cfg.reputation.mode != Mode::Off,
    );
    metrics.set_delivery_mode(cfg.kafka.delivery.as_str());
    let addr: std::net::SocketAddr = cfg
        .metrics
        .listen
        .parse()
        .map_err(|e| ServiceError::address("metrics.listen", e))?;
    let holdings = Arc::new(Holdings::new(cfg.engine().initial_score));
    let api = Api::new(
        holdings.clone(),
        &cfg.api.token,
        &cfg.api.peers,
        Duration::from_millis(cfg.api.peer_timeout_ms as u64),
    );
    let bound = crate::server::serve(addr, metrics.clone(), crate::api::http::routes(api))
        .map_err(|e| ServiceError::listen("metrics.listen", addr, e))?
        .addr;
    tracing::info!(%bound, peers = cfg.api.peers.len(), token = !cfg.api.token.is_empty(),
        "serving /metrics, /healthz, /readyz and the query API /v1/");
    if cfg.kafka.delivery == Delivery::ExactlyOnceOutbox {
        check_outbox_partitioner(&cfg)?;
    }
    let mut failures = 0u32;
    let mut topics_ready = false;
    while !stop.load(Ordering::SeqCst) {
        let step = if topics_ready {
            session(&cfg, &names, stop, &metrics, &holdings).map(|()| true)
        } else {
            topics::ensure(&cfg, &names).map(|()| false)
        };
        match step {
            // A session returns Ok only when stopped.
            Ok(true) => return Ok(()),
            Ok(false) => topics_ready = true,
            Err(e) if !e.is_retriable() => return Err(e),
            Err(e) => {
                let wait = backoff(failures);
                failures = failures.saturating_add(1);
                let what = if topics_ready {
                    "session ended, restarting from committed state"
                } else {
                    "topic setup failed, retrying"
                };
                tracing::warn!(
                    fault = e.fault().as_str(),
                    "{what} in {wait:?}: {}",
                    Chain(&e)
                );
                sleep_unless(stop, wait);
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

/// `exactly_once` needs Kafka transactions. An empty transaction sends
/// nothing to the broker, so this one commits an input offset for a probe
/// group (`<group_id>.txn-probe`; nothing is produced and the service's own
/// group is untouched): a broker without transactions answers the commit
/// with an unsupported-feature error, before any event exists.
fn probe_transactions(cfg: &Config, producer: &BaseProducer<ProduceCtx>) -> Result<()> {
    let probe: rdkafka::consumer::BaseConsumer = client_config(cfg)
        .set("group.id", format!("{}.txn-probe", cfg.kafka.group_id))
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| ServiceError::kafka("create the transaction probe", e))?;
    let meta = probe
        .group_metadata()
        .ok_or_else(|| ServiceError::internal("no group metadata for the transaction probe"))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&cfg.kafka.input_topics[0], 0, Offset::Offset(0))
        .map_err(|e| ServiceError::kafka("transaction probe", e))?;
    let timeout = Duration::from_secs(30);
    producer
        .begin_transaction()
        .map_err(|e| ServiceError::kafka_txn("begin transaction (probe)", e))?;
    let result = producer
        .send_offsets_to_transaction(&tpl, &meta, timeout)
        .and_then(|()| producer.commit_transaction(timeout))
        .map_err(|e| ServiceError::kafka_txn("commit transaction (probe)", e));
    if result.is_err() {
        let _ = producer.abort_transaction(timeout);
    }
    result
}

/// One consumer-group session, until `stop` or a failure.
fn session(
    cfg: &Config,
    names: &Names,
    stop: &AtomicBool,
    metrics: &Arc<Metrics>,
    holdings: &Arc<Holdings>,
) -> Result<()> {
    metrics.set_ready(false);
    let input_counts = topics::partition_counts(cfg, &cfg.kafka.input_topics)?;
    holdings.set_topics(input_counts.clone().into_iter().collect());
    let delivery = cfg.kafka.delivery;
    let transactional = delivery.transactional();
    let topics: [String; 4] = [
        cfg.outputs.scores_topic.clone(),
        cfg.outputs.flags_topic.clone(),
        cfg.outputs.dlq_topic.clone(),
        cfg.reputation.topic.clone(),
    ];
    let counts = topics::partition_counts(cfg, &topics)?;
    let mut partitions = [0i32; 4];
    for r in Route::ALL {
        if r == Route::Reputation && cfg.reputation.mode == Mode::Off {
            continue;
        }
        let t = &topics[r.index()];
        partitions[r.index()] = *counts
            .get(t)
            .ok_or_else(|| ServiceError::broker(format!("output topic {t} has no partitions")))?;
    }
    let mut pc = client_config(cfg);
    pc.set("enable.idempotence", "true");
    if crate::kafka::property(cfg, "linger.ms").is_none() {
        // Commits flush what is queued at once (`kafka::flush_now`), so the
        // linger only shapes requests within a cycle (50 ms measured within
        // the noise of 5 ms, docs/PERFORMANCE.md).
        pc.set("linger.ms", LINGER_MS);
    }
    if transactional {
        // The broker aborts a transaction open longer than this, so it is
        // also how long a killed instance's open transaction holds back
        // read_committed readers of its partitions (the next owner's
        // restore among them): the commit interval + 10 s unless set.
        pc.set("transactional.id", &names.transactional_id).set(
            "transaction.timeout.ms",
            cfg.transaction_timeout_ms().to_string(),
        );
    }
    let producer: BaseProducer<ProduceCtx> = pc
        .create_with_context(ProduceCtx::default())
        .map_err(|e| ServiceError::kafka("create the producer", e))?;
    if transactional {
        producer
            .init_transactions(Duration::from_secs(30))
            .map_err(|e| ServiceError::kafka_txn("init transactions", e))?;
        probe_transactions(cfg, &producer)?;
    }
    let mut session = Session::new(
        cfg,
        names,
        producer,
        Outputs { topics, partitions },
        metrics,
        holdings,
        local_partitions(cfg),
    );
    if cfg.reputation.mode != Mode::Off {
        // Every input partition takes part in the barrier (contract §14).
        let expected: Vec<Tp> = input_counts
            .iter()
            .flat_map(|(t, n)| (0..*n).map(move |p| (t.clone(), p)))
            .collect();
        session.reputation = Some(Reputation::start(cfg, expected)?);
    }
    let ctx = Ctx::new(session, metrics.clone());
    let mut consumer: Consumer = client_config(cfg)
        .set("group.id", &cfg.kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        // A partition's end tells its lane not to wait for more (`lanes`).
        .set("enable.partition.eof", "true")
        .set("statistics.interval.ms", "5000")
        .create_with_context(ctx)
        .map_err(|e| ServiceError::kafka("create the consumer", e))?;
    let mut lanes = Lanes::new();
    consumer.set_nonempty_callback(lanes.waker());
    let consumer = Arc::new(consumer);
    let input: Vec<&str> = cfg.kafka.input_topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&input)
        .map_err(|e| ServiceError::kafka("subscribe", e))?;
    tracing::info!(
        group = %cfg.kafka.group_id,
        topics = ?input,
        delivery = %delivery,
        transactional_id = %names.transactional_id,
        "consuming"
    );
    let result = poll_loop(&consumer, &mut lanes, cfg, stop);
    // Shut down: finish the cycle when healthy, else abort it.
    let mut guard = consumer.context().lock();
    if let Some(s) = guard.as_mut() {
        if result.is_ok() && !s.is_broken() {
            commit(s, &consumer)?;
            hand_over(s)?;
            // The last cycle's RocksDB writes, so that a failed one ends
            // the process with an error (and the flush below sees them).
            s.finish_writes()?;
            for p in s.parts.values() {
                let _ = p.store().flush();
            }
        } else {
            s.abort();
        }
    }
    // The session (its stores) closes before the consumer leaves the group.
    guard.take();
    drop(guard);
    // The split queues go before the consumer leaves the group.
    drop(lanes);
    consumer.unsubscribe();
    // Writes and cancelled restores still holding a directory close it.
    join_lingering(Duration::from_secs(30));
    result
}

/// How long the poll loop sleeps with nothing to do (a queue receiving
/// something wakes it), and while a commit is in flight or a lagging
/// partition's records are being fetched.
const IDLE_POLL: Duration = Duration::from_millis(50);
const LANDING_POLL: Duration = Duration::from_millis(2);

/// Records read between two polls of the main queue (rebalances, errors,
/// statistics) while records flow.
const MAIN_EVERY: u32 = 64;

/// The producer's `linger.ms` unless `kafka.properties` sets one.
const LINGER_MS: &str = "5";

/// How the loop sleeps when it has nothing to read.
enum Nap {
    /// Until a queue receives something, at most this long.
    Wake(Duration),
    /// [`LANDING_POLL`], whatever arrives: the lowest lane is waited for.
    Lane,
}

fn poll_loop(
    consumer: &Arc<Consumer>,
    lanes: &mut Lanes<Ctx<Session>>,
    cfg: &Config,
    stop: &AtomicBool,
) -> Result<()> {
    let commit_every = Duration::from_millis(cfg.kafka.commit_interval_ms() as u64);
    // The record's topic and partition, its name copied only when it changes.
    let mut tp: Tp = (String::new(), -1);
    let mut nap = None;
    let mut since_main = MAIN_EVERY;
    while !stop.load(Ordering::SeqCst) {
        if let Some(n) = nap.take() {
            match n {
                // Waiting for the lowest lane: a plain sleep, since the
                // other lanes' records keep arriving meanwhile and their
                // wake-ups would turn the wait into a spin.
                Nap::Lane => std::thread::sleep(LANDING_POLL),
                Nap::Wake(d) => lanes.wait(d),
            }
            since_main = MAIN_EVERY;
        }
        // The main queue: callbacks (rebalances run the session's), errors,
        // and the records of a partition without a lane of its own.
        let main = if since_main >= MAIN_EVERY {
            since_main = 0;
            consumer.poll(Duration::ZERO)
        } else {
            None
        };
        since_main += 1;
        let mut guard = consumer.context().lock();
        let s = guard
            .as_mut()
            .ok_or_else(|| ServiceError::internal("session state missing"))?;
        if let Some(e) = s.take_broken() {
            return Err(e);
        }
        // Restores run on their own thread with their partitions paused:
        // this loop keeps polling (the member stays in the group) and
        // serving the partitions it has.
        drive_restore(s, consumer, lanes)?;
        // An overlapped commit that answered: its state writes start, and
        // the open cycle's transaction begins.
        land(s, consumer, None)?;
        s.reputation_turn()?;
        let restored = s.to_restore.is_empty() && s.restoring.is_none();
        if s.assigned_once && restored != s.metrics.is_ready() {
            s.metrics.set_ready(restored);
        }
        let mut drained = false;
        let mut waiting = false;
        match main {
            Some(m) => take(s, consumer, &mut tp, m)?,
            None => match lanes.next(consumer, |tp| {
                s.parts.get(tp).map(|p| p.engine().watermark())
            }) {
                Pick::Record(m) => take(s, consumer, &mut tp, Ok(m))?,
                Pick::Error(e) => take(s, consumer, &mut tp, Err(e))?,
                Pick::Wait => waiting = true,
                // Drained only if the main queue was polled too.
                Pick::Drained if since_main == 1 => drained = true,
                Pick::Drained => since_main = MAIN_EVERY,
            },
        }
        s.cleanup_unowned();
        // Idle flush only once the consumer has nothing buffered, and only
        // for partitions read to their end: a backlog being worked through,
        // or not fetched yet, is not idleness.
        if drained {
            s.idle_flush(|tp| lanes.read_to_end(consumer, tp))?;
        }
        // A cycle due while the one before it still commits grows until
        // that commit answers (or its held events reach the cap, then
        // waits for it): under a backlog, cycles lengthen to the commit's
        // round trip instead of stalling the loop.
        let full = s.outbox_bytes() >= MAX_CYCLE_BYTES;
        if s.in_cycle() && (s.cycle_age() >= commit_every || full) && (!s.defers() || full) {
            commit_overlapped(s, consumer)?;
        }
        // While a commit is in flight the loop sleeps briefly, so that its
        // answer is taken (and the next transaction begun) within ~2 ms
        // rather than after an idle sleep's 50 ms.
        let landing = s.defers();
        if waiting {
            nap = Some(Nap::Lane);
        } else if drained {
            nap = Some(Nap::Wake(if landing { LANDING_POLL } else { IDLE_POLL }));
        }
    }
    Ok(())
}

/// One record (or a consumer error) from the main queue or a lane.
fn take(
    s: &mut Session,
    consumer: &Consumer,
    tp: &mut Tp,
    msg: KafkaResult<BorrowedMessage<'_>>,
) -> Result<()> {
    match msg {
        // A partition's end matters to its lane only.
        Err(KafkaError::PartitionEOF(_)) => {}
        Err(e) => {
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                return Err(ServiceError::kafka("consumer", e));
            }
            tracing::warn!("consumer error: {e}");
        }
        Ok(m) => {
            if tp.0 != m.topic() {
                m.topic().clone_into(&mut tp.0);
            }
            tp.1 = m.partition();
            if s.parts.contains_key(tp) {
                let source = crate::kafka::vote_source(source_header(&m));
                s.handle(tp, m.offset(), m.key(), m.payload(), source)?;
            } else {
                // Fetched before its pause took effect: read again
                // from here (or the state's offset) once restored.
                not_restored(s, consumer, tp, m.offset());
            }
        }
    }
    Ok(())
}

/// The record's `jurystream-source` header (contract §12), if any.
fn source_header(m: &impl Message) -> Option<&[u8]> {
    use rdkafka::message::Headers;
    m.headers()?
        .iter()
        .find(|h| h.key == crate::kafka::SOURCE_HEADER)
        .and_then(|h| h.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_thirty_seconds() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(6), Duration::from_secs(30));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(30));
    }
}
