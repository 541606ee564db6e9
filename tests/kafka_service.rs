//! `jurystream run` against a real Kafka-protocol broker (tansu on loopback).
//! Skipped when tansu is not installed, unless JURYSTREAM_REQUIRE_BROKER=1
//! (then they fail; see docs/testing.md).

mod kafka_support;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kafka_support::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset};

/// One broker test at a time: they are heavy on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// `[state]` lines for the crash and scale-out tests: no cache
/// (`state.cache_mb = 0`), so every series and identity a vote needs after a
/// restore or a move comes from RocksDB (the other tests run the default).
const NO_CACHE: &str = "cache_mb = 0";

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn committed_offsets(setup: &Setup, group: &str) -> HashMap<i32, i64> {
    group_offsets(&setup.bootstrap, group, &setup.input_topic)
        .into_iter()
        .collect()
}

/// Input records `group` has committed, over every partition. The kill
/// points of the crash tests: cheap to read, so a kill lands close to its
/// point while the instance is consuming (reading the output to a count is
/// slower than the service, and let kills land after an instance had
/// finished the stream).
fn committed_input(setup: &Setup, group: &str) -> i64 {
    committed_offsets(setup, group)
        .values()
        .map(|o| (*o).max(0))
        .sum()
}

/// Waits until `group` has committed `at` input records, then kills `svc`
/// (kill -9) and starts a new instance `tag` in its place. Returns the
/// count committed at the kill.
fn kill_once_committed(setup: &Setup, group: &str, at: i64, svc: &mut Service, tag: &str) -> i64 {
    let at_kill = wait_for(
        &format!("{at} input records committed"),
        Duration::from_secs(300),
        || {
            let c = committed_input(setup, group);
            (c >= at).then_some(c)
        },
    );
    svc.kill9();
    *svc = Service::start(setup, tag);
    at_kill
}

/// Messages per input partition (last offset + 1), read to the end.
fn end_offsets(setup: &Setup) -> HashMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &setup.bootstrap)
        .set("group.id", "end-offsets-reader")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(&setup.input_topic), Duration::from_secs(10))
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    let n = md.topics()[0].partitions().len();
    for p in md.topics()[0].partitions() {
        tpl.add_partition_offset(&setup.input_topic, p.id(), Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut ends = HashMap::new();
    let mut eofs = 0;
    while eofs < n {
        match c.poll(Duration::from_secs(5)) {
            Some(Ok(m)) => {
                use rdkafka::Message;
                ends.insert(m.partition(), m.offset() + 1);
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => eofs += 1,
            Some(Err(e)) => panic!("{e}"),
            None => panic!("no EOF from the input topic"),
        }
    }
    ends
}

#[test]
fn same_events_as_replay_and_clean_sigterm() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "equiv", 3, "exactly_once_outbox", "");
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 3_000, 1);
    let expected = replay(&setup.config, &input);
    assert!(
        expected.len() > 300,
        "the stream should produce many events"
    );
    assert!(expected.iter().any(|e| e["type"] == "ambiguity_flagged"));
    assert!(expected.iter().any(|e| e["type"] == "vote_rejected"));
    setup.produce(&input);
    let mut svc = Service::start(&setup, "a");
    wait_for_events(&setup, &expected, Duration::from_secs(180), &svc);
    let status = svc.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        svc.log_text()
    );
    assert_same_events(&setup, &expected);
    // DLQ records name their source offset and keep the original key.
    let dlq: Vec<_> = read_committed(&setup.bootstrap, std::slice::from_ref(&setup.dlq));
    assert!(!dlq.is_empty());
    for (_, _, _, key, v) in &dlq {
        assert_eq!(v["source"]["topic"], setup.input_topic.as_str());
        assert!(v["source"]["offset"].as_i64().unwrap() >= 0);
        assert!(v["source"]["partition"].as_i64().unwrap() >= 0);
        // the generator's bad lines are cut JSON: no key could be derived
        assert_eq!(key, &None);
    }
    // SIGTERM: the committed offsets are the end of every input partition.
    assert_eq!(
        committed_offsets(&setup, "equiv-group"),
        end_offsets(&setup)
    );
}

/// `exactly_once`, after checking that the broker commits Kafka
/// transactions: a broker without them fails the test, naming the way out
/// (the tests never fall back to another delivery mode by themselves).
fn exactly_once_mode(setup_bootstrap: &str, probe: &str) -> &'static str {
    if let Err(why) = transactions_supported(setup_bootstrap, probe) {
        panic!(
            "the test broker cannot commit Kafka transactions ({why}); delivery = \"exactly_once\" \
             cannot be tested on it. Install the prebuilt tansu (scripts/broker.sh install; \
             scripts/broker.sh which names the binary in use; docs/testing.md)"
        );
    }
    "exactly_once"
}

/// The default mode, `exactly_once` (one Kafka transaction per cycle: the
/// events, the changelog records and the input offsets via
/// send_offsets_to_transaction), end to end on the real broker.
#[test]
fn exactly_once_with_transactions_equals_replay() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let mode = exactly_once_mode(&broker.bootstrap(), "eos-probe");
    let setup = Setup::new(&broker, "eos", 3, mode, "");
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 3_000, 7);
    let expected = replay(&setup.config, &input);
    assert!(expected.iter().any(|e| e["type"] == "ambiguity_flagged"));
    setup.produce(&input);
    let mut svc = Service::start(&setup, "a");
    wait_for_events(&setup, &expected, Duration::from_secs(180), &svc);
    assert_eq!(
        svc.metric(r#"jurystream_delivery_mode{mode="exactly_once"}"#),
        Some(1.0)
    );
    let status = svc.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        svc.log_text()
    );
    assert_same_events(&setup, &expected);
    // The input offsets were committed inside the transactions: the group
    // stands at the end of every input partition.
    assert_eq!(committed_offsets(&setup, "eos-group"), end_offsets(&setup));
}

#[test]
fn kill_9_at_many_points_loses_nothing_and_repeats_only_killed_cycles() {
    kill_9_at_many_points("exactly_once", false);
}

#[test]
fn kill_9_at_many_points_outbox_loses_and_doubles_nothing() {
    kill_9_at_many_points("exactly_once_outbox", false);
}

/// contract §14 `learned` mode: the open values, the batches waiting at the
/// barrier and the sealed sums survive kill -9 (the oracle is
/// `replay --partition-files`, the reputation topic's records identical
/// per key).
#[test]
fn kill_9_at_many_points_learned_loses_nothing_and_repeats_only_killed_cycles() {
    kill_9_at_many_points("exactly_once", true);
}

#[test]
fn kill_9_at_many_points_learned_outbox_loses_and_doubles_nothing() {
    kill_9_at_many_points("exactly_once_outbox", true);
}

