//! Validation: every value checked against its range and upper bound once,
//! at load, and the engine's configuration built from the checked values.

use std::collections::HashMap;

use super::*;
use crate::engine::reputation::confusion::ConfusionParams;

impl Sections {
    pub(super) fn into_config(self) -> Result<Config, ConfigError> {
        self.validate()?;
        let engine = self.engine()?;
        Ok(Config {
            batching: self.batching,
            scoring: self.scoring,
            ambiguity: self.ambiguity,
            input: self.input,
            dedupe: self.dedupe,
            outputs: self.outputs,
            metrics: self.metrics,
            api: self.api,
            kafka: self.kafka,
            state: self.state,
            log: self.log,
            connect: self.connect,
            label_studio: self.label_studio,
            reputation: self.reputation,
            rubrics: self.rubrics,
            engine,
        })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let b = &self.batching;
        seconds("batching.window_seconds", b.window_seconds)?;
        if b.window_seconds > 0.0 && seconds_to_ns(b.window_seconds) == 0 {
            return Err(ConfigError(
                "batching.window_seconds: must be 0 or at least one nanosecond".into(),
            ));
        }
        seconds("batching.grace_seconds", b.grace_seconds)?;
        in_range("batching.max_votes", b.max_votes, 1, MAX_VOTES)?;
        positive("batching.idle_flush_seconds", b.idle_flush_seconds)?;
        seconds("batching.idle_flush_seconds", b.idle_flush_seconds)?;
        let s = &self.scoring;
        finite("scoring.initial_score", s.initial_score)?;
        if !(0.0..=1.0).contains(&s.initial_score) {
            return Err(ConfigError(format!(
                "scoring.initial_score: must be in [0, 1], got {}",
                s.initial_score
            )));
        }
        seconds("scoring.initial_gap_seconds", s.initial_gap_seconds)?;
        in_range(
            "ambiguity.min_votes",
            self.ambiguity.min_votes,
            0,
            MAX_VOTES,
        )?;
        in_range(
            "input.max_message_bytes",
            self.input.max_message_bytes,
            1,
            MAX_MESSAGE_BYTES,
        )?;
        seconds(
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
        seconds("dedupe.retention_seconds", self.dedupe.retention_seconds)?;
        seconds(
            "state.cleanup_grace_seconds",
            self.state.cleanup_grace_seconds,
        )?;
        in_range("state.cache_mb", self.state.cache_mb, 0, MAX_CACHE_MB)?;
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
        in_range(
            "metrics.max_label_values",
            self.metrics.max_label_values,
            1,
            MAX_LABEL_VALUES,
        )?;
        in_range(
            "api.peer_timeout_ms",
            self.api.peer_timeout_ms,
            1,
            MAX_MILLIS,
        )?;
        for p in &self.api.peers {
            let ok = p
                .strip_prefix("http://")
                .is_some_and(|rest| !rest.is_empty() && !rest.contains(['?', '#']));
            if !ok {
                return Err(ConfigError(format!(
                    "api.peers: {p:?} is not an http:// base URL (like \"http://host:9464\")"
                )));
            }
        }
        let k = &self.kafka;
        if k.input_topics.is_empty() || k.input_topics.iter().any(String::is_empty) {
            return Err(ConfigError(
                "kafka.input_topics: must list at least one non-empty topic".into(),
            ));
        }
        in_range(
            "kafka.commit_interval_ms",
            k.commit_interval_ms(),
            1,
            MAX_MILLIS,
        )?;
        in_range(
            "kafka.topic_partitions",
            k.topic_partitions,
            1,
            MAX_TOPIC_PARTITIONS,
        )?;
        in_range(
            "kafka.replication_factor",
            k.replication_factor,
            1,
            MAX_REPLICATION_FACTOR,
        )?;
        in_range(
            "kafka.shutdown_timeout_ms",
            k.shutdown_timeout_ms,
            1,
            MAX_MILLIS,
        )?;
        for (key, v) in &k.properties {
            if matches!(v, toml::Value::Table(_) | toml::Value::Array(_)) {
                return Err(ConfigError(format!(
                    "kafka.properties.{key}: must be a string, number or boolean"
                )));
            }
        }
        if let Some(v) = k.properties.get("transaction.timeout.ms") {
            let ms = match v {
                toml::Value::Integer(n) => Some(*n),
                toml::Value::String(s) => s.trim().parse().ok(),
                _ => None,
            };
            let least = k.commit_interval_ms() + TRANSACTION_MARGIN_MS;
            if k.delivery == Delivery::ExactlyOnce && ms.is_none_or(|ms| ms <= least) {
                return Err(ConfigError(format!(
                    "kafka.properties.transaction.timeout.ms: must be a number of \
                     milliseconds above kafka.commit_interval_ms + {TRANSACTION_MARGIN_MS} \
                     ({least}): a transaction stays open for a commit interval, then commits \
                     (unset, the service uses the interval + \
                     {TRANSACTION_TIMEOUT_BEYOND_INTERVAL_MS} ms)"
                )));
            }
        }
        self.validate_reputation()?;
        self.validate_connect()
    }

    /// `[connect]` and `[label_studio]` (contract §12).
    fn validate_connect(&self) -> Result<(), ConfigError> {
        let c = &self.connect;
        c.listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| ConfigError(format!("connect.listen: {e}")))?;
        in_range(
            "connect.max_body_bytes",
            c.max_body_bytes,
            1,
            MAX_BODY_BYTES,
        )?;
        in_range(
            "connect.produce_timeout_ms",
            c.produce_timeout_ms,
            1,
            MAX_MILLIS,
        )?;
        seconds("connect.drain_seconds", c.drain_seconds)?;
        let l = &self.label_studio;
        if !l.url.is_empty() {
            let ok = ["http://", "https://"].iter().any(|scheme| {
                l.url
                    .strip_prefix(scheme)
                    .is_some_and(|rest| !rest.is_empty() && !rest.contains(['?', '#']))
            });
            if !ok {
                return Err(ConfigError(format!(
                    "label_studio.url: {:?} is not an http:// or https:// base URL",
                    l.url
                )));
            }
        }
        if let Some(p) = l.projects.iter().find(|p| **p < 1) {
            return Err(ConfigError(format!(
                "label_studio.projects: {p} is not a project id (ids start at 1)"
            )));
        }
        for (control, rubric) in &l.controls {
            if rubric.is_empty() || rubric.len() > 256 {
                return Err(ConfigError(format!(
                    "label_studio.controls.{control}: a voter_prompt_id of 1..=256 bytes"
                )));
            }
        }
        for (label, v) in &l.values {
            let ok = match v {
                toml::Value::Float(f) => (0.0..=1.0).contains(f),
                toml::Value::Integer(i) => (0..=1).contains(i),
                toml::Value::Boolean(_) => true,
                toml::Value::String(s) => crate::input::label_value(s).is_some(),
                _ => false,
            };
            if !ok {
                return Err(ConfigError(format!(
                    "label_studio.values.{label}: must be a number in [0, 1], a boolean or a vote \
                     string (pass, flag, fully, mostly, partial, minor, none), got {v}"
                )));
            }
        }
        for (k, v) in [
            ("label_studio.inference_id_field", &l.inference_id_field),
            ("label_studio.model_id_field", &l.model_id_field),
            ("label_studio.inference_time_field", &l.inference_time_field),
        ] {
            if v.is_empty() {
                return Err(ConfigError(format!("{k}: must not be empty")));
            }
        }
        seconds(
            "label_studio.sync_interval_seconds",
            l.sync_interval_seconds,
        )?;
        seconds(
            "label_studio.sync_lookback_seconds",
            l.sync_lookback_seconds,
        )?;
        in_range(
            "label_studio.extra_reviews",
            l.extra_reviews,
            0,
            MAX_ANNOTATIONS,
        )?;
        in_range(
            "label_studio.max_annotations",
            l.max_annotations,
            1,
            MAX_ANNOTATIONS,
        )?;
        Ok(())
    }

