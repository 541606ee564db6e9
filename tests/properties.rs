//! Properties of the contract over random small vote streams (few
//! inferences, voters and rubrics, timestamps within a few minutes, some
//! abstentions, some vote ids, random configurations):
//!
//! - every score (and previous score, aggregate, mean, alpha) is in [0, 1],
//!   every variance in [0, 0.25]; every score interval (contract §13) is in
//!   [0, 1] and holds its score, with at most one effective vote per vote;
//! - reordering the votes of one open window (no voter twice in a series,
//!   distinct timestamps) changes no event;
//! - redelivering any accepted vote, any number of times, changes nothing;
//! - splitting a replay after any line (the first part `--keep-open`, both
//!   through one `--state-dir`) changes nothing (through the binary), with
//!   the default cache and with `state.cache_mb = 0`;
//! - a replay through the RocksDB state store with any cache size, write
//!   cycle and restarts gives the same answers as one in memory.
//!
//! All but the split run the library API (`Config::from_layers`,
//! `decode_vote`, `Engine`, `Store`); case counts stay small for debug builds.

mod common;

use jurystream::config::Config;
use jurystream::engine::{Engine, Outcome, ScoreUpdate};
use jurystream::input::{decode_vote, DecodeOptions, Reason};
use jurystream::state::Store;
use proptest::prelude::*;
use serde_json::{json, Value};

/// One generated configuration, as TOML.
#[derive(Debug, Clone)]
struct Cfg {
    window: &'static str,
    grace: &'static str,
    max_votes: u32,
    aggregator: &'static str,
    temperature: f64,
    lambda: f64,
    time_unit: &'static str,
    initial_score: f64,
    min_votes: u32,
    threshold: f64,
    retention: &'static str,
}

impl Cfg {
    fn toml(&self) -> String {
        format!(
            "[batching]\nwindow_seconds = {}\ngrace_seconds = {}\nmax_votes = {}\n\
             [scoring]\naggregator = \"{}\"\ntemperature = {:?}\nlambda = {:?}\n\
             time_unit = \"{}\"\ninitial_score = {:?}\n\
             [ambiguity]\nmin_votes = {}\nvariance_threshold = {:?}\n\
             [dedupe]\nretention_seconds = {}\n\
             [rubrics.b]\naggregator = \"power_mean\"\ntemperature = 0.1\n",
            self.window,
            self.grace,
            self.max_votes,
            self.aggregator,
            self.temperature,
            self.lambda,
            self.time_unit,
            self.initial_score,
            self.min_votes,
            self.threshold,
            self.retention
        )
    }
}

fn any_cfg() -> impl Strategy<Value = Cfg> {
    (
        prop::sample::select(vec!["0", "7.5", "30", "60"]),
        prop::sample::select(vec!["0", "2.5", "10"]),
        prop::sample::select(vec![1u32, 2, 3, 1000]),
        prop::sample::select(vec!["mean", "power_mean"]),
        0.1f64..=1.0,
        0.0f64..0.1,
        prop::sample::select(vec!["seconds", "minutes", "hours", "days"]),
        0.0f64..=1.0,
        (
            1u32..4,
            0.0f64..0.3,
            prop::sample::select(vec!["2592000", "90", "20"]),
        ),
    )
        .prop_map(
            |(
                window,
                grace,
                max_votes,
                aggregator,
                temperature,
                lambda,
                time_unit,
                s0,
                (mv, th, retention),
            )| {
                Cfg {
                    window,
                    grace,
                    max_votes,
                    aggregator,
                    temperature,
                    lambda,
                    time_unit,
                    initial_score: s0,
                    min_votes: mv,
                    threshold: th,
                    retention,
                }
            },
        )
}

fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        2 => Just(Value::Null),
        4 => (0.0f64..=1.0).prop_map(|x| json!(x)),
        2 => prop::sample::select(vec![0.0, 1.0, 0.5]).prop_map(|x| json!(x)),
        2 => prop::sample::select(vec!["pass", "FLAG", "Mostly", "partial", "minor", "none", "fully"])
            .prop_map(|s| json!(s)),
        1 => any::<bool>().prop_map(|b| json!(b)),
    ]
}

fn time(ms: u64) -> String {
    format!(
        "2024-07-07T00:{:02}:{:02}.{:03}Z",
        ms / 60_000,
        (ms / 1000) % 60,
        ms % 1000
    )
}

