//! Judging score updates (contract §10), pure: no I/O, no clock. A [`Judge`]
//! takes one grid point's score updates in emission order; [`outcome`]
//! ranks the points and picks thresholds.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::engine::score::TimeUnit;
use crate::engine::{Forecast, ScoreUpdate, SeriesKey};
use crate::time::{format_timestamp, Nanos};

/// p is clamped to [P_CLAMP, 1 − P_CLAMP] in the log loss.
pub const P_CLAMP: f64 = 1e-6;
/// Bins of the batch-variance histogram over [0, 0.25] (the largest
/// variance of values in [0, 1]); larger values land in the last bin.
pub const VARIANCE_BINS: usize = 50;
pub const VARIANCE_MAX: f64 = 0.25;
/// Most steps kept per grid point (memory bound: a tiny `--step` over a
/// long input is refused rather than allowed to grow without end).
pub const MAX_STEPS: usize = 100_000;
/// Series whose trajectories the report draws.
pub const TOP_SERIES: usize = 4;

/// Sums of the forecast metrics over updates with `update_seq ≥ 2`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sums {
    pub n: u64,
    pub sq_err: f64,
    pub log_loss: f64,
    /// Σ (m_prev − m)²: the naive forecast "the previous batch's mean vote".
    pub sq_err_last: f64,
    /// Updates whose previous score had an interval (contract §13), and those
    /// of them whose interval held the batch's mean vote.
    pub with_interval: u64,
    pub covered: u64,
}

impl Sums {
    /// One update: forecast `p` with its interval, batch mean vote `m`,
    /// previous batch's `m_prev`.
    pub fn add(&mut self, p: f64, interval: Option<(f64, f64)>, m: f64, m_prev: f64) {
        self.n += 1;
        let d = p - m;
        self.sq_err += d * d;
        let pc = p.clamp(P_CLAMP, 1.0 - P_CLAMP);
        self.log_loss += -(m * pc.ln() + (1.0 - m) * (1.0 - pc).ln());
        let d = m_prev - m;
        self.sq_err_last += d * d;
        if let Some((low, high)) = interval {
            self.with_interval += 1;
            self.covered += u64::from(low <= m && m <= high);
        }
    }

    pub fn metrics(&self) -> Metrics {
        if self.n == 0 {
            return Metrics::default();
        }
        let n = self.n as f64;
        let mse = self.sq_err / n;
        let mse_last = self.sq_err_last / n;
        Metrics {
            n: self.n,
            mse: Some(mse),
            log_loss: Some(self.log_loss / n),
            skill: (mse_last != 0.0).then(|| 1.0 - mse / mse_last),
            coverage: (self.with_interval > 0)
                .then(|| self.covered as f64 / self.with_interval as f64),
        }
    }
}

/// A grid point's metrics; `None` (JSON null) when undefined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Metrics {
    pub n: u64,
    pub mse: Option<f64>,
    pub log_loss: Option<f64>,
    pub skill: Option<f64>,
    /// The share of these updates whose previous score's 95 % interval
    /// (contract §13) held the batch's mean vote (those with an interval).
    pub coverage: Option<f64>,
}

/// Flag counts of one window's updates against every grid threshold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlagCounts {
    pub all: u64,
    pub eligible: u64,
    /// Per threshold (in the grid's order): eligible with variance above it.
    pub flagged: Vec<u64>,
}

/// A series' score trajectory: (T, score after, batch mean vote) per update.
pub type Trajectory = Vec<(Nanos, f64, f64)>;

/// One grid point's judge.
#[derive(Debug, Clone)]
pub struct Judge {
    thresholds: Vec<f64>,
    min_votes: u32,
    step_ns: Nanos,
    pub sums: Sums,
    pub flags: FlagCounts,
    /// Sums per step of event time (index = T div step).
    pub steps: BTreeMap<i128, Sums>,
    pub variances: [u64; VARIANCE_BINS],
    /// The most-voted series seen (votes in all their scored batches).
    pub top: Vec<(SeriesKey, u64)>,
    /// Series whose trajectories to record (the report's second pass).
    pub record: Vec<SeriesKey>,
    pub trajectories: BTreeMap<SeriesKey, Trajectory>,
}

/// `--step` too small for the input's time span.
#[derive(Debug, Clone, PartialEq)]
pub struct TooManySteps;

impl Judge {
    pub fn new(thresholds: &[f64], min_votes: u32, step_ns: Nanos) -> Judge {
        Judge {
            thresholds: thresholds.to_vec(),
            min_votes,
            step_ns: step_ns.max(1),
            sums: Sums::default(),
            flags: FlagCounts {
                flagged: vec![0; thresholds.len()],
                ..FlagCounts::default()
            },
            steps: BTreeMap::new(),
            variances: [0; VARIANCE_BINS],
            top: Vec::new(),
            record: Vec::new(),
            trajectories: BTreeMap::new(),
        }
    }

