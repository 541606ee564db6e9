//! Outbox mode's recovery: a restored partition whose last cycle is not
//! known to be delivered has that cycle's events published again, except
//! those already in the output topics (found by their origin header).
//!
//! The planning ([`scan_plan`], [`parse_origin`], [`missing`]) is pure; the
//! read of the output topics and the publishing are at the edges.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::{reader_config, QuietEof};
use crate::output::Route;
use crate::service::client::{Tp, ORIGIN_HEADER};
use crate::service::error::{Result, ServiceError};
use crate::service::partition::changelog::{CycleMarker, OutEvent};

/// `<input topic>/<partition>/<cycle>/`: what every origin header of one
/// cycle starts with.
pub fn origin_prefix(tp: &Tp, seq: u64) -> String {
    format!("{}/{}/{}/", tp.0, tp.1, seq)
}

/// The origin header of event `idx` of cycle `seq` of input partition `tp`.
pub fn origin(tp: &Tp, seq: u64, idx: u32) -> String {
    format!("{}{idx}", origin_prefix(tp, seq))
}

/// Splits an origin header into its cycle prefix (with the trailing slash,
/// as [`origin_prefix`] makes it) and the event index.
pub fn parse_origin(v: &[u8]) -> Option<(&str, u32)> {
    let v = std::str::from_utf8(v).ok()?;
    let cut = v.rfind('/')? + 1;
    let idx = v[cut..].parse().ok()?;
    Some((&v[..cut], idx))
}

/// One interrupted cycle to complete.
pub struct Cycle {
    pub tp: Tp,
    pub marker: CycleMarker,
    pub events: Vec<OutEvent>,
}

/// Per route and output partition, the offset to read from to see every
/// event of `cycles` that reached the broker: the lowest floor among the
/// cycles writing there, or `None` (the beginning) when one of them has no
/// floor for it.
pub fn scan_plan(cycles: &[Cycle]) -> BTreeMap<Route, BTreeMap<i32, Option<i64>>> {
    let mut plan: BTreeMap<Route, BTreeMap<i32, Option<i64>>> = BTreeMap::new();
    for c in cycles {
        for ev in &c.events {
            let floor = c
                .marker
                .floors
                .iter()
                .find(|f| f.0 == ev.route && f.1 == ev.partition)
                .map(|f| f.2);
            let slot = plan
                .entry(ev.route)
                .or_default()
                .entry(ev.partition)
                .or_insert(floor);
            *slot = match (*slot, floor) {
                (Some(a), Some(b)) => Some(a.min(b)),
                _ => None,
            };
        }
    }
    plan
}

/// The (cycle, event) indexes of `cycles` not in `present`, in order.
pub fn missing(cycles: &[Cycle], present: &HashSet<(usize, u32)>) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for (i, c) in cycles.iter().enumerate() {
        for j in 0..c.events.len() as u32 {
            if !present.contains(&(i, j)) {
                out.push((i, j));
            }
        }
    }
    out
}

/// The events of `cycles` (interrupted outbox cycles) that are not in
/// the output topics, by cycle: what the new owner must publish before the
/// cycles count as delivered. Runs on the restore thread (reading the
/// outputs can take long; the poll loop must not wait for it) and gives up
/// when `cancel` is set.
pub fn undelivered(cfg: &Config, cycles: &[Cycle], cancel: &AtomicBool) -> Result<Vec<Vec<u32>>> {
    let started = Instant::now();
    let wanted: HashMap<String, usize> = cycles
        .iter()
        .enumerate()
        .map(|(i, c)| (origin_prefix(&c.tp, c.marker.seq), i))
        .collect();
    let topics = [
        &cfg.outputs.scores_topic,
        &cfg.outputs.flags_topic,
        &cfg.outputs.dlq_topic,
        &cfg.reputation.topic,
    ];
    let mut present = HashSet::new();
    for (route, partitions) in scan_plan(cycles) {
        scan_origins(
            cfg,
            topics[route.index()],
            &partitions,
            &wanted,
            &mut present,
            cancel,
        )?;
    }
    let mut out = vec![Vec::new(); cycles.len()];
    for (i, j) in missing(cycles, &present) {
        out[i].push(j);
    }
    for (c, todo) in cycles.iter().zip(&out) {
        tracing::info!(
            topic = %c.tp.0,
            partition = c.tp.1,
            cycle = c.marker.seq,
            events = c.events.len(),
            missing = todo.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checked the outputs for the last cycle before this restore"
        );
    }
    Ok(out)
}

