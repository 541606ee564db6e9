//! Helpers shared by the integration tests that drive the `jurystream`
//! binary: running `replay`, reading its JSON lines, and comparing event
//! streams the way the contract allows (contract §5: only `processed_at` may
//! differ between runs; numbers within 1e-9).

#![allow(dead_code)]

mod skip;
#[allow(unused_imports)]
pub use skip::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jurystream"))
}

/// `state.cache_mb` values a replay test runs with: the default, and 0
/// (only what open batches need: every series and identity comes from
/// RocksDB). No output may differ between them.
pub const CACHE_SIZES: [Option<u32>; 2] = [None, Some(0)];

thread_local! {
    static CACHE_MB: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the commands of this thread setting `state.cache_mb`
/// (through its environment variable) to `mb`, or leaving the default.
pub fn with_cache_mb<T>(mb: Option<u32>, f: impl FnOnce() -> T) -> T {
    let before = CACHE_MB.with(|c| c.replace(mb));
    let out = f();
    CACHE_MB.with(|c| c.set(before));
    out
}

/// A `jurystream` command with no `JURYSTREAM_*` variable of the caller's
/// environment (they would override the configuration), except the cache
/// size set by [`with_cache_mb`].
pub fn command() -> Command {
    let mut c = Command::new(bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("JURYSTREAM_") {
            c.env_remove(k);
        }
    }
    if let Some(mb) = CACHE_MB.with(|c| c.get()) {
        c.env("JURYSTREAM_STATE__CACHE_MB", mb.to_string());
    }
    c.stdin(Stdio::null());
    c
}

/// Runs `jurystream replay` and returns its raw output (any exit status).
pub fn replay_output(
    config: Option<&Path>,
    input: &Path,
    state_dir: Option<&Path>,
    keep_open: bool,
) -> Output {
    let mut c = command();
    c.arg("replay").arg("--input").arg(input);
    if let Some(cfg) = config {
        c.arg("--config").arg(cfg);
    }
    if let Some(d) = state_dir {
        c.arg("--state-dir").arg(d);
    }
    if keep_open {
        c.arg("--keep-open");
    }
    c.output().expect("cannot run jurystream")
}

/// Runs `jurystream replay`, asserts exit status 0, returns the events.
pub fn replay(
    config: Option<&Path>,
    input: &Path,
    state_dir: Option<&Path>,
    keep_open: bool,
) -> Vec<Value> {
    let out = replay_output(config, input, state_dir, keep_open);
    assert!(
        out.status.success(),
        "replay of {} exited {:?}\nstderr:\n{}",
        input.display(),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_lines(&out.stdout)
}

/// One JSON value per non-blank line; panics on anything else.
pub fn parse_lines(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).expect("output is not UTF-8");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("output line {} is not JSON ({e}): {l}", i + 1))
        })
        .collect()
}

/// Splits bytes into physical lines, each keeping its LF (the last one may
/// have none), as `replay` numbers them.
pub fn physical_lines(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &b) in data.iter().enumerate() {
        if b == b'\n' {
            out.push(&data[start..=i]);
            start = i + 1;
        }
    }
    if start < data.len() {
        out.push(&data[start..]);
    }
    out
}

/// How two event streams are compared.
#[derive(Debug, Clone, Copy, Default)]
pub struct CompareOptions {
    /// Do not compare `vote_rejected.source.line` (split replays restart it).
    pub ignore_source_line: bool,
}

const TIME_KEYS: [&str; 5] = [
    "window_start",
    "window_end",
    "first_vote_at",
    "last_vote_at",
    "timestamp",
];
const DERIVED: &str = "derived:";