    /// `[reputation]` (contract §14): each key in its range; the rules that
    /// tie `epoch_seconds` to the batching unless the mode is `off`
    /// ([`Config::check_epochs`] checks them in any mode).
    fn validate_reputation(&self) -> Result<(), ConfigError> {
        let r = &self.reputation;
        positive("reputation.epoch_seconds", r.epoch_seconds)?;
        seconds("reputation.epoch_seconds", r.epoch_seconds)?;
        let ns = seconds_to_ns(r.epoch_seconds);
        if ns == 0 || ns as f64 / NANOS_PER_SEC as f64 != r.epoch_seconds {
            return Err(ConfigError(format!(
                "reputation.epoch_seconds: must be a whole number of nanoseconds, got {}",
                r.epoch_seconds
            )));
        }
        non_negative("reputation.prior_votes", r.prior_votes)?;
        positive("reputation.noise_floor", r.noise_floor)?;
        positive("reputation.min_weight", r.min_weight)?;
        if r.min_weight > 1.0 {
            return Err(ConfigError(format!(
                "reputation.min_weight: must be at most 1, got {}",
                r.min_weight
            )));
        }
        at_least_one("reputation.max_weight", r.max_weight)?;
        if r.topic.is_empty() {
            return Err(ConfigError("reputation.topic: must not be empty".into()));
        }
        self.validate_confusion()?;
        if r.mode != Mode::Off {
            check_epochs(&self.batching, r)?;
        }
        Ok(())
    }

