//! Quality of learned reviewer reputation (contract §14, "Quality"),
//! on vote logs with planted reviewers (`tests/reputation/gen_population.py`:
//! honest, noisy, spammers, adversaries, a principled minority, and a
//! reviewer with one dissent on a near-unanimous rubric) in two shapes:
//!
//! - compact sessions: an item's reviews within seconds, one batch per
//!   series; hour-long epochs (`epoch_seconds = 3600`), two days;
//! - Label Studio-like spread: an item's reviews 15 min to 3 h apart, each
//!   batch one vote; day-long epochs (the default), five days.
//!
//! Each log is replayed in modes `off` and `learned`, and `jurystream
//! reputation --format json` gives the final weights. Checked, for three
//! seeds per shape: every spammer and adversary ends below every other
//! reviewer in every rubric; the minority ≥ 0.5 and above every spammer;
//! the one-off dissenter ≥ 0.5; `learned` raises at most 1.05 × `off`'s
//! flags; the mean squared error of the series' final scores against the
//! planted truth falls by the factors of the issue. `shadow` prints what
//! `off` prints, byte for byte but `processed_at`. And the weights rank
//! reviewers as crowd-kit's OneCoinDawidSkene and GLAD do (Spearman ≥ 0.5;
//! needs `scripts/crowdkit.sh install`). The measured numbers are printed
//! (`cargo test --test reputation_quality -- --nocapture`) and quoted in
//! docs/testing.md.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{command, parse_lines, parse_utc, prerequisites_required, skip_or_fail};
use serde_json::Value;

#[derive(Clone, Copy, Debug)]
struct Shape {
    name: &'static str,
    days: u32,
    items_per_day: u32,
    epoch_seconds: u64,
}

const COMPACT: Shape = Shape {
    name: "compact",
    days: 2,
    items_per_day: 400,
    epoch_seconds: 3600,
};

const SPREAD: Shape = Shape {
    name: "spread",
    days: 5,
    items_per_day: 150,
    epoch_seconds: 86_400,
};

const SEEDS: [u64; 3] = [1, 2, 3];

/// The rubrics every planted role reviews (`format` is the near-unanimous
/// one, reviewed by the honest and one-off reviewers only).
const MAIN_RUBRICS: [&str; 3] = ["helpfulness", "safety", "tone"];

type Series = (String, String);

struct Population {
    dir: tempfile::TempDir,
    votes: PathBuf,
    truth: BTreeMap<Series, f64>,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python3_available() -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_or_fail(
            "python3 not found: the planted population cannot be generated",
            "scripts/install-deps.sh installs python3",
        );
    }
    ok
}

/// The planted population of `shape` for `seed`, in a fresh directory.
fn generate(shape: Shape, seed: u64) -> Population {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(root().join("tests/reputation/gen_population.py"))
        .args(["--shape", shape.name, "--seed", &seed.to_string()])
        .args(["--days", &shape.days.to_string()])
        .args(["--items-per-day", &shape.items_per_day.to_string()])
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "gen_population.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let truth: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("truth.json")).unwrap()).unwrap();
    let truth = truth["series"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let (id, rubric) = k.split_once('\t').unwrap();
            ((id.to_string(), rubric.to_string()), v.as_f64().unwrap())
        })
        .collect();
    let votes = dir.path().join("votes.jsonl");
    Population { dir, votes, truth }
}

/// A configuration file for `mode`, with the shape's epochs (batching at
/// its defaults: 60 s windows, 5 s grace).
fn config(p: &Population, shape: Shape, mode: &str) -> PathBuf {
    let path = p.dir.path().join(format!("{mode}.toml"));
    std::fs::write(
        &path,
        format!(
            "[reputation]\nmode = \"{mode}\"\nepoch_seconds = {}\n",
            shape.epoch_seconds
        ),
    )
    .unwrap();
    path
}