/// Kills the service (kill -9) at 5 points of the stream in `mode`, one of
/// the two exactly-once modes.
///
/// `exactly_once_outbox`: the output must equal the replay. `exactly_once`:
/// every restart initialises the same transactional.id (the instance id is
/// kept in the state directory), which on Apache Kafka aborts the killed
/// instance's open transaction, so the output would equal the replay too.
/// The test broker (the prebuilt tansu) instead makes that transaction's
/// records visible to read_committed readers (measured, docs/testing.md),
/// and the restart redoes the cycle: the test asserts that nothing is lost
/// or foreign and that the only repeats are those redone cycles' events
/// ([`assert_copies_only_of_killed_cycles`]; none on Apache Kafka).
fn kill_9_at_many_points(mode: &str, learned_mode: bool) {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    if mode == "exactly_once" {
        exactly_once_mode(&broker.bootstrap(), "crash-probe");
    }
    let name = if learned_mode { "crashrep" } else { "crash" };
    let group = format!("{name}-group");
    let extra = if learned_mode {
        format!("{NO_CACHE}\n{}", learned(name))
    } else {
        NO_CACHE.to_owned()
    };
    let setup = Setup::new(&broker, name, 4, mode, &extra);
    let input = setup.dir.path().join("votes.jsonl");
    let (expected, produced) = if learned_mode {
        votes_over_epochs(&input, 20_000, 4);
        let produced = setup.produce(&input) as i64;
        (
            partition_oracle(&setup.config, &partition_files(&setup)),
            produced,
        )
    } else {
        generate_votes(&input, 50_000, 7);
        let expected = replay(&setup.config, &input);
        (expected, setup.produce(&input) as i64)
    };
    let mut svc = Service::start(&setup, "0");
    // Kill at 5 points of the stream; the 100 ms commit cycle means most
    // kills land inside an open cycle, and each kill waits until the
    // current instance has committed input of its own.
    let mut since = 0;
    // Per restart (outbox mode): the cycles in doubt it completed and the
    // events of them it published again (its metrics).
    let mut restarts: Vec<(f64, f64)> = Vec::new();
    for (i, pct) in [5i64, 25, 45, 65, 85].into_iter().enumerate() {
        let at = (produced * pct / 100).max(since + 1).min(produced);
        let at_kill = kill_once_committed(&setup, &group, at, &mut svc, &(i + 1).to_string());
        if mode == "exactly_once_outbox" {
            // Killed while input was left, the instance was mid-stream: each
            // partition whose last cycle had events is restored in doubt
            // (not marked delivered), and the restart checks those events
            // against the output topics and publishes the missing ones
            // before the partition is ready. (An instance killed before any
            // batch closed has emitted nothing: nothing is in doubt.)
            wait_for(
                &format!("restart {} ready, killed at {at_kill} of {produced}", i + 1),
                Duration::from_secs(120),
                || (svc.is_ready() && !svc.ready_partitions().is_empty()).then_some(()),
            );
            restarts.push((
                svc.metric("jurystream_outbox_recovered_cycles_total")
                    .unwrap_or(0.0),
                svc.metric("jurystream_outbox_republished_events_total")
                    .unwrap_or(0.0),
            ));
        }
        since = committed_input(&setup, &group);
    }
    if mode == "exactly_once" {
        wait_for_every_event(&setup, &expected, Duration::from_secs(300), &svc);
        let status = svc.terminate(Duration::from_secs(30));
        assert!(status.success(), "{}", svc.log_text());
        assert_copies_only_of_killed_cycles(&setup, &expected, 5);
        if learned_mode {
            // The test broker makes a killed cycle's records visible, and
            // its redo may seal other epochs (as it may close other
            // batches): only the seal records are checked here.
            assert_one_value_per_key(&setup.bootstrap, &format!("{name}-reputation"), false);
        }
        return;
    }
    wait_for_events(&setup, &expected, Duration::from_secs(300), &svc);
    let status = svc.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", svc.log_text());
    assert_same_events(&setup, &expected);
    if learned_mode {
        assert_one_value_per_key(&setup.bootstrap, &format!("{name}-reputation"), true);
    }
    if mode == "exactly_once_outbox" {
        // A restart is ready only once it completed every cycle in doubt it
        // restored; the kills mid-stream leave some.
        eprintln!("(cycles completed, events published again) per restart: {restarts:?}");
        assert!(
            restarts.iter().any(|(cycles, _)| *cycles >= 1.0),
            "no restart completed a killed instance's last cycle: {restarts:?}"
        );
        assert_every_event_has_a_unique_origin(&setup);
    }
}

/// `exactly_once` commits a cycle's transaction off the poll loop while the
/// next cycle is read and processed (`cycle::overlap`). Killed at the two
/// instants that opens, each while the next cycle has processed votes:
/// `before` the commit is asked for (the transaction still open: the
/// restart aborts it and redoes the cycle), and `after` it answered but
/// before the poll loop took the answer (committed, its RocksDB write not
/// started: the restart restores it from the changelog). Nothing is lost;
/// `after` leaves nothing to repeat, so the output is exactly the replay's.
#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs a build with the test-hooks feature (scripts/test.sh)"
)]
fn kill_9_while_a_commit_is_in_flight_before_its_answer() {
    kill_9_while_a_commit_is_in_flight("before");
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs a build with the test-hooks feature (scripts/test.sh)"
)]
fn kill_9_while_a_commit_is_in_flight_after_its_answer() {
    kill_9_while_a_commit_is_in_flight("after");
}

fn kill_9_while_a_commit_is_in_flight(at: &str) {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    exactly_once_mode(&broker.bootstrap(), &format!("inflight-{at}-probe"));
    let name = format!("inflight{at}");
    let setup = Setup::new(&broker, &name, 4, "exactly_once", NO_CACHE);
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 20_000, 11);
    let expected = replay(&setup.config, &input);
    setup.produce(&input);
    let listen = format!("127.0.0.1:{}", free_port());
    let hold = format!("{at}:3000");
    let mut svc = Service::start_with(
        &setup.config,
        setup.dir.path(),
        "held",
        &[
            ("JURYSTREAM_METRICS__LISTEN", listen.as_str()),
            ("JURYSTREAM_TEST_HOLD_COMMIT", hold.as_str()),
        ],
    );
    let in_flight = "jurystream_commit_in_flight";
    let commits = "jurystream_commit_duration_seconds_count";
    let accepted = "jurystream_votes_accepted_total{source=\"kafka\"}";
    // A commit in flight (the count of commits landed tells it apart from
    // the next one), and votes the next cycle accepted since it began.
    let (landed, before) = wait_for("a commit in flight", Duration::from_secs(120), || {
        (svc.metric(in_flight)? == 1.0).then_some(())?;
        Some((svc.metric(commits)?, svc.metric(accepted)?))
    });
    let processed = wait_for(
        "votes accepted while that commit is in flight",
        Duration::from_secs(60),
        || {
            let now = svc.metric(accepted)?;
            (now > before).then_some(now)
        },
    );
    assert_eq!(svc.metric(in_flight), Some(1.0), "{}", svc.log_text());
    assert_eq!(
        svc.metric(commits),
        Some(landed),
        "the same commit is in flight"
    );
    svc.kill9();
    eprintln!(
        "killed {at} a commit's answer, {} votes into the next cycle",
        processed - before
    );
    let mut svc = Service::start(&setup, "restarted");
    if at == "after" {
        wait_for_events(&setup, &expected, Duration::from_secs(300), &svc);
        let status = svc.terminate(Duration::from_secs(30));
        assert!(status.success(), "{}", svc.log_text());
        assert_same_events(&setup, &expected);
    } else {
        wait_for_every_event(&setup, &expected, Duration::from_secs(300), &svc);
        let status = svc.terminate(Duration::from_secs(30));
        assert!(status.success(), "{}", svc.log_text());
        assert_copies_only_of_killed_cycles(&setup, &expected, 1);
    }
}

