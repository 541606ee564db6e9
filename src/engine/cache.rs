//! The engine's bounded cache of series states and vote identities (pure:
//! the shell loads what a vote needs from RocksDB before the vote, persists
//! what the engine changed, then asks the engine to evict).
//!
//! An entry is evictable when it is clean (persisted) and, for a series,
//! no open batch needs it. Eviction drops the least recently used entries
//! until the cache is at three quarters of its budget, so that a full cache
//! is not scanned again after every cycle.

use super::agreement::reviewer_bytes;
use super::memory::{block, id_block, prefetch, slot};
use super::reputation::{Epoch, OpenValue};
use super::{vote_identity, Engine, SeriesKey, SeriesState};
use crate::input::{Id, Vote};
use crate::time::Nanos;

/// What a vote needs in the cache before [`Engine::process`] and the cache
/// does not hold: the shell reads these from the state store and hands them
/// over with [`Engine::provide_series`] / [`Engine::provide_identity`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Wants {
    pub series: Option<SeriesKey>,
    pub identity: Option<u128>,
}

/// A cached series.
#[derive(Debug, Clone)]
pub(super) struct SeriesEntry {
    pub state: SeriesState,
    /// Seqs of this series' open batches (at most one per window; they
    /// need the state when they close, so they pin it in the cache). A
    /// vote finds its batch here: one series lookup per vote. Inline up to
    /// two (the open windows of a series are few: window + grace).
    pub open: smallvec::SmallVec<[u64; 2]>,
    /// Changed since the last drain.
    pub dirty: bool,
    /// contract §14 open values (modes `shadow` and `learned`).
    pub values: super::learn::Values,
    /// Tick of the last use (least recently used goes first).
    pub used: u64,
    /// The tick at which this series was created here, with nothing stored
    /// (0 if it was read from the store). A vote identity implies its
    /// series (an accepted vote creates the series in the same step, and
    /// both are written in the same cycle), so until an eviction of
    /// identities reaches this tick every identity of the series is in
    /// the cache, and a miss there needs no store read.
    pub born: u64,
}

/// A vote identity as a cache key: two words, so that a table slot is
/// aligned to 8 bytes (a `u128` key pads every slot to 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IdKey([u64; 2]);

impl std::hash::Hash for IdKey {
    /// One word: an identity is already an XXH3-128 hash.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0[1]);
    }
}

impl From<u128> for IdKey {
    fn from(id: u128) -> IdKey {
        IdKey([(id >> 64) as u64, id as u64])
    }
}

impl From<IdKey> for u128 {
    fn from(k: IdKey) -> u128 {
        (u128::from(k.0[0]) << 64) | u128::from(k.0[1])
    }
}

/// A cached vote identity: 16 bytes (the dirty flag is the top bit of the
/// last-use tick, which never reaches 2⁶³), so a slot is 32 with its key.
#[derive(Debug, Clone, Copy)]
pub(super) struct IdentityEntry {
    /// Vote time of the accepted vote.
    pub at: Nanos,
    used_dirty: u64,
}

const DIRTY: u64 = 1 << 63;

impl IdentityEntry {
    fn new(at: Nanos, tick: u64) -> IdentityEntry {
        IdentityEntry {
            at,
            used_dirty: tick,
        }
    }

    /// Tick of the last use (least recently used goes first).
    pub fn used(&self) -> u64 {
        self.used_dirty & !DIRTY
    }

    /// Changed since the last drain.
    pub fn dirty(&self) -> bool {
        self.used_dirty & DIRTY != 0
    }

    pub fn touch(&mut self, tick: u64) {
        self.used_dirty = (self.used_dirty & DIRTY) | tick;
    }

    /// Sets the dirty flag; returns what it was.
    pub fn set_dirty(&mut self, dirty: bool) -> bool {
        let was = self.dirty();
        self.used_dirty = self.used() | if dirty { DIRTY } else { 0 };
        was
    }
}

/// Approximate memory of a cached identity: its hash table slot.
pub(super) const IDENTITY_BYTES: usize = slot::<(IdKey, IdentityEntry)>();

/// Approximate memory of a cached series: its slot, its entry's heap
/// block, and the heap blocks of the key's two ids (shared with open
/// batches, counted here) and of the model id.
pub(super) fn series_bytes(inference_id: &Id, voter_prompt_id: &Id, s: &SeriesState) -> usize {
    slot::<(SeriesKey, Box<SeriesEntry>)>()
        + block(std::mem::size_of::<SeriesEntry>())
        + id_block(inference_id)
        + id_block(voter_prompt_id)
        + s.model_id.as_ref().map_or(0, id_block)
        + if s.companion_scores.is_empty() {
            0
        } else {
            block(8 * s.companion_scores.len())
        }
}

