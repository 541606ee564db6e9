//! The engine's side of contract §14: each open epoch's values, sealing as the
//! watermark passes an epoch, the tables a batch is scored with, and the
//! changes to persist. The math is `reputation.rs`'s.

use std::sync::Arc;

use super::memory::prefetch;
use super::reputation::{self, Table};
use super::*;

mod held;
pub(super) use held::OpenSlot;
pub use held::{Held, InSeries, OpenFold, OpenValues};

/// A cached series' open values: (epoch, reviewer, value).
pub(super) type Values = Vec<(Epoch, Id, OpenSlot)>;

/// The values a series' first one makes room for.
const UNIT_CAPACITY: usize = 6;

/// A series' open values of one epoch: (reviewer, value).
pub(super) type Unit = Vec<(Id, OpenSlot)>;

/// A seal looks up this many series before it seals them.
const SEAL_AHEAD: usize = 16;

/// What [`Spare::note`] did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Noted {
    /// A value for a reviewer the series had none of in the epoch.
    added: bool,
    /// The series' first value of the epoch.
    first: bool,
}

/// Emptied value vectors, kept for series' next values. A seal empties
/// an epoch's worth of them and the next epoch's first votes need as many
/// again; allocated and freed each time, with mimalloc returning freed
/// pages at once (`allocator.rs`), that round trip was page faults and
/// TLB flushes, about 6 % of a `shadow` replay's engine thread. Never more
/// than the series of the last epoch sealed (memory in use an epoch ago).
#[derive(Debug, Default)]
pub(super) struct Spare(Vec<Values>);

impl Spare {
    /// Keeps `new` as `voter`'s value of `epoch` in a series' `values` if
    /// it is the latest (by timestamp; ties: this later arrival). A series'
    /// first value takes a spare vector, or a new one. A new value is held
    /// by its vote's identity; a tie pins the slot to the series' record
    /// (a restore folds identities by vote time alone, which cannot tell
    /// two votes of one time apart).
    pub(super) fn note(
        &mut self,
        values: &mut Values,
        epoch: Epoch,
        voter: &Id,
        new: OpenValue,
    ) -> Noted {
        let mut first = true;
        for (k, v, slot) in values.iter_mut() {
            if *k != epoch {
                continue;
            }
            first = false;
            if v != voter {
                continue;
            }
            if slot.value.timestamp == new.timestamp && slot.held == Held::Identity {
                slot.held = Held::Series;
            }
            if slot.value.timestamp <= new.timestamp {
                slot.value = new;
            }
            return Noted {
                added: false,
                first: false,
            };
        }
        let slot = OpenSlot {
            value: new,
            held: Held::Identity,
        };
        if values.capacity() == 0 {
            // A unit has a few reviewers: one allocation for most series.
            *values = self
                .0
                .pop()
                .unwrap_or_else(|| Values::with_capacity(UNIT_CAPACITY));
        }
        values.push((epoch, voter.clone(), slot));
        Noted { added: true, first }
    }

    /// Pins to the series' record the values of `epoch` in `values` whose
    /// vote time is `at`: the identity of a vote of that time was taken
    /// over by a later vote (accepted again after the retention forgot
    /// it), so the store no longer holds that vote's value. (A value of
    /// another reviewer with the same time may be pinned too: it is then
    /// held twice, which changes nothing.)
    pub(super) fn pin(values: &mut Values, epoch: Epoch, at: Nanos) {
        for (k, _, slot) in values.iter_mut() {
            if *k == epoch && slot.value.timestamp == at && slot.held == Held::Identity {
                slot.held = Held::Series;
            }
        }
    }

    /// Keeps `values`' vector (emptied) for a later series.
    pub(super) fn keep(&mut self, values: &mut Values) {
        values.clear();
        if values.capacity() > 0 {
            self.0.push(std::mem::take(values));
        }
    }

    /// At most `n` kept.
    fn bound(&mut self, n: usize) {
        self.0.truncate(n);
    }
}

