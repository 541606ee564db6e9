//! `delivery = "exactly_once"` (Kafka transactions) end to end.
//!
//! The test broker, tansu 0.6.0, cannot commit transactions, so these tests
//! run the service against librdkafka's mock cluster (`rdkafka::mocking`),
//! which implements the transactional protocol (InitProducerId with
//! producer-epoch fencing, AddPartitionsToTxn, TxnOffsetCommit, EndTxn) and
//! consumer groups. What the mock does not model, and these tests therefore
//! do not claim: it does not hide the records of aborted transactions from
//! `read_committed` readers, and it does not store offsets committed inside
//! a transaction. The crash-safety of the cycle is covered on the real
//! broker in outbox mode (tests/kafka_service.rs); here: that the
//! transactional cycle runs and produces exactly the replay's events, and
//! that an instance whose producer is fenced stops with a clear message
//! and exit status 1 instead of committing.

mod kafka_support;

use std::sync::Mutex;
use std::time::Duration;

use kafka_support::*;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A mock cluster of three brokers with every topic of test `name` (the
/// mock has no CreateTopics; the service finds them and creates nothing).
fn mock_setup(
    name: &str,
    partitions: i32,
) -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    Setup,
) {
    let mock = MockCluster::new(3).expect("mock cluster");
    let setup = Setup::at(
        &mock.bootstrap_servers(),
        name,
        partitions,
        "exactly_once",
        "",
        6000,
    );
    let input = setup.input_topic.clone();
    for (topic, n) in [
        (input.clone(), partitions),
        (setup.scores.clone(), 3),
        (setup.flags.clone(), 3),
        (setup.dlq.clone(), 1),
        (format!("{name}-group-changelog.{input}"), partitions),
    ] {
        mock.create_topic(&topic, n, 3).expect("create mock topic");
    }
    (mock, setup)
}

#[test]
fn exactly_once_with_transactions_equals_replay() {
    let _g = serial();
    let (_mock, setup) = mock_setup("txn", 3);
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 6_000, 21);
    let expected = replay(&setup.config, &input);
    setup.publish(&input);
    let mut svc = Service::start(&setup, "a");
    wait_for_events(&setup, &expected, Duration::from_secs(180), &svc);
    assert_same_events(&setup, &expected);
    let log = svc.log_text();
    assert!(log.contains("delivery=exactly_once "), "{log}");
    assert!(
        svc.terminate(Duration::from_secs(30)).success(),
        "{}",
        svc.log_text()
    );
}

#[test]
fn a_fenced_producer_stops_the_instance_without_committing() {
    let _g = serial();
    let (mock, setup) = mock_setup("fenced", 2);
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 20_000, 23);
    let expected = replay(&setup.config, &input);
    setup.publish(&input);
    let mut a = instance(&setup, "a", "a", "127.0.0.1:0", None);
    wait_for(
        "the first instance's output",
        Duration::from_secs(120),
        || (!read_committed(&setup.bootstrap, &setup.output_topics()).is_empty()).then_some(()),
    );
    // The next transaction commit is answered PRODUCER_FENCED, as Kafka
    // answers a zombie whose transactional.id a newer instance took over
    // (the mock itself gives every InitProducerId a new producer id, so it
    // cannot fence by transactional.id on its own).
    mock.request_errors(
        RDKafkaApiKey::EndTxn,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
    );
    let status = wait_for(
        "the fenced instance to stop",
        Duration::from_secs(120),
        || a.child.try_wait().unwrap(),
    );
    let log = a.log_text();
    assert_eq!(
        status.code(),
        Some(1),
        "exit status 1 on a fatal error\n{log}"
    );
    assert!(log.to_lowercase().contains("fenced"), "{log}");
    // Another instance restores the state from the changelog and carries
    // on to the end. The mock shows aborted transactions' records to
    // readers, so only "nothing missing" is checked here, not "nothing
    // extra".
    let _b = instance(&setup, "b", "b", "127.0.0.1:0", None);
    let want = multiset(&expected);
    wait_for("every expected event", Duration::from_secs(180), || {
        let got: Vec<serde_json::Value> = read_committed(&setup.bootstrap, &setup.output_topics())
            .into_iter()
            .map(|e| e.4)
            .collect();
        let have = multiset(&got);
        // `want` ⊆ `have` as multisets (both sorted)
        let mut h = have.iter().peekable();
        let covered = want.iter().all(|w| {
            while h.peek().is_some_and(|x| *x < w) {
                h.next();
            }
            h.next().is_some_and(|x| x == w)
        });
        covered.then_some(())
    });
}
