//! The sync (contract §12): Label Studio does not retry a failed webhook, so
//! every `label_studio.sync_interval_seconds` `connect` reads the
//! annotations updated since its last pass and produces their votes again.
//! `run` drops those it already has as duplicates; the missed ones arrive
//! (and `run` counts them: `jurystream_votes_accepted_total{source="sync"}`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::error::ConnectError;
use super::ls::{filter_time, CallError, Client, PAGE_SIZE};
use super::mapping::{annotation_votes, MappedVote, Mapping, Project};
use super::produce::Producer;
use crate::telemetry::connect::{ConnectMetrics, Source, VoteResult};
use crate::time::{parse_timestamp, wall_clock, Nanos, NANOS_PER_SEC};

/// The votes of the annotations of `tasks` updated in [`since`, `until`)
/// (from the first when `since` is None).
pub fn votes_since(
    map: &Mapping,
    project: &Project,
    tasks: &[Value],
    since: Option<Nanos>,
    until: Nanos,
) -> Vec<MappedVote> {
    let mut out = Vec::new();
    for task in tasks {
        let annotations = task["annotations"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for a in annotations {
            let updated = a["updated_at"]
                .as_str()
                .and_then(|t| parse_timestamp(t).ok());
            let recent = match (since, updated) {
                (Some(s), Some(u)) => u >= s && u < until,
                (None, Some(u)) => u < until,
                // A time that does not parse: taken (run rejects its votes
                // visibly rather than this pass hiding them).
                _ => true,
            };
            if recent {
                out.extend(annotation_votes(map, project, task, a));
            }
        }
    }
    out
}

pub struct Syncer {
    pub client: Arc<Client>,
    pub mapping: Mapping,
    pub projects: Vec<i64>,
    pub interval: Duration,
    pub lookback: Duration,
}

/// A pass's votes are re-read from this much before the last pass began
/// (Label Studio's clock and this one differ; a duplicate costs nothing).
const OVERLAP: Duration = Duration::from_secs(60);
/// A pass leaves annotations this recent to the next one: their webhook
/// may still be on its way (`run` would count the sync's copy, if first,
/// as a vote only the sync delivered).
const SETTLE: Duration = Duration::from_secs(5);

impl Syncer {
    /// Runs passes until `stop`.
    pub fn run(&self, producer: &Producer, metrics: &ConnectMetrics, stop: &AtomicBool) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "sync: cannot start its runtime; sync is off");
                return;
            }
        };
        let mut since = wall_clock() - self.lookback.as_nanos() as Nanos;
        loop {
            let started = wall_clock();
            match self.pass(&rt, producer, metrics, since) {
                Ok(votes) => {
                    metrics.sync_run(true, started as f64 / NANOS_PER_SEC as f64);
                    if votes > 0 {
                        tracing::info!(
                            votes,
                            "sync: produced the votes of recently updated annotations"
                        );
                    }
                    since = started - OVERLAP.as_nanos() as Nanos;
                }
                Err(e) => {
                    metrics.sync_run(false, 0.0);
                    tracing::warn!(error = %crate::error::Chain(&e), "sync: pass failed; the next pass covers its time again");
                }
            }
            let wake = Instant::now() + self.interval;
            while Instant::now() < wake {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200).min(self.interval));
            }
        }
    }

    /// One pass: the votes produced.
    fn pass(
        &self,
        rt: &tokio::runtime::Runtime,
        producer: &Producer,
        metrics: &ConnectMetrics,
        since: Nanos,
    ) -> Result<usize, ConnectError> {
        let ids = if self.projects.is_empty() {
            self.client.project_ids().map_err(call_error)?
        } else {
            self.projects.clone()
        };
        let mut produced = 0;
        for id in ids {
            let project = match self.client.project(id) {
                Ok(p) => Project::of(&p),
                Err(CallError::NotFound) => continue,
                Err(CallError::Other(e)) => return Err(e),
            };
            // Keyset pages: from the last task's updated_at on (a page of
            // tasks that all share it is followed by the next page number).
            let mut cursor = filter_time(since);
            let mut page = 1;
            loop {
                let tasks = self
                    .client
                    .tasks_since(id, &cursor, page)
                    .map_err(call_error)?;
                let until = wall_clock() - SETTLE.as_nanos() as Nanos;
                let votes = votes_since(&self.mapping, &project, &tasks, Some(since), until);
                if !votes.is_empty() {
                    let pairs: Vec<(&str, &[u8])> = votes
                        .iter()
                        .map(|v| (v.key.as_str(), v.json.as_bytes()))
                        .collect();
                    let result = rt.block_on(producer.send_all(Source::Sync, &pairs));
                    if let Err(e) = result {
                        metrics.votes(Source::Sync, VoteResult::Failed, votes.len() as u64);
                        return Err(e);
                    }
                    metrics.votes(Source::Sync, VoteResult::Produced, votes.len() as u64);
                    produced += votes.len();
                }
                if (tasks.len() as u32) < PAGE_SIZE {
                    break;
                }
                let last = tasks
                    .last()
                    .and_then(|t| t["updated_at"].as_str())
                    .and_then(|t| parse_timestamp(t).ok())
                    .map(filter_time);
                match last {
                    Some(t) if t != cursor => {
                        cursor = t;
                        page = 1;
                    }
                    _ => page += 1,
                }
            }
        }
        Ok(produced)
    }
}

fn call_error(e: CallError) -> ConnectError {
    match e {
        CallError::NotFound => ConnectError::Answer {
            call: "Label Studio's project list".to_owned(),
            status: 404,
            body: "not found".to_owned(),
        },
        CallError::Other(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_annotations_updated_since_count() {
        let body = crate::connect::mapping::fixtures::fixture("004_ANNOTATION_UPDATED.json");
        let project = Project::of(&body["project"]);
        let mut task = body["task"].clone();
        let mut old = body["annotation"].clone();
        old["updated_at"] = "2026-11-25T22:00:00Z".into();
        old["id"] = 9.into();
        task["annotations"] = serde_json::json!([old, body["annotation"]]);
        let map = crate::connect::mapping::fixtures::fields();
        let since = parse_timestamp("2026-11-25T22:30:00Z").unwrap();
        let end = parse_timestamp("2026-11-25T23:00:00Z").unwrap();
        let votes = votes_since(&map, &project, &[task.clone()], Some(since), end);
        assert_eq!(votes.len(), 4);
        assert!(votes.iter().all(|v| v.vote_id.starts_with("ls:1:2:")));
        assert_eq!(
            votes_since(&map, &project, &[task.clone()], None, end).len(),
            8
        );
        // Too recent: left to the next pass.
        let settling = parse_timestamp("2026-11-25T22:41:54Z").unwrap();
        assert_eq!(
            votes_since(&map, &project, &[task], None, settling).len(),
            4
        );
    }
}
