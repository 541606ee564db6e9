//! The stored format of state records, owned here and nowhere else: the
//! engine hands plain structs to the store and knows nothing of bytes.
//!
//! **Values.** Every value RocksDB or the changelog holds is either empty
//! (the key is the whole record: `t`, `v`) or starts with the number of
//! the format that wrote it ([`FORMAT`]), followed by the record's postcard
//! layout in that format. A reader picks the layout from that byte and
//! never guesses; a value whose byte it does not know is a corrupt record
//! (a newer build wrote it: formats only move forward, docs/decisions.md).
//! Local positions (`p` keys) are fixed 8-byte integers and carry no byte:
//! they are never sent anywhere, and `p:format` is what says how the rest
//! of a directory is stored.
//!
//! **Keys** never change layout: a new layout would be a new kind byte.
//! Batch (`b`) and leaderboard (`l`) keys are postcard of the fields below.
//!
//! **The service's records** (its cycle marker and outbox chunks, the
//! reputation topic's records) are laid out here too ([`service`]): the
//! service converts its types to these layouts and back, and nothing
//! outside `state` encodes a stored value. `tests.rs` checks the bytes of
//! every layout against `tests/fixtures/layouts/format-{FORMAT}.txt`: a
//! layout that changes without a new [`FORMAT`] fails it.
//!
//! **Changelog records** carry the format in a header ([`HEADER`]) as well;
//! a record without it was written by a build before format 7 (untagged,
//! read by [`super::legacy`]). A directory below format 7 is rewritten to
//! this format once, when it is opened ([`super::Store::open`]).
//!
//! Format history (each is still read): 1–3 the first series layout, 4 the
//! leaderboard and the series' `ambiguous`/`pending`, 5 agreement sums
//! and reviewers, `last_mean_vote` and companion scores, 6 the evidence and
//! the leaderboard's squares (all untagged, [`super::legacy`]); 7 the
//! format byte on every value, same layouts as 6; 8 contract §14's open values
//! (`e`), sealed deltas (`u`) and batches waiting at the barrier (`x`), the
//! layouts of 7 unchanged (a format-7 value is read as it is); 9 an
//! identity's value may carry its vote's series and voter (the store
//! derives the `v` voter keys from it, as it derives the `t` index, instead
//! of a record of their own), and a series' open values of an epoch are
//! one record (`h`) instead of one per reviewer (`e`, still read); 10 a
//! series' value ends with its open values of every epoch (the series is
//! written anyway in each cycle one of them changes), and the store
//! derives a local index of them (`j`, never sent) instead of `h` records
//! (format 9's still read while their series' value is older than 10, and
//! deleted at their epoch's seal); 11 an identity's value may end with its
//! vote's value (contract §14's open value, read back from the identities of
//! open epochs at a restore), and a series' value starts with the open
//! values it still carries (those the identities cannot say, and format
//! 10's until their seal; usually none: one byte), its state after them;
//! 12 a sealed delta (`u`, and the reputation topic's delta rows) carries
//! contract §15's sums after §14's (an older delta is read with them zero).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use thiserror::Error;

use crate::engine::agreement::{ReviewerStats, RubricSums};
use crate::engine::board::{BoardKey, BoardRow};
use crate::engine::reputation::{Epoch, OpenValue};
use crate::engine::score::Evidence;
use crate::engine::{Batch, BatchKey, Entry, Meta, Pending, SeriesKey, SeriesState, Voted};
use crate::input::Id;
use crate::time::Nanos;

mod reputation;
mod service;
#[cfg(test)]
mod tests;

pub use reputation::*;
use reputation::{series_parts, SeriesParts};
pub use service::*;

/// The format this build writes.
pub const FORMAT: u8 = 13;

/// The first format with the format byte; every value of 7 reads as 8.
pub const FIRST_TAGGED: u8 = 7;

/// Changelog record header naming the format of its value (ASCII decimal).
pub const HEADER: &str = "jurystream-format";

/// [`FORMAT`] as the header's value, in ASCII decimal, derived from it (a
/// format bump edits [`FORMAT`] only).
pub const HEADER_VALUE: &[u8] = &HEADER_DIGITS;

