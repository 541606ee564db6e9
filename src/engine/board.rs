//! The leaderboard of one partition (SPEC §9): per (model_id,
//! voter_prompt_id), the scored series, the exact sum of their current
//! scores, the flagged ones and their votes. Kept incrementally: a score
//! change moves the row by the series' old and new contribution.
//!
//! Scores are summed as fixed-point integers ([`fixed`]) so that removing a
//! contribution cancels its addition exactly: a running f64 sum would drift
//! over millions of updates, and two instances that summed the same scores
//! in another order would disagree.

use crate::input::Id;

use serde::{Deserialize, Serialize};

use super::SeriesState;

/// One leaderboard row's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BoardKey {
    pub model_id: Option<Id>,
    pub voter_prompt_id: Id,
}

/// One leaderboard row (sums over the series with `update_seq ≥ 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BoardRow {
    pub series: u64,
    /// Σ [`fixed`]`(score)`.
    pub score_sum: i128,
    pub ambiguous: u64,
    pub votes: u64,
}

/// Fixed-point scale of [`BoardRow::score_sum`]: 2⁶⁴ per 1.0. A score in
/// [0, 1] loses only bits below 2⁻⁶⁴; 2⁶³ series fit in an i128.
pub const FIXED_ONE: f64 = 18_446_744_073_709_551_616.0;

/// A score as a fixed-point integer (see [`FIXED_ONE`]).
pub fn fixed(score: f64) -> i128 {
    (score * FIXED_ONE).round() as i128
}

impl BoardRow {
    /// What one series adds to its row (`None` before its first update).
    pub fn of(s: &SeriesState) -> Option<BoardRow> {
        (s.update_seq >= 1).then(|| BoardRow {
            series: 1,
            score_sum: fixed(s.score),
            ambiguous: u64::from(s.ambiguous),
            votes: s.votes,
        })
    }

    pub fn add(&mut self, o: &BoardRow) {
        self.series += o.series;
        self.score_sum += o.score_sum;
        self.ambiguous += o.ambiguous;
        self.votes += o.votes;
    }

    pub fn sub(&mut self, o: &BoardRow) {
        self.series = self.series.saturating_sub(o.series);
        self.score_sum -= o.score_sum;
        self.ambiguous = self.ambiguous.saturating_sub(o.ambiguous);
        self.votes = self.votes.saturating_sub(o.votes);
    }

    /// The unweighted mean of the row's scores.
    pub fn mean_score(&self) -> f64 {
        if self.series == 0 {
            return 0.0;
        }
        self.score_sum as f64 / FIXED_ONE / self.series as f64
    }
}

/// A series' place on the board before and after a change: its row key and
/// contribution.
pub type Placement = (BoardKey, Option<BoardRow>);

pub fn placement(voter_prompt_id: &Id, s: &SeriesState) -> Placement {
    (
        BoardKey {
            model_id: s.model_id.as_deref().map(Id::from),
            voter_prompt_id: voter_prompt_id.clone(),
        },
        BoardRow::of(s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_point_sums_cancel_exactly_and_keep_the_mean() {
        let scores = [0.1, 0.7, 1.0 / 3.0, 0.0, 1.0, 0.123456789012345];
        let mut row = BoardRow::default();
        for s in scores {
            row.add(&BoardRow {
                series: 1,
                score_sum: fixed(s),
                ambiguous: 0,
                votes: 1,
            });
        }
        let mean: f64 = scores.iter().sum::<f64>() / scores.len() as f64;
        assert!((row.mean_score() - mean).abs() < 1e-15);
        let before = row;
        let x = BoardRow {
            series: 1,
            score_sum: fixed(0.987654321),
            ambiguous: 1,
            votes: 3,
        };
        for _ in 0..1000 {
            row.add(&x);
            row.sub(&x);
        }
        assert_eq!(row, before);
        assert_eq!(BoardRow::default().mean_score(), 0.0);
    }
}
