//! The key layout (see the module above) and the encoding of records:
//! how engine changes become keys and values, and back.

use rocksdb::WriteBatch;

use super::Record;
use crate::engine::{
    Change, SeriesKey, SeriesState, SeriesStateV1, SeriesStateV4, SeriesStateV5, SeriesStateV6,
};
use crate::time::Nanos;

pub const META_KEY: &[u8] = b"m";

/// Where the identity sweep got to (a `t` key; see [`super::Store::sweep`]), so
/// that a new process does not walk the tombstones of earlier sweeps.
pub(super) const SWEEP_KEY: &[u8] = b"w";

/// Serialises a value the way every state record is stored.
pub fn encode_value<T: serde::Serialize>(v: &T) -> Vec<u8> {
    enc(v)
}

pub(super) fn series_key_bytes(k: &SeriesKey) -> Vec<u8> {
    let inf = k.inference_id.as_bytes();
    let mut out = Vec::with_capacity(5 + inf.len() + k.voter_prompt_id.len());
    out.push(b's');
    out.extend_from_slice(&(inf.len() as u32).to_be_bytes());
    out.extend_from_slice(inf);
    out.extend_from_slice(k.voter_prompt_id.as_bytes());
    out
}

pub(super) fn series_prefix(inference_id: &str) -> Vec<u8> {
    let inf = inference_id.as_bytes();
    let mut out = Vec::with_capacity(5 + inf.len());
    out.push(b's');
    out.extend_from_slice(&(inf.len() as u32).to_be_bytes());
    out.extend_from_slice(inf);
    out
}

/// The prefix extractor's domain: series (`s`) and voter (`v`) keys, whose
/// prefix is the kind byte, the id's length and the inference id.
pub(super) fn inference_prefix_len(key: &[u8]) -> Option<usize> {
    if !matches!(key.first(), Some(b's' | b'v')) {
        return None;
    }
    let len = u32::from_be_bytes(key.get(1..5)?.try_into().ok()?) as usize;
    let end = 5usize.checked_add(len)?;
    (end <= key.len()).then_some(end)
}

pub(super) fn inference_prefix(key: &[u8]) -> &[u8] {
    &key[..inference_prefix_len(key).unwrap_or(key.len())]
}

pub(super) fn in_inference_domain(key: &[u8]) -> bool {
    inference_prefix_len(key).is_some()
}

/// The smallest key after every key starting with `prefix` (None: there is
/// none, the prefix is all 0xff).
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// `v` key prefix of a series' voters.
pub(super) fn voter_prefix(k: &SeriesKey) -> Vec<u8> {
    let (inf, vp) = (k.inference_id.as_bytes(), k.voter_prompt_id.as_bytes());
    let mut out = Vec::with_capacity(9 + inf.len() + vp.len());
    out.push(b'v');
    out.extend_from_slice(&(inf.len() as u32).to_be_bytes());
    out.extend_from_slice(inf);
    out.extend_from_slice(&(vp.len() as u32).to_be_bytes());
    out.extend_from_slice(vp);
    out
}

/// A stored series state, in the current layout or an older one: before
/// `evidence`, before `companion_scores`, before `last_mean_vote`, before `ambiguous` and
/// `pending` (format ≤ 3). Postcard has no optional trailing fields, so an
/// old layout fails to decode as a newer one.
pub fn decode_series(v: &[u8]) -> Result<SeriesState, postcard::Error> {
    // postcard is not self-describing: an older, shorter record fails to
    // decode as a newer layout (it ends early), so the newest goes first.
    postcard::from_bytes::<SeriesState>(v)
        .or_else(|_| postcard::from_bytes::<SeriesStateV6>(v).map(SeriesState::from))
        .or_else(|_| postcard::from_bytes::<SeriesStateV5>(v).map(SeriesState::from))
        .or_else(|_| postcard::from_bytes::<SeriesStateV4>(v).map(SeriesState::from))
        .or_else(|_| postcard::from_bytes::<SeriesStateV1>(v).map(SeriesState::from))
}

