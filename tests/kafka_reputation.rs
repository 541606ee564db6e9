//! SPEC §14 in `run` on a real broker: four partitions in `learned` mode
//! emit, per partition, what `replay --partition-files` gives for their
//! logs (tables over every partition's sealed sums, batches waiting at
//! the barrier), and the reputation topic holds the group's sums.

mod kafka_support;

use std::sync::Mutex;
use std::time::Duration;

use kafka_support::*;
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn four_partitions_equal_their_replays(delivery: &str, name: &str) {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, name, 4, delivery, &learned(name));
    let input = setup.dir.path().join("votes.jsonl");
    votes_over_epochs(&input, 12_000, 4);
    setup.produce(&input);
    let files = partition_files(&setup);
    assert_eq!(files.len(), 4);
    let expected = partition_oracle(&setup.config, &files);
    // The tables are used: some vote weighs other than 1.
    let learned_weights: Vec<f64> = expected
        .iter()
        .filter_map(|e| e["batch"]["learned_weights"].as_array())
        .flatten()
        .filter_map(Value::as_f64)
        .collect();
    assert!(!learned_weights.is_empty());
    assert!(
        learned_weights.iter().any(|w| *w != 1.0),
        "no table weighed a vote"
    );
    eprintln!(
        "{name}: {} events expected, {} learned weights, {} not 1",
        expected.len(),
        learned_weights.len(),
        learned_weights.iter().filter(|w| **w != 1.0).count()
    );
    let svc = Service::start(&setup, "a");
    wait_for_events(&setup, &expected, Duration::from_secs(300), &svc);
    assert_same_events(&setup, &expected);
    // The group's view: every partition sealed, a table in use, nothing
    // waiting once the stream is done.
    let table = wait_for("the table gauge", Duration::from_secs(60), || {
        svc.metric("jurystream_reputation_table_timestamp_seconds")
            .filter(|t| *t > 0.0)
    });
    assert!(table > 1.7e9, "{table}");
    assert_eq!(
        svc.metric("jurystream_reputation_pending_batches"),
        Some(0.0)
    );
    // The reputation topic: sums of units, and a seal record per partition.
    let seals = read_raw_partitions(&setup.bootstrap, &format!("{name}-reputation"))
        .values()
        .flatten()
        .count();
    assert!(seals >= 4, "{seals} records");
    // GET /v1/voters/{id} shows the group's weight.
    let (status, body) = svc.get("/v1/voters/v1").unwrap();
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let row = &v["voters"][0];
    assert!(row["weight"].as_f64().unwrap() > 0.0, "{body}");
    assert!(row["table_until"].is_string(), "{body}");
}

#[test]
fn four_partitions_learned_exactly_once_equal_their_replays() {
    four_partitions_equal_their_replays("exactly_once", "rep4eo");
}

#[test]
fn four_partitions_learned_outbox_equal_their_replays() {
    four_partitions_equal_their_replays("exactly_once_outbox", "rep4ob");
}

/// An input partition without traffic seals through the idle flush and
/// releases the batches the other waits with: until then the group has
/// sealed nothing, so every learned batch of partition 0 waits.
#[test]
fn an_idle_partition_seals_by_idle_flush_and_releases_the_others() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let name = "repidle";
    let extra = format!("{}\n", learned(name));
    let setup = Setup::new(&broker, name, 2, "exactly_once_outbox", &extra);
    // Partition 1 quiet for 20 s after it is assigned.
    let text = std::fs::read_to_string(&setup.config)
        .unwrap()
        .replace("idle_flush_seconds = 2", "idle_flush_seconds = 20");
    std::fs::write(&setup.config, text).unwrap();
    let all = setup.dir.path().join("all.jsonl");
    votes_over_epochs(&all, 3_000, 2);
    // Only the votes librdkafka's partitioner sends to partition 0.
    let input = setup.dir.path().join("votes.jsonl");
    let kept: String = std::fs::read_to_string(&all)
        .unwrap()
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .and_then(|v| {
                    v["inference_id"]
                        .as_str()
                        .map(|k| crc32fast::hash(k.as_bytes()).is_multiple_of(2))
                })
                .unwrap_or(false)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&input, kept).unwrap();
    setup.produce(&input);
    let files = partition_files(&setup);
    assert_eq!(files.len(), 1, "everything in partition 0");
    let empty = setup.dir.path().join("partition-1.jsonl");
    std::fs::write(&empty, "").unwrap();
    let expected = partition_oracle(&setup.config, &[files[0].clone(), empty]);
    let svc = Service::start(&setup, "a");
    let waiting = wait_for(
        "batches waiting at the barrier",
        Duration::from_secs(60),
        || {
            svc.metric("jurystream_reputation_pending_batches")
                .filter(|n| *n > 0.0)
        },
    );
    assert!(waiting > 0.0);
    wait_for_events(&setup, &expected, Duration::from_secs(120), &svc);
    assert_same_events(&setup, &expected);
    assert_eq!(
        svc.metric("jurystream_reputation_pending_batches"),
        Some(0.0)
    );
    eprintln!("{} batches waited for the idle partition", waiting);
}
