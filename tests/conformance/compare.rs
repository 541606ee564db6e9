//! How the conformance runner (`tests/conformance.rs`) compares an output
//! with a case's expected file: the rules of the conformance kit's
//! `compare.py`, reproduced in Rust (tests/conformance/README.md lists
//! them).
//!
//! - Event streams (`expected.jsonl`, [`compare_streams`]): `processed_at`
//!   must be a string and is otherwise ignored; numbers are equal within
//!   1e-9 (`math.isclose(rel_tol=1e-9, abs_tol=1e-9)`), a boolean never
//!   equals a number; time fields compare as instants and must be RFC 3339
//!   with a zero UTC offset; `batch.vote_ids` and `votes[].vote_id` compare
//!   only when every expected id is explicit (no `derived:` prefix), else by
//!   count; `vote_rejected.detail` only has to be a non-empty string, and
//!   with `ignore_source_line` its `source.line` is not compared; a batch
//!   whose expected variance is within 1e-9 of its threshold may differ in
//!   `ambiguous` and in its `ambiguity_flagged` ("borderline" notes, not
//!   mismatches); each series (inference_id + voter_prompt_id) must hold
//!   the same events in the same order (aligned the way Python's
//!   `difflib.SequenceMatcher` aligns them), rejections form the same
//!   multiset; each `ambiguity_flagged` directly follows its
//!   `score_updated`; fields only the actual output has are warnings.
//! - Documents (`expected.json`, [`compare_documents`]): numbers within the
//!   same tolerance, lists item by item, everything else exactly.
//!
//! The report has the lines `compare.py --show N` prints; its last line is
//! `N events, M mismatches` (or `1 documents, M mismatches`).

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

pub const REL_TOL: f64 = 1e-9;
pub const ABS_TOL: f64 = 1e-9;
pub const BORDERLINE_TOL: f64 = 1e-9;
/// Fields compared as instants (compare.py's TIME_KEYS).
const TIME_KEYS: [&str; 6] = [
    "window_start",
    "window_end",
    "first_vote_at",
    "last_vote_at",
    "timestamp",
    "table_until",
];
/// Vote ids starting with this are derived (compare.py's default
/// `--derived-prefix`): compared by count only.
const DERIVED_PREFIX: &str = "derived:";
/// How many lines of an event's differences a mismatch shows.
const EVENT_DIFFS_SHOWN: usize = 6;

/// What one comparison found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every mismatch (empty: equal).
    pub mismatches: Vec<String>,
    /// The lines compare.py prints: the first mismatches, warnings, notes
    /// and the summary last.
    pub report: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }

    /// The last line: `N events, M mismatches` / `1 documents, M mismatches`.
    pub fn summary(&self) -> &str {
        self.report.last().map(String::as_str).unwrap_or("")
    }
}

/// compare.py EXPECTED ACTUAL [--ignore-source-line] --show `show`: two
/// streams of JSON lines. The names are the files' base names, for messages.
pub fn compare_streams(
    expected: &[u8],
    expected_name: &str,
    actual: &[u8],
    actual_name: &str,
    ignore_source_line: bool,
    show: usize,
) -> Outcome {
    let (exp, err_e) = read_events(expected, expected_name);
    let (act, err_a) = read_events(actual, actual_name);
    let mut comparer = Comparer {
        ignore_source_line,
        ..Comparer::default()
    };
    let mut mismatches = err_e;
    mismatches.extend(err_a);
    mismatches.extend(comparer.compare_streams(&exp, &act));
    let mut report = shown(&mismatches, show);
    if !comparer.warnings.is_empty() {
        report.push(format!(
            "warning: {} extra-field occurrences, e.g. {}",
            comparer.warnings.len(),
            examples(&comparer.warnings)
        ));
    }
    if let Some(first) = comparer.notes.first() {
        report.push(format!(
            "note: {} borderline differences not counted (variance within 1e-09 of the \
             threshold), e.g. {first}",
            comparer.notes.len()
        ));
    }
    if exp.len() != act.len() {
        report.push(format!(
            "note: expected has {} events, actual has {}",
            exp.len(),
            act.len()
        ));
    }
    report.push(format!(
        "{} events, {} mismatches",
        exp.len(),
        mismatches.len()
    ));
    Outcome { mismatches, report }
}

/// compare.py EXPECTED ACTUAL --document --show `show`: two single JSON
/// documents (`jurystream reputation --format json`, contract §14).
pub fn compare_documents(
    expected: &[u8],
    expected_name: &str,
    actual: &[u8],
    actual_name: &str,
    show: usize,
) -> Outcome {
    let exp = read_document(expected, expected_name);
    let act = read_document(actual, actual_name);
    let mut comparer = Comparer::default();
    let mismatches: Vec<String> = match (exp, act) {
        (Ok(e), Ok(a)) => {
            let mut diffs = Vec::new();
            comparer.cmp_value("", &e, &a, &mut diffs, None);
            diffs
                .into_iter()
                .map(|d| match d.strip_prefix('.') {
                    Some(rest) => rest.to_string(),
                    None => d,
                })
                .collect()
        }
        (e, a) => e.err().into_iter().chain(a.err()).collect(),
    };
    let mut report = shown(&mismatches, show);
    if !comparer.warnings.is_empty() {
        report.push(format!(
            "warning: {} extra fields, e.g. {}",
            comparer.warnings.len(),
            examples(&comparer.warnings)
        ));
    }
    report.push(format!("1 documents, {} mismatches", mismatches.len()));
    Outcome { mismatches, report }
}

/// The first `show` mismatches as compare.py prints them.
fn shown(mismatches: &[String], show: usize) -> Vec<String> {
    let mut lines: Vec<String> = mismatches
        .iter()
        .take(show)
        .map(|m| format!("- {m}"))
        .collect();
    if mismatches.len() > show {
        lines.push(format!(
            "  ({} more mismatches not shown)",
            mismatches.len() - show
        ));
    }
    lines
}