/// `at_least_once`, killed at several points (with the 100 ms cycle most
/// kills land inside a cycle), loses no event: after the restarts the
/// output holds every event of the replay, and nothing else (the events a
/// redone cycle sends again are copies of the replay's).
#[test]
fn kill_9_at_least_once_loses_nothing_and_repeats_only_copies() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "alo", 4, "at_least_once", NO_CACHE);
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 40_000, 13);
    let expected = replay(&setup.config, &input);
    let produced = setup.produce(&input) as i64;
    let mut svc = Service::start(&setup, "0");
    let mut since = 0;
    for (i, pct) in [10i64, 40, 70].into_iter().enumerate() {
        let at = (produced * pct / 100).max(since + 1).min(produced);
        kill_once_committed(&setup, "alo-group", at, &mut svc, &(i + 1).to_string());
        since = committed_input(&setup, "alo-group");
    }
    let repeated = wait_for_every_event(&setup, &expected, Duration::from_secs(300), &svc);
    eprintln!(
        "{repeated} events repeated by redone cycles ({} expected)",
        expected.len()
    );
    let status = svc.terminate(Duration::from_secs(30));
    assert!(status.success(), "{}", svc.log_text());
}

/// Every output event carries a `jurystream-origin` header, and no two
/// share one.
fn assert_every_event_has_a_unique_origin(setup: &Setup) {
    let records = read_records(&setup.bootstrap, &setup.output_topics());
    let total = records.len();
    let origins: Vec<String> = records.into_iter().filter_map(|r| r.origin).collect();
    assert_eq!(origins.len(), total, "one origin header per event");
    let mut sorted = origins.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), origins.len(), "origin headers are unique");
    let pattern = format!("{}/", setup.input_topic);
    assert!(
        origins.iter().all(|o| o.starts_with(&pattern)),
        "{:?}",
        &origins[..3.min(origins.len())]
    );
}

/// Three instances share a 6-partition topic; b is killed with SIGKILL
/// mid-stream (after part of the input was committed) and the others take
/// its partitions over: they restore b's state from the changelog and redo
/// b's interrupted cycle (`exactly_once`: its open transaction is never
/// committed) or finish it from the outbox (`exactly_once_outbox`). The
/// merged output must equal one replay of the whole input: nothing lost,
/// nothing doubled.
///
/// tansu 0.6.0's coordinator does not always hand an expired member's
/// partitions to the survivors; when it has not after 45 s, a fourth member
/// joins, which makes it rebalance (with Apache Kafka the survivors get them
/// once b's session times out).
/// On Apache Kafka b's open transaction is aborted after
/// `transaction.timeout.ms`; the test broker never aborts it (measured,
/// docs/testing.md), so `read_committed` readers of the partitions it wrote
/// (the survivors restoring b's changelog among them) wait forever whenever
/// the kill lands in a cycle that had sent records: ignored until the test
/// broker aborts abandoned transactions (`cargo test -- --ignored` runs it).
#[test]
#[ignore = "the test broker never aborts a killed instance's open transaction (docs/testing.md)"]
fn kill_9_one_of_three_instances_the_others_take_over_exactly() {
    kill_9_one_of_three("exactly_once", false, false);
}

/// [`kill_9_one_of_three_instances_the_others_take_over_exactly`] with b's
/// open transaction ended at the kill, as b's restart would end it: the
/// test initialises b's transactional id right after the kill. Apache
/// Kafka aborts the transaction then, and the output equals the replay;
/// the test broker makes its records visible instead (docs/testing.md),
/// so the events of b's open cycle, redone by its new owner, may repeat:
/// asserted as in `kill_9_at_many_points` (nothing lost or foreign, the
/// only repeats one cycle per partition of b's).
#[test]
fn kill_9_one_of_three_instances_exactly_once_the_others_take_over_once_the_transaction_ends() {
    kill_9_one_of_three("exactly_once", true, false);
}

#[test]
fn kill_9_one_of_three_instances_outbox_the_others_take_over_exactly() {
    kill_9_one_of_three("exactly_once_outbox", false, false);
}

/// contract §14 `learned` mode, three instances, one killed: the survivors
/// restore its open values and waiting batches and take over its seals
/// (the oracle is `replay --partition-files`).
#[test]
fn kill_9_one_of_three_instances_learned_outbox_the_others_take_over_exactly() {
    kill_9_one_of_three("exactly_once_outbox", false, true);
}

/// Watches the output topics (as a `read_committed` reader, from each
/// output partition's end when it starts) for the first event produced
/// after `killed_at` (its timestamp, the producer's clock: the killed
/// instance produces nothing after it) whose origin is one of the input
/// partitions `parts`. Returns the time from `killed_at` to reading that
/// event, or None when none is read within `deadline`: the failover of
/// `parts`, as a downstream consumer sees it.
fn watch_first_event(
    bootstrap: &str,
    topics: Vec<String>,
    parts: Vec<i32>,
    killed_at: Instant,
    deadline: Duration,
) -> std::thread::JoinHandle<Option<Duration>> {
    let bootstrap = bootstrap.to_owned();
    std::thread::spawn(move || {
        let killed_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .saturating_sub(killed_at.elapsed())
            .as_millis() as i64;
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", "failover-watch")
            .set("isolation.level", "read_committed")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for t in &topics {
            for (p, high) in high_watermarks_of(&bootstrap, t) {
                let from = Offset::Offset((high - 1).max(0));
                tpl.add_partition_offset(t, p, from).unwrap();
            }
        }
        c.assign(&tpl).unwrap();
        while killed_at.elapsed() < deadline {
            use rdkafka::message::Headers;
            use rdkafka::Message;
            let Some(Ok(m)) = c.poll(Duration::from_millis(100)) else {
                continue;
            };
            if m.timestamp().to_millis().is_none_or(|t| t < killed_ms) {
                continue;
            }
            let origin_partition = m.headers().and_then(|h| {
                let o = h.iter().find(|x| x.key == "jurystream-origin")?;
                let o = std::str::from_utf8(o.value?).ok()?;
                o.rsplit('/').nth(2)?.parse::<i32>().ok()
            });
            if origin_partition.is_some_and(|p| parts.contains(&p)) {
                return Some(killed_at.elapsed());
            }
        }
        None
    })
}

