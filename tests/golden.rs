//! Golden cases: `tests/golden/<case>/{config.toml,input.jsonl,expected.jsonl}`.
//!
//! Each case is small enough to check by hand; every expected file was also
//! checked against the independent Python model `tests/golden/reference.py`
//! (`python3 tests/golden/reference.py --all`, also run below when a Python
//! 3.11+ is present). For each case:
//!
//! 1. `jurystream replay --config config.toml --input input.jsonl` prints
//!    `expected.jsonl`, in order (`processed_at` ignored, numbers within
//!    1e-9, times as instants, derived vote ids by count, `detail` only
//!    non-empty);
//! 2. the input split after every line — the first part with
//!    `--state-dir D --keep-open`, the rest with `--state-dir D` — prints
//!    the same events (contract §6), `source.line` aside.
//!
//! `GOLDEN_BLESS=1 cargo test --test golden` rewrites the expected files
//! from the binary's output; check them with reference.py before committing.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn run_case(name: &str) {
    for mb in CACHE_SIZES {
        with_cache_mb(mb, || run_case_with(name, mb));
    }
}

fn run_case_with(name: &str, cache_mb: Option<u32>) {
    let dir = golden_dir().join(name);
    let name = &format!("{name} (state.cache_mb {cache_mb:?})");
    let config = dir.join("config.toml");
    let input = dir.join("input.jsonl");
    let expected_path = dir.join("expected.jsonl");
    let actual = replay(Some(&config), &input, None, false);
    if std::env::var_os("GOLDEN_BLESS").is_some() {
        let text: String = actual.iter().map(|v| format!("{v}\n")).collect();
        std::fs::write(&expected_path, text).unwrap();
    }
    let expected = parse_lines(&std::fs::read(&expected_path).unwrap());
    assert!(!expected.is_empty(), "{name}: expected.jsonl is empty");
    assert_same_events(
        &format!("golden case {name}"),
        &expected,
        &actual,
        CompareOptions::default(),
    );

    // The same input in two parts, cut after every line (0 and n included).
    let data = std::fs::read(&input).unwrap();
    let lines = physical_lines(&data);
    let work = tempfile::tempdir().unwrap();
    let failures: Vec<String> = (0..=lines.len())
        .filter_map(|k| check_split(Some(&config), &lines, k, &actual, work.path()).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{name}: {} of {} splits differ from the whole replay:\n  {}",
        failures.len(),
        lines.len() + 1,
        failures.join("\n  ")
    );
}

macro_rules! golden {
    ($($name:ident),* $(,)?) => {
        const CASES: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                run_case(stringify!($name));
            }
        )*
    };
}

golden!(
    default_prompt,
    duplicates,
    inference_time,
    late_grace,
    max_votes,
    power_mean,
    rejections,
    retention,
    rubrics,
    supersede,
    time_units,
    values,
    w0,
);

#[test]
fn every_case_directory_is_listed() {
    let mut found: Vec<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            p.join("config.toml")
                .is_file()
                .then(|| p.file_name().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    found.sort();
    let mut listed: Vec<String> = CASES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "add new case directories to golden!(...)");
}

/// The expected files agree with the independent Python model of the
/// contract. Skipped (with a note) without a Python 3.11+ (tomllib),
/// unless JURYSTREAM_REQUIRE_BROKER=1 (then it fails).
#[test]
fn reference_model_agrees_with_expected_files() {
    let script = golden_dir().join("reference.py");
    let probe = std::process::Command::new("python3")
        .args(["-c", "import tomllib"])
        .output();
    if !matches!(probe, Ok(ref o) if o.status.success()) {
        return skip_or_fail(
            "python3 with tomllib (Python 3.11+) not found: the reference model check cannot run",
            "scripts/install-deps.sh installs python3",
        );
    }
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg("--all")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reference.py disagrees with expected files:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn comparator_reads_times_and_tolerates_only_what_it_should() {
    assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_utc("1970-01-01T00:00:01.5Z"), Some(1_500_000_000));
    assert_eq!(
        parse_utc("2024-07-07T00:00:00.000000001+00:00"),
        Some(1_720_310_400_000_000_001)
    );
    assert_eq!(parse_utc("2024-07-07T00:00:00+01:00"), None);
    assert_eq!(parse_utc("2024-07-07 00:00:00Z"), None);

    let e: serde_json::Value = serde_json::json!({
        "type": "score_updated", "processed_at": "x", "score": 0.5,
        "batch": {"last_vote_at": "2024-01-01T00:00:00Z", "vote_ids": ["derived:1"]}
    });
    let same = serde_json::json!({
        "type": "score_updated", "processed_at": "y", "score": 0.5000000000001,
        "batch": {"last_vote_at": "2024-01-01T00:00:00.000Z", "vote_ids": ["derived:2"]}
    });
    assert!(
        compare_events(std::slice::from_ref(&e), &[same], CompareOptions::default()).is_empty()
    );
    let off = serde_json::json!({
        "type": "score_updated", "processed_at": "y", "score": 0.5001,
        "batch": {"last_vote_at": "2024-01-01T00:00:00Z", "vote_ids": ["derived:1"]}
    });
    assert_eq!(
        compare_events(&[e], &[off], CompareOptions::default()).len(),
        1
    );
}