const HEADER_DIGITS: [u8; 2] = {
    assert!(FORMAT >= 10 && FORMAT < 100, "two decimal digits");
    [b'0' + FORMAT / 10, b'0' + FORMAT % 10]
};

/// A value this build cannot read.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("empty value where a record was expected")]
    Empty,
    #[error("written in format {0}, which this build does not know (written by a newer version?)")]
    Unknown(u8),
    #[error("does not match the format-{format} layout: {source}")]
    Layout {
        format: u8,
        #[source]
        source: postcard::Error,
    },
    #[error("identity value is not a 16-byte vote time (format 7 and 8) followed by a vote's series and voter (format 9) and value (format 11)")]
    Identity,
    #[error("changelog header {HEADER} = {0:?} is not a format this build knows")]
    Header(String),
    #[error("{what} code {code} is not one this build knows")]
    Code { what: &'static str, code: u8 },
}

/// A value in the current format: the format byte, then `layout`.
fn encode<T: Serialize + ?Sized>(layout: &T) -> Vec<u8> {
    // postcard only fails on writer errors, which a Vec never has.
    postcard::to_extend(layout, vec![FORMAT]).expect("postcard into a Vec")
}

/// The layout bytes of a stored value and the format that wrote them.
fn payload(v: &[u8]) -> Result<(u8, &[u8]), FormatError> {
    match v.split_first() {
        None => Err(FormatError::Empty),
        Some((&f, rest)) if (FIRST_TAGGED..=FORMAT).contains(&f) => Ok((f, rest)),
        Some((&f, _)) => Err(FormatError::Unknown(f)),
    }
}

fn decode<T: DeserializeOwned>(v: &[u8]) -> Result<T, FormatError> {
    let (format, bytes) = payload(v)?;
    postcard::from_bytes(bytes).map_err(|source| FormatError::Layout { format, source })
}

/// Whether a changelog record's headers say it is in a tagged format
/// (`Ok(true)`), or it predates them (`Ok(false)`, untagged: format ≤ 6).
pub fn changelog_is_tagged(header: Option<&[u8]>) -> Result<bool, FormatError> {
    let Some(h) = header else {
        return Ok(false);
    };
    // The formats with the format byte: FIRST_TAGGED up to this build's.
    let format = std::str::from_utf8(h)
        .ok()
        .filter(|t| !t.starts_with('0') && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u8>().ok())
        .filter(|f| (FIRST_TAGGED..=FORMAT).contains(f));
    match format {
        Some(_) => Ok(true),
        None => Err(FormatError::Header(String::from_utf8_lossy(h).into_owned())),
    }
}

// ---------------------------------------------------------------- layouts
//
// Format 7. Writes borrow the engine's structs (`…Out`); reads build them
// (`…In`). Postcard lays nested structs out inline, field after field.

#[derive(Serialize, Deserialize, Clone, Copy)]
pub(super) struct EvidenceL {
    pub v: f64,
    pub q: f64,
}

impl From<Evidence> for EvidenceL {
    fn from(e: Evidence) -> Self {
        EvidenceL { v: e.v, q: e.q }
    }
}

impl From<EvidenceL> for Evidence {
    fn from(e: EvidenceL) -> Self {
        Evidence { v: e.v, q: e.q }
    }
}

/// An iterator written as a postcard sequence, without collecting.
struct Seq<I>(I);

impl<I: ExactSizeIterator + Clone> Serialize for Seq<I>
where
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.clone())
    }
}

/// A slice written as a postcard sequence of `f(item)`, without collecting.
struct Each<'a, T, F>(&'a [T], F);

fn each<'a, T, U: Serialize, F: Fn(&'a T) -> U>(items: &'a [T], f: F) -> Each<'a, T, F> {
    Each(items, f)
}

impl<'a, T, U: Serialize, F: Fn(&'a T) -> U> Serialize for Each<'a, T, F> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(&self.1))
    }
}

#[derive(Serialize)]
struct SeriesOut<'a, E: Serialize> {
    model_id: Option<&'a str>,
    score: f64,
    last_vote_at: Option<Nanos>,
    update_seq: u64,
    abstentions: u64,
    votes: u64,
    ambiguous: bool,
    pending: u64,
    last_mean_vote: Option<f64>,
    companion_scores: &'a [f64],
    evidence: EvidenceL,
    companion_evidence: E,
}

