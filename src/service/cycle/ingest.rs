//! Ingest: one input record through the decoder and the engine, its events
//! emitted (sent now or held for the outbox), rejections to the DLQ, and the
//! live idle flush.

use std::time::{Duration, Instant};

use crate::engine::Outcome;
use crate::input::{check_future_skew, decode_vote, dlq_payload, Rejection};
use crate::output::{score_update_events, vote_rejected_json, Route, Source};
use crate::service::client::{outbox_partition, send, Out, Tp, ORIGIN_HEADER};
use crate::service::cycle::plan::holds_events;
use crate::service::error::Result;
use crate::service::partition::changelog::OutEvent;
use crate::service::partition::reconcile::origin;
use crate::service::session::overlap::Deferred;
use crate::service::session::{not_assigned, Session};
use crate::time::{format_timestamp, wall_clock, Nanos};

/// Partitions whose last accepted vote (or idle flush, or restore) is at
/// least `idle` before `now`.
pub fn idle_due<'a>(
    last_accepted: impl Iterator<Item = (&'a Tp, Instant)>,
    now: Instant,
    idle: Duration,
) -> Vec<Tp> {
    let mut due: Vec<Tp> = last_accepted
        .filter(|(_, at)| now.saturating_duration_since(*at) >= idle)
        .map(|(tp, _)| tp.clone())
        .collect();
    due.sort();
    due
}

impl Session {
    /// One input record through the engine.
    /// `source`: the record's `source` label, as
    /// [`crate::kafka::vote_source`] gives it (contract §12).
    pub fn handle(
        &mut self,
        tp: &Tp,
        offset: i64,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        source: usize,
    ) -> Result<()> {
        if !self.part_mut(tp)?.take_offset(tp, offset) {
            return Ok(());
        }
        self.ensure_cycle()?;
        self.note_read(Instant::now());
        let now = wall_clock();
        let payload = payload.unwrap_or(&[]);
        let decoded = decode_vote(payload, &self.decode)
            .and_then(|v| check_future_skew(&v, now, self.max_skew).map(|()| v));
        let rejection = match decoded {
            Err(r) => Some(r),
            Ok(vote) => {
                let part = self.parts.get_mut(tp).ok_or_else(|| not_assigned(tp))?;
                let outcome = part.process(&vote, &mut self.updates)?;
                if outcome == Outcome::Accepted {
                    self.metrics.vote_accepted(source);
                }
                match outcome {
                    Outcome::Accepted if self.updates.is_empty() => None,
                    Outcome::Accepted => {
                        self.emit_updates(tp, now)?;
                        None
                    }
                    Outcome::Duplicate => None,
                    Outcome::Late(r) => Some(r),
                }
            }
        };
        if let Some(r) = rejection {
            let source = Source::Kafka {
                topic: tp.0.clone(),
                partition: tp.1,
                offset,
            };
            self.reject(tp, &r, key, payload, &source, now)?;
        }
        // Counters and gauges are folded in once per cycle (refresh_gauges).
        self.note_offset(tp, offset + 1);
        Ok(())
    }

    /// One output event of partition `tp`'s open cycle: sent now, or held
    /// for the outbox.
    fn emit(&mut self, tp: &Tp, route: Route, key: Option<&[u8]>, payload: Vec<u8>) -> Result<()> {
        self.emit_at(tp, route, key, payload, None)
    }

    /// [`Session::emit`] to output partition `partition`, or by its key's
    /// hash when `None`.
    pub(super) fn emit_at(
        &mut self,
        tp: &Tp,
        route: Route,
        key: Option<&[u8]>,
        payload: Vec<u8>,
        partition: Option<i32>,
    ) -> Result<()> {
        let holds = holds_events(self.delivery);
        let n = self.outputs.partitions(route);
        let part = self.part_mut(tp)?;
        let (seq, idx) = part.next_event();
        if holds {
            part.hold(OutEvent {
                route,
                partition: partition.unwrap_or_else(|| outbox_partition(key, n, tp.1)),
                key: key.map(<[u8]>::to_vec),
                payload,
            });
            Ok(())
        } else if self.defers() {
            self.defer(Deferred {
                route,
                key: key.map(<[u8]>::to_vec),
                payload,
                partition,
                origin: origin(tp, seq, idx),
            });
            Ok(())
        } else {
            send(
                &self.producer,
                Out {
                    topic: self.outputs.topic(route),
                    key,
                    payload: Some(&payload),
                    partition,
                    header: Some((ORIGIN_HEADER, origin(tp, seq, idx).as_bytes())),
                },
            )
        }
    }

