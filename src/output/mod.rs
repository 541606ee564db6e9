//! Output events → JSON (SPEC §5). Pure: the caller passes `processed_at`.

use serde::Serialize;

use crate::engine::{Entry, ScoreUpdate};
use crate::input::Rejection;
use crate::time::{format_timestamp, Nanos};

pub const SCHEMA_VERSION: u32 = 1;

/// Where a rejected message came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Source {
    Kafka {
        topic: String,
        partition: i32,
        offset: i64,
    },
    Line {
        line: u64,
    },
}

#[derive(Serialize)]
struct Params<'a> {
    lambda: f64,
    time_unit: &'a str,
    window_seconds: WindowSeconds,
    variance_threshold: f64,
    aggregator: &'a str,
    temperature: f64,
}

/// `window_seconds` printed as an integer when it is one (60, not 60.0).
struct WindowSeconds(f64);

impl Serialize for WindowSeconds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        if v.fract() == 0.0 && v.abs() < 9.0e15 {
            s.serialize_i64(v as i64)
        } else {
            s.serialize_f64(v)
        }
    }
}

/// A timestamp (RFC 3339, as [`format_timestamp`]) serialized from a
/// buffer on the stack: an event has several, and each was an allocation.
struct Ts(Nanos);

impl Serialize for Ts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (buf, n) = crate::time::timestamp_bytes(self.0);
        s.serialize_str(std::str::from_utf8(&buf[..n]).unwrap_or("invalid"))
    }
}

/// The `vote_ids` of a batch, serialized without collecting them first.
struct VoteIds<'a>(&'a [Entry]);

impl Serialize for VoteIds<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|e| &*e.vote_id))
    }
}

#[derive(Serialize)]
struct BatchOut<'a> {
    window_start: Ts,
    window_end: Option<Ts>,
    first_vote_at: Ts,
    last_vote_at: Ts,
    votes: usize,
    abstentions: u32,
    superseded: u32,
    weight_sum: f64,
    mean_vote: f64,
    aggregate: f64,
    variance: f64,
    vote_ids: VoteIds<'a>,
}

#[derive(Serialize)]
struct ScoreUpdated<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    schema_version: u32,
    processed_at: &'a str,
    inference_id: &'a str,
    voter_prompt_id: &'a str,
    model_id: Option<&'a str>,
    update_seq: u64,
    score: f64,
    previous_score: f64,
    alpha: f64,
    freshness: f64,
    delta_t_seconds: f64,
    ambiguous: bool,
    params: Params<'a>,
    batch: BatchOut<'a>,
}

#[derive(Serialize)]
struct FlagVote<'a> {
    vote_id: &'a str,
    voter_id: &'a str,
    value: f64,
    weight: f64,
    timestamp: Ts,
}

#[derive(Serialize)]
struct AmbiguityFlagged<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    schema_version: u32,
    processed_at: &'a str,
    inference_id: &'a str,
    voter_prompt_id: &'a str,
    model_id: Option<&'a str>,
    update_seq: u64,
    score: f64,
    variance: f64,
    threshold: f64,
    mean_vote: f64,
    votes: Vec<FlagVote<'a>>,
}

#[derive(Serialize)]
struct VoteRejected<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    schema_version: u32,
    processed_at: &'a str,
    reason: &'static str,
    detail: &'a str,
    payload: &'a str,
    source: &'a Source,
}

fn to_json<T: Serialize>(v: &T) -> String {
    // An event is about 700 bytes: one allocation instead of growing from
    // serde_json's 128 four times.
    let mut out = Vec::with_capacity(1024);
    match serde_json::to_writer(&mut out, v) {
        // serde_json writes valid UTF-8.
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        // Serializing these plain structs cannot fail (no maps with non-string keys).
        Err(e) => format!("{{\"type\":\"encode_error\",\"detail\":\"{e}\"}}"),
    }
}