/// One vote line: inference, voter, rubric, time (ms after 00:00), value,
/// vote id, reputation, inference time lead (ms).
fn any_vote() -> impl Strategy<Value = String> {
    (
        0usize..4,
        0u8..4,
        prop::sample::select(vec!["a", "b"]),
        0u64..240_000,
        any_value(),
        prop::option::weighted(0.4, 0u8..12),
        prop::option::weighted(0.3, 0.1f64..5.0),
        prop::option::weighted(0.2, 0u64..100_000),
    )
        .prop_map(|(inf, voter, rubric, ms, value, vid, rep, lead)| {
            // 7 and "7" are the same inference.
            let inference = [json!("i0"), json!("i1"), json!(7), json!("7")][inf].clone();
            let mut m = serde_json::Map::new();
            m.insert("inference_id".into(), inference);
            m.insert("voter_id".into(), json!(format!("v{voter}")));
            m.insert("voter_prompt_id".into(), json!(rubric));
            m.insert("vote".into(), value);
            m.insert("timestamp".into(), json!(time(ms)));
            m.insert("model_id".into(), json!(format!("m-{}", inf.min(2))));
            if let Some(id) = vid {
                m.insert("vote_id".into(), json!(format!("id-{id}")));
            }
            if let Some(r) = rep {
                m.insert("reputation".into(), json!(r));
            }
            if let Some(l) = lead {
                m.insert("inference_time".into(), json!(time(ms.saturating_sub(l))));
            }
            Value::Object(m).to_string()
        })
}

fn any_line() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => any_vote(),
        1 => Just("{\"inference_id\": \"i0\", \"vote\": 1".to_owned()),
        1 => Just(String::new()),
    ]
}

/// What the engine emitted, in order.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // test data, compared whole
enum Ev {
    Update(ScoreUpdate),
    Rejected(Reason),
}

fn engine_for(cfg: &Cfg) -> (Engine, DecodeOptions) {
    let c = Config::from_layers(Some(&cfg.toml()), &[]).expect("generated config is valid");
    (Engine::new(c.engine()), c.decode_options())
}

/// Runs lines through decode + engine (+ close at end), returning events and
/// the outcome of each line (None for blank or undecodable ones).
fn run(cfg: &Cfg, lines: &[String]) -> (Vec<Ev>, Vec<Option<Outcome>>) {
    let (mut engine, opts) = engine_for(cfg);
    let mut evs = Vec::new();
    let mut outcomes = Vec::new();
    let mut updates = Vec::new();
    for l in lines {
        if l.trim().is_empty() {
            outcomes.push(None);
            continue;
        }
        match decode_vote(l.as_bytes(), &opts) {
            Err(r) => {
                evs.push(Ev::Rejected(r.reason));
                outcomes.push(None);
            }
            Ok(v) => {
                let o = engine.process(&v, &mut updates);
                if let Outcome::Late(r) = &o {
                    evs.push(Ev::Rejected(r.reason));
                }
                evs.extend(updates.drain(..).map(Ev::Update));
                outcomes.push(Some(o));
            }
        }
    }
    engine.close_all(&mut updates);
    evs.extend(updates.drain(..).map(Ev::Update));
    (evs, outcomes)
}

