//! Reviewer agreement (contract §11) against the textbook: Krippendorff's α
//! (interval) as D_o / D_e over all pairs of values, and each reviewer's
//! squared distance to the mean of the other votes of the unit, computed
//! here from the units of hand-made logs (never from the sums the program
//! keeps). Through the binary on fixed logs (Krippendorff's worked
//! example, edge cases) and as properties over random logs through the
//! library: one pass equals the pairwise formula, and the sums of a log
//! split into partitions add up exactly to the sums of one pass.

mod common;

use std::collections::BTreeMap;

use common::command;
use proptest::prelude::*;
use serde_json::Value;

/// Units: (rubric, voter id, value) lists, one per batch.
type Units = Vec<(String, Vec<(String, f64)>)>;

/// Textbook α of one rubric's units: 1 − D_o / D_e, pairs ordered.
fn alpha_pairwise(units: &[Vec<f64>]) -> Option<f64> {
    let units: Vec<&Vec<f64>> = units.iter().filter(|u| u.len() >= 2).collect();
    let all: Vec<f64> = units.iter().flat_map(|u| u.iter().copied()).collect();
    let n = all.len() as f64;
    if n < 2.0 {
        return None;
    }
    let mut d_o = 0.0;
    for u in &units {
        let mut s = 0.0;
        for i in 0..u.len() {
            for j in 0..u.len() {
                if i != j {
                    s += (u[i] - u[j]).powi(2);
                }
            }
        }
        d_o += s / (u.len() - 1) as f64;
    }
    d_o /= n;
    let mut d_e = 0.0;
    for i in 0..all.len() {
        for j in 0..all.len() {
            if i != j {
                d_e += (all[i] - all[j]).powi(2);
            }
        }
    }
    d_e /= n * (n - 1.0);
    (d_e > 1e-12).then(|| 1.0 - d_o / d_e)
}

/// What contract §11 prints, computed from the units by definition.
fn expected(units: &Units) -> Value {
    let mut by_rubric: BTreeMap<&str, Vec<Vec<f64>>> = BTreeMap::new();
    let mut dev: BTreeMap<(&str, &str), (u64, f64)> = BTreeMap::new();
    for (rubric, votes) in units {
        if votes.len() < 2 {
            continue;
        }
        by_rubric
            .entry(rubric)
            .or_default()
            .push(votes.iter().map(|v| v.1).collect());
        for (i, (voter, v)) in votes.iter().enumerate() {
            let others: Vec<f64> = votes
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, o)| o.1)
                .collect();
            let mean = others.iter().sum::<f64>() / others.len() as f64;
            let e = dev.entry((voter, rubric)).or_default();
            e.0 += 1;
            e.1 += (v - mean).powi(2);
        }
    }
    let rubrics: Vec<Value> = by_rubric
        .iter()
        .map(|(r, us)| {
            serde_json::json!({
                "voter_prompt_id": r,
                "units": us.len(),
                "pairable_votes": us.iter().map(Vec::len).sum::<usize>(),
                "alpha": alpha_pairwise(us),
            })
        })
        .collect();
    let voters: Vec<Value> = dev
        .iter()
        .map(|((v, r), (n, s))| {
            serde_json::json!({
                "voter_id": v, "voter_prompt_id": r, "rated_votes": n,
                "mean_sq_deviation": s / *n as f64,
            })
        })
        .collect();
    serde_json::json!({ "rubrics": rubrics, "voters": voters })
}

/// Equal, numbers within 1e-9 (relative or absolute).
fn assert_close(what: &str, want: &Value, got: &Value) {
    match (want, got) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!(
                (a - b).abs() <= 1e-9 * a.abs().max(1.0),
                "{what}: want {a}, got {b}"
            );
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{what}: lengths of {want} and {got}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_close(&format!("{what}[{i}]"), x, y);
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            let keys = |o: &serde_json::Map<String, Value>| o.keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(a), keys(b), "{what}: fields");
            for (k, x) in a {
                assert_close(&format!("{what}.{k}"), x, &b[k]);
            }
        }
        _ => assert_eq!(want, got, "{what}"),
    }
}

fn vote_line(inference: &str, voter: &str, rubric: &str, vote: &str, second: u32) -> String {
    format!(
        r#"{{"inference_id": "{inference}", "voter_id": "{voter}", "voter_prompt_id": "{rubric}", "vote": {vote}, "timestamp": "2024-07-07T00:{:02}:{:02}Z"}}"#,
        second / 60,
        second % 60
    )
}

