//! The leaderboard of one partition (contract §9, §13): per (model_id,
//! voter_prompt_id), the scored series, the exact sums of their current
//! scores and of their squares, the flagged ones and their votes. Kept incrementally: a score
//! change moves the row by the series' old and new contribution.
//!
//! Scores are summed as fixed-point integers ([`fixed`]) so that removing a
//! contribution cancels its addition exactly: a running f64 sum would drift
//! over millions of updates, and two instances that summed the same scores
//! in another order would disagree.

use crate::input::Id;

use super::SeriesState;

/// One leaderboard row's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BoardKey {
    pub model_id: Option<Id>,
    pub voter_prompt_id: Id,
}

/// One leaderboard row (sums over the series with `update_seq ≥ 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BoardRow {
    pub series: u64,
    /// Σ [`fixed`]`(score)`.
    pub score_sum: i128,
    pub ambiguous: u64,
    pub votes: u64,
    /// Σ [`fixed_square`]`(score)` (contract §13: the rows' `score_sd`).
    pub score_squares: i128,
}

/// Fixed-point scale of [`BoardRow::score_sum`]: 2⁶⁴ per 1.0. A score in
/// [0, 1] loses only bits below 2⁻⁶⁴; 2⁶³ series fit in an i128.
pub const FIXED_ONE: f64 = 18_446_744_073_709_551_616.0;

/// A score as a fixed-point integer (see [`FIXED_ONE`]).
pub fn fixed(score: f64) -> i128 {
    (score * FIXED_ONE).round() as i128
}

/// The square of [`fixed`]`(score)`, in the same scale (rounded down):
/// computed from the fixed-point value so that the row's variance is
/// exact in [`BoardRow::score_sd`] (a square rounded in f64 would leave
/// a spread of about 1e-8 between equal scores).
pub fn fixed_square(score: f64) -> i128 {
    let a = fixed(score).unsigned_abs();
    let (high, low) = wide_mul(a, a);
    ((high << 64) | (low >> 64)) as i128
}

/// The 256-bit product of two u128 as (high, low) halves. Written here
/// because the standard library has no 256-bit integer and two
/// multiplications do not justify a big-number crate.
fn wide_mul(a: u128, b: u128) -> (u128, u128) {
    const LOW: u128 = u64::MAX as u128;
    let (a1, a0) = (a >> 64, a & LOW);
    let (b1, b0) = (b >> 64, b & LOW);
    let (mid, mid_carry) = (a0 * b1).overflowing_add(a1 * b0);
    let (low, low_carry) = (a0 * b0).overflowing_add(mid << 64);
    let high = a1 * b1 + (mid >> 64) + (u128::from(mid_carry) << 64) + u128::from(low_carry);
    (high, low)
}

/// A 256-bit (high, low) value as f64.
fn wide_to_f64((high, low): (u128, u128)) -> f64 {
    high as f64 * FIXED_ONE * FIXED_ONE + low as f64
}

/// The leaderboard rows merged per `label` (rows whose labels coincide,
/// such as the pairs a metrics label cap joins, add up exactly in fixed
/// point first), as the leaderboard gauges export them: per label, the sum
/// of scores, the sum of squared scores and the scored series.
pub fn gauge_rows<'a, K: Ord>(
    rows: impl IntoIterator<Item = (&'a BoardKey, &'a BoardRow)>,
    mut label: impl FnMut(&BoardKey) -> K,
) -> Vec<(K, f64, f64, u64)> {
    let mut sums: std::collections::BTreeMap<K, BoardRow> = Default::default();
    for (k, r) in rows {
        sums.entry(label(k)).or_default().add(r);
    }
    sums.into_iter()
        .map(|(k, r)| {
            (
                k,
                r.score_sum as f64 / FIXED_ONE,
                r.score_squares as f64 / FIXED_ONE,
                r.series,
            )
        })
        .collect()
}

impl BoardRow {
    /// What one series adds to its row (`None` before its first update).
    pub fn of(s: &SeriesState) -> Option<BoardRow> {
        (s.update_seq >= 1).then(|| BoardRow {
            series: 1,
            score_sum: fixed(s.score),
            ambiguous: u64::from(s.ambiguous),
            votes: s.votes,
            score_squares: fixed_square(s.score),
        })
    }

    pub fn add(&mut self, o: &BoardRow) {
        self.series += o.series;
        self.score_sum += o.score_sum;
        self.ambiguous += o.ambiguous;
        self.votes += o.votes;
        self.score_squares += o.score_squares;
    }

