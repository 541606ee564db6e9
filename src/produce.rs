//! `jurystream produce`: publishes a JSONL vote file to a topic (backfills, demos).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::error::{Classify, Fault, KafkaCause, RetryHint};
use crate::kafka::send_waiting;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// A failure of `jurystream produce` or `jurystream consume`. Publishing a
/// file again is safe (jurystream drops the votes it already has), so
/// "retriable" means: run the same command again.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// The Kafka client cannot be created: a `--property` librdkafka
    /// rejects (the user's). Not retriable.
    #[error("cannot create the {client}")]
    Client {
        /// "producer" or "consumer".
        client: &'static str,
        #[source]
        source: KafkaCause,
    },
    /// The topic's metadata cannot be read (the broker is unreachable or
    /// slow): the broker's or the network's. Retriable.
    #[error("cannot read the metadata of {topic} from {brokers}")]
    Metadata {
        topic: String,
        brokers: String,
        #[source]
        source: KafkaCause,
    },
    /// The topic does not exist; nothing was sent. The user's (a wrong
    /// `--topic`, or the topic is not created yet). Not retriable until
    /// it is created.
    #[error(
        "topic {topic} does not exist on {brokers}; nothing was sent. Create it \
         (`jurystream run` creates its input topics at start when kafka.create_topics is \
         true) and publish again"
    )]
    MissingTopic { topic: String, brokers: String },
    /// The input file cannot be opened: the user's path. Not retriable.
    #[error("cannot open {}", path.display())]
    OpenInput {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading the input failed after it opened (a disk or network file
    /// system error): the input's. Retriable.
    #[error("cannot read {}", path.display())]
    ReadInput {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The client did not take a record: a line over the size limit (the
    /// input's, not retriable), a fatal producer error (the broker's, not
    /// retriable) or another client error (the broker's, retriable).
    #[error("produce to {topic}")]
    Send {
        topic: String,
        #[source]
        source: KafkaCause,
    },
    /// Records the broker did not acknowledge (failed, or unanswered
    /// within the wait): the broker's. Retriable: publishing again is
    /// safe.
    #[error(
        "{} of {sent} messages to {topic} were not acknowledged by the broker \
         ({failed} failed, {unanswered} unanswered after {waited_s} s; first error: {first_error}); \
         publishing the file again is safe: jurystream drops the votes it already has",
        failed + unanswered
    )]
    NotAcknowledged {
        topic: String,
        sent: u64,
        failed: u64,
        unanswered: u64,
        waited_s: u64,
        first_error: String,
    },
    /// The consumer cannot be given a topic's partitions (an invalid
    /// partition in the metadata): the broker's answer or a bug. Not
    /// retriable.
    #[error("cannot assign the partitions of {topics}")]
    Assign {
        /// The topics, comma-separated.
        topics: String,
        #[source]
        source: KafkaCause,
    },
    /// Writing a consumed message to stdout failed (a closed pipe): the
    /// output's. Not retriable.
    #[error("cannot write to stdout")]
    Stdout(#[source] std::io::Error),
}

impl Classify for ProduceError {
    fn fault(&self) -> Fault {
        match self {
            ProduceError::Client { .. } | ProduceError::MissingTopic { .. } => Fault::Usage,
            ProduceError::OpenInput { .. } | ProduceError::ReadInput { .. } => Fault::Input,
            ProduceError::Send { source, .. } if too_large(source) => Fault::Input,
            ProduceError::Metadata { .. }
            | ProduceError::Send { .. }
            | ProduceError::NotAcknowledged { .. }
            | ProduceError::Assign { .. } => Fault::Broker,
            ProduceError::Stdout(_) => Fault::Output,
        }
    }

    /// Whether running the command again can help: see each variant.
    fn retry(&self) -> RetryHint {
        RetryHint::from_bool(match self {
            ProduceError::Metadata { .. }
            | ProduceError::ReadInput { .. }
            | ProduceError::NotAcknowledged { .. } => true,
            ProduceError::Send { source, .. } => {
                !too_large(source) && source.rdkafka_error_code() != Some(RDKafkaErrorCode::Fatal)
            }
            _ => false,
        })
    }
}

/// A record over the producer's or the broker's size limit.
fn too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
    )
}

type Result<T, E = ProduceError> = std::result::Result<T, E>;

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

/// Counts the records the broker did not acknowledge (delivery reports).
#[derive(Default)]
struct Acks {
    failed: std::sync::atomic::AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl rdkafka::ClientContext for Acks {}

impl rdkafka::producer::ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| e.to_string());
        }
    }
}

/// How long `produce` waits for the broker to acknowledge what it sent.
const PRODUCE_FLUSH: Duration = Duration::from_secs(120);

