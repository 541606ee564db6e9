//! One `serde_json` pass: a JSON object → the raw scalars of the known fields.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{Reason, Rejection};

/// A JSON value as the validator sees it. Arrays and objects are only
/// "composite" (they are walked, so depth and syntax are still checked).
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar<'a> {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(Cow<'a, str>),
    Composite,
}

impl Scalar<'_> {
    pub fn is_null(&self) -> bool {
        matches!(self, Scalar::Null)
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Scalar::U64(n) => Some(n as f64),
            Scalar::I64(n) => Some(n as f64),
            Scalar::F64(x) => Some(x),
            _ => None,
        }
    }
}

/// The fields contract §1 names; `None` is "key absent". A repeated key: the last wins.
#[derive(Debug, Default)]
pub struct RawVote<'a> {
    pub inference_id: Option<Scalar<'a>>,
    pub voter_id: Option<Scalar<'a>>,
    pub voter_prompt_id: Option<Scalar<'a>>,
    pub vote: Option<Scalar<'a>>,
    pub timestamp: Option<Scalar<'a>>,
    pub vote_time: Option<Scalar<'a>>,
    pub vote_id: Option<Scalar<'a>>,
    pub model_id: Option<Scalar<'a>>,
    pub reputation: Option<Scalar<'a>>,
    pub inference_time: Option<Scalar<'a>>,
}

/// Parses one message (UTF-8 JSON, an object, nothing after it).
pub fn parse(bytes: &[u8]) -> Result<RawVote<'_>, Rejection> {
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(Rejection::new(
            Reason::MalformedJson,
            "invalid JSON: starts with a UTF-8 byte order mark",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let raw = de.deserialize_any(TopVisitor).map_err(json_error)?;
    de.end().map_err(json_error)?;
    Ok(raw)
}

fn json_error(e: serde_json::Error) -> Rejection {
    let msg = e.to_string();
    let detail = if let Some(kind) = msg.strip_prefix(NOT_OBJECT) {
        format!(
            "message must be a JSON object, got {}",
            kind.split(" at line").next().unwrap_or(kind)
        )
    } else {
        format!("invalid JSON: {msg}")
    };
    Rejection::new(Reason::MalformedJson, detail)
}

const NOT_OBJECT: &str = "not an object: ";

struct TopVisitor;

impl TopVisitor {
    fn refuse<E: de::Error>(kind: &str) -> Result<RawVote<'static>, E> {
        Err(E::custom(format!("{NOT_OBJECT}{kind}")))
    }
}

impl<'de> Visitor<'de> for TopVisitor {
    type Value = RawVote<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Self::refuse("a boolean")
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Self::refuse("a number")
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Self::refuse("a number")
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Self::refuse("a number")
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Self::refuse("a string")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Self::refuse("null")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // Walk it so that a syntax error inside still reads as one.
        while seq.next_element::<Skip>()?.is_some() {}
        Self::refuse("an array")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut raw = RawVote::default();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let slot = match key.0.as_ref() {
                "inference_id" => &mut raw.inference_id,
                "voter_id" => &mut raw.voter_id,
                "voter_prompt_id" => &mut raw.voter_prompt_id,
                "vote" => &mut raw.vote,
                "timestamp" => &mut raw.timestamp,
                "vote_time" => &mut raw.vote_time,
                "vote_id" => &mut raw.vote_id,
                "model_id" => &mut raw.model_id,
                "reputation" => &mut raw.reputation,
                "inference_time" => &mut raw.inference_time,
                _ => {
                    map.next_value::<Skip>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value_seed(ScalarSeed)?);
        }
        Ok(raw)
    }
}

/// A key, borrowed from the input when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scalar<'de>, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Null)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Bool(b))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::U64(n))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::I64(n))
    }
    fn visit_f64<E: de::Error>(self, x: f64) -> Result<Scalar<'de>, E> {
        Ok(Scalar::F64(x))
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Scalar<'de>, E> {
        Ok(Scalar::Str(Cow::Owned(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar<'de>, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Scalar::Composite)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar<'de>, A::Error> {
        while map.next_key::<Skip>()?.is_some() {
            map.next_value::<Skip>()?;
        }
        Ok(Scalar::Composite)
    }
}

/// Skips any value through `deserialize_any`, so that serde_json's nesting
/// limit (128) applies to ignored fields too.
struct Skip;

impl<'de> de::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_borrowed_str<E: de::Error>(self, _: &'de str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_key::<Skip>()?.is_some() {
            map.next_value::<Skip>()?;
        }
        Ok(Skip)
    }
}