/// `end_transaction`: initialise b's transactional id right after the kill
/// (`exactly_once` only).
fn kill_9_one_of_three(mode: &str, end_transaction: bool, learned_mode: bool) {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    if mode == "exactly_once" {
        exactly_once_mode(&broker.bootstrap(), "kill3-probe");
    }
    // max.poll.interval above a rebalance with restores, so no member
    // leaves the group on its own while it is forming (see below).
    let name = if learned_mode { "kill3rep" } else { "kill3" };
    let group = format!("{name}-group");
    let extra = if learned_mode {
        format!("{NO_CACHE}\n{}", learned(name))
    } else {
        NO_CACHE.to_owned()
    };
    let setup = Setup::at(&broker.bootstrap(), name, 6, mode, &extra, 20_000);
    let input = setup.dir.path().join("votes.jsonl");
    let mut expected = Vec::new();
    if learned_mode {
        // Computed once every vote is in the input topic (below).
        votes_over_epochs(&input, 40_000, 6);
    } else {
        generate_votes(&input, 100_000, 11);
        expected = replay(&setup.config, &input);
    }
    let n = std::fs::read_to_string(&input).unwrap().lines().count();
    let first = setup.dir.path().join("first.jsonl");
    let second = setup.dir.path().join("second.jsonl");
    let third = setup.dir.path().join("third.jsonl");
    slice_file(&input, &first, 0, n / 2);
    slice_file(&input, &second, n / 2, n * 17 / 20);
    slice_file(&input, &third, n * 17 / 20, n);
    // no idle flush while instances come and go
    let start = |tag: &str| instance(&setup, tag, tag, "127.0.0.1:0", Some("3600"));
    let mut produced = setup.produce(&first) as i64;
    let a = start("a");
    let mut b = start("b");
    let c = start("c");
    // All three own partitions before the kill.
    wait_for(
        "three instances with partitions",
        Duration::from_secs(180),
        || {
            [&a, &b, &c]
                .iter()
                .all(|s| !s.ready_partitions().is_empty())
                .then_some(())
        },
    );
    produced += setup.publish(&second) as i64;
    // Kill b mid-stream: some input committed, not all.
    wait_for("b to be mid-stream", Duration::from_secs(300), || {
        let done = committed_offsets(&setup, &group).values().sum::<i64>();
        (done > produced / 2 + produced / 10).then_some(())
    });
    // What b holds (its metrics) just before the kill.
    let b_parts: Vec<i32> = b.ready_partitions().into_iter().collect();
    b.kill9();
    let killed_at = std::time::Instant::now();
    assert!(!b_parts.is_empty(), "b owned partitions when it was killed");
    if end_transaction {
        // What b's restart would do first (its id: group id, instance id).
        let p: rdkafka::producer::BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &setup.bootstrap)
            .set("transactional.id", format!("{group}-b"))
            .create()
            .unwrap();
        use rdkafka::producer::Producer;
        p.init_transactions(Duration::from_secs(30)).unwrap();
        eprintln!(
            "b's transactional id initialised {:.2} s after the kill",
            killed_at.elapsed().as_secs_f64()
        );
    }
    // Failover: from the kill to the next committed event of b's
    // partitions, with input for them published after the kill.
    let after_kill = {
        let (bootstrap, topic) = (setup.bootstrap.clone(), setup.input_topic.clone());
        let one_per_batch = [("batch.num.messages".to_owned(), "1".to_owned())];
        std::thread::spawn(move || {
            jurystream::produce::produce(&third, &topic, &bootstrap, &one_per_batch).unwrap()
        })
    };
    let first_event = watch_first_event(
        &setup.bootstrap,
        setup.output_topics(),
        b_parts.clone(),
        killed_at,
        Duration::from_secs(300),
    );
    // The survivors take b's partitions over once its session times out
    // (6 s here). tansu 0.6.0's coordinator drops an expired member without
    // telling the others to rejoin (it returns no error to their
    // heartbeats), so nothing moves until another member joins: start a
    // fourth one then.
    // Ready partitions of b's that a survivor holds (its metrics).
    let taken = |s: &Service| {
        s.ready_partitions()
            .iter()
            .filter(|p| b_parts.contains(p))
            .count()
    };
    let before = taken(&a) + taken(&c);
    // Outbox cycles the survivors had completed before the kill (metrics).
    let recovered = |s: &Service| {
        s.metric("jurystream_outbox_recovered_cycles_total")
            .unwrap_or(0.0)
    };
    let recovered_before = recovered(&a) + recovered(&c);
    let mut members = vec![a, c];
    while taken(&members[0]) + taken(&members[1]) == before {
        if killed_at.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "survivors did not get b's partitions from the broker: starting a fourth member"
            );
            members.push(start("d"));
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // When every partition of b's is ready on a member again (metrics).
    wait_for(
        "b's partitions taken over",
        Duration::from_secs(300),
        || {
            let held: usize = members.iter().map(taken).sum();
            (held == b_parts.len()).then_some(())
        },
    );
    let ready_after = killed_at.elapsed();
    produced += after_kill.join().unwrap() as i64;
    wait_committed(
        &setup,
        &group,
        produced,
        "the survivors to commit everything",
    );
    let first_after = first_event.join().unwrap();
    eprintln!(
        "failover ({mode}): b's partitions {b_parts:?} ready on the others {:.1} s after the \
         kill, their first committed event {} after it",
        ready_after.as_secs_f64(),
        first_after.map_or("not read within 300 s".to_owned(), |d| format!(
            "{:.1} s",
            d.as_secs_f64()
        ))
    );
    assert!(
        first_after.is_some(),
        "no committed event of b's partitions after the kill"
    );
    // Evidence, not asserted: whether a takeover completed an interrupted
    // cycle of b's. In runs on tansu b's partitions were sometimes
    // mid-stream at the kill (restored position below the end) and still
    // had no undelivered last cycle (a last cycle without events, or
    // sealed by a rebalance b began before the kill); the exactness below
    // is the assertion. kill_9_at_many_points_loses_nothing_and_repeats_only_killed_cycles
    // asserts the completion of interrupted cycles.
    if mode == "exactly_once_outbox" {
        let after: f64 = members.iter().map(recovered).sum();
        eprintln!(
            "cycles in doubt the takeover completed: {} (b's partitions {b_parts:?})",
            after - recovered_before
        );
    }
    if learned_mode {
        expected = partition_oracle(&setup.config, &partition_files(&setup));
    }
    stop_one_at_a_time(members, 6);
    // Close the remaining windows with an idle flush, as one run would at its end.
    let d = instance_owning_every_partition(&setup, 6);
    if end_transaction {
        wait_for_every_event(&setup, &expected, Duration::from_secs(300), &d);
        assert_copies_only_of_killed_cycles(&setup, &expected, 1);
        return;
    }
    wait_for_events(&setup, &expected, Duration::from_secs(300), &d);
    assert_same_events(&setup, &expected);
    if mode == "exactly_once_outbox" {
        assert_every_event_has_a_unique_origin(&setup);
    }
}

#[test]
fn broker_restart_mid_stream_is_ridden_out() {
    let _g = serial();
    let Some(mut broker) = broker_or_skip(Some("s3")) else {
        return;
    };
    // A cycle waits for the broker while it restarts: allow that much time
    // between polls, or the member leaves the group (and tansu 0.6.0 does
    // not always give its partitions back to the member when it rejoins).
    let setup = Setup::at(
        &broker.bootstrap(),
        "brestart",
        2,
        "exactly_once_outbox",
        "",
        20_000,
    );
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 10_000, 3);
    let expected = replay(&setup.config, &input);
    // S3 storage takes ~13 ms a request: one record per batch would take
    // minutes (and the prebuilt tansu needs it not; see produce_batched).
    setup.produce_batched(&input);
    let svc = Service::start(&setup, "a");
    let third = expected.len() / 3;
    wait_for("a third of the output", Duration::from_secs(300), || {
        (read_committed(&setup.bootstrap, &setup.output_topics()).len() >= third).then_some(())
    });
    broker.restart();
    wait_for_events(&setup, &expected, Duration::from_secs(300), &svc);
    assert_same_events(&setup, &expected);
}