/// Moves an evicted series' open values to the parked ones (its vector
/// to the spare ones).
pub(super) fn park(
    parked: &mut BTreeMap<Epoch, FxHashMap<SeriesKey, Unit>>,
    spare: &mut Spare,
    series: &SeriesKey,
    values: &mut Values,
) {
    for (epoch, voter, slot) in values.drain(..) {
        parked
            .entry(epoch)
            .or_default()
            .entry(series.clone())
            .or_default()
            .push((voter, slot));
    }
    spare.keep(values);
}

/// `run`'s view of the group (see `Engine::share_tables`): the newest
/// epoch every input partition has sealed, once known.
#[derive(Debug, Clone, Default)]
pub(super) struct Shared {
    group_sealed: Option<Epoch>,
    /// Deltas sealed here since the shell last took them, to publish.
    to_publish: Vec<(TermsKey, Terms)>,
    /// The sealed epoch the shell last took.
    published_through: Option<Epoch>,
}

/// A batch waiting at the barrier, and whether the store holds it.
#[derive(Debug, Clone)]
pub(super) struct PendingSlot {
    pending: Pending,
    stored: bool,
}

impl Engine {
    /// `run` (contract §14): the tables become the group's, fed by the shell
    /// with every partition's sealed deltas (this one's included, as read
    /// back from the topic: its own seals no longer enter them directly),
    /// and in `learned` mode a batch of epoch k waits until
    /// [`Engine::set_group_sealed`] says every partition sealed k − 2.
    ///
    /// Called again (the shell reads the group again from the topic's
    /// beginning), it empties the tables and forgets the group's sealed
    /// epoch, but keeps what this partition sealed and has not handed
    /// over to publish yet: those deltas are in no table and on no topic,
    /// and dropping them would leave them out of every table for good.
    pub fn share_tables(&mut self) {
        let s = self.shared.get_or_insert_with(Shared::default);
        s.group_sealed = None;
        self.tables = Tables::default();
    }

    /// Adds a sealed delta of any partition to the tables (`run`).
    pub fn add_delta(&mut self, rubric: &Id, epoch: Epoch, voter: &Id, t: &Terms) {
        self.tables.add(rubric, epoch, voter, t);
    }

    /// The newest epoch every input partition has sealed (`run`); then
    /// scores the batches that no longer wait, into `out`.
    pub fn set_group_sealed(&mut self, epoch: Option<Epoch>, out: &mut Vec<ScoreUpdate>) {
        if let Some(s) = &mut self.shared {
            s.group_sealed = epoch;
        }
        self.score_ready(out);
    }

    /// Whether a batch of epoch `k` may be scored: T_k is final.
    fn ready(&self, k: Epoch) -> bool {
        match &self.shared {
            None => true,
            Some(s) => s.group_sealed.is_some_and(|g| g >= k - 2),
        }
    }

    /// Whether the closed batch `key` must wait (an earlier one waits, or
    /// its table is not final).
    pub(super) fn must_wait(&self, key: &BatchKey) -> bool {
        !self.pending.is_empty() || !self.ready(self.cfg.reputation.epoch_of(key.window_start))
    }

    /// Keeps a closed batch at the barrier, with its series' model id now.
    pub(super) fn pend(&mut self, key: BatchKey, batch: Batch) {
        let model_id = self
            .series
            .get(&key.series)
            .and_then(|e| e.state.model_id.clone());
        let order = self.next_pending;
        self.next_pending += 1;
        let pending = Pending {
            key,
            batch,
            model_id,
        };
        let slot = PendingSlot {
            pending,
            stored: false,
        };
        self.push_pending(order, slot);
        self.dirty_pending.push(order);
    }

    /// Adds a batch at the back of the barrier (its `order` after every
    /// other's), counting its epoch.
    fn push_pending(&mut self, order: u64, slot: PendingSlot) {
        debug_assert!(self.pending.back().is_none_or(|(o, _)| *o < order));
        let epoch = self.cfg.reputation.epoch_of(slot.pending.key.window_start);
        *self.pending_epochs.entry(epoch).or_default() += 1;
        self.pending.push_back((order, slot));
    }

