//! Where the store holds each open value (contract §14, format 11): the
//! slot the engine keeps, the values a series' record carries, and how a
//! restore folds what the store holds back into slots.

use super::super::reputation::{Epoch, OpenKey, OpenValue};
use crate::input::Id;
use std::collections::BTreeMap;

/// An open value, and where the store holds it: in the identity of its
/// vote (format 11), or in its series' record, and then perhaps also in a
/// record of its own that goes at the seal (a format-9 store held a
/// series' values of an epoch in a record of their own, a format-8 one
/// each value in a record of its own).
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct OpenSlot {
    pub(in crate::engine) value: OpenValue,
    pub(in crate::engine) held: Held,
}

/// Where the store holds an open value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// In the identity of its vote (format 11): the store finds it again
    /// from the vote, so its series' record does not carry it.
    Identity,
    /// In its series' record: written by format 10, or **pinned** there
    /// because the identities cannot tell it apart (a tie between two
    /// votes' times, or a vote whose identity a later vote took over, see
    /// [`super::Spare::pin`]).
    Series,
    /// In its unit's record (format 9's `h`).
    Unit,
    /// In a record of its own (format 8's `e`).
    Value,
}

/// The open values a series' record carries: those not held by their
/// votes' identities.
#[derive(Clone, Copy)]
pub struct OpenValues<'a>(pub(in crate::engine) &'a [(Epoch, Id, OpenSlot)]);

impl<'a> OpenValues<'a> {
    /// (epoch, reviewer, value) each.
    pub fn iter(self) -> InSeries<'a> {
        let left = self
            .0
            .iter()
            .filter(|(.., slot)| slot.held != Held::Identity)
            .count();
        InSeries {
            values: self.0.iter(),
            left,
        }
    }
}

/// [`OpenValues::iter`]: an iterator of known length, as a record's
/// sequence needs.
#[derive(Clone)]
pub struct InSeries<'a> {
    values: std::slice::Iter<'a, (Epoch, Id, OpenSlot)>,
    left: usize,
}

impl<'a> Iterator for InSeries<'a> {
    type Item = (Epoch, &'a Id, OpenValue);

    fn next(&mut self) -> Option<Self::Item> {
        let (epoch, voter, slot) = self
            .values
            .by_ref()
            .find(|(.., slot)| slot.held != Held::Identity)?;
        self.left -= 1;
        Some((*epoch, voter, slot.value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for InSeries<'_> {}

/// What a restore rebuilds the open values from (format 11): the values
/// series' records carry, each as it is, and the values of the identities
/// of open epochs, folded as [`super::Spare::note`] does. A slot a
/// series' record carries is the record's: the record is written whenever
/// its slot changes, and a slot goes there exactly when the identities
/// cannot say its value (a tie, a vote's identity taken over). Any other
/// slot's votes each have their identity, and the latest vote time wins.
#[derive(Debug, Default)]
pub struct OpenFold {
    /// In key order, so that a restore rebuilds the same engine each time.
    slots: BTreeMap<OpenKey, (OpenValue, Held)>,
}

impl OpenFold {
    /// A value a store record carries (a series' record, or an older
    /// format's record of its own: `held`).
    pub fn record(&mut self, key: OpenKey, value: OpenValue, held: Held) {
        self.slots.insert(key, (value, held));
    }

    /// A vote's value, from its identity.
    pub fn identity(&mut self, key: OpenKey, value: OpenValue) {
        match self.slots.entry(key) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert((value, Held::Identity));
            }
            std::collections::btree_map::Entry::Occupied(mut e) => {
                let (old, held) = e.get_mut();
                if *held == Held::Identity && old.timestamp < value.timestamp {
                    *old = value;
                }
            }
        }
    }

    /// The open values, for [`crate::engine::Engine::restore_reputation`].
    pub fn finish(self) -> impl Iterator<Item = (OpenKey, OpenValue, Held)> {
        self.slots.into_iter().map(|(k, (v, held))| (k, v, held))
    }
}