/// Approximate bytes of an identity's series and voter waiting to be drained.
pub(super) fn voter_bytes(key: &SeriesKey, voter: &Id) -> usize {
    // The entry (clones of the key and of the voter) and the record it
    // becomes.
    std::mem::size_of::<(SeriesKey, Id, Option<Option<f64>>)>()
        + id_block(&key.inference_id)
        + id_block(&key.voter_prompt_id)
        + id_block(voter)
        + 16
        + key.inference_id.len()
        + key.voter_prompt_id.len()
        + voter.len()
}

/// Shrinks a table that eviction left below the load [`slot`] counts
/// (7/16 of its slots, half its capacity), so that its memory stays within
/// what its entries are charged. Regrowing it later rehashes what is left,
/// a small cost next to the eviction that emptied it.
fn shrink<K: Eq + std::hash::Hash, V>(map: &mut rustc_hash::FxHashMap<K, V>) {
    if map.len() < map.capacity() / 2 {
        map.shrink_to_fit();
    }
}

/// The eviction target for a cache over `budget`.
pub(super) fn target(budget: usize) -> usize {
    budget - budget / 4
}

/// The `used` tick at or below which evictable entries go so that at least
/// `need` bytes are freed, from `(used, bytes)` of the evictable entries.
/// Least recently used first; ties at the cut all go (approximate LRU, in
/// one pass over a histogram instead of a sort).
pub(super) fn cutoff(candidates: &[(u64, usize)], need: usize) -> Option<u64> {
    if need == 0 || candidates.is_empty() {
        return None;
    }
    let lo = candidates.iter().map(|c| c.0).min().unwrap_or(0);
    let hi = candidates.iter().map(|c| c.0).max().unwrap_or(0);
    const BUCKETS: usize = 1024;
    // Rounded up, so that every tick up to `hi` falls in a bucket.
    let width = (hi - lo) / BUCKETS as u64 + 1;
    let mut bytes = [0usize; BUCKETS];
    for &(used, b) in candidates {
        bytes[((used - lo) / width) as usize] += b;
    }
    let mut freed = 0;
    for (i, b) in bytes.iter().enumerate() {
        freed += b;
        if freed >= need {
            // Every entry of bucket i has used < lo + (i + 1) * width.
            return Some(
                lo.saturating_add((i as u64 + 1).saturating_mul(width) - 1)
                    .min(hi),
            );
        }
    }
    Some(hi)
}

impl Engine {
    /// What `vote` needs loaded before [`Engine::process`].
    pub fn wants(&self, vote: &Vote) -> Wants {
        self.wants_with_identity(vote, vote_identity(vote))
    }

    /// [`Engine::wants`] for a vote whose [`vote_identity`] is known.
    pub fn wants_with_identity(&self, vote: &Vote, identity: u128) -> Wants {
        if self.complete {
            return Wants::default();
        }
        let key = SeriesKey {
            inference_id: vote.inference_id.clone(),
            voter_prompt_id: vote.voter_prompt_id.clone(),
        };
        let series = self.series.get(&key);
        let all_cached = series.is_some_and(|e| e.born > self.identity_cut);
        Wants {
            identity: (!all_cached && !self.dedupe.contains_key(&identity.into()))
                .then_some(identity),
            series: series.is_none().then_some(key),
        }
    }

    /// A stored series state (or `None`: the store has none), loaded on a
    /// miss. A cached entry wins: it may hold changes not yet persisted.
    pub fn provide_series(&mut self, key: SeriesKey, state: Option<SeriesState>) {
        let Some(state) = state else { return };
        if self.series.contains_key(&key) {
            return;
        }
        self.cache_bytes += series_bytes(&key.inference_id, &key.voter_prompt_id, &state);
        let values = self.unpark(&key);
        self.series.insert(
            key,
            Box::new(SeriesEntry {
                state,
                open: smallvec::SmallVec::new(),
                values,
                dirty: false,
                used: self.tick,
                born: 0,
            }),
        );
    }

    /// A stored vote identity's vote time (or `None`), loaded on a miss.
    pub fn provide_identity(&mut self, id: u128, at: Option<Nanos>) {
        let Some(at) = at else { return };
        if let std::collections::hash_map::Entry::Vacant(v) = self.dedupe.entry(id.into()) {
            self.cache_bytes += IDENTITY_BYTES;
            v.insert(IdentityEntry::new(at, self.tick));
        }
    }