pub(super) fn parse_series_key(key: &[u8]) -> Option<SeriesKey> {
    let len = u32::from_be_bytes(key.get(1..5)?.try_into().ok()?) as usize;
    let inf = std::str::from_utf8(key.get(5..5 + len)?).ok()?;
    let vp = std::str::from_utf8(key.get(5 + len..)?).ok()?;
    Some(SeriesKey {
        inference_id: inf.into(),
        voter_prompt_id: vp.into(),
    })
}

pub(super) fn identity_key(id: u128) -> Vec<u8> {
    let mut key = Vec::with_capacity(17);
    key.push(b'd');
    key.extend_from_slice(&id.to_be_bytes());
    key
}

/// `t` key of an identity: vote time in an order-preserving form (sign bit
/// flipped, big-endian), then the identity.
pub(super) fn time_index_key(at: Nanos, id: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(33);
    key.push(b't');
    key.extend_from_slice(&((at as u128) ^ (1 << 127)).to_be_bytes());
    key.extend_from_slice(id);
    key
}

pub(super) fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // postcard only fails on writer errors, which a Vec never has.
    postcard::to_allocvec(v).unwrap_or_default()
}

/// A record to write: key, and value (`None`: a delete).
pub(super) type Put<'a> = (&'a [u8], Option<&'a [u8]>);

/// Sorts `puts` by key (stable: of a key written twice the last write
/// wins) and returns the earliest identity index entry put (a `t` key;
/// for `Store::write_lowering`). RocksDB's memtable inserts a run of
/// ascending keys next to one another instead of each from the top of its
/// skip list: with the identities' random keys, that was most of the cost
/// of a write.
pub(super) fn sort_puts(puts: &mut [Put<'_>]) -> Option<Vec<u8>> {
    puts.sort_by(|a, b| a.0.cmp(b.0));
    puts.iter()
        .find(|(k, v)| k.first() == Some(&b't') && v.is_some())
        .map(|(k, _)| k.to_vec())
}

pub(super) fn put_all(wb: &mut WriteBatch, puts: &[Put<'_>]) {
    for &(k, v) in puts {
        match v {
            Some(v) => wb.put(k, v),
            None => wb.delete(k),
        }
    }
}

/// The records of one change, appended to `out`.
pub(super) fn encode_change(c: Change<'_>, out: &mut Vec<Record>) {
    let record = match c {
        Change::Series(k, s) => (series_key_bytes(k), Some(enc(s))),
        Change::Batch(k, b) => {
            let mut key = vec![b'b'];
            key.extend_from_slice(&enc(k));
            (key, b.map(enc))
        }
        Change::Dedupe(id, at, replaced) => {
            let key = identity_key(id);
            if let Some(old) = replaced {
                // Before the put: the same vote time indexes it again.
                out.push((time_index_key(old, &key[1..]), None));
            }
            (key, Some(at.to_le_bytes().to_vec()))
        }
        Change::Meta(m) => (META_KEY.to_vec(), Some(enc(m))),
        Change::Voter(k, voter) => {
            let mut key = voter_prefix(k);
            key.extend_from_slice(voter.as_bytes());
            (key, Some(Vec::new()))
        }
        Change::Board(k, row) => {
            let mut key = vec![b'l'];
            key.extend_from_slice(&enc(k));
            (key, row.map(enc))
        }
        Change::Agreement(rubric, sums) => {
            ([&b"g"[..], rubric.as_bytes()].concat(), Some(enc(sums)))
        }
        Change::Reviewer((rubric, voter), stats) => (reviewer_key(rubric, voter), Some(enc(stats))),
    };
    out.push(record);
}

/// `r` key prefix of a rubric's reviewers.
pub(super) fn reviewer_prefix(rubric: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + rubric.len() + 16);
    out.push(b'r');
    out.extend_from_slice(&(rubric.len() as u32).to_be_bytes());
    out.extend_from_slice(rubric.as_bytes());
    out
}

/// `r` key of one reviewer of a rubric.
pub(super) fn reviewer_key(rubric: &str, voter_id: &str) -> Vec<u8> {
    let mut key = reviewer_prefix(rubric);
    key.extend_from_slice(voter_id.as_bytes());
    key
}

pub(super) fn position_key(name: &str) -> Vec<u8> {
    let mut key = vec![b'p'];
    key.extend_from_slice(name.as_bytes());
    key
}
