//! The conformance cases: the public golden cases of the behaviour contract
//! (docs/contract.md), kept in `tests/conformance/` (`cases/`, `cases-v3/`
//! for contract §13, `cases-v4/` for §14; tests/conformance/README.md says
//! how a case is laid out). [`conformance_cases_pass`] runs every case
//! against the built binary with the protocol of the conformance kit's
//! `check.sh`, and compares outputs with the rules of its `compare.py`
//! (reproduced in `tests/conformance/compare.rs`), once with the default
//! cache and once with `state.cache_mb = 0`. Per case:
//!
//! - `expect_error`: `replay` exits with status 2, prints no event, and its
//!   stdout or stderr names the key on the file's first line;
//! - `expected.json`: `reputation --format json` prints that document;
//! - `input2.jsonl`: `input.jsonl` replayed with `--state-dir D`, then
//!   `input2.jsonl` with `--state-dir D`; the two outputs together are
//!   `expected.jsonl`;
//! - otherwise `replay` prints `expected.jsonl`, and so does the input
//!   split after its middle line, the first part with `--state-dir D
//!   --keep-open` and the second with `--state-dir D` (`source.line` not
//!   compared).
//!
//! A case's `env` file (NAME=VALUE lines) is the environment of its runs;
//! no other `JURYSTREAM_*` variable reaches the program. Each run is killed
//! after `CHECK_TIMEOUT` seconds (default 300). The outputs of failing cases
//! stay in the work directory the failure names (`CHECK_KEEP=1` or
//! `JURYSTREAM_TEST_KEEP=1` keeps it always); `CHECK_JOBS=1` runs the cases
//! one at a time (default 2).
//!
//! [`shared_conformance_kit_passes_when_present`] also runs the shared kit
//! (`../shared/conformance/check.sh`, which may hold newer cases) when it is
//! beside the repository, and passes with a note when it is not.

#[path = "conformance/compare.rs"]
mod compare;

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The case sets, folders of `tests/conformance/`.
const SETS: [&str; 3] = ["cases", "cases-v3", "cases-v4"];
/// `state.cache_mb` of the two passes: the default, and 0 (every series and
/// identity read from RocksDB).
const CACHE_PASSES: [(&str, Option<&str>); 2] = [("default", None), ("0", Some("0"))];
/// How many mismatches a comparison reports (check.sh: `--show 10`).
const SHOW: usize = 10;
/// The exit status `timeout(1)` reports for a run it stopped.
const TIMED_OUT: i32 = 124;

fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The cases of a set: its sub-folders, by name (hidden ones left out, as
/// check.sh's `"$CASEDIR"/*/`).
fn case_names(set_dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(set_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.path().is_dir() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A run's exit status as bash reports it (128 + signal when killed by one,
/// 124 when stopped by the timeout), or why it could not start.
#[derive(Clone, Debug)]
struct Exit {
    code: i32,
    why: Option<String>,
}

impl Exit {
    fn ok(&self) -> bool {
        self.code == 0 && self.why.is_none()
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code)?;
        if let Some(why) = &self.why {
            write!(f, " ({why})")?;
        }
        Ok(())
    }
}

/// The variables of a case's `env` file, as check.sh's `run` passes them to
/// env(1): one NAME=VALUE per line, blank lines and lines starting with `#`
/// skipped; no file, no variables.
fn read_env_file(path: &Path) -> Result<Vec<(OsString, OsString)>, String> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let data = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut vars = Vec::new();
    for line in data.split(|&c| c == b'\n') {
        if line.is_empty() || line[0] == b'#' {
            continue;
        }
        match line.iter().position(|&c| c == b'=') {
            Some(eq) if eq > 0 => vars.push((
                OsString::from_vec(line[..eq].to_vec()),
                OsString::from_vec(line[eq + 1..].to_vec()),
            )),
            _ => {
                return Err(format!(
                    "env: {:?} is not a NAME=VALUE line",
                    String::from_utf8_lossy(line)
                ))
            }
        }
    }
    Ok(vars)
}

/// The first line of a file, without its newline (`$(head -n 1 FILE)`).
fn first_line(data: &[u8]) -> &[u8] {
    match data.iter().position(|&c| c == b'\n') {
        Some(end) => &data[..end],
        None => data,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// The first `k` lines of `data` and the rest (`head -n k`, `tail -n +k+1`).
fn split_after_line(data: &[u8], k: usize) -> (&[u8], &[u8]) {
    if k == 0 {
        return (&[], data);
    }
    let end = data
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == b'\n')
        .nth(k - 1)
        .map_or(data.len(), |(i, _)| i + 1);
    data.split_at(end)
}

fn replay_args(
    config: &Path,
    input: &Path,
    state_dir: Option<&Path>,
    keep_open: bool,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "replay".into(),
        "--config".into(),
        config.into(),
        "--input".into(),
        input.into(),
    ];
    if let Some(dir) = state_dir {
        args.push("--state-dir".into());
        args.push(dir.into());
    }
    if keep_open {
        args.push("--keep-open".into());
    }
    args
}

/// What a case found wrong (nothing: it passed), and the comparisons'
/// reports.
#[derive(Debug, Default)]
struct Verdict {
    problems: Vec<String>,
    details: Vec<String>,
}

impl Verdict {
    fn passed(&self) -> bool {
        self.problems.is_empty()
    }

    /// Records a failed comparison: `label: summary` as a problem, the
    /// report's lines as details.
    fn compared(&mut self, label: &str, outcome: &compare::Outcome) {
        if outcome.passed() {
            return;
        }
        self.problems
            .push(format!("{label}: {}", outcome.summary()));
        self.details.push(format!("{label}:"));
        self.details
            .extend(outcome.report.iter().map(|l| format!("    {l}")));
    }
}

/// Runs the binary the way check.sh does.
struct Runner {
    bin: PathBuf,
    timeout: Duration,
    /// `JURYSTREAM_STATE__CACHE_MB` of every run (set after the case's own
    /// variables, as the kit's wrapper did).
    cache_mb: Option<&'static str>,
}

impl Runner {
    /// check.sh's `run`: the program with `args`, the case's variables and
    /// no other `JURYSTREAM_*` one, stdin empty, stdout and stderr to the
    /// files; stopped after the timeout.
    fn run(
        &self,
        env: &[(OsString, OsString)],
        args: &[OsString],
        stdout: &Path,
        stderr: &Path,
    ) -> Exit {
        self.try_run(env, args, stdout, stderr)
            .unwrap_or_else(|e| Exit {
                code: 127,
                why: Some(format!("cannot run {}: {e}", self.bin.display())),
            })
    }

    fn try_run(
        &self,
        env: &[(OsString, OsString)],
        args: &[OsString],
        stdout: &Path,
        stderr: &Path,
    ) -> io::Result<Exit> {
        let mut cmd = Command::new(&self.bin);
        for (name, _) in std::env::vars_os() {
            if name.as_encoded_bytes().starts_with(b"JURYSTREAM_") {
                cmd.env_remove(&name);
            }
        }
        for (name, value) in env {
            cmd.env(name, value);
        }
        if let Some(mb) = self.cache_mb {
            cmd.env("JURYSTREAM_STATE__CACHE_MB", mb);
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(fs::File::create(stdout)?)
            .stderr(fs::File::create(stderr)?);
        let mut child = cmd.spawn()?;
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                let code = status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
                return Ok(Exit { code, why: None });
            }
            if start.elapsed() >= self.timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Exit {
                    code: TIMED_OUT,
                    why: Some(format!("stopped after {} s", self.timeout.as_secs())),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// One case, its files written to `out` (created).
    fn check_case(&self, dir: &Path, out: &Path) -> Verdict {
        let mut v = Verdict::default();
        if let Err(e) = fs::create_dir_all(out) {
            v.problems
                .push(format!("cannot create {}: {e}", out.display()));
            return v;
        }
        let config = dir.join("config.toml");
        let input = dir.join("input.jsonl");
        if !config.is_file() || !input.is_file() {
            v.problems
                .push("no such case (config.toml, input.jsonl)".into());
            return v;
        }
        let env = match read_env_file(&dir.join("env")) {
            Ok(env) => env,
            Err(e) => {
                v.problems.push(e);
                return v;
            }
        };

        if dir.join("expect_error").is_file() {
            self.expect_error(dir, out, &env, &mut v);
        } else if dir.join("expected.json").is_file() {
            self.reputation_document(dir, out, &env, &mut v);
        } else if dir.join("input2.jsonl").is_file() {
            self.continuation(dir, out, &env, &mut v);
        } else {
            self.replay_and_split(dir, out, &env, &mut v);
        }
        v
    }

    /// Exit status 2 at start, no events, a message naming the key.
    fn expect_error(&self, dir: &Path, out: &Path, env: &[(OsString, OsString)], v: &mut Verdict) {
        let key = match fs::read(dir.join("expect_error")) {
            Ok(data) => first_line(&data).to_vec(),
            Err(e) => {
                v.problems.push(format!("cannot read expect_error: {e}"));
                return;
            }
        };
        let (stdout_path, stderr_path) = (out.join("stdout.txt"), out.join("stderr.txt"));
        let args = replay_args(
            &dir.join("config.toml"),
            &dir.join("input.jsonl"),
            None,
            false,
        );
        let rc = self.run(env, &args, &stdout_path, &stderr_path);
        let stdout = fs::read(&stdout_path).unwrap_or_default();
        let stderr = fs::read(&stderr_path).unwrap_or_default();
        if rc.code != 2 || rc.why.is_some() {
            v.problems.push(format!("exit status {rc}, expected 2"));
        }
        // grep -F KEY over stdout then stderr (an empty key needs a line)
        let mut both = stdout.clone();
        both.extend_from_slice(&stderr);
        let named = if key.is_empty() {
            !both.is_empty()
        } else {
            contains(&both, &key)
        };
        if !named {
            v.problems.push(format!(
                "the message does not name '{}'",
                String::from_utf8_lossy(&key)
            ));
        }
        if contains(&stdout, b"\"type\"") {
            v.problems.push("events printed".into());
        }
    }

    /// Contract §14: `reputation --format json` prints expected.json.
    fn reputation_document(
        &self,
        dir: &Path,
        out: &Path,
        env: &[(OsString, OsString)],
        v: &mut Verdict,
    ) {
        let actual_path = out.join("actual.json");
        let args: Vec<OsString> = vec![
            "reputation".into(),
            "--config".into(),
            dir.join("config.toml").into(),
            "--input".into(),
            dir.join("input.jsonl").into(),
            "--format".into(),
            "json".into(),
        ];
        let rc = self.run(env, &args, &actual_path, &out.join("stderr.txt"));
        if !rc.ok() {
            v.problems.push(format!("reputation exited {rc}"));
            return;
        }
        let expected = fs::read(dir.join("expected.json")).unwrap_or_default();
        let actual = fs::read(&actual_path).unwrap_or_default();
        let outcome =
            compare::compare_documents(&expected, "expected.json", &actual, "actual.json", SHOW);
        write_report(&out.join("compare.txt"), &outcome);
        v.compared("reputation", &outcome);
    }

    /// Two replays through one state directory, one after the other
    /// (`--keep-open` where the input says so): their outputs
    /// (`{name}1.jsonl`, `{name}2.jsonl`) concatenated.
    fn replay_twice(
        &self,
        env: &[(OsString, OsString)],
        config: &Path,
        inputs: &[(PathBuf, bool); 2],
        state: &Path,
        out: &Path,
        name: &str,
    ) -> Result<Vec<u8>, String> {
        let mut outputs = Vec::new();
        let mut codes = Vec::new();
        for (i, (input, keep_open)) in inputs.iter().enumerate() {
            let stdout = out.join(format!("{name}{}.jsonl", i + 1));
            let rc = self.run(
                env,
                &replay_args(config, input, Some(state), *keep_open),
                &stdout,
                &out.join(format!("{name}{}.stderr.txt", i + 1)),
            );
            codes.push(rc);
            outputs.push(stdout);
        }
        if !codes.iter().all(|rc| rc.ok()) {
            return Err(format!("{name} replay exited {}/{}", codes[0], codes[1]));
        }
        Ok(concat_files(&outputs[0], &outputs[1]))
    }

    /// input.jsonl, then input2.jsonl, through one state directory, without
    /// --keep-open: together expected.jsonl.
    fn continuation(&self, dir: &Path, out: &Path, env: &[(OsString, OsString)], v: &mut Verdict) {
        let config = dir.join("config.toml");
        let state = out.join("state");
        if let Err(e) = fs::create_dir_all(&state) {
            v.problems
                .push(format!("cannot create {}: {e}", state.display()));
            return;
        }
        let inputs = [
            (dir.join("input.jsonl"), false),
            (dir.join("input2.jsonl"), false),
        ];
        let actual = match self.replay_twice(env, &config, &inputs, &state, out, "run") {
            Ok(actual) => actual,
            Err(e) => return v.problems.push(e),
        };
        let _ = fs::write(out.join("actual.jsonl"), &actual);
        match fs::read(dir.join("expected.jsonl")) {
            Ok(expected) => {
                let outcome = compare::compare_streams(
                    &expected,
                    "expected.jsonl",
                    &actual,
                    "actual.jsonl",
                    false,
                    SHOW,
                );
                write_report(&out.join("compare.txt"), &outcome);
                v.compared("continuation", &outcome);
            }
            Err(e) => v.problems.push(format!("cannot read expected.jsonl: {e}")),
        }
    }

    /// The whole input, then the input in two parts through --state-dir.
    fn replay_and_split(
        &self,
        dir: &Path,
        out: &Path,
        env: &[(OsString, OsString)],
        v: &mut Verdict,
    ) {
        let config = dir.join("config.toml");
        let input = dir.join("input.jsonl");
        let expected = match fs::read(dir.join("expected.jsonl")) {
            Ok(data) => Some(data),
            Err(e) => {
                v.problems.push(format!("cannot read expected.jsonl: {e}"));
                None
            }
        };

        // 1. one replay of the whole input
        let actual_path = out.join("actual.jsonl");
        let rc = self.run(
            env,
            &replay_args(&config, &input, None, false),
            &actual_path,
            &out.join("stderr.txt"),
        );
        if !rc.ok() {
            v.problems.push(format!("replay exited {rc}"));
        } else if let Some(expected) = &expected {
            let actual = fs::read(&actual_path).unwrap_or_default();
            let outcome = compare::compare_streams(
                expected,
                "expected.jsonl",
                &actual,
                "actual.jsonl",
                false,
                SHOW,
            );
            write_report(&out.join("compare.txt"), &outcome);
            v.compared("replay", &outcome);
        }

        // 2. the same input in two parts, through --state-dir: cut after
        // line n/2 (n: the newlines, as `wc -l` counts them)
        let data = match fs::read(&input) {
            Ok(data) => data,
            Err(e) => {
                v.problems.push(format!("cannot read input.jsonl: {e}"));
                return;
            }
        };
        let k = data.iter().filter(|&&c| c == b'\n').count() / 2;
        let (part1, part2) = split_after_line(&data, k);
        let (part1_path, part2_path) = (out.join("part1.jsonl"), out.join("part2.jsonl"));
        let state = out.join("state");
        let prepared = fs::write(&part1_path, part1)
            .and_then(|()| fs::write(&part2_path, part2))
            .and_then(|()| fs::create_dir_all(&state));
        if let Err(e) = prepared {
            v.problems
                .push(format!("cannot prepare the split replay: {e}"));
            return;
        }
        let inputs = [(part1_path, true), (part2_path, false)];
        let split = match self.replay_twice(env, &config, &inputs, &state, out, "split") {
            Ok(split) => split,
            Err(e) => return v.problems.push(e),
        };
        let _ = fs::write(out.join("split.jsonl"), &split);
        if let Some(expected) = &expected {
            let outcome = compare::compare_streams(
                expected,
                "expected.jsonl",
                &split,
                "split.jsonl",
                true,
                SHOW,
            );
            write_report(&out.join("split_compare.txt"), &outcome);
            v.compared(&format!("split replay after line {k}"), &outcome);
        }
    }
}

/// `cat A B`.
fn concat_files(a: &Path, b: &Path) -> Vec<u8> {
    let mut data = fs::read(a).unwrap_or_default();
    data.extend(fs::read(b).unwrap_or_default());
    data
}

fn write_report(path: &Path, outcome: &compare::Outcome) {
    let mut text = outcome.report.join("\n");
    text.push('\n');
    let _ = fs::write(path, text);
}

/// One case in one cache pass.
struct Job {
    cache: &'static str,
    cache_mb: Option<&'static str>,
    set: &'static str,
    name: String,
}

impl Job {
    fn label(&self) -> String {
        format!("{}/{} (state.cache_mb {})", self.set, self.name, self.cache)
    }
}

#[test]
fn conformance_cases_pass() {
    let root = conformance_dir();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_jurystream"));
    let timeout = Duration::from_secs(env_number("CHECK_TIMEOUT").unwrap_or(300).max(1));
    let threads = env_number("CHECK_JOBS").unwrap_or(2).clamp(1, 2) as usize;
    let keep = ["CHECK_KEEP", "JURYSTREAM_TEST_KEEP"]
        .iter()
        .any(|v| std::env::var(v).as_deref() == Ok("1"));

    let mut jobs = Vec::new();
    for (cache, cache_mb) in CACHE_PASSES {
        for set in SETS {
            let dir = root.join(set);
            let names = case_names(&dir)
                .unwrap_or_else(|e| panic!("cannot list the cases in {}: {e}", dir.display()));
            assert!(!names.is_empty(), "no cases in {}", dir.display());
            for name in names {
                jobs.push(Job {
                    cache,
                    cache_mb,
                    set,
                    name,
                });
            }
        }
    }

    let work = tempfile::Builder::new()
        .prefix("jurystream-conformance.")
        .tempdir()
        .expect("cannot create a work directory");
    let next = AtomicUsize::new(0);
    let verdicts: Mutex<Vec<Option<Verdict>>> = Mutex::new(jobs.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(job) = jobs.get(i) else { break };
                let runner = Runner {
                    bin: bin.clone(),
                    timeout,
                    cache_mb: job.cache_mb,
                };
                let out = work
                    .path()
                    .join(format!("cache-{}", job.cache))
                    .join(job.set)
                    .join(&job.name);
                let verdict = runner.check_case(&root.join(job.set).join(&job.name), &out);
                if verdict.passed() {
                    println!("PASS {}", job.label());
                } else {
                    println!(
                        "FAIL {}: {} (see {})",
                        job.label(),
                        verdict.problems.join("; "),
                        out.display()
                    );
                }
                verdicts.lock().unwrap()[i] = Some(verdict);
            });
        }
    });

    let verdicts = verdicts.into_inner().unwrap();
    let mut failures = Vec::new();
    for (job, verdict) in jobs.iter().zip(verdicts) {
        let verdict = verdict.expect("every case ran");
        if !verdict.passed() {
            let mut text = format!("FAIL {}: {}", job.label(), verdict.problems.join("; "));
            for line in &verdict.details {
                text.push_str("\n  ");
                text.push_str(line);
            }
            failures.push(text);
        }
    }
    let passed = jobs.len() - failures.len();
    println!("{passed} passed, {} failed", failures.len());
    if failures.is_empty() && !keep {
        return;
    }
    let kept = work.keep();
    println!("work directory: {}", kept.display());
    assert!(
        failures.is_empty(),
        "{} of {} conformance case runs failed (outputs in {}):\n\n{}",
        failures.len(),
        jobs.len(),
        kept.display(),
        failures.join("\n\n")
    );
}

