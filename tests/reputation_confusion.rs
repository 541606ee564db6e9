//! Contract §15 (model `confusion`) end to end through `replay`: the
//! worked checks' batches scored by the engine (numbers from
//! tests/reputation/confusion_reference.py, an independent reading of the
//! contract), the events' fields, `shadow` byte for byte `off`, a graded
//! batch scored as under `noise`, the split replay, and the configuration
//! errors.

mod common;

use std::path::{Path, PathBuf};

use common::{check_split, command, parse_lines, replay, replay_output, CACHE_SIZES};
use serde_json::Value;

const DAY: &str = "2024-07-07";

fn vote(item: &str, voter: &str, rubric: &str, value: &str, at: &str, extra: &str) -> String {
    format!(
        r#"{{"inference_id": "{item}", "voter_id": "{voter}", "voter_prompt_id": "{rubric}", "vote": {value}, "timestamp": "{DAY}T{at}Z", "vote_id": "{item}/{voter}"{extra}}}"#
    )
}

/// Hour 0 of the worked checks (rubric `safety`, reviewers a, b, c, l,
/// each item's votes seconds apart), an hour-1 lone pass of l (T_1
/// empty), and in hour 2 the batches of checks 3, 4 and 5 on new series.
fn votes() -> Vec<String> {
    let mut out = Vec::new();
    let items: [[u8; 4]; 5] = [
        [1, 1, 1, 1],
        [0, 0, 0, 1],
        [0, 0, 0, 1],
        [0, 0, 0, 0],
        [0, 0, 1, 1],
    ];
    for (i, item) in items.iter().enumerate() {
        for (j, (voter, v)) in ["a", "b", "c", "l"].iter().zip(item).enumerate() {
            let at = format!("00:{:02}:{:02}", 5 * i, 10 + j);
            out.push(vote(
                &format!("h0-{i}"),
                voter,
                "safety",
                &v.to_string(),
                &at,
                "",
            ));
        }
    }
    out.push(vote("h1-l", "l", "safety", "1", "01:30:10", ""));
    let hour2: [(&str, &[(&str, &str, &str)]); 6] = [
        ("x-a", &[("a", "1", "")]),
        ("x-l", &[("l", "1", "")]),
        ("x-n", &[("n", "1", "")]),
        ("x-al", &[("a", "0", ""), ("l", "1", "")]),
        (
            "x-cl",
            &[("c", "0", ""), ("l", "1", r#", "reputation": 2.0"#)],
        ),
        ("x-g", &[("a", "0.7", ""), ("l", "1", "")]),
    ];
    for (i, (item, batch)) in hour2.iter().enumerate() {
        for (j, (voter, v, extra)) in batch.iter().enumerate() {
            let at = format!("02:{:02}:{:02}", 5 * i, 10 + j);
            out.push(vote(item, voter, "safety", v, &at, extra));
        }
    }
    out
}

fn config(dir: &Path, mode: &str, model: &str) -> PathBuf {
    let path = dir.join(format!("{mode}-{model}.toml"));
    std::fs::write(
        &path,
        format!("[reputation]\nmode = \"{mode}\"\nepoch_seconds = 3600\nmodel = \"{model}\"\n"),
    )
    .unwrap();
    path
}

fn input(dir: &Path) -> PathBuf {
    let path = dir.join("votes.jsonl");
    std::fs::write(&path, votes().join("\n") + "\n").unwrap();
    path
}

fn update<'a>(events: &'a [Value], item: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["type"] == "score_updated" && e["inference_id"] == item)
        .unwrap_or_else(|| panic!("no score_updated for {item}"))
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn nums(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(num).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6
}

#[track_caller]
fn assert_near(what: &str, actual: f64, expected: f64) {
    assert!(
        close(actual, expected),
        "{what}: {actual}, expected {expected}"
    );
}

#[track_caller]
fn assert_all_near(what: &str, actual: &[f64], expected: &[f64]) {
    assert_eq!(actual.len(), expected.len(), "{what}: {actual:?}");
    for (a, e) in actual.iter().zip(expected) {
        assert_near(what, *a, *e);
    }
}

#[test]
fn worked_checks_through_replay() {
    let dir = tempfile::tempdir().unwrap();
    let votes = input(dir.path());
    let cfg = config(dir.path(), "learned", "confusion");
    for mb in CACHE_SIZES {
        let events = common::with_cache_mb(mb, || replay(Some(&cfg), &votes, None, false));
        // Hour 0 and 1: T_0, T_1 empty, so §3 exactly: weight 1, no prior.
        let h1 = update(&events, "h1-l");
        assert_eq!(h1["batch"]["model"], "confusion");
        assert_eq!(nums(&h1["batch"]["learned_weights"]), [1.0]);
        assert_eq!(h1["batch"]["prior"], Value::Null);
        assert_eq!(h1["batch"]["step"], h1["freshness"]);
        // Check 9 (check 3 with check 8's pair-fit table): lone passes of a,
        // l and n (not in the table).
        let x_a = update(&events, "x-a");
        assert_all_near(
            "x-a weights",
            &nums(&x_a["batch"]["learned_weights"]),
            &[1.544775],
        );
        assert_eq!(nums(&x_a["batch"]["counted_as"]), [1.0]);
        assert_eq!(x_a["batch"]["prior"]["value"], 0.0);
        assert_near("x-a prior", num(&x_a["batch"]["prior"]["weight"]), 0.498003);
        assert_near("x-a mean", num(&x_a["batch"]["mean_vote"]), 0.756213);
        assert_near("x-a score", num(&x_a["score"]), 0.756213);
        assert_eq!(x_a["batch"]["table_until"], format!("{DAY}T01:00:00Z"));
        let x_l = update(&events, "x-l");
        assert_near("x-l step", num(&x_l["batch"]["step"]), 0.216325);
        assert_near("x-l mean", num(&x_l["batch"]["mean_vote"]), 0.302837);
        assert_near("x-l score", num(&x_l["score"]), 0.457349);
        assert_near("x-n score", num(&update(&events, "x-n")["score"]), 0.563527);
        // Check 9 (check 4's batches): a's flag and l's pass; then c's flag
        // and l's pass at r 2.
        let x_al = update(&events, "x-al");
        assert_all_near(
            "x-al weights",
            &nums(&x_al["batch"]["learned_weights"]),
            &[1.246058, 0.216325],
        );
        assert_eq!(nums(&x_al["batch"]["counted_as"]), [0.0, 1.0]);
        assert_near("x-al variance", num(&x_al["batch"]["variance"]), 0.126044);
        assert_near("x-al mean", num(&x_al["batch"]["mean_vote"]), 0.110348);
        assert_near("x-al step", num(&x_al["batch"]["step"]), 0.731191);
        assert_near("x-al score", num(&x_al["score"]), 0.215090);
        let flag = events
            .iter()
            .find(|e| e["type"] == "ambiguity_flagged" && e["inference_id"] == "x-al")
            .expect("x-al is flagged");
        let fv = flag["votes"].as_array().unwrap();
        assert_eq!(fv[0]["counted_as"], 0.0);
        assert_near(
            "x-al l's learned_weight",
            num(&fv[1]["learned_weight"]),
            0.216325,
        );
        let x_cl = update(&events, "x-cl");
        assert_near(
            "x-cl weight_sum",
            num(&x_cl["batch"]["weight_sum"]),
            1.466004,
        );
        assert_near("x-cl mean", num(&x_cl["batch"]["mean_vote"]), 0.220290);
        assert_near("x-cl score", num(&x_cl["score"]), 0.363315);
    }
}

/// `confusion_pair_fit = false`: the same sums (pair counts included)
/// give check 2's table, from the mean, and check 3's scores.
#[test]
fn without_the_pair_fit_the_rates_come_from_the_mean() {
    let dir = tempfile::tempdir().unwrap();
    let votes = input(dir.path());
    let cfg = dir.path().join("no-pair-fit.toml");
    std::fs::write(
        &cfg,
        "[reputation]\nmode = \"learned\"\nepoch_seconds = 3600\nmodel = \"confusion\"\nconfusion_pair_fit = false\n",
    )
    .unwrap();
    let events = replay(Some(&cfg), &votes, None, false);
    let x_a = update(&events, "x-a");
    assert_all_near(
        "x-a weights",
        &nums(&x_a["batch"]["learned_weights"]),
        &[1.601354],
    );
    assert_near("x-a prior", num(&x_a["batch"]["prior"]["weight"]), 0.478061);
    assert_near("x-a score", num(&x_a["score"]), 0.770098);
    assert_near("x-l score", num(&update(&events, "x-l")["score"]), 0.514736);
    assert_near(
        "x-al score",
        num(&update(&events, "x-al")["score"]),
        0.355591,
    );
    assert_near(
        "x-cl score",
        num(&update(&events, "x-cl")["score"]),
        0.452306,
    );
}

/// Check 5: a batch with a graded value scores as under `noise` (the same
/// numbers bit for bit), with the model's fields and no prior.
#[test]
fn a_graded_batch_scores_as_under_noise() {
    let dir = tempfile::tempdir().unwrap();
    let votes = input(dir.path());
    let confusion = replay(
        Some(&config(dir.path(), "learned", "confusion")),
        &votes,
        None,
        false,
    );
    let noise = replay(
        Some(&config(dir.path(), "learned", "noise")),
        &votes,
        None,
        false,
    );
    let (c, n) = (update(&confusion, "x-g"), update(&noise, "x-g"));
    for field in ["score", "alpha"] {
        assert_eq!(c[field], n[field], "{field}");
    }
    for field in [
        "learned_weights",
        "step",
        "weight_sum",
        "mean_vote",
        "aggregate",
        "variance",
    ] {
        assert_eq!(c["batch"][field], n["batch"][field], "batch.{field}");
    }
    assert_eq!(nums(&c["batch"]["counted_as"]), [0.7, 1.0]);
    assert_eq!(c["batch"]["prior"], Value::Null);
    assert!(
        n["batch"].get("model").is_none(),
        "a noise rubric's events have no model"
    );
}

fn without_processed_at(events: Vec<Value>) -> Vec<Value> {
    events
        .into_iter()
        .map(|mut e| {
            e.as_object_mut().unwrap().remove("processed_at");
            e
        })
        .collect()
}

/// `shadow` under `confusion` prints what `off` prints; a rubric override
/// picks the model per rubric.
#[test]
fn shadow_is_off_and_the_model_is_per_rubric() {
    let dir = tempfile::tempdir().unwrap();
    let votes = input(dir.path());
    let off = without_processed_at(replay(
        Some(&config(dir.path(), "off", "noise")),
        &votes,
        None,
        false,
    ));
    let shadow = without_processed_at(replay(
        Some(&config(dir.path(), "shadow", "confusion")),
        &votes,
        None,
        false,
    ));
    assert_eq!(off, shadow);
    // The default model noise, `safety` overridden: the same as model
    // confusion for all.
    let per_rubric = dir.path().join("per-rubric.toml");
    std::fs::write(
        &per_rubric,
        "[reputation]\nmode = \"learned\"\nepoch_seconds = 3600\n\n[rubrics.safety]\nreputation_model = \"confusion\"\n",
    )
    .unwrap();
    let all = without_processed_at(replay(
        Some(&config(dir.path(), "learned", "confusion")),
        &votes,
        None,
        false,
    ));
    assert_eq!(
        without_processed_at(replay(Some(&per_rubric), &votes, None, false)),
        all
    );
}

#[test]
fn a_split_replay_equals_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let votes = input(dir.path());
    let cfg = config(dir.path(), "learned", "confusion");
    let whole = replay(Some(&cfg), &votes, None, false);
    let text = std::fs::read(&votes).unwrap();
    let lines: Vec<&[u8]> = text.split_inclusive(|&b| b == b'\n').collect();
    for k in [10, 21, 24] {
        let work = dir.path().join(format!("split-{k}"));
        std::fs::create_dir_all(&work).unwrap();
        check_split(Some(&cfg), &lines, k, &whole, &work)
            .unwrap_or_else(|e| panic!("split after line {k}: {e}"));
    }
}

