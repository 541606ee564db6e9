//! contract §14's records (formats 8 on): a series' open values as its
//! value holds them (formats 10 on), the `e` and `h` records of formats 8 and
//! 9 (still read), sealed deltas (with contract §15's sums from format 12,
//! its pair counts from format 13),
//! and the keys of all three.

use super::{decode, encode, payload, FormatError, SeriesIn};
use crate::engine::reputation::confusion::ConfusionTerms;
use crate::engine::reputation::pairs::PairRow;
use crate::engine::reputation::{Epoch, OpenKey, OpenValue, Terms, TermsKey};
use crate::engine::SeriesKey;
use crate::input::Id;
use crate::time::Nanos;

/// A series' open values as formats 10 and 11 store them, borrowed.
type OpenRef<'a> = Vec<(Epoch, &'a str, Nanos, Option<f64>)>;

/// A format-11 series value's layout bytes split: its open values
/// (borrowed) and its state's bytes. An empty sequence (one zero byte,
/// what most series values start with) is not decoded.
fn series_open_11(format: u8, bytes: &[u8]) -> Result<(OpenRef<'_>, &[u8]), FormatError> {
    match bytes.split_first() {
        Some((0, state)) => Ok((Vec::new(), state)),
        _ => postcard::take_from_bytes(bytes)
            .map_err(|source| FormatError::Layout { format, source }),
    }
}

/// A series value's parts: its format, its open values (borrowed; none
/// before format 10) and its state's bytes, which format 11 writes after
/// the open values and format 10 before them.
pub(super) struct SeriesParts<'a> {
    pub(super) format: u8,
    pub(super) open: OpenRef<'a>,
    pub(super) state: &'a [u8],
}

pub(super) fn series_parts(v: &[u8]) -> Result<SeriesParts<'_>, FormatError> {
    let (format, bytes) = payload(v)?;
    let layout = |source| FormatError::Layout { format, source };
    let (open, state) = match format {
        ..10 => (Vec::new(), bytes),
        10 => {
            let (_, rest) = postcard::take_from_bytes::<SeriesIn>(bytes).map_err(layout)?;
            let open = postcard::from_bytes(rest).map_err(layout)?;
            (open, &bytes[..bytes.len() - rest.len()])
        }
        _ => series_open_11(format, bytes)?,
    };
    Ok(SeriesParts {
        format,
        open,
        state,
    })
}

/// The epochs a series' value holds open values of (format 10 on; none
/// for an older value), the values borrowed: what a store derives its
/// local `j` index entries from.
pub fn series_open_epochs(v: &[u8]) -> Result<smallvec::SmallVec<[Epoch; 2]>, FormatError> {
    let mut epochs = smallvec::SmallVec::new();
    for (epoch, ..) in series_parts(v)?.open {
        if !epochs.contains(&epoch) {
            epochs.push(epoch);
        }
    }
    Ok(epochs)
}

/// Writes into `out` a series' value (format 10 on) without its open
/// values of the epochs up to `sealed`, if it holds any; `false` when
/// there is nothing to take out or the value is not a series of format 10
/// on (compaction keeps such a value as it is; a reader reports it). The
/// format byte and the state's bytes are kept as they are.
pub fn strip_sealed(v: &[u8], sealed: Epoch, out: &mut Vec<u8>) -> bool {
    let Ok(parts) = series_parts(v) else {
        return false;
    };
    if !parts.open.iter().any(|&(epoch, ..)| epoch <= sealed) {
        return false;
    }
    let kept: OpenRef<'_> = parts
        .open
        .into_iter()
        .filter(|&(epoch, ..)| epoch > sealed)
        .collect();
    let Ok(kept) = postcard::to_allocvec(&kept) else {
        return false;
    };
    out.clear();
    out.push(parts.format);
    if parts.format >= 11 {
        out.extend_from_slice(&kept);
        out.extend_from_slice(parts.state);
    } else {
        out.extend_from_slice(parts.state);
        out.extend_from_slice(&kept);
    }
    true
}

/// A series' open values: (epoch, reviewer, value) each.
pub type SeriesOpen = Vec<(Epoch, Id, OpenValue)>;

/// A series' open values of every epoch, as its value holds them (format
/// 10 on; `None` for an older value, whose values are in its `h` records).
pub fn decode_series_open(v: &[u8]) -> Result<Option<SeriesOpen>, FormatError> {
    let parts = series_parts(v)?;
    if parts.format < 10 {
        return Ok(None);
    }
    Ok(Some(
        parts
            .open
            .into_iter()
            .map(|(epoch, voter, timestamp, value)| {
                (epoch, voter.into(), OpenValue { timestamp, value })
            })
            .collect(),
    ))
}

/// An open value (contract §14): vote time, value (None: an abstention).
type OpenValueL = (Nanos, Option<f64>);

pub fn encode_open_value(v: &OpenValue) -> Vec<u8> {
    encode::<OpenValueL>(&(v.timestamp, v.value))
}

pub fn decode_open_value(v: &[u8]) -> Result<OpenValue, FormatError> {
    let (timestamp, value): OpenValueL = decode(v)?;
    Ok(OpenValue { timestamp, value })
}

/// A series' open values of an epoch (contract §14, format 9): each
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

/// A sealed delta of formats 8 to 11 (contract §14): n, q, h.
type TermsL11 = (u64, u128, u128);

/// Contract §15's sums in a sealed delta: c, p, a, b, c3, t3.
type ConfusionL = (u64, u128, u128, u128, u64, u128);

/// A sealed delta of format 12: n, q, h, then contract §15's sums.
pub(super) type TermsL12 = (u64, u128, u128, ConfusionL);

/// A sealed delta (format 13 on): format 12's, then the reviewer's pair
/// row, (partner, counts) sorted by partner.
pub(super) type TermsL = (u64, u128, u128, ConfusionL, Vec<(Id, [u64; 4])>);

/// [`TermsL`] borrowed, as it is written.
pub(super) type TermsRef<'a> = (u64, u128, u128, ConfusionL, &'a [(Id, [u64; 4])]);

pub(super) fn terms_layout(t: &Terms) -> TermsRef<'_> {
    let c = &t.confusion;
    (t.n, t.q, t.h, (c.c, c.p, c.a, c.b, c.c3, c.t3), &t.pairs.0)
}

pub(super) fn terms_of_12((n, q, h, (c, p, a, b, c3, t3)): TermsL12) -> Terms {
    Terms {
        n,
        q,
        h,
        confusion: ConfusionTerms { c, p, a, b, c3, t3 },
        pairs: PairRow::default(),
    }
}

/// A read row is put in order (a reader never trusts a stored order).
pub(super) fn terms_of((n, q, h, confusion, pairs): TermsL) -> Terms {
    Terms {
        pairs: PairRow::normalized(pairs),
        ..terms_of_12((n, q, h, confusion))
    }
}

pub fn encode_terms(t: &Terms) -> Vec<u8> {
    encode::<TermsRef<'_>>(&terms_layout(t))
}

/// A sealed delta; one of a format before 12 has no §15 sums (zero), one
/// before 13 no pair counts.
pub fn decode_terms(v: &[u8]) -> Result<Terms, FormatError> {
    let (format, bytes) = payload(v)?;
    let layout = |source| FormatError::Layout { format, source };
    match format {
        ..12 => {
            let (n, q, h): TermsL11 = postcard::from_bytes(bytes).map_err(layout)?;
            Ok(Terms::noise(n, q, h))
        }
        12 => postcard::from_bytes(bytes).map(terms_of_12).map_err(layout),
        _ => postcard::from_bytes(bytes).map(terms_of).map_err(layout),
    }
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