/// The shared conformance kit beside the repository, when it is there (it
/// may hold cases newer than tests/conformance): every case set it has,
/// with the default cache and with `state.cache_mb = 0`. Without the kit
/// this passes with a note, `JURYSTREAM_REQUIRE_BROKER=1` or not: the
/// project's own cases ran in [`conformance_cases_pass`].
#[test]
fn shared_conformance_kit_passes_when_present() {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/check.sh");
    if !kit.is_file() {
        eprintln!(
            "NOTE: no shared conformance kit at {} (optional); the project's own cases \
             (tests/conformance) ran in conformance_cases_pass",
            kit.display()
        );
        return;
    }
    // The kit removes JURYSTREAM_* variables, so the cache_mb = 0 pass goes
    // through a wrapper that sets it.
    let work = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_jurystream");
    let wrapper = work.path().join("jurystream-cache0");
    fs::write(
        &wrapper,
        format!("#!/bin/sh\nJURYSTREAM_STATE__CACHE_MB=0 exec '{bin}' \"$@\"\n"),
    )
    .unwrap();
    fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let programs = [("default", Path::new(bin)), ("0", wrapper.as_path())];
    for (mb, program) in programs {
        for set in SETS {
            let cases = kit.with_file_name(set);
            if !cases.is_dir() {
                eprintln!("NOTE: the shared kit has no {set}/");
                continue;
            }
            let out = Command::new("bash")
                .arg(&kit)
                .arg(program)
                .env("CHECK_CASES", &cases)
                .output()
                .expect("cannot run check.sh");
            let stdout = String::from_utf8_lossy(&out.stdout);
            println!("shared kit, {set}, state.cache_mb {mb}:\n{stdout}");
            assert!(
                out.status.success(),
                "shared conformance kit ({set}) failed with state.cache_mb {mb} (exit {:?}):\n{stdout}\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                stdout
                    .lines()
                    .last()
                    .is_some_and(|l| l.ends_with(" 0 failed")),
                "unexpected summary:\n{stdout}"
            );
        }
    }
}

