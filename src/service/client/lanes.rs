//! The input partitions' own queues ("lanes"), read in event-time order.
//!
//! librdkafka hands one consumer every partition's records through one
//! queue, in the order its fetches return them; a broker that serves some
//! partitions faster than others makes their watermarks drift hours apart
//! on a backlog (docs/PERFORMANCE.md). In `learned` mode an epoch seals only
//! once every partition's watermark has passed it (contract §14), so a partition
//! left behind holds the others' batches at the barrier, each written to
//! RocksDB and deleted again. Kafka Streams picks the next record by
//! timestamp across a task's partitions for the same reason.
//!
//! So each restored partition's fetch queue is split off
//! (`split_partition_queue`, before the partition is resumed, so none of its
//! records can be in the main queue), and the loop reads the lane whose
//! partition's watermark is lowest. When that lane is empty while its
//! partition has records the fetcher has not delivered yet, the loop waits
//! for it (up to [`PATIENCE`]) rather than reading ahead elsewhere: the other
//! lanes fill up to librdkafka's prefetch limit and stop being fetched, which
//! is what lets the lagging partition's fetches through. A lane at its
//! partition's end (or given up on) is passed over. The order is only a
//! preference: answers never depend on it (the engine is deterministic in
//! any interleaving of the partitions), only how much waits at the barrier.

use std::ffi::CString;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message as _};

use crate::service::client::Tp;
use crate::service::error::{Result, ServiceError};
use crate::time::Nanos;

/// How long the loop waits for the lowest partition's next records before
/// it reads the other partitions regardless (until that partition delivers
/// again). Long enough for a partition's first fetch after its assignment
/// (an offset lookup, then a fetch the broker may hold for librdkafka's
/// `fetch.wait.max.ms`, 500 ms by default): with 200 ms, one partition of a
/// backlog ran 4 hours of event time ahead of the others at the start
/// (docs/PERFORMANCE.md). It only delays: a partition at its end is never
/// waited for.
const PATIENCE: Duration = Duration::from_millis(2000);

/// How far (in event time) the lane read last may run ahead of the next
/// lowest before the lanes are compared again: a record-by-record order
/// would cost a comparison of every lane per record, and a minute is
/// little next to an epoch (contract §14's default: a day). The order only
/// decides how much waits at the barrier, never an answer.
const SLACK: Nanos = 60_000_000_000;

/// What the lanes give next.
pub enum Pick<'a> {
    Record(BorrowedMessage<'a>),
    /// The lowest partition's records are still being fetched.
    Wait,
    /// Every lane is empty, at its partition's end or given up on.
    Drained,
    Error(KafkaError),
}

/// The split-off queues of the partitions in service, and what wakes the
/// loop when one of them (or the main queue) receives something.
pub struct Lanes<C: ConsumerContext> {
    /// Parallel to `lanes` (the records returned borrow the queues while the
    /// lanes' bookkeeping changes).
    queues: Vec<PartitionQueue<C>>,
    lanes: Vec<Lane>,
    /// Lane indexes and their watermarks, reused by each full pass.
    order: Vec<usize>,
    keys: Vec<Nanos>,
    /// The lane read last, read again without a pass while its watermark
    /// stays within `SLACK` of `bound` (the next lowest's at the pass).
    current: Option<usize>,
    bound: Nanos,
    /// A lane's partition has left: drop such lanes before the next poll.
    prune: bool,
    wake: Arc<Wake>,
}

struct Lane {
    tp: Tp,
    topic: CString,
    /// The offset after the last record delivered; -1 before the first.
    next: i64,
    /// The fetcher reported the partition's end since the last record.
    at_end: bool,
    /// The fetcher delivered a record or reported the end since the lane
    /// was split: librdkafka's cached high watermark can be from before
    /// (an earlier assignment of the partition to this consumer).
    heard: bool,
    /// Since when the loop waits for this lane.
    waiting: Option<Instant>,
}

impl<C: ConsumerContext> Lanes<C> {
    pub fn new() -> Lanes<C> {
        Lanes {
            queues: Vec::new(),
            lanes: Vec::new(),
            order: Vec::new(),
            keys: Vec::new(),
            current: None,
            bound: Nanos::MIN,
            prune: false,
            wake: Arc::new(Wake::default()),
        }
    }

