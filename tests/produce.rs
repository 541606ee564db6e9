//! `jurystream produce` against the real broker: every message it reports
//! is on the topic, and a topic that does not exist is an error that names
//! it, with nothing sent (it used to print "produced N messages" and lose
//! them all). Skipped when tansu is not installed, unless
//! JURYSTREAM_REQUIRE_BROKER=1.

mod kafka_support;

use std::process::Command;

use kafka_support::*;

#[test]
fn produce_reports_only_what_the_broker_acknowledged() {
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "produce", 2, "at_least_once", "");
    let generated = setup.dir.path().join("generated.jsonl");
    generate_votes(&generated, 300, 4);
    // JSON lines only (the test reads them back as JSON).
    let json: Vec<String> = std::fs::read_to_string(&generated)
        .unwrap()
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
        .map(str::to_owned)
        .collect();
    let lines = json.len();
    let input = setup.dir.path().join("votes.jsonl");
    std::fs::write(&input, json.join("\n") + "\n").unwrap();
    let produce = |topic: &str| {
        Command::new(BIN)
            .args(["produce", "--input"])
            .arg(&input)
            .args(["--topic", topic, "--brokers", &setup.bootstrap])
            .output()
            .unwrap()
    };

    // What produce says is what is on the topic: every line.
    let check = |topic: &str| {
        let out = produce(topic);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("produced {lines} messages")),
            "{stderr}"
        );
        let records = read_records(&setup.bootstrap, &[topic.to_owned()]);
        assert_eq!(records.len(), lines, "{topic}");
    };
    // A topic that does not exist: the test broker creates it when asked
    // for its metadata (as Kafka does with auto.create.topics.enable); a
    // broker that does not is named in the error, with nothing sent.
    let out = produce("produce-missing");
    if out.status.success() {
        let records = read_records(&setup.bootstrap, &["produce-missing".to_owned()]);
        assert_eq!(
            records.len(),
            lines,
            "every reported message is on the topic"
        );
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("produce-missing") && stderr.contains("does not exist"),
            "{stderr}"
        );
        assert!(!stderr.contains("produced"), "{stderr}");
    }
    create_topic(&setup.bootstrap, &setup.input_topic, 2);
    check(&setup.input_topic);
}