    /// contract §15's options: each in its range, and set only when some
    /// rubric's model is `confusion` (an option nothing reads is a mistake).
    fn validate_confusion(&self) -> Result<(), ConfigError> {
        let r = &self.reputation;
        let options = [
            ("reputation.confusion_prior_votes", r.confusion_prior_votes),
            ("reputation.confusion_rate_floor", r.confusion_rate_floor),
            ("reputation.confusion_max_weight", r.confusion_max_weight),
        ];
        let used = r.model == Model::Confusion
            || self
                .rubrics
                .values()
                .any(|o| o.reputation_model == Some(Model::Confusion));
        if !used {
            let pair_fit = r
                .confusion_pair_fit
                .map(|_| "reputation.confusion_pair_fit");
            let set = options.iter().find(|(_, v)| v.is_some()).map(|(k, _)| *k);
            if let Some(key) = set.or(pair_fit) {
                return Err(ConfigError(format!(
                    "{key}: an option of reputation model \"confusion\", which no rubric uses \
                     (set reputation.model or rubrics.<id>.reputation_model to \"confusion\", \
                     or remove it)"
                )));
            }
        }
        let c = self.confusion_params();
        non_negative("reputation.confusion_prior_votes", c.prior_votes)?;
        finite("reputation.confusion_rate_floor", c.rate_floor)?;
        if !(c.rate_floor > 0.0 && c.rate_floor < 0.5) {
            return Err(ConfigError(format!(
                "reputation.confusion_rate_floor: must be > 0 and < 0.5, got {}",
                c.rate_floor
            )));
        }
        at_least_one("reputation.confusion_max_weight", c.max_weight)
    }

    /// contract §15's options, the defaults where unset.
    fn confusion_params(&self) -> ConfusionParams {
        let r = &self.reputation;
        let d = ConfusionParams::default();
        ConfusionParams {
            prior_votes: r.confusion_prior_votes.unwrap_or(d.prior_votes),
            rate_floor: r.confusion_rate_floor.unwrap_or(d.rate_floor),
            max_weight: r.confusion_max_weight.unwrap_or(d.max_weight),
            pair_fit: r.confusion_pair_fit.unwrap_or(d.pair_fit),
        }
    }

    fn reputation_params(&self) -> ReputationParams {
        let r = &self.reputation;
        ReputationParams {
            mode: r.mode,
            epoch_ns: seconds_to_ns(r.epoch_seconds),
            prior_votes: r.prior_votes,
            noise_floor: r.noise_floor,
            min_weight: r.min_weight,
            max_weight: r.max_weight,
            confusion: self.confusion_params(),
        }
    }

