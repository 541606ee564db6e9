//! Seeds a partition's changelog from a state directory, for the
//! changelog-only restore benchmark (scripts/bench-state.sh, CHANGELOG=1):
//!
//!   changelog_seed --config FILE --state-dir DIR [--partition P]
//!                  [--cycle-records N] [--next-offset O] [--create-topics]
//!
//! Reads the RocksDB of DIR (a `replay --state-dir` state, opened read-only)
//! in key order and produces every record a restore needs to partition P
//! (default 0) of the changelog of the configuration's first input topic
//! (`Names::changelog`: `<group_id>-changelog.<topic>` unless
//! `kafka.changelog_topic` is set), with the brokers and
//! `kafka.properties` of FILE. The records are the state keys of
//! `jurystream::state` as the service sends them (key, value, or no value
//! for a delete; the state format header): everything but the local `t` index (`Store::apply`
//! rebuilds it from each `d` put), the `p` positions and any `c`/`o`
//! records. After every N records (default 10 000) comes a cycle marker
//! (`c`: seq 1, 2, 3, …, next input offset O (default 0: an empty input
//! topic), no outbox chunks, delivered), as the service's commit cycles
//! seal theirs; a restore buffers one cycle's records until its marker.
//!
//! `--create-topics` first creates the input topic (kafka.topic_partitions
//! partitions) and its changelog (as many, compacted, as
//! `jurystream run` creates it) when missing, so that the service, started
//! afterwards, finds the changelog seeded.
//!
//! Prints progress every 2 s and, at the end, the records (per key kind),
//! markers, bytes (keys + values) and the time to produce and acknowledge
//! them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use jurystream::config::Config;
use jurystream::kafka::{client_config, send_waiting};
use jurystream::service::{CycleMarker, Names, CHANGELOG_HEADER, CYCLE_KEY};

/// Key kinds that never go to a changelog: the local time index, shell
/// positions, and the service's own marker and outbox.
fn local_only(key: &[u8]) -> bool {
    matches!(key.first(), Some(b't' | b'p' | b'c' | b'o'))
}

#[derive(Default)]
struct Acks {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => self.ok.fetch_add(1, Ordering::Relaxed),
            Err((e, _)) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("changelog_seed: delivery failed: {e}");
                }
                0
            }
        };
    }
}

struct Args {
    config: PathBuf,
    state_dir: PathBuf,
    partition: i32,
    cycle_records: u64,
    next_offset: i64,
    create_topics: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: changelog_seed --config FILE --state-dir DIR [--partition P] \
         [--cycle-records N] [--next-offset O] [--create-topics]"
    );
    std::process::exit(2)
}

fn args() -> Args {
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    let (mut config, mut state_dir) = (None, None);
    let mut a = Args {
        config: PathBuf::new(),
        state_dir: PathBuf::new(),
        partition: 0,
        cycle_records: 10_000,
        next_offset: 0,
        create_topics: false,
    };
    while let Some(flag) = it.next() {
        if flag == "--create-topics" {
            a.create_topics = true;
            continue;
        }
        let Some(v) = it.next() else { usage() };
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(v)),
            "--state-dir" => state_dir = Some(PathBuf::from(v)),
            "--partition" => a.partition = v.parse().unwrap_or_else(|_| usage()),
            "--cycle-records" => a.cycle_records = v.parse().unwrap_or_else(|_| usage()),
            "--next-offset" => a.next_offset = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    match (config, state_dir) {
        (Some(c), Some(s)) if a.cycle_records > 0 => {
            a.config = c;
            a.state_dir = s;
            a
        }
        _ => usage(),
    }
}

