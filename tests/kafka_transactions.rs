//! `delivery = "exactly_once"` (Kafka transactions) end to end, against
//! librdkafka's mock cluster (`rdkafka::mocking`), which implements the
//! transactional protocol (InitProducerId with producer-epoch fencing,
//! AddPartitionsToTxn, TxnOffsetCommit, EndTxn) and consumer groups, and
//! whose errors a test can inject: a fenced producer here (the test broker's
//! fencing is partial, docs/testing.md). What the mock does not model, and
//! these tests therefore do not claim: it does not hide the records of open
//! or aborted transactions from `read_committed` readers (last stable offset
//! = high watermark, no aborted-transaction list, no markers written by
//! EndTxn), and it does not store offsets committed inside a transaction.
//! The transactional cycle on the real broker, with kill -9, is in
//! tests/kafka_service.rs; here: that the transactional cycle runs and
//! produces exactly the replay's events, and that an instance whose producer
//! is fenced stops with a clear message and exit status 1 instead of
//! committing.

mod kafka_support;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    assert_eq!(
        svc.metric(r#"jurystream_delivery_mode{mode="exactly_once"}"#),
        Some(1.0)
    );
    assert!(
        svc.terminate(Duration::from_secs(30)).success(),
        "{}",
        svc.log_text()
    );
}

/// The fenced cycle: the broker answers its commit (EndTxn) with
/// PRODUCER_FENCED. The instance must stop with status 1 and the fenced
/// cycle must end up in the output exactly once, with the rest of the
/// stream, after a new instance took over.
///
/// What the mock cannot show: on Kafka the fenced cycle's records belong to
/// a transaction the newer producer aborts, so a read_committed reader
/// never sees them and the new instance, restoring from the last committed
/// marker, produces that cycle again (same origin headers). The mock
/// answers every fetch with last stable offset = high watermark and no
/// aborted transactions, and its EndTxn writes no markers: the fenced
/// cycle's events, changelog records and marker are visible to every
/// reader as soon as they are produced, the new instance's restore
/// included. So "nothing of the fenced cycle is visible before the new
/// instance runs" cannot be checked here; what is checked is the strongest
/// thing the mock allows, from what the processes expose (exit status,
/// topics), never their logs:
/// - a stops with status 1 and says it was fenced, before the end of the
///   stream; the last cycle it wrote of each input partition (by origin
///   header: the fenced cycle where that transaction had events of the
///   partition) has events;
/// - in the end every origin of a's last cycles occurs exactly once, every
///   other origin once too (twice only as two copies of the same event: an
///   earlier cycle of a that was aborted and redone, e.g. after a session
///   restart on a loaded machine, is visible on the mock next to its redo),
///   and one event per origin equals the replay exactly: nothing missing,
///   nothing doubled.
#[test]
fn a_fenced_producer_stops_the_instance_without_committing() {
    let _g = serial();
    let (mock, setup) = mock_setup("fenced", 2);
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 20_000, 23);
    let expected = replay(&setup.config, &input);
    setup.publish(&input);
    // The third transaction commit (EndTxn) is answered PRODUCER_FENCED, as
    // Kafka answers a zombie whose transactional.id a newer instance took
    // over (the mock itself gives every InitProducerId a new producer id,
    // so it cannot fence by transactional.id on its own). The first two
    // pass: the start-up probe's and the first cycle's. Armed before a
    // starts: armed once a's output showed, the fence came too late on a
    // fast machine (a had finished the stream). Cycles end every 100 ms, so
    // a is fenced while most of the 20 000 votes are still to come, and
    // the fenced cycle closes batches (has events).
    mock.request_errors(
        RDKafkaApiKey::EndTxn,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED,
        ],
    );
    let mut a = instance(&setup, "a", "a", "127.0.0.1:0", None);
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

    let before_b = read_records(&setup.bootstrap, &setup.output_topics());
    // Distinct origins: the mock shows an aborted cycle next to its redo.
    let origins_before_b: HashSet<&str> = before_b
        .iter()
        .filter_map(|r| r.origin.as_deref())
        .collect();
    assert!(
        origins_before_b.len() < expected.len(),
        "a was fenced before the end of the stream: {} of {} events\n{log}",
        origins_before_b.len(),
        expected.len()
    );
    // The last cycle a wrote of each input partition, and its events.
    let mut last: HashMap<i32, u64> = HashMap::new();
    for r in &before_b {
        let (p, cycle) = r
            .cycle()
            .unwrap_or_else(|| panic!("no origin header on {r:?}"));
        let c = last.entry(p).or_insert(cycle);
        *c = (*c).max(cycle);
    }
    let fenced_origins: Vec<String> = before_b
        .iter()
        .filter(|r| r.cycle().is_some_and(|(p, c)| last.get(&p) == Some(&c)))
        .map(|r| r.origin.clone().unwrap())
        .collect();
    assert!(
        !fenced_origins.is_empty(),
        "a's last cycles {last:?} have events"
    );
    eprintln!("a's last cycles {last:?}: {} events", fenced_origins.len());

    // Another instance restores the state from the changelog and carries
    // on to the end: one event per origin, and those are the replay's.
    let b = instance(&setup, "b", "b", "127.0.0.1:0", None);
    let deadline = Instant::now() + Duration::from_secs(180);
    let after = loop {
        let records = read_records(&setup.bootstrap, &setup.output_topics());
        let origins: HashSet<&str> = records
            .iter()
            .map(|r| {
                r.origin
                    .as_deref()
                    .unwrap_or_else(|| panic!("no origin header on {r:?}"))
            })
            .collect();
        assert!(
            origins.len() <= expected.len(),
            "more events than the replay: {} > {}",
            origins.len(),
            expected.len()
        );
        if origins.len() == expected.len() {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {} events: {} read\n{}",
            expected.len(),
            origins.len(),
            log_tail(&b)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut by_origin: HashMap<&str, Vec<&Record>> = HashMap::new();
    for r in &after {
        by_origin
            .entry(r.origin.as_deref().unwrap())
            .or_default()
            .push(r);
    }
    for o in &fenced_origins {
        let n = by_origin.get(o.as_str()).map_or(0, Vec::len);
        assert_eq!(
            n, 1,
            "event {o} of the fenced cycle is in the output exactly once"
        );
    }
    let doubled: Vec<&Vec<&Record>> = by_origin.values().filter(|c| c.len() > 1).collect();
    for copies in &doubled {
        let first = normalize(&copies[0].value);
        assert!(
            copies.iter().all(|c| normalize(&c.value) == first),
            "copies of one origin differ: {copies:#?}"
        );
    }
    eprintln!(
        "{} origins of aborted and redone cycles seen twice",
        doubled.len()
    );
    let once: Vec<serde_json::Value> = by_origin.values().map(|c| c[0].value.clone()).collect();
    let diff = differences(&expected, &once);
    assert!(diff.is_empty(), "outputs differ from replay: {diff}");
}
