//! Compaction takes contract §14's sealed open values out of series values.
//!
//! A seal does not rewrite the series it seals (that would write the
//! whole open state again at every epoch boundary): their values of the
//! sealed epoch stay in each series' record until its next write, which
//! for most series never comes, and were kept on disk for as long as the
//! series was. RocksDB rewrites every record anyway as it compacts it; a
//! compaction filter drops the sealed values then, so the open values of
//! sealed epochs cost no disk beyond the next compaction.
//!
//! Only epochs whose seal is **durable** go: the store moves
//! [`Sealed`] after the write that sealed them is synced to its
//! write-ahead log (or flushed), so a crash can never bring back a meta
//! record with the epoch open while compaction already took its values
//! (docs/decisions.md, "Compaction drops sealed open values").

use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};

use super::format;
use crate::engine::reputation::Epoch;

/// The newest epoch whose seal is durable in this store (`Epoch::MIN`:
/// none known, nothing is taken out), shared with its compactions.
#[derive(Clone, Debug)]
pub(super) struct Sealed(Arc<Mutex<Epoch>>);

impl Default for Sealed {
    fn default() -> Sealed {
        Sealed(Arc::new(Mutex::new(Epoch::MIN)))
    }
}

impl Sealed {
    fn get(&self) -> Epoch {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that every epoch up to `epoch` is durably sealed.
    pub(super) fn set(&self, epoch: Epoch) {
        let mut e = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *e = (*e).max(epoch);
    }
}

/// Makes one [`Strip`] per compaction, with the sealed epoch as it is when
/// the compaction starts.
pub(super) struct StripFactory(pub(super) Sealed);

impl CompactionFilterFactory for StripFactory {
    type Filter = Strip;

    fn create(&mut self, _: CompactionFilterContext) -> Strip {
        Strip {
            sealed: self.0.get(),
            out: Vec::new(),
        }
    }

    fn name(&self) -> &CStr {
        c"jurystream.strip-sealed-open-values.factory"
    }
}

/// One compaction's filter: a series value holding open values of a
/// durably sealed epoch is rewritten without them; every other record is
/// kept as it is.
pub(super) struct Strip {
    sealed: Epoch,
    out: Vec<u8>,
}

impl CompactionFilter for Strip {
    fn filter(&mut self, _level: u32, key: &[u8], value: &[u8]) -> Decision {
        if self.sealed == Epoch::MIN
            || key.first() != Some(&b's')
            || !format::strip_sealed(value, self.sealed, &mut self.out)
        {
            return Decision::Keep;
        }
        // SAFETY: `Decision::Change` asks for a `'static` slice, but
        // RocksDB's C shim copies the new value into its own string before
        // the filter is called again (`rocksdb_compactionfilter_t::Filter`
        // in c.cc: `new_value->assign(...)`), and `self.out` is only
        // changed by the next call. No crate offers an owned `Change`.
        let new: &'static [u8] = unsafe { std::mem::transmute::<&[u8], &'static [u8]>(&self.out) };
        Decision::Change(new)
    }

    fn name(&self) -> &CStr {
        c"jurystream.strip-sealed-open-values"
    }
}
