//! The local entries a write derives from its records, never sent to the
//! changelog (whoever applies a record derives them, a changelog restore
//! included): an identity's `t` index entry and `v` voter key, and a
//! series' `j` entries of contract §14's open values, deleted by epoch range
//! at a seal.

use rocksdb::WriteBatch;

use super::keys::*;
use super::{format, Store, StoreError, META_KEY};
use crate::engine::reputation::Epoch;

/// What a store knows of contract §14's epochs (for its `j` index).
#[derive(Debug, Default)]
pub(super) enum Epochs {
    /// Not loaded yet (a changelog restore): every series value's open
    /// values are indexed.
    #[default]
    Unknown,
    /// Loaded with `reputation.mode` off, or a temporary store (whose
    /// series values carry no open values): nothing to index.
    Off,
    /// The epochs, and the newest epoch whose entries are cleared.
    On(crate::engine::reputation::ReputationParams, Epoch),
}

/// The local entries a write derives from its records (see
/// [`Store::index_entries`]): keys to put with empty values, and the
/// newest epoch sealed, whose `j` entries and older ones go.
#[derive(Default)]
pub(super) struct Derived {
    pub(super) puts: Vec<Vec<u8>>,
    pub(super) sealed: Option<Epoch>,
}

impl Store {
    /// The local entries that go with a put of `key` (never sent to the
    /// changelog: whoever applies the record derives them), into `out`.
    /// For an identity, its `t` index entry (if this store keeps the
    /// index) and, when the value carries its vote's series and voter
    /// (format 9), that voter's `v` key. For a series whose value holds
    /// open values (format 10), a `j` entry per epoch of them. For the
    /// partition's meta, once the store knows contract §14's epochs, the
    /// newest epoch its watermark sealed.
    pub(super) fn index_entries(
        &self,
        key: &[u8],
        value: &[u8],
        out: &mut Derived,
    ) -> Result<(), StoreError> {
        match key.first() {
            Some(b'd') => {
                if self.time_index {
                    out.puts
                        .push(time_index_key(self.identity_time(key, value)?, &key[1..]));
                }
                if let Some((series, voter)) =
                    self.decoded(key, value, format::decode_identity_voter)?
                {
                    out.puts.push(voter_key(&series, &voter));
                }
            }
            Some(b's') if !matches!(*self.epochs(), Epochs::Off) => {
                for epoch in self.decoded(key, value, format::series_open_epochs)? {
                    out.puts.push(open_index_key(epoch, key));
                }
            }
            _ if key == META_KEY => {
                if let Epochs::On(params, _) = &*self.epochs() {
                    let meta = self.decoded(key, value, format::decode_meta)?;
                    out.sealed = meta.watermark.map(|wm| params.sealed_by(wm));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// What the store knows of contract §14's epochs.
    pub(super) fn epochs(&self) -> std::sync::MutexGuard<'_, Epochs> {
        self.epochs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets compaction drop the open values of every epoch this store has
    /// sealed: call once the writes that sealed them are durable.
    pub(super) fn seal_durable(&self) {
        if let Epochs::On(_, cleared) = &*self.epochs() {
            self.sealed.set(*cleared);
        }
    }

    /// Deletes, in `wb`, the `j` entries of every epoch up to `sealed`
    /// (one range), if not done yet: their values are sealed. Returns the
    /// epoch if `wb` now seals it.
    pub(super) fn clear_sealed(&self, wb: &mut WriteBatch, sealed: Option<Epoch>) -> Option<Epoch> {
        let sealed = sealed?;
        match &mut *self.epochs() {
            Epochs::On(_, cleared) if sealed > *cleared => {
                wb.delete_range(&b"j"[..], &open_index_from(sealed + 1)[..]);
                *cleared = sealed;
                Some(sealed)
            }
            _ => None,
        }
    }
}