/// `score_updated` as one JSON object.
pub fn score_updated_json(u: &ScoreUpdate, processed_at: &str) -> String {
    let ev = ScoreUpdated {
        kind: "score_updated",
        schema_version: SCHEMA_VERSION,
        processed_at,
        inference_id: &u.series.inference_id,
        voter_prompt_id: &u.series.voter_prompt_id,
        model_id: u.model_id.as_deref(),
        update_seq: u.update_seq,
        score: u.score,
        previous_score: u.previous_score,
        alpha: u.alpha,
        freshness: 1.0 - u.alpha,
        delta_t_seconds: u.delta_t_seconds,
        ambiguous: u.ambiguous,
        params: Params {
            lambda: u.params.lambda,
            time_unit: u.params.time_unit.as_str(),
            window_seconds: WindowSeconds(u.window_seconds),
            variance_threshold: u.params.variance_threshold,
            aggregator: u.params.aggregator.as_str(),
            temperature: u.params.temperature,
        },
        batch: BatchOut {
            window_start: Ts(u.window_start),
            window_end: u.window_end.map(Ts),
            first_vote_at: Ts(u.first_vote_at),
            last_vote_at: Ts(u.last_vote_at),
            votes: u.votes.len(),
            abstentions: u.abstentions,
            superseded: u.superseded,
            weight_sum: u.weight_sum,
            mean_vote: u.mean_vote,
            aggregate: u.aggregate,
            variance: u.variance,
            vote_ids: VoteIds(&u.votes),
        },
    };
    to_json(&ev)
}

/// `ambiguity_flagged` as one JSON object (only for ambiguous updates).
pub fn ambiguity_flagged_json(u: &ScoreUpdate, processed_at: &str) -> String {
    let ev = AmbiguityFlagged {
        kind: "ambiguity_flagged",
        schema_version: SCHEMA_VERSION,
        processed_at,
        inference_id: &u.series.inference_id,
        voter_prompt_id: &u.series.voter_prompt_id,
        model_id: u.model_id.as_deref(),
        update_seq: u.update_seq,
        score: u.score,
        variance: u.variance,
        threshold: u.params.variance_threshold,
        mean_vote: u.mean_vote,
        votes: u
            .votes
            .iter()
            .map(|e| FlagVote {
                vote_id: &e.vote_id,
                voter_id: &e.voter_id,
                value: e.value.unwrap_or_default(),
                weight: e.weight,
                timestamp: Ts(e.timestamp),
            })
            .collect(),
    };
    to_json(&ev)
}

/// The output topic an event goes to.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
pub enum Route {
    /// `outputs.scores_topic`: every `score_updated`.
    Scores,
    /// `outputs.flags_topic`: `ambiguity_flagged`.
    Flags,
    /// `outputs.dlq_topic`: `vote_rejected`.
    Dlq,
}

impl Route {
    pub const ALL: [Route; 3] = [Route::Scores, Route::Flags, Route::Dlq];

    /// Position in [`Route::ALL`] (for per-route tables).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The events of one score update in emission order, each with its route:
/// `score_updated` (scores), then `ambiguity_flagged` (flags) when the batch
/// was flagged. Both shells (replay and the service) emit through this, so
/// they route alike; the Kafka key of both is the inference id.
pub fn score_update_events<E>(
    u: &ScoreUpdate,
    processed_at: &str,
    mut emit: impl FnMut(Route, String) -> Result<(), E>,
) -> Result<(), E> {
    emit(Route::Scores, score_updated_json(u, processed_at))?;
    if u.ambiguous {
        emit(Route::Flags, ambiguity_flagged_json(u, processed_at))?;
    }
    Ok(())
}

/// `vote_rejected` as one JSON object.
pub fn vote_rejected_json(
    r: &Rejection,
    payload: &str,
    source: &Source,
    processed_at: &str,
) -> String {
    let ev = VoteRejected {
        kind: "vote_rejected",
        schema_version: SCHEMA_VERSION,
        processed_at,
        reason: r.reason.as_str(),
        detail: &r.detail,
        payload,
        source,
    };
    to_json(&ev)
}

/// `processed_at` for a wall-clock instant.
pub fn processed_at(now: Nanos) -> String {
    format_timestamp(now)
}
