//! `jurystream produce`: publishes a JSONL vote file to a topic (backfills, demos).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::client::send_waiting;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// Waits until every message `producer` has queued is acknowledged (or
/// failed: the delivery reports are served), for at most `timeout`.
///
/// `Producer::flush` of rust-rdkafka polls in steps of 100 ms and its poll
/// waits out each step even when the last acknowledgement arrived at once,
/// so every flush took ≥ 100 ms. This one asks librdkafka to send at once
/// and checks again every millisecond.
pub fn flush_now<C: rdkafka::producer::ProducerContext>(
    producer: &BaseProducer<C>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match producer.flush(Duration::ZERO) {
            Ok(()) => return Ok(()),
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut)) => {}
            Err(e) => return Err(e),
        }
        if std::time::Instant::now() >= deadline {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        producer.poll(Duration::from_millis(1));
    }
}

/// The record key of a line: its `inference_id` (decimal form for integers), if any.
pub fn key_of(line: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct K {
        inference_id: Option<serde_json::Value>,
    }
    let k: K = serde_json::from_slice(line).ok()?;
    match k.inference_id? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// Publishes every non-blank line of `input`; returns how many were sent.
pub fn produce(
    input: &Path,
    topic: &str,
    brokers: &str,
    properties: &[(String, String)],
) -> Result<u64> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("message.max.bytes", "10000000");
    for (k, v) in properties {
        cfg.set(k, v);
    }
    let producer: BaseProducer = cfg.create().context("cannot create the producer")?;
    let file =
        std::fs::File::open(input).with_context(|| format!("cannot open {}", input.display()))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut buf = Vec::new();
    let mut sent = 0u64;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let key = key_of(line);
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(line);
        if let Some(k) = &key {
            rec = rec.key(k.as_bytes());
        }
        send_waiting(&producer, rec).map_err(|e| anyhow!("produce to {topic}: {e}"))?;
        sent += 1;
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(120))
        .map_err(|e| anyhow!("flush to {topic}: {e}"))?;
    Ok(sent)
}

/// Prints every committed message of `topics` (from the beginning) as one
/// line on stdout, until `idle_exit` passes with nothing new (None: forever).
pub fn consume(brokers: &str, topics: &[String], idle_exit: Option<Duration>) -> Result<u64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use std::io::Write;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("jurystream-consume-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .context("cannot create the consumer")?;
    // Assign every partition (no group membership: nothing to rebalance).
    let mut tpl = rdkafka::TopicPartitionList::new();
    for t in topics {
        let md = consumer
            .fetch_metadata(Some(t), Duration::from_secs(10))
            .map_err(|e| anyhow!("metadata for {t}: {e}"))?;
        for mt in md.topics() {
            for p in mt.partitions() {
                tpl.add_partition_offset(t, p.id(), rdkafka::Offset::Beginning)
                    .map_err(|e| anyhow!("{e}"))?;
            }
        }
    }
    consumer.assign(&tpl).context("assign")?;
    let mut last = std::time::Instant::now();
    let mut n = 0u64;
    let stdout = std::io::stdout();
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let mut out = stdout.lock();
                out.write_all(m.payload().unwrap_or_default())?;
                out.write_all(b"\n")?;
                out.flush()?;
                n += 1;
                last = std::time::Instant::now();
            }
            Some(Err(e)) => eprintln!("consume: {e}"),
            None => {}
        }
        if let Some(idle) = idle_exit {
            if last.elapsed() >= idle {
                return Ok(n);
            }
        }
    }
}