/// Creates the input topic and its changelog when missing, with the
/// settings `jurystream run` creates them with (its `topics` module is
/// private): the changelog compacted, with the same compaction lag.
fn create_topics(cfg: &Config, input: &str, changelog: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        client_config(cfg).create().expect("admin client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let n = cfg.kafka.topic_partitions as i32;
    let rf = cfg.kafka.replication_factor as i32;
    let topics = [
        NewTopic::new(input, n, TopicReplication::Fixed(rf)),
        NewTopic::new(changelog, n, TopicReplication::Fixed(rf))
            .set("cleanup.policy", "compact")
            .set("min.compaction.lag.ms", "86400000"),
    ];
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in rt
        .block_on(admin.create_topics(&topics, &opts))
        .expect("create topics")
    {
        match r {
            Ok(t) => eprintln!("changelog_seed: created topic {t}"),
            Err((t, RDKafkaErrorCode::TopicAlreadyExists)) => {
                eprintln!("changelog_seed: topic {t} exists")
            }
            Err((t, e)) => panic!("create topic {t}: {e}"),
        }
    }
}

/// Queues one record, serving delivery reports while the queue is full.
fn send(p: &BaseProducer<Acks>, topic: &str, partition: i32, key: &[u8], value: Option<&[u8]>) {
    let (name, format) = CHANGELOG_HEADER;
    let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
        .partition(partition)
        .key(key)
        .headers(OwnedHeaders::new().insert(Header {
            key: name,
            value: Some(format),
        }));
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    if let Err(e) = send_waiting(p, rec) {
        panic!("produce to {topic}: {e}");
    }
}

fn main() {
    let a = args();
    let cfg = Config::load(Some(&a.config)).unwrap_or_else(|e| {
        eprintln!("changelog_seed: {e}");
        std::process::exit(2)
    });
    let input = cfg.kafka.input_topics[0].clone();
    let topic = Names::new(&cfg).changelog(&input);
    if a.create_topics {
        create_topics(&cfg, &input, &topic);
    }

    // Read-only, as `Store::open_read_only` opens it (the state module has
    // no public way to walk every record of a store).
    let db = rocksdb::DB::open_for_read_only(&rocksdb::Options::default(), &a.state_dir, false)
        .unwrap_or_else(|e| panic!("open {}: {e}", a.state_dir.display()));
    let mut ro = rocksdb::ReadOptions::default();
    ro.set_total_order_seek(true);
    ro.fill_cache(false);
    ro.set_readahead_size(4 << 20);

    // The service's producer settings (client_config, idempotence), with
    // large batches and a deep queue for throughput.
    let producer: BaseProducer<Acks> = client_config(&cfg)
        .set("enable.idempotence", "true")
        .set("linger.ms", "50")
        .set("batch.num.messages", "100000")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create_with_context(Acks::default())
        .expect("producer");

    eprintln!(
        "changelog_seed: {} -> {topic} [{}] at {}, a marker every {} records, next_offset {}",
        a.state_dir.display(),
        a.partition,
        cfg.kafka.brokers,
        a.cycle_records,
        a.next_offset
    );
    let started = Instant::now();
    let mut logged = started;
    let mut kinds: BTreeMap<u8, (u64, u64)> = BTreeMap::new();
    let (mut records, mut bytes, mut skipped, mut in_cycle, mut seq) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let seal = |seq: &mut u64, records: &mut u64, bytes: &mut u64| {
        *seq += 1;
        let m = CycleMarker {
            seq: *seq,
            next_offset: a.next_offset,
            ..CycleMarker::initial()
        }
        .encode();
        send(&producer, &topic, a.partition, CYCLE_KEY, Some(&m));
        *records += 1;
        *bytes += (CYCLE_KEY.len() + m.len()) as u64;
    };
    for item in db.iterator_opt(rocksdb::IteratorMode::Start, ro) {
        let (k, v) = item.expect("read the state");
        if local_only(&k) {
            skipped += 1;
            continue;
        }
        send(&producer, &topic, a.partition, &k, Some(&v));
        let n = (k.len() + v.len()) as u64;
        let e = kinds.entry(k[0]).or_default();
        e.0 += 1;
        e.1 += n;
        records += 1;
        bytes += n;
        in_cycle += 1;
        if in_cycle == a.cycle_records {
            seal(&mut seq, &mut records, &mut bytes);
            in_cycle = 0;
        }
        producer.poll(Duration::ZERO);
        if logged.elapsed() >= Duration::from_secs(2) {
            logged = Instant::now();
            let s = started.elapsed().as_secs_f64();
            eprintln!(
                "changelog_seed: {records} records, {:.0} MiB queued, {} acknowledged, {s:.0} s ({:.0} records/s)",
                bytes as f64 / 1048576.0,
                producer.context().ok.load(Ordering::Relaxed),
                records as f64 / s
            );
        }
    }
    // The last cycle (or the only one, for an empty state).
    if in_cycle > 0 || seq == 0 {
        seal(&mut seq, &mut records, &mut bytes);
    }
    let queued_s = started.elapsed().as_secs_f64();
    while producer.in_flight_count() > 0 {
        producer.poll(Duration::from_millis(100));
        if logged.elapsed() >= Duration::from_secs(2) {
            logged = Instant::now();
            eprintln!(
                "changelog_seed: flushing, {} of {records} acknowledged",
                producer.context().ok.load(Ordering::Relaxed)
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let ctx = producer.context();
    let (ok, failed) = (
        ctx.ok.load(Ordering::Relaxed),
        ctx.failed.load(Ordering::Relaxed),
    );
    for (k, (n, b)) in &kinds {
        println!("kind {}: {n} records, {b} bytes", *k as char);
    }
    println!("skipped (local only: t, p, c, o): {skipped}");
    println!(
        "seeded {topic} [{}]: {records} records ({} state, {seq} markers), {bytes} bytes ({:.1} MiB), \
         acknowledged {ok}, failed {failed}, queued in {queued_s:.1} s, acknowledged in {secs:.1} s \
         ({:.0} records/s, {:.1} MiB/s)",
        a.partition,
        records - seq,
        bytes as f64 / 1048576.0,
        records as f64 / secs,
        bytes as f64 / 1048576.0 / secs
    );
    if failed > 0 || ok != records {
        eprintln!("changelog_seed: {failed} records failed, {ok} of {records} acknowledged");
        std::process::exit(1);
    }
}
