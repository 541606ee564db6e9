//! Pure: one answer for the group from every instance's answer for its
//! partitions (contract §9, §11), or which partitions no instance holds ready
//! (a 503).

use std::collections::BTreeMap;

use crate::engine::agreement::{ReviewerStats, RubricRow, RubricSums, VoterRow};
use crate::engine::board::{BoardKey, BoardRow};

use super::{
    BoardRowOut, InferenceOut, LeaderRow, LeaderboardOut, LocalAnswer, ReviewerOut, RubricSumsOut,
    RubricsOut, SeriesOut, Tp, Unavailable, VoterOrder, VotersOut,
};

/// For every partition of the group, the data of one instance that holds
/// it ready; every instance's topic sizes count (the largest wins, so a
/// partition added to a topic is waited for).
pub(super) fn covering<T>(answers: Vec<LocalAnswer<T>>) -> Result<Vec<Vec<T>>, Unavailable> {
    let mut topics: BTreeMap<String, i32> = BTreeMap::new();
    let mut ready: BTreeMap<Tp, Vec<T>> = BTreeMap::new();
    for a in answers {
        for (t, n) in a.topics {
            let e = topics.entry(t).or_insert(n);
            *e = (*e).max(n);
        }
        for p in a.partitions {
            if p.ready {
                ready.entry((p.topic, p.partition)).or_insert(p.data);
            }
        }
    }
    if topics.is_empty() {
        return Err(Unavailable::NoTopics);
    }
    let missing: Vec<Tp> = topics
        .iter()
        .flat_map(|(t, &n)| (0..n).map(move |p| (t.clone(), p)))
        .filter(|tp| !ready.contains_key(tp))
        .collect();
    if !missing.is_empty() {
        return Err(Unavailable::Partitions(missing));
    }
    Ok(ready.into_values().collect())
}

/// The series of one inference from every instance's answer, in
/// `voter_prompt_id` byte order; `Ok(None)` when no partition has one.
pub fn merge_inference(
    inference_id: &str,
    answers: Vec<LocalAnswer<SeriesOut>>,
) -> Result<Option<InferenceOut>, Unavailable> {
    let mut series: Vec<SeriesOut> = covering(answers)?.into_iter().flatten().collect();
    if series.is_empty() {
        return Ok(None);
    }
    series.sort_by(|a, b| {
        a.voter_prompt_id
            .as_bytes()
            .cmp(b.voter_prompt_id.as_bytes())
    });
    Ok(Some(InferenceOut {
        inference_id: inference_id.to_owned(),
        series,
    }))
}

/// The leaderboard from every instance's answer (optionally one rubric's),
/// sorted by `voter_prompt_id`, then `mean_score` descending, then
/// `model_id` (null first). A row whose fixed-point sum does not parse is
/// skipped (it cannot come from this program).
pub fn merge_board(
    answers: Vec<LocalAnswer<BoardRowOut>>,
    voter_prompt_id: Option<&str>,
) -> Result<LeaderboardOut, Unavailable> {
    // A row and whether every part of it knew its squares.
    let mut rows: BTreeMap<BoardKey, (BoardRow, bool)> = BTreeMap::new();
    for r in covering(answers)?.into_iter().flatten() {
        if voter_prompt_id.is_some_and(|v| v != r.voter_prompt_id) {
            continue;
        }
        let Ok(score_sum) = r.score_sum_fixed.parse::<i128>() else {
            continue;
        };
        let squares = r.score_squares_fixed.and_then(|s| s.parse::<i128>().ok());
        let key = BoardKey {
            model_id: r.model_id.as_deref().map(crate::input::Id::from),
            voter_prompt_id: r.voter_prompt_id.as_str().into(),
        };
        let (row, known) = rows.entry(key).or_insert((BoardRow::default(), true));
        *known &= squares.is_some();
        row.add(&BoardRow {
            series: r.series,
            score_sum,
            ambiguous: r.ambiguous_series,
            votes: r.votes,
            score_squares: squares.unwrap_or_default(),
        });
    }
    let mut out: Vec<LeaderRow> = rows
        .into_iter()
        .filter(|(_, (r, _))| r.series > 0)
        .map(|(k, (r, known))| LeaderRow {
            model_id: k.model_id.as_deref().map(str::to_owned),
            voter_prompt_id: k.voter_prompt_id.to_string(),
            series: r.series,
            mean_score: r.mean_score(),
            ambiguous_series: r.ambiguous,
            votes: r.votes,
            score_sd: r.score_sd().filter(|_| known),
            mean_score_interval: r.mean_score_interval().filter(|_| known),
        })
        .collect();
    out.sort_by(|a, b| {
        a.voter_prompt_id
            .as_bytes()
            .cmp(b.voter_prompt_id.as_bytes())
            .then(b.mean_score.total_cmp(&a.mean_score))
            .then_with(|| {
                let m = |r: &LeaderRow| r.model_id.as_ref().map(|s| s.as_bytes().to_vec());
                m(a).cmp(&m(b))
            })
    });
    Ok(LeaderboardOut { rows: out })
}

/// The agreement rows of the whole group: every partition's sums added
/// exactly, α computed once (contract §11), in `voter_prompt_id` byte order.
pub fn merge_rubrics(answers: Vec<LocalAnswer<RubricSumsOut>>) -> Result<RubricsOut, Unavailable> {
    let mut sums: BTreeMap<String, RubricSums> = BTreeMap::new();
    for r in covering(answers)?.into_iter().flatten() {
        // A row that does not parse cannot come from this program.
        if let Some(s) = r.sums() {
            sums.entry(r.voter_prompt_id).or_default().add(&s);
        }
    }
    Ok(RubricsOut {
        rubrics: sums.iter().map(|(r, s)| RubricRow::of(r, s)).collect(),
    })
}

/// Reviewer rows of the whole group (each reviewer's partitions added), in
/// (`voter_id`, `voter_prompt_id`) byte order or by deviation, at most
/// `limit`.
pub fn merge_voters(
    answers: Vec<LocalAnswer<ReviewerOut>>,
    order: VoterOrder,
    limit: usize,
) -> Result<VotersOut, Unavailable> {
    let mut stats: BTreeMap<(String, String), ReviewerStats> = BTreeMap::new();
    for r in covering(answers)?.into_iter().flatten() {
        let Ok(sq_dev) = r.sq_dev_fixed.parse::<i128>() else {
            continue;
        };
        stats
            .entry((r.voter_id, r.voter_prompt_id))
            .or_default()
            .add(&ReviewerStats {
                rated: r.rated_votes,
                sq_dev,
            });
    }
    let mut voters: Vec<VoterRow> = stats
        .iter()
        .map(|((v, r), s)| VoterRow::of(v, r, s))
        .collect();
    if order == VoterOrder::Deviation {
        // Stable: ties stay in voter_id order.
        voters.sort_by(|a, b| {
            let d = |r: &VoterRow| r.mean_sq_deviation.unwrap_or(0.0);
            d(b).total_cmp(&d(a))
        });
    }
    voters.truncate(limit);
    Ok(VotersOut { voters })
}