    /// Approximate memory of the cached series and identities.
    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes
    }

    /// Cached series and identities.
    pub fn cached(&self) -> (usize, usize) {
        (self.series.len(), self.dedupe.len())
    }

    /// Changes not drained yet (series, batches, identities).
    pub fn pending_changes(&self) -> usize {
        self.dirty_series.len()
            + self.dirty_batches.len()
            + self.deleted_batches.len()
            + self.dirty_dedupe.len()
            + self.dirty_reviewers.len()
    }

    /// Drops the pending-change entries of batches opened and closed since
    /// the last drain (they will never reach the store), so that a shell
    /// that drains seldom (replay within its cache) keeps that list bounded
    /// by the open batches.
    pub fn forget_closed_batches(&mut self) {
        let batches = &self.batches;
        self.dirty_batches.retain(|seq| batches.contains_key(seq));
    }

    /// Whether nothing needs loading (see [`Engine::wants`]).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Evicts clean, unneeded entries, least recently used first, when the
    /// cache is over `budget` bytes. Call only once the changes drained so
    /// far are in the state store: an evicted entry is read back from there.
    pub fn evict(&mut self, budget: usize) {
        if self.cache_bytes <= budget {
            return;
        }
        let need = self.cache_bytes - target(budget);
        let mut candidates: Vec<(u64, usize)> = Vec::new();
        for (k, e) in &self.series {
            if !e.dirty && e.open.is_empty() {
                let b = series_bytes(&k.inference_id, &k.voter_prompt_id, &e.state);
                candidates.push((e.used, b));
            }
        }
        for e in self.dedupe.values() {
            if !e.dirty() {
                candidates.push((e.used(), IDENTITY_BYTES));
            }
        }
        for ((_, voter), e) in &self.reviewers {
            if e.delta.is_zero() {
                candidates.push((e.used, reviewer_bytes(voter)));
            }
        }
        let Some(cut) = cutoff(&candidates, need) else {
            return;
        };
        let mut freed = 0;
        let parked = &mut self.parked_values;
        let spare = &mut self.spare_values;
        self.series.retain(|k, e| {
            let keep = e.dirty || !e.open.is_empty() || e.used > cut;
            if !keep {
                freed += series_bytes(&k.inference_id, &k.voter_prompt_id, &e.state);
                super::learn::park(parked, spare, k, &mut e.values);
            }
            keep
        });
        let before = self.dedupe.len();
        self.dedupe.retain(|_, e| e.dirty() || e.used() > cut);
        if self.dedupe.len() < before {
            self.identity_cut = self.identity_cut.max(cut);
        }
        freed += (before - self.dedupe.len()) * IDENTITY_BYTES;
        self.reviewers.retain(|(_, voter), e| {
            let keep = !e.delta.is_zero() || e.used > cut;
            if !keep {
                freed += reviewer_bytes(voter);
            }
            keep
        });
        if freed > 0 {
            self.complete = false;
        }
        self.cache_bytes -= freed.min(self.cache_bytes);
        shrink(&mut self.series);
        shrink(&mut self.dedupe);
        shrink(&mut self.reviewers);
        if self.series.is_empty() && self.dedupe.is_empty() {
            self.cache_bytes = 0;
        }
    }

    pub(super) fn remember(&mut self, identity: u128, at: Nanos) {
        let tick = self.tick;
        let e = self.dedupe.entry(identity.into()).or_insert_with(|| {
            self.cache_bytes += IDENTITY_BYTES;
            IdentityEntry::new(at, tick)
        });
        if !e.dirty() && e.at != at {
            // A stored identity accepted again: its index entry goes.
            self.replaced_dedupe.entry(identity).or_insert(e.at);
        }
        e.at = at;
        e.touch(tick);
        if !e.set_dirty(true) {
            self.dirty_dedupe.push(identity);
        }
    }

    /// An accepted vote's series, in one lookup (the series table was most
    /// of the engine's hash lookups): created if new, its model set if it
    /// had none, its use tick, the vote counted as pending, and marked
    /// changed. Returns the seq of the series' open batch of the window
    /// starting at `window_start`, or a new seq that the series now lists
    /// (the caller opens that batch).
    pub(super) fn accept_into_series(
        &mut self,
        key: &SeriesKey,
        window_start: Nanos,
        model_id: Option<&str>,
        value: Option<(Epoch, &Id, OpenValue)>,
    ) -> u64 {
        let tick = self.tick;
        let Some(e) = self.series.get_mut(key) else {
            let seq = self.meta.take_batch_seq();
            self.meta_dirty = true;
            let mut state = SeriesState::new(model_id, &self.cfg);
            self.cache_bytes += series_bytes(&key.inference_id, &key.voter_prompt_id, &state);
            state.pending = 1;
            self.dirty_series.push(key.clone());
            // (Values parked for a series the store lacks: only when a
            // store was written by hand, but a unit must be whole.)
            let mut values = self.unpark(key);
            let noted =
                value.map(|(k, voter, v)| (k, self.spare_values.note(&mut values, k, voter, v)));
            self.series.insert(
                key.clone(),
                Box::new(SeriesEntry {
                    state,
                    open: smallvec::smallvec![seq],
                    values,
                    dirty: true,
                    used: tick,
                    born: tick,
                }),
            );
            if let Some((k, n)) = noted {
                self.noted(key, k, n);
            }
            return seq;
        };
        // The series' open values (contract §14) are an allocation of their
        // own, cold when a vote comes: their load starts now and overlaps
        // the batch's lookup, instead of following it.
        if value.is_some() {
            prefetch(e.values.as_ptr());
        }
        e.used = tick;
        e.state.pending += 1;
        if !std::mem::replace(&mut e.dirty, true) {
            self.dirty_series.push(key.clone());
        }
        let batches = &self.batches;
        let found = e.open.iter().copied().find(|seq| {
            batches
                .get(seq)
                .is_some_and(|b| b.key.window_start == window_start)
        });
        let seq = found.unwrap_or_else(|| {
            let seq = self.meta.take_batch_seq();
            self.meta_dirty = true;
            e.open.push(seq);
            seq
        });
        let noted =
            value.map(|(k, voter, v)| (k, self.spare_values.note(&mut e.values, k, voter, v)));
        if e.state.model_id.is_none() && model_id.is_some() {
            let before = self
                .cfg
                .query_index
                .then(|| super::board::placement(&key.voter_prompt_id, &e.state));
            e.state.model_id = model_id.map(Into::into);
            self.cache_bytes += e.state.model_id.as_ref().map_or(0, id_block);
            if let Some(before) = before {
                let after = super::board::placement(&key.voter_prompt_id, &e.state);
                self.move_on_board(before, after);
            }
        }
        if let Some((k, n)) = noted {
            self.noted(key, k, n);
        }
        seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoff_frees_the_least_recently_used_first() {
        let c: Vec<(u64, usize)> = (1..=100).map(|t| (t, 10)).collect();
        assert_eq!(cutoff(&c, 0), None);
        assert_eq!(cutoff(&[], 5), None);
        // 10 bytes each: freeing 95 bytes takes the 10 oldest.
        let cut = cutoff(&c, 95).unwrap();
        let freed: usize = c.iter().filter(|e| e.0 <= cut).map(|e| e.1).sum();
        assert!(freed >= 95, "freed {freed}");
        assert!(c.iter().any(|e| e.0 > cut), "newest entries stay");
        assert_eq!(cutoff(&c, 10_000), Some(100));
    }

    #[test]
    fn cutoff_handles_wide_tick_ranges() {
        let c = vec![(0u64, 8usize), (u64::MAX / 2, 8), (u64::MAX - 1, 8)];
        let cut = cutoff(&c, 8).unwrap();
        assert!(cut < u64::MAX / 2, "only the oldest goes: {cut}");
        assert_eq!(cutoff(&c, 24), Some(u64::MAX - 1));
    }

    #[test]
    fn cutoff_frees_what_is_needed_for_any_tick_range() {
        // Ranges just over the histogram's 1024 buckets once cut too early.
        for n in [5u64, 1024, 1025, 1500, 2047, 2048, 5000] {
            let c: Vec<(u64, usize)> = (1..=n).map(|t| (t, 10)).collect();
            for need in [
                10,
                10 * n as usize / 2,
                10 * n as usize - 10,
                10 * n as usize,
            ] {
                let cut = cutoff(&c, need).unwrap();
                let freed: usize = c.iter().filter(|e| e.0 <= cut).map(|e| e.1).sum();
                assert!(freed >= need, "n {n}: freed {freed} < {need}");
            }
        }
    }

    #[test]
    fn target_leaves_headroom() {
        assert_eq!(target(0), 0);
        assert_eq!(target(100), 75);
    }
}