#[test]
fn every_bad_input_class_lands_in_the_dlq_with_its_offset() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(
        &broker,
        "dlq",
        1,
        "at_least_once",
        "[input]\nmax_message_bytes = 4096\n",
    );
    let input = setup.dir.path().join("bad.jsonl");
    let ok = |ts: &str, id: &str| {
        format!(
            r#"{{"inference_id":"i1","voter_id":"{id}","voter_prompt_id":"r","vote":1,"timestamp":"{ts}"}}"#
        )
    };
    let lines = vec![
        ("malformed_json", "{not json".to_owned()),
        ("missing_field", r#"{"inference_id":"i1","voter_prompt_id":"r","vote":1,"timestamp":"2024-07-07T00:00:00Z"}"#.to_owned()),
        ("invalid_field", r#"{"inference_id":"i1","voter_id":"a","voter_prompt_id":"r","vote":2,"timestamp":"2024-07-07T00:00:00Z"}"#.to_owned()),
        ("invalid_timestamp", r#"{"inference_id":"i1","voter_id":"a","voter_prompt_id":"r","vote":1,"timestamp":"yesterday"}"#.to_owned()),
        ("invalid_timestamp", r#"{"inference_id":"i1","voter_id":"a","voter_prompt_id":"r","vote":1,"timestamp":"2999-01-01T00:00:00Z"}"#.to_owned()),
        ("too_large", format!(r#"{{"inference_id":"i1","pad":"{}"}}"#, "x".repeat(5000))),
        ("", ok("2024-07-07T00:10:00Z", "a")),
        ("late", ok("2024-07-07T00:00:00Z", "b")),
    ];
    let mut text = String::new();
    for (_, l) in &lines {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(&input, text).unwrap();
    setup.produce(&input);
    let svc = Service::start(&setup, "a");
    let n_bad = lines.iter().filter(|(r, _)| !r.is_empty()).count();
    let dlq = wait_for("every rejection", Duration::from_secs(120), || {
        let d = read_committed(&setup.bootstrap, std::slice::from_ref(&setup.dlq));
        (d.len() >= n_bad).then_some(d)
    });
    assert_eq!(dlq.len(), n_bad, "{}", svc.log_text());
    for (_, _, _, _, v) in &dlq {
        let offset = v["source"]["offset"].as_u64().unwrap() as usize;
        let (reason, line) = &lines[offset];
        assert_eq!(v["reason"], *reason, "offset {offset}: {v}");
        assert_eq!(v["source"]["topic"], setup.input_topic.as_str());
        assert_eq!(v["source"]["partition"], 0);
        assert_eq!(v["payload"].as_str().unwrap(), line.as_str());
        assert!(!v["detail"].as_str().unwrap().is_empty());
    }
}

#[test]
fn new_instance_with_empty_state_continues_from_the_changelog() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "takeover", 2, "exactly_once_outbox", "");
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 4_000, 11);
    let expected = replay(&setup.config, &input);
    let text = std::fs::read_to_string(&input).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (first, second) = lines.split_at(lines.len() / 2);
    let part1 = setup.dir.path().join("part1.jsonl");
    let part2 = setup.dir.path().join("part2.jsonl");
    std::fs::write(&part1, first.join("\n") + "\n").unwrap();
    std::fs::write(&part2, second.join("\n") + "\n").unwrap();
    let base = std::fs::read_to_string(&setup.config).unwrap();
    let state_a = setup.dir.path().join("state-a");
    let state_b = setup.dir.path().join("state-b");
    let state_line = format!("dir = \"{}\"", setup.dir.path().join("state").display());
    // Instance A: no idle flush, so its windows stay open for B.
    let cfg_a = setup.dir.path().join("a.toml");
    std::fs::write(
        &cfg_a,
        base.replace("idle_flush_seconds = 2", "idle_flush_seconds = 3600")
            .replace(&state_line, &format!("dir = \"{}\"", state_a.display())),
    )
    .unwrap();
    let cfg_b = setup.dir.path().join("b.toml");
    std::fs::write(
        &cfg_b,
        base.replace(&state_line, &format!("dir = \"{}\"", state_b.display())),
    )
    .unwrap();
    let n1 = setup.produce(&part1) as i64;
    let mut a = Service::start_with(
        &cfg_a,
        setup.dir.path(),
        "a",
        &[
            ("JURYSTREAM_INSTANCE_ID", "a"),
            ("JURYSTREAM_METRICS__LISTEN", "127.0.0.1:0"),
        ],
    );
    wait_for(
        "instance A to commit the first half",
        Duration::from_secs(120),
        || {
            (committed_offsets(&setup, "takeover-group")
                .values()
                .sum::<i64>()
                == n1)
                .then_some(())
        },
    );
    assert!(
        a.terminate(Duration::from_secs(30)).success(),
        "{}",
        a.log_text()
    );
    // Instance B: empty state directory, same group; the changelog carries the state.
    assert!(!state_b.exists());
    setup.publish(&part2);
    let listen = format!("127.0.0.1:{}", free_port());
    let b = Service::start_with(
        &cfg_b,
        setup.dir.path(),
        "b",
        &[
            ("JURYSTREAM_INSTANCE_ID", "b"),
            ("JURYSTREAM_METRICS__LISTEN", listen.as_str()),
        ],
    );
    wait_for_events(&setup, &expected, Duration::from_secs(180), &b);
    // B rebuilt its state from changelog records, not from a local copy.
    let restored = b
        .metric("jurystream_state_restored_records_total")
        .unwrap_or(0.0);
    assert!(restored > 0.0, "{}", b.log_text());
    assert_same_events(&setup, &expected);
}

/// Stops `members` gracefully, one at a time, each only after the group has
/// settled again (the remaining members own all `partitions`).
///
/// tansu 0.6.0's coordinator loses a group for good when its chosen leader
/// leaves while the group is still forming (the leader stays recorded, so
/// no one can complete the assignment); Apache Kafka does not need this.
fn stop_one_at_a_time(mut members: Vec<Service>, partitions: usize) {
    while let Some(mut m) = members.pop() {
        let all: Vec<&Service> = members.iter().chain(std::iter::once(&m)).collect();
        wait_settled(&all, partitions);
        assert!(
            m.terminate(Duration::from_secs(60)).success(),
            "{}",
            m.log_text()
        );
    }
}

/// Waits until `members` together own all `partitions` with their state
/// restored (no rebalance in progress).
fn wait_settled(members: &[&Service], partitions: usize) {
    wait_for("the group to settle", Duration::from_secs(120), || {
        // Every partition held ready by one of them (their metrics).
        let owned: usize = members.iter().map(|s| s.ready_partitions().len()).sum();
        (owned == partitions).then_some(())
    });
}

/// One instance (idle flush on, state dir of "a") that owns all `partitions`
/// of the group, to close the last windows at the end of a test.
fn instance_owning_every_partition(setup: &Setup, partitions: usize) -> Service {
    let svc = instance(setup, "final", "a", "127.0.0.1:0", None);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while svc.ready_partitions().len() != partitions {
        assert!(
            std::time::Instant::now() < deadline,
            "the final instance was not assigned all {partitions} partitions:\n{}",
            svc.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    svc
}

/// Waits until `group` has committed `n` input records in total.
fn wait_committed(setup: &Setup, group: &str, n: i64, what: &str) {
    wait_for(what, Duration::from_secs(300), || {
        (committed_offsets(setup, group).values().sum::<i64>() == n).then_some(())
    });
}

/// Lines `from..to` of `input` into a new file.
fn slice_file(input: &std::path::Path, out: &std::path::Path, from: usize, to: usize) {
    let text = std::fs::read_to_string(input).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let to = to.min(lines.len());
    std::fs::write(out, lines[from..to].join("\n") + "\n").unwrap();
}

/// `votes` generated votes (`seed`): all but the last 2 000 committed by
/// an instance A of group `{name}-group` that then stops, so its
/// changelog holds the history; the last 2 000 published for whoever
/// comes next. Returns the replay of all of them.
fn history_then_tail(setup: &Setup, votes: usize, seed: u64, name: &str) -> Vec<serde_json::Value> {
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, votes, seed);
    let expected = replay(&setup.config, &input);
    let n = std::fs::read_to_string(&input).unwrap().lines().count();
    let first = setup.dir.path().join("first.jsonl");
    let second = setup.dir.path().join("second.jsonl");
    slice_file(&input, &first, 0, n - 2_000);
    slice_file(&input, &second, n - 2_000, n);
    let produced = setup.produce(&first) as i64;
    let mut a = instance(setup, "a", "a", "127.0.0.1:0", Some("3600"));
    wait_committed(
        setup,
        &format!("{name}-group"),
        produced,
        "instance A to commit the history",
    );
    assert!(
        a.terminate(Duration::from_secs(60)).success(),
        "{}",
        a.log_text()
    );
    setup.publish(&second);
    expected
}

#[test]
fn scale_out_1_3_1_while_votes_flow_equals_one_instance() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "scale", 6, "exactly_once_outbox", NO_CACHE);
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 100_000, 5);
    let expected = replay(&setup.config, &input);
    let n = std::fs::read_to_string(&input).unwrap().lines().count();
    let chunks: Vec<std::path::PathBuf> = (0..3)
        .map(|i| {
            let p = setup.dir.path().join(format!("chunk{i}.jsonl"));
            slice_file(&input, &p, i * n / 3, (i + 1) * n / 3);
            p
        })
        .collect();
    // no idle flush while instances come and go
    let start = |tag: &str| instance(&setup, tag, tag, "127.0.0.1:0", Some("3600"));
    let mut produced = setup.produce(&chunks[0]) as i64;
    let mut a = start("a");
    wait_committed(&setup, "scale-group", produced, "a third committed");
    let mut b = start("b");
    let mut c = start("c");
    produced += setup.publish(&chunks[1]) as i64;
    wait_committed(
        &setup,
        "scale-group",
        produced,
        "two thirds committed by three instances",
    );
    // One at a time, each after the group settled (see stop_one_at_a_time).
    wait_settled(&[&a, &b, &c], 6);
    assert!(
        b.terminate(Duration::from_secs(60)).success(),
        "{}",
        b.log_text()
    );
    wait_settled(&[&a, &c], 6);
    assert!(
        c.terminate(Duration::from_secs(60)).success(),
        "{}",
        c.log_text()
    );
    produced += setup.publish(&chunks[2]) as i64;
    wait_committed(
        &setup,
        "scale-group",
        produced,
        "everything committed by one instance",
    );
    assert!(
        a.terminate(Duration::from_secs(60)).success(),
        "{}",
        a.log_text()
    );
    // Close the remaining windows with an idle flush, as one run would at its end.
    let d = instance_owning_every_partition(&setup, 6);
    wait_for_events(&setup, &expected, Duration::from_secs(300), &d);
    assert_same_events(&setup, &expected);
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text))
}

