//! Output events → JSON (contract §5). Pure: the caller passes `processed_at`.

use serde::Serialize;

use crate::engine::ScoreUpdate;
use crate::input::Rejection;
use crate::time::{format_timestamp, Nanos};

mod json;

use json::Json;

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

/// The fields both score events start with, in their order (the object
/// is left open).
fn score_event<'a>(
    out: &'a mut Vec<u8>,
    kind: &str,
    u: &ScoreUpdate,
    processed_at: &str,
) -> Json<'a> {
    let mut o = Json::object(out);
    o.str("type", kind)
        .u64("schema_version", SCHEMA_VERSION.into())
        .str("processed_at", processed_at)
        .str("inference_id", &u.series.inference_id)
        .str("voter_prompt_id", &u.series.voter_prompt_id)
        .opt_str("model_id", u.model_id.as_deref())
        .u64("update_seq", u.update_seq)
        .f64("score", u.score);
    o
}

/// `score_updated` as one JSON object, appended to `out`.
fn write_score_updated(out: &mut Vec<u8>, u: &ScoreUpdate, processed_at: &str) {
    let mut o = score_event(out, "score_updated", u, processed_at);
    o.f64("previous_score", u.previous_score)
        .f64("alpha", u.alpha)
        .f64("freshness", 1.0 - u.alpha)
        .f64("delta_t_seconds", u.delta_t_seconds)
        .bool("ambiguous", u.ambiguous);
    let mut p = o.open_object("params");
    p.f64("lambda", u.params.lambda)
        .str("time_unit", u.params.time_unit.as_str());
    // An integer when it is one (60, not 60.0).
    let w = u.window_seconds;
    if w.fract() == 0.0 && w.abs() < 9.0e15 {
        p.i64("window_seconds", w as i64);
    } else {
        p.f64("window_seconds", w);
    }
    p.f64("variance_threshold", u.params.variance_threshold)
        .str("aggregator", u.params.aggregator.as_str())
        .f64("temperature", u.params.temperature);
    p.close();
    let mut b = o.open_object("batch");
    b.ts("window_start", u.window_start)
        .opt_ts("window_end", u.window_end)
        .ts("first_vote_at", u.first_vote_at)
        .ts("last_vote_at", u.last_vote_at)
        .u64("votes", u.votes.len() as u64)
        .u64("abstentions", u.abstentions.into())
        .u64("superseded", u.superseded.into())
        .f64("weight_sum", u.weight_sum)
        .f64("mean_vote", u.mean_vote)
        .f64("aggregate", u.aggregate)
        .f64("variance", u.variance);
    let mut ids = b.open_array("vote_ids");
    for e in &u.votes {
        ids.str("", &e.vote_id);
    }
    ids.close();
    if let Some(l) = &u.learned {
        b.f64s_repeated("learned_weights", &l.weights)
            .f64("step", l.step)
            .ts_repeated("table_until", l.table_until);
        // contract §15: what each vote counted as, and the prior.
        if let Some(c) = &l.confusion {
            b.str("model", "confusion");
            let mut values = b.open_array("counted_as");
            for &y in &c.values {
                values.f64("", y);
            }
            values.close();
            match c.prior {
                Some((value, weight)) => {
                    let mut p = b.open_object("prior");
                    p.f64("value", value).f64("weight", weight);
                    p.close();
                }
                None => {
                    b.null("prior");
                }
            }
        }
    }
    b.close();
    o.opt_f64("effective_votes", u.effective_votes);
    match u.score_interval {
        Some((low, high)) => {
            let mut i = o.open_array("score_interval");
            i.f64("", low).f64("", high);
            i.close();
        }
        None => {
            o.null("score_interval");
        }
    }
    o.close();
}