    /// The engine's configuration; checks the scoring parameters of the
    /// defaults and of every rubric on the way.
    fn engine(&self) -> Result<EngineConfig, ConfigError> {
        let defaults = self.rubric_params("scoring", "ambiguity", &RubricOverride::default())?;
        let mut rubrics = HashMap::new();
        for (name, o) in &self.rubrics {
            let prefix = format!("rubrics.{name}");
            rubrics.insert(name.clone(), self.rubric_params(&prefix, &prefix, o)?);
        }
        let b = &self.batching;
        Ok(EngineConfig {
            window_ns: seconds_to_ns(b.window_seconds),
            window_seconds: b.window_seconds,
            grace_ns: seconds_to_ns(b.grace_seconds),
            max_votes: b.max_votes as u32,
            initial_score: self.scoring.initial_score,
            initial_gap_ns: seconds_to_ns(self.scoring.initial_gap_seconds),
            min_votes: self.ambiguity.min_votes as u32,
            retention_ns: seconds_to_ns(self.dedupe.retention_seconds),
            defaults,
            rubrics,
            query_index: false,
            companions: Vec::new(),
            reputation: self.reputation_params(),
        })
    }

    /// `o` over the defaults; errors name `{scoring}.x` or `{ambiguity}.x`.
    fn rubric_params(
        &self,
        scoring: &str,
        ambiguity: &str,
        o: &RubricOverride,
    ) -> Result<RubricParams, ConfigError> {
        let d = &self.scoring;
        let lambda = o.lambda.unwrap_or(d.lambda);
        let temperature = o.temperature.unwrap_or(d.temperature);
        let variance_threshold = o
            .variance_threshold
            .unwrap_or(self.ambiguity.variance_threshold);
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
        Ok(RubricParams {
            lambda,
            time_unit: o.time_unit.unwrap_or(d.time_unit),
            variance_threshold,
            aggregator: o.aggregator.unwrap_or(d.aggregator),
            temperature,
            reputation_model: o.reputation_model.unwrap_or(self.reputation.model),
        })
    }
}

/// `reputation.epoch_seconds` a multiple of `batching.window_seconds`
/// (when that is > 0) and at least `batching.grace_seconds`.
pub(super) fn check_epochs(b: &Batching, r: &Reputation) -> Result<(), ConfigError> {
    let e = seconds_to_ns(r.epoch_seconds);
    let w = seconds_to_ns(b.window_seconds);
    if w > 0 && e % w != 0 {
        return Err(ConfigError(format!(
            "reputation.epoch_seconds: must be a multiple of batching.window_seconds ({}), got {}",
            b.window_seconds, r.epoch_seconds
        )));
    }
    if e < seconds_to_ns(b.grace_seconds) {
        return Err(ConfigError(format!(
            "reputation.epoch_seconds: must be at least batching.grace_seconds ({}), got {}",
            b.grace_seconds, r.epoch_seconds
        )));
    }
    Ok(())
}

/// A finite bound of weights, at least 1.
fn at_least_one(key: &str, v: f64) -> Result<(), ConfigError> {
    finite(key, v)?;
    if v < 1.0 {
        return Err(ConfigError(format!("{key}: must be >= 1, got {v}")));
    }
    Ok(())
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

/// A duration in seconds: finite, in [0, `MAX_SECONDS`] (100 years).
fn seconds(key: &str, v: f64) -> Result<(), ConfigError> {
    non_negative(key, v)?;
    if v > MAX_SECONDS {
        return Err(ConfigError(format!(
            "{key}: must be at most {MAX_SECONDS} (100 years), got {v}"
        )));
    }
    Ok(())
}

fn in_range(key: &str, v: i64, min: i64, max: i64) -> Result<(), ConfigError> {
    if v < min {
        return Err(ConfigError(format!("{key}: must be >= {min}, got {v}")));
    }
    if v > max {
        return Err(ConfigError(format!(
            "{key}: must be at most {max}, got {v}"
        )));
    }
    Ok(())
}