/// RFC 3339 UTC (`Z` or `+00:00`) → nanoseconds since the epoch.
pub fn parse_utc(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let num = |a: usize, n: usize| -> Option<i64> {
        let part = s.get(a..a + n)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let (y, mo, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (h, mi, sec) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let mut i = 19;
    let mut frac: i128 = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() || digits.len() > 9 {
            return None;
        }
        frac = format!("{digits:0<9}").parse().ok()?;
    }
    match &s[i..] {
        "Z" | "z" | "+00:00" | "-00:00" => {}
        _ => return None,
    }
    // Days from civil (H. Hinnant).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec;
    Some(secs as i128 * 1_000_000_000 + frac)
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-9 || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

fn is_derived(v: &Value) -> bool {
    match v {
        Value::String(s) => s.starts_with(DERIVED),
        Value::Array(a) => a.iter().any(is_derived),
        _ => false,
    }
}

fn cmp_value(
    path: &str,
    key: &str,
    e: &Value,
    a: &Value,
    opts: CompareOptions,
    out: &mut Vec<String>,
) {
    if TIME_KEYS.contains(&key) {
        if let (Value::String(es), Value::String(as_)) = (e, a) {
            match (parse_utc(es), parse_utc(as_)) {
                (Some(x), Some(y)) if x == y => {}
                _ => out.push(format!("{path}: expected {es}, actual {as_}")),
            }
            return;
        }
    }
    match (e, a) {
        (Value::Number(x), Value::Number(y)) => {
            let ok = match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(p), Some(q), _, _) => p == q,
                (_, _, Some(p), Some(q)) => p == q,
                _ => close(
                    x.as_f64().unwrap_or(f64::NAN),
                    y.as_f64().unwrap_or(f64::NAN),
                ),
            };
            if !ok {
                out.push(format!("{path}: expected {x}, actual {y}"));
            }
        }
        (Value::Object(eo), Value::Object(ao)) => {
            for (k, ev) in eo {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let Some(av) = ao.get(k) else {
                    out.push(format!("{p}: missing in actual"));
                    continue;
                };
                match k.as_str() {
                    "processed_at" => {
                        if !av.is_string() {
                            out.push(format!("{p}: not a string"));
                        }
                    }
                    "detail" => {
                        if av.as_str().is_none_or(str::is_empty) {
                            out.push(format!("{p}: must be a non-empty string"));
                        }
                    }
                    "line" if opts.ignore_source_line && path == "source" => {
                        if !av.is_u64() {
                            out.push(format!("{p}: not an integer"));
                        }
                    }
                    "vote_ids" | "vote_id" if is_derived(ev) => match (ev, av) {
                        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {}
                        (Value::String(_), Value::String(_)) => {}
                        _ => out.push(format!("{p}: expected {ev}, actual {av}")),
                    },
                    _ => cmp_value(&p, k, ev, av, opts, out),
                }
            }
            for k in ao.keys() {
                if !eo.contains_key(k) {
                    out.push(format!("{path}.{k}: only in actual"));
                }
            }
        }
        (Value::Array(ea), Value::Array(aa)) => {
            if ea.len() != aa.len() {
                out.push(format!(
                    "{path}: expected {} items, actual {}",
                    ea.len(),
                    aa.len()
                ));
                return;
            }
            for (i, (x, y)) in ea.iter().zip(aa).enumerate() {
                cmp_value(&format!("{path}[{i}]"), key, x, y, opts, out);
            }
        }
        _ => {
            if e != a {
                out.push(format!("{path}: expected {e}, actual {a}"));
            }
        }
    }
}

fn describe(v: &Value) -> String {
    match v["type"].as_str() {
        Some("vote_rejected") => format!(
            "vote_rejected({}, line {})",
            v["reason"], v["source"]["line"]
        ),
        Some(t) => format!(
            "{t}({}/{} #{})",
            v["inference_id"], v["voter_prompt_id"], v["update_seq"]
        ),
        None => v.to_string(),
    }
}

/// Compares two event streams in order: `processed_at` only has to be a
/// string, `detail` a non-empty string, numbers agree within 1e-9, times
/// as instants, derived vote ids by count. Returns the differences.
pub fn compare_events(expected: &[Value], actual: &[Value], opts: CompareOptions) -> Vec<String> {
    let mut problems = Vec::new();
    if expected.len() != actual.len() {
        problems.push(format!(
            "expected {} events, actual {}",
            expected.len(),
            actual.len()
        ));
    }
    for (i, (e, a)) in expected.iter().zip(actual).enumerate() {
        let mut d = Vec::new();
        cmp_value("", "", e, a, opts, &mut d);
        if !d.is_empty() {
            problems.push(format!("event {} {}: {}", i + 1, describe(e), d.join("; ")));
        }
    }
    problems
}

/// Panics with a readable report unless the streams agree.
pub fn assert_same_events(what: &str, expected: &[Value], actual: &[Value], opts: CompareOptions) {
    let problems = compare_events(expected, actual, opts);
    if !problems.is_empty() {
        let shown: Vec<_> = problems.iter().take(8).cloned().collect();
        panic!(
            "{what}: {} difference(s)\n  {}\nactual events:\n{}",
            problems.len(),
            shown.join("\n  "),
            actual
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Writes `lines` (each with its own line ending) to `path`.
pub fn write_lines(path: &Path, lines: &[&[u8]]) {
    std::fs::write(path, lines.concat()).expect("cannot write test input");
}

/// Checks the split-replay property of contract §6: the input cut after line
/// `k` (the first part replayed with `--state-dir D --keep-open`, the
/// second with `--state-dir D`) prints the events of `whole`.
pub fn check_split(
    config: Option<&Path>,
    lines: &[&[u8]],
    k: usize,
    whole: &[Value],
    work: &Path,
) -> Result<(), String> {
    let dir = work.join(format!("split-{k}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (p1, p2) = (dir.join("part1.jsonl"), dir.join("part2.jsonl"));
    write_lines(&p1, &lines[..k]);
    write_lines(&p2, &lines[k..]);
    let state = dir.join("state");
    let mut got = replay(config, &p1, Some(&state), true);
    got.extend(replay(config, &p2, Some(&state), false));
    let _ = std::fs::remove_dir_all(&dir);
    let problems = compare_events(
        whole,
        &got,
        CompareOptions {
            ignore_source_line: true,
        },
    );
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "split after line {k}: {}",
            problems.into_iter().take(4).collect::<Vec<_>>().join("; ")
        ))
    }
}
