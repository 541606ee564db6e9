//! The deployment files (deploy/): scripts/validate-deploy.sh passes, and
//! every metric the alert rules (directly or through the recording rules
//! they read) and the dashboard use is one jurystream exports
//! (src/telemetry/names.rs), every alert has a unit test and a runbook; the
//! manifests, rules and panels of `jurystream connect` (contract §12) fit
//! together.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The metric names src/telemetry/names.rs declares (`pub const X: &str = "jurystream_..."`).
fn exported_metrics() -> BTreeSet<String> {
    let src = read("src/telemetry/names.rs");
    let names: BTreeSet<String> = src
        .lines()
        .filter(|l| l.trim_start().starts_with("pub const ") && l.contains(": &str"))
        .filter_map(|l| l.split('"').nth(1))
        .filter(|n| n.starts_with("jurystream_"))
        .map(str::to_owned)
        .collect();
    assert!(
        names.len() >= 19,
        "too few metric constants found: {names:?}"
    );
    names
}

/// `jurystream_[a-z_]+` tokens of a PromQL expression (recording-rule names
/// with colons do not match).
fn metric_tokens(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("jurystream_") {
        let start = i + pos;
        let boundary = start == 0 || {
            let c = b[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
        };
        let mut end = start + "jurystream_".len();
        while end < b.len() && (b[end].is_ascii_lowercase() || b[end] == b'_') {
            end += 1;
        }
        if boundary {
            out.push(expr[start..end].to_owned());
        }
        i = end;
    }
    out
}

/// The metric a series name belongs to: itself, or a histogram's name
/// without `_bucket`, `_sum` or `_count`.
fn base_metric(token: &str, exported: &BTreeSet<String>) -> Option<String> {
    if exported.contains(token) {
        return Some(token.to_owned());
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = token.strip_suffix(suffix) {
            if exported.contains(base) {
                return Some(base.to_owned());
            }
        }
    }
    None
}

/// One rule of alerts.yml: (alert name, expr, the rule's text).
fn alert_rules() -> Vec<(String, String, String)> {
    let rules = rules_of("- alert:");
    assert!(!rules.is_empty(), "no alert rules parsed");
    rules
}

/// The recording rules of alerts.yml: record name → expr.
fn recording_rules() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, expr, _) in rules_of("- record:") {
        assert!(
            out.insert(name.clone(), expr).is_none(),
            "recording rule {name} defined twice"
        );
    }
    assert!(!out.is_empty(), "no recording rules parsed");
    out
}

/// The rules of alerts.yml that start with `key` ("- alert:" or
/// "- record:"): (name, expr, the rule's text).
fn rules_of(key: &str) -> Vec<(String, String, String)> {
    let text = read("deploy/prometheus/alerts.yml");
    let lines: Vec<&str> = text.lines().collect();
    let mut rules = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        if let Some(name) = l.strip_prefix(key) {
            let indent = lines[i].len() - l.len();
            let mut j = i + 1;
            while j < lines.len() {
                let t = lines[j].trim_start();
                let ind = lines[j].len() - t.len();
                if !t.is_empty() && ind <= indent {
                    break;
                }
                j += 1;
            }
            let body = lines[i..j].join("\n");
            rules.push((name.trim().to_owned(), rule_expr(&lines[i..j]), body));
            i = j;
        } else {
            i += 1;
        }
    }
    rules
}

/// `jurystream:...` recording-rule names an expression reads.
fn recorded_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(pos) = expr[i..].find("jurystream:") {
        let start = i + pos;
        let boundary = start == 0 || {
            let c = b[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
        };
        let mut end = start + "jurystream:".len();
        while end < b.len()
            && (b[end].is_ascii_lowercase()
                || b[end].is_ascii_digit()
                || b[end] == b'_'
                || b[end] == b':')
        {
            end += 1;
        }
        if boundary {
            out.push(expr[start..end].to_owned());
        }
        i = end;
    }
    out
}

/// `expr` followed by the exprs of the recording rules it reads, and of
/// those they read, so that `metric_tokens` sees the metrics behind them.
/// Every recording rule it reads must be one of alerts.yml.
fn expand(what: &str, expr: &str, records: &BTreeMap<String, String>) -> String {
    let mut out = expr.to_owned();
    let mut seen = BTreeSet::new();
    let mut todo = recorded_names(expr);
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let body = records.get(&name).unwrap_or_else(|| {
            panic!("{what} reads {name}, which is no recording rule of alerts.yml")
        });
        out.push('\n');
        out.push_str(body);
        todo.extend(recorded_names(body));
    }
    out
}

/// The `expr:` of one rule: inline, or a `|` block (more indented lines).
fn rule_expr(rule: &[&str]) -> String {
    for (k, line) in rule.iter().enumerate() {
        let t = line.trim_start();
        if let Some(v) = t.strip_prefix("expr:") {
            let v = v.trim();
            if v != "|" && v != ">" && v != "|-" && v != ">-" {
                return v.to_owned();
            }
            let indent = line.len() - t.len();
            let mut out = Vec::new();
            for l in &rule[k + 1..] {
                let tt = l.trim_start();
                if !tt.is_empty() && l.len() - tt.len() <= indent {
                    break;
                }
                out.push(tt);
            }
            return out.join("\n");
        }
    }
    panic!("rule without expr:\n{}", rule.join("\n"));
}

