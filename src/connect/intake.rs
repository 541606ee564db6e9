//! `POST /v1/votes` without I/O (contract §12): a body becomes votes in
//! request order, each checked by the rules of contract §1; a valid one is
//! kept as its JSON text, unchanged, with its Kafka key (the inference id).

use serde::Serialize;
use serde_json::value::RawValue;

use crate::input::{check_future_skew, decode_vote, DecodeOptions, Rejection};
use crate::time::Nanos;

/// How a body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// `Content-Type: application/x-ndjson` (or another JSON-lines type).
    Ndjson,
    /// Anything else: one JSON object, or a JSON array of votes.
    Json,
}

impl BodyKind {
    /// From a `Content-Type` header value (parameters ignored).
    pub fn of_content_type(ct: Option<&str>) -> BodyKind {
        let essence = ct
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonlines"
            | "application/jsonlines" => BodyKind::Ndjson,
            _ => BodyKind::Json,
        }
    }
}

/// A valid vote: its Kafka key and its bytes as the client sent them.
#[derive(Debug, Clone, PartialEq)]
pub struct Valid<'a> {
    pub index: usize,
    pub key: String,
    pub bytes: &'a [u8],
}

/// An invalid vote, as the answer lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refused {
    pub index: usize,
    pub reason: &'static str,
    pub detail: String,
}

/// A body's votes, checked.
#[derive(Debug, Default, PartialEq)]
pub struct Checked<'a> {
    pub valid: Vec<Valid<'a>>,
    pub refused: Vec<Refused>,
}

/// The body is neither a JSON object, a JSON array nor NDJSON (a 400).
#[derive(Debug, Clone, PartialEq)]
pub struct BadBody(pub String);

/// What the checks need: the decoder's options, the wall clock and how far
/// ahead of it a vote may be (`input.max_future_skew_seconds`).
#[derive(Debug, Clone)]
pub struct Rules {
    pub decode: DecodeOptions,
    pub now: Nanos,
    pub max_skew: Nanos,
}

/// Splits `body` into its votes, in request order, and checks each.
/// NDJSON: one vote per non-blank line (index = its place among them).
/// JSON: an object is one vote; an array holds votes. A JSON body of
/// several objects one per line (NDJSON without its content type) is read
/// as NDJSON.
pub fn check<'a>(body: &'a [u8], kind: BodyKind, rules: &Rules) -> Result<Checked<'a>, BadBody> {
    let items = match kind {
        BodyKind::Ndjson => ndjson(body),
        BodyKind::Json => json(body)?,
    };
    if items.is_empty() {
        return Err(BadBody("the body holds no vote".into()));
    }
    let mut out = Checked::default();
    for (index, bytes) in items.into_iter().enumerate() {
        let checked = decode_vote(bytes, &rules.decode)
            .and_then(|v| check_future_skew(&v, rules.now, rules.max_skew).map(|()| v));
        match checked {
            Ok(v) => out.valid.push(Valid {
                index,
                key: v.inference_id.to_string(),
                bytes,
            }),
            Err(Rejection { reason, detail }) => out.refused.push(Refused {
                index,
                reason: reason.as_str(),
                detail,
            }),
        }
    }
    Ok(out)
}

/// The non-blank lines, each without its LF.
fn ndjson(body: &[u8]) -> Vec<&[u8]> {
    body.split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .collect()
}

