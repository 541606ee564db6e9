//! The one place configuration is loaded, layered and validated (SPEC §6).
//!
//! Layers, later wins: the embedded `config/default.toml`, the `--config`
//! file, then `JURYSTREAM_<SECTION>__<KEY>` environment variables. Every
//! error names the key it is about.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

use serde::Deserialize;

use crate::engine::score::{Aggregator, TimeUnit};
use crate::engine::{EngineConfig, RubricParams};
use crate::input::DecodeOptions;
use crate::time::NANOS_PER_SEC;

/// The defaults, compiled in so that the binary needs no file to start.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// A configuration problem: exit status 2 at start.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "configuration error: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub batching: Batching,
    pub scoring: Scoring,
    pub ambiguity: Ambiguity,
    pub input: Input,
    pub dedupe: Dedupe,
    pub outputs: Outputs,
    pub metrics: Metrics,
    pub kafka: Kafka,
    pub state: State,
    pub log: Log,
    #[serde(default)]
    pub rubrics: BTreeMap<String, RubricOverride>,
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
    pub time_unit: String,
    pub aggregator: String,
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kafka {
    pub brokers: String,
    pub group_id: String,
    pub input_topics: Vec<String>,
    pub commit_interval_ms: i64,
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

/// How a commit cycle reaches the broker (`kafka.delivery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    ExactlyOnce,
    ExactlyOnceOutbox,
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
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    pub dir: String,
    pub cleanup_grace_seconds: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub format: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RubricOverride {
    pub aggregator: Option<String>,
    pub temperature: Option<f64>,
    pub lambda: Option<f64>,
    pub time_unit: Option<String>,
    pub variance_threshold: Option<f64>,
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
            let parsed = parse_env_value(value);
            let slot = table
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(Default::default()));
            match slot {
                toml::Value::Table(t) => {
                    t.insert(key, parsed);
                }
                _ => return Err(ConfigError(format!("{name}: {section} is not a section"))),
            }
        }
        let de = toml::Value::Table(table);
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            ConfigError(format!("{path}: {inner}"))
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let b = &self.batching;
        non_negative("batching.window_seconds", b.window_seconds)?;
        if b.window_seconds > 0.0 && seconds_to_ns(b.window_seconds) == 0 {
            return Err(ConfigError(
                "batching.window_seconds: must be 0 or at least one nanosecond".into(),
            ));
        }
        non_negative("batching.grace_seconds", b.grace_seconds)?;
        at_least("batching.max_votes", b.max_votes, 1)?;
        if b.max_votes > i64::from(u32::MAX) {
            return Err(ConfigError("batching.max_votes: too large".into()));
        }
        positive("batching.idle_flush_seconds", b.idle_flush_seconds)?;
        let s = &self.scoring;
        finite("scoring.initial_score", s.initial_score)?;
        if !(0.0..=1.0).contains(&s.initial_score) {
            return Err(ConfigError(format!(
                "scoring.initial_score: must be in [0, 1], got {}",
                s.initial_score
            )));
        }
        non_negative("scoring.initial_gap_seconds", s.initial_gap_seconds)?;
        self.defaults()?;
        at_least("ambiguity.min_votes", self.ambiguity.min_votes, 0)?;
        if self.ambiguity.min_votes > i64::from(u32::MAX) {
            return Err(ConfigError("ambiguity.min_votes: too large".into()));
        }
        at_least("input.max_message_bytes", self.input.max_message_bytes, 1)?;
        non_negative(
            "input.max_future_skew_seconds",
            self.input.max_future_skew_seconds,
        )?;
        if let Some(d) = &self.input.default_voter_prompt_id {
            if d.is_empty() || d.len() > 256 {
                return Err(ConfigError(
                    "input.default_voter_prompt_id: must be 1..=256 bytes".into(),
                ));
            }
        }
        non_negative("dedupe.retention_seconds", self.dedupe.retention_seconds)?;
        non_negative(
            "state.cleanup_grace_seconds",
            self.state.cleanup_grace_seconds,
        )?;
        for (k, v) in [
            ("outputs.scores_topic", &self.outputs.scores_topic),
            ("outputs.flags_topic", &self.outputs.flags_topic),
            ("outputs.dlq_topic", &self.outputs.dlq_topic),
            ("kafka.brokers", &self.kafka.brokers),
            ("kafka.group_id", &self.kafka.group_id),
            ("state.dir", &self.state.dir),
        ] {
            if v.is_empty() {
                return Err(ConfigError(format!("{k}: must not be empty")));
            }
        }
        self.metrics
            .listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| ConfigError(format!("metrics.listen: {e}")))?;
        at_least("metrics.max_label_values", self.metrics.max_label_values, 1)?;
        let k = &self.kafka;
        if k.input_topics.is_empty() || k.input_topics.iter().any(String::is_empty) {
            return Err(ConfigError(
                "kafka.input_topics: must list at least one non-empty topic".into(),
            ));
        }
        at_least("kafka.commit_interval_ms", k.commit_interval_ms, 1)?;
        at_least("kafka.topic_partitions", k.topic_partitions, 1)?;
        at_least("kafka.replication_factor", k.replication_factor, 1)?;
        at_least("kafka.shutdown_timeout_ms", k.shutdown_timeout_ms, 1)?;
        for (key, v) in &k.properties {
            if matches!(v, toml::Value::Table(_) | toml::Value::Array(_)) {
                return Err(ConfigError(format!(
                    "kafka.properties.{key}: must be a string, number or boolean"
                )));
            }
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(ConfigError(format!(
                "log.format: must be \"text\" or \"json\", got {:?}",
                self.log.format
            )));
        }
        for name in self.rubrics.keys() {
            self.rubric(name)?;
        }
        Ok(())
    }

    fn defaults(&self) -> Result<RubricParams, ConfigError> {
        let s = &self.scoring;
        rubric_params(
            "scoring",
            "ambiguity",
            s.lambda,
            &s.time_unit,
            self.ambiguity.variance_threshold,
            &s.aggregator,
            s.temperature,
        )
    }

    fn rubric(&self, name: &str) -> Result<RubricParams, ConfigError> {
        let d = &self.scoring;
        let o = self.rubrics.get(name).cloned().unwrap_or_default();
        let prefix = format!("rubrics.{name}");
        rubric_params(
            &prefix,
            &prefix,
            o.lambda.unwrap_or(d.lambda),
            o.time_unit.as_deref().unwrap_or(&d.time_unit),
            o.variance_threshold
                .unwrap_or(self.ambiguity.variance_threshold),
            o.aggregator.as_deref().unwrap_or(&d.aggregator),
            o.temperature.unwrap_or(d.temperature),
        )
    }

    /// The engine's view of this configuration.
    pub fn engine(&self) -> EngineConfig {
        // validate() ran in from_layers, so these cannot fail here.
        let defaults = self.defaults().unwrap_or_else(|e| panic!("{e}"));
        let rubrics: HashMap<String, RubricParams> = self
            .rubrics
            .keys()
            .map(|k| (k.clone(), self.rubric(k).unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        EngineConfig {
            window_ns: seconds_to_ns(self.batching.window_seconds),
            window_seconds: self.batching.window_seconds,
            grace_ns: seconds_to_ns(self.batching.grace_seconds),
            max_votes: self.batching.max_votes as u32,
            initial_score: self.scoring.initial_score,
            initial_gap_ns: seconds_to_ns(self.scoring.initial_gap_seconds),
            min_votes: self.ambiguity.min_votes as u32,
            retention_ns: seconds_to_ns(self.dedupe.retention_seconds),
            defaults,
            rubrics,
        }
    }

    pub fn decode_options(&self) -> DecodeOptions {
        DecodeOptions {
            max_message_bytes: self.input.max_message_bytes as usize,
            default_voter_prompt_id: self.input.default_voter_prompt_id.clone(),
        }
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

/// Seconds (already validated finite, ≥ 0) → whole nanoseconds.
pub fn seconds_to_ns(s: f64) -> i128 {
    (s * NANOS_PER_SEC as f64).round() as i128
}

fn rubric_params(
    scoring: &str,
    ambiguity: &str,
    lambda: f64,
    time_unit: &str,
    variance_threshold: f64,
    aggregator: &str,
    temperature: f64,
) -> Result<RubricParams, ConfigError> {
    non_negative(&format!("{scoring}.lambda"), lambda)?;
    finite(&format!("{scoring}.temperature"), temperature)?;
    if !(0.1..=1.0).contains(&temperature) {
        return Err(ConfigError(format!(
            "{scoring}.temperature: must be in [0.1, 1.0], got {temperature}"
        )));
    }
    non_negative(
        &format!("{ambiguity}.variance_threshold"),
        variance_threshold,
    )?;
    let time_unit = TimeUnit::parse(time_unit).ok_or_else(|| {
        ConfigError(format!(
            "{scoring}.time_unit: must be seconds, minutes, hours or days, got {time_unit:?}"
        ))
    })?;
    let aggregator = Aggregator::parse(aggregator).ok_or_else(|| {
        ConfigError(format!(
            "{scoring}.aggregator: must be \"mean\" or \"power_mean\", got {aggregator:?}"
        ))
    })?;
    Ok(RubricParams {
        lambda,
        time_unit,
        variance_threshold,
        aggregator,
        temperature,
    })
}

fn finite(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{key}: must be a finite number, got {v}"
        )))
    }
}

fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    finite(key, v)?;
    if v < 0.0 {
        return Err(ConfigError(format!("{key}: must be >= 0, got {v}")));
    }
    Ok(())
}

fn positive(key: &str, v: f64) -> Result<(), ConfigError> {
    finite(key, v)?;
    if v <= 0.0 {
        return Err(ConfigError(format!("{key}: must be > 0, got {v}")));
    }
    Ok(())
}

fn at_least(key: &str, v: i64, min: i64) -> Result<(), ConfigError> {
    if v < min {
        return Err(ConfigError(format!("{key}: must be >= {min}, got {v}")));
    }
    Ok(())
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
mod tests {
    use super::*;

    fn load(file: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        Config::from_layers(Some(file), &env)
    }

    #[test]
    fn defaults_load_and_match_the_contract() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.batching.window_seconds, 60.0);
        assert_eq!(c.batching.grace_seconds, 5.0);
        assert_eq!(c.batching.max_votes, 1000);
        assert_eq!(c.batching.idle_flush_seconds, 30.0);
        assert_eq!(c.scoring.initial_score, 0.5);
        assert_eq!(c.scoring.initial_gap_seconds, 3600.0);
        assert_eq!(c.scoring.lambda, 0.01);
        assert_eq!(c.scoring.time_unit, "seconds");
        assert_eq!(c.scoring.aggregator, "mean");
        assert_eq!(c.scoring.temperature, 0.5);
        assert_eq!(c.ambiguity.min_votes, 2);
        assert_eq!(c.ambiguity.variance_threshold, 0.05);
        assert_eq!(c.input.max_message_bytes, 1_048_576);
        assert_eq!(c.input.max_future_skew_seconds, 300.0);
        assert_eq!(c.input.default_voter_prompt_id, None);
        assert_eq!(c.dedupe.retention_seconds, 2_592_000.0);
        assert_eq!(c.outputs.scores_topic, "jury.scores");
        assert_eq!(c.outputs.flags_topic, "jury.flags");
        assert_eq!(c.outputs.dlq_topic, "jury.dlq");
        assert_eq!(c.metrics.listen, "127.0.0.1:9464");
        assert_eq!(c.metrics.max_label_values, 200);
        assert_eq!(c.kafka.group_id, "jurystream");
        assert_eq!(c.kafka.brokers, "localhost:9092");
        assert_eq!(c.kafka.input_topics, vec!["votes".to_string()]);
        assert_eq!(c.kafka.commit_interval_ms, 100);
        assert_eq!(c.state.dir, "data");
    }

    #[test]
    fn partial_files_and_env_layer_over_defaults() {
        let c = load(
            "[scoring]\nlambda = 0.2\n[batching]\nwindow_seconds = 7.5\n",
            &[
                ("JURYSTREAM_SCORING__TIME_UNIT", "days"),
                ("JURYSTREAM_BATCHING__MAX_VOTES", "3"),
            ],
        )
        .unwrap();
        assert_eq!(c.scoring.lambda, 0.2);
        assert_eq!(c.scoring.time_unit, "days");
        assert_eq!(c.batching.max_votes, 3);
        assert_eq!(c.batching.grace_seconds, 5.0);
        assert_eq!(c.engine().window_ns, 7_500_000_000);
        let c = load(
            "",
            &[("JURYSTREAM_SCORING__LAMBDA", "0.001"), ("OTHER", "x")],
        )
        .unwrap();
        assert_eq!(c.scoring.lambda, 0.001);
    }

    #[test]
    #[allow(clippy::type_complexity)] // a table of cases
    fn errors_name_the_key() {
        let cases: &[(&str, &[(&str, &str)], &str)] = &[
            ("[scoring]\nlamda = 0.01\n", &[], "lamda"),
            ("[scoring]\ntime_unit = \"weeks\"\n", &[], "time_unit"),
            ("[scoring]\ntemperature = 1.2\n", &[], "temperature"),
            ("[scoring]\nlambda = -1.0\n", &[], "lambda"),
            ("", &[("JURYSTREAM_SCORING__LAMBDA", "-0.5")], "lambda"),
            ("", &[("JURYSTREAM_SCORING__LAMBDA", "abc")], "lambda"),
            ("[batching]\ngrace_seconds = -1\n", &[], "grace_seconds"),
            ("[batching]\nwindow_seconds = -60\n", &[], "window_seconds"),
            ("[batching]\nmax_votes = 0\n", &[], "max_votes"),
            ("[scoring]\ninitial_score = 1.5\n", &[], "initial_score"),
            ("[scoring]\naggregator = \"median\"\n", &[], "aggregator"),
            ("[scoring]\nlambda = nan\n", &[], "lambda"),
            (
                "[ambiguity]\nvariance_threshold = inf\n",
                &[],
                "variance_threshold",
            ),
            (
                "[rubrics.safety]\nlambda = -2.0\n",
                &[],
                "rubrics.safety.lambda",
            ),
            (
                "[rubrics.safety]\nwindow_seconds = 5\n",
                &[],
                "window_seconds",
            ),
            ("[nosuch]\nx = 1\n", &[], "nosuch"),
            ("", &[("JURYSTREAM_SCORING__NOPE", "1")], "nope"),
        ];
        for (file, env, key) in cases {
            let err = load(file, env).expect_err(file).0;
            assert!(err.contains(key), "{err:?} does not name {key}");
        }
    }

    #[test]
    fn rubric_overrides_inherit_the_rest() {
        let c = load(
            "[scoring]\nlambda = 0.002\n[rubrics.accuracy]\naggregator = \"power_mean\"\ntemperature = 0.1\n[rubrics.\"7\"]\nvariance_threshold = 0.02\n",
            &[],
        )
        .unwrap();
        let e = c.engine();
        let acc = e.params("accuracy");
        assert_eq!(acc.aggregator, Aggregator::PowerMean);
        assert_eq!(acc.lambda, 0.002);
        assert_eq!(e.params("7").variance_threshold, 0.02);
        assert_eq!(e.params("other").aggregator, Aggregator::Mean);
    }
}