/// `ambiguity_flagged` as one JSON object (only for ambiguous updates),
/// appended to `out`.
fn write_ambiguity_flagged(out: &mut Vec<u8>, u: &ScoreUpdate, processed_at: &str) {
    let mut o = score_event(out, "ambiguity_flagged", u, processed_at);
    o.f64("variance", u.variance)
        .f64("threshold", u.params.variance_threshold)
        .f64("mean_vote", u.mean_vote);
    let mut votes = o.open_array("votes");
    let learned = u.learned.as_ref().map(|l| &l.weights);
    let counted_as = u
        .learned
        .as_ref()
        .and_then(|l| l.confusion.as_ref())
        .map(|c| &c.values);
    for (i, e) in u.votes.iter().enumerate() {
        let mut v = votes.element_object();
        // `learned` mode: the applied weight r'_i = r_i·ω_i, then ω_i.
        let omega = learned.map(|w| w[i]);
        v.str("vote_id", &e.vote_id)
            .str("voter_id", &e.voter_id)
            .f64("value", e.value.unwrap_or_default());
        match omega {
            Some(w) => v.f64_repeated("weight", e.weight * w),
            None => v.f64("weight", e.weight),
        };
        v.ts("timestamp", e.timestamp);
        if let Some(w) = omega {
            v.f64_repeated("learned_weight", w);
        }
        if let Some(values) = counted_as {
            v.f64("counted_as", values[i]);
        }
        v.close();
    }
    votes.close();
    o.close();
}

/// An event is about 700 bytes: one allocation.
const EVENT_BYTES: usize = 1024;

fn to_string(write: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut out = Vec::with_capacity(EVENT_BYTES);
    write(&mut out);
    // Only strings and ASCII are written.
    String::from_utf8(out).expect("events are UTF-8")
}

/// `score_updated` as one JSON object.
pub fn score_updated_json(u: &ScoreUpdate, processed_at: &str) -> String {
    to_string(|out| write_score_updated(out, u, processed_at))
}

/// `ambiguity_flagged` as one JSON object (only for ambiguous updates).
pub fn ambiguity_flagged_json(u: &ScoreUpdate, processed_at: &str) -> String {
    to_string(|out| write_ambiguity_flagged(out, u, processed_at))
}

/// The output topic an event goes to. Stored records name it by its code
/// ([`Route::stored`]), not by its place here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// `outputs.scores_topic`: every `score_updated`.
    Scores,
    /// `outputs.flags_topic`: `ambiguity_flagged`.
    Flags,
    /// `outputs.dlq_topic`: `vote_rejected`.
    Dlq,
    /// `reputation.topic`: contract §14's sealed sums and seal records (modes
    /// `shadow` and `learned`; not an event).
    Reputation,
}

impl Route {
    pub const ALL: [Route; 4] = [Route::Scores, Route::Flags, Route::Dlq, Route::Reputation];

    /// Position in [`Route::ALL`] (for per-route tables).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The route's code in stored records (the cycle marker's floors and
    /// outbox events, `crate::state::format`): fixed, whatever the order
    /// of the variants. Formats 7 to 11 wrote postcard's variant index of
    /// this enum, one byte of the same value, so their records read as
    /// they are.
    pub fn stored(self) -> u8 {
        match self {
            Route::Scores => 0,
            Route::Flags => 1,
            Route::Dlq => 2,
            Route::Reputation => 3,
        }
    }

    /// The route a stored code names (`None`: no route has it).
    pub fn from_stored(code: u8) -> Option<Route> {
        match code {
            0 => Some(Route::Scores),
            1 => Some(Route::Flags),
            2 => Some(Route::Dlq),
            3 => Some(Route::Reputation),
            _ => None,
        }
    }
}

/// The events of one score update in emission order, each with its route:
/// `score_updated` (scores), then `ambiguity_flagged` (flags) when the batch
/// was flagged. Both shells (replay and the service) emit through this, so
/// they route alike; the Kafka key of both is the inference id.
pub fn score_update_events<E>(
    u: &ScoreUpdate,
    processed_at: &str,
    mut emit: impl FnMut(Route, Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    for route in score_update_routes(u) {
        let mut out = Vec::with_capacity(EVENT_BYTES);
        write_score_update_event(&mut out, route, u, processed_at);
        emit(route, out)?;
    }
    Ok(())
}

/// The routes of [`score_update_events`], in emission order.
pub fn score_update_routes(u: &ScoreUpdate) -> impl Iterator<Item = Route> {
    std::iter::once(Route::Scores).chain(u.ambiguous.then_some(Route::Flags))
}

/// The event of a score update on `route` (see [`score_update_routes`]),
/// appended to `out` (replay writes its lines into one buffer this way,
/// with no buffer per event).
pub fn write_score_update_event(
    out: &mut Vec<u8>,
    route: Route,
    u: &ScoreUpdate,
    processed_at: &str,
) {
    match route {
        Route::Scores => write_score_updated(out, u, processed_at),
        Route::Flags => write_ambiguity_flagged(out, u, processed_at),
        // Not routes of a score update.
        Route::Dlq | Route::Reputation => {}
    }
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