/// Polls `/readyz` until it answers 200; returns the distinct statuses seen,
/// in order.
fn wait_ready(port: u16, deadline: Duration) -> Vec<u16> {
    let mut seen = Vec::new();
    wait_for("/readyz to turn 200", deadline, || {
        let code = http_get(port, "/readyz").map(|r| r.0);
        if let Some(c) = code {
            if seen.last() != Some(&c) {
                seen.push(c);
            }
        }
        (code == Some(200)).then_some(())
    });
    seen
}

#[test]
fn readyz_is_503_until_the_assigned_state_is_restored() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "ready", 2, "exactly_once_outbox", "");
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 20_000, 13);
    let produced = setup.produce(&input) as i64;
    let mut a = instance(&setup, "a", "a", "127.0.0.1:0", Some("3600"));
    wait_committed(
        &setup,
        "ready-group",
        produced,
        "instance A to commit everything",
    );
    assert!(
        a.terminate(Duration::from_secs(30)).success(),
        "{}",
        a.log_text()
    );
    // B starts with an empty state directory: it must rebuild from the changelog.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let b = instance(&setup, "b", "b", &listen, Some("3600"));
    let seen = wait_ready(port, Duration::from_secs(120));
    assert_eq!(seen.first(), Some(&503), "statuses seen: {seen:?}");
    assert_eq!(seen.last(), Some(&200));
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    // Ready means restored: the restore is measured already.
    let restored = b.metric("jurystream_state_restored_records_total");
    assert!(restored > Some(0.0), "{}", b.log_text());
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    let count: f64 = metrics
        .lines()
        .find(|l| l.starts_with("jurystream_state_restore_duration_seconds_count"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(count >= 1.0, "{metrics}");
}

#[test]
fn a_restore_longer_than_max_poll_interval_keeps_the_member_in_the_group() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    // B runs with max.poll.interval.ms = session.timeout.ms = 2 s; the
    // changelog below takes longer to restore on an empty disk (asserted,
    // so the test proves its point: ~6 s on the project's machine).
    let max_poll_ms = 2_000u64;
    let setup = Setup::new(&broker, "longrestore", 1, "exactly_once_outbox", NO_CACHE);
    let expected = history_then_tail(&setup, 100_000, 17, "longrestore");
    // The rest of the stream waits for B (processed once B is restored).
    // B: empty disk, so the whole changelog is read and applied.
    let cfg_b = setup.dir.path().join("b.toml");
    let text = std::fs::read_to_string(&setup.config)
        .unwrap()
        .replace(
            r#""session.timeout.ms" = "6000""#,
            r#""session.timeout.ms" = "2000""#,
        )
        .replace(
            r#""max.poll.interval.ms" = "6000""#,
            r#""max.poll.interval.ms" = "2000""#,
        );
    assert!(text.contains(r#""max.poll.interval.ms" = "2000""#));
    std::fs::write(&cfg_b, text).unwrap();
    let port = free_port();
    let state_b = setup.dir.path().join("state-b").display().to_string();
    let listen = format!("127.0.0.1:{port}");
    let b = Service::start_with(
        &cfg_b,
        setup.dir.path(),
        "b",
        &[
            ("JURYSTREAM_INSTANCE_ID", "b"),
            ("JURYSTREAM_STATE__DIR", state_b.as_str()),
            ("JURYSTREAM_METRICS__LISTEN", listen.as_str()),
        ],
    );
    let seen = wait_ready(port, Duration::from_secs(600));
    assert_eq!(seen.first(), Some(&503), "statuses seen: {seen:?}");
    // The restore's time, from the metric (one restore of the partitions B
    // was given: the sum over them is its duration).
    let took_s = b
        .metric("jurystream_state_restore_duration_seconds_sum")
        .expect("restore measured");
    let took = (took_s * 1000.0) as u64;
    eprintln!("restore took {took} ms");
    assert!(
        took > max_poll_ms,
        "the restore took {took} ms, not longer than max.poll.interval.ms ({max_poll_ms}): \
         make the history larger\n{}",
        b.log_text()
    );
    assert!(
        b.metric("jurystream_state_restored_records_total")
            .unwrap_or(0.0)
            > 0.0
    );
    // B processed the rest, exactly.
    wait_for_events(&setup, &expected, Duration::from_secs(300), &b);
    assert_same_events(&setup, &expected);
    // Never expelled (a poll-interval violation would revoke or lose the
    // partitions): one assignment, no revoke, no lost partitions.
    for (event, want) in [("assigned", 1.0), ("revoked", 0.0), ("lost", 0.0)] {
        let series = format!("jurystream_rebalances_total{{event=\"{event}\"}}");
        assert_eq!(b.metric(&series), Some(want), "{series}\n{}", b.log_text());
    }
}

#[test]
fn rebalance_storm_exactly_once_equals_replay() {
    rebalance_storm("exactly_once");
}

#[test]
fn rebalance_storm_outbox_equals_replay() {
    rebalance_storm("exactly_once_outbox");
}

/// A rebalance storm under load: three instances on 6 partitions while
/// 100 000 votes arrive in eight parts; between parts, b leaves (SIGTERM)
/// and rejoins, and twice c is killed with SIGKILL and restarted at once.
/// Each member change waits for the group to settle (every partition held
/// ready by someone, from the members' metrics): tansu 0.6.0's coordinator
/// loses a group whose leader leaves while it is still forming (see
/// `stop_one_at_a_time`). The output equals a replay's: none missing, none
/// twice (outbox mode: one origin header per event). In `exactly_once` the
/// test broker shows read_committed readers the records of a killed
/// instance's transaction that its restart aborted (docs/testing.md), so
/// there the output must hold every event of the replay, and whatever is
/// there besides comes from the cycles the two kills left open
/// ([`assert_copies_only_of_killed_cycles`]: the redo's cycles need not end
/// where the killed one did, so a copy may carry the next cycle's number).
fn rebalance_storm(mode: &str) {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    if mode == "exactly_once" {
        exactly_once_mode(&broker.bootstrap(), "storm-probe");
    }
    let name = if mode == "exactly_once" {
        "storm"
    } else {
        "stormo"
    };
    let group = format!("{name}-group");
    let setup = Setup::at(&broker.bootstrap(), name, 6, mode, NO_CACHE, 20_000);
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 100_000, 29);
    let expected = replay(&setup.config, &input);
    let n = std::fs::read_to_string(&input).unwrap().lines().count();
    const PARTS: usize = 8;
    let parts: Vec<std::path::PathBuf> = (0..PARTS)
        .map(|i| {
            let p = setup.dir.path().join(format!("part{i}.jsonl"));
            slice_file(&input, &p, i * n / PARTS, (i + 1) * n / PARTS);
            p
        })
        .collect();
    // no idle flush while instances come and go
    let start = |tag: &str| instance(&setup, tag, tag, "127.0.0.1:0", Some("3600"));
    let mut produced = setup.produce(&parts[0]) as i64;
    let a = start("a");
    let mut b = start("b");
    let mut c = start("c");
    wait_settled(&[&a, &b, &c], 6);
    let mut kills = 0;
    for (i, part) in parts.iter().enumerate().skip(1) {
        produced += setup.publish(part) as i64;
        if i == 3 || i == 6 {
            // c dies mid-stream and comes back on the same state directory.
            c.kill9();
            kills += 1;
            c = start("c");
        } else {
            assert!(
                b.terminate(Duration::from_secs(60)).success(),
                "{}",
                b.log_text()
            );
            wait_settled(&[&a, &c], 6);
            b = start("b");
        }
        wait_settled(&[&a, &b, &c], 6);
    }
    assert_eq!(kills, 2);
    wait_committed(&setup, &group, produced, "the storm's input committed");
    stop_one_at_a_time(vec![a, b, c], 6);
    // Close the remaining windows with an idle flush, as one run would at its end.
    let d = instance_owning_every_partition(&setup, 6);
    if mode == "exactly_once" {
        wait_for_every_event(&setup, &expected, Duration::from_secs(300), &d);
        assert_copies_only_of_killed_cycles(&setup, &expected, kills);
    } else {
        wait_for_events(&setup, &expected, Duration::from_secs(300), &d);
        assert_same_events(&setup, &expected);
        assert_every_event_has_a_unique_origin(&setup);
    }
}

/// A rebalance while a restore reads a long changelog (≥ 300 000 records):
/// the revoke does not wait for the restore (its thread stops at its next
/// check, within a second, and holds its directories until then), so the
/// member hands its partitions over at once, the group settles, each
/// partition is restored again by its new owner, and the output is exact.
#[test]
fn a_revoke_during_a_long_restore_hands_over_at_once() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "revokerestore", 2, "exactly_once_outbox", NO_CACHE);
    let expected = history_then_tail(&setup, 120_000, 31, "revokerestore");
    // B, on an empty disk, restores the whole changelog; C joins while it does.
    let b = instance(&setup, "b", "b", "127.0.0.1:0", Some("3600"));
    wait_for(
        "B restoring both partitions",
        Duration::from_secs(120),
        || (b.held_partitions().len() == 2 && b.ready_partitions().is_empty()).then_some(()),
    );
    let c = instance(&setup, "c", "c", "127.0.0.1:0", Some("3600"));
    wait_for("C to hold a partition", Duration::from_secs(120), || {
        (!c.held_partitions().is_empty()).then_some(())
    });
    wait_settled(&[&b, &c], 2);
    assert_eq!(
        b.metric(r#"jurystream_rebalances_total{event="lost"}"#),
        Some(0.0),
        "{}",
        b.log_text()
    );
    // B's revoke: within a second, far inside its deadline (4 s).
    let revokes = b.metric("jurystream_revoke_duration_seconds_count");
    assert!(
        revokes >= Some(1.0),
        "B handed nothing over:\n{}",
        b.log_text()
    );
    let handed = (b.metric("jurystream_revoke_duration_seconds_sum").unwrap() * 1000.0) as u64;
    assert!(
        handed < 1_000,
        "the revoke took {handed} ms:\n{}",
        b.log_text()
    );
    // The restore was interrupted (B was still reading when C joined: the
    // whole changelog holds ≥ 300 000 records).
    let restored = [&b, &c]
        .iter()
        .filter_map(|s| s.metric("jurystream_state_restored_records_total"))
        .fold(0.0, f64::max) as u64;
    let total: u64 = high_watermarks_of(
        &setup.bootstrap,
        "revokerestore-group-changelog.revokerestore-votes",
    )
    .values()
    .sum::<i64>() as u64;
    assert!(
        total >= 300_000,
        "the changelog holds {total} records: make the history larger"
    );
    eprintln!(
        "changelog {total} records; B handed over in {handed} ms; largest restore {restored}"
    );
    stop_one_at_a_time(vec![b, c], 2);
    let d = instance_owning_every_partition(&setup, 2);
    wait_for_events(&setup, &expected, Duration::from_secs(300), &d);
    assert_same_events(&setup, &expected);
}

