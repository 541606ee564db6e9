//! Bytes → a validated [`Vote`] or a [`Rejection`] (contract §1).
//!
//! Decoding is a single `serde_json` pass over the message into borrowed
//! scalars; only the fields the contract names are looked at, every other
//! value is skipped (but still checked for well-formedness and depth).

mod decode;

use crate::time::{format_timestamp, parse_timestamp, Nanos};
pub use decode::{RawVote, Scalar};

/// Why a message was rejected; the names are part of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    MalformedJson,
    MissingField,
    InvalidField,
    InvalidTimestamp,
    Late,
    TooLarge,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::MalformedJson,
        Reason::MissingField,
        Reason::InvalidField,
        Reason::InvalidTimestamp,
        Reason::Late,
        Reason::TooLarge,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MalformedJson => "malformed_json",
            Reason::MissingField => "missing_field",
            Reason::InvalidField => "invalid_field",
            Reason::InvalidTimestamp => "invalid_timestamp",
            Reason::Late => "late",
            Reason::TooLarge => "too_large",
        }
    }
}

/// A refused message: the reason and a human-readable detail naming the field.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub reason: Reason,
    pub detail: String,
}

impl Rejection {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Rejection {
            reason,
            detail: detail.into(),
        }
    }
}

/// An id (inference, voter, rubric, vote, model): up to 23 bytes inline,
/// so the usual ids cost no allocation, and a clone is a copy (a longer
/// one is shared, counted). Serialized as a string, as `Arc<str>` was.
pub type Id = smol_str::SmolStr;

/// A validated vote. Ids are opaque strings (integers already turned into
/// their decimal form).
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    pub inference_id: Id,
    pub voter_id: Id,
    pub voter_prompt_id: Id,
    /// `None` is an abstention.
    pub value: Option<f64>,
    pub timestamp: Nanos,
    pub vote_id: Option<Id>,
    pub model_id: Option<Id>,
    pub weight: f64,
    pub inference_time: Option<Nanos>,
}

/// What the decoder needs from the configuration.
#[derive(Debug, Clone, Default)]
pub struct DecodeOptions {
    pub max_message_bytes: usize,
    pub default_voter_prompt_id: Option<String>,
}

const MAX_ID_BYTES: usize = 256;

/// Decodes and validates one message.
pub fn decode_vote(bytes: &[u8], opts: &DecodeOptions) -> Result<Vote, Rejection> {
    if bytes.len() > opts.max_message_bytes {
        return Err(Rejection::new(
            Reason::TooLarge,
            format!(
                "message is {} bytes, over input.max_message_bytes ({})",
                bytes.len(),
                opts.max_message_bytes
            ),
        ));
    }
    let raw = decode::parse(bytes)?;
    validate(raw, opts)
}

/// Refuses a vote whose timestamp is more than `max_skew` ahead of `now`
/// (the wall clock of a live service; contract §1 `invalid_timestamp`).
pub fn check_future_skew(vote: &Vote, now: Nanos, max_skew: Nanos) -> Result<(), Rejection> {
    if vote.timestamp > now.saturating_add(max_skew) {
        return Err(Rejection::new(
            Reason::InvalidTimestamp,
            format!(
                "timestamp: {} is more than input.max_future_skew_seconds ahead of the wall clock",
                format_timestamp(vote.timestamp)
            ),
        ));
    }
    Ok(())
}

fn validate(raw: RawVote<'_>, opts: &DecodeOptions) -> Result<Vote, Rejection> {
    let inference_id = id_field("inference_id", raw.inference_id)?;
    let voter_id = id_field("voter_id", raw.voter_id)?;
    let voter_prompt_id = match id_field("voter_prompt_id", raw.voter_prompt_id)? {
        Some(v) => Some(v),
        None => opts.default_voter_prompt_id.as_deref().map(Id::from),
    };
    let (Some(inference_id), Some(voter_id), Some(voter_prompt_id)) = (
        inference_id.clone(),
        voter_id.clone(),
        voter_prompt_id.clone(),
    ) else {
        let name = if inference_id.is_none() {
            "inference_id"
        } else if voter_id.is_none() {
            "voter_id"
        } else {
            "voter_prompt_id"
        };
        return Err(missing(name));
    };
    let value = match raw.vote {
        None => return Err(missing("vote")),
        Some(v) => vote_value(v)?,
    };
    let timestamp = match (raw.timestamp, raw.vote_time) {
        (Some(t), _) if !t.is_null() => time_field("timestamp", t)?,
        (_, Some(t)) if !t.is_null() => time_field("vote_time", t)?,
        _ => return Err(missing("timestamp")),
    };
    let vote_id = id_field("vote_id", raw.vote_id)?;
    let model_id = match raw.model_id {
        None | Some(Scalar::Null) => None,
        Some(Scalar::Str(s)) => Some(check_len("model_id", s.as_ref())?.into()),
        Some(_) => {
            return Err(Rejection::new(
                Reason::InvalidField,
                "model_id: must be a string",
            ))
        }
    };
    let weight = match raw.reputation {
        None | Some(Scalar::Null) => 1.0,
        Some(s) => match s.as_f64() {
            Some(r) if r.is_finite() && r > 0.0 => r,
            Some(_) => {
                return Err(Rejection::new(
                    Reason::InvalidField,
                    "reputation: must be > 0",
                ))
            }
            None => {
                return Err(Rejection::new(
                    Reason::InvalidField,
                    "reputation: must be a number",
                ))
            }
        },
    };
    let inference_time = match raw.inference_time {
        None | Some(Scalar::Null) => None,
        Some(t) => Some(time_field("inference_time", t)?),
    };
    Ok(Vote {
        inference_id,
        voter_id,
        voter_prompt_id,
        value,
        timestamp,
        vote_id,
        model_id,
        weight,
        inference_time,
    })
}