#[test]
fn runner_helpers_follow_check_sh() {
    // head -n k / tail -n +k+1
    assert_eq!(
        split_after_line(b"a\nb\nc\n", 1),
        (&b"a\n"[..], &b"b\nc\n"[..])
    );
    assert_eq!(split_after_line(b"a\nb\nc", 2), (&b"a\nb\n"[..], &b"c"[..]));
    assert_eq!(split_after_line(b"a", 0), (&b""[..], &b"a"[..]));
    assert_eq!(first_line(b"lambda\nmore\n"), b"lambda");
    assert_eq!(first_line(b"lamda"), b"lamda");
    assert!(contains(b"error: scoring.lambda must be", b"lambda"));
    assert!(!contains(b"error", b"lambda"));

    let dir = tempfile::tempdir().unwrap();
    let env = dir.path().join("env");
    fs::write(
        &env,
        "# overrides\n\nJURYSTREAM_A__B=1\nJURYSTREAM_C__D=x=y",
    )
    .unwrap();
    assert_eq!(
        read_env_file(&env).unwrap(),
        vec![
            (OsString::from("JURYSTREAM_A__B"), OsString::from("1")),
            (OsString::from("JURYSTREAM_C__D"), OsString::from("x=y")),
        ]
    );
    fs::write(&env, "NOT_AN_ASSIGNMENT\n").unwrap();
    assert!(read_env_file(&env).is_err());
    assert!(read_env_file(&dir.path().join("none")).unwrap().is_empty());
}
