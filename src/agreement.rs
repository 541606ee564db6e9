//! `jurystream agreement` (contract §11): Krippendorff's α per rubric and each
//! reviewer's deviation for a vote log, with the engine of `replay`.
//!
//! The file runs through a fresh engine on a temporary store
//! (`replay::run_file_detached`, every batch closed at the end); every score
//! update with ≥ 2 counted votes is a unit, folded into a [`Tally`] with
//! the same arithmetic the service keeps in its state
//! (`engine::agreement::unit`), so the numbers equal `GET /v1/rubrics`.
//!
//! Errors: [`ReplayError`], `replay`'s own. Everything `agreement` can
//! fail at is a replay's (opening and reading its input, the temporary
//! store, its threads); the tally itself cannot fail.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::engine::agreement::{unit, values, ReviewerStats, RubricSums};
pub use crate::engine::agreement::{RubricRow, VoterRow};
use crate::engine::ScoreUpdate;
use crate::input::Rejection;
use crate::replay::{run_file_detached, ReplayError, Sink};

/// What `agreement --format json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgreementOut {
    pub rubrics: Vec<RubricRow>,
    pub voters: Vec<VoterRow>,
}

/// The sums of a log's units (pure: fed score updates).
#[derive(Debug, Default)]
pub struct Tally {
    pub rubrics: BTreeMap<String, RubricSums>,
    /// (voter_id, voter_prompt_id): the output's order.
    pub reviewers: BTreeMap<(String, String), ReviewerStats>,
}

impl Tally {
    /// Adds one score update's batch if it is a unit.
    pub fn observe(&mut self, u: &ScoreUpdate) {
        let Some((sums, deviations)) = unit(&values(&u.votes)) else {
            return;
        };
        let rubric = &*u.series.voter_prompt_id;
        self.rubrics
            .entry(rubric.to_owned())
            .or_default()
            .add(&sums);
        for (e, d) in u.votes.iter().zip(deviations) {
            self.reviewers
                .entry((e.voter_id.to_string(), rubric.to_owned()))
                .or_default()
                .add(&d);
        }
    }

    /// The rows, rubrics by `voter_prompt_id` and reviewers by (`voter_id`,
    /// `voter_prompt_id`), byte-wise.
    pub fn report(&self) -> AgreementOut {
        AgreementOut {
            rubrics: self
                .rubrics
                .iter()
                .map(|(r, s)| RubricRow::of(r, s))
                .collect(),
            voters: self
                .reviewers
                .iter()
                .map(|((v, r), s)| VoterRow::of(v, r, s))
                .collect(),
        }
    }
}

impl Sink for Tally {
    fn updates(&mut self, updates: &mut Vec<ScoreUpdate>) -> std::io::Result<()> {
        for u in updates.drain(..) {
            self.observe(&u);
        }
        Ok(())
    }

    fn rejected(&mut self, _: &Rejection, _: &[u8], _: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// Replays `input` and returns its tally, with progress on stderr.
pub fn tally_file(
    cfg: &Config,
    input: &Path,
) -> Result<(Tally, crate::replay::ReplaySummary), ReplayError> {
    let mut tally = Tally::default();
    let (summary, ()) = run_file_detached(cfg, input, "agreement", &mut tally, |_| (), |_| ())?;
    Ok((tally, summary))
}

/// Most reviewers per rubric in the table (JSON lists them all).
const TABLE_REVIEWERS: usize = 20;

/// The report for a terminal: every rubric, then per rubric the reviewers
/// who deviate most.
pub fn table(t: &Tally) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let num = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.4}"));
    let _ = writeln!(
        s,
        "{:<24} {:>8} {:>14} {:>8}",
        "voter_prompt_id", "units", "pairable_votes", "alpha"
    );
    for (r, sums) in &t.rubrics {
        let _ = writeln!(
            s,
            "{:<24} {:>8} {:>14} {:>8}",
            r,
            sums.units,
            sums.pairable,
            num(sums.alpha())
        );
    }
    for rubric in t.rubrics.keys() {
        let mut rows: Vec<(&str, &ReviewerStats)> = t
            .reviewers
            .iter()
            .filter(|((_, r), _)| r == rubric)
            .map(|((v, _), st)| (v.as_str(), st))
            .collect();
        rows.sort_by(|a, b| {
            let d = |x: &ReviewerStats| x.mean_sq_deviation().unwrap_or(0.0);
            d(b.1).total_cmp(&d(a.1)).then(a.0.cmp(b.0))
        });
        let _ = writeln!(
            s,
            "\nreviewers of {rubric} by mean squared deviation ({} in all):",
            rows.len()
        );
        let _ = writeln!(
            s,
            "{:<24} {:>11} {:>17}",
            "voter_id", "rated_votes", "mean_sq_deviation"
        );
        for (v, st) in rows.iter().take(TABLE_REVIEWERS) {
            let _ = writeln!(
                s,
                "{:<24} {:>11} {:>17}",
                v,
                st.rated,
                num(st.mean_sq_deviation())
            );
        }
        if rows.len() > TABLE_REVIEWERS {
            let _ = writeln!(
                s,
                "… {} more (--format json lists every reviewer)",
                rows.len() - TABLE_REVIEWERS
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Classify, Fault};

    #[test]
    fn a_missing_input_is_the_users_fault_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("missing.jsonl");
        let cfg = Config::from_layers(None, &[]).unwrap();
        let err = tally_file(&cfg, &input).unwrap_err();
        assert!(matches!(err, ReplayError::OpenInput { .. }), "{err:?}");
        assert_eq!(err.fault(), Fault::Input);
        assert!(!err.is_retriable());
        assert_eq!(
            err.to_string(),
            format!("cannot open input {}", input.display())
        );
    }

    #[test]
    fn a_read_error_names_the_input() {
        // A directory opens but cannot be read as a file.
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config::from_layers(None, &[]).unwrap();
        let err = tally_file(&cfg, dir.path()).unwrap_err();
        assert!(matches!(err, ReplayError::ReadInput { .. }), "{err:?}");
        assert_eq!(err.fault(), Fault::Input);
        assert!(!err.is_retriable(), "a directory stays one");
        assert!(
            err.to_string().contains(&dir.path().display().to_string()),
            "{err}"
        );
    }
}
