//! The one place configuration is loaded, layered and validated (contract §6).
//!
//! Layers, later wins: the embedded `config/default.toml`, the `--config`
//! file, then `JURYSTREAM_<SECTION>__<KEY>` environment variables. Choices
//! (delivery, log format, time unit, aggregator) are parsed into enums by
//! serde; numbers are checked against their ranges and upper bounds once, at
//! load, which also builds the engine's [`EngineConfig`]. Every error names
//! the key it is about, or the environment variable that set it.

mod choice;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use choice::{one_of, some_one_of};
pub use choice::{Delivery, LogFormat};

use crate::engine::reputation::{Mode, Model, ReputationParams};
use crate::engine::score::{Aggregator, TimeUnit};
use crate::engine::{EngineConfig, RubricParams};
use crate::input::DecodeOptions;
use crate::time::NANOS_PER_SEC;

/// The defaults, compiled in so that the binary needs no file to start.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Upper bound of every `*_seconds` key: 100 years of 365.25 days. In
/// nanoseconds (3.16e18) it still fits an `i64`, and `Duration::from_secs_f64`
/// and `Instant + Duration` cannot overflow.
pub const MAX_SECONDS: f64 = 100.0 * 365.25 * 86_400.0;
/// Upper bound of `kafka.commit_interval_ms` and `kafka.shutdown_timeout_ms`:
/// one hour (far below librdkafka's `i32` millisecond timeouts).
pub const MAX_MILLIS: i64 = 3_600_000;
/// What the service's `transaction.timeout.ms` (`exactly_once`) adds to the
/// commit interval when `kafka.properties` does not set it: Kafka Streams'
/// exactly-once transaction timeout, 10 s (docs/decisions.md, "Failover
/// waits for the transaction timeout, now 10 s").
pub const TRANSACTION_TIMEOUT_BEYOND_INTERVAL_MS: i64 = 10_000;
/// A transactional cycle's steps must end this long before its
/// transaction's timeout (the commit request still has to reach the
/// broker, whose clock started at the transaction's first record).
pub const TRANSACTION_MARGIN_MS: i64 = 1_000;
/// Upper bound of `input.max_message_bytes`: librdkafka's own maximum
/// message size (`message.max.bytes`, 1 000 000 000).
pub const MAX_MESSAGE_BYTES: i64 = 1_000_000_000;
/// Upper bound of `metrics.max_label_values`.
pub const MAX_LABEL_VALUES: i64 = 100_000;
/// Upper bound of `kafka.topic_partitions`.
pub const MAX_TOPIC_PARTITIONS: i64 = 100_000;
/// Upper bound of `kafka.replication_factor` (an INT16 in Kafka's protocol).
pub const MAX_REPLICATION_FACTOR: i64 = i16::MAX as i64;
/// Upper bound of `batching.max_votes` and `ambiguity.min_votes`.
pub const MAX_VOTES: i64 = u32::MAX as i64;
/// Upper bound of `connect.max_body_bytes`: 1 GiB.
pub const MAX_BODY_BYTES: i64 = 1 << 30;
/// Upper bound of `label_studio.max_annotations` and `extra_reviews`.
pub const MAX_ANNOTATIONS: i64 = 10_000;
/// `state.cache_mb` at most 1 TiB.
pub const MAX_CACHE_MB: i64 = 1 << 20;

/// A configuration problem: exit status 2 at start.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "configuration error: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

/// A configuration that cannot be loaded: the user's, exit status 2.
impl crate::error::Classify for ConfigError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::Usage
    }

    fn retry(&self) -> crate::error::RetryHint {
        crate::error::RetryHint::NoRetry
    }
}

/// Everything a configuration holds, as loaded and validated. The sections
/// are plain data; [`Config::engine`] is the engine's view of them, built
/// once at load.
#[derive(Debug, Clone)]
pub struct Config {
    pub batching: Batching,
    pub scoring: Scoring,
    pub ambiguity: Ambiguity,
    pub input: Input,
    pub dedupe: Dedupe,
    pub outputs: Outputs,
    pub metrics: Metrics,
    pub api: Api,
    pub kafka: Kafka,
    pub state: State,
    pub log: Log,
    pub connect: Connect,
    pub label_studio: LabelStudio,
    pub reputation: Reputation,
    pub rubrics: BTreeMap<String, RubricOverride>,
    engine: EngineConfig,
}

