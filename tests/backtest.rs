//! `jurystream backtest` (contract §10) against a computation from `replay`'s
//! events (never from the backtest's own code): on the example input through
//! the binary, and as a property over random vote logs and grid points
//! through the library.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{bin, command, parse_lines};
use proptest::prelude::*;
use serde_json::{json, Value};

/// What contract §10 defines, computed from one replay's events.
#[derive(Debug, Default)]
struct Hand {
    n: u64,
    se: f64,
    ll: f64,
    se_last: f64,
    /// updates whose previous score had an interval, and those whose
    /// interval held the batch's mean vote (contract §13 coverage)
    with_interval: u64,
    covered: u64,
    all: u64,
    eligible: u64,
    /// variances of the eligible updates
    variances: Vec<f64>,
    /// n per day (index = T's day number)
    per_day: HashMap<i64, u64>,
}

fn t_ns(s: &str) -> i128 {
    common::parse_utc(s).unwrap_or_else(|| panic!("bad timestamp {s}"))
}

fn hand(events: &[Value], min_votes: u64) -> Hand {
    let mut h = Hand::default();
    let mut last_mean: HashMap<(String, String), f64> = HashMap::new();
    let mut last_interval: HashMap<(String, String), Value> = HashMap::new();
    for e in events.iter().filter(|e| e["type"] == "score_updated") {
        let key = (
            e["inference_id"].as_str().unwrap().to_owned(),
            e["voter_prompt_id"].as_str().unwrap().to_owned(),
        );
        let b = &e["batch"];
        let m = b["mean_vote"].as_f64().unwrap();
        h.all += 1;
        if b["votes"].as_u64().unwrap() >= min_votes {
            h.eligible += 1;
            h.variances.push(b["variance"].as_f64().unwrap());
        }
        let prev = last_mean.insert(key.clone(), m);
        let prev_interval = last_interval.insert(key, e["score_interval"].clone());
        if e["update_seq"].as_u64().unwrap() >= 2 {
            if let Some(Value::Array(i)) = prev_interval {
                h.with_interval += 1;
                let (low, high) = (i[0].as_f64().unwrap(), i[1].as_f64().unwrap());
                h.covered += u64::from(low <= m && m <= high);
            }
            let p = e["previous_score"].as_f64().unwrap();
            let m_prev = prev.expect("a series' second update has a previous batch");
            h.n += 1;
            h.se += (p - m) * (p - m);
            let pc = p.clamp(1e-6, 1.0 - 1e-6);
            h.ll += -(m * pc.ln() + (1.0 - m) * (1.0 - pc).ln());
            h.se_last += (m_prev - m) * (m_prev - m);
            let day = t_ns(b["last_vote_at"].as_str().unwrap()).div_euclid(86_400 * 1_000_000_000);
            *h.per_day.entry(day as i64).or_default() += 1;
        }
    }
    h
}

fn close(a: &Value, b: Option<f64>, what: &str) {
    match (a.as_f64(), b) {
        (None, None) => {}
        (Some(x), Some(y)) => assert!(
            (x - y).abs() <= 1e-12 * y.abs().max(1.0),
            "{what}: backtest {x} vs hand {y}"
        ),
        (x, y) => panic!("{what}: backtest {x:?} vs hand {y:?}"),
    }
}

fn check_row(row: &Value, h: &Hand, what: &str) {
    assert_eq!(row["n"].as_u64(), Some(h.n), "{what}: n");
    let n = h.n as f64;
    close(
        &row["mse"],
        (h.n > 0).then(|| h.se / n),
        &format!("{what}: mse"),
    );
    close(
        &row["log_loss"],
        (h.n > 0).then(|| h.ll / n),
        &format!("{what}: log_loss"),
    );
    let skill = (h.n > 0 && h.se_last != 0.0).then(|| 1.0 - (h.se / n) / (h.se_last / n));
    close(&row["skill"], skill, &format!("{what}: skill"));
    let coverage = (h.with_interval > 0).then(|| h.covered as f64 / h.with_interval as f64);
    close(&row["coverage"], coverage, &format!("{what}: coverage"));
}

