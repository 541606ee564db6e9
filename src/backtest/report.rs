//! `backtest --report DIR`: one self-contained `DIR/index.html` (inline
//! SVG drawn by `plotters`, no script, no network). Every chart is a
//! `<figure class="chart" id="…">` holding one `<svg>`.

use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::Shift;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;

use super::judge::{Point, Trajectory, VARIANCE_BINS, VARIANCE_MAX};
use super::{BacktestError, Options, Results};
use crate::config::Config;
use crate::engine::SeriesKey;
use crate::time::{format_timestamp, Nanos, NANOS_PER_SEC};

/// The chart ids, in page order.
pub const CHARTS: [&str; 5] = [
    "skill-by-lambda",
    "log-loss-by-lambda",
    "variance-histogram",
    "trajectories",
    "skill-by-step",
];

const W: u32 = 900;
const H: u32 = 380;
const FONT: &str = "sans-serif";

/// The report's score trajectories: per series, under the best point and
/// under the configuration.
pub struct Trajectories {
    pub best: Point,
    pub configured: Point,
    pub series: Vec<(SeriesKey, Trajectory, Trajectory)>,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

type Result<T, E = BacktestError> = std::result::Result<T, E>;

/// What drawing on an [`Area`] returns.
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// One chart (`chart`: its id, for errors) as an SVG string.
fn svg(
    chart: &'static str,
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> Drawn,
) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        let drawn = root
            .fill(&WHITE)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present());
        drawn.map_err(|e| BacktestError::Plot {
            chart,
            source: Box::new(e),
        })?;
    }
    Ok(out)
}

fn label(p: &Point) -> String {
    format!(
        "λ {} per {}, window {} s",
        p.lambda,
        p.time_unit.as_str().trim_end_matches('s'),
        p.window_seconds
    )
}

/// (lo, hi) of `values` with a margin; a fallback when empty or flat.
fn span(values: impl Iterator<Item = f64>, fallback: (f64, f64)) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if lo > hi {
        return fallback;
    }
    if lo == hi {
        return (lo - 0.5, hi + 0.5);
    }
    let m = (hi - lo) * 0.08;
    (lo - m, hi + m)
}

/// λ on the x axis: log10 when every λ is positive and they span a
/// factor of 10 or more, else linear. Returns (x of λ, whether log).
fn lambda_axis(lambdas: &[f64]) -> (fn(f64) -> f64, bool) {
    let positive = lambdas.iter().all(|l| *l > 0.0);
    let (lo, hi) = span(lambdas.iter().copied(), (0.0, 1.0));
    if positive && lambdas.len() > 1 && hi / lo.max(f64::MIN_POSITIVE) >= 10.0 {
        (f64::log10, true)
    } else {
        (|x| x, false)
    }
}