    /// What the main queue's non-empty callback calls.
    pub fn waker(&self) -> impl Fn() + Send + Sync + 'static {
        let wake = self.wake.clone();
        move || wake.notify()
    }

    /// Splits a partition's queue off, before the partition is resumed;
    /// `next`: the offset it continues from (-1: unknown).
    pub fn split(&mut self, consumer: &Arc<BaseConsumer<C>>, tp: &Tp, next: i64) -> Result<()> {
        self.remove(tp);
        let no_queue = || ServiceError::broker(format!("no queue for partition {}-{}", tp.0, tp.1));
        let topic = CString::new(tp.0.as_str()).map_err(|_| no_queue())?;
        let mut queue = consumer
            .split_partition_queue(&tp.0, tp.1)
            .ok_or_else(no_queue)?;
        queue.set_nonempty_callback(self.waker());
        self.queues.push(queue);
        self.lanes.push(Lane {
            tp: tp.clone(),
            topic,
            next,
            at_end: false,
            heard: false,
            waiting: None,
        });
        Ok(())
    }

    fn remove(&mut self, tp: &Tp) {
        if let Some(i) = self.lanes.iter().position(|l| &l.tp == tp) {
            self.drop_lane(i);
        }
    }

    fn drop_lane(&mut self, i: usize) {
        self.lanes.swap_remove(i);
        self.queues.swap_remove(i);
        self.current = None;
    }

    /// Whether every record of `tp` up to its end has been read: its lane
    /// has heard from the fetcher since it was split and is caught up. A
    /// partition without a lane (queued, restoring, paused) or whose first
    /// fetch has not answered yet is not: the idle flush must never close
    /// windows ahead of a backlog no one has read (contract §2, §14: every
    /// vote of it would be late).
    pub fn read_to_end(&self, consumer: &BaseConsumer<C>, tp: &Tp) -> bool {
        self.lanes
            .iter()
            .find(|l| &l.tp == tp)
            .is_some_and(|l| l.read_to_end(high_watermark(consumer, &l.topic, l.tp.1)))
    }

    /// Sleeps until a queue receives something, at most `d`.
    pub fn wait(&self, d: Duration) {
        self.wake.wait(d);
    }

    /// The next record, from the lane whose partition's watermark is lowest
    /// (`watermark`: `None` for a partition no longer in service, whose lane
    /// is dropped; `Some(None)` for one without a vote yet, read first).
    pub fn next(
        &mut self,
        consumer: &BaseConsumer<C>,
        watermark: impl Fn(&Tp) -> Option<Option<Nanos>>,
    ) -> Pick<'_> {
        let key = |l: &Lane| watermark(&l.tp).map(|w| w.unwrap_or(Nanos::MIN));
        // Lanes whose partition left, seen by the call before: dropped before
        // any poll (the record returned borrows the queues).
        if std::mem::take(&mut self.prune) {
            let mut i = 0;
            while i < self.lanes.len() {
                if key(&self.lanes[i]).is_none() {
                    self.drop_lane(i);
                } else {
                    i += 1;
                }
            }
        }
        // The lane read last, while it is still no later than the others
        // (by at most `SLACK`).
        if let Some(c) = self.current.take() {
            match key(&self.lanes[c]) {
                None => self.prune = true,
                Some(k) if k <= self.bound.saturating_add(SLACK) => {
                    match self.queues[c].poll(Duration::ZERO) {
                        Some(Ok(m)) => {
                            self.lanes[c].delivered(&m);
                            self.current = Some(c);
                            return Pick::Record(m);
                        }
                        Some(Err(KafkaError::PartitionEOF(_))) => self.lanes[c].ended(),
                        Some(Err(e)) => return Pick::Error(e),
                        None => {}
                    }
                }
                Some(_) => {}
            }
        }
        // A full pass, lowest watermark first; a lane whose partition left
        // is passed over (and dropped by the next call).
        self.keys.clear();
        self.order.clear();
        for (i, lane) in self.lanes.iter().enumerate() {
            match key(lane) {
                Some(k) => {
                    self.keys.push(k);
                    self.order.push(i);
                }
                None => {
                    self.keys.push(Nanos::MIN);
                    self.prune = true;
                }
            }
        }
        self.order.sort_by_key(|&i| self.keys[i]);
        let mut now = None;
        for rank in 0..self.order.len() {
            let i = self.order[rank];
            loop {
                match self.queues[i].poll(Duration::ZERO) {
                    Some(Ok(m)) => {
                        self.lanes[i].delivered(&m);
                        self.current = Some(i);
                        self.bound = self
                            .order
                            .get(rank + 1)
                            .map_or(Nanos::MAX, |&j| self.keys[j]);
                        return Pick::Record(m);
                    }
                    Some(Err(KafkaError::PartitionEOF(_))) => self.lanes[i].ended(),
                    Some(Err(e)) => return Pick::Error(e),
                    None => break,
                }
            }
            let lane = &mut self.lanes[i];
            if lane.caught_up(consumer) {
                continue;
            }
            let now = *now.get_or_insert_with(Instant::now);
            let since = *lane.waiting.get_or_insert(now);
            if now.duration_since(since) < PATIENCE {
                return Pick::Wait;
            }
        }
        Pick::Drained
    }
}

