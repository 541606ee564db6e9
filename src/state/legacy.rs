//! Formats 1–6, which stored values without a format byte: read only to
//! bring them to the current format ([`super::format`]), when a directory
//! of an earlier build is opened and when a changelog record without the
//! format header is restored. Nothing writes them.
//!
//! Every value kind kept its layout through these formats but two:
//! - the series (`s`) grew fields at the end (formats 4, 5 and 6); postcard
//!   is not self-describing and a longer layout fails on a shorter record
//!   (it ends early), so the layouts are tried newest first. This is the
//!   only place a layout is guessed, and only for records that have no
//!   format byte to say;
//! - the leaderboard row (`l`) gained its sum of squares in format 6; an
//!   older row gets [`SQUARES_UNKNOWN`], and the partition's rows are
//!   rebuilt from its series when they are loaded.

use serde::Deserialize;

use super::format::{self, FormatError, SeriesIn};
use crate::engine::board::BoardRow;
use crate::engine::score::Evidence;
use crate::engine::SeriesState;
use crate::input::Id;
use crate::time::Nanos;

/// `score_squares` of a leaderboard row stored before format 6 (a sum of
/// squares is never negative): the rows are rebuilt from the series.
pub const SQUARES_UNKNOWN: i128 = -1;

/// The current-format value of an untagged record (formats 1–6) under
/// `key`. An empty value stays empty (the key is the record).
pub fn upgrade(key: &[u8], value: &[u8]) -> Result<Vec<u8>, FormatError> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    let layout = |source| FormatError::Layout { format: 6, source };
    Ok(match key.first() {
        Some(b's') => format::encode_series(&series(value).map_err(layout)?, std::iter::empty()),
        Some(b'l') => format::encode_board_row(&board_row(value).map_err(layout)?),
        Some(b'd') => format::encode_identity(
            Nanos::from_le_bytes(value.try_into().map_err(|_| FormatError::Identity)?),
            None,
        ),
        // Meta, batches, agreement sums, reviewers, the sweep's key, the
        // service's cycle marker and outbox: same layout, now tagged.
        _ => [&[format::FORMAT][..], value].concat(),
    })
}

/// Series as stored before the query API (formats 1–3).
#[derive(Deserialize)]
struct SeriesV1 {
    model_id: Option<Id>,
    score: f64,
    last_vote_at: Option<Nanos>,
    update_seq: u64,
    abstentions: u64,
    votes: u64,
}

/// Format 4: then `ambiguous` and `pending`.
#[derive(Deserialize)]
struct SeriesV4 {
    v1: SeriesV1,
    ambiguous: bool,
    pending: u64,
}

/// Format 5, first layout: then `last_mean_vote`.
#[derive(Deserialize)]
struct SeriesV5 {
    v4: SeriesV4,
    last_mean_vote: Option<f64>,
}

/// Format 5, second layout: then `companion_scores`.
#[derive(Deserialize)]
struct SeriesV5b {
    v5: SeriesV5,
    companion_scores: Box<[f64]>,
}

/// An untagged series record in any of its layouts.
fn series(v: &[u8]) -> Result<SeriesState, postcard::Error> {
    if let Ok(s) = postcard::from_bytes::<SeriesIn>(v) {
        return Ok(s.into());
    }
    let (v5, companion_scores) = match postcard::from_bytes::<SeriesV5b>(v) {
        Ok(s) => (s.v5, s.companion_scores),
        Err(_) => match postcard::from_bytes::<SeriesV5>(v) {
            Ok(s) => (s, Box::default()),
            Err(_) => {
                let v4 = postcard::from_bytes::<SeriesV4>(v).or_else(|_| {
                    postcard::from_bytes::<SeriesV1>(v).map(|v1| SeriesV4 {
                        v1,
                        ambiguous: false,
                        pending: 0,
                    })
                })?;
                let v5 = SeriesV5 {
                    v4,
                    last_mean_vote: None,
                };
                (v5, Box::default())
            }
        },
    };
    let SeriesV5 { v4, last_mean_vote } = v5;
    let SeriesV4 {
        v1,
        ambiguous,
        pending,
    } = v4;
    Ok(SeriesState {
        model_id: v1.model_id,
        score: v1.score,
        last_vote_at: v1.last_vote_at,
        update_seq: v1.update_seq,
        abstentions: v1.abstentions,
        votes: v1.votes,
        ambiguous,
        pending,
        last_mean_vote,
        companion_scores,
        evidence: upgraded_evidence(v1.update_seq),
        companion_evidence: Box::default(),
    })
}

/// The evidence of a series stored before it was kept (format ≤ 5): none
/// before its first update; after one, the score taken as all votes and as
/// one vote's worth (V = Q = 1), so its interval is as wide as a single
/// vote's until new batches add to it (docs/decisions.md).
fn upgraded_evidence(update_seq: u64) -> Evidence {
    if update_seq == 0 {
        Evidence::default()
    } else {
        Evidence { v: 1.0, q: 1.0 }
    }
}

/// An untagged leaderboard row: format 6's, or the one before squares.
fn board_row(v: &[u8]) -> Result<BoardRow, postcard::Error> {
    type V5 = (u64, i128, u64, u64);
    postcard::from_bytes::<format::BoardRowL>(v)
        .or_else(|_| {
            postcard::from_bytes::<V5>(v).map(|(s, sum, a, n)| (s, sum, a, n, SQUARES_UNKNOWN))
        })
        .map(format::board_row)
}
