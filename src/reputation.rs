//! `jurystream reputation` (contract §14): the learned reviewer weights of a
//! vote log, with the engine of `replay`.
//!
//! The file runs through a fresh engine on a temporary store
//! (`replay::run_file_detached`) that collects and seals as `shadow` mode
//! does in any configured mode (the tables do not depend on it); at the
//! end every epoch is sealed, and the rows are the tables over every
//! epoch: what a batch of the next epoch would get.
//!
//! Errors: [`ReplayError`], `replay`'s own, and a configuration whose
//! `epoch_seconds` breaks its cross-key rules (checked in every mode).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::engine::reputation::{unfix, Epoch, Mode, Table, Tables, Terms, TermsKey};
use crate::engine::{Engine, ScoreUpdate};
use crate::input::Rejection;
use crate::replay::{run_file_detached, ReplayError, ReplaySummary, Sink};

/// What `reputation --format json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReputationOut {
    pub rubrics: Vec<RubricRow>,
    pub voters: Vec<VoterRow>,
}

/// A rubric's pooled numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RubricRow {
    pub voter_prompt_id: String,
    /// N: values in units.
    pub rated_votes: u64,
    /// float(Q)·2⁻⁴⁰ / N.
    pub mean_sq_deviation: f64,
    /// τ².
    pub noise_variance: f64,
    /// The rubric's model (contract §15), and its `confusion` table side
    /// by side with the noise model's: null while that table is empty.
    pub model: String,
    pub rates_from: Option<String>,
    /// π.
    pub base_rate: Option<f64>,
    pub sensitivity: Option<f64>,
    pub specificity: Option<f64>,
    /// s.
    pub evidence_scale: Option<f64>,
    /// ±w₀: + for a prior towards a pass.
    pub prior_weight: Option<f64>,
}

/// A reviewer's numbers for a rubric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VoterRow {
    pub voter_id: String,
    pub voter_prompt_id: String,
    /// N_u.
    pub rated_votes: u64,
    /// float(Q_u)·2⁻⁴⁰ / N_u.
    pub mean_sq_deviation: f64,
    /// σ̂²_u.
    pub noise_variance: f64,
    /// ω_u.
    pub weight: f64,
    /// The rubric's model, and the reviewer's row of its `confusion` table
    /// (contract §15): null while that table is empty or the reviewer is
    /// not in it.
    pub model: String,
    /// C_u.
    pub confusion_votes: Option<u64>,
    pub sensitivity: Option<f64>,
    pub specificity: Option<f64>,
    /// w⁺_u.
    pub pass_weight: Option<f64>,
    /// w⁻_u.
    pub flag_weight: Option<f64>,
}

/// The rows of `tables` over every epoch: rubrics by `voter_prompt_id`,
/// reviewers by (`voter_id`, `voter_prompt_id`), byte-wise; only those
/// with `rated_votes` ≥ 1.
pub fn report(cfg: &Config, tables: &Tables) -> ReputationOut {
    let engine = cfg.engine();
    let p = &engine.reputation;
    let mut rubrics = Vec::new();
    let mut voters = Vec::new();
    for rubric in tables.rubrics() {
        let table = Table::build(p, tables.sums(&rubric, Epoch::MAX));
        let n = table.totals.n;
        if n == 0 {
            continue;
        }
        let model = engine.params(&rubric).reputation_model.as_str();
        let c = table.confusion.as_ref();
        rubrics.push(RubricRow {
            voter_prompt_id: rubric.to_string(),
            rated_votes: n,
            mean_sq_deviation: unfix(table.totals.q) / n as f64,
            noise_variance: table.noise_variance,
            model: model.to_owned(),
            rates_from: c.map(|c| c.rates_from.as_str().to_owned()),
            base_rate: c.map(|c| c.base_rate),
            sensitivity: c.map(|c| c.sensitivity),
            specificity: c.map(|c| c.specificity),
            evidence_scale: c.map(|c| c.evidence_scale),
            prior_weight: c.map(|c| {
                if c.prior.0 > 0.5 {
                    c.prior.1
                } else {
                    -c.prior.1
                }
            }),
        });
        for (voter, r) in &table.voters {
            let sides = c.and_then(|c| c.voters.get(voter));
            voters.push(VoterRow {
                voter_id: voter.to_string(),
                voter_prompt_id: rubric.to_string(),
                rated_votes: r.terms.n,
                mean_sq_deviation: unfix(r.terms.q) / r.terms.n as f64,
                noise_variance: r.noise_variance,
                weight: r.weight,
                model: model.to_owned(),
                confusion_votes: sides.map(|s| s.votes),
                sensitivity: sides.map(|s| s.sensitivity),
                specificity: sides.map(|s| s.specificity),
                pass_weight: sides.map(|s| s.pass_weight),
                flag_weight: sides.map(|s| s.flag_weight),
            });
        }
    }
    voters
        .sort_by(|a, b| (&a.voter_id, &a.voter_prompt_id).cmp(&(&b.voter_id, &b.voter_prompt_id)));
    ReputationOut { rubrics, voters }
}