/// Publishes every non-blank line of `input`; returns how many the broker
/// acknowledged, which is all of them or an error that says how many were
/// not. A topic that does not exist is named in the error before anything
/// is sent.
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
    let producer: BaseProducer<Acks> =
        cfg.create_with_context(Acks::default())
            .map_err(|source| ProduceError::Client {
                client: "producer",
                source: source.into(),
            })?;
    let md = producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|source| ProduceError::Metadata {
            topic: topic.to_owned(),
            brokers: brokers.to_owned(),
            source: source.into(),
        })?;
    let exists = md
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
    if !exists {
        return Err(ProduceError::MissingTopic {
            topic: topic.to_owned(),
            brokers: brokers.to_owned(),
        });
    }
    let file = std::fs::File::open(input).map_err(|source| ProduceError::OpenInput {
        path: input.to_owned(),
        source,
    })?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut buf = Vec::new();
    let mut sent = 0u64;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|source| ProduceError::ReadInput {
                path: input.to_owned(),
                source,
            })?;
        if n == 0 {
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
        send_waiting(&producer, rec).map_err(|source| ProduceError::Send {
            topic: topic.to_owned(),
            source: source.into(),
        })?;
        sent += 1;
        producer.poll(Duration::ZERO);
    }
    let flushed = producer.flush(PRODUCE_FLUSH);
    let unanswered = producer.in_flight_count().max(0) as u64;
    let failed = producer
        .context()
        .failed
        .load(std::sync::atomic::Ordering::Relaxed);
    if failed + unanswered > 0 || flushed.is_err() {
        let first = producer
            .context()
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .or_else(|| flushed.err().map(|e| e.to_string()))
            .unwrap_or_default();
        return Err(ProduceError::NotAcknowledged {
            topic: topic.to_owned(),
            sent,
            failed,
            unanswered,
            waited_s: PRODUCE_FLUSH.as_secs(),
            first_error: first,
        });
    }
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
        .map_err(|source| ProduceError::Client {
            client: "consumer",
            source: source.into(),
        })?;
    // Assign every partition (no group membership: nothing to rebalance).
    let mut tpl = rdkafka::TopicPartitionList::new();
    for t in topics {
        let md = consumer
            .fetch_metadata(Some(t), Duration::from_secs(10))
            .map_err(|source| ProduceError::Metadata {
                topic: t.clone(),
                brokers: brokers.to_owned(),
                source: source.into(),
            })?;
        for mt in md.topics() {
            for p in mt.partitions() {
                tpl.add_partition_offset(t, p.id(), rdkafka::Offset::Beginning)
                    .map_err(|source| ProduceError::Assign {
                        topics: t.clone(),
                        source: source.into(),
                    })?;
            }
        }
    }
    consumer
        .assign(&tpl)
        .map_err(|source| ProduceError::Assign {
            topics: topics.join(","),
            source: source.into(),
        })?;
    let mut last = std::time::Instant::now();
    let mut n = 0u64;
    let stdout = std::io::stdout();
    loop {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let mut out = stdout.lock();
                out.write_all(m.payload().unwrap_or_default())
                    .and_then(|()| out.write_all(b"\n"))
                    .and_then(|()| out.flush())
                    .map_err(ProduceError::Stdout)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_whose_fault_and_name_what() {
        let missing = ProduceError::MissingTopic {
            topic: "votes-x".into(),
            brokers: "b:9092".into(),
        };
        assert_eq!(missing.fault(), Fault::Usage);
        assert!(!missing.is_retriable());
        let text = missing.to_string();
        assert!(
            text.starts_with("topic votes-x does not exist on b:9092; nothing was sent. Create it"),
            "{text}"
        );

        let unacked = ProduceError::NotAcknowledged {
            topic: "votes".into(),
            sent: 10,
            failed: 2,
            unanswered: 1,
            waited_s: 120,
            first_error: "timed out".into(),
        };
        assert_eq!(unacked.fault(), Fault::Broker);
        assert!(unacked.is_retriable());
        assert!(
            unacked.to_string().starts_with(
                "3 of 10 messages to votes were not acknowledged by the broker \
                 (2 failed, 1 unanswered after 120 s; first error: timed out); "
            ),
            "{unacked}"
        );

        let open = ProduceError::OpenInput {
            path: "/no/votes.jsonl".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(open.fault(), Fault::Input);
        assert!(!open.is_retriable());
        assert_eq!(open.to_string(), "cannot open /no/votes.jsonl");

        let too_large = ProduceError::Send {
            topic: "votes".into(),
            source: KafkaCause::new(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge,
            )),
        };
        assert_eq!(too_large.fault(), Fault::Input);
        assert!(!too_large.is_retriable());
        assert_eq!(too_large.to_string(), "produce to votes");
        // The client's error follows once (its code once too).
        let text = crate::error::chain(&too_large);
        assert_eq!(
            text,
            format!(
                "produce to votes: {}",
                KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
            )
        );
        assert_eq!(text.matches("MessageSizeTooLarge").count(), 1, "{text}");
        let full = ProduceError::Send {
            topic: "votes".into(),
            source: KafkaCause::new(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)),
        };
        assert_eq!(full.fault(), Fault::Broker);
        assert!(full.is_retriable());
    }
}
