//! Disputed items back to reviewers (contract §12): `connect` consumes
//! `outputs.flags_topic` (group `<kafka.group_id>-label-studio`) and, for
//! each `ambiguity_flagged` event with a Label Studio vote, raises its
//! task's overlap and unlabels it, so Label Studio serves it to more
//! annotators. A flag's offset is committed only after Label Studio
//! accepted the change (retried with backoff); routing is at least once,
//! and never asks beyond `label_studio.max_annotations`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::Message;
use serde_json::Value;

use super::error::{Classify, ConnectError};
use super::ls::{CallError, Client};
use super::mapping::parse_vote_id;
use crate::config::Config;
use crate::error::Chain;
use crate::telemetry::connect::{ConnectMetrics, Routing};

/// The overlap to ask for (contract §12): min(max, max(overlap, total +
/// extra)); None when that leaves no room for another review (the task is
/// at its cap).
pub fn new_overlap(overlap: u64, total: u64, extra: u64, max: u64) -> Option<u64> {
    let want = overlap.max(total + extra).min(max);
    (want > total).then_some(want)
}

/// The annotations Label Studio counts towards a task's `overlap`: under
/// the project's "ignore skipped" setting (`skip_queue`
/// `IGNORE_SKIPPED`) a skipped annotation completes the task like any
/// other, so skips count; under the requeue settings they do not
/// (`total_annotations` is the task's annotations less its skipped
/// ones, `cancelled_annotations`).
pub fn counted_annotations(task: &Value, skip_queue: Option<&str>) -> u64 {
    let total = task["total_annotations"].as_u64().unwrap_or(0);
    let skipped = task["cancelled_annotations"].as_u64().unwrap_or(0);
    match skip_queue {
        Some("IGNORE_SKIPPED") => total + skipped,
        _ => total,
    }
}