/// The series layout of formats 6 and 7 (format 6 stored it untagged).
#[derive(Deserialize)]
pub(super) struct SeriesIn {
    pub model_id: Option<Id>,
    pub score: f64,
    pub last_vote_at: Option<Nanos>,
    pub update_seq: u64,
    pub abstentions: u64,
    pub votes: u64,
    pub ambiguous: bool,
    pub pending: u64,
    pub last_mean_vote: Option<f64>,
    pub companion_scores: Box<[f64]>,
    pub evidence: EvidenceL,
    pub companion_evidence: Box<[EvidenceL]>,
}

impl From<SeriesIn> for SeriesState {
    fn from(s: SeriesIn) -> SeriesState {
        SeriesState {
            model_id: s.model_id,
            score: s.score,
            last_vote_at: s.last_vote_at,
            update_seq: s.update_seq,
            abstentions: s.abstentions,
            votes: s.votes,
            ambiguous: s.ambiguous,
            pending: s.pending,
            last_mean_vote: s.last_mean_vote,
            companion_scores: s.companion_scores,
            evidence: s.evidence.into(),
            companion_evidence: s.companion_evidence.iter().map(|&e| e.into()).collect(),
        }
    }
}

/// A series' value (format 11): the open values it carries (contract §14;
/// see [`crate::engine::OpenValues`]), each (epoch, reviewer, vote time,
/// value), then its state.
pub fn encode_series<'a>(
    s: &SeriesState,
    open: impl ExactSizeIterator<Item = (Epoch, &'a Id, OpenValue)> + Clone,
) -> Vec<u8> {
    let state = SeriesOut {
        model_id: s.model_id.as_deref(),
        score: s.score,
        last_vote_at: s.last_vote_at,
        update_seq: s.update_seq,
        abstentions: s.abstentions,
        votes: s.votes,
        ambiguous: s.ambiguous,
        pending: s.pending,
        last_mean_vote: s.last_mean_vote,
        companion_scores: &s.companion_scores,
        evidence: s.evidence.into(),
        companion_evidence: each(&s.companion_evidence, |&e| EvidenceL::from(e)),
    };
    let open = Seq(open.map(|(epoch, voter, v)| (epoch, &**voter, v.timestamp, v.value)));
    encode(&(open, state))
}

pub fn decode_series(v: &[u8]) -> Result<SeriesState, FormatError> {
    // The open values are the engine's from its restore on (see
    // `decode_series_open`); read here, borrowed, so that the value is whole.
    let SeriesParts { format, state, .. } = series_parts(v)?;
    postcard::from_bytes::<SeriesIn>(state)
        .map(Into::into)
        .map_err(|source| FormatError::Layout { format, source })
}

#[derive(Serialize)]
struct EntryOut<'a> {
    voter_id: &'a str,
    vote_id: &'a str,
    value: Option<f64>,
    weight: f64,
    timestamp: Nanos,
    inference_time: Option<Nanos>,
    live: bool,
}

#[derive(Deserialize)]
struct EntryIn {
    voter_id: Id,
    vote_id: Id,
    value: Option<f64>,
    weight: f64,
    timestamp: Nanos,
    inference_time: Option<Nanos>,
    live: bool,
}

pub fn encode_batch(b: &Batch) -> Vec<u8> {
    encode(&(entries_out(b), b.counted))
}

pub fn decode_batch(v: &[u8]) -> Result<Batch, FormatError> {
    let (entries, counted): (Vec<EntryIn>, u32) = decode(v)?;
    Ok(Batch::stored(entries_in(entries), counted))
}

fn entries_out(b: &Batch) -> impl Serialize + '_ {
    each(&b.entries, |e| EntryOut {
        voter_id: &e.voter_id,
        vote_id: &e.vote_id,
        value: e.value,
        weight: e.weight,
        timestamp: e.timestamp,
        inference_time: e.inference_time,
        live: e.live,
    })
}

