//! contract §14 in `run`: each partition's sealed sums published to the
//! compacted `reputation.topic` with its cycle, every instance reading the
//! whole topic back into the group's view ([`Group`]), which feeds every
//! partition's tables and releases the batches waiting at the barrier.
//!
//! The record codec and the [`Group`] are pure; the reader thread is at
//! the end. The session's side is `tables.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::engine::reputation::{Epoch, ReputationParams, Table, Tables, Terms, TermsKey};
use crate::engine::Models;
use crate::input::Id;
use crate::kafka::{client_config, QuietEof};
use crate::service::client::Tp;
use crate::service::error::{Result, ServiceError};
use crate::state::format::{self, TopicKey};

/// A record of the reputation topic.
#[derive(Debug, Clone, PartialEq)]
pub enum TopicRecord {
    /// One input partition's sealed sums of a rubric and epoch: each
    /// reviewer's terms, in `voter_id` byte order.
    Delta {
        rubric: Id,
        epoch: Epoch,
        tp: Tp,
        rows: Vec<(Id, Terms)>,
    },
    /// The newest epoch an input partition has sealed.
    Sealed { tp: Tp, epoch: Epoch },
}

impl TopicRecord {
    /// Key and value, laid out by the state format
    /// (`crate::state::format`: `topic_delta_key`, `encode_topic_delta`,
    /// `topic_seal_key`, `encode_topic_seal`); values carry its byte.
    pub fn encode(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            TopicRecord::Delta {
                rubric,
                epoch,
                tp,
                rows,
            } => (
                format::topic_delta_key(rubric, *epoch, &tp.0, tp.1),
                format::encode_topic_delta(rows),
            ),
            TopicRecord::Sealed { tp, epoch } => (
                format::topic_seal_key(&tp.0, tp.1),
                format::encode_topic_seal(*epoch),
            ),
        }
    }

    pub fn decode(key: &[u8], value: &[u8]) -> std::result::Result<TopicRecord, String> {
        let bad = |e: &dyn std::fmt::Display| format!("not a reputation record: {e}");
        match format::parse_topic_key(key).map_err(|e| bad(&e))? {
            Some(TopicKey::Delta {
                rubric,
                epoch,
                topic,
                partition,
            }) => Ok(TopicRecord::Delta {
                rubric,
                epoch,
                tp: (topic, partition),
                rows: format::decode_topic_delta(value).map_err(|e| bad(&e))?,
            }),
            Some(TopicKey::Seal { topic, partition }) => Ok(TopicRecord::Sealed {
                tp: (topic, partition),
                epoch: format::decode_topic_seal(value).map_err(|e| bad(&e))?,
            }),
            None => Err(bad(&"unknown key kind")),
        }
    }
}

/// The records a partition's sealed deltas and newest sealed epoch make,
/// deltas first (grouped per rubric and epoch, reviewers in byte order).
pub fn records_of(
    tp: &Tp,
    deltas: Vec<(TermsKey, Terms)>,
    sealed: Option<Epoch>,
) -> Vec<TopicRecord> {
    let mut grouped: std::collections::BTreeMap<(Id, Epoch), Vec<(Id, Terms)>> = Default::default();
    for ((rubric, epoch, voter), t) in deltas {
        grouped.entry((rubric, epoch)).or_default().push((voter, t));
    }
    let mut out: Vec<TopicRecord> = grouped
        .into_iter()
        .map(|((rubric, epoch), mut rows)| {
            rows.sort_by(|a, b| a.0.cmp(&b.0));
            TopicRecord::Delta {
                rubric,
                epoch,
                tp: tp.clone(),
                rows,
            }
        })
        .collect();
    if let Some(epoch) = sealed {
        out.push(TopicRecord::Sealed {
            tp: tp.clone(),
            epoch,
        });
    }
    out
}

/// The topic partition every record of input partition `tp` goes to.
pub fn topic_partition(tp: &Tp, partitions: i32) -> i32 {
    let h = i64::from(crc32fast::hash(tp.0.as_bytes())) + i64::from(tp.1);
    h.rem_euclid(i64::from(partitions.max(1))) as i32
}

/// What an instance knows of the group from the topic: every delta once,
/// each input partition's newest sealed epoch, and the tables over them.
pub struct Group {
    params: ReputationParams,
    /// Each rubric's model (what `newest` tells the API).
    models: Models,
    /// Every input partition (of every input topic).
    pub expected: Vec<Tp>,
    seen: HashSet<(Id, Epoch, Tp)>,
    sealed: HashMap<Tp, Epoch>,
    tables: Tables,
    /// Deltas read since the partitions last took them.
    fresh: Vec<(TermsKey, Terms)>,
}

impl Group {
    pub fn new(params: ReputationParams, models: Models, expected: Vec<Tp>) -> Group {
        Group {
            params,
            models,
            expected,
            seen: HashSet::new(),
            sealed: HashMap::new(),
            tables: Tables::default(),
            fresh: Vec::new(),
        }
    }

