//! `jurystream backtest` (contract §10): replays a vote file once per (λ,
//! window) of a grid with the engine of `replay`, and judges how well each
//! series' score before a batch predicts that batch.
//!
//! - The file is read and decoded once, on one thread; every window of the
//!   grid gets the same decoded chunks (`Arc`) and runs one engine on its
//!   own thread with a temporary store and a share of `state.cache_mb`
//!   (`replay::run_detached`). λ changes nothing but the scores, so that
//!   engine scores the window's first λ and keeps every series' score
//!   under the others beside it (`EngineConfig::companions`): one engine
//!   per window, not per point. No event is encoded: the score updates go
//!   to one [`judge::Judge`] per point.
//! - `judge.rs` (pure): the metrics, the flag counts, the ranking.
//! - `report.rs`: `--report DIR` (HTML with inline SVG charts). Its score
//!   trajectories need a second pass over the file for two points (the
//!   best and the configuration's), recording only the most-voted series.

mod error;
pub mod judge;
pub mod report;

use std::io::BufReader;
use std::path::PathBuf;
use std::sync::Arc;

pub use error::{BacktestError, Fault};

use crate::config::Config;
use crate::engine::score::TimeUnit;
use crate::engine::{Decay, Engine, ScoreUpdate, SeriesKey};
use crate::input::Rejection;
use crate::replay::{
    join_thread, open_input, run_detached, spawn_reader, Chunk, Progress, ReplayError, Sink,
    INPUT_READER,
};
use crate::time::{Nanos, NANOS_PER_SEC};
use judge::{Judge, Outcome, Point, TooManySteps};

/// The threshold grid when `--variance-threshold` is absent.
pub const DEFAULT_THRESHOLDS: [f64; 9] = [0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2];
pub const DEFAULT_REVIEW_BUDGET: f64 = 0.05;
pub const DEFAULT_STEP_NS: Nanos = 86_400 * NANOS_PER_SEC;

type Result<T, E = BacktestError> = std::result::Result<T, E>;

/// A command-line value that cannot be used: the message names the flag
/// (exit status 2).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A flag value that cannot be used: the user's, not retriable.
impl crate::error::Classify for UsageError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::Usage
    }

    fn retry(&self) -> crate::error::RetryHint {
        crate::error::RetryHint::NoRetry
    }
}

/// What to backtest.
#[derive(Debug, Clone)]
pub struct Options {
    pub input: PathBuf,
    pub lambdas: Vec<f64>,
    pub time_unit: TimeUnit,
    pub windows: Vec<f64>,
    /// Ascending, no duplicates.
    pub thresholds: Vec<f64>,
    pub review_budget: f64,
    pub step_ns: Nanos,
    pub report: Option<PathBuf>,
}

/// The command line's raw values (None: the flag is absent).
#[derive(Debug, Clone, Default)]
pub struct RawOptions {
    pub input: PathBuf,
    pub lambda: Option<String>,
    pub time_unit: Option<String>,
    pub window: Option<String>,
    pub variance_threshold: Option<String>,
    pub review_budget: Option<String>,
    pub step: Option<String>,
    pub report: Option<PathBuf>,
}

/// A comma-separated list of numbers, each accepted by `parse`; duplicates
/// dropped (first kept). Empty → an error naming `flag`.
fn list(
    flag: &str,
    text: &str,
    parse: impl Fn(&str) -> Option<f64>,
    what: &str,
) -> Result<Vec<f64>, UsageError> {
    let mut out: Vec<f64> = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        let v = parse(item).ok_or_else(|| UsageError(format!("{flag}: {item:?} is not {what}")))?;
        if !out.contains(&v) {
            out.push(v);
        }
    }
    if out.is_empty() || text.trim().is_empty() {
        return Err(UsageError(format!("{flag}: the grid is empty")));
    }
    Ok(out)
}

fn non_negative(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

/// A duration in seconds: a number, or a number with `s`, `m`, `h` or `d`.
pub fn parse_duration_seconds(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let factor = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        _ => return None,
    };
    non_negative(num).map(|v| v * factor)
}