/// `jurystream agreement --format json` on `lines` (default configuration:
/// 60 s windows, every batch closed at the end).
fn agreement(lines: &[String]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("votes.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = command()
        .args(["agreement", "--format", "json", "--input"])
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Krippendorff (2011), "Computing Krippendorff's alpha-reliability":
/// observers A–D, 12 units, values 1–5 (blank = missing); interval α =
/// 0.849. Each unit is one inference whose votes fall in one window; the
/// values are mapped onto [0, 1] by (v − 1)/4 (α is invariant to it).
#[test]
fn krippendorffs_interval_example() {
    let table: [[Option<u8>; 12]; 4] = {
        let m = None;
        [
            [
                Some(1),
                Some(2),
                Some(3),
                Some(3),
                Some(2),
                Some(1),
                Some(4),
                Some(1),
                Some(2),
                m,
                m,
                m,
            ],
            [
                Some(1),
                Some(2),
                Some(3),
                Some(3),
                Some(2),
                Some(2),
                Some(4),
                Some(1),
                Some(2),
                Some(5),
                m,
                Some(3),
            ],
            [
                m,
                Some(3),
                Some(3),
                Some(3),
                Some(2),
                Some(3),
                Some(4),
                Some(2),
                Some(2),
                Some(5),
                Some(1),
                m,
            ],
            [
                Some(1),
                Some(2),
                Some(3),
                Some(3),
                Some(2),
                Some(4),
                Some(4),
                Some(1),
                Some(2),
                Some(5),
                Some(1),
                m,
            ],
        ]
    };
    let mut lines = Vec::new();
    let mut units: Units = Vec::new();
    for u in 0..12 {
        let mut votes = Vec::new();
        for (o, row) in table.iter().enumerate() {
            if let Some(v) = row[u] {
                let voter = ["A", "B", "C", "D"][o];
                let x = (f64::from(v) - 1.0) / 4.0;
                lines.push(vote_line(
                    &format!("unit-{u:02}"),
                    voter,
                    "interval",
                    &x.to_string(),
                    o as u32,
                ));
                votes.push((voter.to_owned(), x));
            }
        }
        units.push(("interval".to_owned(), votes));
    }
    let got = agreement(&lines);
    let alpha = got["rubrics"][0]["alpha"].as_f64().unwrap();
    assert!(
        (alpha - 0.849).abs() < 0.0005,
        "published 0.849, got {alpha}"
    );
    assert_eq!(got["rubrics"][0]["units"], 11);
    assert_eq!(got["rubrics"][0]["pairable_votes"], 40);
    assert_close("agreement", &expected(&units), &got);
    assert_eq!(got["voters"].as_array().unwrap().len(), 4);
}

#[test]
fn edge_cases() {
    let l = vote_line;
    // All votes equal: no expected disagreement, α null.
    let got = agreement(&[
        l("i", "a", "same", "0.7", 0),
        l("i", "b", "same", "0.7", 1),
        l("j", "a", "same", "0.7", 2),
        l("j", "c", "same", "0.7", 3),
    ]);
    assert_eq!(got["rubrics"][0]["alpha"], Value::Null, "{got}");
    assert_eq!(got["rubrics"][0]["units"], 2);
    assert_eq!(got["voters"][0]["mean_sq_deviation"], 0.0);

    // One unit with a spread: α defined (the textbook gives 0 − …).
    let one = vec![l("i", "a", "one", "0", 0), l("i", "b", "one", "1", 1)];
    let units: Units = vec![("one".into(), vec![("a".into(), 0.0), ("b".into(), 1.0)])];
    assert_close("one unit", &expected(&units), &agreement(&one));

    // Abstentions and superseded votes are not counted; a batch with one
    // counted vote is not a unit; rubrics apart; reputations ignored.
    let lines = vec![
        l("i", "a", "r", "0.0", 0),
        l("i", "b", "r", "0.5", 1),
        l("i", "a", "r", "1.0", 2),
        l("i", "c", "r", "null", 3),
        l("k", "a", "r", "0.2", 4),
        l("k", "c", "r", "null", 5),
        l("m", "a", "s", "true", 6),
        // second window of i: a unit of its own
        l("i", "c", "r", "0.25", 70),
        l("i", "b", "r", "0.75", 71),
    ];
    let weighted = lines[1].replace('}', r#", "reputation": 5.0}"#);
    let mut lines2 = lines.clone();
    lines2[1] = weighted;
    let units: Units = vec![
        ("r".into(), vec![("b".into(), 0.5), ("a".into(), 1.0)]),
        ("r".into(), vec![("c".into(), 0.25), ("b".into(), 0.75)]),
    ];
    let got = agreement(&lines);
    assert_close("excluded votes", &expected(&units), &got);
    assert_eq!(got, agreement(&lines2), "reputation does not enter");
    let voters: Vec<(&str, &str)> = got["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["voter_id"].as_str().unwrap(),
                v["voter_prompt_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(voters, [("a", "r"), ("b", "r"), ("c", "r")]);

    // No unit at all: nothing to report.
    let got = agreement(&[l("i", "a", "r", "1", 0)]);
    assert_eq!(got, serde_json::json!({"rubrics": [], "voters": []}));
}

#[test]
fn a_bad_format_is_a_usage_error() {
    let out = command()
        .args(["agreement", "--format", "yaml", "--input", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--format"));
}

/// A random log: strictly increasing times (no vote is late or a duplicate
/// in any split of it), a few inferences, reviewers and rubrics, values
/// with abstentions. Returns the lines and the inference of each.
fn any_log() -> impl Strategy<Value = Vec<(u32, u32, u32, Option<u8>, u32)>> {
    prop::collection::vec(
        (
            0u32..6,
            0u32..5,
            0u32..2,
            prop::option::weighted(0.85, 0u8..5),
            1u32..25,
        ),
        1..120,
    )
}

/// One batch of the model: voter → (arrival, value; None abstains).
type Batch = BTreeMap<String, (usize, Option<f64>)>;

fn lines_of(log: &[(u32, u32, u32, Option<u8>, u32)]) -> (Vec<String>, Vec<u32>, Units) {
    let mut t = 0u32;
    let mut lines = Vec::new();
    let mut infs = Vec::new();
    // (inference, rubric, window) → voter → (arrival, value): the unit by
    // contract §2: a later vote of the same voter in the batch replaces theirs.
    let mut batches: BTreeMap<(u32, u32, u32), Batch> = BTreeMap::new();
    for (k, &(inf, voter, rubric, value, step)) in log.iter().enumerate() {
        t += step;
        let v = value.map(|x| f64::from(x) / 4.0);
        let vote = v.map_or("null".to_owned(), |x| x.to_string());
        let (inf_s, voter_s, rubric_s) =
            (format!("i{inf}"), format!("v{voter}"), format!("r{rubric}"));
        lines.push(format!(
            r#"{{"inference_id": "{inf_s}", "voter_id": "{voter_s}", "voter_prompt_id": "{rubric_s}", "vote": {vote}, "timestamp": "2024-07-07T{:02}:{:02}:{:02}Z"}}"#,
            t / 3600,
            t / 60 % 60,
            t % 60
        ));
        infs.push(inf);
        batches
            .entry((inf, rubric, t / 60))
            .or_default()
            .insert(voter_s, (k, v));
    }
    let units = batches
        .into_iter()
        .map(|((_, rubric, _), voters)| {
            let mut counted: Vec<(usize, String, f64)> = voters
                .into_iter()
                .filter_map(|(voter, (k, v))| v.map(|x| (k, voter, x)))
                .collect();
            counted.sort_by_key(|c| c.0);
            (
                format!("r{rubric}"),
                counted.into_iter().map(|(_, v, x)| (v, x)).collect(),
            )
        })
        .collect();
    (lines, infs, units)
}

fn tally(cfg: &jurystream::config::Config, lines: &[String]) -> jurystream::agreement::Tally {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("votes.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    jurystream::agreement::tally_file(cfg, &input).unwrap().0
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// One pass equals the textbook, and splitting the log into partitions
    /// (by inference, as Kafka keys would) and adding their sums gives the
    /// same integers, hence the same α and deviations.
    #[test]
    fn partitions_add_up_to_one_pass(log in any_log(), parts in 1u32..4, cache_mb in prop::sample::select(vec![0u32, 64])) {
        let cfg = jurystream::config::Config::from_layers(
            Some(&format!("[state]\ncache_mb = {cache_mb}\n")), &[]).unwrap();
        let (lines, infs, units) = lines_of(&log);
        let whole = tally(&cfg, &lines);
        let got = serde_json::to_value(whole.report()).unwrap();
        assert_close("one pass", &expected(&units), &got);

        let mut added = jurystream::agreement::Tally::default();
        for p in 0..parts {
            let mine: Vec<String> = lines.iter().zip(&infs)
                .filter(|(_, i)| *i % parts == p).map(|(l, _)| l.clone()).collect();
            if mine.is_empty() {
                continue;
            }
            let t = tally(&cfg, &mine);
            for (r, s) in t.rubrics {
                added.rubrics.entry(r).or_default().add(&s);
            }
            for (k, s) in t.reviewers {
                added.reviewers.entry(k).or_default().add(&s);
            }
        }
        prop_assert_eq!(&added.rubrics, &whole.rubrics);
        prop_assert_eq!(&added.reviewers, &whole.reviewers);
        prop_assert_eq!(added.report(), whole.report());
    }
}
