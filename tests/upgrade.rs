//! Upgrades: a build continues exactly from the state an earlier build
//! wrote. `tests/fixtures/state-format-N/` holds what the build of state
//! format N left behind after the first part of a vote stream — a replay's
//! `--state-dir`, and a service's changelog topic, input topic, committed
//! events and local `state.dir` — written by `write_format_N_fixtures`
//! (`#[ignore]`d: it runs the old binary named by `JURYSTREAM_FIXTURE_BIN`).
//! There are fixtures for formats 6 ([`write_format_6_fixtures`], commit
//! ed1e475), 7 ([`write_format_7_fixtures`], commit d6bf4e9), 8
//! ([`write_format_8_fixtures`], commit 783ceac, in contract §14's `learned`
//! mode: its reputation topic too, and `replay --partition-files` as the
//! run's oracle), 9 ([`write_format_9_fixtures`], commit 55b69dd,
//! `learned` too), 10 ([`write_format_10_fixtures`], commit 0de2b72,
//! `learned` too: its series values carry their open values), 11
//! ([`write_format_11_fixtures`], commit e748c18, `learned` too: its
//! sealed deltas have no contract §15 sums) and 12
//! ([`write_format_12_fixtures`], commit dc2a84e, `learned` with contract
//! §15's model `confusion`: its sealed deltas carry §15's sums). The other
//! tests run this build on the second part and compare with a replay of
//! the whole stream by this build, three for each format N:
//!
//! - `replay_continues_from_a_format_N_state_directory` (no broker;
//!   [`replay_continues`]);
//! - `run_restores_a_format_N_changelog_and_continues_exactly` (an empty
//!   `state.dir`: everything comes from the changelog) and
//!   `run_continues_on_a_format_N_state_directory_exactly` (the old
//!   instance's RocksDB directories plus the changelog), both
//!   [`run_continues`], on a fresh test broker into which the fixture's
//!   input and changelog records are written back at their partitions and
//!   offsets, byte for byte. Skipped when tansu is not installed, unless
//!   JURYSTREAM_REQUIRE_BROKER=1.
//!
//! A later state format adds `state-format-M/` the same way, written by the
//! last build of format M (see the fixtures' README.md and
//! docs/testing.md); the fixtures of older formats stay.

mod kafka_support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kafka_support::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use serde_json::{json, Value};

/// One broker test at a time: they are heavy on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The Setup name of every fixture: topics `upgrade-votes`,
/// `upgrade-scores`, `upgrade-flags`, `upgrade-dlq`, group `upgrade-group`,
/// changelog `upgrade-group-changelog.upgrade-votes`.
const NAME: &str = "upgrade";
const PARTITIONS: i32 = 4;
/// Votes generated (`generate_votes`, [`SEED`]); the first [`PART1_LINES`]
/// lines are part 1, the rest part 2.
const VOTES: usize = 900;
const SEED: u64 = 6;
const PART1_LINES: usize = 600;
/// Short event-time windows (the generated votes span about 19 s): many
/// batches close within part 1, and some are open at the cut.
const BATCHING: &str = "window_seconds = 4\ngrace_seconds = 1";
/// The old instance's idle flush: never (a hundred years), so that the
/// batches open at the cut stay open and no flush to the wall clock makes
/// part 2 late.
const NEVER: &str = "3155760000";
/// The reputation epoch (one 4 s window) of a fixture in contract §14's `learned` mode (format
/// 8 on): many epochs seal within part 1, some batches wait at the barrier
/// at the cut.
const EPOCH_SECONDS: u32 = 4;
/// What a `learned` fixture holds besides [`FILES`]: the reputation topic.
const REPUTATION_FILE: &str = "service-reputation.jsonl";
/// Files a fixture directory holds besides the state directories.
const FILES: [&str; 8] = [
    "config.toml",
    "votes-1.jsonl",
    "votes-2.jsonl",
    "replay-events-1.jsonl",
    "service-input.jsonl",
    "service-changelog.jsonl",
    "service-events-1.jsonl",
    "service-topics.json",
];

/// The fixture directory of one state format.
struct Fixture {
    format: u32,
    dir: PathBuf,
}

impl Fixture {
    fn of_format(format: u32) -> Fixture {
        Fixture {
            format,
            dir: Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("tests/fixtures/state-format-{format}")),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        let p = self.dir.join(name);
        assert!(
            p.exists(),
            "{} is missing: the state-format-{} fixture is incomplete \
             (see its README.md to write it again)",
            p.display(),
            self.format
        );
        p
    }

    /// The configuration this build runs the fixture with: the old one,
    /// and for a `confusion` fixture of a format before 13 (its sealed
    /// deltas have no pair counts, which no build can recover)
    /// `confusion_pair_fit = false`, so that tables do not depend on which
    /// build sealed an epoch and the continuation equals the whole replay.
    fn config(&self) -> String {
        let config = std::fs::read_to_string(self.path("config.toml")).unwrap();
        if confusion_format(self.format) && self.format < 13 {
            let model = "model = \"confusion\"\n";
            assert!(config.contains(model), "{config}");
            config.replacen(model, &format!("{model}confusion_pair_fit = false\n"), 1)
        } else {
            config
        }
    }

    /// [`Fixture::config`] written into `dir`.
    fn config_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("config.toml");
        std::fs::write(&path, self.config()).unwrap();
        path
    }

    fn changelog_topic(&self) -> String {
        changelog_topic()
    }

    /// Whether the old build ran in contract §14's `learned` mode (the
    /// fixtures of format 8 on): it then left a reputation topic too, and
    /// the oracle of a run is `replay --partition-files`.
    fn learned(&self) -> bool {
        self.dir.join(REPUTATION_FILE).exists()
    }
}

/// Whether the fixture of `format` is written in `learned` mode: format 8
/// added contract §14's state (open values, sealed sums, waiting batches).
fn learned_format(format: u32) -> bool {
    format >= 8
}

/// Whether the fixture of `format` is written with contract §15's model
/// `confusion`: format 12 added its sums to the sealed deltas.
fn confusion_format(format: u32) -> bool {
    format >= 12
}