/// The file format: [`Config`] without what load derives from it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sections {
    batching: Batching,
    scoring: Scoring,
    ambiguity: Ambiguity,
    input: Input,
    dedupe: Dedupe,
    outputs: Outputs,
    metrics: Metrics,
    api: Api,
    kafka: Kafka,
    state: State,
    log: Log,
    connect: Connect,
    label_studio: LabelStudio,
    reputation: Reputation,
    #[serde(default)]
    rubrics: BTreeMap<String, RubricOverride>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Batching {
    pub window_seconds: f64,
    pub grace_seconds: f64,
    pub max_votes: i64,
    pub idle_flush_seconds: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scoring {
    pub initial_score: f64,
    pub initial_gap_seconds: f64,
    pub lambda: f64,
    #[serde(deserialize_with = "one_of")]
    pub time_unit: TimeUnit,
    #[serde(deserialize_with = "one_of")]
    pub aggregator: Aggregator,
    pub temperature: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ambiguity {
    pub min_votes: i64,
    pub variance_threshold: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    pub max_message_bytes: i64,
    pub max_future_skew_seconds: f64,
    #[serde(default)]
    pub default_voter_prompt_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dedupe {
    pub retention_seconds: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outputs {
    pub scores_topic: String,
    pub flags_topic: String,
    pub dlq_topic: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    pub listen: String,
    pub max_label_values: i64,
}

/// The query API (contract §9).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Api {
    /// Bearer token required on `/v1/*` (empty: none).
    pub token: String,
    /// Base URLs of the group's instances, asked for the partitions this
    /// one does not hold.
    pub peers: Vec<String>,
    pub peer_timeout_ms: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kafka {
    pub brokers: String,
    pub group_id: String,
    pub input_topics: Vec<String>,
    /// Unset: the delivery mode's default (see [`Kafka::commit_interval_ms`]).
    #[serde(default)]
    pub commit_interval_ms: Option<i64>,
    pub create_topics: bool,
    pub topic_partitions: i64,
    pub replication_factor: i64,
    pub changelog_topic: String,
    pub transactional_id_prefix: String,
    pub shutdown_timeout_ms: i64,
    pub delivery: Delivery,
    #[serde(default)]
    pub properties: BTreeMap<String, toml::Value>,
}

impl Kafka {
    /// The commit cycle's length: as configured, else 100 ms in the
    /// exactly-once modes (their events become visible at the commit, so
    /// the interval is their latency) and 500 ms in `at_least_once` (events
    /// are sent as emitted; a cycle's fixed costs, its changelog records
    /// and its RocksDB write are then shared by five times as many votes:
    /// docs/decisions.md, "The commit interval's default follows the
    /// delivery mode").
    pub fn commit_interval_ms(&self) -> i64 {
        self.commit_interval_ms.unwrap_or(match self.delivery {
            Delivery::AtLeastOnce => 500,
            Delivery::ExactlyOnce | Delivery::ExactlyOnceOutbox => 100,
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    pub dir: String,
    pub cleanup_grace_seconds: f64,
    /// Memory for cached series and vote identities, in MiB (0: only what
    /// open batches need).
    pub cache_mb: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub format: LogFormat,
}

/// `jurystream connect` (contract §12).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Connect {
    pub listen: String,
    /// Bearer token required on every route but the health and metrics
    /// ones (empty: none).
    #[serde(deserialize_with = "choice::text")]
    pub token: String,
    pub max_body_bytes: i64,
    pub produce_timeout_ms: i64,
    /// After SIGTERM: seconds of serving with `/readyz` 503 before the
    /// requests in progress are finished and the process exits.
    pub drain_seconds: f64,
}

/// Label Studio, for `connect` (contract §12).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelStudio {
    pub url: String,
    #[serde(deserialize_with = "choice::text")]
    pub token: String,
    pub projects: Vec<i64>,
    pub controls: BTreeMap<String, String>,
    pub values: BTreeMap<String, toml::Value>,
    pub inference_id_field: String,
    pub model_id_field: String,
    pub inference_time_field: String,
    pub sync_interval_seconds: f64,
    pub sync_lookback_seconds: f64,
    pub extra_reviews: i64,
    pub max_annotations: i64,
}

/// Learned reviewer reputation (contract §14).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reputation {
    #[serde(deserialize_with = "one_of")]
    pub mode: Mode,
    pub epoch_seconds: f64,
    pub prior_votes: f64,
    pub noise_floor: f64,
    pub min_weight: f64,
    pub max_weight: f64,
    #[serde(deserialize_with = "choice::text")]
    pub topic: String,
    /// contract §15: the default model, and its options (unset: the
    /// default; set while no rubric uses the model: an error).
    #[serde(deserialize_with = "one_of")]
    pub model: Model,
    #[serde(default)]
    pub confusion_prior_votes: Option<f64>,
    #[serde(default)]
    pub confusion_rate_floor: Option<f64>,
    #[serde(default)]
    pub confusion_max_weight: Option<f64>,
    #[serde(default)]
    pub confusion_pair_fit: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RubricOverride {
    #[serde(default, deserialize_with = "some_one_of")]
    pub aggregator: Option<Aggregator>,
    pub temperature: Option<f64>,
    pub lambda: Option<f64>,
    #[serde(default, deserialize_with = "some_one_of")]
    pub time_unit: Option<TimeUnit>,
    pub variance_threshold: Option<f64>,
    #[serde(default, deserialize_with = "some_one_of")]
    pub reputation_model: Option<Model>,
}

impl Config {
    /// Loads defaults, then `file` (if any), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        let text = match file {
            Some(p) => Some(std::fs::read_to_string(p).map_err(|e| {
                ConfigError(format!("cannot read config file {}: {e}", p.display()))
            })?),
            None => None,
        };
        Self::from_layers(text.as_deref(), &env)
    }

    /// The layering itself, without touching the file system or process environment.
    pub fn from_layers(
        file: Option<&str>,
        env: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table = DEFAULT_TOML
            .parse()
            .map_err(|e| ConfigError(format!("built-in defaults: {e}")))?;
        if let Some(text) = file {
            let user: toml::Table = text
                .parse()
                .map_err(|e| ConfigError(format!("config file: {e}")))?;
            merge(&mut table, user);
        }
        // "section.key" → the variable that set it, as the user wrote it.
        let mut from_env: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in env {
            let Some(rest) = name.strip_prefix("JURYSTREAM_") else {
                continue;
            };
            let Some((section, key)) = rest.split_once("__") else {
                continue;
            };
            let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
            if section == "rubrics" {
                return Err(ConfigError(format!(
                    "{name}: rubric overrides live in the config file only"
                )));
            }
            if !DEFAULT_SECTIONS.contains(&section.as_str()) {
                return Err(ConfigError(format!(
                    "{name}: unknown key (no section {section:?}; sections are {})",
                    DEFAULT_SECTIONS.join(", ")
                )));
            }
            let Some(toml::Value::Table(t)) = table.get_mut(&section) else {
                return Err(ConfigError(format!("{name}: {section} is not a section")));
            };
            t.insert(key.clone(), parse_env_value(value));
            from_env.insert(format!("{section}.{key}"), name.clone());
        }
        Self::from_table(table).map_err(|e| blame_env(e, &from_env))
    }

    fn from_table(table: toml::Table) -> Result<Config, ConfigError> {
        let s: Sections =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner().to_string();
                // The path says where; drop toml's own "\nin `key`" suffix.
                let inner = inner.split("\nin `").next().unwrap_or_default().trim_end();
                if let Some(rest) = inner.strip_prefix("unknown field `") {
                    if let Some((field, tail)) = rest.split_once('`') {
                        let key = if path == field || path.ends_with(&format!(".{field}")) {
                            path
                        } else if path == "." {
                            field.to_owned()
                        } else {
                            format!("{path}.{field}")
                        };
                        return ConfigError(format!("{key}: unknown key{tail}"));
                    }
                }
                ConfigError(format!("{path}: {inner}"))
            })?;
        s.into_config()
    }

    /// This configuration with another decay (λ in `time_unit`) and window,
    /// validated as a file setting them would be: a backtest grid point
    /// (contract §10). A rubric's own `lambda` keeps its meaning: when it does
    /// not name a `time_unit` it keeps the configured one.
    pub fn with_decay_and_window(
        &self,
        lambda: f64,
        time_unit: TimeUnit,
        window_seconds: f64,
    ) -> Result<Config, ConfigError> {
        let mut rubrics = self.rubrics.clone();
        for o in rubrics.values_mut() {
            if o.lambda.is_some() && o.time_unit.is_none() {
                o.time_unit = Some(self.scoring.time_unit);
            }
        }
        let mut s = Sections {
            batching: self.batching.clone(),
            scoring: self.scoring.clone(),
            ambiguity: self.ambiguity.clone(),
            input: self.input.clone(),
            dedupe: self.dedupe.clone(),
            outputs: self.outputs.clone(),
            metrics: self.metrics.clone(),
            api: self.api.clone(),
            kafka: self.kafka.clone(),
            state: self.state.clone(),
            log: self.log.clone(),
            connect: self.connect.clone(),
            label_studio: self.label_studio.clone(),
            reputation: self.reputation.clone(),
            rubrics,
        };
        s.scoring.lambda = lambda;
        s.scoring.time_unit = time_unit;
        s.batching.window_seconds = window_seconds;
        s.into_config()
    }

    /// This configuration whose engine also scores every series under
    /// `companions` (the backtest's other λ of a window).
    pub fn with_companions(&self, companions: Vec<crate::engine::Decay>) -> Config {
        let mut c = self.clone();
        c.engine.companions = companions;
        c
    }

    /// This configuration in reputation mode `mode` (the `reputation`
    /// command collects in every mode).
    pub fn with_reputation_mode(&self, mode: Mode) -> Config {
        let mut c = self.clone();
        c.reputation.mode = mode;
        c.engine.reputation.mode = mode;
        c
    }

    /// The cross-key rules of `reputation.epoch_seconds` (contract §14), which
    /// load checks unless the mode is `off` and the `reputation` command
    /// checks in every mode.
    pub fn check_epochs(&self) -> Result<(), ConfigError> {
        validate::check_epochs(&self.batching, &self.reputation)
    }

    /// The engine's view of this configuration, validated and built at load.
    pub fn engine(&self) -> EngineConfig {
        self.engine.clone()
    }

    /// `state.cache_mb` in bytes.
    pub fn cache_bytes(&self) -> usize {
        (self.state.cache_mb as usize) << 20
    }

    pub fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            max_message_bytes: self.input.max_message_bytes as usize,
            default_voter_prompt_id: self.input.default_voter_prompt_id.clone(),
        }
    }

    /// `transaction.timeout.ms` in `exactly_once`: how long the broker keeps
    /// a transaction open before aborting it, so how long `read_committed`
    /// readers of a killed instance's partitions (the next owner restoring
    /// its changelog among them) wait. `kafka.properties` may set it; else
    /// the commit interval plus 10 s, raised to `message.timeout.ms` and
    /// `socket.timeout.ms` + 100 when `kafka.properties` sets those higher
    /// (librdkafka refuses a transaction timeout below them). A cycle's
    /// steps end [`TRANSACTION_MARGIN_MS`] before it (`service::session`).
    pub fn transaction_timeout_ms(&self) -> i64 {
        let prop = |key: &str| -> Option<i64> {
            self.kafka_properties()
                .into_iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.trim().parse().ok())
        };
        if let Some(t) = prop("transaction.timeout.ms") {
            return t;
        }
        let mut t = self.kafka.commit_interval_ms() + TRANSACTION_TIMEOUT_BEYOND_INTERVAL_MS;
        if let Some(m) = prop("message.timeout.ms") {
            t = t.max(m);
        }
        if let Some(s) = prop("socket.timeout.ms") {
            t = t.max(s.saturating_add(100));
        }
        t
    }

    /// `kafka.properties` as librdkafka strings.
    pub fn kafka_properties(&self) -> Vec<(String, String)> {
        self.kafka
            .properties
            .iter()
            .map(|(k, v)| {
                let s = match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), s)
            })
            .collect()
    }
}

