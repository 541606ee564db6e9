//! The quick-start example and the README stay true: `examples/votes.jsonl`
//! with `config/example.toml` replays cleanly, the README's sample events
//! are what that replay prints, the README's configuration table names
//! every key of `config/default.toml`, and configuration errors end the
//! program as the README says (exit status 2, the key or the variable).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn example_events() -> Vec<Value> {
    replay(
        Some(&root().join("config/example.toml")),
        &root().join("examples/votes.jsonl"),
        None,
        false,
    )
}

#[test]
fn the_example_replays_with_scores_flags_and_rejections() {
    let text = std::fs::read_to_string(root().join("config/example.toml")).unwrap();
    jurystream::config::Config::from_layers(Some(&text), &[]).expect("example config is valid");
    let events = example_events();
    let of = |t: &'static str| events.iter().filter(move |e| e["type"] == t);
    let rubrics: BTreeSet<&str> = of("score_updated")
        .map(|e| e["voter_prompt_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        rubrics.into_iter().collect::<Vec<_>>(),
        ["accuracy", "helpfulness", "safety"]
    );
    for e in of("score_updated") {
        let s = e["score"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&s), "{e}");
    }
    assert!(of("ambiguity_flagged").count() >= 1);
    let reasons: BTreeSet<&str> = of("vote_rejected")
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons.into_iter().collect::<Vec<_>>(),
        [
            "invalid_timestamp",
            "late",
            "malformed_json",
            "missing_field"
        ]
    );
    let inferences: BTreeSet<&str> = of("score_updated")
        .map(|e| e["inference_id"].as_str().unwrap())
        .collect();
    assert_eq!(inferences.len(), 20);
    let superseded: u64 = of("score_updated")
        .map(|e| e["batch"]["superseded"].as_u64().unwrap())
        .sum();
    assert_eq!(superseded, 1, "the example has one re-vote");
}

/// The ```json blocks of a Markdown file.
fn json_blocks(md: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut block: Option<String> = None;
    for line in md.lines() {
        match (&mut block, line.trim_end()) {
            (None, "```json") => block = Some(String::new()),
            (Some(b), "```") => {
                out.push(
                    serde_json::from_str(b).unwrap_or_else(|e| panic!("README json: {e}\n{b}")),
                );
                block = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            _ => {}
        }
    }
    out
}

#[test]
fn readme_quick_start_is_what_the_example_prints() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    // The first command works alone: it installs what the build needs.
    assert!(readme.contains(
        "\nscripts/install-deps.sh --build && cargo run --release -- replay --config config/example.toml --input examples/votes.jsonl\n"
    ));
    assert!(readme.contains("scripts/test.sh"));
    let samples = json_blocks(&readme);
    assert!(samples.len() >= 2, "README shows sample events");
    let events = example_events();
    for s in &samples {
        let found = events
            .iter()
            .find(|e| {
                e["type"] == s["type"]
                    && e["inference_id"] == s["inference_id"]
                    && e["voter_prompt_id"] == s["voter_prompt_id"]
                    && e["update_seq"] == s["update_seq"]
            })
            .unwrap_or_else(|| panic!("README sample not in the replay: {s}"));
        assert_same_events(
            "README sample event",
            std::slice::from_ref(s),
            std::slice::from_ref(found),
            CompareOptions::default(),
        );
    }
}

fn keys(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) if prefix.is_empty() => keys(&name, t, out),
            _ => out.push(name),
        }
    }
}

#[test]
fn readme_configuration_table_names_every_default_key() {
    let defaults: toml::Table =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml"))
            .unwrap()
            .parse()
            .unwrap();
    let mut all = Vec::new();
    keys("", &defaults, &mut all);
    // Keys default.toml only shows commented out.
    all.push("input.default_voter_prompt_id".into());
    all.push("kafka.commit_interval_ms".into());
    for k in [
        "aggregator",
        "temperature",
        "lambda",
        "time_unit",
        "variance_threshold",
    ] {
        all.push(format!("rubrics.<voter_prompt_id>.{k}"));
    }
    assert!(all.len() > 35, "{all:?}");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let missing: Vec<&String> = all
        .iter()
        .filter(|k| !readme.contains(&format!("| `{k}` |")))
        .collect();
    assert!(missing.is_empty(), "README lacks rows for {missing:?}");
}

/// Runs `replay` of the example with `env` set and returns (status, stderr, stdout).
fn replay_with_env(config: Option<&Path>, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut c = command();
    c.arg("replay")
        .arg("--input")
        .arg(root().join("examples/votes.jsonl"));
    if let Some(p) = config {
        c.arg("--config").arg(p);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("cannot run jurystream");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn configuration_errors_exit_2_naming_the_variable_or_the_key() {
    let (code, err, out) = replay_with_env(None, &[("JURYSTREAM_BATCHING__WINDOW_SECS", "5")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("configuration error: JURYSTREAM_BATCHING__WINDOW_SECS: unknown key"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    let (code, err, _) = replay_with_env(None, &[("JURYSTREAM_SCORING__LAMBDA", "-1")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("JURYSTREAM_SCORING__LAMBDA"), "{err}");
    let (code, err, _) =
        replay_with_env(None, &[("JURYSTREAM_BATCHING__IDLE_FLUSH_SECONDS", "1e20")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("JURYSTREAM_BATCHING__IDLE_FLUSH_SECONDS"),
        "{err}"
    );
    // From the file: the key path, no variable.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[kafka]\ndelivery = \"twice\"\n").unwrap();
    let (code, err, _) = replay_with_env(Some(&file), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(r#"kafka.delivery: must be "exactly_once", "exactly_once_outbox" or "at_least_once", got "twice""#),
        "{err}"
    );
    assert!(!err.contains("JURYSTREAM_"), "{err}");
}