impl RawOptions {
    /// Checks every flag; defaults come from `cfg` (λ, time unit, window)
    /// and from contract §10 (thresholds, review budget, step).
    pub fn resolve(self, cfg: &Config) -> Result<Options, UsageError> {
        let lambdas = match &self.lambda {
            Some(t) => list("--lambda", t, non_negative, "a number >= 0")?,
            None => vec![cfg.scoring.lambda],
        };
        let time_unit = match &self.time_unit {
            Some(t) => TimeUnit::parse(t.trim()).ok_or_else(|| {
                UsageError(format!(
                    "--time-unit: {t:?} is not one of seconds, minutes, hours, days"
                ))
            })?,
            None => cfg.scoring.time_unit,
        };
        let windows = match &self.window {
            Some(t) => list(
                "--window",
                t,
                parse_duration_seconds,
                "a duration >= 0 (seconds, or with s, m, h, d)",
            )?,
            None => vec![cfg.batching.window_seconds],
        };
        let mut thresholds = match &self.variance_threshold {
            Some(t) => list("--variance-threshold", t, non_negative, "a number >= 0")?,
            None => DEFAULT_THRESHOLDS.to_vec(),
        };
        thresholds.sort_by(f64::total_cmp);
        let review_budget = match &self.review_budget {
            Some(t) => non_negative(t).filter(|b| *b <= 1.0).ok_or_else(|| {
                UsageError(format!(
                    "--review-budget: {t:?} is not a fraction in [0, 1]"
                ))
            })?,
            None => DEFAULT_REVIEW_BUDGET,
        };
        let step_ns = match &self.step {
            Some(t) => parse_duration_seconds(t)
                .map(|s| (s * NANOS_PER_SEC as f64).round())
                .filter(|ns| *ns >= 1.0 && *ns < 1e27)
                .map(|ns| ns as Nanos)
                .ok_or_else(|| {
                    UsageError(format!(
                        "--step: {t:?} is not a duration > 0 (seconds, or with s, m, h, d)"
                    ))
                })?,
            None => DEFAULT_STEP_NS,
        };
        Ok(Options {
            input: self.input,
            lambdas,
            time_unit,
            windows,
            thresholds,
            review_budget,
            step_ns,
            report: self.report,
        })
    }
}

/// The grid in its order (window-major, then λ as given) with each
/// point's configuration; a value the configuration rejects names its flag.
pub fn grid(cfg: &Config, opts: &Options) -> Result<Vec<(Point, Config)>, UsageError> {
    let mut out = Vec::new();
    for &w in &opts.windows {
        for &l in &opts.lambdas {
            let c = cfg
                .with_decay_and_window(l, opts.time_unit, w)
                .map_err(|e| {
                    let flag = if e.0.starts_with("batching.window_seconds") {
                        "--window"
                    } else {
                        "--lambda"
                    };
                    UsageError(format!("{flag}: {e}"))
                })?;
            out.push((
                Point {
                    lambda: l,
                    time_unit: opts.time_unit,
                    window_seconds: w,
                },
                c,
            ));
        }
    }
    Ok(out)
}

/// The judges of one engine as the engine loop's sink (rejections are
/// only counted): the first judges the engine's scores, the others its
/// companion scores, in order.
struct Judging {
    judges: Vec<Judge>,
    error: Option<TooManySteps>,
}

impl Sink for Judging {
    fn updates(&mut self, updates: &mut Vec<ScoreUpdate>) -> std::io::Result<()> {
        for u in updates.drain(..) {
            for (k, j) in self.judges.iter_mut().enumerate() {
                let r = match k.checked_sub(1).and_then(|c| u.companions.get(c)) {
                    Some(f) => j.judge_as(&u, f),
                    None => j.judge(&u),
                };
                if let Err(e) = r {
                    self.error = Some(e);
                    return Err(std::io::Error::other("--step: too many steps"));
                }
            }
        }
        Ok(())
    }