/// A batch waiting at the barrier (contract §14): its key's fields, its
/// entries and counted votes, its series' model id when it closed.
pub fn encode_pending(p: &Pending) -> Vec<u8> {
    let k = &p.key;
    encode(&(
        k.window_start,
        &*k.series.inference_id,
        &*k.series.voter_prompt_id,
        k.seq,
        entries_out(&p.batch),
        p.batch.counted,
        p.model_id.as_deref(),
    ))
}

type PendingL = (Nanos, Id, Id, u64, Vec<EntryIn>, u32, Option<Id>);

pub fn decode_pending(v: &[u8]) -> Result<Pending, FormatError> {
    let (window_start, inference_id, voter_prompt_id, seq, entries, counted, model_id): PendingL =
        decode(v)?;
    Ok(Pending {
        key: BatchKey {
            window_start,
            series: SeriesKey {
                inference_id,
                voter_prompt_id,
            },
            seq,
        },
        batch: Batch::stored(entries_in(entries), counted),
        model_id,
    })
}

fn entries_in(entries: Vec<EntryIn>) -> Vec<Entry> {
    entries
        .into_iter()
        .map(|e| Entry {
            voter_id: e.voter_id,
            vote_id: e.vote_id,
            value: e.value,
            weight: e.weight,
            timestamp: e.timestamp,
            inference_time: e.inference_time,
            live: e.live,
        })
        .collect()
}

/// `Meta`: (watermark, next batch seq, an unused time kept for the layout).
type MetaL = (Option<Nanos>, u64, Option<Nanos>);

pub fn encode_meta(m: &Meta) -> Vec<u8> {
    encode::<MetaL>(&(m.watermark, m.next_batch_seq, m.swept_before))
}

pub fn decode_meta(v: &[u8]) -> Result<Meta, FormatError> {
    let (watermark, next_batch_seq, swept_before): MetaL = decode(v)?;
    Ok(Meta {
        watermark,
        next_batch_seq,
        swept_before,
    })
}

/// A vote identity's value: its vote time (16 bytes, little-endian), then
/// (format 9, when the vote's series keeps its voters) the vote's
/// inference, rubric and voter, then (format 11, when contract §14 collects)
/// its value (postcard `Option<f64>`).
pub fn encode_identity(at: Nanos, voted: Option<Voted<'_>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        17 + voted.map_or(0, |v| {
            12 + v.series.inference_id.len() + v.series.voter_prompt_id.len() + v.voter.len()
        }),
    );
    out.push(FORMAT);
    out.extend_from_slice(&at.to_le_bytes());
    let Some(v) = voted else {
        return out;
    };
    let k = v.series;
    let out = postcard::to_extend(&(&*k.inference_id, &*k.voter_prompt_id, v.voter), out);
    match v.open {
        None => out,
        Some(value) => out.and_then(|out| postcard::to_extend(&value, out)),
    }
    .expect("postcard into a Vec")
}

/// The vote time and the rest of an identity's value.
fn identity_parts(v: &[u8]) -> Result<(u8, Nanos, &[u8]), FormatError> {
    let (format, bytes) = payload(v)?;
    let (at, rest) = bytes
        .split_first_chunk::<16>()
        .ok_or(FormatError::Identity)?;
    if format < 9 && !rest.is_empty() {
        return Err(FormatError::Identity);
    }
    Ok((format, Nanos::from_le_bytes(*at), rest))
}

pub fn decode_identity(v: &[u8]) -> Result<Nanos, FormatError> {
    identity_parts(v).map(|(_, at, _)| at)
}

/// The series and voter an identity's value carries (format 9 on; `None`
/// for older values, whose voters have `v` records of their own).
pub fn decode_identity_voter(v: &[u8]) -> Result<Option<(SeriesKey, Id)>, FormatError> {
    Ok(decode_identity_vote(v)?.map(|(series, voter, _)| (series, voter)))
}

