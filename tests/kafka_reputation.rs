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
