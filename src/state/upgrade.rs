//! Bringing a state directory of an earlier format to this one, once, at
//! open: the format positions and what an upgrade from each format does.

use rocksdb::{Direction, IteratorMode, ReadOptions, WriteBatch};

use super::keys::*;
use super::{format, legacy, Store, StoreError};

/// Position name of the directory's format ([`format::FORMAT`] once
/// upgraded; history in [`format`]). What an upgrade from each does, at
/// open ([`Store::upgrade`]): below 7 every value gets its format byte
/// (`legacy`); below 3 the `t` index is rebuilt (format 2 could leave an
/// entry behind); below 6 the leaderboard rows are rebuilt from the series
/// (4 added them, 6 their squares); the agreement sums and reviewers (5)
/// start empty (the votes before are gone).
pub(super) const FORMAT_POS: &str = "format";
pub(super) const FORMAT_VERSION: i64 = format::FORMAT as i64;
/// The first format whose values carry their format byte: from it on an
/// upgrade rewrites nothing (7 → 8 added record kinds only).
pub(super) const TAGGED_VERSION: i64 = format::FIRST_TAGGED as i64;

/// Position name of how far the upgrade to format 7 got (the last key
/// rewritten; raw bytes, not a number), so that an interrupted upgrade
/// resumes instead of reading tagged values as untagged ones.
pub(super) const UPGRADING_POS: &str = "upgrading";

impl Store {
    /// Brings a directory of an earlier format to this one, once (see
    /// [`FORMAT_POS`]); refuses one of a later format.
    pub(super) fn upgrade(&self) -> Result<(), StoreError> {
        let format = self.position(FORMAT_POS)?.unwrap_or(0);
        if format > FORMAT_VERSION {
            return Err(self.corrupt(
                &position_key(FORMAT_POS),
                format!(
                    "the directory is in format {format}, written by a newer version; \
                     this one reads formats up to {FORMAT_VERSION}"
                ),
            ));
        }
        if format == FORMAT_VERSION {
            return Ok(());
        }
        let tagged = if format < TAGGED_VERSION {
            self.tag_values()?
        } else {
            0
        };
        let mut wb = WriteBatch::default();
        let mut indexed = 0u64;
        if format < 3 {
            // Format 2 could leave an index entry behind when an identity
            // was accepted again; the index is rebuilt from the identities.
            wb.delete_range(b"t", b"u");
            wb.delete(SWEEP_KEY);
            for item in self.prefix(b"d") {
                let (k, v) = item?;
                let at = self.identity_time(&k, &v)?;
                wb.put(time_index_key(at, &k[1..]), []);
                indexed += 1;
                if wb.len() >= 50_000 {
                    self.write(std::mem::take(&mut wb))?;
                }
            }
        }
        if format < 6 {
            self.rebuild_board(&mut wb)?;
        }
        wb.put(position_key(FORMAT_POS), FORMAT_VERSION.to_le_bytes());
        wb.delete(position_key(UPGRADING_POS));
        self.write(wb)?;
        if format > 0 {
            tracing::info!(path = %self.path.display(), from = format, to = FORMAT_VERSION,
                records = tagged, identities_indexed = indexed, "state directory upgraded");
        }
        Ok(())
    }

    /// Rewrites every value of an untagged directory (format < 7) in the
    /// current format, in key order, in writes of 50 000 that each record
    /// the last key done ([`UPGRADING_POS`]), where an interrupted upgrade
    /// resumes. Returns how many values it rewrote.
    fn tag_values(&self) -> Result<u64, StoreError> {
        let done = self.get(&position_key(UPGRADING_POS))?;
        let mut opts = ReadOptions::default();
        opts.set_total_order_seek(true);
        let mode = match &done {
            Some(k) => IteratorMode::From(k, Direction::Forward),
            None => IteratorMode::Start,
        };
        let mut wb = WriteBatch::default();
        let mut n = 0u64;
        for item in self.db.iterator_opt(mode, opts) {
            let (k, v) = item.map_err(|e| self.rocks(e))?;
            // Positions and the time index are local and carry no format
            // byte; the key `done` names is already rewritten.
            if matches!(k.first(), Some(b'p' | b't'))
                || v.is_empty()
                || done.as_deref() == Some(&k[..])
            {
                continue;
            }
            let value = legacy::upgrade(&k, &v).map_err(|e| self.corrupt(&k, e))?;
            wb.put(&k, value);
            n += 1;
            if wb.len() >= 50_000 {
                wb.put(position_key(UPGRADING_POS), &k);
                self.write(std::mem::take(&mut wb))?;
            }
        }
        self.write(wb)?;
        Ok(n)
    }
}
