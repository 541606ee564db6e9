//! Kafka client plumbing shared by the service, `connect` and the
//! `produce`/`consume` tools: client settings from the configuration, a
//! reader of committed data, and the producer waits rust-rdkafka lacks.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::config::Config;
use crate::telemetry::VOTE_SOURCES;

/// The record header that says where a vote came from (contract §12 v4):
/// `connect` sets it to `api`, `webhook` or `sync`.
pub const SOURCE_HEADER: &str = "jurystream-source";

/// A vote's `source` label in `jurystream_votes_accepted_total` (contract §8),
/// as its index in [`VOTE_SOURCES`]: `kafka` without [`SOURCE_HEADER`],
/// the header's value if it is one `connect` sets, `other` for any other
/// value (a label value never comes from the data).
pub fn vote_source(header: Option<&[u8]>) -> usize {
    let Some(h) = header else { return 0 };
    let other = VOTE_SOURCES.len() - 1;
    (1..other)
        .find(|&i| VOTE_SOURCES[i].as_bytes() == h)
        .unwrap_or(other)
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

/// One `kafka.properties` value, if set.
pub fn property(cfg: &Config, key: &str) -> Option<String> {
    cfg.kafka_properties()
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// A reader that assigns partitions itself, reads committed data only and
/// reports the end of each partition.
pub fn reader_config(cfg: &Config, purpose: &str) -> ClientConfig {
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

/// A client context that does not report reaching the end of a partition
/// as an error (the restore and reconcile readers wait for exactly that).
pub struct QuietEof;

impl ClientContext for QuietEof {
    fn error(&self, error: KafkaError, reason: &str) {
        let eof = matches!(error, KafkaError::PartitionEOF(_))
            || matches!(error, KafkaError::Global(RDKafkaErrorCode::PartitionEOF));
        if !eof {
            tracing::error!("reader: {error}: {reason}");
        }
    }
}

impl ConsumerContext for QuietEof {}

/// Queues `rec`, serving delivery reports while librdkafka's queue is full
/// (a poll returns as soon as one is served).
pub fn send_waiting<C: ProducerContext>(
    producer: &BaseProducer<C>,
    mut rec: BaseRecord<'_, [u8], [u8], C::DeliveryOpaque>,
) -> Result<(), KafkaError> {
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                rec = r;
                producer.poll(Duration::from_millis(20));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Waits until every message `producer` has queued is acknowledged (or
/// failed: the delivery reports are served), for at most `timeout`.
///
/// Written by hand because neither wait of rust-rdkafka fits a commit:
/// `Producer::flush` polls in steps of 100 ms and its poll waits out each
/// step even when the last acknowledgement arrived at once, so every flush
/// took ≥ 100 ms; and a short `poll` spins, because it hands librdkafka
/// the time left in whole milliseconds, which is 0 for the last one (a
/// 1 ms poll never blocks: a commit's wait for its acknowledgements kept a
/// core busy, docs/PERFORMANCE.md, "What made it fast"). So this one asks
/// librdkafka to send at once (a flush that does not wait wakes its broker
/// threads past `linger.ms`) about every millisecond, serves the delivery
/// reports that are there, and sleeps [`ACK_WAIT_STEP`] when there are none.
pub fn flush_now<C: ProducerContext>(
    producer: &BaseProducer<C>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    let mut kicked: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if kicked.is_none_or(|at| now - at >= SEND_NOW_EVERY) {
            match producer.flush(Duration::ZERO) {
                Ok(()) => return Ok(()),
                Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {}
                Err(e) => return Err(e),
            }
            kicked = Some(now);
        }
        let waiting = producer.in_flight_count();
        if waiting == 0 {
            return Ok(());
        }
        if now >= deadline {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        // One delivery report event (a produce response's records) at most.
        producer.poll(Duration::ZERO);
        if producer.in_flight_count() == waiting {
            std::thread::sleep(ACK_WAIT_STEP);
        }
    }
}

/// How often [`flush_now`] asks librdkafka to send what is queued at once.
const SEND_NOW_EVERY: Duration = Duration::from_millis(1);

/// How long [`flush_now`] sleeps when no delivery report is waiting: a
/// fraction of a loopback round trip, so it adds little to a commit.
const ACK_WAIT_STEP: Duration = Duration::from_micros(200);

#[cfg(test)]
mod tests {
    use super::*;

    fn producer() -> BaseProducer {
        // Nothing listens on port 1: records stay queued.
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("message.timeout.ms", "60000")
            .set("log_level", "0")
            .create()
            .expect("producer")
    }

    #[test]
    fn flush_now_returns_at_once_with_nothing_queued() {
        let p = producer();
        let started = Instant::now();
        flush_now(&p, Duration::from_secs(30)).expect("nothing to wait for");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn flush_now_gives_up_at_its_timeout_when_nothing_is_acknowledged() {
        let p = producer();
        send_waiting(&p, BaseRecord::to("t").payload(&b"v"[..]).key(&b"k"[..])).expect("queued");
        let started = Instant::now();
        let err = flush_now(&p, Duration::from_millis(300)).expect_err("no broker");
        assert!(
            matches!(err, KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)),
            "{err:?}"
        );
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        assert_eq!(p.in_flight_count(), 1, "the record is still queued");
    }
}
