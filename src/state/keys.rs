//! The key layout (see the module above) and the encoding of records:
//! how engine changes become keys and values, and back.

use rocksdb::WriteBatch;

use super::format;
use super::Record;
use crate::engine::reputation::Epoch;
use crate::engine::{Change, SeriesKey};
use crate::time::Nanos;

pub const META_KEY: &[u8] = b"m";

/// Where the identity sweep got to (a `t` key; see [`super::Store::sweep`]), so
/// that a new process does not walk the tombstones of earlier sweeps.
pub(super) const SWEEP_KEY: &[u8] = b"w";

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

/// `v` key of a series' voter (the key is the record: its value is
/// empty). Format 9 on, it is derived from the identity records that carry
/// their vote's series and voter.
pub(super) fn voter_key(k: &SeriesKey, voter: &str) -> Vec<u8> {
    let mut key = voter_prefix(k);
    key.extend_from_slice(voter.as_bytes());
    key
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

/// `b` key of an open batch.
pub(super) fn batch_key(k: &crate::engine::BatchKey) -> Vec<u8> {
    [&b"b"[..], &format::batch_key(k)].concat()
}

/// `l` key of a leaderboard row.
pub(super) fn board_key(k: &crate::engine::board::BoardKey) -> Vec<u8> {
    [&b"l"[..], &format::board_key(k)].concat()
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
        Change::Series(k, s, open) => (
            series_key_bytes(k),
            Some(format::encode_series(s, open.iter())),
        ),
        Change::Batch(k, b) => (batch_key(k), b.map(format::encode_batch)),
        Change::Dedupe(id, at, replaced, voter) => {
            let key = identity_key(id);
            if let Some(old) = replaced {
                // Before the put: the same vote time indexes it again.
                out.push((time_index_key(old, &key[1..]), None));
            }
            (key, Some(format::encode_identity(at, voter)))
        }
        Change::Meta(m) => (META_KEY.to_vec(), Some(format::encode_meta(m))),
        Change::Board(k, row) => (board_key(k), row.map(format::encode_board_row)),
        Change::Agreement(rubric, sums) => (
            [&b"g"[..], rubric.as_bytes()].concat(),
            Some(format::encode_rubric_sums(sums)),
        ),
        Change::Reviewer((rubric, voter), stats) => (
            reviewer_key(rubric, voter),
            Some(format::encode_reviewer(stats)),
        ),
        Change::OpenUnitGone(epoch, series) => (
            [&b"h"[..], &format::open_unit_key(epoch, series)].concat(),
            None,
        ),
        Change::OpenValueGone(k) => ([&b"e"[..], &format::open_value_key(k)].concat(), None),
        Change::Terms(k, t) => (
            [&b"u"[..], &format::terms_key(k)].concat(),
            Some(format::encode_terms(t)),
        ),
        Change::Pending(order, p) => (pending_key(order), p.map(format::encode_pending)),
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

/// `j` key: a series (by its `s` key) holds open values of `epoch`
/// (contract §14). Local, like `t`: derived from the series' value by whoever
/// applies it. The epoch comes first, order-preserving (sign bit flipped,
/// big-endian), so that a seal deletes an epoch's entries as one range.
pub(super) fn open_index_key(epoch: Epoch, series_key: &[u8]) -> Vec<u8> {
    let mut key = open_index_from(epoch);
    key.extend_from_slice(&series_key[1..]);
    key
}

/// The first `j` key of `epoch`: every entry of an older epoch is before it.
pub(super) fn open_index_from(epoch: Epoch) -> Vec<u8> {
    let mut key = Vec::with_capacity(17);
    key.push(b'j');
    key.extend_from_slice(&((epoch as u128) ^ (1 << 127)).to_be_bytes());
    key
}

/// A `j` key's epoch and series.
pub(super) fn parse_open_index_key(key: &[u8]) -> Option<(Epoch, SeriesKey)> {
    let epoch = u128::from_be_bytes(key.get(1..17)?.try_into().ok()?) ^ (1 << 127);
    let series = parse_series_key(&[&b"s"[..], key.get(17..)?].concat())?;
    Some((epoch as Epoch, series))
}

/// `x` key of a batch waiting at the barrier: its place in the close order.
pub(super) fn pending_key(order: u64) -> Vec<u8> {
    [&b"x"[..], &order.to_be_bytes()].concat()
}

pub(super) fn position_key(name: &str) -> Vec<u8> {
    let mut key = vec![b'p'];
    key.extend_from_slice(name.as_bytes());
    key
}
