//! A real Prometheus server for the scrape tests (Debian `prometheus`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use serde_json::Value;

use super::{free_port, skip_or_fail};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn tool_ok(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// GET over HTTP/1.0 on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A Prometheus server scraping its targets every second, with the
/// project's rules loaded.
pub struct Prometheus {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts scraping `127.0.0.1:PORT` for each of `target_ports`.
    pub fn start(target_ports: &[u16]) -> Prometheus {
        let targets: Vec<String> = target_ports
            .iter()
            .map(|p| format!("\"127.0.0.1:{p}\""))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let rules = root().join("deploy/prometheus/alerts.yml");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: jurystream\n    static_configs:\n      - targets: [{targets}]\n",
                rules = rules.display(),
                targets = targets.join(", ")
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let mut p = Prometheus { child, port, dir };
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((200, _)) = http_get(port, "/-/ready") {
                break;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", p.log());
            }
            assert!(
                Instant::now() < end,
                "prometheus not ready after 60 s:\n{}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    pub fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.port, path)
            .unwrap_or_else(|| panic!("no answer from prometheus for {path}"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: HTTP {status}, not JSON ({e}): {body}"));
        assert_eq!(v["status"], "success", "{path}: HTTP {status}: {body}");
        v["data"].clone()
    }

    /// The series an instant query returns (a PromQL error fails the test).
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", urlencode(expr)));
        match data["resultType"].as_str() {
            Some("vector") | Some("matrix") => data["result"].as_array().unwrap().clone(),
            Some("scalar") => vec![data["result"].clone()],
            other => panic!("{expr}: unexpected result type {other:?}"),
        }
    }

    /// The value of a query returning one series (None while it returns none).
    pub fn value(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr);
        r.first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `prometheus` and `promtool` are installed (if not: skip, or
/// fail under `JURYSTREAM_REQUIRE_BROKER=1`).
pub fn prometheus_installed() -> bool {
    let missing: Vec<&str> = ["prometheus", "promtool"]
        .into_iter()
        .filter(|c| !tool_ok(c))
        .collect();
    if missing.is_empty() {
        return true;
    }
    skip_or_fail(
        &format!("{} not installed", missing.join(" and ")),
        "scripts/install-deps.sh installs them",
    );
    false
}

impl Prometheus {
    /// Krippendorff's α per rubric (contract §11) from the four agreement
    /// counters summed over every target: their values since the
    /// instances started.
    pub fn agreement_alpha(&self) -> BTreeMap<String, f64> {
        let sum = |name: &str| format!("sum by (voter_prompt_id) ({name})");
        let q = format!(
            "1 - ({n} - 1) * {w} / ({n} * {s2} - {s1} ^ 2 > 0)",
            n = sum("jurystream_agreement_pairable_votes_total"),
            w = sum("jurystream_agreement_within_unit_total"),
            s2 = sum("jurystream_agreement_vote_square_sum_total"),
            s1 = sum("jurystream_agreement_vote_sum_total"),
        );
        self.by_rubric(&q)
    }

    /// `jurystream_agreement_pairable_votes_total` summed over every target,
    /// per rubric.
    pub fn agreement_pairable(&self) -> BTreeMap<String, f64> {
        self.by_rubric("sum by (voter_prompt_id) (jurystream_agreement_pairable_votes_total)")
    }

    fn by_rubric(&self, q: &str) -> BTreeMap<String, f64> {
        self.query(q)
            .iter()
            .map(|s| {
                (
                    s["metric"]["voter_prompt_id"]
                        .as_str()
                        .unwrap_or("?")
                        .to_owned(),
                    s["value"][1].as_str().unwrap().parse::<f64>().unwrap(),
                )
            })
            .collect()
    }
}

impl Prometheus {
    /// What differs between the counters summed over every target and
    /// `offline` (`jurystream agreement --format json` of the same log):
    /// α per rubric within 1e-9, pairable votes exactly (a cycle counted
    /// twice would show); `None` when they agree.
    pub fn agreement_mismatch(&self, offline: &Value) -> Option<String> {
        let rows = offline["rubrics"].as_array()?;
        let want: BTreeMap<String, (Option<f64>, f64)> = rows
            .iter()
            .map(|r| {
                (
                    r["voter_prompt_id"].as_str().unwrap_or("?").to_owned(),
                    (
                        r["alpha"].as_f64(),
                        r["pairable_votes"].as_f64().unwrap_or(-1.0),
                    ),
                )
            })
            .collect();
        let (alpha, pairable) = (self.agreement_alpha(), self.agreement_pairable());
        let defined = want.values().filter(|w| w.0.is_some()).count();
        let same = alpha.len() == defined
            && want.iter().all(|(k, (a, n))| {
                pairable.get(k) == Some(n)
                    && a.is_none_or(|a| alpha.get(k).is_some_and(|b| (a - b).abs() <= 1e-9))
            });
        (!same).then(|| {
            format!("PromQL α {alpha:?} and pairable votes {pairable:?}, agreement {want:?}")
        })
    }
}

impl Prometheus {
    /// The leaderboard's `score_sd` per (model_id, voter_prompt_id) from
    /// the three leaderboard gauges summed over every target (contract §13),
    /// for rows of at least two series. A missing model_id is `unknown`.
    pub fn score_sd(&self) -> BTreeMap<(String, String), f64> {
        let sum = |name: &str| format!("sum by (model_id, voter_prompt_id) ({name})");
        let q = format!(
            "sqrt(clamp_min(({q} - {s} ^ 2 / {n}) / ({n} - 1 > 0), 0))",
            q = sum("jurystream_model_score_squares"),
            s = sum("jurystream_model_scores"),
            n = sum("jurystream_model_series"),
        );
        self.query(&q)
            .iter()
            .map(|s| {
                let label = |k: &str| s["metric"][k].as_str().unwrap_or("?").to_owned();
                (
                    (label("model_id"), label("voter_prompt_id")),
                    s["value"][1].as_str().unwrap().parse::<f64>().unwrap(),
                )
            })
            .collect()
    }

    /// What differs between [`Prometheus::score_sd`] and the `score_sd` of
    /// the leaderboard rows `board` (within 1e-6: PromQL's f64 sums cancel
    /// where the service's fixed-point sums do not); `None` when they
    /// agree.
    pub fn score_sd_mismatch(&self, board: &[Value]) -> Option<String> {
        let want: BTreeMap<(String, String), f64> = board
            .iter()
            .filter_map(|r| {
                let model = r["model_id"].as_str().unwrap_or("unknown").to_owned();
                let rubric = r["voter_prompt_id"].as_str()?.to_owned();
                Some(((model, rubric), r["score_sd"].as_f64()?))
            })
            .collect();
        let have = self.score_sd();
        let same = have.len() == want.len()
            && want
                .iter()
                .all(|(k, w)| have.get(k).is_some_and(|h| (h - w).abs() <= 1e-6));
        (!same).then(|| format!("PromQL score_sd {have:?}, leaderboard {want:?}"))
    }
}