/// A metric against λ, one line per window.
fn by_lambda(
    chart: &'static str,
    results: &Results,
    title: &str,
    y_desc: &str,
    metric: impl Fn(&super::judge::Metrics) -> Option<f64>,
) -> Result<String> {
    let lambdas: Vec<f64> = results.points.iter().map(|(p, _)| p.lambda).collect();
    let (fx, log) = lambda_axis(&lambdas);
    let mut windows: Vec<f64> = Vec::new();
    for (p, _) in &results.points {
        if !windows.contains(&p.window_seconds) {
            windows.push(p.window_seconds);
        }
    }
    let lines: Vec<(f64, Vec<(f64, f64)>)> = windows
        .iter()
        .map(|&w| {
            let mut pts: Vec<(f64, f64)> = results
                .points
                .iter()
                .filter(|(p, _)| p.window_seconds == w)
                .filter_map(|(p, j)| metric(&j.sums.metrics()).map(|m| (fx(p.lambda), m)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (w, pts)
        })
        .collect();
    let (x0, x1) = span(lambdas.iter().map(|l| fx(*l)), (0.0, 1.0));
    let (y0, y1) = span(
        lines.iter().flat_map(|l| l.1.iter().map(|p| p.1)),
        (0.0, 1.0),
    );
    let unit = results
        .points
        .first()
        .map_or("seconds", |(p, _)| p.time_unit.as_str());
    svg(chart, (W, H), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let x_fmt = |x: &f64| {
            if log {
                format!("{:.3e}", 10f64.powf(*x))
            } else {
                format!("{x:.4}")
            }
        };
        chart
            .configure_mesh()
            .x_desc(format!("λ (per {})", unit.trim_end_matches('s')))
            .y_desc(y_desc)
            .x_label_formatter(&x_fmt)
            .draw()?;
        for (i, (w, pts)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(format!("window {w} s"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(
                pts.iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

/// The best window's batch variances, with the grid thresholds and their
/// flag rates.
fn variance_histogram(results: &Results) -> Result<String> {
    let Some(best) = &results.outcome.best else {
        return svg(CHARTS[2], (W, H), |_| Ok(()));
    };
    let Some((_, j)) = results
        .points
        .iter()
        .find(|(p, _)| p.window_seconds == best.window_seconds)
    else {
        return svg(CHARTS[2], (W, H), |_| Ok(()));
    };
    let width = VARIANCE_MAX / VARIANCE_BINS as f64;
    let top = j.variances.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.12;
    let rows: Vec<_> = results
        .outcome
        .thresholds
        .iter()
        .filter(|r| r.window_seconds == best.window_seconds)
        .collect();
    let x1 = rows
        .iter()
        .map(|r| r.variance_threshold)
        .fold(VARIANCE_MAX, f64::max)
        * 1.02;
    svg(CHARTS[2], (W, H), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!(
                    "Batch variances (window {} s) and thresholds",
                    best.window_seconds
                ),
                (FONT, 20),
            )
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x1, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("batch variance (the last bin holds everything above 0.25)")
            .y_desc("score updates")
            .draw()?;
        chart.draw_series(j.variances.iter().enumerate().map(|(i, &c)| {
            let a = i as f64 * width;
            Rectangle::new([(a, 0.0), (a + width, c as f64)], BLUE.mix(0.6).filled())
        }))?;
        for (i, r) in rows.iter().enumerate() {
            let color = if r.recommended {
                RED
            } else {
                RGBColor(110, 110, 110)
            };
            let t = r.variance_threshold;
            chart.draw_series(LineSeries::new(
                vec![(t, 0.0), (t, top)],
                color.stroke_width(if r.recommended { 2 } else { 1 }),
            ))?;
            let rate = r
                .flag_rate
                .map_or_else(|| "-".to_owned(), |f| format!("{:.1}%", f * 100.0));
            let y = top * (0.95 - 0.07 * (i % 6) as f64);
            chart.draw_series(std::iter::once(Text::new(
                format!("{t}: {rate}"),
                (t, y),
                (FONT, 13).into_font().color(&color),
            )))?;
        }
        Ok(())
    })
}

/// Score trajectories of the most-voted series: best and configured λ
/// as lines, each batch's mean vote as points.
fn trajectories(t: &Trajectories) -> Result<String> {
    let n = t.series.len().max(1);
    let cols = if n > 1 { 2 } else { 1 };
    let rows = n.div_ceil(cols);
    let size = (W, 300 * rows as u32);
    svg(CHARTS[3], size, |root| {
        let cells = root.split_evenly((rows, cols));
        for ((key, best, conf), cell) in t.series.iter().zip(cells.iter()) {
            let secs = |at: Nanos| at as f64 / NANOS_PER_SEC as f64;
            let (x0, x1) = span(best.iter().chain(conf).map(|p| secs(p.0)), (0.0, 1.0));
            let mut chart = ChartBuilder::on(cell)
                .caption(
                    format!("{} / {}", key.inference_id, key.voter_prompt_id),
                    (FONT, 15),
                )
                .margin(8)
                .x_label_area_size(34)
                .y_label_area_size(44)
                .build_cartesian_2d(x0..x1, -0.02..1.02)?;
            let x_fmt = |x: &f64| {
                let ts = format_timestamp((*x * NANOS_PER_SEC as f64) as Nanos);
                ts.get(5..16).unwrap_or(&ts).replace('T', " ")
            };
            chart
                .configure_mesh()
                .x_labels(4)
                .y_labels(6)
                .x_label_formatter(&x_fmt)
                .draw()?;
            let blue = BLUE.to_rgba();
            let orange = RGBColor(230, 120, 0).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    best.iter().map(|p| (secs(p.0), p.1)),
                    blue.stroke_width(2),
                ))?
                .label(format!("best: {}", label(&t.best)))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue));
            chart
                .draw_series(LineSeries::new(
                    conf.iter().map(|p| (secs(p.0), p.1)),
                    orange.stroke_width(2),
                ))?
                .label(format!("configured: {}", label(&t.configured)))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], orange));
            chart
                .draw_series(
                    best.iter()
                        .map(|p| Circle::new((secs(p.0), p.2), 3, BLACK.mix(0.7).filled())),
                )?
                .label("batch mean vote")
                .legend(|(x, y)| Circle::new((x + 10, y), 3, BLACK.mix(0.7).filled()));
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .label_font((FONT, 10))
                .background_style(WHITE.mix(0.7))
                .border_style(BLACK.mix(0.4))
                .draw()?;
        }
        Ok(())
    })
}

