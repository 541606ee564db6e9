//! `exactly_once`'s overlapped commit (`cycle::plan::overlap`): the cycle
//! whose transaction commits on a thread of its own, and the events the
//! next cycle emits meanwhile, which wait until that commit has answered
//! and the next transaction has begun. The session owns one [`Overlap`];
//! `cycle::commit` starts and lands the commits.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::engine::agreement::RubricSums;
use crate::input::Id;
use crate::output::Route;
use crate::service::client::Tp;
use crate::service::error::{Result, ServiceError};

/// Per partition (`topic-partition`), its agreement sums by rubric.
pub type AgreementSums = Vec<(String, FxHashMap<Id, RubricSums>)>;

/// A cycle whose transaction commits off the poll loop.
pub struct InFlight {
    /// The committer's answer.
    done: mpsc::Receiver<Result<()>>,
    /// The committer (`None` once joined).
    thread: Option<JoinHandle<()>>,
    /// The partitions the cycle sealed: their RocksDB writes start when it
    /// lands.
    pub sealed: Vec<Tp>,
    /// When its commit started (the commit duration).
    pub started: Instant,
    /// The agreement sums it commits.
    pub agreement: AgreementSums,
    /// When each of its input records was read (the commit latency).
    pub read_at: Vec<Instant>,
}

impl InFlight {
    pub fn new(
        done: mpsc::Receiver<Result<()>>,
        thread: JoinHandle<()>,
        sealed: Vec<Tp>,
        started: Instant,
        agreement: AgreementSums,
        read_at: Vec<Instant>,
    ) -> InFlight {
        InFlight {
            done,
            thread: Some(thread),
            sealed,
            started,
            agreement,
            read_at,
        }
    }
}

/// An event the open cycle emitted while the cycle before it commits.
pub struct Deferred {
    pub route: Route,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub partition: Option<i32>,
    pub origin: String,
}

/// A test's pause in the committer (`JURYSTREAM_TEST_HOLD_COMMIT`, read at
/// start, and only by a build with the `test-hooks` feature;
/// docs/testing.md): before the commit is asked for, or after it
/// answered, so that a kill -9 can land at either instant while the next
/// cycle is processed. Unset, nothing pauses. (A build without the
/// feature never makes one.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
pub enum CommitHold {
    Before(Duration),
    After(Duration),
}

impl CommitHold {
    /// `before:MS` or `after:MS`.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    pub fn parse(v: &str) -> Option<CommitHold> {
        let (at, ms) = v.trim().split_once(':')?;
        let d = Duration::from_millis(ms.trim().parse().ok()?);
        match at.trim() {
            "before" => Some(CommitHold::Before(d)),
            "after" => Some(CommitHold::After(d)),
            _ => None,
        }
    }

    /// The hold the environment asks for, if any: only in a build with
    /// the `test-hooks` feature (the tests'); a production build never
    /// pauses, whatever its environment says.
    #[cfg(feature = "test-hooks")]
    pub fn from_env() -> Option<CommitHold> {
        std::env::var("JURYSTREAM_TEST_HOLD_COMMIT")
            .ok()
            .and_then(|v| CommitHold::parse(&v))
    }

    #[cfg(not(feature = "test-hooks"))]
    pub fn from_env() -> Option<CommitHold> {
        None
    }
}

/// The commit in flight, if any, and the events waiting for it.
#[derive(Default)]
pub struct Overlap {
    in_flight: Option<InFlight>,
    deferred: Vec<Deferred>,
    deferred_bytes: usize,
    /// A test's pause in the committer.
    pub hold: Option<CommitHold>,
}

impl Overlap {
    pub fn new() -> Overlap {
        Overlap {
            hold: CommitHold::from_env(),
            ..Overlap::default()
        }
    }

    /// Whether a commit is in flight (events must wait).
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    pub fn start(&mut self, f: InFlight) {
        self.in_flight = Some(f);
    }

    /// Keeps an event until the next transaction begins.
    pub fn defer(&mut self, ev: Deferred) {
        self.deferred_bytes += ev.payload.len() + ev.key.as_ref().map_or(0, Vec::len);
        self.deferred.push(ev);
    }

    /// Bytes of events waiting.
    pub fn deferred_bytes(&self) -> usize {
        self.deferred_bytes
    }

    /// The waiting events, in emission order; none wait afterwards.
    pub fn take_deferred(&mut self) -> Vec<Deferred> {
        self.deferred_bytes = 0;
        std::mem::take(&mut self.deferred)
    }

    /// The commit's answer, once it is in: waits up to `wait` for it
    /// (`None`: only takes one already there). No answer in time is a
    /// failure, as a step that timed out would be.
    pub fn answer(&mut self, wait: Option<Duration>) -> Option<(Result<()>, InFlight)> {
        let f = self.in_flight.as_ref()?;
        let gone = || ServiceError::internal("the committer thread ended without an answer");
        let result = match wait {
            Some(t) => match f.done.recv_timeout(t) {
                Ok(r) => r,
                Err(mpsc::RecvTimeoutError::Timeout) => Err(ServiceError::broker(format!(
                    "commit transaction: no answer within {t:?}"
                ))),
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
            },
            None => match f.done.try_recv() {
                Ok(r) => r,
                Err(mpsc::TryRecvError::Empty) => return None,
                Err(mpsc::TryRecvError::Disconnected) => Err(gone()),
            },
        };
        let mut f = self.in_flight.take()?;
        if result.is_ok() {
            if let Some(t) = f.thread.take() {
                let _ = t.join();
            }
        }
        // A thread without an answer in time is left to finish on its own.
        Some((result, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_before_or_after_and_milliseconds() {
        let ms = Duration::from_millis;
        assert_eq!(
            CommitHold::parse("before:3000"),
            Some(CommitHold::Before(ms(3000)))
        );
        assert_eq!(
            CommitHold::parse(" after : 5 "),
            Some(CommitHold::After(ms(5)))
        );
        assert_eq!(CommitHold::parse("during:5"), None);
        assert_eq!(CommitHold::parse("after"), None);
        assert_eq!(CommitHold::parse("after:soon"), None);
    }

    #[test]
    fn deferred_events_come_back_in_order_and_are_counted() {
        let mut o = Overlap::default();
        for i in 0..3u8 {
            o.defer(Deferred {
                route: Route::Scores,
                key: Some(vec![i; 2]),
                payload: vec![i; 10],
                partition: None,
                origin: format!("t/0/1/{i}"),
            });
        }
        assert_eq!(o.deferred_bytes(), 36);
        let back: Vec<String> = o.take_deferred().into_iter().map(|d| d.origin).collect();
        assert_eq!(back, ["t/0/1/0", "t/0/1/1", "t/0/1/2"]);
        assert_eq!(o.deferred_bytes(), 0);
        assert!(!o.busy());
        assert!(o.answer(None).is_none());
    }
}