    /// Takes one record. A delta seen before counts once (a redone cycle
    /// writes identical records; the topic keeps the latest per key).
    pub fn apply(&mut self, r: TopicRecord) {
        match r {
            TopicRecord::Delta {
                rubric,
                epoch,
                tp,
                rows,
            } => {
                if !self.seen.insert((rubric.clone(), epoch, tp)) {
                    return;
                }
                for (voter, t) in rows {
                    self.tables.add(&rubric, epoch, &voter, &t);
                    self.fresh.push(((rubric.clone(), epoch, voter), t));
                }
            }
            TopicRecord::Sealed { tp, epoch } => {
                let e = self.sealed.entry(tp).or_insert(epoch);
                *e = (*e).max(epoch);
            }
        }
    }

    /// Folds the epochs no table can need apart any more: those up to
    /// k* − 2, and up to `needed` − 2 (the oldest epoch a batch of this
    /// instance's partitions may have). A partition whose committed state
    /// is behind what its published seal records say (`at_least_once`
    /// after a crash) may need older ones: [`Group::can_serve`].
    pub fn fold(&mut self, needed: Option<Epoch>) {
        let Some(g) = self.group_sealed() else {
            return;
        };
        let limit = needed.map_or(g, |n| n.min(g));
        self.tables.fold_through(limit - 2);
    }

    /// Whether the tables can serve a partition whose oldest batch to
    /// score may be of epoch `needed`.
    pub fn can_serve(&self, needed: Option<Epoch>) -> bool {
        match (needed, self.tables.base_until()) {
            (Some(n), Some(b)) => b <= n - 2,
            (None, Some(_)) => false,
            (_, None) => true,
        }
    }

    /// k*: the newest epoch every input partition has sealed.
    pub fn group_sealed(&self) -> Option<Epoch> {
        self.expected
            .iter()
            .map(|tp| self.sealed.get(tp).copied())
            .min()
            .flatten()
    }

    pub fn params(&self) -> &ReputationParams {
        &self.params
    }

    pub fn take_fresh(&mut self) -> Vec<(TermsKey, Terms)> {
        std::mem::take(&mut self.fresh)
    }

    /// Deltas that give a partition started now the group's tables.
    pub fn export(&self) -> Vec<(TermsKey, Terms)> {
        self.tables.export()
    }

    /// T_{k*+2} of every rubric, and (k* + 1)·E (contract §9 `weight`,
    /// `table_until`): None until every partition has sealed an epoch.
    pub fn newest(&mut self) -> Option<crate::api::GroupWeights> {
        let g = self.group_sealed()?;
        let tables = self
            .tables
            .rubrics()
            .into_iter()
            .map(|r| {
                let t: Arc<Table> = self.tables.table(&self.params, &r, g + 2);
                (r.to_string(), t)
            })
            .collect();
        Some(crate::api::GroupWeights {
            table_until: self.params.start_of(g + 1),
            tables,
            models: self.models.clone(),
        })
    }
}

/// The thread reading the whole reputation topic (read_committed) from
/// its beginning, for as long as the session lives.
pub struct Reader {
    pub rx: mpsc::Receiver<TopicRecord>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    pub fn start(cfg: &Config) -> Result<Reader> {
        let topic = cfg.reputation.topic.clone();
        let consumer: BaseConsumer<QuietEof> = client_config(cfg)
            .set("group.id", format!("{}-reputation", cfg.kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .create_with_context(QuietEof)
            .map_err(|e| ServiceError::kafka("create the reputation reader", e))?;
        let md = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .map_err(|e| ServiceError::kafka("reputation topic metadata", e))?;
        let n = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .map_or(0, |t| t.partitions().len());
        if n == 0 {
            return Err(ServiceError::broker(format!(
                "reputation topic {topic} has no partitions"
            )));
        }
        let mut tpl = TopicPartitionList::new();
        for p in 0..n as i32 {
            tpl.add_partition_offset(&topic, p, Offset::Beginning)
                .map_err(|e| ServiceError::kafka("assign the reputation topic", e))?;
        }
        consumer
            .assign(&tpl)
            .map_err(|e| ServiceError::kafka("assign the reputation topic", e))?;
        let (tx, rx) = mpsc::sync_channel(65_536);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("reputation-reader".into())
            .spawn(move || {
                while !stopping.load(Ordering::SeqCst) {
                    let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                        continue;
                    };
                    let m = match m {
                        Ok(m) => m,
                        Err(e) => {
                            tracing::warn!("reputation reader: {e}");
                            continue;
                        }
                    };
                    let (Some(k), Some(v)) = (m.key(), m.payload()) else {
                        continue;
                    };
                    match TopicRecord::decode(k, v) {
                        Ok(r) => {
                            if tx.send(r).is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::warn!(
                            partition = m.partition(),
                            offset = m.offset(),
                            "reputation topic: skipping a record: {e}"
                        ),
                    }
                }
            })
            .map_err(|e| ServiceError::thread("the reputation reader", e))?;
        Ok(Reader {
            rx,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The session's side: the reader and the group view.
pub struct Reputation {
    pub reader: Reader,
    pub group: Group,
    /// The group's newest sealed epoch the partitions were last told.
    pub told: Option<Epoch>,
}

impl Reputation {
    pub fn start(cfg: &Config, expected: Vec<Tp>) -> Result<Reputation> {
        Ok(Reputation {
            reader: Reader::start(cfg)?,
            group: Group::new(cfg.engine().reputation, cfg.engine().models(), expected),
            told: None,
        })
    }
}

#[cfg(test)]
mod tests;