fn in_unit(x: f64) -> bool {
    (0.0..=1.0).contains(&x)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn scores_stay_in_the_unit_interval(cfg in any_cfg(), lines in prop::collection::vec(any_line(), 1..60)) {
        let (evs, _) = run(&cfg, &lines);
        for e in &evs {
            if let Ev::Update(u) = e {
                prop_assert!(in_unit(u.score), "score {} in {u:?}", u.score);
                prop_assert!(in_unit(u.previous_score), "previous {}", u.previous_score);
                prop_assert!(in_unit(u.aggregate), "aggregate {} in {u:?}", u.aggregate);
                prop_assert!(in_unit(u.mean_vote), "mean {}", u.mean_vote);
                prop_assert!(in_unit(u.alpha), "alpha {}", u.alpha);
                prop_assert!((0.0..=0.25 + 1e-12).contains(&u.variance), "variance {}", u.variance);
                prop_assert!(u.delta_t_seconds >= 0.0);
                prop_assert!(!u.votes.is_empty());
                prop_assert!(u.votes.len() as u32 <= cfg.max_votes);
                // contract §13: at most one effective vote per counted vote
                // (Cauchy–Schwarz), and an interval inside [0, 1] that
                // holds the score.
                match (u.effective_votes, u.score_interval) {
                    (Some(n), Some((low, high))) => {
                        prop_assert!(n > 0.0 && n <= u.series_votes as f64 * (1.0 + 1e-9), "effective {n} of {} votes", u.series_votes);
                        prop_assert!(low >= -1e-12 && high <= 1.0 + 1e-12 && low <= high, "{low} {high}");
                        prop_assert!(low - 1e-9 <= u.score && u.score <= high + 1e-9, "{low} {} {high}", u.score);
                    }
                    (None, None) => prop_assert!(u.alpha == 1.0 || u.score == u.previous_score, "{u:?}"),
                    other => prop_assert!(false, "one of effective_votes and score_interval: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn redelivering_accepted_votes_changes_nothing(
        cfg in any_cfg(),
        lines in prop::collection::vec(any_line(), 1..50),
        picks in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..20),
    ) {
        // Within the retention (a copy after it is a new vote, contract §4).
        let cfg = Cfg { retention: "2592000", ..cfg };
        let (want, outcomes) = run(&cfg, &lines);
        // Lines whose vote was accepted (or already a duplicate).
        let redeliverable: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, Some(Outcome::Accepted) | Some(Outcome::Duplicate)))
            .map(|(i, _)| i)
            .collect();
        prop_assume!(!redeliverable.is_empty());
        // Insert copies, each somewhere after its original.
        let mut inserts: Vec<(usize, usize)> = picks
            .iter()
            .map(|(a, b)| {
                let orig = redeliverable[a.index(redeliverable.len())];
                let after = orig + 1 + b.index(lines.len() - orig);
                (after, orig)
            })
            .collect();
        inserts.sort();
        let mut with_copies = Vec::new();
        let mut next = inserts.iter().peekable();
        for pos in 0..=lines.len() {
            while let Some(&&(at, orig)) = next.peek() {
                if at != pos {
                    break;
                }
                with_copies.push(lines[orig].clone());
                next.next();
            }
            if pos < lines.len() {
                with_copies.push(lines[pos].clone());
            }
        }
        prop_assert_eq!(with_copies.len(), lines.len() + inserts.len());
        let (got, _) = run(&cfg, &with_copies);
        prop_assert_eq!(got, want);
    }
}

/// Votes of one window with distinct (series, voter) pairs and distinct
/// timestamps, plus a shuffled copy of them.
fn one_window() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
    let pairs: Vec<(usize, u8, &'static str)> = (0..3)
        .flat_map(|i| (0..5u8).flat_map(move |v| ["a", "b"].map(move |r| (i, v, r))))
        .collect();
    (
        prop::sample::subsequence(pairs, 1..20),
        prop::collection::vec((any_value(), prop::option::of(0.2f64..3.0)), 20),
        Just((0..55_000u64).step_by(250).collect::<Vec<u64>>()).prop_shuffle(),
    )
        .prop_flat_map(|(pairs, values, times)| {
            let lines: Vec<String> = pairs
                .iter()
                .zip(values)
                .zip(times)
                .enumerate()
                .map(|(n, (((inf, voter, rubric), (value, rep)), ms))| {
                    let mut m = serde_json::Map::new();
                    m.insert("inference_id".into(), json!(format!("i{inf}")));
                    m.insert("voter_id".into(), json!(format!("v{voter}")));
                    m.insert("voter_prompt_id".into(), json!(rubric));
                    m.insert("vote".into(), value);
                    m.insert("timestamp".into(), json!(time(120_000 + ms)));
                    m.insert("model_id".into(), json!(format!("m-{inf}")));
                    if n % 2 == 0 {
                        m.insert("vote_id".into(), json!(format!("w-{n}")));
                    }
                    if let Some(r) = rep {
                        m.insert("reputation".into(), json!(r));
                    }
                    Value::Object(m).to_string()
                })
                .collect();
            (Just(lines.clone()), Just(lines).prop_shuffle())
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn reordering_one_open_window_changes_no_score(
        (lines, shuffled) in one_window(),
        aggregator in prop::sample::select(vec!["mean", "power_mean"]),
        temperature in 0.1f64..=1.0,
    ) {
        // 60 s windows from 00:02:00, every vote before 00:02:55, grace 5 s:
        // the window stays open until the end of the input.
        let cfg = Cfg {
            window: "60",
            grace: "5",
            max_votes: 1000,
            aggregator,
            temperature,
            lambda: 0.01,
            time_unit: "seconds",
            initial_score: 0.5,
            min_votes: 2,
            threshold: 0.05,
            retention: "2592000",
        };
        let (want, _) = run(&cfg, &lines);
        let (got, _) = run(&cfg, &shuffled);
        prop_assert!(want.iter().all(|e| matches!(e, Ev::Update(_))));
        prop_assert_eq!(got, want);
    }
}

/// [`run`] through the RocksDB state store as the shells use it: each
/// vote's series and identity loaded from the store when the cache lacks
/// them, the changes written (with the retention sweep) and the cache
/// evicted down to `budget` bytes every `cycle` lines, and the engine
/// rebuilt from the store (open batches only) before each line in `restarts`.
fn run_stored(
    cfg: &Cfg,
    lines: &[String],
    budget: usize,
    cycle: usize,
    restarts: &[usize],
) -> (Vec<Ev>, Vec<Option<Outcome>>) {
    let c = Config::from_layers(Some(&cfg.toml()), &[]).expect("generated config is valid");
    let opts = c.decode_options();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (mut engine, _) = store.load(c.engine()).unwrap();
    let mut evs = Vec::new();
    let mut outcomes = Vec::new();
    let mut updates = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if restarts.contains(&i) {
            store.write_bulk(&mut engine, true).unwrap();
            engine = store.load(c.engine()).unwrap().0;
        }
        if l.trim().is_empty() {
            outcomes.push(None);
        } else {
            match decode_vote(l.as_bytes(), &opts) {
                Err(r) => {
                    evs.push(Ev::Rejected(r.reason));
                    outcomes.push(None);
                }
                Ok(v) => {
                    let wants = engine.wants(&v);
                    store.provide(&mut engine, &[wants]).unwrap();
                    let o = engine.process(&v, &mut updates);
                    if let Outcome::Late(r) = &o {
                        evs.push(Ev::Rejected(r.reason));
                    }
                    evs.extend(updates.drain(..).map(Ev::Update));
                    outcomes.push(Some(o));
                }
            }
        }
        if (i + 1) % cycle == 0 {
            store.write_bulk(&mut engine, true).unwrap();
            engine.evict(budget);
        }
    }
    engine.close_all(&mut updates);
    evs.extend(updates.drain(..).map(Ev::Update));
    (evs, outcomes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Cache sizes, write cycles and restarts from the store change no
    /// answer (outputs never depend on the cache).
    #[test]
    fn the_cache_size_and_restarts_change_nothing(
        cfg in any_cfg(),
        lines in prop::collection::vec(any_line(), 1..60),
        budget in prop_oneof![Just(0usize), 0usize..4096, Just(usize::MAX)],
        cycle in 1usize..8,
        restarts in prop::collection::vec(0usize..60, 0..4),
    ) {
        let (want, want_o) = run(&cfg, &lines);
        let (got, got_o) = run_stored(&cfg, &lines, budget, cycle, &restarts);
        prop_assert_eq!(got_o, want_o);
        prop_assert_eq!(got, want);
    }
}

proptest! {
    // Each case runs the binary three times.
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn splitting_a_replay_changes_nothing(
        cfg in any_cfg(),
        lines in prop::collection::vec(any_line(), 1..40),
        cut in any::<prop::sample::Index>(),
    ) {
        let work = tempfile::tempdir().unwrap();
        let config = work.path().join("config.toml");
        std::fs::write(&config, cfg.toml()).unwrap();
        let input = work.path().join("input.jsonl");
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&input, &text).unwrap();
        let whole = common::replay(Some(&config), &input, None, false);
        let physical = common::physical_lines(text.as_bytes());
        let k = cut.index(physical.len() + 1);
        for mb in common::CACHE_SIZES {
            let r = common::with_cache_mb(mb, || {
                common::check_split(Some(&config), &physical, k, &whole, work.path())
            });
            prop_assert!(r.is_ok(), "state.cache_mb {:?}: {}", mb, r.unwrap_err());
        }
    }
}
