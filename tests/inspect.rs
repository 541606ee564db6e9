//! `jurystream inspect` over a replay's `--state-dir` (contract §6), and
//! `--help` on every command.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use serde_json::Value;

fn inspect(state: &Path, inference: &str) -> Value {
    inspect_with(state, inference, None)
}

fn inspect_with(state: &Path, inference: &str, config: Option<&Path>) -> Value {
    let mut cmd = command();
    cmd.args(["inspect", "--state-dir"])
        .arg(state)
        .args(["--inference", inference]);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "inspect exited {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("inspect prints one JSON document")
}

/// The last score_updated of every series, by (inference_id, voter_prompt_id).
fn last_updates(events: &[Value]) -> BTreeMap<(String, String), Value> {
    let mut last = BTreeMap::new();
    for e in events.iter().filter(|e| e["type"] == "score_updated") {
        let key = (
            e["inference_id"].as_str().unwrap().to_owned(),
            e["voter_prompt_id"].as_str().unwrap().to_owned(),
        );
        last.insert(key, e.clone());
    }
    last
}

#[test]
fn inspect_shows_the_last_score_of_every_series() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    // Several series per inference, integer ids, several updates per series.
    for case in ["max_votes", "time_units", "duplicates", "power_mean"] {
        let dir = golden.join(case);
        let state = tempfile::tempdir().unwrap();
        let events = replay(
            Some(&dir.join("config.toml")),
            &dir.join("input.jsonl"),
            Some(state.path()),
            false,
        );
        let last = last_updates(&events);
        assert!(!last.is_empty());
        let inferences: std::collections::BTreeSet<&String> = last.keys().map(|k| &k.0).collect();
        for inf in inferences {
            let doc = inspect_with(state.path(), inf, Some(&dir.join("config.toml")));
            assert_eq!(doc["inference_id"], inf.as_str());
            assert_eq!(doc["open_batches"], serde_json::json!([]), "{case}/{inf}");
            let series = doc["series"].as_array().unwrap();
            let want: Vec<_> = last.iter().filter(|(k, _)| &k.0 == inf).collect();
            assert_eq!(series.len(), want.len(), "{case}/{inf}: {doc}");
            for ((_, prompt), ev) in want {
                let s = series
                    .iter()
                    .find(|s| s["voter_prompt_id"] == prompt.as_str())
                    .unwrap_or_else(|| panic!("{case}/{inf}/{prompt} missing: {doc}"));
                assert_eq!(s["inference_id"], inf.as_str());
                assert_eq!(
                    s["score"].as_f64(),
                    ev["score"].as_f64(),
                    "{case}/{inf}/{prompt}"
                );
                assert_eq!(s["update_seq"], ev["update_seq"], "{case}/{inf}/{prompt}");
                // contract §13, from the stored V and Q: the last event's.
                for k in ["effective_votes", "score_interval"] {
                    assert!(!ev[k].is_null(), "{case}/{inf}/{prompt}: {k}");
                    assert_eq!(s[k], ev[k], "{case}/{inf}/{prompt}: {k}");
                }
                assert_eq!(s["model_id"], ev["model_id"], "{case}/{inf}/{prompt}");
                assert_eq!(
                    parse_utc(s["last_vote_at"].as_str().unwrap()),
                    parse_utc(ev["batch"]["last_vote_at"].as_str().unwrap()),
                    "{case}/{inf}/{prompt}"
                );
            }
        }
    }
}

#[test]
fn inspect_shows_open_batches_after_keep_open_and_nothing_for_unknown_ids() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/supersede");
    let state = tempfile::tempdir().unwrap();
    let events = replay(
        Some(&dir.join("config.toml")),
        &dir.join("input.jsonl"),
        Some(state.path()),
        true,
    );
    // Only the 09:00 window closed; the 09:01 batches stay open.
    let last = last_updates(&events);
    assert_eq!(last.len(), 1);
    let doc = inspect(state.path(), "doc-1");
    let s = &doc["series"][0];
    assert_eq!(s["update_seq"], 1);
    assert_eq!(
        s["score"].as_f64(),
        last[&("doc-1".into(), "helpful".into())]["score"].as_f64()
    );
    let open = doc["open_batches"].as_array().unwrap();
    assert_eq!(open.len(), 1, "{doc}");
    assert_eq!(open[0]["voter_prompt_id"], "helpful");
    // a5, u7's later vote and g1 count; a4, f1 and u7's first were replaced.
    assert_eq!(open[0]["counted"], 3, "{doc}");
    // doc-2 has a series (abstentions only, then an open batch) but no update.
    let doc2 = inspect(state.path(), "doc-2");
    assert_eq!(doc2["series"][0]["update_seq"], 0, "{doc2}");
    let none = inspect(state.path(), "no-such-inference");
    assert_eq!(none["series"], serde_json::json!([]));
}

#[test]
fn help_on_every_command_exits_zero() {
    for (args, needles) in [
        (
            vec!["--help"],
            vec!["replay", "run", "inspect", "produce", "consume"],
        ),
        (
            vec!["replay", "--help"],
            vec!["--config", "--input", "--state-dir", "--keep-open"],
        ),
        (
            vec!["inspect", "--help"],
            vec!["--state-dir", "--inference"],
        ),
        (vec!["run", "--help"], vec!["--config"]),
        (vec!["produce", "--help"], vec!["--input", "--topic"]),
        (vec!["consume", "--help"], vec!["--topic", "--brokers"]),
    ] {
        let out = command().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        for n in needles {
            assert!(text.contains(n), "{args:?} help lacks {n}:\n{text}");
        }
    }
}