/// The reputation topic of a `learned` fixture.
fn reputation_topic() -> String {
    format!("{NAME}-reputation")
}

/// The changelog topic of the fixture's input topic (`Names::changelog`:
/// `<group_id>-changelog.<input topic>`).
fn changelog_topic() -> String {
    format!("{NAME}-group-changelog.{NAME}-votes")
}

// ---------------------------------------------------------------- base64

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
fn b64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unb64(s: &str) -> Vec<u8> {
    let digit = |c: u8| {
        B64.iter()
            .position(|&d| d == c)
            .unwrap_or_else(|| panic!("not base64: {s:?}")) as u32
    };
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for c in s.chunks(4) {
        let mut n = 0;
        for (i, &d) in c.iter().enumerate() {
            n |= digit(d) << (18 - 6 * i);
        }
        for i in 0..c.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[test]
fn base64_round_trips() {
    assert_eq!(b64(b""), "");
    assert_eq!(b64(b"f"), "Zg==");
    assert_eq!(b64(b"fo"), "Zm8=");
    assert_eq!(b64(b"foo"), "Zm9v");
    assert_eq!(b64(b"foob"), "Zm9vYg==");
    for n in 0..300usize {
        let bytes: Vec<u8> = (0..n).map(|i| (i * 151 + n) as u8).collect();
        assert_eq!(unb64(&b64(&bytes)), bytes);
    }
}

// ------------------------------------------------------------ raw records

/// A topic record byte for byte, as the fixture's JSONL holds it (bytes in
/// base64).
#[derive(Debug, Clone, PartialEq)]
struct Raw {
    partition: i32,
    offset: i64,
    /// CreateTime in ms, when the record has one.
    timestamp: Option<i64>,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Raw {
    fn of(m: &impl Message) -> Raw {
        Raw {
            partition: m.partition(),
            offset: m.offset(),
            timestamp: match m.timestamp() {
                rdkafka::Timestamp::CreateTime(t) => Some(t),
                _ => None,
            },
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|x| (x.key.to_owned(), x.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": self.key.as_deref().map(b64),
            "value": self.value.as_deref().map(b64),
            "headers": self.headers.iter()
                .map(|(k, v)| json!({"key": k, "value": v.as_deref().map(b64)}))
                .collect::<Vec<_>>(),
        })
    }

    fn from_json(v: &Value) -> Raw {
        let bytes = |v: &Value| v.as_str().map(unb64);
        Raw {
            partition: v["partition"].as_i64().unwrap() as i32,
            offset: v["offset"].as_i64().unwrap(),
            timestamp: v["timestamp"].as_i64(),
            key: bytes(&v["key"]),
            value: bytes(&v["value"]),
            headers: v["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| (h["key"].as_str().unwrap().to_owned(), bytes(&h["value"])))
                .collect(),
        }
    }
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn write_jsonl<'a>(path: &Path, values: impl IntoIterator<Item = &'a Value>) {
    let mut text = String::new();
    for v in values {
        text.push_str(&serde_json::to_string(v).unwrap());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// Every record of `topic` a read_committed reader sees (`committed`; else
/// read_uncommitted), in (partition, offset) order, read to the end of
/// every partition.
fn read_raw(bootstrap: &str, topic: &str, committed: bool) -> Vec<Raw> {
    let parts = metadata_partitions(bootstrap, topic);
    assert!(!parts.is_empty(), "{topic} has no partitions");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "upgrade-raw-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set(
            "isolation.level",
            if committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut at_end = BTreeSet::new();
    let end = Instant::now() + Duration::from_secs(60);
    while at_end.len() < parts.len() {
        assert!(
            Instant::now() < end,
            "the end of {topic} not reached within 60 s: {} records, partitions at the end {at_end:?}",
            out.len()
        );
        match c.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            Some(Ok(m)) => out.push(Raw::of(&m)),
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    out
}

/// The delivery report of every record sent: (partition, offset) by index.
type Ack = Result<(i32, i64), String>;
struct Acks(Mutex<HashMap<usize, Ack>>);

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = usize;
    fn delivery(&self, r: &DeliveryResult<'_>, idx: usize) {
        let v = match r {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        self.0.lock().unwrap().insert(idx, v);
    }
}

/// Writes `records` to `topic` (existing, empty) at their partitions and
/// offsets: keys, values, headers and timestamps as they are, and the
/// partitions' high watermarks `high`. An offset without a record after a
/// run of records (a transaction marker of the broker that wrote them) is
/// made again by writing that run in a transaction of its own; fails
/// unless each record lands at its own offset.
fn produce_exact(bootstrap: &str, topic: &str, records: &[Raw], high: &BTreeMap<i32, i64>) {
    let mut by_part: BTreeMap<i32, Vec<&Raw>> = BTreeMap::new();
    for r in records {
        by_part.entry(r.partition).or_default().push(r);
    }
    // Runs of consecutive offsets, and the offsets without a record after
    // each (up to the next run or the high watermark).
    let mut runs: Vec<(i32, Vec<&Raw>, i64)> = Vec::new();
    for (p, rs) in &by_part {
        let first = runs.len();
        let mut expect = 0i64;
        for r in rs {
            if runs.len() == first || r.offset != expect {
                if runs.len() > first {
                    runs.last_mut().unwrap().2 = r.offset - expect;
                } else {
                    assert_eq!(r.offset, 0, "{topic} [{p}] starts without a record");
                }
                runs.push((*p, Vec::new(), 0));
            }
            runs.last_mut().unwrap().1.push(r);
            expect = r.offset + 1;
        }
        let end = *high
            .get(p)
            .unwrap_or_else(|| panic!("no high watermark for {topic} [{p}]"));
        runs.last_mut().unwrap().2 = end - expect;
    }
    let gaps: BTreeSet<i64> = runs.iter().map(|r| r.2).collect();
    let gaps = match gaps.into_iter().collect::<Vec<_>>()[..] {
        [] | [0] => false,
        [1] => true,
        ref other => panic!(
            "{topic}: runs of records followed by {other:?} offsets without a record; \
             written back are none after every run, or one (a transaction's marker)"
        ),
    };
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("batch.num.messages", "1")
        .set("linger.ms", "0");
    if gaps {
        cfg.set("transactional.id", format!("{topic}-fixture-loader"));
    }
    let producer: BaseProducer<Acks> = cfg
        .create_with_context(Acks(Mutex::new(HashMap::new())))
        .unwrap();
    let timeout = Duration::from_secs(30);
    if gaps {
        producer.init_transactions(timeout).unwrap();
    }
    let mut sent: Vec<&Raw> = Vec::new();
    for (_, run, _) in &runs {
        if gaps {
            producer.begin_transaction().unwrap();
        }
        for r in run {
            let mut headers = OwnedHeaders::new();
            for (k, v) in &r.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: v.as_deref(),
                });
            }
            let mut rec: BaseRecord<'_, [u8], [u8], usize> =
                BaseRecord::with_opaque_to(topic, sent.len())
                    .partition(r.partition)
                    .headers(headers);
            if let Some(k) = &r.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                rec = rec.payload(v.as_slice());
            }
            if let Some(t) = r.timestamp {
                rec = rec.timestamp(t);
            }
            let mut rec = rec;
            loop {
                match producer.send(rec) {
                    Ok(()) => break,
                    Err((
                        KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        back,
                    )) => {
                        producer.poll(Duration::from_millis(100));
                        rec = back;
                    }
                    Err((e, _)) => panic!("send to {topic}: {e}"),
                }
            }
            sent.push(r);
        }
        if gaps {
            producer.commit_transaction(timeout).unwrap();
        } else {
            producer.flush(timeout).unwrap();
        }
    }
    producer.flush(timeout).unwrap();
    let acks = producer.context().0.lock().unwrap();
    for (i, r) in sent.iter().enumerate() {
        let got = acks.get(&i).cloned();
        assert_eq!(
            got,
            Some(Ok((r.partition, r.offset))),
            "{topic}: record {i} was meant for partition {} offset {}",
            r.partition,
            r.offset
        );
    }
}

// ------------------------------------------------------------ directories

/// Whether `name` is one of RocksDB's text logs (LOG, LOG.old.*), which a
/// fixture leaves out (the write-ahead logs, `NNNNNN.log`, stay).
fn is_rocksdb_text_log(name: &str) -> bool {
    name == "LOG" || name.starts_with("LOG.old")
}

/// Copies the directory tree `from` to `to`, without RocksDB's text logs.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            copy_tree(&e.path(), &to.join(&name));
        } else if ty.is_file() && !is_rocksdb_text_log(&name) {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// Removes RocksDB's text logs under `dir`.
fn remove_rocksdb_text_logs(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            remove_rocksdb_text_logs(&e.path());
        } else if is_rocksdb_text_log(&e.file_name().to_string_lossy()) {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
}

/// Files under `dir`, as paths relative to it (to tell what a fixture
/// holds).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk(root, &e.path(), out);
            } else {
                out.push(e.path().strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

// ---------------------------------------------------------- configuration

/// The configuration a service of the fixture runs with: the fixture's
/// `config.toml` (which has no broker address or state directory, and
/// never flushes idle partitions) with `brokers`, `state.dir` and
/// `batching.idle_flush_seconds` set.
fn service_config(fixture: &str, bootstrap: &str, state: &Path, idle_flush: &str) -> String {
    let mut out = String::new();
    let mut set = 0;
    for line in fixture.lines() {
        if line.starts_with("idle_flush_seconds") {
            writeln!(out, "idle_flush_seconds = {idle_flush}").unwrap();
            set += 1;
            continue;
        }
        out.push_str(line);
        out.push('\n');
        match line.trim() {
            "[kafka]" => writeln!(out, "brokers = \"{bootstrap}\"").unwrap(),
            "[state]" => writeln!(out, "dir = \"{}\"", state.display()).unwrap(),
            _ => continue,
        }
        set += 1;
    }
    assert_eq!(
        set, 3,
        "config.toml lacks [kafka], [state] or idle_flush_seconds:\n{fixture}"
    );
    out
}

/// `jurystream run` of `bin` with `config` (log `service-TAG.log` in `dir`,
/// metrics on a free port).
fn start_run(bin: &Path, config: &Path, dir: &Path, tag: &str) -> Service {
    let log = dir.join(format!("service-{tag}.log"));
    let port = free_port();
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(config)
        .env(
            "JURYSTREAM_LOG",
            std::env::var("JURYSTREAM_TEST_LOG").unwrap_or_else(|_| "info,rdkafka=warn".into()),
        )
        .env("JURYSTREAM_METRICS__LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("start {} run: {e}", bin.display()));
    Service {
        child,
        log,
        port: Some(port),
    }
}

/// The lines of `file`, split after the first `n`.
fn split_lines(file: &Path, n: usize) -> (String, String) {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() > n,
        "{} has {} lines",
        file.display(),
        lines.len()
    );
    (lines[..n].join("\n") + "\n", lines[n..].join("\n") + "\n")
}

/// `votes-1.jsonl` then `votes-2.jsonl` of the fixture, in `dir`.
fn whole_stream(fx: &Fixture, dir: &Path) -> PathBuf {
    let all = dir.join("votes-all.jsonl");
    let mut text = std::fs::read_to_string(fx.path("votes-1.jsonl")).unwrap();
    text.push_str(&std::fs::read_to_string(fx.path("votes-2.jsonl")).unwrap());
    std::fs::write(&all, text).unwrap();
    all
}

// -------------------------------------------------------------- generator

/// Writes `tests/fixtures/state-format-6/` (or `$JURYSTREAM_FIXTURE_OUT`,
/// which must not exist or be empty) with the binary
/// `$JURYSTREAM_FIXTURE_BIN`, the build of state format 6 (commit ed1e475);
/// needs the test broker. See the fixture's README.md.
#[test]
#[ignore = "writes the fixture with an old binary: JURYSTREAM_FIXTURE_BIN=… cargo test --test upgrade write_format_6_fixtures -- --ignored"]
fn write_format_6_fixtures() {
    write_fixtures(6, "ed1e475");
}

/// Writes `tests/fixtures/state-format-7/` (or `$JURYSTREAM_FIXTURE_OUT`)
/// with the binary `$JURYSTREAM_FIXTURE_BIN`, the build of state format 7
/// (commit d6bf4e9, the last before format 8); needs the test broker. See
/// the fixture's README.md.
#[test]
#[ignore = "writes the fixture with an old binary: JURYSTREAM_FIXTURE_BIN=… cargo test --test upgrade write_format_7_fixtures -- --ignored"]
fn write_format_7_fixtures() {
    write_fixtures(7, "d6bf4e9");
}

/// Writes `tests/fixtures/state-format-8/` (or `$JURYSTREAM_FIXTURE_OUT`)
/// with the binary `$JURYSTREAM_FIXTURE_BIN`, the build of state format 8
/// (commit 783ceac), in contract §14's `learned` mode; needs the test broker.
/// See the fixture's README.md.
#[test]
#[ignore = "writes the fixture with an old binary: JURYSTREAM_FIXTURE_BIN=… cargo test --test upgrade write_format_8_fixtures -- --ignored"]
fn write_format_8_fixtures() {
    write_fixtures(8, "783ceac");
}

/// Writes `tests/fixtures/state-format-9/` (or `$JURYSTREAM_FIXTURE_OUT`)
/// with the binary `$JURYSTREAM_FIXTURE_BIN`, the build of state format 9
/// (commit 55b69dd), in contract §14's `learned` mode; needs the test broker.
/// See the fixture's README.md.
#[test]
#[ignore = "writes the fixture with an old binary: JURYSTREAM_FIXTURE_BIN=… cargo test --test upgrade write_format_9_fixtures -- --ignored"]
fn write_format_9_fixtures() {
    write_fixtures(9, "55b69dd");
}

/// Writes `tests/fixtures/state-format-10/` (or `$JURYSTREAM_FIXTURE_OUT`)
/// with the binary `$JURYSTREAM_FIXTURE_BIN`, the build of state format 10
/// (commit 0de2b72), in contract §14's `learned` mode; needs the test broker.
/// See the fixture's README.md.
#[test]
#[ignore = "writes the fixture with an old binary: JURYSTREAM_FIXTURE_BIN=… cargo test --test upgrade write_format_10_fixtures -- --ignored"]
fn write_format_10_fixtures() {
    write_fixtures(10, "0de2b72");
}

/// Writes `tests/fixtures/state-format-12/` (or `$JURYSTREAM_FIXTURE_OUT`)
/// with the binary `$JURYSTREAM_FIXTURE_BIN`, a build of state format 12
/// (commit dc2a84e), in contract §14's `learned` mode with contract §15's
/// model `confusion`; needs the test broker. See the fixture's README.md.
#[test]
#[ignore = "writes the fixture with an old binary: JURYSTREAM_FIXTURE_BIN=… cargo test --test upgrade write_format_12_fixtures -- --ignored"]
fn write_format_12_fixtures() {
    write_fixtures(12, "dc2a84e");
}

/// Writes `tests/fixtures/state-format-11/` (or `$JURYSTREAM_FIXTURE_OUT`)
/// with the binary `$JURYSTREAM_FIXTURE_BIN`, the build of state format 11
/// (commit e748c18), in contract §14's `learned` mode; needs the test broker.
/// See the fixture's README.md.
#[test]
#[ignore = "writes the fixture with an old binary: JURYSTREAM_FIXTURE_BIN=… cargo test --test upgrade write_format_11_fixtures -- --ignored"]
fn write_format_11_fixtures() {
    write_fixtures(11, "e748c18");
}

fn write_fixtures(format: u32, commit: &str) {
    let _g = serial();
    let bin = PathBuf::from(std::env::var("JURYSTREAM_FIXTURE_BIN").expect(
        "JURYSTREAM_FIXTURE_BIN: the jurystream binary of the state format to write fixtures for",
    ));
    assert!(bin.is_file(), "{} is not a file", bin.display());
    let out = std::env::var_os("JURYSTREAM_FIXTURE_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Fixture::of_format(format).dir);
    if out.exists() {
        assert!(
            std::fs::read_dir(&out).unwrap().next().is_none(),
            "{} is not empty: remove it to write the fixture again",
            out.display()
        );
    }
    std::fs::create_dir_all(&out).unwrap();
    let version = Command::new(&bin).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let sha256 = Command::new("sha256sum")
        .arg(&bin)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());

    let Some(broker) = broker_or_skip(None) else {
        panic!("the generator needs the test broker (scripts/broker.sh install)");
    };
    let learned_mode = learned_format(format);
    let extra = if learned_mode {
        let mut extra = learned(NAME).replace(
            "epoch_seconds = 60",
            &format!("epoch_seconds = {EPOCH_SECONDS}"),
        );
        if confusion_format(format) {
            extra.push_str("model = \"confusion\"\n");
        }
        extra
    } else {
        String::new()
    };
    let setup = Setup::new(&broker, NAME, PARTITIONS, "exactly_once", &extra);
    transactions_supported(&setup.bootstrap, "upgrade-txn-probe")
        .unwrap_or_else(|e| panic!("the test broker cannot commit transactions: {e}"));

    // The votes and the configuration (without broker and state directory).
    let votes = setup.dir.path().join("votes.jsonl");
    if learned_mode {
        // The votes then one per partition far after them (in part 2):
        // the live run's idle flush seals nothing a replay does not.
        votes_over_epochs(&votes, VOTES, PARTITIONS as u32);
    } else {
        generate_votes(&votes, VOTES, SEED);
    }
    let (part1, part2) = split_lines(&votes, PART1_LINES);
    std::fs::write(out.join("votes-1.jsonl"), &part1).unwrap();
    std::fs::write(out.join("votes-2.jsonl"), &part2).unwrap();
    let mut config = format!(
        "# The configuration the state-format-{format} fixture was written with \
         (tests/upgrade.rs).\n# The service tests add kafka.brokers and state.dir, \
         and set batching.idle_flush_seconds.\n"
    );
    for line in std::fs::read_to_string(&setup.config).unwrap().lines() {
        if line.starts_with("brokers = ") || line.starts_with("dir = ") {
            continue;
        }
        if line.starts_with("idle_flush_seconds") {
            writeln!(config, "{BATCHING}\nidle_flush_seconds = {NEVER}").unwrap();
            continue;
        }
        config.push_str(line);
        config.push('\n');
    }
    std::fs::write(out.join("config.toml"), &config).unwrap();
    let config_path = out.join("config.toml");

    // The replay fixture: part 1 into a state directory, batches kept open.
    let replay_state = out.join("replay-state");
    let replayed = Command::new(&bin)
        .args(["replay", "--config"])
        .arg(&config_path)
        .arg("--input")
        .arg(out.join("votes-1.jsonl"))
        .arg("--state-dir")
        .arg(&replay_state)
        .arg("--keep-open")
        .output()
        .unwrap();
    assert!(
        replayed.status.success(),
        "old replay: {}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    std::fs::write(out.join("replay-events-1.jsonl"), &replayed.stdout).unwrap();
    remove_rocksdb_text_logs(&replay_state);

    // The service fixture: part 1 through the old `run`, committed, then
    // kill -9.
    let state = setup.dir.path().join("state-old");
    std::fs::write(
        &setup.config,
        service_config(&config, &setup.bootstrap, &state, NEVER),
    )
    .unwrap();
    setup.produce(&out.join("votes-1.jsonl"));
    let ends = high_watermarks_of(&setup.bootstrap, &setup.input_topic);
    assert_eq!(ends.len(), PARTITIONS as usize);
    assert!(
        ends.values().all(|e| *e > 0),
        "every partition gets votes: {ends:?}"
    );
    let mut old = start_run(&bin, &setup.config, setup.dir.path(), "old");
    let group = format!("{NAME}-group");
    let started = Instant::now();
    wait_for(
        "the old instance to commit every input record of part 1",
        Duration::from_secs(300),
        || {
            if let Some(status) = old.child.try_wait().unwrap() {
                panic!("the old instance exited ({status}):\n{}", log_tail(&old));
            }
            (group_offsets(&setup.bootstrap, &group, &setup.input_topic) == ends).then_some(())
        },
    );
    eprintln!("old instance committed part 1 in {:?}", started.elapsed());
    old.kill9();

    let input = read_raw(&setup.bootstrap, &setup.input_topic, true);
    let changelog = read_raw(&setup.bootstrap, &changelog_topic(), true);
    let mut state_topics = vec![changelog_topic()];
    if learned_mode {
        state_topics.push(reputation_topic());
    }
    // No transaction was left open (nor aborted): read_uncommitted sees
    // no more than read_committed, once the broker has written the last
    // commit's markers (the group's offsets can be visible a moment
    // before a loaded broker has; a transaction left open never gets
    // them, and the wait then fails).
    for t in state_topics.iter().cloned().chain(setup.output_topics()) {
        let uncommitted = read_raw(&setup.bootstrap, &t, false);
        wait_for(
            &format!("{t}: every record in a committed transaction after the kill"),
            Duration::from_secs(60),
            || (read_raw(&setup.bootstrap, &t, true) == uncommitted).then_some(()),
        );
    }
    let events = read_committed(&setup.bootstrap, &setup.output_topics());
    assert_eq!(input.len(), part1.lines().count());
    assert!(!changelog.is_empty() && !events.is_empty());
    write_jsonl(
        &out.join("service-input.jsonl"),
        &input.iter().map(Raw::to_json).collect::<Vec<_>>(),
    );
    write_jsonl(
        &out.join("service-changelog.jsonl"),
        &changelog.iter().map(Raw::to_json).collect::<Vec<_>>(),
    );
    write_jsonl(
        &out.join("service-events-1.jsonl"),
        &events
            .iter()
            .map(|(t, p, o, k, v)| json!({"topic": t, "partition": p, "offset": o, "key": k, "value": v}))
            .collect::<Vec<_>>(),
    );
    if learned_mode {
        let reputation = read_raw(&setup.bootstrap, &reputation_topic(), true);
        assert!(!reputation.is_empty(), "part 1 sealed epochs");
        write_jsonl(
            &out.join(REPUTATION_FILE),
            &reputation.iter().map(Raw::to_json).collect::<Vec<_>>(),
        );
    }
    let mut topics = serde_json::Map::new();
    let mut names = vec![setup.input_topic.clone()];
    names.extend(state_topics);
    names.extend(setup.output_topics());
    for t in &names {
        let hw: serde_json::Map<String, Value> = high_watermarks_of(&setup.bootstrap, t)
            .into_iter()
            .map(|(p, h)| (p.to_string(), json!(h)))
            .collect();
        topics.insert(t.clone(), json!({ "high_watermarks": hw }));
    }
    std::fs::write(
        out.join("service-topics.json"),
        serde_json::to_string_pretty(&Value::Object(topics)).unwrap() + "\n",
    )
    .unwrap();
    copy_tree(&state, &out.join("service-state"));

    let readme = format!(
        r#"# State format {format}: what the old build leaves behind

Written by `write_format_{format}_fixtures` in `tests/upgrade.rs` with the
jurystream binary built from commit {commit} ({version}, sha256
`{sha256}`), the last build of state format {format}. The tests of
`tests/upgrade.rs` run the current build on these files and require it to
continue exactly where this one stopped.

| file | what |
|---|---|
| `votes-1.jsonl`, `votes-2.jsonl` | `generate_votes(_, {VOTES}, {SEED})` split after line {PART1_LINES}: part 1 (what the old build processed) and part 2 |
| `config.toml` | the configuration both parts run with: 4 s windows, 1 s grace (so that batches close within part 1 and some are open at the cut); `[kafka]` without `brokers` and `[state]` without `dir` (the service tests add them); `batching.idle_flush_seconds` = 100 years, so the old instance never flushed (the service tests run part 2 with 2 s) |
| `replay-state/` | `replay --config config.toml --input votes-1.jsonl --state-dir replay-state --keep-open` of the old binary: its RocksDB directory (RocksDB's text logs LOG, LOG.old.* left out) |
| `replay-events-1.jsonl` | that replay's stdout |
| `service-input.jsonl` | topic `{NAME}-votes` ({PARTITIONS} partitions) holding part 1 as `Setup::produce` publishes it (keyed by inference id, one record per batch): every record with partition, offset, CreateTime, key, value and headers (bytes in base64) |
| `service-changelog.jsonl` | the changelog `{changelog}` after the old `run` (`delivery = "exactly_once"`) committed every record of part 1 and was killed with SIGKILL, read_committed, every record as above (`value` null for a tombstone) |
| `service-events-1.jsonl` | the committed events of that run on the output topics (topic, partition, offset, key, JSON value) |
| `service-topics.json` | the high watermark of every partition of those topics at the kill (on the test broker the offset after a partition's last transactional record holds no record: a transaction marker; the service tests write each partition's records back in one transaction, which puts it there again) |
| `service-state/` | the old instance's `state.dir` at the kill (without RocksDB's text logs) |

Write it again (it must not exist; needs the test broker, `scripts/broker.sh install`):

    rm -rf tests/fixtures/state-format-{format}
    JURYSTREAM_FIXTURE_BIN=/path/to/jurystream-{commit} \
      cargo test --locked --test upgrade write_format_{format}_fixtures -- --ignored --nocapture

Each later change of the state format adds a fixture directory of its own
the same way, written by the last build of the format it replaces:
`write_format_N_fixtures` calling `write_fixtures(N, "<commit>")`, and
three tests calling `replay_continues` and `run_continues` (with and
without the old state.dir) on `Fixture::of_format(N)`; docs/testing.md
(`tests/upgrade.rs`, upgrade fixtures) has the steps. The fixtures of
older formats stay: every build must continue from each of them.

What it holds: {n_input} input records, {n_changelog} changelog records and
{n_events} committed events ({n_scores} score updates) from part 1; the
replay printed {n_replay} events.
{learned_note}"#,
        learned_note = if learned_mode {
            format!(
                "\ncontract §14's `learned` mode: `config.toml` has a `[reputation]` section \
                 (epoch {EPOCH_SECONDS} s, topic `{rep}`), the votes are \
                 `votes_over_epochs(_, {VOTES}, {PARTITIONS})` (seed 11, then one vote per \
                 partition far after the last, in part 2), and `{REPUTATION_FILE}` holds the \
                 reputation topic at the kill as the changelog file does. The oracle of the \
                 service tests is `replay --partition-files` of the input topic's partitions.{}\n",
                if confusion_format(format) {
                    " The `[reputation]` section sets `model = \"confusion\"` (contract §15): \
                     units of 0/1 values add its sums to the sealed deltas."
                } else {
                    ""
                },
                rep = reputation_topic()
            )
        } else {
            String::new()
        },
        changelog = changelog_topic(),
        n_input = input.len(),
        n_changelog = changelog.len(),
        n_events = events.len(),
        n_scores = events.iter().filter(|e| e.0 == setup.scores).count(),
        n_replay = String::from_utf8_lossy(&replayed.stdout).lines().count(),
    );
    std::fs::write(out.join("README.md"), readme).unwrap();
    for f in FILES
        .into_iter()
        .chain(learned_mode.then_some(REPUTATION_FILE))
    {
        assert!(out.join(f).is_file(), "{f} was not written");
    }
    eprintln!(
        "wrote {}: {} input records, {} changelog records, {} events; files: {:?}",
        out.display(),
        input.len(),
        changelog.len(),
        events.len(),
        tree(&out)
    );
}

// ------------------------------------------------------------------ replay

#[test]
fn replay_continues_from_a_format_6_state_directory() {
    replay_continues(&Fixture::of_format(6));
}

#[test]
fn replay_continues_from_a_format_7_state_directory() {
    replay_continues(&Fixture::of_format(7));
}

#[test]
fn replay_continues_from_a_format_8_learned_state_directory() {
    replay_continues(&Fixture::of_format(8));
}

#[test]
fn replay_continues_from_a_format_9_learned_state_directory() {
    replay_continues(&Fixture::of_format(9));
}

#[test]
fn replay_continues_from_a_format_10_learned_state_directory() {
    replay_continues(&Fixture::of_format(10));
}

#[test]
fn replay_continues_from_a_format_11_learned_state_directory() {
    replay_continues(&Fixture::of_format(11));
}

#[test]
fn replay_continues_from_a_format_12_confusion_state_directory() {
    replay_continues(&Fixture::of_format(12));
}

/// This build's `replay` of part 2 into a copy of the old replay's state
/// directory prints what this build's replay of the whole stream prints
/// after the old replay's events of part 1.
fn replay_continues(fx: &Fixture) {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    copy_tree(&fx.path("replay-state"), &state);
    let config = fx.config_file(tmp.path());
    let old = read_jsonl(&fx.path("replay-events-1.jsonl"));
    let new: Vec<Value> = String::from_utf8(run_ok(
        "replay",
        &config,
        &fx.path("votes-2.jsonl"),
        &["--state-dir".as_ref(), state.as_os_str()],
    ))
    .unwrap()
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    let whole = replay(&config, &whole_stream(fx, tmp.path()));
    assert!(!old.is_empty() && !new.is_empty());
    // Emission order is deterministic (one partition, one engine).
    let joined: Vec<String> = old.iter().chain(&new).map(normalize).collect();
    let want: Vec<String> = whole.iter().map(normalize).collect();
    if joined != want {
        let i = joined
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(joined.len().min(want.len()));
        panic!(
            "old events of part 1 ({}) + this build's of part 2 ({}) = {} events, the whole \
             replay {}; first difference at event {i} (part {}):\n  continued: {}\n  whole:     {}",
            old.len(),
            new.len(),
            joined.len(),
            want.len(),
            if i < old.len() { 1 } else { 2 },
            joined.get(i).map_or("(none)", String::as_str),
            want.get(i).map_or("(none)", String::as_str),
        );
    }
    // The copy was read: series of part 1 continue their update_seq (a
    // fresh directory would start each at 1), and part 2 alone differs.
    let continued = assert_update_seq_continues(
        old.iter().filter(|e| e["type"] == "score_updated"),
        new.iter().filter(|e| e["type"] == "score_updated"),
    );
    assert!(continued > 0, "no series of part 1 continued in part 2");
    let fresh = replay(&config, &fx.path("votes-2.jsonl"));
    assert_ne!(
        fresh.iter().map(normalize).collect::<Vec<_>>(),
        new.iter().map(normalize).collect::<Vec<_>>(),
        "part 2 on the old state directory gives what it gives on an empty one"
    );
    eprintln!(
        "replay: {} old events + {} new = the whole replay; {continued} series continued",
        old.len(),
        new.len()
    );
}

/// Each series (inference, rubric) of `new` starts at its last update_seq
/// in `old` + 1 (1 when `old` has none) and goes up by one. Returns how
/// many series of `old` continued.
fn assert_update_seq_continues<'a>(
    old: impl IntoIterator<Item = &'a Value>,
    new: impl IntoIterator<Item = &'a Value>,
) -> usize {
    let series = |v: &Value| {
        (
            v["inference_id"].as_str().unwrap().to_owned(),
            v["voter_prompt_id"].as_str().unwrap().to_owned(),
        )
    };
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    for v in old {
        let seq = v["update_seq"].as_u64().unwrap();
        let prev = last.insert(series(v), seq).unwrap_or(0);
        assert_eq!(seq, prev + 1, "update_seq order of part 1: {v}");
    }
    let mut continued = BTreeSet::new();
    for v in new {
        let k = series(v);
        let seq = v["update_seq"].as_u64().unwrap();
        let prev = last.insert(k.clone(), seq).unwrap_or(0);
        assert_eq!(seq, prev + 1, "update_seq of {k:?} in part 2: {v}");
        if prev > 0 && seq == prev + 1 {
            continued.insert(k);
        }
    }
    continued.len()
}

// ----------------------------------------------------------------- service

#[test]
fn run_restores_a_format_6_changelog_and_continues_exactly() {
    run_continues(&Fixture::of_format(6), false);
}

#[test]
fn run_continues_on_a_format_6_state_directory_exactly() {
    run_continues(&Fixture::of_format(6), true);
}

#[test]
fn run_restores_a_format_7_changelog_and_continues_exactly() {
    run_continues(&Fixture::of_format(7), false);
}

#[test]
fn run_continues_on_a_format_7_state_directory_exactly() {
    run_continues(&Fixture::of_format(7), true);
}

#[test]
fn run_restores_a_format_8_learned_changelog_and_continues_exactly() {
    run_continues(&Fixture::of_format(8), false);
}

#[test]
fn run_continues_on_a_format_8_learned_state_directory_exactly() {
    run_continues(&Fixture::of_format(8), true);
}

#[test]
fn run_restores_a_format_9_learned_changelog_and_continues_exactly() {
    run_continues(&Fixture::of_format(9), false);
}

#[test]
fn run_continues_on_a_format_9_learned_state_directory_exactly() {
    run_continues(&Fixture::of_format(9), true);
}

#[test]
fn run_restores_a_format_10_learned_changelog_and_continues_exactly() {
    run_continues(&Fixture::of_format(10), false);
}

#[test]
fn run_continues_on_a_format_10_learned_state_directory_exactly() {
    run_continues(&Fixture::of_format(10), true);
}

#[test]
fn run_restores_a_format_11_learned_changelog_and_continues_exactly() {
    run_continues(&Fixture::of_format(11), false);
}

#[test]
fn run_continues_on_a_format_11_learned_state_directory_exactly() {
    run_continues(&Fixture::of_format(11), true);
}

#[test]
fn run_restores_a_format_12_confusion_changelog_and_continues_exactly() {
    run_continues(&Fixture::of_format(12), false);
}

#[test]
fn run_continues_on_a_format_12_confusion_state_directory_exactly() {
    run_continues(&Fixture::of_format(12), true);
}

/// A fresh broker holding the fixture's input and changelog records (at
/// their partitions and offsets) and part 2 published after them; this
/// build's `run` on an empty state.dir, or with `old_state` on a copy of the
/// old instance's, commits exactly what a replay of the whole stream has
/// beyond the old instance's committed events, each series continuing its
/// update_seq.
fn run_continues(fx: &Fixture, old_state: bool) {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, NAME, PARTITIONS, "exactly_once", "");
    let state = setup.dir.path().join("state-new");
    // (The reputation section, when there is one, comes with the fixture's
    // config.toml.)
    if old_state {
        copy_tree(&fx.path("service-state"), &state);
    }
    std::fs::write(
        &setup.config,
        service_config(&fx.config(), &setup.bootstrap, &state, "2"),
    )
    .unwrap();

    // The old broker's topics, record for record.
    let input: Vec<Raw> = read_jsonl(&fx.path("service-input.jsonl"))
        .iter()
        .map(Raw::from_json)
        .collect();
    let changelog: Vec<Raw> = read_jsonl(&fx.path("service-changelog.jsonl"))
        .iter()
        .map(Raw::from_json)
        .collect();
    let topics: Value =
        serde_json::from_str(&std::fs::read_to_string(fx.path("service-topics.json")).unwrap())
            .unwrap();
    let changelog_topic = fx.changelog_topic();
    create_topic(&setup.bootstrap, &setup.input_topic, PARTITIONS);
    create_topic(&setup.bootstrap, &changelog_topic, PARTITIONS);
    let high = |t: &str| -> BTreeMap<i32, i64> {
        topics[t]["high_watermarks"]
            .as_object()
            .unwrap_or_else(|| panic!("service-topics.json has no {t}"))
            .iter()
            .map(|(p, h)| (p.parse().unwrap(), h.as_i64().unwrap()))
            .collect()
    };
    produce_exact(
        &setup.bootstrap,
        &setup.input_topic,
        &input,
        &high(&setup.input_topic),
    );
    produce_exact(
        &setup.bootstrap,
        &changelog_topic,
        &changelog,
        &high(&changelog_topic),
    );
    if fx.learned() {
        let topic = reputation_topic();
        let records: Vec<Raw> = read_jsonl(&fx.path(REPUTATION_FILE))
            .iter()
            .map(Raw::from_json)
            .collect();
        let ends = high(&topic);
        create_topic(&setup.bootstrap, &topic, ends.len() as i32);
        produce_exact(&setup.bootstrap, &topic, &records, &ends);
        assert_eq!(high_watermarks_of(&setup.bootstrap, &topic), ends);
        assert_eq!(read_raw(&setup.bootstrap, &topic, true), records);
    }
    for t in [&setup.input_topic, &changelog_topic] {
        assert_eq!(
            high_watermarks_of(&setup.bootstrap, t),
            high(t),
            "{t} as the old broker had it"
        );
    }
    assert_eq!(read_raw(&setup.bootstrap, &setup.input_topic, true), input);
    assert_eq!(
        read_raw(&setup.bootstrap, &changelog_topic, true),
        changelog
    );

    // Part 2 keyed by inference id as part 1 was: every inference stays in
    // its partition. Part 1 published the same way lands where the
    // fixture has it.
    let probe = format!("{NAME}-partitioner-probe");
    create_topic(&setup.bootstrap, &probe, PARTITIONS);
    jurystream::produce::produce(
        &fx.path("votes-1.jsonl"),
        &probe,
        &setup.bootstrap,
        &[("batch.num.messages".to_owned(), "1".to_owned())],
    )
    .unwrap();
    // (Lines without a key, the generator's cut JSON, go to any partition.)
    let place = |rs: &[Raw]| -> Vec<(Vec<u8>, i32)> {
        let mut v: Vec<_> = rs
            .iter()
            .filter_map(|r| Some((r.key.clone()?, r.partition)))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        place(&read_raw(&setup.bootstrap, &probe, true)),
        place(&input),
        "part 1 published now lands in other partitions than in the fixture"
    );
    setup.publish(&fx.path("votes-2.jsonl"));
    let part1_at: HashMap<Vec<u8>, i32> = input
        .iter()
        .filter_map(|r| Some((r.key.clone()?, r.partition)))
        .collect();
    let ends: HashMap<i32, i64> =
        input
            .iter()
            .map(|r| (r.partition, r.offset + 1))
            .fold(HashMap::new(), |mut m, (p, o)| {
                let e = m.entry(p).or_insert(0);
                *e = (*e).max(o);
                m
            });
    let all_input = read_raw(&setup.bootstrap, &setup.input_topic, true);
    let part2: Vec<&Raw> = all_input
        .iter()
        .filter(|r| r.offset >= ends.get(&r.partition).copied().unwrap_or(0))
        .collect();
    assert_eq!(
        part2.len(),
        std::fs::read_to_string(fx.path("votes-2.jsonl"))
            .unwrap()
            .lines()
            .count()
    );
    let mut shared = 0;
    for r in &part2 {
        if let Some(p) = r.key.as_ref().and_then(|k| part1_at.get(k)) {
            shared += 1;
            assert_eq!(
                r.partition,
                *p,
                "inference {} is in partition {p} in part 1 and {} in part 2",
                String::from_utf8_lossy(r.key.as_deref().unwrap()),
                r.partition
            );
        }
    }
    assert!(shared > 0, "no inference of part 2 was in part 1");

    // What this build must add: the whole replay less the old events (in
    // `learned` mode the replay of the input topic's partitions, with the
    // tables they share).
    let tmp = tempfile::tempdir().unwrap();
    let whole = if fx.learned() {
        partition_oracle(&fx.config_file(tmp.path()), &partition_files(&setup))
    } else {
        replay(&fx.config_file(tmp.path()), &whole_stream(fx, tmp.path()))
    };
    let old: Vec<(String, i32, i64, Option<String>, Value)> =
        read_jsonl(&fx.path("service-events-1.jsonl"))
            .into_iter()
            .map(|e| {
                (
                    e["topic"].as_str().unwrap().to_owned(),
                    e["partition"].as_i64().unwrap() as i32,
                    e["offset"].as_i64().unwrap(),
                    e["key"].as_str().map(str::to_owned),
                    e["value"].clone(),
                )
            })
            .collect();
    let mut left: HashMap<String, Vec<Value>> = HashMap::new();
    for e in &whole {
        left.entry(normalize(e)).or_default().push(e.clone());
    }
    for (t, p, o, _, v) in &old {
        let n = normalize(v);
        let found = left.get_mut(&n).and_then(Vec::pop);
        assert!(
            found.is_some(),
            "an event the old instance committed ({t} [{p}] offset {o}) is not in this build's \
             replay of the whole stream: {n}"
        );
    }
    let expected: Vec<Value> = left.into_values().flatten().collect();
    assert!(!expected.is_empty());

    let started = Instant::now();
    let mut svc = start_run(
        Path::new(BIN),
        &setup.config,
        setup.dir.path(),
        if old_state {
            "on-old-state"
        } else {
            "from-changelog"
        },
    );
    wait_for_events(&setup, &expected, Duration::from_secs(300), &svc);
    let took = started.elapsed();
    let got = read_committed(&setup.bootstrap, &setup.output_topics());
    let values: Vec<Value> = got.iter().map(|e| e.4.clone()).collect();
    let diff = differences(&expected, &values);
    assert!(
        diff.is_empty(),
        "this build's events of part 2 differ from the replay's: {diff}\n{}",
        log_tail(&svc)
    );
    let score = |evs: &[(String, i32, i64, Option<String>, Value)]| -> Vec<Value> {
        let mut s: Vec<_> = evs.iter().filter(|e| e.0 == setup.scores).collect();
        s.sort_by_key(|e| (e.1, e.2));
        for e in &s {
            assert_eq!(
                e.3.as_deref(),
                e.4["inference_id"].as_str(),
                "score key is the inference id"
            );
        }
        s.into_iter().map(|e| e.4.clone()).collect()
    };
    let continued = assert_update_seq_continues(&score(&old), &score(&got));
    assert!(continued > 0, "no series of part 1 continued in part 2");
    let status = svc.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        log_tail(&svc)
    );
    eprintln!(
        "run ({}): {} events of part 2 in {took:?}, {continued} series continued",
        if old_state {
            "old state.dir"
        } else {
            "empty state.dir"
        },
        got.len()
    );
}
