//! The partition's leaderboard rows in RocksDB (`l` keys): read, and
//! rebuilt from the series when a directory or a restored changelog holds
//! rows stored before their squares (`legacy::SQUARES_UNKNOWN`).

use rocksdb::WriteBatch;

use super::keys::*;
use super::{format, legacy};
use super::{Store, StoreError};
use crate::engine::board::{BoardKey, BoardRow};

impl Store {
    /// Puts the leaderboard rows computed from every stored series into `wb`
    /// (a directory written before the leaderboard existed; its voters are
    /// not known and stay empty).
    pub(super) fn rebuild_board(&self, wb: &mut WriteBatch) -> Result<(), StoreError> {
        let mut rows: std::collections::BTreeMap<BoardKey, BoardRow> = Default::default();
        for item in self.prefix(b"s") {
            let (k, v) = item?;
            let key = parse_series_key(&k).ok_or_else(|| self.corrupt(&k, "bad series key"))?;
            let s = self.decoded(&k, &v, format::decode_series)?;
            let (bk, row) = crate::engine::board::placement(&key.voter_prompt_id, &s);
            if let Some(row) = row {
                rows.entry(bk).or_default().add(&row);
            }
        }
        wb.delete_range(b"l", b"m");
        for (k, row) in &rows {
            wb.put(board_key(k), format::encode_board_row(row));
        }
        Ok(())
    }

    /// The partition's leaderboard rows.
    pub fn board(&self) -> Result<Vec<(BoardKey, BoardRow)>, StoreError> {
        Ok(self.board_rows()?.0)
    }

    /// The leaderboard rows, and whether one of them was stored before
    /// `score_squares` (a changelog written by an older version, restored
    /// into this directory): then its squares are unknown.
    fn board_rows(&self) -> Result<(Vec<(BoardKey, BoardRow)>, bool), StoreError> {
        let mut out = Vec::new();
        let mut old = false;
        for item in self.prefix(b"l") {
            let (k, v) = item?;
            let key = format::parse_board_key(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            let row = self.decoded(&k, &v, format::decode_board_row)?;
            old |= row.score_squares == legacy::SQUARES_UNKNOWN;
            out.push((key, row));
        }
        Ok((out, old))
    }

    /// The leaderboard rows for a load: rebuilt from the series first when
    /// one is in an older layout.
    pub(super) fn board_for_load(&self) -> Result<Vec<(BoardKey, BoardRow)>, StoreError> {
        let (rows, old) = self.board_rows()?;
        if !old {
            return Ok(rows);
        }
        let mut wb = WriteBatch::default();
        self.rebuild_board(&mut wb)?;
        self.db.write(wb).map_err(|e| self.rocks(e))?;
        tracing::info!(path = %self.path.display(),
            "leaderboard rows of an older layout rebuilt from the series");
        self.board()
    }
}
