//! What a drain hands the shell to persist: [`Change`], one per dirty
//! key, in an order safe to apply as one atomic write.

use super::agreement::{ReviewerKey, ReviewerStats, RubricSums};
use super::board::{BoardKey, BoardRow};
use super::reputation::{Epoch, OpenKey, Terms, TermsKey};
use super::{cache, learn, Engine, OpenValues};
use super::{Batch, BatchKey, Meta, Pending, SeriesKey, SeriesState};
use crate::time::Nanos;

/// One change to persist, as [`Engine::drain_changes`] reports it.
pub enum Change<'a> {
    /// A series' state, with its open values of every epoch (contract §14).
    Series(&'a SeriesKey, &'a SeriesState, OpenValues<'a>),
    Batch(&'a BatchKey, Option<&'a Batch>),
    /// An accepted vote's identity and vote time (identities are forgotten
    /// by the state store's retention sweep, never by the engine), the
    /// vote time the store held for it before, if the identity is accepted
    /// again after the retention forgot it (its index entry goes), and
    /// (`query_index` only) the vote: the store keeps the series' voters
    /// (contract §9) as an index of its identities, and contract §14's open values
    /// in them.
    Dedupe(u128, Nanos, Option<Nanos>, Option<Voted<'a>>),
    Meta(&'a Meta),
    /// A leaderboard row (`None`: no scored series left in it).
    Board(&'a BoardKey, Option<&'a BoardRow>),
    /// A rubric's agreement sums (`query_index` only).
    Agreement(&'a str, &'a RubricSums),
    /// A reviewer's agreement numbers for a rubric, whole (`query_index`
    /// only).
    Reviewer(&'a ReviewerKey, &'a ReviewerStats),
    /// A series' open values of an epoch that a format-9 store held in a
    /// record of their own (contract §14), now sealed: the record goes.
    OpenUnitGone(Epoch, &'a SeriesKey),
    /// A value stored as a record of its own by format 8, now sealed: its
    /// record goes.
    OpenValueGone(&'a OpenKey),
    /// A sealed delta of this partition (contract §14), written once.
    Terms(&'a TermsKey, &'a Terms),
    /// A closed batch waiting at the barrier, by its place in the close
    /// order (contract §14; `None`: it was scored).
    Pending(u64, Option<&'a Pending>),
}

/// An accepted vote as its identity's record keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Voted<'a> {
    pub series: &'a SeriesKey,
    pub voter: &'a str,
    /// The vote's value when contract §14 collects (`Some(None)`: an
    /// abstention), its epoch's open value until the epoch seals.
    pub open: Option<Option<f64>>,
}

/// [`Engine::drain_changes`] walks a whole table instead of looking up its
/// dirty keys once they are more than one entry in this many.
const SCAN_WHEN_DIRTY: usize = 8;

impl Engine {
    /// Hands every change since the last drain to `sink`, in an order that
    /// is safe to apply as one atomic write.
    pub fn drain_changes(&mut self, mut sink: impl FnMut(Change<'_>)) {
        // A temporary store (no `query_index`) is never restored from: the
        // open values stay in memory only (see `noted`).
        let keep_values = self.cfg.query_index;
        fn persisted(values: &learn::Values, keep: bool) -> OpenValues<'_> {
            OpenValues(if keep { values } else { &[] })
        }
        // A mostly dirty table (a replay's bulk write) costs less in one pass
        // than in a random lookup per dirty key; the order of the changes
        // does not matter (one per key, applied as one write).
        if self.dirty_series.len() >= self.series.len() / SCAN_WHEN_DIRTY {
            self.dirty_series.clear();
            for (k, e) in self.series.iter_mut() {
                if std::mem::take(&mut e.dirty) {
                    sink(Change::Series(
                        k,
                        &e.state,
                        persisted(&e.values, keep_values),
                    ));
                }
            }
        }
        for k in self.dirty_series.drain(..) {
            if let Some(e) = self.series.get_mut(&k) {
                e.dirty = false;
                sink(Change::Series(
                    &k,
                    &e.state,
                    persisted(&e.values, keep_values),
                ));
            }
        }
        for seq in self.dirty_batches.drain(..) {
            // A batch closed since is deleted below if the store has it.
            if let Some(open) = self.batches.get_mut(&seq) {
                open.batch.dirty = false;
                open.batch.stored = true;
                sink(Change::Batch(&open.key, Some(&open.batch)));
            }
        }
        for k in self.deleted_batches.drain(..) {
            sink(Change::Batch(&k, None));
        }
        let voters = &self.identity_voters;
        let mut dedupe = |id: u128, at: Nanos, replaced: Option<Nanos>| {
            let voted = voters.get(&id).map(|(series, voter, open)| Voted {
                series,
                voter,
                open: *open,
            });
            sink(Change::Dedupe(id, at, replaced, voted));
        };
        if self.dirty_dedupe.len() >= self.dedupe.len() / SCAN_WHEN_DIRTY {
            self.dirty_dedupe.clear();
            for (&k, e) in self.dedupe.iter_mut() {
                if e.set_dirty(false) {
                    let id = u128::from(k);
                    dedupe(id, e.at, self.replaced_dedupe.remove(&id));
                }
            }
        }
        for id in self.dirty_dedupe.drain(..) {
            if let Some(e) = self.dedupe.get_mut(&id.into()) {
                e.set_dirty(false);
                dedupe(id, e.at, self.replaced_dedupe.remove(&id));
            }
        }
        for (_, (k, voter, _)) in self.identity_voters.drain() {
            self.cache_bytes = self
                .cache_bytes
                .saturating_sub(cache::voter_bytes(&k, &voter));
        }
        if !self.dirty_board.is_empty() {
            self.dirty_board.sort_unstable();
            self.dirty_board.dedup();
            for k in self.dirty_board.drain(..) {
                let row = self.board.get(&k).copied().filter(|r| r.series > 0);
                if row.is_none() {
                    self.board.remove(&k);
                }
                sink(Change::Board(&k, row.as_ref()));
            }
        }
        self.drain_agreement(&mut sink);
        self.drain_reputation(&mut sink);
        if std::mem::take(&mut self.meta_dirty) {
            sink(Change::Meta(&self.meta));
        }
    }
}