fn write_config(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

const BASE: &str = "[ambiguity]\nmin_votes = 3\nvariance_threshold = 0.05\n";

#[test]
fn the_metrics_on_the_example_equal_a_computation_from_replay_events() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let input = root.join("examples/votes.jsonl");
    let config = write_config(dir.path(), "base.toml", BASE);
    let out = command()
        .args([
            "backtest",
            "--format",
            "json",
            "--lambda",
            "0.002,0.05",
            "--window",
        ])
        .arg("30,5m")
        .args([
            "--variance-threshold",
            "0.001,0.2,0.01",
            "--review-budget",
            "0.1",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--input")
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let o: Value = serde_json::from_slice(&out.stdout).unwrap();
    let grid = o["grid"].as_array().unwrap();
    assert_eq!(grid.len(), 4);
    let mut hands = Vec::new();
    for window in [30.0, 300.0] {
        for lambda in [0.002, 0.05] {
            let c = write_config(
                dir.path(),
                &format!("p-{lambda}-{window}.toml"),
                &format!(
                    "{BASE}[scoring]\nlambda = {lambda}\n[batching]\nwindow_seconds = {window}\n"
                ),
            );
            let events = common::replay(Some(&c), &input, None, false);
            let h = hand(&events, 3);
            assert!(h.n > 0, "the example scores some series twice");
            assert!(h.with_interval > 0, "coverage is defined");
            let row = grid
                .iter()
                .find(|r| r["lambda"] == json!(lambda) && r["window_seconds"] == json!(window))
                .unwrap_or_else(|| panic!("no grid row for {lambda} {window}: {grid:?}"));
            assert_eq!(row["time_unit"], "seconds");
            check_row(row, &h, &format!("λ {lambda} window {window}"));
            hands.push((lambda, window, h));
        }
    }
    // Coverage differs between the points (the example is not degenerate).
    assert!(hands.iter().any(|(_, _, h)| h.covered > 0));
    assert!(hands.iter().any(|(_, _, h)| h.covered < h.with_interval));
    // Ranked by skill, descending.
    let skills: Vec<f64> = grid.iter().filter_map(|r| r["skill"].as_f64()).collect();
    assert!(skills.windows(2).all(|w| w[0] >= w[1]), "{skills:?}");
    assert_eq!(o["best"]["lambda"], grid[0]["lambda"]);
    assert_eq!(o["best"]["window_seconds"], grid[0]["window_seconds"]);

    // Thresholds: rows per window in ascending threshold order.
    let rows = o["thresholds"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    for window in [30.0, 300.0] {
        let h = &hands.iter().find(|x| x.1 == window).unwrap().2;
        let mine: Vec<&Value> = rows
            .iter()
            .filter(|r| r["window_seconds"] == json!(window))
            .collect();
        let ts: Vec<f64> = mine
            .iter()
            .map(|r| r["variance_threshold"].as_f64().unwrap())
            .collect();
        assert_eq!(ts, vec![0.001, 0.01, 0.2]);
        let mut recommended = None;
        for r in &mine {
            let t = r["variance_threshold"].as_f64().unwrap();
            let flagged = h.variances.iter().filter(|v| **v > t).count() as u64;
            assert_eq!(r["eligible"].as_u64(), Some(h.eligible));
            assert_eq!(
                r["flagged"].as_u64(),
                Some(flagged),
                "window {window} threshold {t}"
            );
            let rate = flagged as f64 / h.all as f64;
            close(&r["flag_rate"], Some(rate), "flag_rate");
            if recommended.is_none() && rate <= 0.1 {
                recommended = Some(t);
            }
            assert_eq!(
                r["recommended"],
                json!(recommended == Some(t)),
                "window {window} threshold {t}"
            );
        }
    }
    // Steps (one day by default): each step's n per grid point.
    for step in o["steps"].as_array().unwrap() {
        let day = t_ns(step["start"].as_str().unwrap()).div_euclid(86_400 * 1_000_000_000) as i64;
        assert_eq!(
            t_ns(step["end"].as_str().unwrap()) - t_ns(step["start"].as_str().unwrap()),
            86_400 * 1_000_000_000
        );
        for r in step["grid"].as_array().unwrap() {
            let (_, _, h) = hands
                .iter()
                .find(|x| r["lambda"] == json!(x.0) && r["window_seconds"] == json!(x.1))
                .unwrap();
            assert_eq!(r["n"].as_u64(), h.per_day.get(&day).copied().or(Some(0)));
        }
    }
    let total_in_steps: u64 = o["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["grid"][0]["n"].as_u64().unwrap())
        .sum();
    assert!(total_in_steps > 0);
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let input = root.join("examples/votes.jsonl");
    for (flag, value) in [
        ("--lambda", ""),
        ("--lambda", "0.1,x"),
        ("--lambda", "-1"),
        ("--window", "5q"),
        ("--variance-threshold", ","),
        ("--time-unit", "weeks"),
        ("--review-budget", "2"),
        ("--step", "0"),
        ("--format", "yaml"),
    ] {
        let out = command()
            .arg("backtest")
            .arg("--input")
            .arg(&input)
            .arg(flag)
            .arg(value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value:?}: {stderr}");
        assert!(stderr.contains(flag), "{flag} {value:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
    assert!(bin().exists());
}

// ---- the property, through the library ----

fn time(ms: u64) -> String {
    format!(
        "2024-07-0{}T{:02}:{:02}:{:02}.{:03}Z",
        7 + ms / 86_400_000,
        (ms / 3_600_000) % 24,
        (ms / 60_000) % 60,
        (ms / 1000) % 60,
        ms % 1000
    )
}

fn any_log() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        (
            0u8..5,
            0u8..5,
            prop::sample::select(vec!["a", "b"]),
            1u64..3_000_000,
            prop_oneof![
                1 => Just(Value::Null),
                4 => (0.0f64..=1.0).prop_map(|x| json!(x)),
                2 => prop::sample::select(vec!["pass", "flag"]).prop_map(|s| json!(s)),
            ],
            prop::option::weighted(0.3, 0.2f64..3.0),
        ),
        1..120,
    )
    .prop_map(|votes| {
        let mut ms = 0;
        votes
            .into_iter()
            .map(|(inf, voter, rubric, gap, v, rep)| {
                ms += gap;
                let mut m = serde_json::Map::new();
                m.insert("inference_id".into(), json!(format!("i{inf}")));
                m.insert("voter_id".into(), json!(format!("v{voter}")));
                m.insert("voter_prompt_id".into(), json!(rubric));
                m.insert("vote".into(), v);
                m.insert("timestamp".into(), json!(time(ms)));
                if let Some(r) = rep {
                    m.insert("reputation".into(), json!(r));
                }
                Value::Object(m).to_string()
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// skill, mse and log_loss of a grid point equal those computed from
    /// the events of `replay` with that λ and window, whichever λ of the
    /// window's grid it is (the first is the engine's, the others its
    /// companions).
    #[test]
    fn a_grid_point_equals_replay_with_its_lambda_and_window(
        lines in any_log(),
        lambda in prop::sample::select(vec![0.0, 1e-5, 1e-3, 0.02, 0.5]),
        others in prop::sample::subsequence(vec![0.0, 1e-5, 1e-3, 0.02, 0.5], 0..4),
        unit in prop::sample::select(vec!["seconds", "minutes", "hours"]),
        window in prop::sample::select(vec![0.0, 1.0, 60.0, 900.0]),
        min_votes in 1u64..4,
        cache_mb in prop::sample::select(vec![0u32, 64]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("votes.jsonl");
        std::fs::write(&input, lines.join("\n") + "\n").unwrap();
        let base = format!(
            "[ambiguity]\nmin_votes = {min_votes}\n[state]\ncache_mb = {cache_mb}\n\
             [rubrics.b]\nlambda = 0.001\n"
        );
        let cfg = jurystream::config::Config::from_layers(Some(&base), &[]).unwrap();
        // λ among others, in any place of the list (duplicates allowed).
        let mut grid: Vec<f64> = others.clone();
        let at = others.len() / 2;
        grid.insert(at, lambda);
        let list: Vec<String> = grid.iter().map(|l| format!("{l}")).collect();
        let raw = jurystream::backtest::RawOptions {
            input: input.clone(),
            lambda: Some(list.join(",")),
            time_unit: Some(unit.to_owned()),
            window: Some(format!("{window}")),
            ..Default::default()
        };
        let opts = raw.resolve(&cfg).unwrap();
        let results = jurystream::backtest::run(&cfg, &opts).unwrap();
        let mut distinct = grid.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        prop_assert_eq!(results.outcome.grid.len(), distinct.len());
        let row = results
            .outcome
            .grid
            .iter()
            .find(|r| r.lambda == lambda)
            .map(|r| serde_json::to_value(r).unwrap())
            .unwrap();

        // The same λ (in that unit) and window, written in a file; the
        // rubric's own lambda keeps the configured unit (seconds).
        let text = format!(
            "[ambiguity]\nmin_votes = {min_votes}\n[state]\ncache_mb = {cache_mb}\n\
             [scoring]\nlambda = {lambda:?}\ntime_unit = \"{unit}\"\n\
             [batching]\nwindow_seconds = {window:?}\n\
             [rubrics.b]\nlambda = 0.001\ntime_unit = \"seconds\"\n"
        );
        let rcfg = jurystream::config::Config::from_layers(Some(&text), &[]).unwrap();
        let mut out = Vec::new();
        jurystream::replay::run(
            &rcfg,
            &jurystream::replay::ReplayOptions {
                input: &input,
                state_dir: None,
                keep_open: false,
                metrics: None,
                shared: None,
            },
            &mut out,
        )
        .unwrap();
        let events = parse_lines(&out);
        let h = hand(&events, min_votes);
        check_row(&row, &h, "grid point");
        let first = serde_json::to_value(&results.outcome.thresholds[0]).unwrap();
        prop_assert_eq!(&first["eligible"], &json!(h.eligible));
    }
}