fn missing(name: &str) -> Rejection {
    Rejection::new(
        Reason::MissingField,
        format!("{name}: required field is missing"),
    )
}

fn check_len<'s>(name: &str, s: &'s str) -> Result<&'s str, Rejection> {
    if s.is_empty() || s.len() > MAX_ID_BYTES {
        return Err(Rejection::new(
            Reason::InvalidField,
            format!("{name}: must be 1..={MAX_ID_BYTES} bytes, got {}", s.len()),
        ));
    }
    Ok(s)
}

/// An id: a string of 1..=256 bytes or an integer (its decimal form). Null is absent.
fn id_field(name: &str, v: Option<Scalar<'_>>) -> Result<Option<Id>, Rejection> {
    match v {
        None | Some(Scalar::Null) => Ok(None),
        Some(Scalar::Str(s)) => Ok(Some(check_len(name, s.as_ref())?.into())),
        Some(Scalar::U64(n)) => Ok(Some(n.to_string().into())),
        Some(Scalar::I64(n)) => Ok(Some(n.to_string().into())),
        // serde_json reads the integer literal `-0` as the float -0.0.
        Some(Scalar::F64(x)) if x == 0.0 && x.is_sign_negative() => Ok(Some("0".into())),
        Some(Scalar::F64(_)) => Err(Rejection::new(
            Reason::InvalidField,
            format!("{name}: must be a string or integer (integers without fraction or exponent, within i64/u64)"),
        )),
        Some(_) => Err(Rejection::new(
            Reason::InvalidField,
            format!("{name}: must be a string or integer"),
        )),
    }
}

/// The vote labels of contract §1, matched after ASCII lower-casing.
pub fn label_value(label: &str) -> Option<f64> {
    if label.len() > 7 {
        return None;
    }
    let mut buf = [0u8; 7];
    let lower = &mut buf[..label.len()];
    lower.copy_from_slice(label.as_bytes());
    lower.make_ascii_lowercase();
    Some(match &*lower {
        b"pass" => 1.0,
        b"flag" => 0.0,
        b"fully" => 1.0,
        b"mostly" => 0.9,
        b"partial" => 0.7,
        b"minor" => 0.3,
        b"none" => 0.0,
        _ => return None,
    })
}

fn vote_value(v: Scalar<'_>) -> Result<Option<f64>, Rejection> {
    match v {
        Scalar::Null => Ok(None),
        Scalar::Bool(b) => Ok(Some(if b { 1.0 } else { 0.0 })),
        Scalar::Str(s) => match label_value(&s) {
            Some(x) => Ok(Some(x)),
            None => {
                let shown: String = s.chars().take(64).collect();
                Err(Rejection::new(
                    Reason::InvalidField,
                    format!("vote: unknown label '{shown}'"),
                ))
            }
        },
        Scalar::Composite => Err(Rejection::new(
            Reason::InvalidField,
            "vote: must be a number, boolean, label string or null",
        )),
        n => match n.as_f64() {
            Some(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Ok(Some(x)),
            _ => Err(Rejection::new(
                Reason::InvalidField,
                "vote: number must be in [0, 1]",
            )),
        },
    }
}

fn time_field(name: &str, v: Scalar<'_>) -> Result<Nanos, Rejection> {
    match v {
        Scalar::Str(s) => parse_timestamp(&s).map_err(|e| {
            Rejection::new(Reason::InvalidTimestamp, format!("{name}: {}", e.message()))
        }),
        _ => Err(Rejection::new(
            Reason::InvalidTimestamp,
            format!("{name}: must be an RFC 3339 string"),
        )),
    }
}

/// The original bytes as the DLQ carries them: lossy UTF-8, cut at a
/// character boundary to at most 65536 bytes.
pub fn dlq_payload(bytes: &[u8]) -> String {
    const MAX: usize = 65_536;
    let s = String::from_utf8_lossy(bytes);
    if s.len() <= MAX {
        return s.into_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests;
