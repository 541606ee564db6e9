use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::*;
use crate::engine::{RubricParams, ScoreUpdate, SeriesKey};

fn update(model: Option<&str>, rubric: &str, ambiguous: bool) -> ScoreUpdate {
    ScoreUpdate {
        series: SeriesKey {
            inference_id: "i".into(),
            voter_prompt_id: rubric.into(),
        },
        model_id: model.map(Into::into),
        update_seq: 1,
        score: 0.5,
        previous_score: 0.5,
        previous_mean_vote: None,
        series_votes: 0,
        alpha: 0.5,
        delta_t_seconds: 1.0,
        ambiguous,
        params: RubricParams {
            lambda: 0.01,
            time_unit: crate::engine::score::TimeUnit::Seconds,
            variance_threshold: 0.05,
            aggregator: crate::engine::score::Aggregator::Mean,
            temperature: 0.5,
            reputation_model: crate::engine::reputation::Model::Noise,
        },
        window_seconds: 60.0,
        window_start: 0,
        window_end: None,
        first_vote_at: 0,
        last_vote_at: 0,
        abstentions: 0,
        superseded: 0,
        weight_sum: 1.0,
        mean_vote: 0.5,
        aggregate: 0.5,
        variance: 0.0,
        votes: vec![],
        effective_votes: None,
        score_interval: None,
        previous_interval: None,
        companions: vec![],
        learned: None,
    }
}

#[test]
fn label_values_are_capped() {
    let m = Metrics::new(200);
    for i in 0..1000 {
        m.score_update(&update(Some(&format!("m{i}")), "r", i % 2 == 0), 1.0);
    }
    let text = m.render();
    let models: HashSet<&str> = text
        .lines()
        .filter(|l| l.starts_with(SCORE_UPDATES))
        .filter_map(|l| l.split("model_id=\"").nth(1))
        .filter_map(|l| l.split('"').next())
        .collect();
    // 1 000 distinct model ids: 200 kept, the rest become "other".
    assert_eq!(models.len(), 201, "{}", models.len());
    assert!(models.contains("other"));
    assert!(text.contains("jurystream_build_info{version="));
    assert!(text.contains("jurystream_votes_rejected_total{reason=\"late\"} 0"));
    // The 800 capped updates all count under "other".
    assert!(
        text.contains(
            "jurystream_score_updates_total{model_id=\"other\",voter_prompt_id=\"r\"} 800"
        ),
        "{text}"
    );
}

#[test]
fn missing_model_is_unknown_and_values_are_escaped() {
    let m = Metrics::new(200);
    m.score_update(&update(None, "r", false), 1.0);
    m.score_update(&update(Some("a\"b\\c\nd"), "r", false), 1.0);
    let text = m.render();
    assert!(
        text.contains("{model_id=\"unknown\",voter_prompt_id=\"r\"} 1"),
        "{text}"
    );
    assert!(text.contains("model_id=\"a\\\"b\\\\c\\nd\""), "{text}");
}

/// One sample's labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// A sample line of the text format: name, labels, value.
fn sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let (series, value) = line.rsplit_once(' ').expect("name and value");
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("value of {line:?}")),
    };
    let (name, labels) = match series.split_once('{') {
        None => (series, BTreeMap::new()),
        Some((name, rest)) => {
            let rest = rest.strip_suffix('}').expect("closing brace");
            let mut labels = BTreeMap::new();
            // Values here hold no `",` (the test data has none).
            for kv in rest.split("\",").filter(|s| !s.is_empty()) {
                let (k, v) = kv.split_once("=\"").expect("label=\"value\"");
                labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
            }
            (name, labels)
        }
    };
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    assert!(!name.is_empty() && name.chars().all(ok), "name in {line:?}");
    (name.to_owned(), labels, value)
}