/// Every PromQL string of the dashboard: panel targets and variable queries.
fn dashboard_exprs() -> Vec<(String, String)> {
    let d: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/jurystream.json")).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap_or("?").to_owned(),
                t["expr"].as_str().unwrap_or("").to_owned(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap();
            out.push((format!("variable {}", v["name"]), q.to_owned()));
        }
    }
    out
}

#[test]
fn validate_deploy_script_passes() {
    let missing: Vec<&str> = ["promtool", "python3"]
        .into_iter()
        .filter(|c| !have(c))
        .collect();
    if !missing.is_empty() {
        return common::skip_or_fail(
            &format!("{} not installed", missing.join(" and ")),
            "scripts/install-deps.sh installs them",
        );
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/validate-deploy.sh"))
        .env("JURYSTREAM_BIN", env!("CARGO_BIN_EXE_jurystream"))
        .output()
        .expect("run scripts/validate-deploy.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/validate-deploy.sh failed ({:?})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("validate-deploy: all checks passed"),
        "{stdout}"
    );
    // The config files were loaded by the binary, not skipped.
    assert!(
        stdout.contains("ok: deploy/compose/config.toml"),
        "{stdout}"
    );
    // The connect ones too, by a binary that has the connect command.
    let has_connect = Command::new(env!("CARGO_BIN_EXE_jurystream"))
        .args(["connect", "--help"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert_eq!(
        stdout.contains("ok: deploy/compose/connect.toml"),
        has_connect,
        "deploy/compose/connect.toml loaded iff the binary has `connect`:\n{stdout}"
    );
}

/// The exported metrics `exprs` use, and the tokens that are not exported.
fn resolve(
    exprs: &[(String, String)],
    exported: &BTreeSet<String>,
) -> (HashSet<String>, Vec<String>) {
    let mut used = HashSet::new();
    let mut unknown = Vec::new();
    for (what, expr) in exprs {
        for t in metric_tokens(expr) {
            match base_metric(&t, exported) {
                Some(b) => {
                    used.insert(b);
                }
                None => unknown.push(format!("{what}: {t}")),
            }
        }
    }
    (used, unknown)
}

#[test]
fn alert_and_dashboard_metrics_exist_in_telemetry() {
    let exported = exported_metrics();
    let records = recording_rules();
    // An alert's expr with the recording rules it reads.
    let alerts: Vec<(String, String)> = alert_rules()
        .into_iter()
        .map(|(name, expr, _)| {
            let what = format!("alert {name}");
            let expr = expand(&what, &expr, &records);
            (what, expr)
        })
        .collect();
    let recorded: Vec<(String, String)> = records
        .iter()
        .map(|(name, expr)| {
            let what = format!("recording rule {name}");
            let expr = expand(&what, expr, &records);
            (what, expr)
        })
        .collect();
    let panels = dashboard_exprs();
    for (what, expr) in alerts.iter().chain(&panels) {
        assert!(
            !metric_tokens(expr).is_empty()
                || expr.contains("up{job=\"jurystream\"}")
                || expr.contains("up{job=\"jurystream-connect\"}"),
            "{what} uses no jurystream metric: {expr}"
        );
    }
    // The values of the connect metrics' labels (result, source, action)
    // that rules and panels select are values src/telemetry/names.rs
    // documents (`produced`, `failed` ...): a typo selects nothing.
    let telemetry = read("src/telemetry/names.rs");
    for (what, expr) in alerts.iter().chain(&recorded).chain(&panels) {
        for (label, value) in label_matchers(expr) {
            if ["result", "source", "action"].contains(&label.as_str()) {
                assert!(
                    telemetry.contains(&format!("`{value}`")),
                    "{what}: {label}=\"{value}\" is no value src/telemetry/names.rs documents"
                );
            }
        }
    }
    let (alert_used, unknown_a) = resolve(&alerts, &exported);
    let (_, unknown_r) = resolve(&recorded, &exported);
    let (dash_used, unknown_d) = resolve(&panels, &exported);
    let unknown: Vec<_> = unknown_a
        .into_iter()
        .chain(unknown_r)
        .chain(unknown_d)
        .collect();
    assert!(
        unknown.is_empty(),
        "metrics not exported by src/telemetry/names.rs: {unknown:#?}"
    );
    // The dashboard shows every exported metric.
    let missing: Vec<_> = exported
        .iter()
        .filter(|m| !dash_used.contains(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard shows none of {missing:?}"
    );
    // The alerts cover the signals the issue names.
    for m in [
        "jurystream_last_score_update_timestamp_seconds",
        "jurystream_votes_accepted_total",
        "jurystream_ambiguity_flags_total",
        "jurystream_votes_rejected_total",
        "jurystream_consumer_lag_messages",
        "jurystream_commit_duration_seconds",
        "jurystream_model_scores",
        "jurystream_model_score_squares",
        "jurystream_model_series",
        // jurystream connect (contract §12)
        "jurystream_connect_votes_total",
        "jurystream_connect_routing_total",
        "jurystream_connect_sync_runs_total",
        "jurystream_connect_last_sync_timestamp_seconds",
    ] {
        assert!(alert_used.contains(m), "no alert uses {m}");
    }
}

/// `label="value"` matchers of a PromQL expression (`=` only, not `=~`,
/// `!=`).
fn label_matchers(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(pos) = rest.find("=\"") {
        let before = &rest[..pos];
        let label: String = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let after = &rest[pos + 2..];
        let end = after.find('"').unwrap_or(after.len());
        if !label.is_empty() && !before.ends_with(['!', '=', '~']) {
            out.push((label, after[..end].to_owned()));
        }
        rest = &after[end.min(after.len())..];
        if let Some(r) = rest.strip_prefix('"') {
            rest = r;
        }
    }
    out
}

#[test]
fn metric_token_parsing() {
    assert_eq!(
        label_matchers(
            "sum(rate(jurystream_connect_votes_total{result=\"failed\", source!=\"api\"}[5m])) \
             + up{job=~\"x\",instance=\"a:1\"}"
        ),
        vec![
            ("result".to_owned(), "failed".to_owned()),
            ("instance".to_owned(), "a:1".to_owned())
        ]
    );
    let exported = exported_metrics();
    let toks = metric_tokens(
        "histogram_quantile(0.9, sum by (le) (rate(jurystream_commit_duration_seconds_bucket[5m]))) \
         / jurystream:ratio:rate5m + x_jurystream_nope + jurystream_score_count",
    );
    assert_eq!(
        toks,
        vec![
            "jurystream_commit_duration_seconds_bucket".to_owned(),
            "jurystream_score_count".to_owned()
        ]
    );
    assert_eq!(
        base_metric("jurystream_score_count", &exported).as_deref(),
        Some("jurystream_score")
    );
    assert_eq!(base_metric("jurystream_scores_total", &exported), None);
    assert_eq!(
        recorded_names(
            "(jurystream:model_score_mean offset 1h - jurystream:model_score_mean) \
             > jurystream:model_score_drop_noise:1h and x_jurystream:nope + jurystream_score"
        ),
        vec![
            "jurystream:model_score_mean".to_owned(),
            "jurystream:model_score_mean".to_owned(),
            "jurystream:model_score_drop_noise:1h".to_owned(),
        ]
    );
    let mut records = BTreeMap::new();
    records.insert("jurystream:a".to_owned(), "sum(jurystream_x)".to_owned());
    records.insert(
        "jurystream:b:1h".to_owned(),
        "jurystream:a offset 1h / jurystream:a".to_owned(),
    );
    let e = expand("t", "jurystream:b:1h > 1", &records);
    assert_eq!(metric_tokens(&e), vec!["jurystream_x".to_owned()]);
    let undefined = std::panic::catch_unwind(|| expand("t", "jurystream:c > 1", &records));
    assert!(
        undefined.is_err(),
        "an undefined recording rule is an error"
    );
}

/// GitHub's heading anchor: lower case, punctuation dropped, spaces to '-'.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_has_labels_annotations_runbook_and_a_unit_test() {
    let docs = read("docs/operations.md");
    let anchors: HashSet<String> = docs
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    let tests = read("deploy/prometheus/alerts_test.yml");
    let mut names = HashSet::new();
    for (name, _, body) in alert_rules() {
        assert!(names.insert(name.clone()), "alert {name} defined twice");
        let sev = body
            .lines()
            .find_map(|l| l.trim().strip_prefix("severity:"))
            .map(str::trim);
        assert!(
            matches!(sev, Some("critical") | Some("warning")),
            "alert {name}: severity critical or warning, got {sev:?}"
        );
        for key in ["summary:", "description:", "runbook_url:"] {
            assert!(
                body.lines().any(|l| l.trim_start().starts_with(key)),
                "alert {name}: no {key}"
            );
        }
        let url = body
            .lines()
            .find_map(|l| l.trim().strip_prefix("runbook_url:"))
            .unwrap()
            .trim()
            .trim_matches('"');
        let frag = url.strip_prefix("docs/operations.md#").unwrap_or_else(|| {
            panic!("alert {name}: runbook_url {url} is not docs/operations.md#...")
        });
        assert!(
            anchors.contains(frag),
            "alert {name}: docs/operations.md has no heading for #{frag}"
        );
        // promtool does not notice an untested alert: every one must fire
        // in some test, and be expected silent in some test.
        let firing = format!("alertname: {name}\n");
        let occurrences: Vec<usize> = tests.match_indices(&firing).map(|(i, _)| i).collect();
        assert!(
            !occurrences.is_empty(),
            "alert {name} has no test in alerts_test.yml"
        );
        let after = |i: usize| {
            tests[i + firing.len()..]
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        assert!(
            occurrences.iter().any(|&i| after(i) == "exp_alerts:"),
            "alert {name}: no test where it fires"
        );
        assert!(
            occurrences.iter().any(|&i| after(i) == "exp_alerts: []"),
            "alert {name}: no test where it stays silent"
        );
    }
    assert!(names.len() >= 6);
}

/// The value of the first `key:` line at exactly `indent` spaces.
fn yaml_scalar(text: &str, indent: usize, key: &str) -> Option<String> {
    let prefix = format!("{}{key}:", " ".repeat(indent));
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
}

/// The `config.toml: |` block of deploy/k8s/configmap.yaml, dedented and
/// parsed.
fn k8s_config() -> toml::Table {
    configmap_toml("deploy/k8s/configmap.yaml")
}

/// The `config.toml: |` block of a ConfigMap manifest, dedented and parsed.
fn configmap_toml(rel: &str) -> toml::Table {
    let text = read(rel);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == "config.toml: |")
        .unwrap_or_else(|| panic!("{rel}: no `config.toml: |` block"));
    let indent = lines[start].len() - lines[start].trim_start().len();
    let mut block = Vec::new();
    for l in &lines[start + 1..] {
        let t = l.trim_start();
        if !t.is_empty() && l.len() - t.len() <= indent {
            break;
        }
        block.push(*l);
    }
    let cut = block
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut toml_text = String::new();
    for l in &block {
        toml_text.push_str(l.get(cut..).unwrap_or(""));
        toml_text.push('\n');
    }
    toml_text
        .parse()
        .unwrap_or_else(|e| panic!("{rel} config.toml: {e}\n{toml_text}"))
}

/// api.peers in the Kubernetes ConfigMap names every StatefulSet pod, once,
/// through the headless Service that is the StatefulSet's serviceName, on
/// the port of metrics.listen (the query API's listener).
#[test]
fn k8s_api_peers_list_one_url_per_statefulset_replica() {
    let sts = read("deploy/k8s/statefulset.yaml");
    let svc = read("deploy/k8s/service.yaml");
    let name = yaml_scalar(&sts, 2, "name").expect("statefulset.yaml: metadata.name");
    let service = yaml_scalar(&sts, 2, "serviceName").expect("statefulset.yaml: spec.serviceName");
    let replicas: usize = yaml_scalar(&sts, 2, "replicas")
        .expect("statefulset.yaml: spec.replicas")
        .parse()
        .expect("spec.replicas is a number");
    assert!(replicas >= 1);
    assert_eq!(
        yaml_scalar(&svc, 2, "name").as_deref(),
        Some(service.as_str()),
        "service.yaml must define the StatefulSet's serviceName {service}"
    );
    assert_eq!(
        yaml_scalar(&svc, 2, "clusterIP").as_deref(),
        Some("None"),
        "service.yaml: the StatefulSet's Service must be headless (clusterIP: None)"
    );

    let conf = k8s_config();
    let listen = conf
        .get("metrics")
        .and_then(|m| m.get("listen"))
        .and_then(|v| v.as_str());
    assert_eq!(listen, Some("0.0.0.0:9464"), "configmap: metrics.listen");
    let port = "9464";
    let peers: Vec<String> = conf
        .get("api")
        .and_then(|a| a.get("peers"))
        .and_then(|p| p.as_array())
        .expect("configmap: api.peers must be an array")
        .iter()
        .map(|p| {
            p.as_str()
                .expect("api.peers entries are strings")
                .to_owned()
        })
        .collect();
    assert_eq!(
        peers.len(),
        replicas,
        "configmap api.peers must list one URL per StatefulSet replica ({replicas}): {peers:?}"
    );
    for (i, url) in peers.iter().enumerate() {
        let rest = url
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("api.peers[{i}] {url}: not http://"));
        let authority = rest.trim_end_matches('/');
        assert!(
            !authority.contains('/'),
            "api.peers[{i}] {url}: a base URL has no path"
        );
        let (host, p) = authority
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("api.peers[{i}] {url}: no port"));
        assert_eq!(p, port, "api.peers[{i}] {url}: port of metrics.listen");
        // pod <name>-<i> through the headless Service: the short name, or
        // a longer one (<ns>.svc[.cluster.local]) after it.
        let pod_host = format!("{name}-{i}.{service}");
        assert!(
            host == pod_host || host.starts_with(&format!("{pod_host}.")),
            "api.peers[{i}] {url}: expected pod {name}-{i} of Service {service} ({pod_host}[.<ns>.svc...])"
        );
    }
}

/// The leaderboard panels and the score-drop alert use the three gauges of
/// contract §8 and §13 (v3): the mean, and how sure it is (the sample sd of
/// the series' scores, the 95 % interval of the mean). The alert's
/// threshold and z are one recording rule each.
#[test]
fn leaderboard_panels_and_score_drop_alert() {
    let d: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/jurystream.json")).unwrap();
    let panel = |title: &str| -> serde_json::Value {
        d["panels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("dashboard: no panel {title:?}"))
            .clone()
    };
    let target = |p: &serde_json::Value, refid: &str| -> String {
        p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["refId"] == refid)
            .unwrap_or_else(|| panic!("panel {}: no target {refid}", p["title"]))["expr"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let uses = |what: &str, e: &str, needles: &[&str]| {
        for n in needles {
            assert!(e.contains(n), "{what}: does not use {n}: {e}");
        }
        assert!(
            e.contains("by (model_id, voter_prompt_id)"),
            "{what}: per model and rubric: {e}"
        );
    };
    const MEAN: &[&str] = &["jurystream_model_scores", "jurystream_model_series"];
    // sd = sqrt((Σ squares − (Σ scores)²/n) / (n − 1)), variance clamped
    // at 0, only for n ≥ 2; the interval is mean ± z·sd/√n with contract §13's z.
    const SD: &[&str] = &[
        "jurystream_model_score_squares",
        "jurystream_model_scores",
        "jurystream_model_series",
        "clamp_min(",
        ">= 2)",
        "- 1)",
    ];
    const Z: &str = "1.959963984540054";

    let table = panel("Model leaderboard");
    assert_eq!(table["type"], "table");
    for t in table["targets"].as_array().unwrap() {
        assert_eq!(
            t["instant"], true,
            "leaderboard targets are instant queries"
        );
        assert_eq!(t["format"], "table");
    }
    // A and B are the mean and the series (tests/prometheus_scrape.rs
    // compares them with the scores topic); C, D, E the sd and the
    // interval's low and high, each a column of its own.
    uses("Model leaderboard [A]", &target(&table, "A"), MEAN);
    uses(
        "Model leaderboard [B]",
        &target(&table, "B"),
        &["jurystream_model_series"],
    );
    uses("Model leaderboard [C]", &target(&table, "C"), SD);
    for refid in ["D", "E"] {
        let e = target(&table, refid);
        uses(&format!("Model leaderboard [{refid}]"), &e, SD);
        assert!(e.contains(Z), "Model leaderboard [{refid}]: z {Z}: {e}");
    }
    assert!(target(&table, "D").contains(&format!(" - {Z} *")));
    assert!(target(&table, "E").contains(&format!(" + {Z} *")));
    let renamed = table["transformations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "organize")
        .expect("Model leaderboard: organize transformation")["options"]["renameByName"]
        .clone();
    for refid in ["A", "B", "C", "D", "E"] {
        let column = renamed[format!("Value #{refid}")].as_str().unwrap_or("");
        assert!(
            !column.is_empty(),
            "Model leaderboard: Value #{refid} has no column name"
        );
    }

    let over_time = panel("Mean score by model over time");
    assert_eq!(over_time["type"], "timeseries");
    uses(
        "Mean score by model over time [A]",
        &target(&over_time, "A"),
        MEAN,
    );
    for refid in ["B", "C"] {
        let e = target(&over_time, refid);
        uses(&format!("Mean score by model over time [{refid}]"), &e, SD);
        assert!(
            e.contains(Z),
            "Mean score by model over time [{refid}]: {e}"
        );
    }

    // The name contract §8 v2 gave the sum of the scores is gone (renamed
    // jurystream_model_scores in v3): no deploy file may still read it.
    let mut files = vec![root().join("deploy")];
    while let Some(f) = files.pop() {
        if f.is_dir() {
            files.extend(std::fs::read_dir(&f).unwrap().map(|e| e.unwrap().path()));
        } else if let Ok(text) = std::fs::read_to_string(&f) {
            assert!(
                !text.contains("jurystream_model_score_sum"),
                "{} still names jurystream_model_score_sum (v3: jurystream_model_scores)",
                f.display()
            );
        }
    }

    let rules = read("deploy/prometheus/alerts.yml");
    let records = recording_rules();
    for name in [
        "jurystream:model_score_drop_threshold",
        "jurystream:model_score_drop_z",
    ] {
        assert_eq!(
            rules.matches(&format!("- record: {name}\n")).count(),
            1,
            "alerts.yml: one recording rule {name}"
        );
        // a single sample without labels: the rules read it with scalar()
        let number = records[name]
            .strip_prefix("vector(")
            .and_then(|v| v.strip_suffix(')'))
            .and_then(|v| v.parse::<f64>().ok());
        assert!(
            number.is_some_and(|v| v > 0.0),
            "{name}: expr must be vector(<positive number>), got {}",
            records[name]
        );
    }
    let (_, expr, _) = alert_rules()
        .into_iter()
        .find(|(n, _, _)| n == "JurystreamModelScoreDropped")
        .expect("alert JurystreamModelScoreDropped");
    for needle in [
        "scalar(jurystream:model_score_drop_threshold)",
        "jurystream:model_score_drop_noise:1h",
        "jurystream:model_score_mean offset 1h",
        "jurystream:model_series offset 1h",
    ] {
        assert!(
            expr.contains(needle),
            "JurystreamModelScoreDropped: no {needle}: {expr}"
        );
    }
    // The noise bound z·sqrt(sd²/n + sd_1h²/n_1h), and the sd behind it.
    let noise = &records["jurystream:model_score_drop_noise:1h"];
    for needle in [
        "scalar(jurystream:model_score_drop_z)",
        "jurystream:model_score_sd offset 1h",
        "jurystream:model_series offset 1h",
    ] {
        assert!(
            noise.contains(needle),
            "jurystream:model_score_drop_noise:1h: no {needle}: {noise}"
        );
    }
    let behind = expand("JurystreamModelScoreDropped", &expr, &records);
    for needle in SD {
        assert!(
            records["jurystream:model_score_sd"].contains(needle),
            "jurystream:model_score_sd: no {needle}"
        );
        assert!(behind.contains(needle));
    }
}

// ---------------------------------------------------------------- connect

/// The alerts of `jurystream connect` (contract §12), group jurystream.connect:
/// each reads the signal the issue names, the sync alerts only look at
/// instances that sync, and the stale threshold is one recording rule.
#[test]
fn connect_alerts() {
    let text = read("deploy/prometheus/alerts.yml");
    let group = text
        .split("  - name: ")
        .find(|g| g.starts_with("jurystream.connect\n"))
        .expect("alerts.yml: no group jurystream.connect");
    let alerts: BTreeMap<String, (String, String)> = alert_rules()
        .into_iter()
        .map(|(name, expr, body)| (name, (expr, body)))
        .collect();
    let rule = |name: &str| -> (String, String) {
        assert!(
            group.contains(&format!("- alert: {name}\n")),
            "alert {name} is not in group jurystream.connect"
        );
        alerts[name].clone()
    };
    let for_of = |body: &str| -> String {
        body.lines()
            .find_map(|l| l.trim().strip_prefix("for:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let has = |name: &str, expr: &str, needles: &[&str]| {
        for n in needles {
            assert!(expr.contains(n), "{name}: does not use {n}: {expr}");
        }
    };

    let (expr, body) = rule("JurystreamConnectInstanceDown");
    has(
        "JurystreamConnectInstanceDown",
        &expr,
        &["up{job=\"jurystream-connect\"} == 0"],
    );
    assert_eq!(for_of(&body), "5m");

    // The broker does not acknowledge: result="failed", 5 minutes.
    let (expr, body) = rule("JurystreamConnectProduceFailing");
    has(
        "JurystreamConnectProduceFailing",
        &expr,
        &["jurystream_connect_votes_total{result=\"failed\"}", "> 0"],
    );
    assert_eq!(for_of(&body), "5m");
    assert!(body.contains("severity: critical"));

    // Label Studio calls failing: result="error", 15 minutes.
    let (expr, body) = rule("JurystreamConnectRoutingErrors");
    has(
        "JurystreamConnectRoutingErrors",
        &expr,
        &["jurystream_connect_routing_total{result=\"error\"}", "> 0"],
    );
    assert_eq!(for_of(&body), "15m");

    // Lost webhooks: votes only the sync delivered, cluster-wide (run's
    // count by source), over 30 minutes, for an hour.
    let (expr, body) = rule("JurystreamWebhooksLost");
    has(
        "JurystreamWebhooksLost",
        &expr,
        &[
            "increase(jurystream_votes_accepted_total{",
            "source=\"sync\"",
            "[30m])",
            "> 0",
        ],
    );
    assert_eq!(for_of(&body), "1h");

    // Stale sync: against the recording rule, only where syncs run (the
    // instances with the sync off report last_sync 0 and run no pass).
    let (expr, _) = rule("JurystreamConnectSyncStale");
    has(
        "JurystreamConnectSyncStale",
        &expr,
        &[
            "time() - max by (instance) (jurystream_connect_last_sync_timestamp_seconds)",
            "> scalar(jurystream:connect_sync_stale_seconds)",
            "and on (instance)",
            "increase(jurystream_connect_sync_runs_total[",
        ],
    );
    let records = recording_rules();
    let stale = records
        .get("jurystream:connect_sync_stale_seconds")
        .expect("recording rule jurystream:connect_sync_stale_seconds");
    let seconds = stale
        .strip_prefix("vector(")
        .and_then(|v| v.strip_suffix(')'))
        .and_then(|v| v.parse::<f64>().ok());
    // about 3 x label_studio.sync_interval_seconds of the deploy configs
    let interval = configmap_toml("deploy/k8s/connect-configmap.yaml")["label_studio"]
        ["sync_interval_seconds"]
        .as_integer()
        .expect("connect ConfigMap: label_studio.sync_interval_seconds") as f64;
    assert!(
        seconds.is_some_and(|s| s >= 2.0 * interval),
        "jurystream:connect_sync_stale_seconds must be vector(<seconds>) of at least 2 sync intervals ({interval} s), got {stale}"
    );
    assert!(
        group.contains("- record: jurystream:connect_sync_stale_seconds\n"),
        "the stale threshold lives in group jurystream.connect"
    );
    // Every alert of the group is one of these: a new one needs its checks.
    let in_group = group.matches("- alert: ").count();
    assert_eq!(
        in_group, 5,
        "group jurystream.connect has {in_group} alerts"
    );
}

/// The dashboard's row "Label Studio intake (connect)": below every other
/// row, panel ids unique, and its panels show every connect metric: votes
/// by source and result, webhooks by action, sync runs and missed votes,
/// routing outcomes, the produce latency's p99.
#[test]
fn connect_dashboard_row() {
    let d: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/jurystream.json")).unwrap();
    let panels = d["panels"].as_array().unwrap();
    let mut ids = HashSet::new();
    for p in panels {
        let id = p["id"].as_i64().expect("every panel has an id");
        assert!(ids.insert(id), "panel id {id} used twice");
    }
    const ROW: &str = "Label Studio intake (connect)";
    let start = panels
        .iter()
        .position(|p| p["type"] == "row" && p["title"] == ROW)
        .unwrap_or_else(|| panic!("dashboard: no row {ROW:?}"));
    let end = panels[start + 1..]
        .iter()
        .position(|p| p["type"] == "row")
        .map_or(panels.len(), |i| start + 1 + i);
    let row: Vec<&serde_json::Value> = panels[start + 1..end].iter().collect();
    assert!(row.len() >= 5, "row {ROW:?} has {} panels", row.len());
    let y = |p: &serde_json::Value| p["gridPos"]["y"].as_i64().unwrap();
    let bottom = |p: &serde_json::Value| y(p) + p["gridPos"]["h"].as_i64().unwrap();
    let row_y = y(&panels[start]);
    for (i, p) in panels.iter().enumerate() {
        if i < start {
            assert!(
                bottom(p) <= row_y,
                "panel {:?} reaches below the row {ROW:?} (y {row_y})",
                p["title"]
            );
        }
    }
    for p in &row {
        assert!(y(p) > row_y, "panel {:?} is not below its row", p["title"]);
    }
    let exprs: Vec<String> = row
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    let any =
        |needles: &[&str]| -> bool { exprs.iter().any(|e| needles.iter().all(|n| e.contains(n))) };
    for needles in [
        &[
            "sum by (source, result)",
            "rate(jurystream_connect_votes_total[",
        ][..],
        &["sum by (action)", "rate(jurystream_connect_webhooks_total["],
        &["increase(jurystream_connect_sync_runs_total["],
        &[
            "increase(jurystream_votes_accepted_total{",
            "source=\"sync\"",
        ],
        &["jurystream_connect_last_sync_timestamp_seconds"],
        &["sum by (result)", "rate(jurystream_connect_routing_total["],
        &[
            "histogram_quantile(0.99,",
            "sum by (le) (rate(jurystream_connect_produce_duration_seconds_bucket[",
        ],
        &["up{job=\"jurystream-connect\"}"],
    ] {
        assert!(
            any(needles),
            "row {ROW:?}: no panel query with all of {needles:?}"
        );
    }
    // The connect metrics are shown in this row, not elsewhere.
    for (i, p) in panels.iter().enumerate() {
        if (start..end).contains(&i) {
            continue;
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap_or("");
            assert!(
                !e.contains("jurystream_connect_"),
                "panel {:?} outside row {ROW:?} shows a connect metric",
                p["title"]
            );
        }
    }
}

/// The YAML documents of a manifest (split at `---` lines).
fn yaml_docs(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for l in text.lines() {
        if l.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let d = docs.last_mut().unwrap();
            d.push_str(l);
            d.push('\n');
        }
    }
    docs.retain(|d| d.lines().any(|l| l.starts_with("kind:")));
    docs
}

/// The lines under the first `key:` line (at any indent), more indented.
fn yaml_block<'a>(doc: &'a str, key: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = doc.lines().collect();
    let Some(i) = lines.iter().position(|l| {
        let t = l.trim_start().trim_start_matches("- ");
        t == format!("{key}:") || t.starts_with(&format!("{key}: "))
    }) else {
        return Vec::new();
    };
    let indent = lines[i].len() - lines[i].trim_start().len();
    lines[i + 1..]
        .iter()
        .take_while(|l| {
            let t = l.trim_start();
            t.is_empty() || t.starts_with('#') || l.len() - t.len() > indent
        })
        .copied()
        .collect()
}

/// The value of the first `key: value` among `lines` (a list item's `- `
/// and quotes dropped).
fn yaml_value(lines: &[&str], key: &str) -> Option<String> {
    lines.iter().find_map(|l| {
        l.trim_start()
            .trim_start_matches("- ")
            .strip_prefix(&format!("{key}:"))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .filter(|v| !v.is_empty())
    })
}

/// The items of a YAML list block (each item's lines, its `- ` dropped).
fn yaml_items(block: &[&str]) -> Vec<Vec<String>> {
    let indent = block
        .iter()
        .filter(|l| l.trim_start().starts_with("- "))
        .map(|l| l.len() - l.trim_start().len())
        .min();
    let mut items: Vec<Vec<String>> = Vec::new();
    for l in block {
        let t = l.trim_start();
        if Some(l.len() - t.len()) == indent && t.starts_with("- ") {
            items.push(vec![format!(
                "{}{}",
                " ".repeat(indent.unwrap() + 2),
                &t[2..]
            )]);
        } else if let Some(item) = items.last_mut() {
            item.push((*l).to_owned());
        }
    }
    items
}

/// One env entry of a container: (name, value, secretKeyRef (name, key)).
type EnvVar = (String, Option<String>, Option<(String, String)>);

fn env_of(doc: &str) -> Vec<EnvVar> {
    yaml_items(&yaml_block(doc, "env"))
        .into_iter()
        .map(|item| {
            let lines: Vec<&str> = item.iter().map(String::as_str).collect();
            let name = yaml_value(&lines, "name").expect("env entry without name");
            let value = yaml_value(&lines, "value");
            let secret = lines
                .iter()
                .position(|l| l.trim() == "secretKeyRef:")
                .map(|i| {
                    let r = &lines[i + 1..];
                    (
                        yaml_value(r, "name").expect("secretKeyRef without name"),
                        yaml_value(r, "key").expect("secretKeyRef without key"),
                    )
                });
            (name, value, secret)
        })
        .collect()
}

/// The connect manifests of deploy/k8s: two Deployments on port 9465 with
/// /healthz and /readyz probes, the sync (and routing) on the one-replica
/// Deployment only, each Secret key they read named in the command that
/// creates the Secret (docs/operations.md and the manifest), Services on
/// 9465, the listen address, and the same Kafka settings as the processor.
#[test]
fn k8s_connect_manifests() {
    let text = read("deploy/k8s/connect-deployment.yaml");
    let docs = yaml_docs(&text);
    let deployments: BTreeMap<String, &String> = docs
        .iter()
        .filter(|d| d.lines().any(|l| l == "kind: Deployment"))
        .map(|d| (yaml_scalar(d, 2, "name").expect("Deployment name"), d))
        .collect();
    assert_eq!(
        deployments.keys().collect::<Vec<_>>(),
        ["jurystream-connect", "jurystream-connect-label-studio"],
        "connect-deployment.yaml"
    );
    let ops = read("docs/operations.md");
    let mut secret_refs = BTreeSet::new();
    for (name, doc) in &deployments {
        let args = yaml_value(&doc.lines().collect::<Vec<_>>(), "args").unwrap_or_default();
        assert!(
            args.starts_with("[\"connect\", \"--config\""),
            "{name}: args {args}"
        );
        // container port name -> number
        let ports: BTreeMap<String, String> = yaml_items(&yaml_block(doc, "ports"))
            .iter()
            .map(|item| {
                let lines: Vec<&str> = item.iter().map(String::as_str).collect();
                (
                    yaml_value(&lines, "name").unwrap_or_default(),
                    yaml_value(&lines, "containerPort").unwrap_or_default(),
                )
            })
            .collect();
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let block = yaml_block(doc, probe);
            assert!(!block.is_empty(), "{name}: no {probe}");
            assert_eq!(
                yaml_value(&block, "path").as_deref(),
                Some(path),
                "{name}: {probe} path"
            );
            let port = yaml_value(&block, "port").unwrap_or_default();
            let number = ports.get(&port).cloned().unwrap_or(port);
            assert_eq!(number, "9465", "{name}: {probe} port");
        }
        for r in ["requests", "limits"] {
            let block = yaml_block(doc, r);
            assert!(
                yaml_value(&block, "cpu").is_some() && yaml_value(&block, "memory").is_some(),
                "{name}: resources.{r} sets cpu and memory"
            );
        }
        let env = env_of(doc);
        let var = |v: &str| env.iter().find(|(n, _, _)| n == v);
        assert!(
            var("JURYSTREAM_CONNECT__TOKEN").is_some_and(|(_, _, s)| s.is_some()),
            "{name}: JURYSTREAM_CONNECT__TOKEN from a Secret"
        );
        let sync =
            var("JURYSTREAM_LABEL_STUDIO__SYNC_INTERVAL_SECONDS").and_then(|(_, v, _)| v.clone());
        let replicas = yaml_scalar(doc, 2, "replicas").unwrap_or_default();
        if name == "jurystream-connect" {
            assert!(
                replicas.parse::<u32>().is_ok_and(|r| r >= 2),
                "{name}: replicas {replicas}"
            );
            assert_eq!(sync.as_deref(), Some("0"), "{name}: must not sync");
            assert_eq!(
                var("JURYSTREAM_LABEL_STUDIO__EXTRA_REVIEWS")
                    .and_then(|(_, v, _)| v.clone())
                    .as_deref(),
                Some("0"),
                "{name}: must not route"
            );
        } else {
            assert!(
                replicas.parse::<u32>().is_ok_and(|r| r >= 2),
                "{name}: replicas {replicas} (Label Studio never retries a webhook)"
            );
            let strategy = yaml_block(doc, "strategy");
            assert_eq!(
                yaml_value(&strategy, "type").as_deref(),
                Some("RollingUpdate"),
                "{name}: a webhook pod serves throughout a rollout"
            );
            assert_eq!(
                yaml_value(&strategy, "maxUnavailable").as_deref(),
                Some("0"),
                "{name}: a webhook pod serves throughout a rollout"
            );
            assert_eq!(sync, None, "{name}: syncs at the ConfigMap's interval");
            assert!(
                var("JURYSTREAM_LABEL_STUDIO__TOKEN").is_some_and(|(_, _, s)| s.is_some()),
                "{name}: JURYSTREAM_LABEL_STUDIO__TOKEN from a Secret"
            );
        }
        for (_, _, s) in env {
            if let Some(r) = s {
                secret_refs.insert(r);
            }
        }
    }
    // Every Secret key read is created by the documented command, in the
    // runbook and in the manifest's comment.
    assert!(!secret_refs.is_empty());
    for (secret, key) in &secret_refs {
        for (what, text) in [
            ("docs/operations.md", &ops),
            ("connect-deployment.yaml", &text),
        ] {
            let cmd = text
                .find(&format!("kubectl create secret generic {secret}"))
                .map(|i| &text[i..])
                .unwrap_or_else(|| panic!("{what}: no `kubectl create secret generic {secret}`"));
            let cmd = &cmd[..cmd.find("\n\n").unwrap_or(cmd.len())];
            assert!(
                cmd.contains(&format!("--from-literal={key}=")),
                "{what}: the command creating Secret {secret} has no key {key}: {cmd}"
            );
        }
    }

    let services = read("deploy/k8s/connect-service.yaml");
    let services: BTreeMap<String, String> = yaml_docs(&services)
        .into_iter()
        .map(|d| (yaml_scalar(&d, 2, "name").expect("Service name"), d))
        .collect();
    for name in deployments.keys() {
        let svc = services
            .get(name)
            .unwrap_or_else(|| panic!("connect-service.yaml: no Service {name}"));
        let lines: Vec<&str> = svc.lines().collect();
        assert_eq!(
            yaml_value(&lines, "port").as_deref(),
            Some("9465"),
            "Service {name}"
        );
        // the Service selects its Deployment's pods by component
        let component =
            |d: &str| yaml_value(&yaml_block(d, "selector"), "app.kubernetes.io/component");
        assert_eq!(
            component(svc),
            component(deployments[name]),
            "Service {name} selects the pods of Deployment {name}"
        );
    }

    let conf = configmap_toml("deploy/k8s/connect-configmap.yaml");
    assert_eq!(
        conf["connect"]["listen"].as_str(),
        Some("0.0.0.0:9465"),
        "connect ConfigMap: connect.listen"
    );
    let processor = k8s_config();
    for (section, key) in [
        ("kafka", "brokers"),
        ("kafka", "group_id"),
        ("kafka", "input_topics"),
        ("outputs", "flags_topic"),
    ] {
        assert_eq!(
            conf.get(section).and_then(|s| s.get(key)),
            processor.get(section).and_then(|s| s.get(key)),
            "connect ConfigMap {section}.{key} must equal the processor's"
        );
    }
    let monitor = read("deploy/k8s/connect-podmonitor.yaml");
    assert!(monitor.contains("kind: PodMonitor") && monitor.contains("- port: http"));
    let kust = read("deploy/k8s/kustomization.yaml");
    for f in [
        "connect-configmap.yaml",
        "connect-service.yaml",
        "connect-deployment.yaml",
        "connect-poddisruptionbudget.yaml",
        "connect-podmonitor.yaml",
    ] {
        assert!(
            kust.contains(&format!("  - {f}\n")),
            "kustomization.yaml: {f}"
        );
    }
}