/// A sink that keeps nothing: only the tables matter here.
struct Discard;

impl Sink for Discard {
    fn updates(&mut self, updates: &mut Vec<ScoreUpdate>) -> std::io::Result<()> {
        updates.clear();
        Ok(())
    }

    fn rejected(&mut self, _: &Rejection, _: &[u8], _: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// Replays `input`, seals every epoch at its end and returns the report,
/// with progress on stderr.
pub fn report_file(
    cfg: &Config,
    input: &Path,
) -> Result<(ReputationOut, ReplaySummary), ReplayError> {
    let run_cfg = match cfg.reputation.mode {
        Mode::Off => cfg.with_reputation_mode(Mode::Shadow),
        _ => cfg.clone(),
    };
    let (summary, out) = run_file_detached(
        &run_cfg,
        input,
        "reputation",
        &mut Discard,
        |_| (),
        |e| {
            e.seal_all();
            report(cfg, e.tables())
        },
    )?;
    Ok((out, summary))
}

/// The sealed deltas of `input` replayed as one partition of several
/// (`replay --partition-files`): what it would publish, epoch by epoch
/// (the end of its input seals nothing).
pub fn partition_deltas(cfg: &Config, input: &Path) -> Result<Vec<(TermsKey, Terms)>, ReplayError> {
    let shadow = cfg.with_reputation_mode(Mode::Shadow);
    let (_, deltas) = run_file_detached(
        &shadow,
        input,
        "partition",
        &mut Discard,
        Engine::share_tables,
        |e| e.take_published().0,
    )?;
    Ok(deltas)
}

/// The report for a terminal: the rubrics, then per rubric its reviewers
/// from the lowest weight up.
pub fn table(r: &ReputationOut) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<24} {:>12} {:>18} {:>14}",
        "voter_prompt_id", "rated_votes", "mean_sq_deviation", "noise_variance"
    );
    for row in &r.rubrics {
        let _ = writeln!(
            s,
            "{:<24} {:>12} {:>18.6} {:>14.6}",
            row.voter_prompt_id, row.rated_votes, row.mean_sq_deviation, row.noise_variance
        );
    }
    for rubric in &r.rubrics {
        let mut rows: Vec<&VoterRow> = r
            .voters
            .iter()
            .filter(|v| v.voter_prompt_id == rubric.voter_prompt_id)
            .collect();
        rows.sort_by(|a, b| a.weight.total_cmp(&b.weight));
        let _ = writeln!(s, "\n{} (lowest weight first)", rubric.voter_prompt_id);
        if let (Some(from), Some(pi), Some(prior)) =
            (&rubric.rates_from, rubric.base_rate, rubric.prior_weight)
        {
            let _ = writeln!(
                s,
                "  model {}; confusion: rates from the {from}, base rate {pi:.4}, prior {prior:+.4}",
                rubric.model
            );
        }
        let _ = writeln!(
            s,
            "  {:<24} {:>8} {:>12} {:>18} {:>14} {:>11} {:>11} {:>11} {:>11}",
            "voter_id",
            "weight",
            "rated_votes",
            "mean_sq_deviation",
            "noise_variance",
            "sensitivity",
            "specificity",
            "pass_weight",
            "flag_weight"
        );
        let opt = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.4}"));
        for v in rows {
            let _ = writeln!(
                s,
                "  {:<24} {:>8.4} {:>12} {:>18.6} {:>14.6} {:>11} {:>11} {:>11} {:>11}",
                v.voter_id,
                v.weight,
                v.rated_votes,
                v.mean_sq_deviation,
                v.noise_variance,
                opt(v.sensitivity),
                opt(v.specificity),
                opt(v.pass_weight),
                opt(v.flag_weight)
            );
        }
    }
    s
}
