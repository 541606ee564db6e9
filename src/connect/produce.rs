//! Votes to the input topic: an idempotent producer with `acks=all`, and a
//! send that returns only once the broker acknowledged every vote of a
//! request (or says it could not).

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::error::ConnectError;
use crate::config::Config;
use crate::kafka::SOURCE_HEADER;
use crate::telemetry::connect::Source;

pub struct Producer {
    /// Replaced after a failed request ([`Producer::renew`]).
    inner: RwLock<Arc<FutureProducer>>,
    /// When `inner` was last replaced.
    renewed: std::sync::Mutex<Instant>,
    config: rdkafka::ClientConfig,
    topic: String,
    timeout: Duration,
}

impl Producer {
    /// The first of `kafka.input_topics`, with the user's
    /// `kafka.properties`; librdkafka gives up on a vote after
    /// `connect.produce_timeout_ms`, so a vote is either acknowledged within
    /// a request's wait or not sent at all by this request.
    pub fn new(cfg: &Config) -> Result<Producer, ConnectError> {
        let timeout = Duration::from_millis(cfg.connect.produce_timeout_ms as u64);
        let mut c = crate::kafka::client_config(cfg);
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("message.timeout.ms", timeout.as_millis().to_string());
        // A vote may be `input.max_message_bytes` long (1 MiB by default),
        // above librdkafka's default message limit (1 000 000 bytes), which
        // failed such a vote on every retry: the client's limit follows,
        // with room for the key, unless kafka.properties sets it.
        if crate::kafka::property(cfg, "message.max.bytes").is_none() {
            let limit = (cfg.input.max_message_bytes as u64 + 64 * 1024).max(1_000_000);
            c.set("message.max.bytes", limit.to_string());
        }
        let inner: FutureProducer = c.create().map_err(|e| ConnectError::Client(e.into()))?;
        Ok(Producer {
            inner: RwLock::new(Arc::new(inner)),
            renewed: std::sync::Mutex::new(Instant::now()),
            config: c,
            topic: cfg.kafka.input_topics[0].clone(),
            timeout,
        })
    }

    fn current(&self) -> Arc<FutureProducer> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// After a failed send the producer is replaced (at most once per
    /// `produce_timeout_ms`): an idempotent producer can be stuck for good
    /// when the broker no longer accepts its identity (a broker that lost
    /// its producer state answers PRODUCER_FENCED to every retry; measured
    /// on the test broker after a restart), and a new producer gets a new
    /// identity. What the old one still holds is abandoned or lands late;
    /// either way `run` drops a vote it already has, so the client's retry
    /// through the new producer is safe.
    fn renew(&self, failed: &Arc<FutureProducer>) {
        let mut g = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let mut last = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&g, failed) || last.elapsed() < self.timeout {
            return; // renewed lately, by this request's wait or another's
        }
        match self.config.create::<FutureProducer>() {
            Ok(p) => {
                tracing::warn!(
                    "connect: votes were not acknowledged; a new producer replaces the old one"
                );
                *g = Arc::new(p);
                *last = Instant::now();
            }
            Err(e) => tracing::error!(error = %e, "connect: cannot create a new producer"),
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Whether the broker answers and knows the topic (for `/readyz`).
    pub fn check_topic(&self) -> Result<(), ConnectError> {
        use rdkafka::producer::Producer as _;
        let md = self
            .current()
            .client()
            .fetch_metadata(Some(&self.topic), Duration::from_secs(5))
            .map_err(|e| ConnectError::broker(format!("metadata of {}", self.topic), e))?;
        match md.topics().first() {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
            _ => Err(ConnectError::MissingTopic {
                topic: self.topic.clone(),
            }),
        }
    }

    /// Sends every `(key, payload)` (an empty key: none) and waits for all
    /// acknowledgements, within `connect.produce_timeout_ms` in all.
    /// Each record carries [`SOURCE_HEADER`] = `source` (contract §12).
    pub async fn send_all(
        &self,
        source: Source,
        votes: &[(&str, &[u8])],
    ) -> Result<(), ConnectError> {
        let producer = self.current();
        let result = self.send_with(&producer, source, votes).await;
        if result.is_err() {
            self.renew(&producer);
        }
        result
    }

    async fn send_with(
        &self,
        producer: &FutureProducer,
        source: Source,
        votes: &[(&str, &[u8])],
    ) -> Result<(), ConnectError> {
        let deadline = Instant::now() + self.timeout;
        let mut pending = Vec::with_capacity(votes.len());
        for &(key, payload) in votes {
            let header = Header {
                key: SOURCE_HEADER,
                value: Some(source.as_str()),
            };
            let mut record = FutureRecord::<str, [u8]>::to(&self.topic)
                .payload(payload)
                .headers(OwnedHeaders::new().insert(header));
            if !key.is_empty() {
                record = record.key(key);
            }
            loop {
                match producer.send_result(record) {
                    Ok(f) => {
                        pending.push(f);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        if Instant::now() >= deadline {
                            return Err(ConnectError::broker_without_cause(
                                "the producer queue stayed full (the broker does not keep up)",
                            ));
                        }
                        record = r;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(ConnectError::broker("produce", e)),
                }
            }
        }
        for f in pending {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left + Duration::from_millis(100), f).await {
                Ok(Ok(Ok(_))) => {}
                Ok(Ok(Err((e, _)))) => return Err(ConnectError::broker("not acknowledged", e)),
                Ok(Err(_)) => {
                    return Err(ConnectError::broker_without_cause("the producer went away"))
                }
                Err(_) => {
                    return Err(ConnectError::broker_without_cause(format!(
                        "not acknowledged within connect.produce_timeout_ms ({} ms)",
                        self.timeout.as_millis()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Waits for what is queued (at shutdown).
    pub fn flush(&self) {
        use rdkafka::producer::Producer as _;
        let _ = self.current().flush(Timeout::After(self.timeout));
    }
}