/// Outbox mode: a cycle in doubt whose marker has no floor for an output
/// partition (the instance's first write there: its producer had no
/// acknowledgement from it when it sealed the cycle) makes its new owner
/// read that partition from the beginning. Here the one rejected vote is
/// the last record, so the killed instance's last cycle is its first DLQ
/// write, and the DLQ holds 1 500 000 records before it: a read longer than
/// `max.poll.interval.ms` (6 s). That read runs on the restore thread, so
/// the member stays in the group, and the output is exact.
#[test]
fn a_reconcile_reading_a_long_output_tail_keeps_the_member_in_the_group() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "longtail", 1, "exactly_once_outbox", NO_CACHE);
    // The generator's votes without the lines a replay rejects (broken
    // or late ones), then one broken line: the only rejection.
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 20_000, 37);
    let rejected: std::collections::HashSet<u64> = replay(&setup.config, &input)
        .iter()
        .filter(|e| e["type"] == "vote_rejected")
        .filter_map(|e| e["source"]["line"].as_u64())
        .collect();
    let mut text: String = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(i, _)| !rejected.contains(&(*i as u64 + 1)))
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    text.push_str("{not json\n");
    std::fs::write(&input, text).unwrap();
    let expected = replay(&setup.config, &input);
    assert_eq!(
        expected
            .iter()
            .filter(|e| e["type"] == "vote_rejected")
            .count(),
        1,
        "the broken last line is the only rejection"
    );
    // Records in the DLQ before the service runs: not events of its, and
    // read by the check of the cycle in doubt.
    create_topic(&setup.bootstrap, &setup.dlq, 1);
    let foreign = setup.dir.path().join("foreign.jsonl");
    let lines: String = (0..1_500_000)
        .map(|i| format!("{{\"foreign\":{i}}}\n"))
        .collect();
    std::fs::write(&foreign, lines).unwrap();
    let n = jurystream::produce::produce(&foreign, &setup.dlq, &setup.bootstrap, &[]).unwrap();
    assert_eq!(n, 1_500_000);
    let produced = setup.produce(&input) as i64;
    let mut a = instance(&setup, "a", "a", "127.0.0.1:0", Some("3600"));
    wait_committed(&setup, "longtail-group", produced, "A to commit everything");
    // A's last cycle (the rejection's) is committed and not marked delivered.
    a.kill9();
    let b = instance(&setup, "b", "a", "127.0.0.1:0", Some("3600"));
    wait_for("B ready", Duration::from_secs(600), || {
        b.is_ready().then_some(())
    });
    // B completed A's cycle in doubt, after reading the outputs on the
    // restore thread (the restore's time includes that read).
    assert_eq!(
        b.metric("jurystream_outbox_recovered_cycles_total"),
        Some(1.0),
        "{}",
        b.log_text()
    );
    let checked = (b
        .metric("jurystream_state_restore_duration_seconds_sum")
        .expect("restore measured")
        * 1000.0) as u64;
    eprintln!("B restored, reading the outputs, in {checked} ms");
    assert!(
        checked > 6_000,
        "the restore with its output read took {checked} ms, not longer than \
         max.poll.interval.ms: make the DLQ longer\n{}",
        b.log_text()
    );
    // Never expelled (a poll-interval violation would revoke or lose the
    // partition).
    for event in ["revoked", "lost"] {
        let series = format!("jurystream_rebalances_total{{event=\"{event}\"}}");
        assert_eq!(b.metric(&series), Some(0.0), "{series}\n{}", b.log_text());
    }
    // Close the last windows (idle flush), then the outputs: the replay's
    // events once each, besides the foreign records.
    drop(b);
    let d = instance_owning_every_partition(&setup, 1);
    let ours = || -> Vec<serde_json::Value> {
        read_committed(&setup.bootstrap, &setup.output_topics())
            .into_iter()
            .map(|e| e.4)
            .filter(|v| v.get("foreign").is_none())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while ours().len() < expected.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let diff = differences(&expected, &ours());
    assert!(
        diff.is_empty(),
        "outputs differ from replay: {diff}\n{}",
        log_tail(&d)
    );
}