/// `jurystream replay`'s stdout, asserting exit status 0.
fn replay_stdout(p: &Population, shape: Shape, mode: &str) -> Vec<u8> {
    let out = command()
        .arg("replay")
        .arg("--config")
        .arg(config(p, shape, mode))
        .arg("--input")
        .arg(&p.votes)
        .output()
        .expect("run jurystream replay");
    assert!(
        out.status.success(),
        "replay ({mode}) exited {:?}:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `jurystream reputation --format json` over the population (learned
/// mode's configuration: the weights do not depend on the mode).
fn reputation(p: &Population, shape: Shape) -> Value {
    let out = command()
        .arg("reputation")
        .arg("--config")
        .arg(config(p, shape, "learned"))
        .arg("--input")
        .arg(&p.votes)
        .args(["--format", "json"])
        .output()
        .expect("run jurystream reputation");
    assert!(
        out.status.success(),
        "reputation exited {:?}:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("reputation --format json is one JSON object")
}

/// What a replay ends with: each series' last `score_updated` event, the
/// number of `score_updated` events per series, and the
/// `ambiguity_flagged` count.
struct Run {
    last: BTreeMap<Series, Value>,
    updates: BTreeMap<Series, usize>,
    flags: usize,
}

fn summarise(events: &[Value]) -> Run {
    let mut run = Run {
        last: BTreeMap::new(),
        updates: BTreeMap::new(),
        flags: 0,
    };
    for e in events {
        match e["type"].as_str().unwrap() {
            "score_updated" => {
                let key = (
                    e["inference_id"].as_str().unwrap().to_string(),
                    e["voter_prompt_id"].as_str().unwrap().to_string(),
                );
                *run.updates.entry(key.clone()).or_default() += 1;
                run.last.insert(key, e.clone());
            }
            "ambiguity_flagged" => run.flags += 1,
            // Redeliveries are duplicates (contract §4), which emit nothing;
            // the generator writes no other kind of bad line.
            other => panic!("unexpected event {other}: {e}"),
        }
    }
    run
}

fn mse(keys: &[&Series], run: &Run, truth: &BTreeMap<Series, f64>) -> f64 {
    let sum: f64 = keys
        .iter()
        .map(|k| {
            let s = run.last[*k]["score"].as_f64().unwrap();
            (s - truth[*k]).powi(2)
        })
        .sum();
    sum / keys.len() as f64
}

fn role(voter: &str) -> &str {
    voter.split('-').next().unwrap()
}

/// Checks the final weights of `jurystream reputation` and returns a line
/// describing them.
fn check_weights(what: &str, rep: &Value) -> String {
    let mut by_rubric: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for v in rep["voters"].as_array().unwrap() {
        by_rubric
            .entry(v["voter_prompt_id"].as_str().unwrap().to_string())
            .or_default()
            .push((
                v["voter_id"].as_str().unwrap().to_string(),
                v["weight"].as_f64().unwrap(),
            ));
    }
    let mut notes = Vec::new();
    for rubric in MAIN_RUBRICS {
        let rows = by_rubric
            .get(rubric)
            .unwrap_or_else(|| panic!("{what}: no weights for {rubric}"));
        let roles: BTreeSet<&str> = rows.iter().map(|(v, _)| role(v)).collect();
        for r in [
            "honest",
            "noisy",
            "spammer",
            "adversary",
            "minority",
            "oneoff",
        ] {
            assert!(
                roles.contains(r),
                "{what}: no {r} reviewer rated on {rubric}"
            );
        }
        let bad = |v: &str| matches!(role(v), "spammer" | "adversary");
        let (worst_good, worst_good_w) = rows
            .iter()
            .filter(|(v, _)| !bad(v))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        let (best_bad, best_bad_w) = rows
            .iter()
            .filter(|(v, _)| bad(v))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        assert!(
            best_bad_w < worst_good_w,
            "{what}, {rubric}: {best_bad} weighs {best_bad_w}, not below {worst_good} ({worst_good_w}); \
             every spammer and adversary must end with the lowest weights: {rows:?}"
        );
        let best_spammer = rows
            .iter()
            .filter(|(v, _)| role(v) == "spammer")
            .map(|(_, w)| *w)
            .fold(f64::MIN, f64::max);
        let minority: Vec<f64> = rows
            .iter()
            .filter(|(v, _)| role(v) == "minority")
            .map(|(_, w)| *w)
            .collect();
        for (v, w) in rows.iter().filter(|(v, _)| role(v) == "minority") {
            assert!(
                *w >= 0.5 && *w > best_spammer,
                "{what}, {rubric}: the principled minority {v} weighs {w} \
                 (must be >= 0.5 and above every spammer, best {best_spammer})"
            );
        }
        let lowest = rows.iter().map(|(_, w)| *w).fold(f64::MAX, f64::min);
        notes.push(format!(
            "{rubric}: spammers/adversaries {lowest:.3}..{best_bad_w:.3} < others from {worst_good_w:.3}, \
             minority {}",
            minority
                .iter()
                .map(|w| format!("{w:.3}"))
                .collect::<Vec<_>>()
                .join("/")
        ));
    }
    // The near-unanimous rubric and its one dissenter.
    let format = rep["rubrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["voter_prompt_id"] == "format")
        .unwrap_or_else(|| panic!("{what}: no rubric format"));
    let msd = format["mean_sq_deviation"].as_f64().unwrap();
    assert!(
        msd > 0.0 && msd < 0.01,
        "{what}: format should be near-unanimous (mean_sq_deviation {msd})"
    );
    let oneoff: Vec<f64> = by_rubric["format"]
        .iter()
        .filter(|(v, _)| role(v) == "oneoff")
        .map(|(_, w)| *w)
        .collect();
    assert!(
        !oneoff.is_empty(),
        "{what}: the one-off dissenter has no weight on format"
    );
    for w in &oneoff {
        assert!(
            *w >= 0.5,
            "{what}: one disagreement on a near-unanimous rubric costs the one-off reviewer \
             too much: weight {w} < 0.5"
        );
    }
    notes.push(format!("format: one dissent -> {:.3}", oneoff[0]));
    notes.join("; ")
}

/// Measured quality of one population.
struct Measured {
    ratio_all: f64,
    ratio_tabled: f64,
    tabled: usize,
    series: usize,
    flags_off: usize,
    flags_learned: usize,
}

/// Replays `off` and `learned`, checks the weights, and measures.
fn measure(shape: Shape, seed: u64) -> Measured {
    let what = format!("{} seed {seed}", shape.name);
    let p = generate(shape, seed);
    let off = summarise(&parse_lines(&replay_stdout(&p, shape, "off")));
    let learned = summarise(&parse_lines(&replay_stdout(&p, shape, "learned")));

    // The shape is what it claims to be.
    assert_eq!(
        off.last.keys().collect::<Vec<_>>(),
        learned.last.keys().collect::<Vec<_>>(),
        "{what}: off and learned scored different series"
    );
    for k in off.last.keys() {
        assert!(
            p.truth.contains_key(k),
            "{what}: series {k:?} has no planted truth"
        );
    }
    assert!(
        off.last.len() * 100 >= p.truth.len() * 99,
        "{what}: only {} of {} series scored",
        off.last.len(),
        p.truth.len()
    );
    match shape.name {
        "compact" => assert!(
            off.updates.values().all(|&n| n == 1),
            "{what}: a compact session should be one batch per series"
        ),
        _ => assert!(
            learned
                .last
                .values()
                .all(|e| e["batch"]["votes"].as_u64() == Some(1)),
            "{what}: every batch of the spread shape should hold one vote"
        ),
    }

    // Weights.
    let weights = check_weights(&what, &reputation(&p, shape));

    // Flags.
    assert!(
        learned.flags as f64 <= 1.05 * off.flags as f64,
        "{what}: learned raised {} flags, more than 1.05 x off's {}",
        learned.flags,
        off.flags
    );

    // Scores against the planted truth. A series is scored with a table
    // when its last batch's table holds an epoch with votes: its
    // `table_until` ((k − 1)·E for a batch of epoch k) is at least the end
    // of the first epoch of the data.
    let e_ns = shape.epoch_seconds as i128 * 1_000_000_000;
    let first = learned
        .last
        .values()
        .map(|e| parse_utc(e["batch"]["window_start"].as_str().unwrap()).unwrap())
        .min()
        .unwrap();
    let first_epoch_end = (first.div_euclid(e_ns) + 1) * e_ns;
    let keys: Vec<&Series> = off.last.keys().collect();
    let tabled: Vec<&Series> = keys
        .iter()
        .copied()
        .filter(|k| {
            let until = learned.last[*k]["batch"]["table_until"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: learned event without table_until"));
            parse_utc(until).unwrap() >= first_epoch_end
        })
        .collect();
    assert!(
        tabled.len() * 2 >= keys.len(),
        "{what}: only {} of {} series were scored with a table",
        tabled.len(),
        keys.len()
    );
    // Those series did see learned weights other than 1.
    assert!(
        tabled
            .iter()
            .any(|k| learned.last[*k]["batch"]["learned_weights"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_f64() != Some(1.0))),
        "{what}: no series scored with a table got a learned weight other than 1"
    );
    let (off_all, learned_all) = (mse(&keys, &off, &p.truth), mse(&keys, &learned, &p.truth));
    let (off_tab, learned_tab) = (
        mse(&tabled, &off, &p.truth),
        mse(&tabled, &learned, &p.truth),
    );
    let m = Measured {
        ratio_all: off_all / learned_all,
        ratio_tabled: off_tab / learned_tab,
        tabled: tabled.len(),
        series: keys.len(),
        flags_off: off.flags,
        flags_learned: learned.flags,
    };
    eprintln!(
        "{what}: MSE off {off_all:.4} learned {learned_all:.4}, off/learned {:.3} over {} series, \
         {:.3} over the {} scored with a table; flags off {} learned {} ({:.3}x)\n  weights: {weights}",
        m.ratio_all,
        m.series,
        m.ratio_tabled,
        m.tabled,
        m.flags_off,
        m.flags_learned,
        m.flags_learned as f64 / m.flags_off.max(1) as f64,
    );
    m
}

#[test]
fn compact_sessions_learned_weights_and_scores() {
    if !python3_available() {
        return;
    }
    for seed in SEEDS {
        let m = measure(COMPACT, seed);
        assert!(
            m.flags_off > 0,
            "compact seed {seed}: no flags in off: nothing to compare"
        );
        assert!(
            m.ratio_all >= 1.8,
            "compact seed {seed}: MSE off/learned {:.3} < 1.8",
            m.ratio_all
        );
    }
}

#[test]
fn label_studio_spread_learned_weights_and_scores() {
    if !python3_available() {
        return;
    }
    for seed in SEEDS {
        let m = measure(SPREAD, seed);
        assert!(
            m.ratio_all >= 1.25,
            "spread seed {seed}: MSE off/learned {:.3} < 1.25 over all series",
            m.ratio_all
        );
        assert!(
            m.ratio_tabled >= 1.7,
            "spread seed {seed}: MSE off/learned {:.3} < 1.7 over the series scored with a table",
            m.ratio_tabled
        );
    }
}

/// A line with `processed_at`'s value blanked (the one field that may
/// differ between runs).
fn without_processed_at(line: &[u8]) -> Vec<u8> {
    const KEY: &[u8] = b"\"processed_at\":\"";
    let Some(at) = line.windows(KEY.len()).position(|w| w == KEY) else {
        return line.to_vec();
    };
    let start = at + KEY.len();
    let len = line[start..].iter().position(|&b| b == b'"').unwrap();
    [&line[..start], &line[start + len..]].concat()
}

#[test]
fn shadow_prints_what_off_prints() {
    if !python3_available() {
        return;
    }
    for shape in [COMPACT, SPREAD] {
        let p = generate(shape, 1);
        let off = replay_stdout(&p, shape, "off");
        let shadow = replay_stdout(&p, shape, "shadow");
        let learned = replay_stdout(&p, shape, "learned");
        let lines = |b: &[u8]| -> Vec<Vec<u8>> {
            b.split(|&c| c == b'\n').map(without_processed_at).collect()
        };
        let (off, shadow, learned) = (lines(&off), lines(&shadow), lines(&learned));
        assert!(off.len() > 1000, "{}: only {} lines", shape.name, off.len());
        assert_eq!(
            off.len(),
            shadow.len(),
            "{}: shadow printed another number of lines",
            shape.name
        );
        for (i, (a, b)) in off.iter().zip(&shadow).enumerate() {
            assert!(
                a == b,
                "{}: line {} differs in shadow:\noff:    {}\nshadow: {}",
                shape.name,
                i + 1,
                String::from_utf8_lossy(a),
                String::from_utf8_lossy(b)
            );
        }
        // The comparison can tell modes apart.
        assert_ne!(
            off, learned,
            "{}: learned printed what off prints",
            shape.name
        );
        eprintln!("{}: shadow = off over {} lines", shape.name, off.len());
    }
}

/// Whether crowd-kit's virtualenv is there. When it is not, the test skips,
/// except under JURYSTREAM_REQUIRE_BROKER=1: then it is installed here, and
/// a failed install fails the test.
fn crowdkit_ready() -> bool {
    let script = root().join("scripts/crowdkit.sh");
    let installed = Command::new("bash")
        .arg(&script)
        .arg("installed")
        .status()
        .is_ok_and(|s| s.success());
    if installed {
        return true;
    }
    if !prerequisites_required() {
        skip_or_fail(
            "crowd-kit's virtualenv is not installed",
            "scripts/crowdkit.sh install, about 30 s from PyPI",
        );
        return false;
    }
    let out = Command::new("bash")
        .arg(&script)
        .arg("install")
        .output()
        .expect("run scripts/crowdkit.sh install");
    assert!(
        out.status.success(),
        "scripts/crowdkit.sh install failed (JURYSTREAM_REQUIRE_BROKER=1 makes this a failure):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

#[test]
fn weights_rank_reviewers_as_crowd_kit_does() {
    if !python3_available() || !crowdkit_ready() {
        return;
    }
    // The two shapes in parallel: GLAD takes about 20 s per log.
    let handles: Vec<_> = [COMPACT, SPREAD]
        .into_iter()
        .map(|shape| {
            std::thread::spawn(move || {
                let p = generate(shape, 1);
                let rep = p.dir.path().join("reputation.json");
                std::fs::write(&rep, serde_json::to_vec(&reputation(&p, shape)).unwrap()).unwrap();
                let out = Command::new("bash")
                    .arg(root().join("scripts/crowdkit.sh"))
                    .arg("compare")
                    .arg(&p.votes)
                    .arg(&rep)
                    .args(["--rubrics", &MAIN_RUBRICS.join(",")])
                    .output()
                    .expect("run scripts/crowdkit.sh compare");
                assert!(
                    out.status.success(),
                    "{}: crowd-kit comparison failed:\n{}",
                    shape.name,
                    String::from_utf8_lossy(&out.stderr)
                );
                let got: Value = serde_json::from_slice(&out.stdout).unwrap();
                (shape, got)
            })
        })
        .collect();
    for h in handles {
        let (shape, got) = h.join().unwrap();
        let mut line = Vec::new();
        let mut check = |scope: &str, v: &Value| {
            for model in ["one_coin_ds", "glad"] {
                let rho = v[format!("spearman_{model}")].as_f64().unwrap_or_else(|| {
                    panic!("{}: {scope}: no Spearman for {model}: {v}", shape.name)
                });
                assert!(
                    rho >= 0.5,
                    "{}, {scope}: Spearman of our weights with crowd-kit's {model} is {rho:.3} < 0.5",
                    shape.name
                );
                line.push(format!("{scope} {model} {rho:.3}"));
            }
        };
        for rubric in MAIN_RUBRICS {
            check(rubric, &got["rubrics"][rubric]);
        }
        check("overall", &got["overall"]);
        eprintln!(
            "{} seed 1, Spearman with crowd-kit: {} (overall over within-rubric ranks: DS {:.3}, GLAD {:.3})",
            shape.name,
            line.join(", "),
            got["overall"]["within_rubric_ranks_spearman_one_coin_ds"].as_f64().unwrap_or(f64::NAN),
            got["overall"]["within_rubric_ranks_spearman_glad"].as_f64().unwrap_or(f64::NAN),
        );
    }
}

/// Populations of `scripts/confusion/planted.py` (binary votes, one batch
/// per item, items over a week, hour-long epochs) where contract §15's
/// model `confusion` meets the bars on every seed measured
/// (docs/PERFORMANCE.md, "Which way a reviewer errs"), one seed each: the
/// lenient and harsh crowds it was built for, class imbalance both ways,
/// and spammers with adversaries, which the pair fit is for.
const CONFUSION_POPULATIONS: [&str; 5] = [
    "len+harsh pi=.12",
    "harsh50% pi=.50",
    "lenient50% pi=.50",
    "honest pi=.05",
    "spam+adv pi=.05",
];

/// Model `confusion` through this build's `replay` against crowd-kit
/// 1.4.2's batch Dawid–Skene, GLAD and majority vote on the same votes
/// (`scripts/crowdkit.sh judge`): never below unweighted (`off`), at least
/// GLAD, at most 2 points below DS, and above §14's `noise`.
#[test]
fn confusion_meets_its_bars_against_crowd_kit() {
    if !python3_available() || !crowdkit_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("judge.json");
    let out = Command::new("bash")
        .arg(root().join("scripts/crowdkit.sh"))
        .arg("judge")
        .arg("--bin")
        .arg(common::bin())
        .args(["--sets", "planted", "--seeds", "1", "--pops"])
        .arg(CONFUSION_POPULATIONS.join(","))
        .arg("--json")
        .arg(&json)
        .arg("--cache")
        .arg(dir.path().join("crowdkit.json"))
        .output()
        .expect("run scripts/crowdkit.sh judge");
    assert!(
        out.status.success(),
        "judge.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for pop in CONFUSION_POPULATIONS {
        let acc = |method: &str| -> f64 {
            doc[pop][method]["1"]
                .as_f64()
                .unwrap_or_else(|| panic!("{pop}: no {method} in {doc}"))
        };
        let (off, noise, confusion) = (acc("off"), acc("noise"), acc("confusion"));
        let (ds, glad) = (acc("DS"), acc("GLAD"));
        eprintln!(
            "{pop}: off {off:.2}, noise {noise:.2}, confusion {confusion:.2}, DS {ds:.2}, GLAD {glad:.2}"
        );
        assert!(confusion >= off, "{pop}: confusion {confusion} < off {off}");
        assert!(
            confusion >= glad,
            "{pop}: confusion {confusion} < GLAD {glad}"
        );
        assert!(
            confusion >= ds - 2.0,
            "{pop}: confusion {confusion} < DS {ds} − 2"
        );
        assert!(
            confusion > noise,
            "{pop}: confusion {confusion} <= noise {noise}"
        );
    }
}