/// Bad configuration is refused at start (exit status 2) naming the key.
#[test]
fn bad_configuration_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let votes = input(dir.path());
    let cases = [
        ("[reputation]\nmodel = \"dawid\"\n", "reputation.model"),
        (
            "[rubrics.safety]\nreputation_model = \"coin\"\n",
            "rubrics.safety.reputation_model",
        ),
        (
            "[reputation]\nconfusion_prior_votes = 3\n",
            "reputation.confusion_prior_votes",
        ),
        (
            "[reputation]\nmodel = \"confusion\"\nconfusion_rate_floor = 0.5\n",
            "reputation.confusion_rate_floor",
        ),
        (
            "[reputation]\nmodel = \"confusion\"\nconfusion_max_weight = 0.5\n",
            "reputation.confusion_max_weight",
        ),
        (
            "[reputation]\nmodel = \"confusion\"\nconfusion_prior_votes = -1\n",
            "reputation.confusion_prior_votes",
        ),
        (
            "[reputation]\nconfusion_pair_fit = false\n",
            "reputation.confusion_pair_fit",
        ),
        (
            "[reputation]\nmodel = \"confusion\"\nconfusion_pair_fit = \"no\"\n",
            "confusion_pair_fit",
        ),
    ];
    for (i, (toml, key)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.toml"));
        std::fs::write(&path, toml).unwrap();
        let out = replay_output(Some(&path), &votes, None, false);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}: {stderr}");
        assert!(stderr.contains(key), "{toml}: {stderr} does not name {key}");
        assert!(parse_lines(&out.stdout).is_empty());
    }
    // The option is accepted when some rubric uses the model, and from the
    // environment.
    let ok = dir.path().join("ok.toml");
    std::fs::write(
        &ok,
        "[reputation]\nconfusion_max_weight = 4\n\n[rubrics.safety]\nreputation_model = \"confusion\"\n",
    )
    .unwrap();
    assert!(replay_output(Some(&ok), &votes, None, false)
        .status
        .success());
    let out = command()
        .args(["replay", "--input"])
        .arg(&votes)
        .env("JURYSTREAM_REPUTATION__MODEL", "confusion")
        .env("JURYSTREAM_REPUTATION__CONFUSION_RATE_FLOOR", "0.7")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("JURYSTREAM_REPUTATION__CONFUSION_RATE_FLOOR"));
}

