//! The close step (contract §2 (5)–(6), §3): which batches a watermark or a
//! full batch closes, in what order, and the score update each closed
//! batch makes of its series.

use super::reputation::{self, confusion, Model, Table};
use super::score::Aggregator;
use super::score::Evidence;
use super::*;

impl Engine {
    /// The single close step: the full batch (if any) and every batch whose
    /// window the watermark has closed, in (window start, series, seq) order.
    pub(super) fn close_ready(&mut self, full: Option<u64>, out: &mut Vec<ScoreUpdate>) {
        let wm = self.meta.watermark;
        while let Some(entry) = self.windows.first_entry() {
            if !self.cfg.is_closed(*entry.key(), wm) {
                break;
            }
            let seqs = entry.remove();
            for seq in self.in_close_order(seqs) {
                self.close_batch(seq, out);
            }
        }
        // Its window is still open (else it closed above), and every window
        // closed above starts before it: it comes last.
        if let Some(seq) = full {
            self.close_batch(seq, out);
        }
    }

    /// The open batches among `seqs` (those closed since are skipped) in
    /// close order: (window start, series, seq).
    pub(super) fn in_close_order(&self, seqs: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut keys: Vec<&BatchKey> = seqs
            .into_iter()
            .filter_map(|seq| self.batches.get(&seq).map(|b| &b.key))
            .collect();
        keys.sort_unstable();
        keys.into_iter().map(|k| k.seq).collect()
    }

    /// Closes the open batch `seq` (nothing if it is closed already): scores
    /// it, or in `learned` mode keeps it pending at the barrier (contract §14)
    /// while its table is not final or an earlier batch waits.
    pub(super) fn close_batch(&mut self, seq: u64, out: &mut Vec<ScoreUpdate>) {
        let Some(OpenBatch { key, batch }) = self.batches.remove(&seq) else {
            return;
        };
        if batch.stored {
            self.deleted_batches.push(key.clone());
        }
        if self.cfg.reputation.learned() {
            self.score_ready(out);
            if self.must_wait(&key) {
                self.pend(key, batch);
                return;
            }
        }
        self.score_closed(key, batch, None, out);
    }