/// The series, voter and value an identity's value carries: the series
/// and voter from format 9 on, the value (contract §14's open value, `Some`)
/// from format 11 on when the mode collected it.
#[allow(clippy::type_complexity)]
pub fn decode_identity_vote(
    v: &[u8],
) -> Result<Option<(SeriesKey, Id, Option<Option<f64>>)>, FormatError> {
    let (format, _, rest) = identity_parts(v)?;
    if rest.is_empty() {
        return Ok(None);
    }
    let layout = |source| FormatError::Layout { format, source };
    let ((inference_id, voter_prompt_id, voter), rest): ((Id, Id, Id), _) =
        postcard::take_from_bytes(rest).map_err(layout)?;
    let open = if rest.is_empty() || format < 11 {
        None
    } else {
        Some(postcard::from_bytes::<Option<f64>>(rest).map_err(layout)?)
    };
    let series = SeriesKey {
        inference_id,
        voter_prompt_id,
    };
    Ok(Some((series, voter, open)))
}

/// `BoardRow`: series, Σ score, ambiguous, votes, Σ score².
pub(super) type BoardRowL = (u64, i128, u64, u64, i128);

pub(super) fn board_row(l: BoardRowL) -> BoardRow {
    let (series, score_sum, ambiguous, votes, score_squares) = l;
    BoardRow {
        series,
        score_sum,
        ambiguous,
        votes,
        score_squares,
    }
}

pub fn encode_board_row(r: &BoardRow) -> Vec<u8> {
    encode::<BoardRowL>(&(r.series, r.score_sum, r.ambiguous, r.votes, r.score_squares))
}

pub fn decode_board_row(v: &[u8]) -> Result<BoardRow, FormatError> {
    decode(v).map(board_row)
}

/// `RubricSums`: units, pairable, Σ v, Σ v², within.
type RubricSumsL = (u64, u64, i128, i128, i128);

pub fn encode_rubric_sums(s: &RubricSums) -> Vec<u8> {
    encode::<RubricSumsL>(&(s.units, s.pairable, s.sum, s.square_sum, s.within))
}

pub fn decode_rubric_sums(v: &[u8]) -> Result<RubricSums, FormatError> {
    let (units, pairable, sum, square_sum, within): RubricSumsL = decode(v)?;
    Ok(RubricSums {
        units,
        pairable,
        sum,
        square_sum,
        within,
    })
}

/// `ReviewerStats`: rated, Σ squared deviation.
type ReviewerL = (u64, i128);

pub fn encode_reviewer(r: &ReviewerStats) -> Vec<u8> {
    encode::<ReviewerL>(&(r.rated, r.sq_dev))
}

pub fn decode_reviewer(v: &[u8]) -> Result<ReviewerStats, FormatError> {
    let (rated, sq_dev): ReviewerL = decode(v)?;
    Ok(ReviewerStats { rated, sq_dev })
}

/// Where the identity sweep got to: a `t` key.
pub fn encode_sweep(t_key: &[u8]) -> Vec<u8> {
    [&[FORMAT][..], t_key].concat()
}

pub fn decode_sweep(v: &[u8]) -> Result<Vec<u8>, FormatError> {
    payload(v).map(|(_, k)| k.to_vec())
}

// ------------------------------------------------------------------- keys

/// A batch key's bytes after the kind byte: window start, series, seq.
pub fn batch_key(k: &BatchKey) -> Vec<u8> {
    let layout = (
        k.window_start,
        &*k.series.inference_id,
        &*k.series.voter_prompt_id,
        k.seq,
    );
    postcard::to_allocvec(&layout).expect("postcard into a Vec")
}

pub fn parse_batch_key(bytes: &[u8]) -> Result<BatchKey, postcard::Error> {
    let (window_start, inference_id, voter_prompt_id, seq): (Nanos, Id, Id, u64) =
        postcard::from_bytes(bytes)?;
    Ok(BatchKey {
        window_start,
        series: SeriesKey {
            inference_id,
            voter_prompt_id,
        },
        seq,
    })
}

/// A leaderboard key's bytes after the kind byte: model, rubric.
pub fn board_key(k: &BoardKey) -> Vec<u8> {
    postcard::to_allocvec(&(k.model_id.as_deref(), &*k.voter_prompt_id))
        .expect("postcard into a Vec")
}

pub fn parse_board_key(bytes: &[u8]) -> Result<BoardKey, postcard::Error> {
    let (model_id, voter_prompt_id): (Option<Id>, Id) = postcard::from_bytes(bytes)?;
    Ok(BoardKey {
        model_id,
        voter_prompt_id,
    })
}
