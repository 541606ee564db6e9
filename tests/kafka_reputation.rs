//! SPEC §14 in `run` on a real broker: four partitions in `learned` mode
//! emit, per partition, what `replay --partition-files` gives for their
//! logs (tables over every partition's sealed sums, batches waiting at
//! the barrier), and the reputation topic holds the group's sums.

mod kafka_support;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use kafka_support::*;
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const BIN: &str = env!("CARGO_BIN_EXE_jurystream");

fn learned(name: &str) -> String {
    format!(
        "\n[reputation]\nmode = \"learned\"\nepoch_seconds = 60\nprior_votes = 2\ntopic = \"{name}-reputation\"\n"
    )
}

/// Votes over several one-minute epochs, then one vote per input
/// partition two epochs after the last (keys chosen by librdkafka's
/// partitioner, CRC-32 of the key): every partition seals every epoch a
/// batch's table holds, so the live run's idle flush, which seals a
/// partition's last epochs too, changes no table a batch uses.
fn votes(path: &Path, n: usize, partitions: u32) {
    generate_votes(path, n, 11);
    let text = std::fs::read_to_string(path).unwrap();
    let last = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["timestamp"].as_str().map(str::to_owned))
        .max()
        .unwrap();
    let end = chrono_like_plus(&last, 150);
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    let mut covered = vec![false; partitions as usize];
    for i in 0.. {
        let key = format!("close-{i}");
        let p = (crc32fast::hash(key.as_bytes()) % partitions) as usize;
        if covered[p] {
            continue;
        }
        covered[p] = true;
        writeln!(
            f,
            r#"{{"inference_id": "{key}", "voter_id": "v0", "voter_prompt_id": "accuracy", "vote": 1, "timestamp": "{end}"}}"#
        )
        .unwrap();
        if covered.iter().all(|c| *c) {
            break;
        }
    }
}

/// `ts` (`2024-07-DDTHH:MM:SS.mmmZ`, as the generator writes) plus `secs`.
fn chrono_like_plus(ts: &str, secs: i64) -> String {
    let day: i64 = ts[8..10].parse().unwrap();
    let h: i64 = ts[11..13].parse().unwrap();
    let m: i64 = ts[14..16].parse().unwrap();
    let s: i64 = ts[17..19].parse().unwrap();
    let t = ((day * 24 + h) * 60 + m) * 60 + s + secs;
    format!(
        "2024-07-{:02}T{:02}:{:02}:{:02}Z",
        t / 86_400,
        t / 3600 % 24,
        t / 60 % 60,
        t % 60
    )
}

/// The input topic split into one file per partition, in offset order.
fn partition_files(setup: &Setup) -> Vec<PathBuf> {
    read_raw_partitions(&setup.bootstrap, &setup.input_topic)
        .into_iter()
        .map(|(p, records)| {
            let path = setup.dir.path().join(format!("partition-{p}.jsonl"));
            let mut f = std::fs::File::create(&path).unwrap();
            for (_, payload) in records {
                f.write_all(&payload).unwrap();
                f.write_all(b"\n").unwrap();
            }
            path
        })
        .collect()
}

/// `replay --partition-files`: the oracle.
fn oracle(config: &Path, files: &[PathBuf]) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["replay", "--config"])
        .arg(config)
        .arg("--partition-files")
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn four_partitions_equal_their_replays(delivery: &str, name: &str) {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, name, 4, delivery, &learned(name));
    let input = setup.dir.path().join("votes.jsonl");
    votes(&input, 12_000, 4);
    setup.produce(&input);
    let files = partition_files(&setup);
    assert_eq!(files.len(), 4);
    let expected = oracle(&setup.config, &files);
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
