//! The engine's side of SPEC §14: each open epoch's values, sealing as the
//! watermark passes an epoch, the tables a batch is scored with, and the
//! changes to persist. The math is `reputation.rs`'s.

use std::sync::Arc;

use super::reputation::{self, Table};
use super::*;

/// An open value, and whether the store holds it or must be given it.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenSlot {
    value: OpenValue,
    dirty: bool,
    stored: bool,
}

impl Engine {
    /// Keeps `voter`'s vote as the series' value of its epoch if it is the
    /// latest (by timestamp; ties: this later arrival).
    pub(super) fn note_value(
        &mut self,
        series: &SeriesKey,
        voter: &Id,
        start: Nanos,
        timestamp: Nanos,
        value: Option<f64>,
    ) {
        let epoch = self.cfg.reputation.epoch_of(start);
        let slots = self.open_values.entry(epoch).or_default();
        let new = OpenValue { timestamp, value };
        let key = (series.clone(), voter.clone());
        let slot = match slots.get_mut(&key) {
            Some(slot) if slot.value.timestamp > timestamp => return,
            Some(slot) => {
                slot.value = new;
                slot
            }
            None => slots.entry(key).or_insert(OpenSlot {
                value: new,
                dirty: false,
                stored: false,
            }),
        };
        if !std::mem::replace(&mut slot.dirty, true) {
            self.dirty_open.push((epoch, series.clone(), voter.clone()));
        }
    }

    /// Seals every open epoch the watermark `wm` has passed: its units
    /// become this partition's deltas (and enter its tables), its values
    /// go. Then folds what no batch can need apart any more, going by the
    /// watermark `before` this advance (the batches it closes are still to
    /// score).
    pub(super) fn seal_through(&mut self, wm: Nanos, before: Option<Nanos>) {
        let p = &self.cfg.reputation;
        let through = p.sealed_by(wm);
        while let Some(entry) = self.open_values.first_entry() {
            if *entry.key() > through {
                break;
            }
            let epoch = *entry.key();
            let slots = entry.remove();
            for ((series, voter), slot) in &slots {
                if slot.stored {
                    self.deleted_open
                        .push((epoch, series.clone(), voter.clone()));
                }
            }
            let terms = reputation::seal(slots.iter().map(|((s, v), o)| (s, v, &o.value)));
            for ((rubric, voter), t) in terms {
                self.tables.add(&rubric, epoch, &voter, &t);
                self.sealed.push(((rubric, epoch, voter), t));
            }
        }
        if let Some(before) = before {
            self.fold_before(before);
        }
    }

    /// Folds the epochs no batch open under the watermark `wm` needs
    /// apart: such a batch's window ends after `wm`, so its epoch k is at
    /// least that of wm − W (of wm when W = 0), and T_k holds every epoch
    /// up to k − 2.
    fn fold_before(&mut self, wm: Nanos) {
        let oldest = self
            .cfg
            .reputation
            .epoch_of(wm.saturating_sub(self.cfg.window_ns));
        self.tables.fold_through(oldest - 2);
    }

    /// Seals every open epoch (the `reputation` command's end of input).
    pub fn seal_all(&mut self) {
        if let Some((&last, _)) = self.open_values.last_key_value() {
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

    /// Open values held (SPEC §8 `jurystream_reputation_open_values`).
    pub fn open_values(&self) -> usize {
        self.open_values.values().map(|s| s.len()).sum()
    }

    /// Adds what a store holds: the open values and the sealed deltas
    /// (nothing is marked dirty).
    pub fn restore_reputation(
        &mut self,
        values: impl IntoIterator<Item = (OpenKey, OpenValue)>,
        deltas: impl IntoIterator<Item = (TermsKey, Terms)>,
    ) {
        for ((epoch, series, voter), value) in values {
            let slot = OpenSlot {
                value,
                dirty: false,
                stored: true,
            };
            self.open_values
                .entry(epoch)
                .or_default()
                .insert((series, voter), slot);
        }
        for ((rubric, epoch, voter), t) in deltas {
            self.tables.add(&rubric, epoch, &voter, &t);
        }
        if let Some(wm) = self.meta.watermark {
            self.fold_before(wm);
        }
    }

    pub(super) fn drain_reputation(&mut self, sink: &mut impl FnMut(Change<'_>)) {
        for key in self.dirty_open.drain(..) {
            let (epoch, series, voter) = key;
            let Some(slots) = self.open_values.get_mut(&epoch) else {
                continue;
            };
            let k = (series, voter);
            if let Some(slot) = slots.get_mut(&k) {
                slot.dirty = false;
                slot.stored = true;
                let (series, voter) = k;
                sink(Change::OpenValue(
                    &(epoch, series, voter),
                    Some(&slot.value),
                ));
            }
        }
        for key in self.deleted_open.drain(..) {
            sink(Change::OpenValue(&key, None));
        }
        for (key, t) in self.sealed.drain(..) {
            sink(Change::Terms(&key, &t));
        }
    }
}

#[cfg(test)]
mod tests;
