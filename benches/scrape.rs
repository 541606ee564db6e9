//! What one scrape of `/metrics` costs when the registry is large
//! (docs/PERFORMANCE.md, "Scrape cost"):
//!
//!   scrape [MODELS] [RUBRICS] [RENDERS]
//!
//! Fills the service's metrics as a busy instance would have them:
//! MODELS × RUBRICS (model_id, voter_prompt_id) pairs (defaults 200 × 5,
//! the label cap at its default 200 for both labels), each with score
//! updates, flags, the leaderboard gauges and the agreement counters,
//! 64 held partitions with their watermark, lag and engine counters, and
//! every rejection reason. Then times RENDERS renders of the `/metrics`
//! text (what a scrape costs on the HTTP thread, without the socket) and
//! prints the mean time per render, the size of one exposition and its
//! number of lines.

use std::time::Instant;

use jurystream::engine::agreement::{Counted, RubricSums};
use jurystream::engine::board::{fixed, fixed_square, gauge_rows, BoardKey, BoardRow};
use jurystream::engine::reputation::Model;
use jurystream::engine::score::{Aggregator, TimeUnit};
use jurystream::engine::{Counters, RubricParams, ScoreUpdate, SeriesKey};
use jurystream::telemetry::Metrics;

const MAX_LABEL_VALUES: usize = 200;
const PARTITIONS: i32 = 64;

fn update(model: &str, rubric: &str, score: f64, ambiguous: bool) -> ScoreUpdate {
    ScoreUpdate {
        series: SeriesKey {
            inference_id: "i".into(),
            voter_prompt_id: rubric.into(),
        },
        model_id: Some(model.into()),
        update_seq: 1,
        score,
        previous_score: 0.5,
        previous_mean_vote: None,
        series_votes: 3,
        alpha: 0.1,
        delta_t_seconds: 1.0,
        ambiguous,
        params: RubricParams {
            lambda: 0.01,
            time_unit: TimeUnit::Seconds,
            variance_threshold: 0.05,
            aggregator: Aggregator::Mean,
            temperature: 0.5,
            reputation_model: Model::Noise,
        },
        window_seconds: 60.0,
        window_start: 0,
        window_end: None,
        first_vote_at: 0,
        last_vote_at: 0,
        abstentions: 0,
        superseded: 0,
        weight_sum: 3.0,
        mean_vote: score,
        aggregate: score,
        variance: 0.01,
        votes: vec![],
        effective_votes: None,
        score_interval: None,
        previous_interval: None,
        companions: vec![],
        learned: None,
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .map(|a| a.parse().expect("MODELS RUBRICS RENDERS"))
        .collect();
    let models = args.first().copied().unwrap_or(200);
    let rubrics = args.get(1).copied().unwrap_or(5);
    let renders = args.get(2).copied().unwrap_or(200);

    let m = Metrics::new(MAX_LABEL_VALUES);
    let mut board = rustc_hash::FxHashMap::default();
    let mut agreement = rustc_hash::FxHashMap::default();
    for i in 0..models {
        for r in 0..rubrics {
            let (model, rubric) = (format!("model-{i:04}"), format!("rubric-{r}"));
            let score = ((i * 7 + r * 13) % 100) as f64 / 100.0;
            for k in 0..3 {
                m.score_update(&update(&model, &rubric, score, k == 0), 1.7e9);
            }
            board.insert(
                BoardKey {
                    model_id: Some(model.as_str().into()),
                    voter_prompt_id: rubric.as_str().into(),
                },
                BoardRow {
                    series: 10,
                    score_sum: 10 * fixed(score),
                    ambiguous: 1,
                    votes: 30,
                    score_squares: 10 * fixed_square(score),
                },
            );
            let sums: &mut RubricSums = agreement.entry(rubric.as_str().into()).or_default();
            sums.units += 1;
            sums.pairable += 3;
            sums.sum += 3 * fixed(score);
            sums.square_sum += 3 * fixed_square(score);
            sums.within += fixed(0.01);
        }
    }
    // What the service does after a commit (service/session.rs).
    let rows = gauge_rows(board.iter(), |k| {
        m.pair_labels(k.model_id.as_deref(), &k.voter_prompt_id)
    });
    m.model_board(rows);
    let mut counted = Counted::default();
    let mut held = Vec::new();
    for p in 0..PARTITIONS {
        let partition = format!("votes-{p}");
        let c = Counters {
            accepted: 1000,
            duplicates: 3,
            ..Default::default()
        };
        m.engine_counters(&partition, &c, 10, 1 << 20, Some(1_700_000_000_000_000_000));
        m.consumer_lag("votes", p, 42);
        counted.baseline(&partition, &Default::default());
        for (rubric, sums) in counted.committed(&partition, &agreement) {
            m.agreement(&rubric, sums);
        }
        held.push((partition, true));
    }
    m.partitions_held(held);
    for r in jurystream::input::Reason::ALL {
        m.rejected(r);
    }
    for _ in 0..100 {
        m.commit_duration(0.02);
        m.restore_duration(0.5);
    }

    let text = m.render();
    let (bytes, lines) = (text.len(), text.lines().count());
    // Warm up, then time.
    for _ in 0..renders.min(10) {
        std::hint::black_box(m.render());
    }
    let started = Instant::now();
    for _ in 0..renders {
        std::hint::black_box(m.render());
    }
    let per = started.elapsed().as_secs_f64() / renders as f64;
    println!(
        "{models} models x {rubrics} rubrics, {PARTITIONS} partitions: {bytes} bytes, {lines} lines; \
         {renders} renders, {:.2} ms per render",
        per * 1e3
    );
}