/// Every contract §8 metric: name, type, labels (besides `le`).
const SPEC: &[(&str, &str, &[&str])] = &[
    (VOTES_ACCEPTED, "counter", &["source"]),
    (VOTES_DUPLICATE, "counter", &[]),
    (VOTES_SUPERSEDED, "counter", &[]),
    (VOTES_REJECTED, "counter", &[REASON]),
    (ABSTENTIONS, "counter", &[]),
    (SCORE_UPDATES, "counter", &[MODEL_ID, VOTER_PROMPT_ID]),
    (AMBIGUITY_FLAGS, "counter", &[MODEL_ID, VOTER_PROMPT_ID]),
    (FRESHNESS, "histogram", &[MODEL_ID, VOTER_PROMPT_ID]),
    (SCORE, "histogram", &[MODEL_ID, VOTER_PROMPT_ID]),
    (LAST_FRESHNESS, "gauge", &[MODEL_ID, VOTER_PROMPT_ID]),
    (LAST_SCORE_UPDATE, "gauge", &[MODEL_ID, VOTER_PROMPT_ID]),
    (BATCH_VOTES, "histogram", &[]),
    (BATCH_VARIANCE, "histogram", &[]),
    (OPEN_BATCHES, "gauge", &[]),
    (CACHE_BYTES, "gauge", &[]),
    (WATERMARK, "gauge", &[PARTITION]),
    (CONSUMER_LAG, "gauge", &[TOPIC, PARTITION]),
    (COMMIT_DURATION, "histogram", &[]),
    (RESTORE_DURATION, "histogram", &[]),
    (BUILD_INFO, "gauge", &[VERSION]),
    // Not in contract §8: what the broker tests read instead of logs.
    (RESTORED_RECORDS, "counter", &[]),
    (REBALANCES, "counter", &["event"]),
    (REVOKE_DURATION, "histogram", &[]),
    (OUTBOX_RECOVERED_CYCLES, "counter", &[]),
    (OUTBOX_REPUBLISHED, "counter", &[]),
    (DELIVERY_MODE, "gauge", &["mode"]),
];