    fn rejected(&mut self, _: &Rejection, _: &[u8], _: u64) -> std::io::Result<()> {
        Ok(())
    }

    fn chunk_done(&mut self, _: &Engine) {}
}

/// What a backtest found.
pub struct Results {
    pub outcome: Outcome,
    pub lines: u64,
    pub rejected: u64,
    pub votes: u64,
    /// Per grid point, in grid order.
    pub points: Vec<(Point, Judge)>,
}

/// Runs one engine per configuration over `opts.input`, decoding it once;
/// each engine's judges (its own scores, then each companion's) come back
/// in order, all engines' one after the other.
fn run_points(
    cfg: &Config,
    opts: &Options,
    points: Vec<(Config, Vec<Judge>)>,
    what: &'static str,
) -> Result<(Vec<Judge>, u64, u64, u64)> {
    let file = open_input(&opts.input)?;
    let total_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let decode = cfg.decode_options();
    let budget = cfg.cache_bytes() / points.len().max(1);
    let mut progress = Progress::new(what, total_bytes);
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Chunk>>(8);
        let decode = &decode;
        let reader = spawn_reader(scope, BufReader::with_capacity(1 << 20, file), decode, tx)?;
        let mut senders = Vec::new();
        let mut handles = Vec::new();
        for (i, (c, judges)) in points.into_iter().enumerate() {
            let (ptx, prx) = std::sync::mpsc::sync_channel::<Arc<Chunk>>(4);
            senders.push(ptx);
            let thread = format!("backtest-{i}");
            let h = std::thread::Builder::new()
                .name(thread.clone())
                .spawn_scoped(scope, move || {
                    let mut sink = Judging {
                        judges,
                        error: None,
                    };
                    let r = run_detached(&c, budget, prx.into_iter().map(Ok), &mut sink);
                    match (r, sink.error) {
                        (_, Some(TooManySteps)) => Err(BacktestError::Usage(UsageError(format!(
                            "--step: more than {} steps of event time; choose a longer step",
                            judge::MAX_STEPS
                        )))),
                        (Err(e), None) => Err(BacktestError::Replay(e.at_input(&opts.input))),
                        (Ok(s), None) => Ok((sink.judges, s)),
                    }
                });
            // The threads started so far stop when their senders are
            // dropped (on this return), and the scope waits for them.
            let h = h.map_err(|source| BacktestError::Spawn {
                thread: thread.clone(),
                source,
            })?;
            handles.push((thread, h));
        }
        let mut votes = 0u64;
        let mut read_error = None;
        for chunk in rx {
            let chunk = match chunk {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    read_error = Some(e);
                    break;
                }
            };
            votes += chunk.decoded.iter().filter(|d| d.is_ok()).count() as u64;
            let lines = chunk.lines.last().map_or(0, |l| l.2);
            progress.update(lines, chunk.bytes, votes);
            // A point that stopped (an error) is left out; its error is
            // reported below.
            senders.retain(|s| s.send(chunk.clone()).is_ok());
            if senders.is_empty() {
                break;
            }
        }
        drop(senders);
        progress.finish();
        // Its chunks ended early if it panicked (the points' results are
        // then partial).
        join_thread(INPUT_READER, reader)?;
        let mut judges = Vec::new();
        let (mut lines, mut rejected) = (0, 0);
        for (thread, h) in handles {
            let (j, s) = h.join().map_err(|panic| BacktestError::Panicked {
                thread,
                message: crate::error::panic_message(&*panic),
            })??;
            judges.extend(j);
            lines = s.lines;
            rejected = s.rejected;
        }
        if let Some(source) = read_error {
            return Err(ReplayError::ReadInput {
                path: Some(opts.input.clone()),
                source,
            }
            .into());
        }
        Ok((judges, lines, rejected, votes))
    })
}

