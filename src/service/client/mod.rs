//! The service's Kafka plumbing: the names it derives from its
//! configuration (and which partition directories are due for cleanup),
//! the output topics, the record sender, the delivery callbacks, and the
//! partitioner that outbox mode computes itself (client settings shared
//! with `connect` and the tools are in [`crate::kafka`]).

pub mod context;
pub mod lanes;
pub mod topics;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, ProducerContext};
use rdkafka::ClientContext;

use crate::config::Config;
use crate::kafka::{property, send_waiting};
use crate::output::Route;
use crate::service::error::{Result, ServiceError};

/// An input (or changelog) topic partition.
pub type Tp = (String, i32);

/// Header on every output event: `<input topic>/<partition>/<cycle>/<index>`,
/// the input partition, the cycle that emitted it and its place in that
/// cycle. It makes each event traceable and lets a restoring instance see
/// which events of an interrupted cycle already reached the broker.
pub const ORIGIN_HEADER: &str = "jurystream-origin";

/// Where one partition's RocksDB lives.
pub fn partition_dir(cfg: &Config, tp: &Tp) -> std::path::PathBuf {
    std::path::PathBuf::from(&cfg.state.dir).join(format!("{}-{}", tp.0, tp.1))
}

/// Names the service derives from the configuration.
#[derive(Clone)]
pub struct Names {
    pub changelog_base: String,
    pub transactional_id: String,
}

/// This process's hold on `state.dir`: an exclusive lock on
/// `state.dir/LOCK` for as long as it lives, and the instance id kept in
/// `state.dir/instance-id` (made once, at the directory's first use). Two
/// processes cannot hold one state directory, so two instances on one host
/// (systemd units, containers sharing a host name) can never share an id,
/// and a restart keeps its id (Kafka Streams keys its transactional ids by
/// a process id kept in its state directory the same way).
pub struct StateDirLock {
    _file: std::fs::File,
    pub instance_id: String,
}

impl StateDirLock {
    pub fn acquire(dir: &std::path::Path) -> Result<StateDirLock> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(dir).map_err(|e| ServiceError::io(dir.display(), e))?;
        let lock_path = dir.join("LOCK");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ServiceError::io(lock_path.display(), e))?;
        // flock: released by the kernel when the process ends, however.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(ServiceError::config(format!(
                "state.dir {} is in use by another jurystream process (lock {}): \
                 each instance needs a state directory of its own",
                dir.display(),
                lock_path.display()
            )));
        }
        let id_path = dir.join("instance-id");
        let instance_id = match std::fs::read_to_string(&id_path) {
            Ok(s) if !s.trim().is_empty() => s.trim().to_owned(),
            _ => {
                let id = new_instance_id();
                let tmp = dir.join("instance-id.tmp");
                std::fs::write(&tmp, format!("{id}\n"))
                    .and_then(|()| std::fs::rename(&tmp, &id_path))
                    .map_err(|e| ServiceError::io(id_path.display(), e))?;
                id
            }
        };
        Ok(StateDirLock {
            _file: file,
            instance_id,
        })
    }
}

/// A new instance id: 16 hex digits of a hash of the host name, the
/// process id and the clock (unique enough for a handful of instances; no
/// random-number crate for one number).
fn new_instance_id() -> String {
    let seed = format!(
        "{}/{}/{}",
        hostname().unwrap_or_default(),
        std::process::id(),
        crate::time::wall_clock()
    );
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(seed.as_bytes()))
}

impl Names {
    /// The names of `cfg`; the instance part of the transactional id is
    /// `$JURYSTREAM_INSTANCE_ID` when set, else `instance_id` (the state
    /// directory's, [`StateDirLock`]).
    pub fn new(cfg: &Config) -> Names {
        Self::with_instance(cfg, None)
    }