    /// Scores a closed batch: its series' update, with the model id it had
    /// when it closed (`model_at_close`, a batch that waited) or has now.
    pub(super) fn score_closed(
        &mut self,
        key: BatchKey,
        batch: Batch,
        model_at_close: Option<Option<Id>>,
        out: &mut Vec<ScoreUpdate>,
    ) {
        let seq = key.seq;
        let accepted = batch.entries.len() as u64;
        let superseded = batch.entries.iter().filter(|e| !e.live).count() as u32;
        let abstentions = batch
            .entries
            .iter()
            .filter(|e| e.live && e.value.is_none())
            .count() as u32;
        let mut counted: Vec<Entry> = batch
            .entries
            .into_iter()
            .filter(|e| e.live && e.value.is_some())
            .collect();
        // Timestamp, then arrival order (the sort is stable).
        counted.sort_by_key(|e| e.timestamp);
        self.counters.abstentions += u64::from(abstentions);
        if self.cfg.query_index {
            self.note_unit(&key.series.voter_prompt_id, &counted);
        }
        // `learned` (contract §14, §15): each counted vote's weight in T_k
        // (and under `confusion` what it counts as, and the prior), and
        // (k − 1)·E.
        let learned = (self.cfg.reputation.learned() && !counted.is_empty()).then(|| {
            let rubric = &key.series.voter_prompt_id;
            let (table, until) = self.table_for(rubric, key.window_start);
            let applied = match self.cfg.params(rubric).reputation_model {
                Model::Noise => Applied {
                    weights: counted.iter().map(|e| table.weight(&e.voter_id)).collect(),
                    confusion: None,
                },
                Model::Confusion => confusion_applied(&table, &counted),
            };
            (applied, until)
        });
        let cfg = &self.cfg;
        // An open batch pins its series in the cache, so it is here; if not,
        // the score update is lost: the shell must stop before committing.
        let Some(entry) = self.series.get_mut(&key.series) else {
            let what = format!(
                "batch {seq} closed, but its series is not in the cache (an open batch pins it)"
            );
            self.inconsistent(&key.series, what);
            return;
        };
        entry.open.retain(|s| *s != seq);
        if !std::mem::replace(&mut entry.dirty, true) {
            self.dirty_series.push(key.series.clone());
        }
        let state = &mut entry.state;
        state.abstentions += u64::from(abstentions);
        state.pending = state.pending.saturating_sub(accepted);
        if counted.is_empty() {
            return;
        }
        let params = cfg.params(&key.series.voter_prompt_id).clone();
        // r'_i = r_i·ω_i in `learned` mode (one product), else r_i; under
        // `confusion` the value is what the vote counts as (contract §15).
        let pairs: Vec<(f64, f64)> = counted
            .iter()
            .enumerate()
            .map(|(i, e)| match &learned {
                Some((a, _)) => {
                    let value = match &a.confusion {
                        Some(c) => c.values[i],
                        None => e.value.unwrap_or_default(),
                    };
                    (value, e.weight * a.weights[i])
                }
                None => (e.value.unwrap_or_default(), e.weight),
            })
            .collect();
        let prior = learned
            .as_ref()
            .and_then(|(a, _)| a.confusion.as_ref())
            .map(|c| c.prior);
        let (m, mean, agg) = match prior {
            None => {
                let m = score::moments(&pairs);
                let agg = score::aggregate(&pairs, m.mean, params.aggregator, params.temperature);
                (m, m.mean, agg)
            }
            Some(prior) => confusion_moments(&pairs, prior, &params),
        };
        let first = counted
            .iter()
            .map(|e| e.timestamp)
            .min()
            .unwrap_or_default();
        let last = counted
            .iter()
            .map(|e| e.timestamp)
            .max()
            .unwrap_or_default();
        let unscored = state.last_vote_at.is_none() || state.update_seq == 0;
        let (prev_score, t_prev) = match state.last_vote_at {
            Some(t) if !unscored => (state.score, t),
            _ => {
                let from_inference = counted.iter().filter_map(|e| e.inference_time).min();
                (
                    cfg.initial_score,
                    from_inference.unwrap_or(last - cfg.initial_gap_ns),
                )
            }
        };
        let prev_evidence = if unscored {
            Evidence::default()
        } else {
            state.evidence
        };
        let dt_ns = (last - t_prev).max(0);
        let dt_seconds = dt_ns as f64 / NANOS_PER_SEC as f64;
        let alpha = score::decay(params.lambda, dt_seconds, params.time_unit);
        // The step, damped in `learned` mode by the batch's mean ω
        // (contract §14): R = Σ r_i against R' = Σ r'_i (`weight_sum`).
        let callers = learned.as_ref().map(|_| {
            let mut r = 0.0;
            for e in &counted {
                r += e.weight;
            }
            r
        });
        let step = |alpha: f64| match callers {
            Some(r) => reputation::damped_step(alpha, r, m.weight_sum),
            None => (alpha, 1.0 - alpha),
        };
        let (kappa, beta) = step(alpha);
        let new_score = score::step(kappa, beta, prev_score, agg);
        let evidence = prev_evidence.step(kappa, beta, m.concentration);
        let mut companions = Vec::with_capacity(cfg.companions.len());
        let mut companion_evidence = Vec::with_capacity(cfg.companions.len());
        for (k, d) in cfg.companions.iter().enumerate() {
            let (lambda, unit) = d.params(&key.series.voter_prompt_id);
            let (prev, prev_evidence) = match state.companion_scores.get(k) {
                Some(&s) if !unscored => (
                    s,
                    state
                        .companion_evidence
                        .get(k)
                        .copied()
                        .unwrap_or(prev_evidence),
                ),
                _ => (prev_score, prev_evidence),
            };
            let (kappa, beta) = step(score::decay(lambda, dt_seconds, unit));
            companions.push(Forecast {
                previous_score: prev,
                score: score::step(kappa, beta, prev, agg),
                previous_interval: prev_evidence.interval(prev, cfg.initial_score),
            });
            companion_evidence.push(prev_evidence.step(kappa, beta, m.concentration));
        }
        if !companions.is_empty() {
            state.companion_scores = companions.iter().map(|c| c.score).collect();
            state.companion_evidence = companion_evidence.into();
        }
        let ambiguous = score::is_ambiguous(
            counted.len(),
            m.variance,
            cfg.min_votes,
            params.variance_threshold,
        );
        let before = cfg
            .query_index
            .then(|| board::placement(&key.series.voter_prompt_id, state));
        state.score = new_score;
        state.evidence = evidence;
        state.last_vote_at = Some(last);
        state.update_seq += 1;
        state.votes += counted.len() as u64;
        state.ambiguous = ambiguous;
        let previous_mean_vote = state.last_mean_vote.replace(mean);
        let after = before
            .is_some()
            .then(|| board::placement(&key.series.voter_prompt_id, state));
        self.counters.score_updates += 1;
        if ambiguous {
            self.counters.flags += 1;
        }
        out.push(ScoreUpdate {
            series: key.series,
            model_id: model_at_close.unwrap_or_else(|| state.model_id.clone()),
            update_seq: state.update_seq,
            score: new_score,
            previous_score: prev_score,
            previous_mean_vote,
            series_votes: state.votes,
            alpha,
            delta_t_seconds: dt_seconds,
            ambiguous,
            window_seconds: cfg.window_seconds,
            params,
            window_start: key.window_start,
            window_end: (cfg.window_ns > 0).then(|| key.window_start + cfg.window_ns),
            first_vote_at: first,
            last_vote_at: last,
            abstentions,
            superseded,
            weight_sum: m.weight_sum,
            mean_vote: mean,
            aggregate: agg,
            variance: m.variance,
            votes: counted,
            effective_votes: evidence.effective_votes(),
            score_interval: evidence.interval(new_score, cfg.initial_score),
            previous_interval: prev_evidence.interval(prev_score, cfg.initial_score),
            companions,
            learned: learned.map(|(a, table_until)| Learned {
                weights: a.weights,
                step: beta,
                table_until,
                confusion: a.confusion,
            }),
        });
        if let (Some(from), Some(to)) = (before, after) {
            self.move_on_board(from, to);
        }
    }
}