    /// One score update, in emission order.
    pub fn judge(&mut self, u: &ScoreUpdate) -> Result<(), TooManySteps> {
        self.judge_as(u, &u.forecast())
    }

    /// [`Judge::judge`] with the scores of another λ (the engine's
    /// companion scores, [`ScoreUpdate::companions`]): everything else of
    /// an update does not depend on λ.
    pub fn judge_as(&mut self, u: &ScoreUpdate, f: &Forecast) -> Result<(), TooManySteps> {
        let votes = u.votes.len() as u64;
        self.flags.all += 1;
        if votes >= u64::from(self.min_votes) {
            self.flags.eligible += 1;
            for (t, f) in self.thresholds.iter().zip(&mut self.flags.flagged) {
                if u.variance > *t {
                    *f += 1;
                }
            }
        }
        let bin = ((u.variance / VARIANCE_MAX) * VARIANCE_BINS as f64).floor();
        self.variances[(bin.max(0.0) as usize).min(VARIANCE_BINS - 1)] += 1;
        if u.update_seq >= 2 {
            if let Some(m_prev) = u.previous_mean_vote {
                self.sums
                    .add(f.previous_score, f.previous_interval, u.mean_vote, m_prev);
                let step = u.last_vote_at.div_euclid(self.step_ns);
                if !self.steps.contains_key(&step) && self.steps.len() >= MAX_STEPS {
                    return Err(TooManySteps);
                }
                self.steps.entry(step).or_default().add(
                    f.previous_score,
                    f.previous_interval,
                    u.mean_vote,
                    m_prev,
                );
            }
        }
        self.offer_top(&u.series, u.series_votes);
        if self.record.contains(&u.series) {
            self.trajectories
                .entry(u.series.clone())
                .or_default()
                .push((u.last_vote_at, f.score, u.mean_vote));
        }
        Ok(())
    }

    /// Keeps the [`TOP_SERIES`] series with the most votes. A series'
    /// count only grows and its last offer is its final count, so the kept
    /// set ends as the top of the final counts (ties: the first to reach it).
    fn offer_top(&mut self, series: &SeriesKey, votes: u64) {
        if let Some(e) = self.top.iter_mut().find(|(k, _)| k == series) {
            e.1 = votes;
        } else if self.top.len() < TOP_SERIES {
            self.top.push((series.clone(), votes));
        } else if let Some(min) = self.top.iter_mut().min_by_key(|(_, v)| *v) {
            if votes > min.1 {
                *min = (series.clone(), votes);
            }
        } else {
            return;
        }
        self.top
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    }
}

