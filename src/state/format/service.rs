//! The service's records, stored like every other value and laid out here:
//! a partition's cycle marker (`c`) and outbox chunks (`o…`), in RocksDB,
//! the changelog and the outbox file (`crate::service::changelog`), and
//! the records of contract §14's reputation topic
//! (`crate::service::reputation`). The service converts its own types to
//! and from these through the functions below, never through a generic
//! encoder, so a field it adds is not stored until the format says how.
//! An output route is stored as its code (`crate::output::Route::stored`,
//! the byte postcard wrote for the enum's variant index in formats 7 to
//! 11): `state` does not know the routes.
//!
//! The marker's and the outbox's layouts have not changed since format 7
//! (untagged before, and such a value is read as every untagged one is:
//! `super::super::legacy`); the reputation topic's came with contract §14,
//! their values tagged from the start.

use serde::{Deserialize, Serialize};

use super::reputation::{terms_layout, terms_of, terms_of_12, TermsL, TermsL12};
use super::{decode, each, encode, payload, FormatError, Seq};
use crate::engine::reputation::{Epoch, Terms};
use crate::input::Id;

// ----------------------------------------------------------- cycle marker

/// A cycle marker's value (`c`): cycle number, next input offset (-1:
/// unknown), outbox chunks, whether the cycle is delivered, then the
/// floors: (route code, output partition, offset) each.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredMarker {
    pub seq: u64,
    pub next_offset: i64,
    pub outbox_chunks: u32,
    pub delivered: bool,
    pub floors: Vec<(u8, i32, i64)>,
}

pub fn encode_marker(m: &StoredMarker) -> Vec<u8> {
    encode(m)
}

pub fn decode_marker(v: &[u8]) -> Result<StoredMarker, FormatError> {
    decode(v)
}

// ----------------------------------------------------------------- outbox

/// One outbox event to write, borrowed: route code, output partition,
/// Kafka key, payload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StoredEventRef<'a> {
    pub route: u8,
    pub partition: i32,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
}

/// One outbox event as read back: the fields of [`StoredEventRef`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StoredEvent {
    pub route: u8,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

impl StoredEvent {
    pub fn borrowed(&self) -> StoredEventRef<'_> {
        StoredEventRef {
            route: self.route,
            partition: self.partition,
            key: self.key.as_deref(),
            payload: &self.payload,
        }
    }
}

/// An outbox chunk as read back (`o`): its cycle number and its events.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StoredChunk {
    pub seq: u64,
    pub events: Vec<StoredEvent>,
}

/// An outbox chunk's value: its cycle number, then its events, written
/// from `events` as they come (their payloads are not copied).
pub fn encode_outbox_chunk<'a>(
    seq: u64,
    events: impl ExactSizeIterator<Item = StoredEventRef<'a>> + Clone,
) -> Vec<u8> {
    encode(&(seq, Seq(events)))
}

pub fn decode_outbox_chunk(v: &[u8]) -> Result<StoredChunk, FormatError> {
    decode(v)
}

// -------------------------------------------------------- reputation topic

/// Kind byte of a sealed delta's key on the reputation topic.
const TOPIC_DELTA: u8 = b'd';
/// Kind byte of a partition's seal record's key on the reputation topic.
const TOPIC_SEAL: u8 = b's';

/// A reputation topic record's key, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicKey {
    /// One input partition's sealed sums of a rubric and epoch.
    Delta {
        rubric: Id,
        epoch: Epoch,
        topic: String,
        partition: i32,
    },
    /// The newest epoch an input partition has sealed.
    Seal { topic: String, partition: i32 },
}

/// The key of an input partition's sealed delta of a rubric and epoch:
/// `d`, then postcard (rubric, epoch, input topic, input partition).
pub fn topic_delta_key(rubric: &str, epoch: Epoch, topic: &str, partition: i32) -> Vec<u8> {
    postcard::to_extend(&(rubric, epoch, topic, partition), vec![TOPIC_DELTA])
        .expect("postcard into a Vec")
}

/// The key of an input partition's seal record: `s`, then postcard
/// (input topic, input partition).
pub fn topic_seal_key(topic: &str, partition: i32) -> Vec<u8> {
    postcard::to_extend(&(topic, partition), vec![TOPIC_SEAL]).expect("postcard into a Vec")
}

/// A reputation topic record's key (`Ok(None)`: a kind byte this build
/// does not know).
pub fn parse_topic_key(key: &[u8]) -> Result<Option<TopicKey>, postcard::Error> {
    Ok(match key.split_first() {
        Some((&TOPIC_DELTA, k)) => {
            let (rubric, epoch, topic, partition): (Id, Epoch, String, i32) =
                postcard::from_bytes(k)?;
            Some(TopicKey::Delta {
                rubric,
                epoch,
                topic,
                partition,
            })
        }
        Some((&TOPIC_SEAL, k)) => {
            let (topic, partition): (String, i32) = postcard::from_bytes(k)?;
            Some(TopicKey::Seal { topic, partition })
        }
        _ => None,
    })
}

/// A sealed delta's value: each reviewer's terms (reviewer, then the
/// terms as a `u` record lays them out), in the order given (the service
/// sorts them by reviewer).
pub fn encode_topic_delta(rows: &[(Id, Terms)]) -> Vec<u8> {
    encode(&each(rows, |(voter, t)| (voter.as_str(), terms_layout(t))))
}

/// A sealed delta's row before format 12: reviewer, n, q, h.
type TopicRowL11 = (Id, u64, u128, u128);

/// A sealed delta's row of format 12: reviewer, terms.
type TopicRowL12 = (Id, TermsL12);

/// A sealed delta's row (format 13 on): reviewer, terms.
type TopicRowL = (Id, TermsL);

/// A sealed delta's rows; one of a format before 12 has no contract §15
/// sums (zero), one before 13 no pair counts.
pub fn decode_topic_delta(v: &[u8]) -> Result<Vec<(Id, Terms)>, FormatError> {
    let (format, bytes) = payload(v)?;
    let layout = |source| FormatError::Layout { format, source };
    match format {
        ..12 => {
            let rows: Vec<TopicRowL11> = postcard::from_bytes(bytes).map_err(layout)?;
            Ok(rows
                .into_iter()
                .map(|(voter, n, q, h)| (voter, Terms::noise(n, q, h)))
                .collect())
        }
        12 => {
            let rows: Vec<TopicRowL12> = postcard::from_bytes(bytes).map_err(layout)?;
            Ok(rows
                .into_iter()
                .map(|(voter, t)| (voter, terms_of_12(t)))
                .collect())
        }
        _ => {
            let rows: Vec<TopicRowL> = postcard::from_bytes(bytes).map_err(layout)?;
            Ok(rows
                .into_iter()
                .map(|(voter, t)| (voter, terms_of(t)))
                .collect())
        }
    }
}

/// A seal record's value: the newest epoch the partition has sealed.
pub fn encode_topic_seal(epoch: Epoch) -> Vec<u8> {
    encode(&epoch)
}

pub fn decode_topic_seal(v: &[u8]) -> Result<Epoch, FormatError> {
    decode(v)
}