    pub(super) fn emit_updates(&mut self, tp: &Tp, now: Nanos) -> Result<()> {
        let updates = std::mem::take(&mut self.updates);
        let processed_at = format_timestamp(now);
        let now_s = now as f64 / 1e9;
        let mut result = Ok(());
        for u in &updates {
            self.metrics.score_update(u, now_s);
            let key = u.series.inference_id.as_bytes();
            result = score_update_events(u, &processed_at, |route, json| {
                self.emit(tp, route, Some(key), json)
            });
            if result.is_err() {
                break;
            }
        }
        self.updates = updates;
        self.updates.clear();
        result
    }

    fn reject(
        &mut self,
        tp: &Tp,
        r: &Rejection,
        key: Option<&[u8]>,
        payload: &[u8],
        source: &Source,
        now: Nanos,
    ) -> Result<()> {
        // Reason and source at info; the detail can quote the payload, so debug only.
        tracing::info!(reason = r.reason.as_str(), ?source, "vote rejected");
        tracing::debug!(reason = r.reason.as_str(), detail = %r.detail, ?source, "vote rejected (detail)");
        self.metrics.rejected(r.reason);
        let text = vote_rejected_json(r, &dlq_payload(payload), source, &format_timestamp(now));
        self.emit(tp, Route::Dlq, key, text.into_bytes())
    }

    /// Live mode's idle flush: a partition that accepted no vote for
    /// `batching.idle_flush_seconds` (contract §2 v4: duplicates and rejected
    /// records are no activity) moves its watermark to now − grace, once
    /// every record of it has been read (`read_to_end`: a partition whose
    /// backlog is unread, just restored or resumed, is not idle).
    pub fn idle_flush(&mut self, read_to_end: impl Fn(&Tp) -> bool) -> Result<()> {
        let idle = Duration::from_secs_f64(self.cfg.batching.idle_flush_seconds);
        let grace = crate::config::seconds_to_ns(self.cfg.batching.grace_seconds);
        let mut due = idle_due(
            self.parts.iter().map(|(tp, p)| (tp, p.last_accepted())),
            Instant::now(),
            idle,
        );
        due.retain(|tp| read_to_end(tp));
        for tp in due {
            self.ensure_cycle()?;
            let now = wall_clock();
            let part = self.parts.get_mut(&tp).ok_or_else(|| not_assigned(&tp))?;
            part.advance_watermark(now - grace, &mut self.updates)?;
            if !self.updates.is_empty() {
                tracing::debug!(topic = %tp.0, partition = tp.1, closed = self.updates.len(), "idle flush");
            }
            self.emit_updates(&tp, now)?;
        }
        self.refresh_gauges();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_flush_is_due_after_the_idle_time_only() {
        let t0 = Instant::now();
        let a: Tp = ("votes".into(), 0);
        let b: Tp = ("votes".into(), 1);
        let last = [(&a, t0), (&b, t0 + Duration::from_secs(20))];
        let idle = Duration::from_secs(30);
        let at = |s| idle_due(last.iter().copied(), t0 + Duration::from_secs(s), idle);
        assert!(at(29).is_empty());
        assert_eq!(at(30), vec![a.clone()]);
        assert_eq!(at(50), vec![a.clone(), b.clone()]);
        // A clock reading before the last record is not idleness.
        assert!(idle_due(last.iter().copied(), t0, Duration::from_nanos(1)).is_empty());
    }
}