/// One point of the grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub lambda: f64,
    pub time_unit: TimeUnit,
    pub window_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GridRow {
    pub lambda: f64,
    pub time_unit: &'static str,
    pub window_seconds: f64,
    #[serde(flatten)]
    pub metrics: Metrics,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThresholdRow {
    pub window_seconds: f64,
    pub variance_threshold: f64,
    pub eligible: u64,
    pub flagged: u64,
    pub flag_rate: Option<f64>,
    pub recommended: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRow {
    pub start: String,
    pub end: String,
    /// The grid's metrics over this step's updates, ranked.
    pub grid: Vec<GridRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Best {
    pub lambda: f64,
    pub time_unit: &'static str,
    pub window_seconds: f64,
    /// The recommended threshold of the best window (null: none within
    /// the review budget).
    pub variance_threshold: Option<f64>,
    pub flag_rate: Option<f64>,
    #[serde(flatten)]
    pub metrics: Metrics,
}

/// What `backtest --format json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub grid: Vec<GridRow>,
    pub thresholds: Vec<ThresholdRow>,
    pub steps: Vec<StepRow>,
    pub best: Option<Best>,
}

fn row(p: &Point, metrics: Metrics) -> GridRow {
    GridRow {
        lambda: p.lambda,
        time_unit: p.time_unit.as_str(),
        window_seconds: p.window_seconds,
        metrics,
    }
}

/// Higher skill first (nulls last), then lower log loss (nulls last),
/// then grid order (the sort is stable).
fn rank(rows: &mut [GridRow]) {
    fn desc_nulls_last(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
        match (a, b) {
            (Some(a), Some(b)) => b.total_cmp(&a),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        }
    }
    rows.sort_by(|a, b| {
        desc_nulls_last(a.metrics.skill, b.metrics.skill).then_with(|| {
            desc_nulls_last(
                a.metrics.log_loss.map(|x| -x),
                b.metrics.log_loss.map(|x| -x),
            )
        })
    });
}

/// Ranks the grid, counts flags per (window, threshold) and recommends
/// thresholds. `points` are in grid order; a window's flag counts come
/// from its first point (they do not depend on λ). `thresholds` ascending.
pub fn outcome(
    points: &[(Point, &Judge)],
    thresholds: &[f64],
    review_budget: f64,
    step_ns: Nanos,
) -> Outcome {
    let mut grid: Vec<GridRow> = points
        .iter()
        .map(|(p, j)| row(p, j.sums.metrics()))
        .collect();
    rank(&mut grid);

    let mut rows = Vec::new();
    let mut windows: Vec<f64> = Vec::new();
    for (p, j) in points {
        if windows.contains(&p.window_seconds) {
            continue;
        }
        windows.push(p.window_seconds);
        let mut recommended = false;
        for (i, &t) in thresholds.iter().enumerate() {
            let flagged = j.flags.flagged[i];
            let flag_rate = (j.flags.all > 0).then(|| flagged as f64 / j.flags.all as f64);
            let this = !recommended && flag_rate.is_some_and(|r| r <= review_budget);
            recommended |= this;
            rows.push(ThresholdRow {
                window_seconds: p.window_seconds,
                variance_threshold: t,
                eligible: j.flags.eligible,
                flagged,
                flag_rate,
                recommended: this,
            });
        }
    }

    let mut indices: Vec<i128> = points
        .iter()
        .flat_map(|(_, j)| j.steps.keys().copied())
        .collect();
    indices.sort_unstable();
    indices.dedup();
    let steps = indices
        .into_iter()
        .map(|i| {
            let mut grid: Vec<GridRow> = points
                .iter()
                .map(|(p, j)| row(p, j.steps.get(&i).copied().unwrap_or_default().metrics()))
                .collect();
            rank(&mut grid);
            StepRow {
                start: format_timestamp(i * step_ns),
                end: format_timestamp((i + 1) * step_ns),
                grid,
            }
        })
        .collect();

    let best = grid.first().map(|g| {
        let chosen = rows
            .iter()
            .find(|r| r.window_seconds == g.window_seconds && r.recommended);
        Best {
            lambda: g.lambda,
            time_unit: g.time_unit,
            window_seconds: g.window_seconds,
            variance_threshold: chosen.map(|r| r.variance_threshold),
            flag_rate: chosen.and_then(|r| r.flag_rate),
            metrics: g.metrics,
        }
    });
    Outcome {
        grid,
        thresholds: rows,
        steps,
        best,
    }
}

/// The ranking, thresholds and best choice for a terminal.
pub fn table(o: &Outcome, review_budget: f64) -> String {
    use std::fmt::Write;
    let f = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.6}"));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>4}  {:>12}  {:>9}  {:>10}  {:>9}  {:>10}  {:>10}  {:>10}  {:>10}",
        "rank", "lambda", "unit", "window_s", "n", "mse", "log_loss", "skill", "coverage"
    );
    for (i, r) in o.grid.iter().enumerate() {
        let m = &r.metrics;
        let _ = writeln!(
            s,
            "{:>4}  {:>12}  {:>9}  {:>10}  {:>9}  {:>10}  {:>10}  {:>10}  {:>10}",
            i + 1,
            r.lambda,
            r.time_unit,
            r.window_seconds,
            m.n,
            f(m.mse),
            f(m.log_loss),
            f(m.skill),
            f(m.coverage)
        );
    }
    let _ = writeln!(
        s,
        "\nambiguity thresholds (review budget: flag_rate <= {review_budget}):"
    );
    let _ = writeln!(
        s,
        "{:>10}  {:>10}  {:>9}  {:>9}  {:>10}  recommended",
        "window_s", "threshold", "eligible", "flagged", "flag_rate"
    );
    for r in &o.thresholds {
        let _ = writeln!(
            s,
            "{:>10}  {:>10}  {:>9}  {:>9}  {:>10}  {}",
            r.window_seconds,
            r.variance_threshold,
            r.eligible,
            r.flagged,
            f(r.flag_rate),
            if r.recommended { "yes" } else { "" }
        );
    }
    match &o.best {
        Some(b) => {
            let t = b
                .variance_threshold
                .map_or_else(|| "none within the budget".to_owned(), |t| t.to_string());
            let _ = writeln!(
                s,
                "\nbest: lambda = {} per {}, window = {} s, variance threshold = {t} (skill {}, log loss {}, n = {})",
                b.lambda,
                b.time_unit.trim_end_matches('s'),
                b.window_seconds,
                f(b.metrics.skill),
                f(b.metrics.log_loss),
                b.metrics.n
            );
        }
        None => s.push_str("\nno grid point\n"),
    }
    s
}
