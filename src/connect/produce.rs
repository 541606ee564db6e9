//! Votes to the input topic: an idempotent producer with `acks=all`, and a
//! send that returns only once the broker acknowledged every vote of a
//! request (or says it could not).

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::error::ConnectError;
use crate::config::Config;

pub struct Producer {
    inner: FutureProducer,
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
        let mut c = crate::service::client_config(cfg);
        c.set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("message.timeout.ms", timeout.as_millis().to_string());
        let inner: FutureProducer = c
            .create()
            .map_err(|e| ConnectError::config(format!("cannot create the Kafka producer: {e}")))?;
        Ok(Producer {
            inner,
            topic: cfg.kafka.input_topics[0].clone(),
            timeout,
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Whether the broker answers and knows the topic (for `/readyz`).
    pub fn check_topic(&self) -> Result<(), ConnectError> {
        use rdkafka::producer::Producer as _;
        let md = self
            .inner
            .client()
            .fetch_metadata(Some(&self.topic), Duration::from_secs(5))
            .map_err(|e| ConnectError::broker(format!("metadata of {}: {e}", self.topic)))?;
        match md.topics().first() {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
            _ => Err(ConnectError::config(format!(
                "topic {} does not exist (create it, or start `jurystream run` with kafka.create_topics)",
                self.topic
            ))),
        }
    }

    /// Sends every `(key, payload)` (an empty key: none) and waits for all
    /// acknowledgements, within `connect.produce_timeout_ms` in all.
    pub async fn send_all(&self, votes: &[(&str, &[u8])]) -> Result<(), ConnectError> {
        let deadline = Instant::now() + self.timeout;
        let mut pending = Vec::with_capacity(votes.len());
        for &(key, payload) in votes {
            let mut record = FutureRecord::<str, [u8]>::to(&self.topic).payload(payload);
            if !key.is_empty() {
                record = record.key(key);
            }
            loop {
                match self.inner.send_result(record) {
                    Ok(f) => {
                        pending.push(f);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        if Instant::now() >= deadline {
                            return Err(ConnectError::broker(
                                "the producer queue stayed full (the broker does not keep up)",
                            ));
                        }
                        record = r;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(ConnectError::broker(format!("produce: {e}"))),
                }
            }
        }
        for f in pending {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left + Duration::from_millis(100), f).await {
                Ok(Ok(Ok(_))) => {}
                Ok(Ok(Err((e, _)))) => {
                    return Err(ConnectError::broker(format!("not acknowledged: {e}")))
                }
                Ok(Err(_)) => return Err(ConnectError::broker("the producer went away")),
                Err(_) => {
                    return Err(ConnectError::broker(format!(
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
        let _ = self.inner.flush(Timeout::After(self.timeout));
    }
}