    pub fn with_instance(cfg: &Config, instance_id: Option<&str>) -> Names {
        let k = &cfg.kafka;
        let changelog_base = if k.changelog_topic.is_empty() {
            format!("{}-changelog", k.group_id)
        } else {
            k.changelog_topic.clone()
        };
        let prefix = if k.transactional_id_prefix.is_empty() {
            k.group_id.clone()
        } else {
            k.transactional_id_prefix.clone()
        };
        let instance = std::env::var("JURYSTREAM_INSTANCE_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| instance_id.map(str::to_owned))
            .or_else(hostname)
            .unwrap_or_else(|| "0".into());
        Names {
            changelog_base,
            transactional_id: format!("{prefix}-{instance}"),
        }
    }

    /// The changelog topic of one input topic.
    pub fn changelog(&self, input_topic: &str) -> String {
        format!("{}.{}", self.changelog_base, input_topic)
    }
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Output topic names and partition counts, by [`Route`].
pub struct Outputs {
    pub topics: [String; 4],
    pub partitions: [i32; 4],
}

impl Outputs {
    pub fn topic(&self, r: Route) -> &str {
        &self.topics[r.index()]
    }

    pub fn partitions(&self, r: Route) -> i32 {
        self.partitions[r.index()]
    }
}

/// Partitions of `unowned` to delete at `now`: not owned for `grace`.
pub fn cleanup_due(
    unowned: &HashMap<Tp, Instant>,
    owned: impl Fn(&Tp) -> bool,
    now: Instant,
    grace: Duration,
) -> Vec<Tp> {
    let mut due: Vec<Tp> = unowned
        .iter()
        .filter(|(tp, since)| now.saturating_duration_since(**since) >= grace && !owned(tp))
        .map(|(tp, _)| tp.clone())
        .collect();
    due.sort();
    due
}

/// One record to send.
pub struct Out<'a> {
    pub topic: &'a str,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    /// Explicit partition; `None` lets the producer's partitioner choose.
    pub partition: Option<i32>,
    /// One header: [`ORIGIN_HEADER`] on output events, the state format's
    /// on changelog records (`crate::state::format::HEADER`).
    pub header: Option<(&'a str, &'a [u8])>,
}

/// Queues one record, waiting while the producer queue is full.
pub fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    out: Out<'_>,
) -> Result<()> {
    let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(out.topic);
    if let Some(k) = out.key {
        rec = rec.key(k);
    }
    if let Some(p) = out.payload {
        rec = rec.payload(p);
    }
    if let Some(p) = out.partition {
        rec = rec.partition(p);
    }
    if let Some((key, value)) = out.header {
        rec = rec.headers(OwnedHeaders::new().insert(Header {
            key,
            value: Some(value),
        }));
    }
    send_waiting(producer, rec).map_err(|e| ServiceError::kafka("produce", e))
}

/// The librdkafka partitioner outbox mode reproduces (its default).
const OUTBOX_PARTITIONER: &str = "consistent_random";

/// Outbox mode publishes events with explicit partitions it computes
/// itself (so a restoring instance knows where to look for them); a
/// `partitioner` property it does not reproduce would silently send events
/// elsewhere than the user asked, so it is refused at start.
pub fn check_outbox_partitioner(cfg: &Config) -> Result<()> {
    match property(cfg, "partitioner") {
        Some(p) if p.trim() != OUTBOX_PARTITIONER => Err(ServiceError::config(format!(
            "kafka.properties.partitioner = {p:?}: kafka.delivery = \"exactly_once_outbox\" \
             partitions events itself as librdkafka's default \"{OUTBOX_PARTITIONER}\" does \
             (CRC-32 of the key); remove the property, set it to \"{OUTBOX_PARTITIONER}\", \
             or use another delivery mode"
        ))),
        _ => Ok(()),
    }
}

/// The output partition librdkafka's default partitioner picks for `key`
/// among `n`: CRC-32 (IEEE) of the key; a record without a key goes to the
/// input partition's number modulo `n` (librdkafka picks a random one).
pub fn outbox_partition(key: Option<&[u8]>, n: i32, input_partition: i32) -> i32 {
    let n = n.max(1);
    match key {
        Some(k) if !k.is_empty() => (crc32fast::hash(k) % n as u32) as i32,
        _ => input_partition.rem_euclid(n),
    }
}

/// Remembers the highest acknowledged offset per topic partition and the
/// first delivery failure.
#[derive(Default)]
pub struct ProduceCtx {
    /// Topic → partition → offset: a report looks its topic up by `&str`
    /// (no allocation per acknowledged record), with a fast hash (SipHash
    /// was ~1 % of the poll loop: one lookup per acknowledged record).
    acked: Mutex<FxHashMap<String, FxHashMap<i32, i64>>>,
    failure: Mutex<Option<KafkaError>>,
}