    /// Scores the waiting batches whose tables are final, in close order.
    pub fn score_ready(&mut self, out: &mut Vec<ScoreUpdate>) {
        while let Some((_, front)) = self.pending.front() {
            let k = self.cfg.reputation.epoch_of(front.pending.key.window_start);
            if !self.ready(k) {
                break;
            }
            let Some((order, slot)) = self.pending.pop_front() else {
                break;
            };
            let epoch = self.cfg.reputation.epoch_of(slot.pending.key.window_start);
            if let Some(n) = self.pending_epochs.get_mut(&epoch) {
                *n -= 1;
                if *n == 0 {
                    self.pending_epochs.remove(&epoch);
                }
            }
            if slot.stored {
                self.deleted_pending.push(order);
            }
            let Pending {
                key,
                batch,
                model_id,
            } = slot.pending;
            self.score_closed(key, batch, Some(model_id), out);
        }
    }

    /// `run`: the deltas this partition sealed since the last call, and
    /// its newest sealed epoch when that moved (the first call after a
    /// start says it again): what the reputation topic is given.
    pub fn take_published(&mut self) -> (Vec<(TermsKey, Terms)>, Option<Epoch>) {
        let through = self.sealed_through();
        let Some(s) = &mut self.shared else {
            return (Vec::new(), None);
        };
        let moved = through.filter(|t| s.published_through != Some(*t));
        if moved.is_some() {
            s.published_through = moved;
        }
        (std::mem::take(&mut s.to_publish), moved)
    }

    /// The newest epoch this partition has sealed (its watermark's).
    pub fn sealed_through(&self) -> Option<Epoch> {
        let p = &self.cfg.reputation;
        self.meta.watermark.map(|wm| p.sealed_by(wm))
    }

    /// Closed batches waiting at the barrier.
    pub fn pending_batches(&self) -> usize {
        self.pending.len()
    }

    /// Counts what [`Spare::note`] did to `series`' values.
    pub(super) fn noted(&mut self, series: &SeriesKey, epoch: Epoch, n: Noted) {
        if n.added {
            self.open_count += 1;
        }
        if n.first {
            // (A series' later values of the epoch find it there.)
            self.open_epochs.insert(epoch);
            self.open_series
                .entry(epoch)
                .or_default()
                .push(series.clone());
        }
    }

    /// The open values parked for `series`, now that it is cached again.
    pub(super) fn unpark(&mut self, series: &SeriesKey) -> Values {
        let mut values = Values::new();
        for (&epoch, units) in self.parked_values.iter_mut() {
            if let Some(unit) = units.remove(series) {
                values.extend(unit.into_iter().map(|(v, slot)| (epoch, v, slot)));
                self.open_series
                    .entry(epoch)
                    .or_default()
                    .push(series.clone());
            }
        }
        values
    }

    /// Seals every open epoch the watermark `wm` has passed: its units
    /// become this partition's deltas (and enter its tables), its values
    /// go. Then folds what no batch can need apart any more, going by the
    /// watermark `before` this advance (the batches it closes are still to
    /// score).
    pub(super) fn seal_through(&mut self, wm: Nanos, before: Option<Nanos>) {
        let through = self.cfg.reputation.sealed_by(wm);
        if self.open_epochs.first().is_some_and(|&k| k <= through) {
            self.seal_epochs(through);
        }
        if let Some(before) = before {
            self.fold_before(before);
        }
    }

