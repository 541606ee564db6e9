//! Three instances on one host, none given `JURYSTREAM_INSTANCE_ID`, in the
//! default `exactly_once` mode: each takes its transactional id from its
//! own state directory (with the host name as the id they fenced
//! one another in turn and published nothing), and together they publish
//! exactly a replay's events. A second process on a state directory in use
//! is refused. Skipped when tansu is not installed, unless
//! JURYSTREAM_REQUIRE_BROKER=1.

mod kafka_support;

use std::collections::BTreeSet;
use std::time::Duration;

use kafka_support::*;

#[test]
fn three_instances_on_one_host_have_their_own_ids_and_publish_exactly_once() {
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "threeids", 3, "exactly_once", "");
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 3_000, 12);
    let expected = replay(&setup.config, &input);
    setup.produce(&input);
    let start = |tag: &str, log: &str| {
        let state = setup.dir.path().join(format!("state-{tag}"));
        let state = state.display().to_string();
        Service::start_with(
            &setup.config,
            setup.dir.path(),
            log,
            &[
                ("JURYSTREAM_STATE__DIR", state.as_str()),
                ("JURYSTREAM_METRICS__LISTEN", "127.0.0.1:0"),
            ],
        )
    };
    let services: Vec<Service> = ["a", "b", "c"].iter().map(|t| start(t, t)).collect();
    wait_for_events(&setup, &expected, Duration::from_secs(300), &services[0]);
    assert_same_events(&setup, &expected);
    let ids: BTreeSet<String> = ["a", "b", "c"]
        .iter()
        .map(|t| {
            std::fs::read_to_string(setup.dir.path().join(format!("state-{t}/instance-id")))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");

    // A fourth process on a's state directory stops at once, exit status
    // 2 (a configuration to fix), naming the directory.
    let mut d = start("a", "a-again");
    let child = &mut d.child;
    let status = wait_for(
        "the second process on a's state.dir to exit",
        Duration::from_secs(30),
        || child.try_wait().unwrap(),
    );
    assert_eq!(status.code(), Some(2), "{}", d.log_text());
    assert!(
        d.log_text()
            .contains("in use by another jurystream process"),
        "{}",
        d.log_text()
    );
}
