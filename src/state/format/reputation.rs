//! SPEC §14's records (formats 8 to 10): a series' open values as its
//! value holds them (format 10), the `e` and `h` records of formats 8 and
//! 9 (still read), sealed deltas, and the keys of all three.

use super::{decode, encode, payload, FormatError, SeriesIn};
use crate::engine::reputation::{Epoch, OpenKey, OpenValue, Terms, TermsKey};
use crate::engine::SeriesKey;
use crate::input::Id;
use crate::time::Nanos;

/// A series' open values as format 10 stores them.
type SeriesOpenL = Vec<(Epoch, Id, Nanos, Option<f64>)>;

/// [`SeriesOpenL`], borrowed.
pub(super) type OpenRef<'a> = Vec<(Epoch, &'a str, Nanos, Option<f64>)>;

/// The epochs a series' value holds open values of (format 10 on; none
/// for an older value), the values borrowed: what a store derives its
/// local `j` index entries from.
pub fn series_open_epochs(v: &[u8]) -> Result<smallvec::SmallVec<[Epoch; 2]>, FormatError> {
    let (format, bytes) = payload(v)?;
    let mut epochs = smallvec::SmallVec::new();
    if format < 10 {
        return Ok(epochs);
    }
    let (_, open): (SeriesIn, OpenRef<'_>) =
        postcard::from_bytes(bytes).map_err(|source| FormatError::Layout { format, source })?;
    for (epoch, ..) in open {
        if !epochs.contains(&epoch) {
            epochs.push(epoch);
        }
    }
    Ok(epochs)
}

/// Writes into `out` a series' value (format 10 on) without its open
/// values of the epochs up to `sealed`, if it holds any; `false` when
/// there is nothing to take out or the value is not a format-10 series
/// (compaction keeps such a value as it is; a reader reports it). The
/// format byte and the state's bytes are kept as they are.
pub fn strip_sealed(v: &[u8], sealed: Epoch, out: &mut Vec<u8>) -> bool {
    let Ok((format, bytes)) = payload(v) else {
        return false;
    };
    if format < 10 {
        return false;
    }
    let Ok((_, rest)) = postcard::take_from_bytes::<SeriesIn>(bytes) else {
        return false;
    };
    let Ok(open) = postcard::from_bytes::<OpenRef<'_>>(rest) else {
        return false;
    };
    if !open.iter().any(|&(epoch, ..)| epoch <= sealed) {
        return false;
    }
    out.clear();
    out.extend_from_slice(&v[..v.len() - rest.len()]);
    let kept: OpenRef<'_> = open
        .into_iter()
        .filter(|&(epoch, ..)| epoch > sealed)
        .collect();
    match postcard::to_extend(&kept, std::mem::take(out)) {
        Ok(bytes) => {
            *out = bytes;
            true
        }
        Err(_) => false,
    }
}

/// A series' open values: (epoch, reviewer, value) each.
pub type SeriesOpen = Vec<(Epoch, Id, OpenValue)>;

/// A series' open values of every epoch, as its value holds them (format
/// 10 on; `None` for an older value, whose values are in its `h` records).
pub fn decode_series_open(v: &[u8]) -> Result<Option<SeriesOpen>, FormatError> {
    let (format, bytes) = payload(v)?;
    if format < 10 {
        return Ok(None);
    }
    let (_, open): (SeriesIn, SeriesOpenL) =
        postcard::from_bytes(bytes).map_err(|source| FormatError::Layout { format, source })?;
    Ok(Some(
        open.into_iter()
            .map(|(epoch, voter, timestamp, value)| (epoch, voter, OpenValue { timestamp, value }))
            .collect(),
    ))
}

/// An open value (SPEC §14): vote time, value (None: an abstention).
type OpenValueL = (Nanos, Option<f64>);

pub fn encode_open_value(v: &OpenValue) -> Vec<u8> {
    encode::<OpenValueL>(&(v.timestamp, v.value))
}

pub fn decode_open_value(v: &[u8]) -> Result<OpenValue, FormatError> {
    let (timestamp, value): OpenValueL = decode(v)?;
    Ok(OpenValue { timestamp, value })
}

/// A series' open values of an epoch (SPEC §14, format 9): each
/// reviewer's vote time and value.
type OpenUnitL = Vec<(Id, Nanos, Option<f64>)>;

/// An `h` record (format 9): the unit's values (`None` for a value of a
/// later format, which holds none).
pub fn decode_open_unit(v: &[u8]) -> Result<Option<Vec<(Id, OpenValue)>>, FormatError> {
    let (format, _) = payload(v)?;
    if format >= 10 {
        return Ok(None);
    }
    let unit: OpenUnitL = decode(v)?;
    Ok(Some(
        unit.into_iter()
            .map(|(voter, timestamp, value)| (voter, OpenValue { timestamp, value }))
            .collect(),
    ))
}

/// A sealed delta (SPEC §14): n, q, h.
type TermsL = (u64, u128, u128);

pub fn encode_terms(t: &Terms) -> Vec<u8> {
    encode::<TermsL>(&(t.n, t.q, t.h))
}

pub fn decode_terms(v: &[u8]) -> Result<Terms, FormatError> {
    let (n, q, h): TermsL = decode(v)?;
    Ok(Terms { n, q, h })
}

/// An open value's key after the kind byte: epoch, inference, rubric,
/// reviewer.
pub fn open_value_key(k: &OpenKey) -> Vec<u8> {
    let (epoch, series, voter) = k;
    let layout = (
        *epoch,
        &*series.inference_id,
        &*series.voter_prompt_id,
        &**voter,
    );
    postcard::to_allocvec(&layout).expect("postcard into a Vec")
}

/// An open unit's key after the kind byte: epoch, inference, rubric.
pub fn open_unit_key(epoch: Epoch, series: &SeriesKey) -> Vec<u8> {
    let layout = (epoch, &*series.inference_id, &*series.voter_prompt_id);
    postcard::to_allocvec(&layout).expect("postcard into a Vec")
}

pub fn parse_open_unit_key(bytes: &[u8]) -> Result<(Epoch, SeriesKey), postcard::Error> {
    let (epoch, inference_id, voter_prompt_id): (Epoch, Id, Id) = postcard::from_bytes(bytes)?;
    let series = SeriesKey {
        inference_id,
        voter_prompt_id,
    };
    Ok((epoch, series))
}

pub fn parse_open_value_key(bytes: &[u8]) -> Result<OpenKey, postcard::Error> {
    let (epoch, inference_id, voter_prompt_id, voter): (Epoch, Id, Id, Id) =
        postcard::from_bytes(bytes)?;
    let series = SeriesKey {
        inference_id,
        voter_prompt_id,
    };
    Ok((epoch, series, voter))
}

/// A sealed delta's key after the kind byte: rubric, epoch, reviewer.
pub fn terms_key(k: &TermsKey) -> Vec<u8> {
    let (rubric, epoch, voter) = k;
    postcard::to_allocvec(&(&**rubric, *epoch, &**voter)).expect("postcard into a Vec")
}

pub fn parse_terms_key(bytes: &[u8]) -> Result<TermsKey, postcard::Error> {
    postcard::from_bytes(bytes)
}