fn json(body: &[u8]) -> Result<Vec<&[u8]>, BadBody> {
    let text =
        std::str::from_utf8(body).map_err(|e| BadBody(format!("the body is not UTF-8: {e}")))?;
    let trimmed = text.trim_matches(|c: char| c.is_ascii_whitespace());
    match trimmed.as_bytes().first() {
        Some(b'[') => {
            let votes: Vec<&RawValue> = serde_json::from_str(trimmed)
                .map_err(|e| BadBody(format!("the body is not a JSON array of votes: {e}")))?;
            Ok(votes.into_iter().map(|v| v.get().as_bytes()).collect())
        }
        Some(b'{') => {
            let mut de = serde_json::Deserializer::from_str(trimmed);
            match <&RawValue as serde::Deserialize>::deserialize(&mut de) {
                Ok(v) if de.end().is_ok() => Ok(vec![v.get().as_bytes()]),
                // A whole object with more after it: NDJSON without its
                // Content-Type.
                Ok(_) => Ok(ndjson(body)),
                Err(e) => Err(BadBody(format!("the body is not a JSON object: {e}"))),
            }
        }
        _ => Err(BadBody(
            "the body must be a JSON object (one vote), a JSON array of votes, or NDJSON \
             (Content-Type: application/x-ndjson)"
                .into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            decode: DecodeOptions {
                max_message_bytes: 200,
                default_voter_prompt_id: None,
            },
            now: crate::time::parse_timestamp("2025-01-01T00:00:00Z").unwrap(),
            max_skew: 300 * crate::time::NANOS_PER_SEC,
        }
    }

    const GOOD: &str = r#"{"inference_id":"i1","voter_id":"v","voter_prompt_id":"r","vote":"Pass","timestamp":"2024-12-31T23:00:00Z"}"#;
    const GOOD_INT: &str = r#"{"inference_id":7,"voter_id":"v","voter_prompt_id":"r","vote":0.5,"timestamp":"2024-12-31T23:00:00Z"}"#;
    const NO_VOTER: &str = r#"{"inference_id":"i2","voter_prompt_id":"r","vote":1,"timestamp":"2024-12-31T23:00:00Z"}"#;
    const FUTURE: &str = r#"{"inference_id":"i3","voter_id":"v","voter_prompt_id":"r","vote":1,"timestamp":"2025-01-01T01:00:00Z"}"#;

    #[test]
    fn an_object_an_array_and_ndjson_give_votes_in_order() {
        let one = check(GOOD.as_bytes(), BodyKind::Json, &rules()).unwrap();
        assert_eq!(one.valid.len(), 1);
        assert_eq!(one.valid[0].bytes, GOOD.as_bytes(), "unchanged");
        assert_eq!(one.valid[0].key, "i1");

        let array = format!("[ {GOOD}, {NO_VOTER},\n{GOOD_INT}, 3, {FUTURE} ]");
        let c = check(array.as_bytes(), BodyKind::Json, &rules()).unwrap();
        let valid: Vec<(usize, &str)> = c.valid.iter().map(|v| (v.index, v.key.as_str())).collect();
        assert_eq!(valid, [(0, "i1"), (2, "7")]);
        assert_eq!(c.valid[1].bytes, GOOD_INT.as_bytes());
        let refused: Vec<(usize, &str)> = c.refused.iter().map(|r| (r.index, r.reason)).collect();
        assert_eq!(
            refused,
            [
                (1, "missing_field"),
                (3, "malformed_json"),
                (4, "invalid_timestamp")
            ]
        );
        assert!(
            c.refused[0].detail.contains("voter_id"),
            "{:?}",
            c.refused[0]
        );

        let lines = format!("{GOOD}\r\n\n  \n{{broken\n{GOOD_INT}");
        let c = check(lines.as_bytes(), BodyKind::Ndjson, &rules()).unwrap();
        assert_eq!(c.valid.iter().map(|v| v.index).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(c.refused[0].index, 1);
        assert_eq!(c.refused[0].reason, "malformed_json");
        // NDJSON sent as JSON is read as NDJSON.
        let both = format!("{GOOD}\n{GOOD_INT}\n");
        let c = check(both.as_bytes(), BodyKind::Json, &rules()).unwrap();
        assert_eq!(c.valid.len(), 2);
    }

    #[test]
    fn bodies_that_are_neither_are_bad_and_large_votes_too_large() {
        for body in [
            "",
            "  ",
            "3",
            "\"x\"",
            "[1, 2",
            "{\"a\": ",
            "[]",
            "\u{feff}{}",
        ] {
            assert!(
                check(body.as_bytes(), BodyKind::Json, &rules()).is_err(),
                "{body:?}"
            );
        }
        assert!(check(b"\n\n", BodyKind::Ndjson, &rules()).is_err());
        assert!(check(&[0xff, b'{'], BodyKind::Json, &rules()).is_err());
        let big = format!(
            r#"{{"inference_id":"i1","voter_id":"v","voter_prompt_id":"r","vote":1,"timestamp":"2024-12-31T23:00:00Z","pad":"{}"}}"#,
            "x".repeat(300)
        );
        let c = check(big.as_bytes(), BodyKind::Json, &rules()).unwrap();
        assert_eq!(c.refused[0].reason, "too_large");
    }

    #[test]
    fn content_types() {
        assert_eq!(
            BodyKind::of_content_type(Some("application/x-ndjson; charset=utf-8")),
            BodyKind::Ndjson
        );
        assert_eq!(
            BodyKind::of_content_type(Some("Application/JSONL")),
            BodyKind::Ndjson
        );
        assert_eq!(
            BodyKind::of_content_type(Some("application/json")),
            BodyKind::Json
        );
        assert_eq!(BodyKind::of_content_type(None), BodyKind::Json);
    }
}