/// Up to three distinct warnings, sorted (`"; ".join(sorted(set(w))[:3])`).
fn examples(warnings: &[String]) -> String {
    let mut uniq: Vec<&String> = warnings
        .iter()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    uniq.sort();
    uniq.iter()
        .take(3)
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The events of a JSON-lines file (compare.py's read_events): lines split
/// at `\n`, trailing `\r`/`\n` removed, blank lines skipped; a line that is
/// not JSON is an error naming `name:line`.
pub fn read_events(data: &[u8], name: &str) -> (Vec<Value>, Vec<String>) {
    let mut events = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in data.split_inclusive(|&c| c == b'\n').enumerate() {
        let mut raw = raw;
        while let [rest @ .., b'\r' | b'\n'] = raw {
            raw = rest;
        }
        // bytes.strip(): ASCII whitespace
        if raw.iter().all(|c| b" \t\n\r\x0b\x0c".contains(c)) {
            continue;
        }
        let parsed = std::str::from_utf8(raw)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str::<Value>(s).map_err(|e| e.to_string()));
        match parsed {
            Ok(v) => events.push(v),
            Err(e) => errors.push(format!("{name}:{}: not a JSON line ({e})", i + 1)),
        }
    }
    (events, errors)
}

/// The one JSON value of a file (compare.py's read_document).
fn read_document(data: &[u8], name: &str) -> Result<Value, String> {
    std::str::from_utf8(data)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str::<Value>(s).map_err(|e| e.to_string()))
        .map_err(|e| format!("{name}: not one JSON document ({e})"))
}

// ---------------------------------------------------------------------------
// Values as Python sees them

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// `math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)`, as CPython
/// computes it.
pub fn isclose(a: f64, b: f64) -> bool {
    if a == b {
        return true;
    }
    if a.is_infinite() || b.is_infinite() {
        return false;
    }
    let diff = (b - a).abs();
    diff <= (REL_TOL * b).abs() || diff <= (REL_TOL * a).abs() || diff <= ABS_TOL
}

/// An RFC 3339 time with a zero UTC offset (`Z`, `z`, `+00:00`, `-00:00`),
/// `T` or `t`, 0 to 9 fraction digits -> nanoseconds since 1970 (compare.py's
/// parse_utc; like it, the fields' ranges are not checked). Anything else,
/// a non-string included, is None.
pub fn parse_utc(v: &Value) -> Option<i128> {
    let s = v.as_str()?.as_bytes();
    let digits = |from: usize, n: usize| -> Option<i128> {
        let part = s.get(from..from + n)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(
            part.iter()
                .fold(0i128, |acc, d| acc * 10 + i128::from(d - b'0')),
        )
    };
    let is = |at: usize, allowed: &[u8]| s.get(at).is_some_and(|c| allowed.contains(c));
    let y = digits(0, 4)?;
    let mo = digits(5, 2)?;
    let d = digits(8, 2)?;
    let hh = digits(11, 2)?;
    let mi = digits(14, 2)?;
    let ss = digits(17, 2)?;
    if !(is(4, b"-") && is(7, b"-") && is(10, b"Tt") && is(13, b":") && is(16, b":")) {
        return None;
    }
    let mut pos = 19;
    let mut frac: i128 = 0;
    if is(pos, b".") {
        let n = s[pos + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if n == 0 || n > 9 {
            return None;
        }
        frac = digits(pos + 1, n)? * 10i128.pow(9 - n as u32);
        pos += 1 + n;
    }
    match &s[pos..] {
        b"Z" | b"z" | b"+00:00" | b"-00:00" => {}
        _ => return None,
    }
    let days = days_from_civil(y, mo, d);
    Some((days * 86_400 + hh * 3_600 + mi * 60 + ss) * 1_000_000_000 + frac)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm, with Python's floor division).
fn days_from_civil(y: i128, m: i128, d: i128) -> i128 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = (if y >= 0 { y } else { y - 399 }).div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9).rem_euclid(12);
    let doy = (153 * mp + 2).div_euclid(5) + d - 1;
    let doe = yoe * 365 + yoe.div_euclid(4) - yoe.div_euclid(100) + doy;
    era * 146_097 + doe - 719_468
}

/// Python's `repr` of a float (shortest round-trip digits; exponent form
/// below 1e-4 and from 1e16 on).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1;
    let body = if decpt <= -4 || decpt > 16 {
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let e = decpt - 1;
        format!(
            "{first}{rest}e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.abs()
        )
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat(decpt.unsigned_abs() as usize))
    } else if decpt as usize >= digits.len() {
        format!("{digits}{}.0", "0".repeat(decpt as usize - digits.len()))
    } else {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{int}.{frac}")
    };
    if f < 0.0 {
        format!("-{body}")
    } else {
        body
    }
}

/// A number as Python prints it (`%r`, `str`, `json.dumps`).
fn py_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        n.to_string()
    } else {
        py_float(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// `json.dumps(v)` (`ensure_ascii` as given). serde_json's objects iterate
/// in key order, so objects come out as with `sort_keys=True`; where
/// compare.py dumps without sorting (group and alignment keys) only
/// equality matters, which only objects differing in key order alone would
/// change.
fn dumps(v: &Value, ensure_ascii: bool) -> String {
    let mut out = String::new();
    dump_into(&mut out, v, ensure_ascii);
    out
}

fn dump_into(out: &mut String, v: &Value, ascii: bool) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&py_number(n)),
        Value::String(s) => dump_str(out, s, ascii),
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dump_into(out, x, ascii);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dump_str(out, k, ascii);
                out.push_str(": ");
                dump_into(out, x, ascii);
            }
            out.push('}');
        }
    }
}

