//! Kafka benchmark helpers (scripts/bench-kafka.sh), built from the
//! project's own dependencies:
//!
//!   kafka_passthrough pass BROKERS IN_TOPIC OUT_TOPIC GROUP N
//!       consume IN_TOPIC as GROUP and produce every payload to OUT_TOPIC,
//!       in 100 ms cycles (flush, then commit offsets: the same cycle as
//!       `jurystream run` with delivery = "at_least_once"), until N records
//!       are committed; prints the elapsed time.
//!   kafka_passthrough wait BROKERS TOPIC GROUP N
//!       wait until GROUP has committed N records of TOPIC; prints the time,
//!       then when it first saw a commit of GROUP and how many that held.
//!   kafka_passthrough mark BROKERS TOPIC GROUP N
//!       the same, polling every 20 ms with one client (scripts/bench-query.sh);
//!       prints the Unix time (s) when it saw N or more committed, and how
//!       many were committed then.
//!   kafka_passthrough pace BROKERS TOPIC FILE RATE SECONDS
//!       create TOPIC (4 partitions) if missing, then produce FILE's lines
//!       to it (keyed by inference_id, as `jurystream produce` does) at
//!       RATE records/s for SECONDS (or until the file ends), every record
//!       acknowledged; prints the count produced and the rate achieved.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord};
use rdkafka::{Offset, TopicPartitionList};

fn committed_total(brokers: &str, topic: &str, group: &str) -> i64 {
    committed_by(&offsets_client(brokers, group), topic)
}

/// A client that reads GROUP's committed offsets (it does not join the group).
fn offsets_client(brokers: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .expect("consumer")
}

fn committed_by(c: &BaseConsumer, topic: &str) -> i64 {
    let md = match c.fetch_metadata(Some(topic), Duration::from_secs(10)) {
        Ok(m) => m,
        Err(_) => return 0,
    };
    let mut tpl = TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition(topic, p.id());
    }
    let got = match c.committed_offsets(tpl, Duration::from_secs(10)) {
        Ok(g) => g,
        Err(_) => return 0,
    };
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        })
        .sum()
}

fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let _ = rt.block_on(admin.create_topics(&[t], &AdminOptions::new()));
}

/// An idempotent producer with `run`'s linger.
fn producer(brokers: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

fn main() {
    let a: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match a.first().map(String::as_str) {
        Some("wait") => {
            let (brokers, topic, group, n) = (&a[1], &a[2], &a[3], a[4].parse::<i64>().unwrap());
            let t = Instant::now();
            // When the group's first commit was seen, and what it held:
            // the rate after it leaves out the start (joining the group,
            // the broker's initial rebalance delay, the first cycle).
            let mut first: Option<(f64, i64)> = None;
            loop {
                let got = committed_total(brokers, topic, group);
                if got > 0 && first.is_none() {
                    first = Some((t.elapsed().as_secs_f64(), got));
                }
                if got >= n {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let (first_s, first_n) = first.unwrap_or((0.0, 0));
            println!("{:.3} {first_s:.3} {first_n}", t.elapsed().as_secs_f64());
        }
        Some("mark") => {
            let (brokers, topic, group, n) = (&a[1], &a[2], &a[3], a[4].parse::<i64>().unwrap());
            let c = offsets_client(brokers, group);
            loop {
                let got = committed_by(&c, topic);
                if got >= n {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap();
                    println!("{:.3} {got}", now.as_secs_f64());
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Some("pass") => {
            let (brokers, input, output, group, n) =
                (&a[1], &a[2], &a[3], &a[4], a[5].parse::<i64>().unwrap());
            create_topic(brokers, output, 4);
            let t = Instant::now();
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("group.id", group)
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                .set("session.timeout.ms", "6000")
                .set("max.poll.interval.ms", "6000")
                .create()
                .expect("consumer");
            let producer: BaseProducer = producer(brokers);
            consumer.subscribe(&[input.as_str()]).expect("subscribe");
            let mut offsets: HashMap<i32, i64> = HashMap::new();
            let mut done = 0i64;
            let mut cycle = Instant::now();
            while done < n {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) {
                    let mut rec: BaseRecord<'_, [u8], [u8]> =
                        BaseRecord::to(output).payload(m.payload().unwrap_or_default());
                    if let Some(k) = m.key() {
                        rec = rec.key(k);
                    }
                    jurystream::kafka::send_waiting(&producer, rec)
                        .unwrap_or_else(|e| panic!("produce to {output}: {e}"));
                    offsets.insert(m.partition(), m.offset() + 1);
                }
                if cycle.elapsed() >= Duration::from_millis(100) && !offsets.is_empty() {
                    jurystream::kafka::flush_now(&producer, Duration::from_secs(60))
                        .expect("flush");
                    let mut tpl = TopicPartitionList::new();
                    for (p, o) in &offsets {
                        tpl.add_partition_offset(input, *p, Offset::Offset(*o))
                            .unwrap();
                    }
                    consumer.commit(&tpl, CommitMode::Sync).expect("commit");
                    done = offsets.values().sum();
                    cycle = Instant::now();
                }
            }
            println!("{:.3}", t.elapsed().as_secs_f64());
        }
        Some("pace") => {
            let (brokers, topic, file) = (&a[1], &a[2], &a[3]);
            let rate: f64 = a[4].parse().unwrap();
            let seconds: f64 = a[5].parse().unwrap();
            create_topic(brokers, topic, 4);
            let producer: BaseProducer = producer(brokers);
            let text = std::fs::read_to_string(file).expect("read the votes file");
            let mut lines = text.lines().filter(|l| !l.trim().is_empty());
            let limit = (rate * seconds) as u64;
            let t = Instant::now();
            let mut sent = 0u64;
            'pace: while sent < limit {
                // Records due by now; the rest of the slice sleeps.
                let due = ((t.elapsed().as_secs_f64() * rate) as u64).min(limit);
                while sent < due {
                    let Some(line) = lines.next() else {
                        break 'pace;
                    };
                    let key = serde_json::from_str::<serde_json::Value>(line)
                        .ok()
                        .and_then(|v| v.get("inference_id")?.as_str().map(str::to_owned));
                    let mut rec: BaseRecord<'_, [u8], [u8]> =
                        BaseRecord::to(topic).payload(line.as_bytes());
                    if let Some(k) = &key {
                        rec = rec.key(k.as_bytes());
                    }
                    jurystream::kafka::send_waiting(&producer, rec)
                        .unwrap_or_else(|e| panic!("produce to {topic}: {e}"));
                    sent += 1;
                }
                producer.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(2));
            }
            jurystream::kafka::flush_now(&producer, Duration::from_secs(60)).expect("flush");
            println!("{sent} {:.0}", sent as f64 / t.elapsed().as_secs_f64());
        }
        _ => eprintln!("usage: kafka_passthrough pass|wait|mark|pace ..."),
    }
}