    /// Seals the open epochs up to `through`: their values, parked and
    /// in the cached series.
    fn seal_epochs(&mut self, through: Epoch) {
        let mut unit = Unit::new();
        let mut sealed_series = 0;
        while let Some(epoch) = self.open_epochs.pop_first() {
            if epoch > through {
                self.open_epochs.insert(epoch);
                break;
            }
            let mut sealer = reputation::Sealer::default();
            let listed = self.open_series.remove(&epoch).unwrap_or_default();
            for block in listed.chunks(SEAL_AHEAD) {
                // Each series' entry and values are cold: the block's
                // lookups, independent of each other, miss together
                // before its series are sealed one by one.
                for series in block {
                    if let Some(e) = self.series.get(series) {
                        prefetch(e.values.as_ptr());
                    }
                }
                for series in block {
                    // Evicted since (its values are parked), or listed twice.
                    let Some(e) = self.series.get_mut(series) else {
                        continue;
                    };
                    unit.clear();
                    let values = e.values.extract_if(.., |(k, ..)| *k == epoch);
                    unit.extend(values.map(|(_, voter, slot)| (voter, slot)));
                    if e.values.is_empty() {
                        self.spare_values.keep(&mut e.values);
                    }
                    sealed_series += 1;
                    self.seal_unit(epoch, series, &unit, &mut sealer);
                }
            }
            for (series, unit) in self.parked_values.remove(&epoch).unwrap_or_default() {
                self.seal_unit(epoch, &series, &unit, &mut sealer);
            }
            for ((rubric, voter), t) in sealer.finish() {
                let key = (rubric, epoch, voter);
                match &mut self.shared {
                    None => self.tables.add(&key.0, epoch, &key.2, &t),
                    Some(s) => s.to_publish.push((key.clone(), t.clone())),
                }
                self.sealed.push((key, t));
            }
        }
        self.spare_values.bound(sealed_series);
    }

    /// A series' values of a sealed epoch go: into the seal, and from the
    /// store if it holds them.
    fn seal_unit(
        &mut self,
        epoch: Epoch,
        series: &SeriesKey,
        unit: &Unit,
        sealer: &mut reputation::Sealer,
    ) {
        self.open_count -= unit.len();
        if unit.iter().any(|(_, slot)| slot.held == Held::Unit) {
            self.deleted_open.push((epoch, series.clone()));
        }
        for (voter, slot) in unit {
            if slot.held == Held::Value {
                self.deleted_legacy_open
                    .push((epoch, series.clone(), voter.clone()));
            }
        }
        let values = unit.iter().map(|(v, slot)| (v, slot.value.value));
        sealer.add(&series.voter_prompt_id, values);
    }

    /// Folds the epochs no batch open under the watermark `wm` needs
    /// apart: such a batch's window ends after `wm`, so its epoch k is at
    /// least that of wm − W (of wm when W = 0), and T_k holds every epoch
    /// up to k − 2.
    /// A batch waiting at the barrier may be older still.
    fn fold_before(&mut self, wm: Nanos) {
        let oldest = self.oldest_epoch_under(wm);
        self.tables.fold_through(oldest - 2);
    }

    /// The oldest epoch a batch still to score may have, under the
    /// watermark `wm`: that of wm − W (of wm when W = 0), or a waiting
    /// batch's.
    fn oldest_epoch_under(&self, wm: Nanos) -> Epoch {
        let p = &self.cfg.reputation;
        let waiting = self.pending_epochs.keys().next().copied();
        let open = p.epoch_of(wm.saturating_sub(self.cfg.window_ns));
        waiting.map_or(open, |w| w.min(open))
    }

    /// `run`: the oldest epoch a batch of this partition still to score
    /// may have (None before its first watermark: any). Its tables must
    /// hold every epoch after this one − 2 apart.
    pub fn oldest_epoch_needed(&self) -> Option<Epoch> {
        self.meta.watermark.map(|wm| self.oldest_epoch_under(wm))
    }

    /// Seals every open epoch (the `reputation` command's end of input).
    pub fn seal_all(&mut self) {
        if let Some(&last) = self.open_epochs.last() {
            let wm = self.cfg.reputation.start_of(last + 1);
            self.seal_through(wm, None);
        }
    }