fn dump_str(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr` of a string (close enough for messages and sort keys).
fn py_repr_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::new();
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python's `repr` of a JSON value.
fn py_repr(v: &Value) -> String {
    match v {
        Value::String(s) => py_repr_str(s),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(py_repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, x)| format!("{}: {}", py_repr_str(k), py_repr(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => py_str(Some(other)),
    }
}

/// Python's `str` of `d.get(key)` (None for a missing field and for null).
fn py_str(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "None".into(),
        Some(Value::Bool(b)) => (if *b { "True" } else { "False" }).to_string(),
        Some(Value::Number(n)) => py_number(n),
        Some(Value::String(s)) => s.clone(),
        Some(other) => py_repr(other),
    }
}

/// compare.py's `_short`: `json.dumps(x, ensure_ascii=False)`, cut to 90
/// characters.
fn short(v: Option<&Value>) -> String {
    let s = dumps(v.unwrap_or(&Value::Null), false);
    if s.chars().count() <= 90 {
        s
    } else {
        let mut cut: String = s.chars().take(87).collect();
        cut.push_str("...");
        cut
    }
}

/// A number as Python compares it with `==` (a bool is 0 or 1).
enum PyNum {
    Int(i128),
    Float(f64),
}

fn py_num(v: &Value) -> Option<PyNum> {
    match v {
        Value::Bool(b) => Some(PyNum::Int(i128::from(*b))),
        Value::Number(n) => Some(match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => PyNum::Int(i128::from(i)),
            (None, Some(u)) => PyNum::Int(i128::from(u)),
            _ => PyNum::Float(n.as_f64().unwrap_or(f64::NAN)),
        }),
        _ => None,
    }
}

/// Python's `==` between two JSON values (`1 == 1.0 == True`).
fn py_eq(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (py_num(a), py_num(b)) {
        return match (x, y) {
            (PyNum::Int(i), PyNum::Int(j)) => i == j,
            (PyNum::Float(f), PyNum::Float(g)) => f == g,
            (PyNum::Int(i), PyNum::Float(f)) | (PyNum::Float(f), PyNum::Int(i)) => {
                f.is_finite() && f.fract() == 0.0 && f.abs() < 1e38 && f as i128 == i
            }
        };
    }
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| py_eq(p, q)))
        }
        _ => a == b,
    }
}

/// `ev.get(key)` compared with Python's `==` (missing = null = None).
fn field_eq(a: &Value, b: &Value, key: &str) -> bool {
    py_eq(
        a.get(key).unwrap_or(&Value::Null),
        b.get(key).unwrap_or(&Value::Null),
    )
}

/// A hashable stand-in for a value used as a Python set or dict key
/// (`update_seq`): values Python finds equal (`3`, `3.0`) get one key.
fn py_key(v: Option<&Value>) -> String {
    let v = v.unwrap_or(&Value::Null);
    match py_num(v) {
        Some(PyNum::Int(i)) => format!("n:{i}"),
        Some(PyNum::Float(f)) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e38 => {
            format!("n:{}", f as i128)
        }
        Some(PyNum::Float(f)) => format!("f:{}", py_float(f)),
        None => format!("j:{}", dumps(v, true)),
    }
}

fn type_is(ev: &Value, t: &str) -> bool {
    ev.get("type").and_then(Value::as_str) == Some(t)
}

// ---------------------------------------------------------------------------
// Events

/// Where an event is compared: its series, the rejections, or a group per
/// other type (compare.py's group_of).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Group {
    Invalid,
    Rejected,
    /// `json.dumps` of inference_id and voter_prompt_id
    Series(String, String),
    Type(String),
}

fn group_of(ev: &Value) -> Group {
    let Some(m) = ev.as_object() else {
        return Group::Invalid;
    };
    if type_is(ev, "vote_rejected") {
        return Group::Rejected;
    }
    if m.contains_key("inference_id") || m.contains_key("voter_prompt_id") {
        let d = |k: &str| dumps(m.get(k).unwrap_or(&Value::Null), true);
        return Group::Series(d("inference_id"), d("voter_prompt_id"));
    }
    Group::Type(py_str(m.get("type")))
}

fn group_name(g: &Group) -> String {
    match g {
        Group::Rejected => "rejections".into(),
        Group::Series(inf, prompt) => {
            let back = |s: &str| py_str(serde_json::from_str::<Value>(s).ok().as_ref());
            format!("series {}/{}", back(inf), back(prompt))
        }
        Group::Invalid => "('<invalid>',)".into(),
        Group::Type(t) => format!("('<type>', {})", py_repr_str(t)),
    }
}

/// `json.dumps(source, sort_keys=True)`, without `line` when it is ignored.
fn source_key(m: &Map<String, Value>, ignore_line: bool) -> String {
    match m.get("source") {
        Some(Value::Object(src)) if ignore_line => {
            let mut src = src.clone();
            src.remove("line");
            dumps(&Value::Object(src), true)
        }
        other => dumps(other.unwrap_or(&Value::Null), true),
    }
}

/// What the alignment of a group compares (compare.py's align_key, dumped).
fn align_key(ev: &Value, ignore_line: bool) -> String {
    let Some(m) = ev.as_object() else {
        return dumps(&Value::Array(vec![Value::from("<invalid>")]), true);
    };
    let field = |k: &str| m.get(k).cloned().unwrap_or(Value::Null);
    let key = match m.get("type").and_then(Value::as_str) {
        Some("vote_rejected") => {
            let mut k = vec![
                field("type"),
                Value::String(source_key(m, ignore_line)),
                field("reason"),
            ];
            if ignore_line {
                k.push(Value::String(py_str(m.get("payload"))));
            }
            k
        }
        Some("score_updated" | "ambiguity_flagged") => vec![field("type"), field("update_seq")],
        _ => vec![field("type")],
    };
    dumps(&Value::Array(key), true)
}

/// The order rejections (and other events without a series) are sorted in
/// before they are aligned (compare.py's _multiset_key).
fn multiset_key(ev: &Value, ignore_line: bool) -> (u8, i128, String, String, String) {
    let Some(m) = ev.as_object() else {
        return (1, 0, dumps(ev, true), String::new(), String::new());
    };
    let line = match m.get("source") {
        Some(Value::Object(src)) if !ignore_line => src.get("line"),
        _ => None,
    };
    let line = match line.and_then(py_num) {
        Some(PyNum::Int(i)) => i,
        _ => -1,
    };
    (
        0,
        line,
        source_key(m, ignore_line),
        py_str(m.get("reason")),
        py_str(m.get("payload")),
    )
}

/// compare.py's describe: how a mismatch names an event.
fn describe(ev: &Value) -> String {
    let Some(m) = ev.as_object() else {
        return short(Some(ev));
    };
    match m.get("type").and_then(Value::as_str) {
        Some("vote_rejected") => format!(
            "vote_rejected({}, source={})",
            py_str(m.get("reason")),
            dumps(m.get("source").unwrap_or(&Value::Null), true)
        ),
        Some(t @ ("score_updated" | "ambiguity_flagged")) => format!(
            "{t}({}/{} #{})",
            py_str(m.get("inference_id")),
            py_str(m.get("voter_prompt_id")),
            py_str(m.get("update_seq"))
        ),
        _ => py_str(m.get("type")),
    }
}

/// A score_updated whose expected variance is within BORDERLINE_TOL of its
/// threshold.
fn is_borderline(ev: &Value) -> bool {
    if !type_is(ev, "score_updated") {
        return false;
    }
    let (Some(Value::Object(b)), Some(Value::Object(p))) = (ev.get("batch"), ev.get("params"))
    else {
        return false;
    };
    match (
        b.get("variance").and_then(num),
        p.get("variance_threshold").and_then(num),
    ) {
        (Some(var), Some(thr)) => (var - thr).abs() <= BORDERLINE_TOL,
        _ => false,
    }
}

/// Every ambiguity_flagged directly follows its score_updated (same
/// series and update_seq).
fn adjacency_problems(events: &[Value], label: &str) -> Vec<String> {
    let mut probs = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        if !(ev.is_object() && type_is(ev, "ambiguity_flagged")) {
            continue;
        }
        let ok = i > 0 && {
            let prev = &events[i - 1];
            prev.is_object()
                && type_is(prev, "score_updated")
                && field_eq(prev, ev, "inference_id")
                && field_eq(prev, ev, "voter_prompt_id")
                && field_eq(prev, ev, "update_seq")
        };
        if !ok {
            probs.push(format!(
                "{label} event #{} {} does not directly follow its score_updated",
                i + 1,
                describe(ev)
            ));
        }
    }
    probs
}

/// `"\n      ".join(d[:6])`, with `... N more` when there are more.
fn joined_diffs(d: &[String], with_more: bool) -> String {
    let mut text = d[..d.len().min(EVENT_DIFFS_SHOWN)].join("\n      ");
    if with_more && d.len() > EVENT_DIFFS_SHOWN {
        text.push_str(&format!("\n      ... {} more", d.len() - EVENT_DIFFS_SHOWN));
    }
    text
}

#[derive(Default)]
struct Comparer {
    ignore_source_line: bool,
    warnings: Vec<String>,
    notes: Vec<String>,
}

impl Comparer {
    fn cmp_value(
        &mut self,
        path: &str,
        e: &Value,
        a: &Value,
        diffs: &mut Vec<String>,
        key: Option<&str>,
    ) {
        if key.is_some_and(|k| TIME_KEYS.contains(&k)) && (e.is_string() || a.is_string()) {
            let (te, ta) = (parse_utc(e), parse_utc(a));
            if ta.is_none() && !a.is_null() {
                diffs.push(format!(
                    "{path}: not an RFC 3339 UTC time: {}",
                    short(Some(a))
                ));
            } else if te != ta {
                diffs.push(format!(
                    "{path}: expected {}, actual {}",
                    short(Some(e)),
                    short(Some(a))
                ));
            }
            return;
        }
        match (e, a) {
            (Value::Number(x), Value::Number(y)) => {
                if !isclose(
                    x.as_f64().unwrap_or(f64::NAN),
                    y.as_f64().unwrap_or(f64::NAN),
                ) {
                    diffs.push(format!(
                        "{path}: expected {}, actual {}",
                        py_number(x),
                        py_number(y)
                    ));
                }
            }
            (Value::Object(x), Value::Object(y)) => self.cmp_dict(path, x, y, diffs, &[]),
            (Value::Array(x), Value::Array(y)) => {
                if x.len() != y.len() {
                    diffs.push(format!(
                        "{path}: expected {} items, actual {}",
                        x.len(),
                        y.len()
                    ));
                    return;
                }
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    self.cmp_value(&format!("{path}[{i}]"), p, q, diffs, key);
                }
            }
            // other types: the same type and the same value (a bool is not
            // a number, null only equals null)
            _ => {
                if e != a {
                    diffs.push(format!(
                        "{path}: expected {}, actual {}",
                        short(Some(e)),
                        short(Some(a))
                    ));
                }
            }
        }
    }

    fn cmp_dict(
        &mut self,
        path: &str,
        e: &Map<String, Value>,
        a: &Map<String, Value>,
        diffs: &mut Vec<String>,
        skip: &[&str],
    ) {
        let join = |k: &str| {
            if path.is_empty() {
                k.to_string()
            } else {
                format!("{path}.{k}")
            }
        };
        for (k, ev) in e {
            if skip.contains(&k.as_str()) {
                continue;
            }
            let p = join(k);
            match a.get(k) {
                None => diffs.push(format!("{p}: missing in actual")),
                Some(av) => self.cmp_value(&p, ev, av, diffs, Some(k.as_str())),
            }
        }
        for k in a.keys() {
            if !e.contains_key(k) && !skip.contains(&k.as_str()) {
                self.warnings
                    .push(format!("{}: extra field in actual", join(k)));
            }
        }
    }

    fn ids_comparable(ids: Option<&Value>) -> bool {
        match ids {
            Some(Value::Array(ids)) => ids
                .iter()
                .all(|x| x.as_str().is_some_and(|s| !s.starts_with(DERIVED_PREFIX))),
            _ => false,
        }
    }

    /// The differences between an expected and an actual event.
    fn cmp_event(&mut self, e: &Value, a: &Value, borderline: bool) -> Vec<String> {
        let mut diffs = Vec::new();
        let Some(am) = a.as_object() else {
            return vec!["actual event is not an object".into()];
        };
        // compare.py assumes expected events are objects (it stops with an
        // error otherwise): a mismatch here
        let Some(em) = e.as_object() else {
            return vec!["expected event is not an object".into()];
        };
        if !am.get("processed_at").is_some_and(Value::is_string) {
            diffs.push("processed_at: missing or not a string".into());
        }
        let mut skip = vec!["processed_at"];
        match em.get("type").and_then(Value::as_str) {
            Some("vote_rejected") => {
                skip.push("detail");
                let d = am.get("detail");
                if !d.and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                    diffs.push(format!(
                        "detail: must be a non-empty string, actual {}",
                        short(d)
                    ));
                }
                if self.ignore_source_line {
                    skip.push("source");
                    match am.get("source") {
                        Some(Value::Object(asrc)) => {
                            if let Some(Value::Object(esrc)) = em.get("source") {
                                self.cmp_dict("source", esrc, asrc, &mut diffs, &["line"]);
                                let line_is_int = matches!(
                                    asrc.get("line"),
                                    Some(Value::Number(n)) if n.is_i64() || n.is_u64()
                                );
                                if !line_is_int {
                                    diffs.push(
                                        "source.line: missing or not an integer in actual".into(),
                                    );
                                }
                            }
                        }
                        _ => diffs.push("source: missing or not an object in actual".into()),
                    }
                }
                self.cmp_dict("", em, am, &mut diffs, &skip);
                diffs
            }
            Some("score_updated") => {
                skip.push("batch");
                if borderline {
                    skip.push("ambiguous");
                    match am.get("ambiguous") {
                        None => diffs.push("ambiguous: missing in actual".into()),
                        Some(aa) => {
                            let ea = em.get("ambiguous").unwrap_or(&Value::Null);
                            if !py_eq(aa, ea) {
                                let bfield = |o: &str, k: &str| {
                                    em.get(o)
                                        .and_then(|x| x.get(k))
                                        .map(py_repr)
                                        .unwrap_or_else(|| "None".into())
                                };
                                self.notes.push(format!(
                                    "borderline: {} ambiguous={}, actual {} (variance {}, threshold {})",
                                    describe(e),
                                    py_str(Some(ea)),
                                    py_str(Some(aa)),
                                    bfield("batch", "variance"),
                                    bfield("params", "variance_threshold")
                                ));
                            }
                        }
                    }
                }
                self.cmp_dict("", em, am, &mut diffs, &skip);
                let Some(Value::Object(ab)) = am.get("batch") else {
                    diffs.push("batch: missing or not an object in actual".into());
                    return diffs;
                };
                let Some(Value::Object(eb)) = em.get("batch") else {
                    diffs.push("batch: not an object in expected".into());
                    return diffs;
                };
                self.cmp_dict("batch", eb, ab, &mut diffs, &["vote_ids"]);
                let (eids, aids) = (eb.get("vote_ids"), ab.get("vote_ids"));
                match (eids, aids) {
                    (_, Some(Value::Array(aids_list))) => {
                        if Self::ids_comparable(eids) {
                            let eids = eids.unwrap_or(&Value::Null);
                            self.cmp_value(
                                "batch.vote_ids",
                                eids,
                                aids.unwrap_or(&Value::Null),
                                &mut diffs,
                                None,
                            );
                        } else if let Some(Value::Array(eids_list)) = eids {
                            if eids_list.len() != aids_list.len() {
                                diffs.push(format!(
                                    "batch.vote_ids: expected {} ids, actual {}",
                                    eids_list.len(),
                                    aids_list.len()
                                ));
                            }
                        } else {
                            diffs.push("batch.vote_ids: not a list in expected".into());
                        }
                    }
                    _ => diffs.push("batch.vote_ids: missing or not a list in actual".into()),
                }
                diffs
            }
            Some("ambiguity_flagged") => {
                skip.push("votes");
                self.cmp_dict("", em, am, &mut diffs, &skip);
                let Some(Value::Array(av)) = am.get("votes") else {
                    diffs.push("votes: missing or not a list in actual".into());
                    return diffs;
                };
                let Some(Value::Array(ev)) = em.get("votes") else {
                    diffs.push("votes: not a list in expected".into());
                    return diffs;
                };
                if ev.len() != av.len() {
                    diffs.push(format!(
                        "votes: expected {} items, actual {}",
                        ev.len(),
                        av.len()
                    ));
                    return diffs;
                }
                let expected_ids = Value::Array(
                    ev.iter()
                        .map(|x| x.get("vote_id").cloned().unwrap_or(Value::Null))
                        .collect(),
                );
                let ids_ok = Self::ids_comparable(Some(&expected_ids));
                let vote_skip: &[&str] = if ids_ok { &[] } else { &["vote_id"] };
                for (i, (x, y)) in ev.iter().zip(av).enumerate() {
                    let Some(y) = y.as_object() else {
                        diffs.push(format!("votes[{i}]: not an object"));
                        continue;
                    };
                    let Some(x) = x.as_object() else {
                        diffs.push(format!("votes[{i}]: not an object in expected"));
                        continue;
                    };
                    self.cmp_dict(&format!("votes[{i}]"), x, y, &mut diffs, vote_skip);
                    if !ids_ok && !y.contains_key("vote_id") {
                        diffs.push(format!("votes[{i}].vote_id: missing in actual"));
                    }
                }
                diffs
            }
            _ => {
                self.cmp_dict("", em, am, &mut diffs, &skip);
                diffs
            }
        }
    }

    /// The mismatches between two event streams (compare.py's
    /// compare_streams); borderline notes go to `self.notes`.
    fn compare_streams(&mut self, expected: &[Value], actual: &[Value]) -> Vec<String> {
        let ignore = self.ignore_source_line;
        let mut mismatches = Vec::new();
        // updates whose ambiguity flag may legitimately go either way
        let borderline: HashSet<(Group, String)> = expected
            .iter()
            .chain(actual)
            .filter(|ev| is_borderline(ev))
            .map(|ev| (group_of(ev), py_key(ev.get("update_seq"))))
            .collect();
        let is_bl_flag = |ev: &Value| {
            type_is(ev, "ambiguity_flagged")
                && borderline.contains(&(group_of(ev), py_key(ev.get("update_seq"))))
        };

        let mut groups_e: HashMap<Group, Vec<&Value>> = HashMap::new();
        let mut groups_a: HashMap<Group, Vec<&Value>> = HashMap::new();
        let mut order: Vec<Group> = Vec::new();
        for (events, groups) in [(expected, &mut groups_e), (actual, &mut groups_a)] {
            for ev in events {
                let g = group_of(ev);
                if !order.contains(&g) {
                    order.push(g.clone());
                }
                groups.entry(g).or_default().push(ev);
            }
        }

        for g in &order {
            let mut le: Vec<&Value> = groups_e.get(g).cloned().unwrap_or_default();
            let mut la: Vec<&Value> = groups_a.get(g).cloned().unwrap_or_default();
            let gname = group_name(g);
            if !matches!(g, Group::Series(..)) {
                // no series: compared as a multiset (sorted), not in order
                sort_multiset(&mut le, ignore);
                sort_multiset(&mut la, ignore);
            } else {
                // borderline flags: compared when both sides have one, else a note
                let mut bl_e: HashMap<String, &Value> = HashMap::new();
                let mut bl_a: HashMap<String, &Value> = HashMap::new();
                for (list, map) in [(&le, &mut bl_e), (&la, &mut bl_a)] {
                    for x in list.iter().filter(|x| is_bl_flag(x)) {
                        map.insert(py_key(x.get("update_seq")), *x);
                    }
                }
                le.retain(|x| !is_bl_flag(x));
                la.retain(|x| !is_bl_flag(x));
                // sorted(set(bl_e) | set(bl_a), key=str): (str(seq), key)
                let mut seqs: Vec<(String, String)> = Vec::new();
                for (k, ev) in bl_e.iter().chain(bl_a.iter()) {
                    if !seqs.iter().any(|(_, seen)| seen == k) {
                        seqs.push((py_str(ev.get("update_seq")), k.clone()));
                    }
                }
                seqs.sort();
                for (_, seq) in seqs {
                    match (bl_e.get(&seq), bl_a.get(&seq)) {
                        (Some(e), Some(a)) => {
                            let d = self.cmp_event(e, a, false);
                            if !d.is_empty() {
                                mismatches.push(format!(
                                    "{gname}: {} differs:\n      {}",
                                    describe(e),
                                    joined_diffs(&d, false)
                                ));
                            }
                        }
                        (Some(x), None) => self
                            .notes
                            .push(format!("borderline: {} only in expected", describe(x))),
                        (None, Some(x)) => self
                            .notes
                            .push(format!("borderline: {} only in actual", describe(x))),
                        (None, None) => {}
                    }
                }
            }
            let ka: Vec<String> = le.iter().map(|x| align_key(x, ignore)).collect();
            let kb: Vec<String> = la.iter().map(|x| align_key(x, ignore)).collect();
            for (op, i1, i2, j1, j2) in opcodes(&ka, &kb) {
                match op {
                    Op::Equal | Op::Replace => {
                        let n = (i2 - i1).min(j2 - j1);
                        for t in 0..n {
                            let (e, a) = (le[i1 + t], la[j1 + t]);
                            let bl = e.is_object()
                                && type_is(e, "score_updated")
                                && borderline.contains(&(g.clone(), py_key(e.get("update_seq"))));
                            let d = self.cmp_event(e, a, bl);
                            if !d.is_empty() {
                                mismatches.push(format!(
                                    "{gname}: {} differs:\n      {}",
                                    describe(e),
                                    joined_diffs(&d, true)
                                ));
                            }
                        }
                        for e in &le[i1 + n..i2] {
                            mismatches.push(format!("{gname}: missing in actual: {}", describe(e)));
                        }
                        for a in &la[j1 + n..j2] {
                            mismatches
                                .push(format!("{gname}: unexpected in actual: {}", describe(a)));
                        }
                    }
                    Op::Delete => {
                        for e in &le[i1..i2] {
                            mismatches.push(format!("{gname}: missing in actual: {}", describe(e)));
                        }
                    }
                    Op::Insert => {
                        for a in &la[j1..j2] {
                            mismatches
                                .push(format!("{gname}: unexpected in actual: {}", describe(a)));
                        }
                    }
                }
            }
        }
        mismatches.extend(adjacency_problems(actual, "actual"));
        mismatches.extend(adjacency_problems(expected, "expected"));
        mismatches
    }
}

/// Python's `sorted(events, key=_multiset_key)` (stable).
fn sort_multiset(events: &mut Vec<&Value>, ignore_line: bool) {
    let mut keyed: Vec<_> = events
        .iter()
        .enumerate()
        .map(|(i, ev)| (multiset_key(ev, ignore_line), i, *ev))
        .collect();
    keyed.sort_by(|x, y| x.0.cmp(&y.0).then(x.1.cmp(&y.1)));
    *events = keyed.into_iter().map(|(_, _, ev)| ev).collect();
}

// ---------------------------------------------------------------------------
// difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Equal,
    Replace,
    Delete,
    Insert,
}

/// The opcodes Python's `difflib.SequenceMatcher(None, a, b,
/// autojunk=False).get_opcodes()` returns (no junk: every element counts).
pub fn opcodes(a: &[String], b: &[String]) -> Vec<(Op, usize, usize, usize, usize)> {
    let mut b2j: HashMap<&str, Vec<usize>> = HashMap::new();
    for (j, x) in b.iter().enumerate() {
        b2j.entry(x.as_str()).or_default().push(j);
    }
    // get_matching_blocks
    let mut queue = vec![(0, a.len(), 0, b.len())];
    let mut blocks: Vec<(usize, usize, usize)> = Vec::new();
    while let Some((alo, ahi, blo, bhi)) = queue.pop() {
        let (i, j, k) = longest_match(a, b, &b2j, alo, ahi, blo, bhi);
        if k > 0 {
            blocks.push((i, j, k));
            if alo < i && blo < j {
                queue.push((alo, i, blo, j));
            }
            if i + k < ahi && j + k < bhi {
                queue.push((i + k, ahi, j + k, bhi));
            }
        }
    }
    blocks.sort();
    // adjacent blocks collapse into one
    let mut merged: Vec<(usize, usize, usize)> = Vec::new();
    let (mut i1, mut j1, mut k1) = (0, 0, 0);
    for (i2, j2, k2) in blocks {
        if i1 + k1 == i2 && j1 + k1 == j2 {
            k1 += k2;
        } else {
            if k1 > 0 {
                merged.push((i1, j1, k1));
            }
            (i1, j1, k1) = (i2, j2, k2);
        }
    }
    if k1 > 0 {
        merged.push((i1, j1, k1));
    }
    merged.push((a.len(), b.len(), 0));
    // get_opcodes
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    for (ai, bj, size) in merged {
        let op = if i < ai && j < bj {
            Some(Op::Replace)
        } else if i < ai {
            Some(Op::Delete)
        } else if j < bj {
            Some(Op::Insert)
        } else {
            None
        };
        if let Some(op) = op {
            ops.push((op, i, ai, j, bj));
        }
        (i, j) = (ai + size, bj + size);
        if size > 0 {
            ops.push((Op::Equal, ai, i, bj, j));
        }
    }
    ops
}

/// SequenceMatcher.find_longest_match without junk: the longest block
/// a[i..i+k] == b[j..j+k] in the ranges, the earliest in a, then in b.
#[allow(clippy::too_many_arguments)]
fn longest_match(
    a: &[String],
    b: &[String],
    b2j: &HashMap<&str, Vec<usize>>,
    alo: usize,
    ahi: usize,
    blo: usize,
    bhi: usize,
) -> (usize, usize, usize) {
    let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0);
    let mut j2len: HashMap<usize, usize> = HashMap::new();
    for (i, x) in a.iter().enumerate().take(ahi).skip(alo) {
        let mut newj2len: HashMap<usize, usize> = HashMap::new();
        if let Some(js) = b2j.get(x.as_str()) {
            for &j in js {
                if j < blo {
                    continue;
                }
                if j >= bhi {
                    break;
                }
                let prev = if j > 0 {
                    j2len.get(&(j - 1)).copied().unwrap_or(0)
                } else {
                    0
                };
                let k = prev + 1;
                newj2len.insert(j, k);
                if k > bestsize {
                    besti = i + 1 - k;
                    bestj = j + 1 - k;
                    bestsize = k;
                }
            }
        }
        j2len = newj2len;
    }
    while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
        besti -= 1;
        bestj -= 1;
        bestsize += 1;
    }
    while besti + bestsize < ahi
        && bestj + bestsize < bhi
        && a[besti + bestsize] == b[bestj + bestsize]
    {
        bestsize += 1;
    }
    (besti, bestj, bestsize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strs(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn opcodes_match_difflib() {
        // difflib.SequenceMatcher(None, "abxcd", "abcyd", autojunk=False).get_opcodes()
        let a = strs(&["a", "b", "x", "c", "d"]);
        let b = strs(&["a", "b", "c", "y", "d"]);
        assert_eq!(
            opcodes(&a, &b),
            vec![
                (Op::Equal, 0, 2, 0, 2),
                (Op::Delete, 2, 3, 2, 2),
                (Op::Equal, 3, 4, 2, 3),
                (Op::Insert, 4, 4, 3, 4),
                (Op::Equal, 4, 5, 4, 5),
            ]
        );
        // ("qabxcd", "abycdf"): [('delete', 0, 1, 0, 0), ('equal', 1, 3, 0, 2),
        // ('replace', 3, 4, 2, 3), ('equal', 4, 6, 3, 5), ('insert', 6, 6, 5, 6)]
        let a = strs(&["q", "a", "b", "x", "c", "d"]);
        let b = strs(&["a", "b", "y", "c", "d", "f"]);
        assert_eq!(
            opcodes(&a, &b),
            vec![
                (Op::Delete, 0, 1, 0, 0),
                (Op::Equal, 1, 3, 0, 2),
                (Op::Replace, 3, 4, 2, 3),
                (Op::Equal, 4, 6, 3, 5),
                (Op::Insert, 6, 6, 5, 6),
            ]
        );
        assert!(opcodes(&[], &[]).is_empty());
    }

    #[test]
    fn times_numbers_and_python_forms() {
        let t = |s: &str| parse_utc(&json!(s));
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(t("1970-01-01t00:00:01.5z"), Some(1_500_000_000));
        assert_eq!(
            t("2024-07-07T00:11:12.007983829+00:00"),
            t("2024-07-07T00:11:12.007983829Z")
        );
        assert_eq!(
            t("2024-07-07T00:11:12Z"),
            t("2024-07-07T00:11:12.000-00:00")
        );
        assert_eq!(t("2000-03-01T00:00:00Z"), Some(951_868_800 * 1_000_000_000));
        assert_eq!(t("2024-07-07T00:11:12+01:00"), None);
        assert_eq!(t("2024-07-07T00:11:12"), None);
        assert_eq!(t("2024-07-07T00:11:12.0123456789Z"), None);
        assert_eq!(parse_utc(&json!(5)), None);
        assert!(isclose(1.0, 1.0 + 1e-10));
        assert!(!isclose(1.0, 1.0 + 1e-8));
        assert!(isclose(0.0, 5e-10));
        assert_eq!(py_float(0.1), "0.1");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(1e15), "1000000000000000.0");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(0.00001), "1e-05");
        assert_eq!(py_float(-2.5e-7), "-2.5e-07");
        assert_eq!(
            dumps(&json!({"line": 3, "b": [true, null, "é"]}), true),
            r#"{"b": [true, null, "\u00e9"], "line": 3}"#
        );
    }

    fn event(v: Value) -> String {
        format!("{v}\n")
    }

    #[test]
    fn streams_follow_compare_py_rules() {
        let upd = |seq: u64, score: f64, ids: Value| {
            json!({"type": "score_updated", "processed_at": "x", "inference_id": "i",
                   "voter_prompt_id": "p", "update_seq": seq, "score": score,
                   "ambiguous": false,
                   "batch": {"window_start": "2024-01-01T00:00:00Z", "variance": 0.5,
                             "vote_ids": ids},
                   "params": {"variance_threshold": 0.1}})
        };
        let rej = |line: u64, detail: &str| {
            json!({"type": "vote_rejected", "processed_at": "y", "reason": "late",
                   "detail": detail, "payload": "{}", "source": {"line": line}})
        };
        let expected: String = [
            upd(1, 0.5, json!(["derived:1", "derived:2"])),
            rej(3, "placeholder"),
            rej(2, "placeholder"),
            upd(2, 0.25, json!(["a"])),
        ]
        .into_iter()
        .map(event)
        .collect();
        // the same events: rejections in another order, other derived ids,
        // a time with another offset form, numbers within 1e-9, an extra field
        let mut u1 = upd(1, 0.5 + 1e-12, json!(["x", "y"]));
        u1["batch"]["window_start"] = json!("2024-01-01T00:00:00.000+00:00");
        u1["extra"] = json!(1);
        let actual: String = [
            rej(2, "why"),
            u1.clone(),
            rej(3, "why"),
            upd(2, 0.25, json!(["a"])),
        ]
        .into_iter()
        .map(event)
        .collect();
        let out = compare_streams(expected.as_bytes(), "e", actual.as_bytes(), "a", false, 5);
        assert!(out.passed(), "{:?}", out.report);
        assert_eq!(out.summary(), "4 events, 0 mismatches");
        assert!(out
            .report
            .iter()
            .any(|l| l.starts_with("warning: 1 extra-field")));

        // an empty detail (the rejections are a multiset: sorted by line
        // first) and a missing update
        let actual: String = [rej(2, ""), u1, rej(3, "why")]
            .into_iter()
            .map(event)
            .collect();
        let out = compare_streams(expected.as_bytes(), "e", actual.as_bytes(), "a", false, 5);
        assert_eq!(
            out.mismatches,
            vec![
                "series i/p: missing in actual: score_updated(i/p #2)".to_string(),
                "rejections: vote_rejected(late, source={\"line\": 2}) differs:\n      \
                 detail: must be a non-empty string, actual \"\""
                    .to_string(),
            ]
        );

        // source.line: compared unless ignored
        let e = event(rej(3, "a"));
        let a = event(rej(1, "b"));
        let out = compare_streams(e.as_bytes(), "e", a.as_bytes(), "a", false, 5);
        assert_eq!(
            out.mismatches,
            vec![
                "rejections: vote_rejected(late, source={\"line\": 3}) differs:\n      \
                 source.line: expected 3, actual 1"
                    .to_string()
            ]
        );
        assert!(compare_streams(e.as_bytes(), "e", a.as_bytes(), "a", true, 5).passed());

        // a flag must follow its update
        let flag = json!({"type": "ambiguity_flagged", "processed_at": "z", "inference_id": "i",
                          "voter_prompt_id": "p", "update_seq": 1, "votes": []});
        let e = format!("{}{}", event(upd(1, 0.5, json!([]))), event(flag.clone()));
        let a = format!("{}{}", event(flag), event(upd(1, 0.5, json!([]))));
        let out = compare_streams(e.as_bytes(), "e", a.as_bytes(), "a", false, 5);
        assert_eq!(
            out.mismatches,
            vec![
                "series i/p: unexpected in actual: ambiguity_flagged(i/p #1)".to_string(),
                "series i/p: missing in actual: ambiguity_flagged(i/p #1)".to_string(),
                "actual event #1 ambiguity_flagged(i/p #1) does not directly follow its \
                 score_updated"
                    .to_string(),
            ]
        );
    }

    #[test]
    fn borderline_flags_are_notes() {
        let upd = |ambiguous: bool| {
            json!({"type": "score_updated", "processed_at": "x", "inference_id": "i",
                   "voter_prompt_id": "p", "update_seq": 1, "ambiguous": ambiguous,
                   "batch": {"variance": 0.1, "vote_ids": []},
                   "params": {"variance_threshold": 0.1}})
        };
        let flag = json!({"type": "ambiguity_flagged", "processed_at": "z", "inference_id": "i",
                          "voter_prompt_id": "p", "update_seq": 1, "votes": []});
        let e = format!("{}{}", event(upd(true)), event(flag));
        let a = event(upd(false));
        let out = compare_streams(e.as_bytes(), "e", a.as_bytes(), "a", false, 5);
        assert!(out.passed(), "{:?}", out.mismatches);
        assert!(
            out.report
                .iter()
                .any(|l| l.starts_with("note: 2 borderline")),
            "{:?}",
            out.report
        );
        assert_eq!(
            out.report.last().map(String::as_str),
            Some("2 events, 0 mismatches"),
            "N is the expected stream's events, as compare.py counts"
        );
    }

    #[test]
    fn documents_compare_numbers_within_tolerance() {
        let e = br#"{"rubrics": [{"id": "a", "w": 0.5}], "n": 1}"#;
        let a = br#"{"rubrics": [{"id": "a", "w": 0.5000000000001}], "n": 1.0, "new": true}"#;
        let out = compare_documents(e, "expected.json", a, "actual.json", 10);
        assert!(out.passed(), "{:?}", out.report);
        assert_eq!(out.summary(), "1 documents, 0 mismatches");
        let a = br#"{"rubrics": [{"id": "b", "w": 0.6}], "n": true}"#;
        let out = compare_documents(e, "expected.json", a, "actual.json", 10);
        assert_eq!(out.mismatches.len(), 3, "{:?}", out.mismatches);
        assert!(out
            .mismatches
            .contains(&"rubrics[0].w: expected 0.5, actual 0.6".to_string()));
        assert!(!compare_documents(e, "e", b"{", "a", 10).passed());
    }
}
