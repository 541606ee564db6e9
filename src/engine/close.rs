//! The close step (contract §2 (5)–(6), §3): which batches a watermark or a
//! full batch closes, in what order, and the score update each closed
//! batch makes of its series.

use super::reputation;
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
        // `learned` (contract §14): each counted vote's ω in T_k, and (k − 1)·E.
        let learned = (self.cfg.reputation.learned() && !counted.is_empty()).then(|| {
            let (table, until) = self.table_for(&key.series.voter_prompt_id, key.window_start);
            let weights: smallvec::SmallVec<[f64; 4]> =
                counted.iter().map(|e| table.weight(&e.voter_id)).collect();
            (weights, until)
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
        // r'_i = r_i·ω_i in `learned` mode (one product), else r_i.
        let pairs: Vec<(f64, f64)> = counted
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let r = match &learned {
                    Some((weights, _)) => e.weight * weights[i],
                    None => e.weight,
                };
                (e.value.unwrap_or_default(), r)
            })
            .collect();
        let m = score::moments(&pairs);
        let agg = score::aggregate(&pairs, m.mean, params.aggregator, params.temperature);
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
        let previous_mean_vote = state.last_mean_vote.replace(m.mean);
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
            mean_vote: m.mean,
            aggregate: agg,
            variance: m.variance,
            votes: counted,
            effective_votes: evidence.effective_votes(),
            score_interval: evidence.interval(new_score, cfg.initial_score),
            previous_interval: prev_evidence.interval(prev_score, cfg.initial_score),
            companions,
            learned: learned.map(|(weights, table_until)| Learned {
                weights,
                step: beta,
                table_until,
            }),
        });
        if let (Some(from), Some(to)) = (before, after) {
            self.move_on_board(from, to);
        }
    }
}