    /// The table a batch of the window starting at `start` is scored
    /// with, for `rubric`, and (k − 1)·E.
    pub(super) fn table_for(&mut self, rubric: &Id, start: Nanos) -> (Arc<Table>, Nanos) {
        let p = &self.cfg.reputation;
        let k = p.epoch_of(start);
        let until = p.start_of(k - 1);
        (self.tables.table(p, rubric, k), until)
    }

    /// The partition's tables (every delta it knows).
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// Open values held (contract §8 `jurystream_reputation_open_values`).
    pub fn open_values(&self) -> usize {
        self.open_count
    }

    /// Adds what a store holds: the open values (each with where an older
    /// store held it besides its series' record),
    /// the sealed deltas and the batches waiting at the barrier, whose
    /// series [`Engine::restore`] was given (nothing is marked dirty).
    pub fn restore_reputation(
        &mut self,
        values: impl IntoIterator<Item = (OpenKey, OpenValue, Held)>,
        deltas: impl IntoIterator<Item = (TermsKey, Terms)>,
        pending: impl IntoIterator<Item = (u64, Pending)>,
    ) {
        let mut pending: Vec<(u64, Pending)> = pending.into_iter().collect();
        pending.sort_unstable_by_key(|(order, _)| *order);
        let waiting: FxHashMap<u64, usize> = pending
            .iter()
            .map(|(_, p)| (p.key.seq, p.batch.entries.len()))
            .collect();
        for (order, p) in pending {
            self.next_pending = order + 1;
            if let Some(e) = self.series.get_mut(&p.key.series) {
                if !e.open.contains(&p.key.seq) {
                    e.open.push(p.key.seq);
                }
                // Votes of open and waiting batches (contract §9 pending_votes).
                let batches = &self.batches;
                e.state.pending = e
                    .open
                    .iter()
                    .map(|seq| {
                        batches
                            .get(seq)
                            .map(|b| b.batch.entries.len())
                            .or_else(|| waiting.get(seq).copied())
                            .unwrap_or(0) as u64
                    })
                    .sum();
            }
            let slot = PendingSlot {
                pending: p,
                stored: true,
            };
            self.push_pending(order, slot);
        }
        for ((epoch, series, voter), value, held) in values {
            let slot = OpenSlot { value, held };
            self.open_count += 1;
            self.open_epochs.insert(epoch);
            match self.series.get_mut(&series) {
                Some(e) => {
                    if !e.values.iter().any(|(k, ..)| *k == epoch) {
                        self.open_series.entry(epoch).or_default().push(series);
                    }
                    e.values.push((epoch, voter, slot));
                }
                None => self
                    .parked_values
                    .entry(epoch)
                    .or_default()
                    .entry(series)
                    .or_default()
                    .push((voter, slot)),
            }
        }
        for ((rubric, epoch, voter), t) in deltas {
            self.tables.add(&rubric, epoch, &voter, &t);
        }
        if let Some(wm) = self.meta.watermark {
            self.fold_before(wm);
        }
    }

    /// The older records of sealed open values to delete, the seals and
    /// the waiting batches, to persist (the open values themselves are in
    /// their series' records).
    pub(super) fn drain_reputation(&mut self, sink: &mut impl FnMut(Change<'_>)) {
        for (epoch, series) in self.deleted_open.drain(..) {
            sink(Change::OpenUnitGone(epoch, &series));
        }
        for key in self.deleted_legacy_open.drain(..) {
            sink(Change::OpenValueGone(&key));
        }
        for (key, t) in self.sealed.drain(..) {
            sink(Change::Terms(&key, &t));
        }
        for order in self.dirty_pending.drain(..) {
            // Scored since (then never stored): nothing to write. The
            // waiting batches are in close order.
            if let Ok(i) = self.pending.binary_search_by_key(&order, |(o, _)| *o) {
                let slot = &mut self.pending[i].1;
                slot.stored = true;
                sink(Change::Pending(order, Some(&slot.pending)));
            }
        }
        for order in self.deleted_pending.drain(..) {
            sink(Change::Pending(order, None));
        }
    }
}

#[cfg(test)]
mod tests;