/// The `reputation` command shows both models side by side (check 2's
/// table over hour 0 alone).
#[test]
fn the_reputation_command_shows_both_models() {
    let dir = tempfile::tempdir().unwrap();
    let hour0: Vec<String> = votes().into_iter().take(20).collect();
    let path = dir.path().join("hour0.jsonl");
    std::fs::write(&path, hour0.join("\n") + "\n").unwrap();
    for model in ["noise", "confusion"] {
        let cfg = config(dir.path(), "off", model);
        let out = command()
            .args(["reputation", "--format", "json", "--config"])
            .arg(&cfg)
            .arg("--input")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let rubric = &doc["rubrics"][0];
        assert_eq!(rubric["model"], model);
        assert_eq!(rubric["rates_from"], "pairs");
        assert_near("base_rate", num(&rubric["base_rate"]), 0.223710);
        assert_near("evidence_scale", num(&rubric["evidence_scale"]), 1.906787);
        assert_near("prior_weight", num(&rubric["prior_weight"]), -0.498003);
        let voter = |id: &str| {
            doc["voters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["voter_id"] == id)
                .unwrap()
                .clone()
        };
        let (a, l) = (voter("a"), voter("l"));
        assert_eq!(a["confusion_votes"], 5);
        assert_near("a sensitivity", num(&a["sensitivity"]), 0.911529);
        assert_near("a pass_weight", num(&a["pass_weight"]), 1.544775);
        assert_near("l pass_weight", num(&l["pass_weight"]), 0.216325);
        assert_near("l flag_weight", num(&l["flag_weight"]), 0.435603);
        assert!(a["weight"].is_number(), "§14's ω stays");
    }
}