/// The rendered text holds every contract §8 metric with its type, labels, help
/// and buckets, each declared once; every sample line parses.
#[test]
fn exposition_has_every_spec_metric() {
    let m = Metrics::new(200);
    m.score_update(&update(Some("gpt"), "accuracy", true), 1.0);
    m.engine_counters(
        "votes-0",
        &Counters {
            accepted: 3,
            abstentions: 1,
            ..Default::default()
        },
        2,
        50,
        Some(1_700_000_000_000_000_000),
    );
    m.engine_counters("votes-1", &Counters::default(), 3, 100, Some(0));
    for header in [None, Some(&b"webhook"[..]), Some(b"sync"), None] {
        m.vote_accepted(crate::kafka::vote_source(header));
    }
    m.consumer_lag("votes", 0, 7);
    m.commit_duration(0.02);
    m.restore_duration(1.5);
    m.rejected(crate::input::Reason::Late);
    m.set_delivery_mode("exactly_once");

    let text = m.render();
    let mut types = BTreeMap::new();
    let mut helps = BTreeMap::new();
    let mut samples: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (n, t) = rest.split_once(' ').unwrap();
            assert!(
                types.insert(n.to_owned(), t.to_owned()).is_none(),
                "{n} twice"
            );
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (n, h) = rest.split_once(' ').unwrap();
            helps.insert(n.to_owned(), h.to_owned());
        } else {
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let (n, labels, v) = sample(line);
            samples.entry(n).or_default().push((labels, v));
        }
    }
    for (name, kind, labels) in SPEC {
        assert_eq!(types.get(*name).map(String::as_str), Some(*kind), "{name}");
        assert!(helps.contains_key(*name), "{name}");
        let want: BTreeSet<&str> = labels.iter().copied().collect();
        let series: Vec<&str> = match *kind {
            "histogram" => vec!["_bucket", "_sum", "_count"],
            _ => vec![""],
        };
        for suffix in series {
            let full = format!("{name}{suffix}");
            let s = samples
                .get(&full)
                .unwrap_or_else(|| panic!("no {full} sample"));
            for (l, _) in s {
                let got: BTreeSet<&str> = l
                    .keys()
                    .map(String::as_str)
                    .filter(|k| *k != "le")
                    .collect();
                assert_eq!(got, want, "{full}");
            }
        }
    }
    // Every sample belongs to a declared family.
    for n in samples.keys() {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                n.strip_suffix(s)
                    .filter(|b| types.get(*b).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(n);
        assert!(types.contains_key(base), "{n} undeclared");
    }

    // HELP texts and buckets as before.
    assert_eq!(
        helps[VOTES_REJECTED],
        "Messages sent to the DLQ, by reason."
    );
    assert_eq!(helps[FRESHNESS], "Freshness (1 - alpha) of score updates.");
    assert_eq!(
        helps[CONSUMER_LAG],
        "Messages behind the end of each input partition (librdkafka statistics)."
    );
    let les = |name: &str| -> Vec<String> {
        samples[&format!("{name}_bucket")]
            .iter()
            .map(|(l, _)| l["le"].clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let expect = |b: &[f64]| -> Vec<String> {
        let mut v: Vec<String> = b.iter().map(|x| x.to_string()).collect();
        v.push("+Inf".into());
        v.sort();
        v
    };
    assert_eq!(les(FRESHNESS), expect(FRESHNESS_BUCKETS));
    assert_eq!(les(SCORE), expect(SCORE_BUCKETS));
    assert_eq!(les(BATCH_VOTES), expect(BATCH_VOTE_BUCKETS));
    assert_eq!(les(BATCH_VARIANCE), expect(VARIANCE_BUCKETS));
    assert_eq!(les(COMMIT_DURATION), expect(SECONDS_BUCKETS));

    // Every rejection reason from the start; values as fed.
    let reasons: BTreeSet<&str> = samples[VOTES_REJECTED]
        .iter()
        .map(|(l, _)| l["reason"].as_str())
        .collect();
    let all: BTreeSet<&str> = crate::input::Reason::ALL
        .iter()
        .map(|r| r.as_str())
        .collect();
    assert_eq!(reasons, all);
    let accepted: f64 = samples[VOTES_ACCEPTED].iter().map(|(_, v)| v).sum();
    assert_eq!(accepted, 4.0, "the four votes counted by source");
    assert_eq!(samples[ABSTENTIONS][0].1, 1.0);
    assert_eq!(samples[OPEN_BATCHES][0].1, 5.0, "sum over partitions");
    assert_eq!(samples[CACHE_BYTES][0].1, 150.0, "sum over partitions");
    assert_eq!(samples[BUILD_INFO][0].1, 1.0);
    assert_eq!(
        samples[BUILD_INFO][0].0["version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(samples[WATERMARK].len(), 2);

    // A revoked partition's gauges go; its counts stay.
    m.forget_partition("votes-0");
    m.forget_lag("votes", 0);
    let text = m.render();
    assert!(!text.contains("partition=\"votes-0\""), "{text}");
    assert!(text.contains("partition=\"votes-1\""), "{text}");
    assert!(!text.contains(CONSUMER_LAG), "{text}");
    assert!(text.contains("jurystream_open_batches 3\n"), "{text}");
    for line in [
        "jurystream_votes_accepted_total{source=\"kafka\"} 2\n",
        "jurystream_votes_accepted_total{source=\"webhook\"} 1\n",
        "jurystream_votes_accepted_total{source=\"api\"} 0\n",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

#[test]
fn engine_counters_fold_deltas() {
    let m = Metrics::new(10);
    let mut c = Counters {
        duplicates: 5,
        ..Default::default()
    };
    m.engine_counters("p", &c, 0, 0, None);
    c.duplicates = 7;
    m.engine_counters("p", &c, 0, 0, None);
    m.engine_counters("q", &c, 0, 0, None);
    assert!(m.render().contains("jurystream_votes_duplicate_total 14\n"));
}

/// A vote's source label: its header when `connect` sets that value,
/// `kafka` without one, `other` otherwise (never a value from the data).
#[test]
fn votes_accepted_are_counted_by_source() {
    use crate::kafka::vote_source;
    let m = Metrics::new(10);
    for h in [
        None,
        Some(&b"sync"[..]),
        Some(b"api"),
        Some(b"sync"),
        Some(b"evil\"}"),
    ] {
        m.vote_accepted(vote_source(h));
    }
    let text = m.render();
    for (source, n) in [
        ("kafka", 1),
        ("api", 1),
        ("webhook", 0),
        ("sync", 2),
        ("other", 1),
    ] {
        let line = format!("jurystream_votes_accepted_total{{source=\"{source}\"}} {n}\n");
        assert!(text.contains(&line), "{line} in {text}");
    }
}

/// The partitions an instance holds, ready or restoring, replace the last
/// set: a released partition disappears.
#[test]
fn held_partitions_are_listed_and_replaced() {
    let m = Metrics::new(10);
    m.partitions_held([
        ("votes-0".to_string(), true),
        ("votes-1".to_string(), false),
    ]);
    let text = m.render();
    assert!(
        text.contains("jurystream_partition_ready{partition=\"votes-0\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("jurystream_partition_ready{partition=\"votes-1\"} 0\n"),
        "{text}"
    );
    m.partitions_held([("votes-1".to_string(), true)]);
    let text = m.render();
    assert!(!text.contains("partition=\"votes-0\""), "{text}");
    assert!(
        text.contains("jurystream_partition_ready{partition=\"votes-1\"} 1\n"),
        "{text}"
    );
}

/// Label values that run together alike stay two series; a gone series
/// disappears.
#[test]
fn label_values_that_concatenate_alike_stay_apart() {
    let m = Metrics::new(10);
    m.consumer_lag("votes", 12, 1);
    m.consumer_lag("votes1", 2, 2);
    let text = m.render();
    assert!(
        text.contains("jurystream_consumer_lag_messages{partition=\"12\",topic=\"votes\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("jurystream_consumer_lag_messages{partition=\"2\",topic=\"votes1\"} 2\n"),
        "{text}"
    );
    m.forget_lag("votes", 12);
    let text = m.render();
    assert!(!text.contains("topic=\"votes\""), "{text}");
    assert!(text.contains("topic=\"votes1\""), "{text}");

    m.score_update(&update(Some("ab"), "c", true), 1.0);
    m.score_update(&update(Some("a"), "bc", true), 1.0);
    let text = m.render();
    for pair in [
        "model_id=\"ab\",voter_prompt_id=\"c\"",
        "model_id=\"a\",voter_prompt_id=\"bc\"",
    ] {
        assert!(
            text.contains(&format!("jurystream_ambiguity_flags_total{{{pair}}} 1\n")),
            "{pair} in {text}"
        );
    }
}

/// A new agreement series is rendered at 0 once, then with its sums.
#[test]
fn a_new_agreement_series_starts_at_zero() {
    let m = Metrics::new(10);
    let line = |text: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("jurystream_agreement_pairable_votes_total{voter_prompt_id=\"r\"}")
            })
            .map(str::to_owned)
    };
    assert_eq!(line(&m.render()), None);
    m.agreement("r", [2.0, 1.0, 1.0, 0.5]);
    m.agreement("r", [1.0, 0.0, 0.0, 0.0]);
    assert_eq!(
        line(&m.render()).as_deref(),
        Some("jurystream_agreement_pairable_votes_total{voter_prompt_id=\"r\"} 0.0")
    );
    assert_eq!(
        line(&m.render()).as_deref(),
        Some("jurystream_agreement_pairable_votes_total{voter_prompt_id=\"r\"} 3.0")
    );
    m.agreement("r", [1.0, 0.0, 0.0, 0.0]);
    assert_eq!(
        line(&m.render()).as_deref(),
        Some("jurystream_agreement_pairable_votes_total{voter_prompt_id=\"r\"} 4.0")
    );
}

/// The leaderboard gauges are replaced as a whole; the label cap applies.
#[test]
fn board_rows_replace_the_last_ones() {
    let m = Metrics::new(1);
    assert_eq!(
        m.pair_labels(Some("a"), "r"),
        ("a".to_string(), "r".to_string())
    );
    assert_eq!(
        m.pair_labels(Some("b"), "s"),
        (OTHER.to_string(), OTHER.to_string())
    );
    assert_eq!(
        m.pair_labels(None, "r"),
        (OTHER.to_string(), "r".to_string())
    );
    m.model_board([
        (("a".to_string(), "r".to_string()), 1.5, 1.25, 2),
        ((OTHER.to_string(), OTHER.to_string()), 0.5, 0.25, 1),
    ]);
    let text = m.render();
    assert!(
        text.contains("jurystream_model_scores{model_id=\"a\",voter_prompt_id=\"r\"} 1.5\n"),
        "{text}"
    );
    assert!(
        text.contains("jurystream_model_series{model_id=\"other\",voter_prompt_id=\"other\"} 1\n"),
        "{text}"
    );
    m.model_board([(("a".to_string(), "r".to_string()), 1.0, 1.0, 1)]);
    let text = m.render();
    assert!(!text.contains("model_id=\"other\""), "{text}");
    assert!(
        text.contains("jurystream_model_score_squares{model_id=\"a\",voter_prompt_id=\"r\"} 1.0\n"),
        "{text}"
    );
}

#[test]
fn learned_weights_are_observed_per_capped_rubric() {
    let m = Metrics::with_reputation(1, true);
    let learned = |weights: &[f64]| crate::engine::Learned {
        weights: weights.iter().copied().collect(),
        step: 0.5,
        table_until: 0,
        confusion: None,
    };
    for (model, rubric, weights) in [
        ("a", "r", &[0.25, 1.0][..]),
        ("b", "r", &[2.5][..]),
        ("a", "s", &[1.0][..]),
        ("a", "t", &[1.0, 1.0][..]),
    ] {
        let mut u = update(Some(model), rubric, false);
        u.learned = Some(learned(weights));
        m.score_update(&u, 1.0);
    }
    // One update without weights (shadow or a batch scored before tables).
    m.score_update(&update(Some("a"), "r", false), 1.0);
    let text = m.render();
    let count = |rubric: &str| {
        let prefix = format!("{REPUTATION_WEIGHT}_count{{voter_prompt_id=\"{rubric}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().parse::<f64>().unwrap())
    };
    // Both models' weights of `r` in one histogram; past the cap of one
    // rubric value, `s` and `t` share the overflow label.
    assert_eq!(count("r"), Some(3.0), "{text}");
    assert_eq!(count("s"), None, "{text}");
    let sum = format!("{REPUTATION_WEIGHT}_sum{{voter_prompt_id=\"r\"}} 3.75");
    assert!(text.lines().any(|l| l == sum), "{text}");
    let overflow: f64 = text
        .lines()
        .filter(|l| l.starts_with(&format!("{REPUTATION_WEIGHT}_count{{")))
        .filter(|l| !l.contains("voter_prompt_id=\"r\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(overflow, 3.0, "{text}");
}

#[test]
fn side_weights_and_inverted_votes_are_observed_per_rubric_and_side() {
    let m = Metrics::with_reputation(10, true);
    let mut u = update(Some("a"), "safety", false);
    let vote = |value: f64| crate::engine::Entry {
        voter_id: "rev".into(),
        vote_id: "v".into(),
        value: Some(value),
        weight: 1.0,
        timestamp: 0,
        inference_time: None,
        live: true,
    };
    // A pass weighed 1.5, a flag 0.5, and a pass counted as a flag (0.25).
    u.votes = vec![vote(1.0), vote(0.0), vote(1.0)];
    u.learned = Some(crate::engine::Learned {
        weights: [1.5, 0.5, 0.25].into_iter().collect(),
        step: 0.5,
        table_until: 0,
        confusion: Some(crate::engine::Counted {
            values: [1.0, 0.0, 0.0].into_iter().collect(),
            prior: None,
            by_side: true,
        }),
    });
    m.score_update(&u, 1.0);
    let text = m.render();
    let line = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().parse::<f64>().unwrap())
    };
    let pass = format!("{REPUTATION_SIDE_WEIGHT}_sum{{side=\"pass\",voter_prompt_id=\"safety\"}} ");
    let flag =
        format!("{REPUTATION_SIDE_WEIGHT}_count{{side=\"flag\",voter_prompt_id=\"safety\"}} ");
    let inverted = format!("{REPUTATION_INVERTED}{{voter_prompt_id=\"safety\"}} ");
    assert_eq!(line(&pass), Some(1.75), "{text}");
    assert_eq!(line(&flag), Some(1.0), "{text}");
    assert_eq!(line(&inverted), Some(1.0), "{text}");
    // Such a batch is not in §14's weight histogram.
    assert!(!text.contains(&format!(
        "{REPUTATION_WEIGHT}_count{{voter_prompt_id=\"safety\"}}"
    )));
}