/// The sections of `config/default.toml`, for messages.
const DEFAULT_SECTIONS: &[&str] = &[
    "batching",
    "scoring",
    "ambiguity",
    "input",
    "dedupe",
    "outputs",
    "metrics",
    "kafka",
    "state",
    "log",
    "api",
    "connect",
    "label_studio",
    "reputation",
];

/// An error about a key an environment variable set names that variable:
/// `JURYSTREAM_X__Y (x.y): …`, or `JURYSTREAM_X__Y: unknown key (x.y)…`.
fn blame_env(e: ConfigError, from_env: &BTreeMap<String, String>) -> ConfigError {
    let Some((key, rest)) = e.0.split_once(": ") else {
        return e;
    };
    let Some(var) = from_env.get(key) else {
        return e;
    };
    match rest.strip_prefix("unknown key") {
        Some(tail) => ConfigError(format!("{var}: unknown key ({key}){tail}")),
        None => ConfigError(format!("{var} ({key}): {rest}")),
    }
}

/// Seconds (validated finite, in [0, `MAX_SECONDS`]) → whole nanoseconds.
pub fn seconds_to_ns(s: f64) -> i128 {
    (s * NANOS_PER_SEC as f64).round() as i128
}

/// An environment value: a TOML value when it parses as one, else a string.
fn parse_env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.to_owned()),
    }
}

/// Deep merge: tables merge key by key, anything else is replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests;