impl Lane {
    fn delivered(&mut self, m: &BorrowedMessage<'_>) {
        self.next = m.offset() + 1;
        self.at_end = false;
        self.heard = true;
        self.waiting = None;
    }

    fn ended(&mut self) {
        self.at_end = true;
        self.heard = true;
        self.waiting = None;
    }

    /// Whether the partition has nothing more to deliver now: its end was
    /// reported, or librdkafka's last fetch put its end at most one offset
    /// past the last record (that one can be a transaction's commit marker,
    /// which is never delivered).
    fn caught_up<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>) -> bool {
        self.at_end
            || (self.next >= 0 && self.below(high_watermark(consumer, &self.topic, self.tp.1)))
    }

    /// Whether the high watermark `hi` is at most one offset past the last
    /// record delivered.
    fn below(&self, hi: Option<i64>) -> bool {
        hi.is_some_and(|hi| hi - self.next <= 1)
    }

    /// [`Lanes::read_to_end`] given the high watermark `hi`: the fetcher
    /// has spoken since the split, and the partition is at its end.
    fn read_to_end(&self, hi: Option<i64>) -> bool {
        self.heard && (self.at_end || (self.next >= 0 && self.below(hi)))
    }
}

/// The partition's high watermark as of librdkafka's last fetch response,
/// without a request. rust-rdkafka has only the blocking query to the
/// broker (`fetch_watermarks`), too slow for a per-record decision, so this
/// calls librdkafka's `rd_kafka_get_watermark_offsets` itself.
fn high_watermark<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &CString,
    partition: i32,
) -> Option<i64> {
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid while `consumer` is borrowed; the
    // topic is a NUL-terminated string and both out-pointers are valid for
    // the call, which only reads the partition's cached offsets.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high)
}

/// A flag and a condition variable: set by librdkafka's threads when a
/// queue becomes non-empty, waited on by the loop when it has nothing to do.
#[derive(Default)]
struct Wake {
    ready: Mutex<bool>,
    cv: Condvar,
}

impl Wake {
    fn notify(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_one();
    }

    fn wait(&self, d: Duration) {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        if !*ready {
            ready = self
                .cv
                .wait_timeout(ready, d)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *ready = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(next: i64) -> Lane {
        Lane {
            tp: ("votes".into(), 0),
            topic: CString::new("votes").unwrap(),
            next,
            at_end: false,
            heard: false,
            waiting: None,
        }
    }

    /// A lane is read to its end (idle-flushable) only once the fetcher
    /// has delivered or reported the end since the split: a restored
    /// partition's first fetch may not have answered, and librdkafka's
    /// cached high watermark may be an earlier assignment's.
    #[test]
    fn a_partition_is_read_to_its_end_only_after_the_fetcher_spoke() {
        // Just split at the restored offset 100; a stale watermark says 100.
        let mut l = lane(100);
        assert!(!l.read_to_end(Some(100)), "first fetch not answered");
        assert!(!l.read_to_end(None));
        // Records delivered up to 149, the partition's end at 150 (or 151
        // behind a transaction marker).
        l.next = 150;
        l.heard = true;
        assert!(l.read_to_end(Some(150)));
        assert!(l.read_to_end(Some(151)));
        assert!(!l.read_to_end(Some(152)), "a backlog not fetched yet");
        assert!(!l.read_to_end(None), "no watermark known");
        // The end reported by the fetcher.
        let mut e = lane(-1);
        assert!(!e.read_to_end(None));
        e.at_end = true;
        e.heard = true;
        assert!(e.read_to_end(None));
    }
}