/// What a batch's votes count for under its rubric's model: the weights
/// (ω, or contract §15's g) and, under `confusion`, the values and prior.
struct Applied {
    weights: smallvec::SmallVec<[f64; 4]>,
    confusion: Option<Counted>,
}

/// Contract §15 "Scoring": each vote's (y, g) in T_k's `confusion` table,
/// and the prior when it carries weight. A batch with a graded value
/// counts each vote as itself with its §14 ω, a batch of 0/1 values
/// without a table with weight 1 (§3 exactly); neither has a prior.
fn confusion_applied(table: &Table, counted: &[Entry]) -> Applied {
    let binary = counted
        .iter()
        .all(|e| matches!(e.value, Some(x) if x == 0.0 || x == 1.0));
    let t = match &table.confusion {
        Some(t) if binary => t,
        // A graded batch scores as under `noise`; a 0/1 batch without a
        // table as §3.
        _ => {
            return Applied {
                weights: counted
                    .iter()
                    .map(|e| {
                        if binary {
                            1.0
                        } else {
                            table.weight(&e.voter_id)
                        }
                    })
                    .collect(),
                confusion: Some(Counted {
                    values: counted
                        .iter()
                        .map(|e| e.value.unwrap_or_default())
                        .collect(),
                    prior: None,
                    by_side: false,
                }),
            };
        }
    };
    let mut weights = smallvec::SmallVec::new();
    let mut values = smallvec::SmallVec::new();
    for e in counted {
        let x = e.value.unwrap_or_default();
        let (y, g) = t.counted(&e.voter_id, x, table.weight(&e.voter_id));
        values.push(y);
        weights.push(g);
    }
    let prior = (t.prior.1 > 0.0).then_some(t.prior);
    Applied {
        weights,
        confusion: Some(Counted {
            values,
            prior,
            by_side: true,
        }),
    }
}

/// Contract §15's moments of the (y_i, r'_i): σ² and D about the votes
/// alone, the mean and the aggregate with the prior as one more value of
/// weight w₀ (not a vote: the power mean's k counts votes). With no
/// evidence (R' = 0) the mean and aggregate are 0.5, σ² and D 0 (the step
/// is then 0).
fn confusion_moments(
    pairs: &[(f64, f64)],
    prior: Option<(f64, f64)>,
    params: &RubricParams,
) -> (score::Moments, f64, f64) {
    let Some(mean) = confusion::mean_with_prior(pairs, prior) else {
        let mut weight_sum = 0.0;
        for &(_, r) in pairs {
            weight_sum += r;
        }
        let m = score::Moments {
            weight_sum,
            mean: 0.5,
            variance: 0.0,
            concentration: 0.0,
        };
        return (m, 0.5, 0.5);
    };
    let m = score::moments(pairs);
    let agg = match (params.aggregator, prior) {
        (Aggregator::Mean, _) => mean,
        (Aggregator::PowerMean, None) => score::power_mean(pairs, params.temperature),
        (Aggregator::PowerMean, Some(p)) => {
            let mut with: Vec<(f64, f64)> = pairs.to_vec();
            with.push(p);
            score::power_mean_of(&with, params.temperature, pairs.len())
        }
    };
    (m, mean, agg)
}