/// contract §2 (v4): only accepted votes are activity. One vote, then the same
/// record again every 500 ms (as `connect`'s sync resends delivered votes)
/// into the otherwise quiet partition: the vote's batch still closes by
/// the idle flush, `idle_flush_seconds` after the vote (+ a poll), while
/// the duplicates flow. (Before v4 every duplicate restarted the idle
/// time and the batch stayed open for as long as they came.)
#[test]
fn duplicates_do_not_hold_a_quiet_partition_open() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "idledups", 1, "at_least_once", "");
    let text = std::fs::read_to_string(&setup.config).unwrap().replace(
        "idle_flush_seconds = 2",
        "window_seconds = 1\ngrace_seconds = 0\nidle_flush_seconds = 3",
    );
    std::fs::write(&setup.config, text).unwrap();
    create_topic(&setup.bootstrap, &setup.input_topic, 1);
    let svc = Service::start(&setup, "a");
    wait_for("the partition ready", Duration::from_secs(60), || {
        (svc.ready_partitions().len() == 1).then_some(())
    });
    let vote = setup.dir.path().join("vote.jsonl");
    let now = jurystream::time::format_timestamp(jurystream::time::wall_clock());
    std::fs::write(
        &vote,
        format!(
            r#"{{"inference_id":"idle-1","voter_id":"r1","voter_prompt_id":"quality","vote":"pass","timestamp":"{now}","vote_id":"v-idle-1"}}"#
        ) + "\n",
    )
    .unwrap();
    let sent = Instant::now();
    setup.publish(&vote);
    let scores = vec![setup.scores.clone()];
    let mut duplicates = 0;
    let closed = loop {
        let elapsed = sent.elapsed();
        let scored = read_records(&setup.bootstrap, &scores)
            .iter()
            .any(|r| r.value["batch"]["vote_ids"][0] == "v-idle-1");
        if scored {
            break elapsed;
        }
        assert!(
            elapsed < Duration::from_secs(30),
            "no score update {elapsed:?} after the vote, {duplicates} duplicates later\n{}",
            log_tail(&svc)
        );
        setup.publish(&vote);
        duplicates += 1;
        std::thread::sleep(Duration::from_millis(500));
    };
    // The idle time (3 s) after the vote's window (1 s) closed, one poll
    // and the commit cycle; before v4 it never closed while duplicates came.
    assert!(
        closed < Duration::from_secs(10),
        "the batch closed {closed:?} after the vote"
    );
    let dup = svc
        .metric("jurystream_votes_duplicate_total")
        .unwrap_or(0.0);
    assert!(dup >= 2.0, "duplicates reached run meanwhile: {dup}");
    eprintln!("closed {closed:?} after the vote, with {duplicates} duplicates sent meanwhile");
}