    pub fn sub(&mut self, o: &BoardRow) {
        self.series = self.series.saturating_sub(o.series);
        self.score_sum -= o.score_sum;
        self.ambiguous = self.ambiguous.saturating_sub(o.ambiguous);
        self.votes = self.votes.saturating_sub(o.votes);
        self.score_squares -= o.score_squares;
    }

    /// The unweighted mean of the row's scores.
    pub fn mean_score(&self) -> f64 {
        if self.series == 0 {
            return 0.0;
        }
        self.score_sum as f64 / FIXED_ONE / self.series as f64
    }

    /// The sample standard deviation of the row's scores (None below two
    /// series): √((n Σs² − (Σs)²) / (n (n − 1))), the numerator in exact
    /// 256-bit integers (units of 2⁻¹²⁸), clamped at 0.
    pub fn score_sd(&self) -> Option<f64> {
        if self.series < 2 {
            return None;
        }
        let n = u128::from(self.series);
        let (high, low) = wide_mul(n, self.score_squares.max(0) as u128);
        let n_squares = ((high << 64) | (low >> 64), low << 64);
        let sum_squared = {
            let s = self.score_sum.max(0) as u128;
            wide_mul(s, s)
        };
        if n_squares <= sum_squared {
            return Some(0.0);
        }
        let (borrow, low) = match n_squares.1.overflowing_sub(sum_squared.1) {
            (low, true) => (1, low),
            (low, false) => (0, low),
        };
        let diff = (n_squares.0 - sum_squared.0 - borrow, low);
        let n = self.series as f64;
        let variance = wide_to_f64(diff) / (FIXED_ONE * FIXED_ONE) / (n * (n - 1.0));
        Some(variance.sqrt())
    }

    /// The 95 % interval of the row's mean score across its series
    /// (contract §13): `mean ± z · sd / √n` (None below two series).
    pub fn mean_score_interval(&self) -> Option<(f64, f64)> {
        let sd = self.score_sd()?;
        let mean = self.mean_score();
        let half = crate::engine::score::Z95 * sd / (self.series as f64).sqrt();
        Some((mean - half, mean + half))
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
                score_squares: fixed_square(s),
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
            score_squares: fixed_square(0.987654321),
        };
        for _ in 0..1000 {
            row.add(&x);
            row.sub(&x);
        }
        assert_eq!(row, before);
        assert_eq!(BoardRow::default().mean_score(), 0.0);
    }

    fn row_of(scores: &[f64]) -> BoardRow {
        let mut row = BoardRow::default();
        for &s in scores {
            row.add(&BoardRow {
                series: 1,
                score_sum: fixed(s),
                score_squares: fixed_square(s),
                ..BoardRow::default()
            });
        }
        row
    }

    /// The sample sd of a direct two-pass computation, within 1e-12.
    #[test]
    fn score_sd_is_the_sample_standard_deviation() {
        let cases: [&[f64]; 6] = [
            &[0.1, 0.7, 1.0 / 3.0, 0.0, 1.0, 0.123456789012345],
            &[0.5, 0.5],
            &[1.0, 1.0, 1.0],
            &[0.0, 1.0],
            &[0.8; 1000],
            &[0.25, 0.75, 0.5, 0.5],
        ];
        for scores in cases {
            let n = scores.len() as f64;
            let mean = scores.iter().sum::<f64>() / n;
            let var = scores.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / (n - 1.0);
            let row = row_of(scores);
            let sd = row.score_sd().unwrap();
            assert!(
                (sd - var.sqrt()).abs() < 1e-12,
                "{scores:?}: {sd} vs {}",
                var.sqrt()
            );
            let (low, high) = row.mean_score_interval().unwrap();
            let half = 1.959963984540054 * var.sqrt() / n.sqrt();
            assert!((low - (mean - half)).abs() < 1e-12 && (high - (mean + half)).abs() < 1e-12);
        }
        assert_eq!(row_of(&[0.4]).score_sd(), None);
        assert_eq!(row_of(&[0.4]).mean_score_interval(), None);
        assert_eq!(BoardRow::default().score_sd(), None);
    }

    #[test]
    fn wide_mul_is_the_256_bit_product() {
        assert_eq!(wide_mul(u128::MAX, u128::MAX), (u128::MAX - 1, 1));
        assert_eq!(wide_mul(1 << 64, 1 << 64), (1, 0));
        assert_eq!(wide_mul(3, 5), (0, 15));
        assert_eq!(fixed_square(1.0), 1 << 64);
        assert_eq!(fixed_square(0.5), 1 << 62);
    }
}