/// Reads `topic`'s `partitions` from the given offsets to their end and
/// collects (cycle, index) of the events whose origin header starts with
/// one of the `wanted` prefixes.
fn scan_origins(
    cfg: &Config,
    topic: &str,
    partitions: &BTreeMap<i32, Option<i64>>,
    wanted: &HashMap<String, usize>,
    present: &mut HashSet<(usize, u32)>,
    cancel: &AtomicBool,
) -> Result<()> {
    let consumer: BaseConsumer<QuietEof> = reader_config(cfg, "reconcile")
        .create_with_context(QuietEof)
        .map_err(|e| ServiceError::kafka("create the output reader", e))?;
    let mut tpl = TopicPartitionList::new();
    for (p, from) in partitions {
        let o = from.map_or(Offset::Beginning, Offset::Offset);
        tpl.add_partition_offset(topic, *p, o)
            .map_err(|e| ServiceError::kafka("output reader partitions", e))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| ServiceError::kafka(&format!("assign {topic}"), e))?;
    let mut done = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while done.len() < partitions.len() {
        if cancel.load(Ordering::SeqCst) {
            return Err(ServiceError::broker("restore cancelled by a rebalance"));
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if Instant::now() > deadline {
                    return Err(ServiceError::broker(format!(
                        "reading {topic} to its end timed out"
                    )));
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                done.insert(p);
            }
            Some(Err(e)) => return Err(ServiceError::kafka(&format!("reading {topic}"), e)),
            Some(Ok(m)) => {
                let Some(headers) = m.headers() else { continue };
                for h in headers.iter().filter(|h| h.key == ORIGIN_HEADER) {
                    let Some((prefix, idx)) = h.value.and_then(parse_origin) else {
                        continue;
                    };
                    if let Some(&c) = wanted.get(prefix) {
                        present.insert((c, idx));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(route: Route, partition: i32) -> OutEvent {
        OutEvent {
            route,
            partition,
            key: None,
            payload: vec![],
        }
    }

    #[test]
    fn origin_headers_name_partition_cycle_and_index() {
        let tp: Tp = ("votes".into(), 3);
        assert_eq!(origin(&tp, 12, 0), "votes/3/12/0");
        assert!(origin(&tp, 12, 7).starts_with(&origin_prefix(&tp, 12)));
        // cycle 1 is not a prefix of cycle 12's events
        assert!(!origin(&tp, 12, 7).starts_with(&origin_prefix(&tp, 1)));
        assert_eq!(
            parse_origin(origin(&tp, 12, 7).as_bytes()),
            Some(("votes/3/12/", 7))
        );
        // Topic names may hold slashes' neighbours; the index is after the last one.
        assert_eq!(parse_origin(b"a.b-c/0/1/42"), Some(("a.b-c/0/1/", 42)));
        for bad in [&b"votes/3/12/"[..], b"no-slash", b"votes/3/12/x", b"\xff/1"] {
            assert_eq!(parse_origin(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_scan_starts_at_the_lowest_floor_or_the_beginning() {
        let tp: Tp = ("votes".into(), 0);
        let marker = |floors| CycleMarker {
            seq: 3,
            floors,
            ..CycleMarker::initial()
        };
        let cycles = vec![
            Cycle {
                tp: tp.clone(),
                marker: marker(vec![(Route::Scores, 0, 40), (Route::Scores, 1, 7)]),
                events: vec![
                    ev(Route::Scores, 0),
                    ev(Route::Scores, 1),
                    ev(Route::Dlq, 2),
                ],
            },
            Cycle {
                tp: ("votes".into(), 1),
                marker: marker(vec![(Route::Scores, 0, 30)]),
                events: vec![ev(Route::Scores, 0), ev(Route::Scores, 1)],
            },
        ];
        let plan = scan_plan(&cycles);
        // Scores/0: both cycles have floors → the lower one.
        assert_eq!(plan[&Route::Scores][&0], Some(30));
        // Scores/1: the second cycle has none → from the beginning.
        assert_eq!(plan[&Route::Scores][&1], None);
        assert_eq!(plan[&Route::Dlq][&2], None);
        assert!(!plan.contains_key(&Route::Flags));

        let present: HashSet<(usize, u32)> = [(0, 0), (0, 2), (1, 1)].into_iter().collect();
        assert_eq!(missing(&cycles, &present), vec![(0, 1), (1, 0)]);
    }
}
