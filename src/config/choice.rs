//! Configuration values that are one of a few names: [`Delivery`],
//! [`LogFormat`], and the engine's [`TimeUnit`] and [`Aggregator`]. Each is
//! parsed by serde; a bad value reads `must be "a", "b" or "c", got "x"`,
//! and the loader puts the key (or the environment variable) in front.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::engine::reputation::{Mode, Model};
use crate::engine::score::{Aggregator, TimeUnit};

/// `kafka.delivery`: how a commit cycle reaches the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// `exactly_once`: one Kafka transaction per cycle.
    ExactlyOnce,
    /// `exactly_once_outbox`: the cycle's events go to the changelog first;
    /// an interrupted cycle is completed on restore.
    ExactlyOnceOutbox,
    /// `at_least_once`: events, then the changelog, then offsets.
    AtLeastOnce,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::ExactlyOnce => "exactly_once",
            Delivery::ExactlyOnceOutbox => "exactly_once_outbox",
            Delivery::AtLeastOnce => "at_least_once",
        }
    }

    /// Whether a cycle is one Kafka transaction (begun before its first
    /// record, aborted when the cycle is dropped).
    pub fn transactional(self) -> bool {
        self == Delivery::ExactlyOnce
    }
}

/// `log.format` (also `--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// A configuration value that is one of a few names.
pub(super) trait Choice: Copy + 'static {
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
}

impl Choice for Delivery {
    const ALL: &'static [Self] = &[
        Delivery::ExactlyOnce,
        Delivery::ExactlyOnceOutbox,
        Delivery::AtLeastOnce,
    ];
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for LogFormat {
    const ALL: &'static [Self] = &[LogFormat::Text, LogFormat::Json];
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for TimeUnit {
    const ALL: &'static [Self] = &[
        TimeUnit::Seconds,
        TimeUnit::Minutes,
        TimeUnit::Hours,
        TimeUnit::Days,
    ];
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for Mode {
    const ALL: &'static [Self] = &[Mode::Off, Mode::Shadow, Mode::Learned];
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for Model {
    const ALL: &'static [Self] = &[Model::Noise, Model::Confusion];
    fn name(self) -> &'static str {
        self.as_str()
    }
}

impl Choice for Aggregator {
    const ALL: &'static [Self] = &[Aggregator::Mean, Aggregator::PowerMean];
    fn name(self) -> &'static str {
        self.as_str()
    }
}

/// `"a", "b" or "c"`.
fn allowed<T: Choice>() -> String {
    let names: Vec<String> = T::ALL.iter().map(|c| format!("{:?}", c.name())).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.concat(),
    }
}

/// `s` as a `T`, or `must be "a", "b" or "c", got "s"`.
fn parse_choice<T: Choice>(s: &str) -> Result<T, String> {
    T::ALL
        .iter()
        .copied()
        .find(|c| c.name() == s)
        .ok_or_else(|| format!("must be {}, got {s:?}", allowed::<T>()))
}

struct ChoiceVisitor<T>(PhantomData<T>);

impl<T: Choice> Visitor<'_> for ChoiceVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&allowed::<T>())
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        parse_choice(s).map_err(E::custom)
    }
}

pub(super) fn one_of<'de, D: Deserializer<'de>, T: Choice>(d: D) -> Result<T, D::Error> {
    d.deserialize_str(ChoiceVisitor(PhantomData))
}

pub(super) fn some_one_of<'de, D: Deserializer<'de>, T: Choice>(
    d: D,
) -> Result<Option<T>, D::Error> {
    one_of(d).map(Some)
}

macro_rules! choice_impls {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $t {
            /// `must be "a" or "b", got "c"`.
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                parse_choice(s)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                one_of(d)
            }
        }
    )*};
}

choice_impls!(Delivery, LogFormat);

/// A string value that may have been written (or set from the environment)
/// as a number or boolean: a token of digits is still a token.
pub(super) fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match toml::Value::deserialize(d)? {
        toml::Value::String(s) => Ok(s),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(de::Error::custom(format!(
            "must be a string, got {}",
            other.type_str()
        ))),
    }
}
