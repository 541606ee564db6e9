//! librdkafka's consumer callbacks: statistics (lag) and rebalances. A
//! rebalance callback runs inside `poll` on the service thread and reaches
//! the session only through the small [`Rebalance`] interface.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::ClientContext;

use crate::service::client::Tp;
use crate::telemetry::Metrics;

/// What a consumer-group member does when partitions come and go.
pub trait Rebalance: Sized + Send {
    /// Partitions are being taken away, at the revoke callback's start
    /// (`started`, from which the revoke deadline counts); `lost`: they are
    /// already someone else's (nothing may be committed for them).
    fn revoke(
        &mut self,
        consumer: &BaseConsumer<Ctx<Self>>,
        tps: &[Tp],
        lost: bool,
        started: Instant,
    );
    /// Partitions were assigned.
    fn assign(&mut self, consumer: &BaseConsumer<Ctx<Self>>, tps: Vec<Tp>);
}

/// The consumer's context: holds the session (`H`) so that rebalance
/// callbacks can reach it.
pub struct Ctx<H> {
    session: Mutex<Option<H>>,
    metrics: Arc<Metrics>,
}

impl<H> Ctx<H> {
    pub fn new(session: H, metrics: Arc<Metrics>) -> Ctx<H> {
        Ctx {
            session: Mutex::new(Some(session)),
            metrics,
        }
    }

    /// The session; a panic elsewhere does not make it unusable.
    pub fn lock(&self) -> MutexGuard<'_, Option<H>> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn tps(tpl: &rdkafka::TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl<H: Rebalance> ClientContext for Ctx<H> {
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

impl<H: Rebalance> ConsumerContext for Ctx<H> {
    fn pre_rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        rebalance: &rdkafka::consumer::Rebalance<'_>,
    ) {
        // The revoke deadline counts from here, before the lock is taken.
        let started = Instant::now();
        if let rdkafka::consumer::Rebalance::Revoke(tpl) = rebalance {
            let lost = consumer.assignment_lost();
            if let Some(s) = self.lock().as_mut() {
                s.revoke(consumer, &tps(tpl), lost, started);
            }
        }
    }

    fn post_rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        rebalance: &rdkafka::consumer::Rebalance<'_>,
    ) {
        match rebalance {
            rdkafka::consumer::Rebalance::Assign(tpl) => {
                if let Some(s) = self.lock().as_mut() {
                    s.assign(consumer, tps(tpl));
                }
            }
            rdkafka::consumer::Rebalance::Revoke(_) => {}
            rdkafka::consumer::Rebalance::Error(e) => tracing::error!("rebalance error: {e}"),
        }
    }
}