/// The (project, annotation) of every Label Studio vote of a flag event,
/// deduplicated; empty for any other event.
pub fn flag_annotations(event: &Value) -> Vec<(i64, i64)> {
    if event["type"] != "ambiguity_flagged" {
        return Vec::new();
    }
    let set: BTreeSet<(i64, i64)> = event["votes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v["vote_id"].as_str().and_then(parse_vote_id))
        .collect();
    set.into_iter().collect()
}

pub struct Router {
    pub client: std::sync::Arc<Client>,
    pub extra: u64,
    pub max: u64,
    /// Only these projects (empty: any).
    pub projects: Vec<i64>,
}

/// How long a failed Label Studio call waits before its retry: doubling
/// from 1 s to 60 s.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

impl Router {
    /// One flag event: what routing it did (an error is retried by the
    /// caller).
    pub fn route(&self, event: &Value) -> Result<Routing, ConnectError> {
        let annotations: Vec<(i64, i64)> = flag_annotations(event)
            .into_iter()
            .filter(|(p, _)| self.projects.is_empty() || self.projects.contains(p))
            .collect();
        if annotations.is_empty() {
            return Ok(Routing::Skipped);
        }
        let mut tasks = BTreeSet::new();
        for (_, annotation) in annotations {
            match self.client.get(&format!("/api/annotations/{annotation}/")) {
                Ok(a) => {
                    if let Some(t) = a["task"].as_i64() {
                        tasks.insert(t);
                    }
                }
                Err(CallError::NotFound) => {}
                Err(CallError::Other(e)) => return Err(e),
            }
        }
        let mut outcome = Routing::TaskMissing;
        for task in tasks {
            let path = format!("/api/tasks/{task}/");
            let t = match self.client.get(&path) {
                Ok(t) => t,
                Err(CallError::NotFound) => continue,
                Err(CallError::Other(e)) => return Err(e),
            };
            let overlap = t["overlap"].as_u64().unwrap_or(1);
            // Skips count as Label Studio counts them for this project.
            let skip_queue = match t["project"].as_i64() {
                Some(p) => match self.client.get(&format!("/api/projects/{p}/")) {
                    Ok(project) => project["skip_queue"].as_str().map(str::to_owned),
                    Err(CallError::NotFound) => None,
                    Err(CallError::Other(e)) => return Err(e),
                },
                None => None,
            };
            let total = counted_annotations(&t, skip_queue.as_deref());
            let Some(want) = new_overlap(overlap, total, self.extra, self.max) else {
                if outcome == Routing::TaskMissing {
                    outcome = Routing::AtCap;
                }
                continue;
            };
            match self.client.patch(
                &path,
                &serde_json::json!({ "overlap": want, "is_labeled": false }),
            ) {
                Ok(_) => {
                    tracing::info!(
                        task,
                        overlap = want,
                        annotations = total,
                        "routing: a disputed task asks for more reviews"
                    );
                    outcome = Routing::Requested;
                }
                Err(CallError::NotFound) => {}
                Err(CallError::Other(e)) => return Err(e),
            }
        }
        Ok(outcome)
    }

    /// Consumes the flags topic until `stop`.
    pub fn run(&self, cfg: &Config, metrics: &ConnectMetrics, stop: &AtomicBool) {
        let mut c = crate::kafka::client_config(cfg);
        c.set("group.id", format!("{}-label-studio", cfg.kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed");
        // connect may start before `run` creates the flags topic; librdkafka
        // notices a subscribed topic that appears only at its next metadata
        // refresh (5 min by default), and the flags waited that long. Every
        // 10 s instead (one small request), unless kafka.properties says.
        if crate::kafka::property(cfg, "topic.metadata.refresh.interval.ms").is_none() {
            c.set("topic.metadata.refresh.interval.ms", "10000");
        }
        let consumer: BaseConsumer = match c.create() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "routing: cannot create the consumer; routing is off");
                return;
            }
        };
        if let Err(e) = consumer.subscribe(&[cfg.outputs.flags_topic.as_str()]) {
            tracing::error!(error = %e, "routing: cannot subscribe; routing is off");
            return;
        }
        while !stop.load(Ordering::SeqCst) {
            let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "routing: consumer error");
                    continue;
                }
            };
            let event: Value = msg
                .payload()
                .and_then(|p| serde_json::from_slice(p).ok())
                .unwrap_or(Value::Null);
            let mut wait = BACKOFF.0;
            loop {
                match self.route(&event) {
                    Ok(r) => {
                        metrics.routing(r);
                        break;
                    }
                    Err(e) => {
                        metrics.routing(Routing::Error);
                        tracing::warn!(error = %Chain(&e), retry_in = ?wait,
                            "routing: Label Studio refused or did not answer; the flag is retried");
                        let until = std::time::Instant::now() + wait;
                        while std::time::Instant::now() < until {
                            if stop.load(Ordering::SeqCst) {
                                return;
                            }
                            // librdkafka's heartbeats go on meanwhile; past
                            // max.poll.interval.ms the group moves the
                            // partition and the flag is routed again by
                            // its next owner (at least once).
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        wait = (wait * 2).min(BACKOFF.1);
                        if !e.is_retriable() {
                            tracing::error!(error = %Chain(&e), "routing: not retriable; fix the configuration");
                        }
                    }
                }
            }
            if let Err(e) = consumer.commit_message(&msg, CommitMode::Sync) {
                tracing::warn!(error = %e, "routing: cannot commit the flag's offset; it may be routed again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_raised_up_to_the_cap() {
        // Three reviews, overlap 3: two more.
        assert_eq!(new_overlap(3, 3, 2, 10), Some(5));
        // Overlap already above: kept.
        assert_eq!(new_overlap(8, 3, 2, 10), Some(8));
        // Capped.
        assert_eq!(new_overlap(3, 9, 2, 10), Some(10));
        // At the cap: nothing to ask for.
        assert_eq!(new_overlap(10, 10, 2, 10), None);
        assert_eq!(new_overlap(1, 12, 2, 10), None);
        // Applied twice (a redelivered flag) never goes past the cap.
        let once = new_overlap(3, 3, 2, 5).unwrap();
        assert_eq!(new_overlap(once, 3, 2, 5), Some(5));
    }

    /// A task with three reviews and one skip: under "ignore skipped" the
    /// skip completes the task like a review (four count), so two more
    /// reviews need overlap 6; under the requeue settings three count.
    #[test]
    fn skips_count_as_label_studio_counts_them() {
        let task = serde_json::json!({
            "overlap": 4, "total_annotations": 3, "cancelled_annotations": 1
        });
        let ignore = counted_annotations(&task, Some("IGNORE_SKIPPED"));
        assert_eq!(ignore, 4);
        assert_eq!(new_overlap(4, ignore, 2, 10), Some(6));
        for requeue in [Some("REQUEUE_FOR_OTHERS"), Some("REQUEUE_FOR_ME"), None] {
            let counted = counted_annotations(&task, requeue);
            assert_eq!(counted, 3, "{requeue:?}");
            assert_eq!(new_overlap(4, counted, 2, 10), Some(5), "{requeue:?}");
        }
    }

    #[test]
    fn a_flag_names_its_label_studio_annotations() {
        let flag = serde_json::json!({
            "type": "ambiguity_flagged",
            "votes": [
                {"vote_id": "ls:1:7:verdict@2026-11-25T22:41:54Z"},
                {"vote_id": "ls:1:7:verdict@2026-11-25T22:42:00Z"},
                {"vote_id": "ls:1:9:verdict@2026-11-25T22:43:00Z"},
                {"vote_id": "v-123"}
            ]
        });
        assert_eq!(flag_annotations(&flag), [(1, 7), (1, 9)]);
        let mut other = flag.clone();
        other["type"] = "score_updated".into();
        assert!(flag_annotations(&other).is_empty());
    }
}
