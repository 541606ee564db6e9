//! The backtest report (`--report DIR`) renders in a real browser: headless
//! Chromium lays out `index.html`, a probe copy reports where each chart's
//! SVG landed, a screenshot of the page is taken, and every chart's box
//! must hold drawn (non-background) pixels in more than one colour.
//! Skipped when Chromium is missing, unless JURYSTREAM_REQUIRE_BROKER=1
//! (scripts/install-deps.sh installs the Debian package `chromium`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::command;
use serde_json::Value;

const WIDTH: u32 = 1000;
const CHARTS: [&str; 5] = [
    "skill-by-lambda",
    "log-loss-by-lambda",
    "variance-histogram",
    "trajectories",
    "skill-by-step",
];

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(PathBuf::from)
}

/// Runs headless Chromium on `page` with `args`, at most 120 s.
fn browse(chrome: &Path, page: &Path, height: u32, args: &[&str]) -> std::process::Output {
    let out = Command::new("timeout")
        .arg("120")
        .arg(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--no-first-run",
        ])
        .arg(format!("--window-size={WIDTH},{height}"))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn the_report_draws_every_chart_in_a_browser() {
    let Some(chrome) = chromium() else {
        common::skip_or_fail(
            "chromium is not installed",
            "scripts/install-deps.sh installs the Debian package",
        );
        return;
    };
    let mut dir = tempfile::tempdir().unwrap();
    // JURYSTREAM_TEST_KEEP=1 keeps the report and the screenshot.
    if std::env::var_os("JURYSTREAM_TEST_KEEP").is_some() {
        dir.disable_cleanup(true);
        eprintln!("keeping {}", dir.path().display());
    }
    let dir_path = dir.path().to_owned();
    let report = dir_path.join("report");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/votes.jsonl");
    let out = command()
        .args([
            "backtest",
            "--lambda",
            "0.001,0.01,0.1",
            "--window",
            "60,300",
        ])
        .arg("--input")
        .arg(&input)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = report.join("index.html");
    let html = std::fs::read_to_string(&page).unwrap();

    // Self-contained: no script, no external reference.
    assert!(!html.contains("<script"), "the report has no script");
    for external in ["http://", "https://", "src="] {
        let outside_svg = html.replace("http://www.w3.org/2000/svg", "");
        assert!(
            !outside_svg.contains(external),
            "the report refers to something outside it: {external}"
        );
    }
    // Every chart is a figure with an SVG that has drawn elements.
    for id in CHARTS {
        let start = html
            .find(&format!("<figure class=\"chart\" id=\"{id}\">"))
            .unwrap_or_else(|| panic!("no chart {id}"));
        let end = start + html[start..].find("</figure>").unwrap();
        let fig = &html[start..end];
        assert!(fig.contains("<svg"), "{id}: no svg");
        let marks = ["<polyline", "<rect", "<circle", "<path", "<line"]
            .iter()
            .map(|m| fig.matches(m).count())
            .sum::<usize>();
        assert!(marks > 10, "{id}: only {marks} drawn elements");
        assert!(fig.contains("<text"), "{id}: no text (axes, caption)");
    }

    // Where each chart landed: a probe copy writes the boxes into the title.
    let probe = dir_path.join("probe.html");
    let script = r#"<script>
document.title = JSON.stringify({
  height: document.documentElement.scrollHeight,
  boxes: Array.from(document.querySelectorAll('figure.chart')).map(f => {
    const r = f.querySelector('svg').getBoundingClientRect();
    return [f.id, r.x, r.y + window.scrollY, r.width, r.height];
  })
});
</script></body>"#;
    std::fs::write(&probe, html.replace("</body>", script)).unwrap();
    let dom = browse(&chrome, &probe, 4000, &["--dump-dom"]);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let title = dom
        .split("<title>")
        .nth(1)
        .and_then(|t| t.split("</title>").next())
        .expect("the probe's title");
    let layout: Value = serde_json::from_str(&title.replace("&amp;", "&")).unwrap();
    let height = layout["height"].as_f64().unwrap().ceil() as u32;
    assert!(height > 1000, "page height {height}");

    // The screenshot of the report itself.
    let shot = dir_path.join("report.png");
    browse(
        &chrome,
        &page,
        height,
        &[&format!("--screenshot={}", shot.display())],
    );
    let decoder = png::Decoder::new(std::fs::File::open(&shot).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let px = |x: u32, y: u32| {
        let i = (y as usize * info.width as usize + x as usize) * channels;
        (buf[i], buf[i + 1], buf[i + 2])
    };
    let boxes = layout["boxes"].as_array().unwrap();
    assert_eq!(boxes.len(), CHARTS.len());
    for b in boxes {
        let id = b[0].as_str().unwrap();
        let (x, y, w, h) = (
            b[1].as_f64().unwrap() as u32,
            b[2].as_f64().unwrap() as u32,
            b[3].as_f64().unwrap() as u32,
            b[4].as_f64().unwrap() as u32,
        );
        assert!(w >= 300 && h >= 100, "{id}: box {w}x{h}");
        assert!(
            x + w <= info.width && y + h <= info.height,
            "{id}: box ({x},{y},{w},{h}) outside the {}x{} screenshot",
            info.width,
            info.height
        );
        let mut drawn = 0usize;
        let mut colours = std::collections::HashSet::new();
        for yy in y..y + h {
            for xx in x..x + w {
                let p = px(xx, yy);
                if p != (255, 255, 255) {
                    drawn += 1;
                    colours.insert((p.0 / 32, p.1 / 32, p.2 / 32));
                }
            }
        }
        let share = drawn as f64 / (w * h) as f64;
        assert!(
            share > 0.01,
            "{id}: only {:.2}% of its box is drawn (screenshot {})",
            share * 100.0,
            shot.display()
        );
        assert!(
            colours.len() >= 3,
            "{id}: {} colours drawn (screenshot {})",
            colours.len(),
            shot.display()
        );
    }
}
