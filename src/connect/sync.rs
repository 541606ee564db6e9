//! The sync (SPEC §12): Label Studio does not retry a failed webhook, so
//! every `label_studio.sync_interval_seconds` `connect` reads the
//! annotations updated since its last pass and produces their votes again.
//! `run` drops those it already has as duplicates; the missed ones arrive.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::error::ConnectError;
use super::ls::{filter_time, CallError, Client, PAGE_SIZE};
use super::mapping::{annotation_votes, MappedVote, Mapping, Project};
use super::produce::Producer;
use crate::telemetry::connect::{ConnectMetrics, Source, VoteResult};
use crate::time::{parse_timestamp, wall_clock, Nanos, NANOS_PER_SEC};

/// Vote ids the webhooks produced lately, so that a sync can tell the
/// votes it recovers (webhooks that were lost) from those it repeats.
/// Bounded: the oldest go first.
pub struct Recent {
    inner: Mutex<RecentIds>,
    keep: Duration,
}

/// The ids, and the same in the order they came (with when).
type RecentIds = (HashSet<String>, VecDeque<(Instant, String)>);

/// Most vote ids [`Recent`] remembers (about 100 MB at most).
const MAX_RECENT: usize = 1_000_000;

impl Recent {
    pub fn new(keep: Duration) -> Recent {
        Recent {
            inner: Mutex::new(Default::default()),
            keep,
        }
    }

    pub fn insert(&self, ids: impl IntoIterator<Item = String>) {
        let now = Instant::now();
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *g;
        for id in ids {
            if set.insert(id.clone()) {
                order.push_back((now, id));
            }
        }
        while let Some((at, id)) = order.front() {
            if order.len() <= MAX_RECENT && now.duration_since(*at) <= self.keep {
                break;
            }
            set.remove(id);
            order.pop_front();
        }
    }

    pub fn contains(&self, id: &str) -> bool {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.contains(id)
    }
}

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
/// may still be on its way, and taking them would count them as missed.
const SETTLE: Duration = Duration::from_secs(5);

impl Syncer {
    /// Runs passes until `stop`.
    pub fn run(
        &self,
        producer: &Producer,
        metrics: &ConnectMetrics,
        recent: &Recent,
        stop: &AtomicBool,
    ) {
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
            match self.pass(&rt, producer, metrics, recent, since) {
                Ok((votes, missed)) => {
                    metrics.sync_run(true, started as f64 / NANOS_PER_SEC as f64);
                    if votes > 0 {
                        tracing::info!(
                            votes,
                            missed,
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

    /// One pass: (votes produced, of them not seen from a webhook).
    fn pass(
        &self,
        rt: &tokio::runtime::Runtime,
        producer: &Producer,
        metrics: &ConnectMetrics,
        recent: &Recent,
        since: Nanos,
    ) -> Result<(usize, usize), ConnectError> {
        let ids = if self.projects.is_empty() {
            self.client.project_ids().map_err(call_error)?
        } else {
            self.projects.clone()
        };
        let (mut produced, mut missed) = (0, 0);
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
                    let lost = votes
                        .iter()
                        .filter(|v| !recent.contains(&v.vote_id))
                        .count();
                    metrics.sync_missed(lost as u64);
                    produced += votes.len();
                    missed += lost;
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
        Ok((produced, missed))
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
    fn recent_ids_are_remembered_then_forgotten() {
        let r = Recent::new(Duration::from_secs(3600));
        r.insert(["a".to_owned(), "b".to_owned()]);
        assert!(r.contains("a") && r.contains("b") && !r.contains("c"));
        let r = Recent::new(Duration::ZERO);
        r.insert(["a".to_owned()]);
        std::thread::sleep(Duration::from_millis(2));
        r.insert(["b".to_owned()]);
        assert!(
            !r.contains("a"),
            "older than keep: forgotten at the next insert"
        );
    }

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
