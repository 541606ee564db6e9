//! librdkafka callbacks: delivery reports (producer), statistics and
//! rebalances (consumer). Rebalance callbacks run inside `poll` on the
//! service thread and reach the session through [`Ctx`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::ProducerContext;
use rdkafka::ClientContext;
use rustc_hash::FxHashMap;

use super::client::Tp;
use super::error::ServiceError;
use super::session::Session;
use crate::telemetry::Metrics;

/// The service's consumer.
pub type Consumer = BaseConsumer<Ctx>;

/// Remembers the highest acknowledged offset per topic partition and the
/// first delivery failure.
#[derive(Default)]
pub struct ProduceCtx {
    /// Topic → partition → offset: a report looks its topic up by `&str`
    /// (no allocation per acknowledged record), with a fast hash (SipHash
    /// was ~1 % of the poll loop: one lookup per acknowledged record).
    acked: Mutex<FxHashMap<String, FxHashMap<i32, i64>>>,
    failure: Mutex<Option<KafkaError>>,
}

impl ProduceCtx {
    /// The first delivery failure since the last call, if any.
    pub fn take_failure(&self) -> Option<KafkaError> {
        self.failure.lock().ok().and_then(|mut f| f.take())
    }

    /// The highest acknowledged offset of every partition written to.
    pub fn acked(&self) -> HashMap<Tp, i64> {
        let Ok(map) = self.acked.lock() else {
            return HashMap::new();
        };
        map.iter()
            .flat_map(|(topic, parts)| parts.iter().map(|(p, o)| ((topic.clone(), *p), *o)))
            .collect()
    }
}

impl ClientContext for ProduceCtx {}

impl ProducerContext for ProduceCtx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                if let Ok(mut map) = self.acked.lock() {
                    let parts = match map.get_mut(m.topic()) {
                        Some(parts) => parts,
                        None => map.entry(m.topic().to_owned()).or_default(),
                    };
                    let e = parts.entry(m.partition()).or_insert(-1);
                    *e = (*e).max(m.offset());
                }
            }
            Err((e, _)) => {
                if let Ok(mut f) = self.failure.lock() {
                    f.get_or_insert_with(|| e.clone());
                }
            }
        }
    }
}

/// The consumer's context: holds the session so that rebalance callbacks
/// can commit, hand over and release partitions.
pub struct Ctx {
    pub session: Mutex<Option<Session>>,
    pub metrics: Arc<Metrics>,
}

impl Ctx {
    /// The session state; a panic elsewhere does not make it unusable.
    pub fn lock(&self) -> MutexGuard<'_, Option<Session>> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn tps(tpl: &rdkafka::TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
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

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else { return };
        // A restore in progress stops (its applied cycles are kept); the
        // partitions still assigned afterwards are restored again.
        let interrupted = s.cancel_restore();
        s.to_restore.extend(interrupted);
        let revoked = tps(tpl);
        s.to_restore.retain(|tp| !revoked.contains(tp));
        if consumer.assignment_lost() {
            tracing::warn!("partitions lost: aborting the open cycle without committing");
            s.abort();
        } else {
            // Finish the open cycle within the revoke deadline, or abort it
            // (nothing partial is committed; the next owner restores).
            let started = Instant::now();
            let limit = s.revoke_timeout();
            s.deadline = Some(started + limit);
            let result = s.commit(consumer).and_then(|()| s.hand_over());
            s.deadline = None;
            if let Err(e) = result {
                tracing::error!(
                    deadline_ms = limit.as_millis() as u64,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "commit before revoke failed (the cycle was aborted): {e}"
                );
                s.broken.get_or_insert(e);
            }
        }
        s.release(&revoked);
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut guard = self.lock();
        let Some(s) = guard.as_mut() else { return };
        match rebalance {
            Rebalance::Assign(tpl) => {
                let tps = tps(tpl);
                tracing::info!(partitions = ?tps, "partitions assigned");
                s.assigned_once = true;
                // Paused until restored (an application pause survives a
                // revoke and reassignment, so every restore ends in resume).
                if let Err(e) = consumer.pause(tpl) {
                    s.broken
                        .get_or_insert(ServiceError::kafka("pause partitions to restore", e));
                }
                for tp in &tps {
                    s.unowned.remove(tp);
                }
                s.to_restore.extend(tps);
                s.publish_holdings();
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::error!("rebalance error: {e}"),
        }
    }
}