/// Skill per step of event time, one line per grid point.
fn skill_by_step(results: &Results, step_ns: Nanos) -> Result<String> {
    let steps: Vec<i128> = {
        let mut s: Vec<i128> = results
            .points
            .iter()
            .flat_map(|(_, j)| j.steps.keys().copied())
            .collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let day = |i: i128| (i * step_ns) as f64 / NANOS_PER_SEC as f64;
    let lines: Vec<(String, Vec<(f64, f64)>)> = results
        .points
        .iter()
        .map(|(p, j)| {
            let pts = j
                .steps
                .iter()
                .filter_map(|(i, s)| s.metrics().skill.map(|k| (day(*i), k)))
                .collect();
            (label(p), pts)
        })
        .collect();
    let (x0, x1) = span(steps.iter().map(|i| day(*i)), (0.0, 1.0));
    let (y0, y1) = span(
        lines.iter().flat_map(|l| l.1.iter().map(|p| p.1)),
        (0.0, 1.0),
    );
    svg(CHARTS[4], (W, H), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Skill per step of event time", (FONT, 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let x_fmt = |x: &f64| {
            let ts = format_timestamp((*x * NANOS_PER_SEC as f64) as Nanos);
            ts.get(..16).unwrap_or(&ts).replace('T', " ")
        };
        chart
            .configure_mesh()
            .x_desc("step start (UTC)")
            .y_desc("skill")
            .x_labels(6)
            .x_label_formatter(&x_fmt)
            .draw()?;
        for (i, (name, pts)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(
                pts.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 11))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes `dir/index.html`.
pub fn write(
    dir: &Path,
    cfg: &Config,
    opts: &Options,
    results: &Results,
    traj: Option<&Trajectories>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| BacktestError::ReportDir {
        path: dir.to_owned(),
        source,
    })?;
    let charts = [
        by_lambda(
            CHARTS[0],
            results,
            "Skill against λ (higher is better)",
            "skill",
            |m| m.skill,
        )?,
        by_lambda(
            CHARTS[1],
            results,
            "Log loss against λ (lower is better)",
            "log loss",
            |m| m.log_loss,
        )?,
        variance_histogram(results)?,
        match traj {
            Some(t) => trajectories(t)?,
            None => svg(CHARTS[3], (W, 120), |root| {
                root.draw(&Text::new(
                    "no series was scored twice",
                    (20, 50),
                    (FONT, 18).into_font(),
                ))?;
                Ok(())
            })?,
        },
        skill_by_step(results, opts.step_ns)?,
    ];
    let mut html = String::new();
    let _ = write!(
        html,
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>jurystream backtest</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; max-width: 960px; }}
table {{ border-collapse: collapse; margin: 8px 0 24px; font-size: 14px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f2f2f2; }}
figure.chart {{ margin: 0 0 28px; }}
figure.chart svg {{ display: block; }}
figcaption {{ font-size: 13px; color: #555; margin-top: 4px; }}
</style></head><body>
<h1>Backtest of {input}</h1>
<p>{lines} lines, {votes} decoded votes, {rejected} rejected. Configured:
λ = {lambda} per {unit}, window = {window} s. Review budget: flag rate ≤ {budget}.</p>
"#,
        input = escape(&opts.input.display().to_string()),
        lines = results.lines,
        votes = results.votes,
        rejected = results.rejected,
        lambda = cfg.scoring.lambda,
        unit = cfg.scoring.time_unit.as_str().trim_end_matches('s'),
        window = cfg.batching.window_seconds,
        budget = opts.review_budget,
    );
    if let Some(b) = &results.outcome.best {
        let t = b
            .variance_threshold
            .map_or_else(|| "none within the budget".to_owned(), |t| t.to_string());
        let _ = writeln!(
            html,
            "<p><b>Best:</b> λ = {} per {}, window = {} s, variance threshold = {t}.</p>",
            b.lambda,
            b.time_unit.trim_end_matches('s'),
            b.window_seconds
        );
    }
    html.push_str("<table><tr><th>rank</th><th>λ</th><th>unit</th><th>window s</th><th>n</th><th>mse</th><th>log loss</th><th>skill</th><th>coverage</th></tr>\n");
    let f = |x: Option<f64>| x.map_or_else(|| "–".to_owned(), |x| format!("{x:.6}"));
    for (i, r) in results.outcome.grid.iter().enumerate() {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            i + 1,
            r.lambda,
            r.time_unit,
            r.window_seconds,
            r.metrics.n,
            f(r.metrics.mse),
            f(r.metrics.log_loss),
            f(r.metrics.skill),
            f(r.metrics.coverage)
        );
    }
    html.push_str("</table>\n");
    html.push_str("<p>Coverage: how often the 95 % interval of a series' score held the mean vote of its next batch (expect less than 95 %: the interval is for the score, a batch's mean vote also has its own votes' spread).</p>\n");
    let captions = [
        "Skill = 1 − mse / mse of predicting each batch with the previous batch's mean vote.",
        "Log loss of the score before each batch against the batch's mean vote.",
        "Red: the recommended threshold (the smallest with a flag rate within the budget).",
        "Lines: score after each batch; points: each batch's mean vote (best point's batches).",
        "Does the best λ drift? Skill of every grid point per step.",
    ];
    for ((id, chart), caption) in CHARTS.iter().zip(&charts).zip(captions) {
        let _ = writeln!(
            html,
            "<figure class=\"chart\" id=\"{id}\">{chart}<figcaption>{caption}</figcaption></figure>"
        );
    }
    html.push_str("</body></html>\n");
    let path = dir.join("index.html");
    std::fs::write(&path, html).map_err(|source| BacktestError::ReportFile { path, source })
}