impl ProduceCtx {
    /// The first delivery failure since the last call, if any.
    pub fn take_failure(&self) -> Option<KafkaError> {
        self.failure.lock().ok().and_then(|mut f| f.take())
    }

    /// The highest acknowledged offset of every partition written to.
    pub fn acked(&self) -> HashMap<Tp, i64> {
        let Ok(map) = self.acked.lock() else {
            return HashMap::new();
        };
        map.iter()
            .flat_map(|(topic, parts)| parts.iter().map(|(p, o)| ((topic.clone(), *p), *o)))
            .collect()
    }
}

impl ClientContext for ProduceCtx {}

impl ProducerContext for ProduceCtx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                if let Ok(mut map) = self.acked.lock() {
                    let parts = match map.get_mut(m.topic()) {
                        Some(parts) => parts,
                        None => map.entry(m.topic().to_owned()).or_default(),
                    };
                    let e = parts.entry(m.partition()).or_insert(-1);
                    *e = (*e).max(m.offset());
                }
            }
            Err((e, _)) => {
                if let Ok(mut f) = self.failure.lock() {
                    f.get_or_insert_with(|| e.clone());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Classify;

    #[test]
    fn unowned_state_is_removed_after_the_grace_only() {
        let t0 = Instant::now();
        let mut unowned = HashMap::new();
        unowned.insert(("votes".to_string(), 0), t0);
        unowned.insert(("votes".to_string(), 1), t0 + Duration::from_secs(5));
        unowned.insert(("votes".to_string(), 2), t0);
        let owned = |tp: &Tp| tp.1 == 2;
        let grace = Duration::from_secs(10);
        assert!(cleanup_due(&unowned, owned, t0 + Duration::from_secs(9), grace).is_empty());
        assert_eq!(
            cleanup_due(&unowned, owned, t0 + Duration::from_secs(10), grace),
            vec![("votes".to_string(), 0)]
        );
        assert_eq!(
            cleanup_due(&unowned, owned, t0 + Duration::from_secs(15), grace).len(),
            2
        );
    }

    #[test]
    fn outbox_partitions_follow_librdkafkas_crc32() {
        // The standard CRC-32 check value, which librdkafka's partitioner hashes.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            outbox_partition(Some(b"123456789"), 7, 0),
            (0xCBF4_3926u32 % 7) as i32
        );
        assert_eq!(outbox_partition(None, 4, 6), 2);
        assert_eq!(outbox_partition(Some(b""), 4, 1), 1);
        assert_eq!(outbox_partition(Some(b"x"), 0, 0), 0);
    }

    #[test]
    fn a_partitioner_outbox_mode_does_not_reproduce_is_refused() {
        let mut cfg = Config::from_layers(None, &[]).unwrap();
        assert!(check_outbox_partitioner(&cfg).is_ok());
        cfg.kafka.properties.insert(
            "partitioner".into(),
            toml::Value::String("consistent_random".into()),
        );
        assert!(check_outbox_partitioner(&cfg).is_ok());
        cfg.kafka.properties.insert(
            "partitioner".into(),
            toml::Value::String("murmur2_random".into()),
        );
        let e = check_outbox_partitioner(&cfg).unwrap_err();
        assert_eq!(e.fault(), crate::error::Fault::Usage);
        assert!(!e.is_retriable());
        assert!(e.to_string().contains("murmur2_random"), "{e}");
    }
}

#[cfg(test)]
mod state_dir_tests {
    use super::*;
    use crate::error::Classify;

    #[test]
    fn a_state_dir_has_one_process_and_keeps_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateDirLock::acquire(dir.path()).unwrap();
        assert_eq!(first.instance_id.len(), 16);
        // A second holder (another process, or another open here: flock
        // locks are per open file) is refused, naming the directory.
        let err = StateDirLock::acquire(dir.path()).err().expect("in use");
        assert!(!err.is_retriable());
        assert!(err.to_string().contains("in use"), "{err}");
        let id = first.instance_id.clone();
        drop(first);
        // A restart keeps the id.
        assert_eq!(StateDirLock::acquire(dir.path()).unwrap().instance_id, id);
        // Another directory gets another id.
        let other = tempfile::tempdir().unwrap();
        assert_ne!(StateDirLock::acquire(other.path()).unwrap().instance_id, id);
    }
}