/// Runs the grid (and the report's second pass when asked for).
pub fn run(cfg: &Config, opts: &Options) -> Result<Results> {
    let points = grid(cfg, opts)?;
    let min_votes = cfg.engine().min_votes;
    // One engine per window (the grid is window-major): the first λ's
    // configuration, scoring the window's other λ as companions.
    let mut engines: Vec<(Config, Vec<Judge>)> = Vec::new();
    for group in points.chunk_by(|a, b| a.0.window_seconds == b.0.window_seconds) {
        let companions = group[1..]
            .iter()
            .map(|(_, c)| Decay::of(&c.engine()))
            .collect();
        let judges = group
            .iter()
            .map(|_| Judge::new(&opts.thresholds, min_votes, opts.step_ns))
            .collect();
        engines.push((group[0].1.with_companions(companions), judges));
    }
    let (judges, lines, rejected, votes) = run_points(cfg, opts, engines, "backtest")?;
    let points: Vec<(Point, Judge)> = points.into_iter().map(|(p, _)| p).zip(judges).collect();
    let refs: Vec<(Point, &Judge)> = points.iter().map(|(p, j)| (*p, j)).collect();
    let outcome = judge::outcome(&refs, &opts.thresholds, opts.review_budget, opts.step_ns);
    Ok(Results {
        outcome,
        lines,
        rejected,
        votes,
        points,
    })
}

/// The best point's and the configuration's score trajectories of the
/// best point's most-voted series (a second pass over the input).
pub fn trajectories(
    cfg: &Config,
    opts: &Options,
    results: &Results,
) -> Result<Option<report::Trajectories>> {
    let Some(best) = &results.outcome.best else {
        return Ok(None);
    };
    let Some((_, best_judge)) = results
        .points
        .iter()
        .find(|(p, _)| p.lambda == best.lambda && p.window_seconds == best.window_seconds)
    else {
        return Ok(None);
    };
    let series: Vec<SeriesKey> = best_judge.top.iter().map(|(k, _)| k.clone()).collect();
    if series.is_empty() {
        return Ok(None);
    }
    let best_point = Point {
        lambda: best.lambda,
        time_unit: opts.time_unit,
        window_seconds: best.window_seconds,
    };
    let configured = Point {
        lambda: cfg.scoring.lambda,
        time_unit: cfg.scoring.time_unit,
        window_seconds: cfg.batching.window_seconds,
    };
    let min_votes = cfg.engine().min_votes;
    let mut runs = Vec::new();
    for p in [best_point, configured] {
        let c = cfg
            .with_decay_and_window(p.lambda, p.time_unit, p.window_seconds)
            .map_err(BacktestError::Config)?;
        let mut j = Judge::new(&[], min_votes, opts.step_ns);
        j.record = series.clone();
        runs.push((c, vec![j]));
    }
    let (judges, ..) = run_points(cfg, opts, runs, "backtest report")?;
    let mut judges = judges.into_iter();
    let (b, c) = (judges.next().unwrap(), judges.next().unwrap());
    Ok(Some(report::Trajectories {
        best: best_point,
        configured,
        series: series
            .into_iter()
            .map(|k| {
                let tb = b.trajectories.get(&k).cloned().unwrap_or_default();
                let tc = c.trajectories.get(&k).cloned().unwrap_or_default();
                (k, tb, tc)
            })
            .collect(),
    }))
}

/// `jurystream backtest`: runs, prints (table or JSON on stdout, a
/// summary on stderr) and writes the report when asked for.
pub fn run_and_print(cfg: &Config, opts: &Options, json: bool) -> Result<()> {
    let results = run(cfg, opts)?;
    eprintln!(
        "backtest: {} lines, {} votes decoded, {} lines rejected; {} grid points",
        results.lines,
        results.votes,
        results.rejected,
        results.points.len()
    );
    if json {
        let text = serde_json::to_string_pretty(&results.outcome).map_err(BacktestError::Json)?;
        println!("{text}");
    } else {
        print!("{}", judge::table(&results.outcome, opts.review_budget));
    }
    if let Some(dir) = &opts.report {
        let traj = trajectories(cfg, opts, &results)?;
        report::write(dir, cfg, opts, &results, traj.as_ref())?;
        eprintln!(
            "backtest: report written to {}",
            dir.join("index.html").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
