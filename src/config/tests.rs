use std::time::{Duration, Instant, SystemTime};

use super::*;

fn load(file: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    Config::from_layers(Some(file), &env)
}

fn err(file: &str, env: &[(&str, &str)]) -> String {
    load(file, env).expect_err(file).0
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
    assert_eq!(c.scoring.time_unit, TimeUnit::Seconds);
    assert_eq!(c.scoring.aggregator, Aggregator::Mean);
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
    assert_eq!(c.kafka.commit_interval_ms, None);
    assert_eq!(c.kafka.commit_interval_ms(), 100);
    assert_eq!(c.kafka.delivery, Delivery::ExactlyOnce);
    assert_eq!(c.state.dir, "data");
    assert_eq!(c.log.format, LogFormat::Text);
    let e = c.engine();
    assert_eq!(e.window_ns, 60 * NANOS_PER_SEC);
    assert_eq!(e.grace_ns, 5 * NANOS_PER_SEC);
    assert_eq!(e.retention_ns, 2_592_000 * NANOS_PER_SEC);
    assert_eq!(e.defaults.time_unit, TimeUnit::Seconds);
}

#[test]
fn the_commit_interval_defaults_by_delivery_mode_unless_set() {
    let interval =
        |file: &str, env: &[(&str, &str)]| load(file, env).unwrap().kafka.commit_interval_ms();
    let alo = [("JURYSTREAM_KAFKA__DELIVERY", "at_least_once")];
    let outbox = [("JURYSTREAM_KAFKA__DELIVERY", "exactly_once_outbox")];
    assert_eq!(interval("", &[]), 100);
    assert_eq!(interval("", &outbox), 100);
    assert_eq!(interval("", &alo), 500);
    assert_eq!(interval("[kafka]\ncommit_interval_ms = 100\n", &alo), 100);
    assert_eq!(interval("[kafka]\ncommit_interval_ms = 2000\n", &[]), 2000);
    assert_eq!(
        interval(
            "",
            &[("JURYSTREAM_KAFKA__COMMIT_INTERVAL_MS", "250"), alo[0]]
        ),
        250
    );
}

#[test]
fn the_transaction_timeout_is_the_interval_plus_ten_seconds_unless_set() {
    let timeout = |file: &str| load(file, &[]).unwrap().transaction_timeout_ms();
    assert_eq!(timeout(""), 10_100);
    assert_eq!(timeout("[kafka]\ncommit_interval_ms = 2000\n"), 12_000);
    let props = "[kafka.properties]\n";
    assert_eq!(
        timeout(&format!("{props}\"transaction.timeout.ms\" = 30000\n")),
        30_000
    );
    assert_eq!(
        timeout(&format!("{props}\"transaction.timeout.ms\" = \"4000\"\n")),
        4_000
    );
    // librdkafka refuses a transaction timeout below these two.
    assert_eq!(
        timeout(&format!("{props}\"message.timeout.ms\" = 45000\n")),
        45_000
    );
    assert_eq!(
        timeout(&format!("{props}\"socket.timeout.ms\" = 20000\n")),
        20_100
    );
    // A set one must leave a cycle its interval and the margin.
    let err = |file: &str, env: &[(&str, &str)]| load(file, env).err().map(|e| e.to_string());
    let set = |ms: &str| {
        format!("[kafka]\ncommit_interval_ms = 2000\n{props}\"transaction.timeout.ms\" = {ms}\n")
    };
    assert!(err(&set("3000"), &[])
        .unwrap()
        .contains("kafka.properties.transaction.timeout.ms"));
    assert!(err(&set("\"soon\""), &[]).is_some());
    assert!(err(&set("3001"), &[]).is_none());
    let outbox = [("JURYSTREAM_KAFKA__DELIVERY", "exactly_once_outbox")];
    assert!(
        err(&set("3000"), &outbox).is_none(),
        "no transactions in the outbox mode"
    );
}

#[test]
fn the_sections_are_those_of_default_toml() {
    let t: toml::Table = DEFAULT_TOML.parse().unwrap();
    let mut keys: Vec<&str> = t.keys().map(String::as_str).collect();
    let mut listed = DEFAULT_SECTIONS.to_vec();
    keys.sort_unstable();
    listed.sort_unstable();
    assert_eq!(keys, listed);
}

#[test]
fn partial_files_and_env_layer_over_defaults() {
    let c = load(
        "[scoring]\nlambda = 0.2\n[batching]\nwindow_seconds = 7.5\n",
        &[
            ("JURYSTREAM_SCORING__TIME_UNIT", "days"),
            ("JURYSTREAM_BATCHING__MAX_VOTES", "3"),
            ("JURYSTREAM_KAFKA__DELIVERY", "at_least_once"),
            ("JURYSTREAM_LOG__FORMAT", "json"),
        ],
    )
    .unwrap();
    assert_eq!(c.scoring.lambda, 0.2);
    assert_eq!(c.scoring.time_unit, TimeUnit::Days);
    assert_eq!(c.engine().defaults.time_unit, TimeUnit::Days);
    assert_eq!(c.batching.max_votes, 3);
    assert_eq!(c.batching.grace_seconds, 5.0);
    assert_eq!(c.kafka.delivery, Delivery::AtLeastOnce);
    assert_eq!(c.log.format, LogFormat::Json);
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
fn bad_choices_name_the_key_and_list_the_allowed_values() {
    let cases = [
        (
            "[kafka]\ndelivery = \"x\"\n",
            r#"kafka.delivery: must be "exactly_once", "exactly_once_outbox" or "at_least_once", got "x""#,
        ),
        (
            "[log]\nformat = \"xml\"\n",
            r#"log.format: must be "text" or "json", got "xml""#,
        ),
        (
            "[scoring]\ntime_unit = \"weeks\"\n",
            r#"scoring.time_unit: must be "seconds", "minutes", "hours" or "days", got "weeks""#,
        ),
        (
            "[scoring]\naggregator = \"median\"\n",
            r#"scoring.aggregator: must be "mean" or "power_mean", got "median""#,
        ),
        (
            "[rubrics.safety]\ntime_unit = \"Days\"\n",
            r#"rubrics.safety.time_unit: must be "seconds", "minutes", "hours" or "days", got "Days""#,
        ),
        (
            "[rubrics.safety]\naggregator = \"max\"\n",
            r#"rubrics.safety.aggregator: must be "mean" or "power_mean", got "max""#,
        ),
    ];
    for (file, want) in cases {
        assert_eq!(err(file, &[]), want);
    }
    // Not a string at all: still the key and the allowed values.
    let e = err("[kafka]\ndelivery = 1\n", &[]);
    assert!(
        e.starts_with("kafka.delivery: ")
            && e.contains(r#""exactly_once", "exactly_once_outbox" or "at_least_once""#),
        "{e}"
    );
}

#[test]
fn choices_parse_print_and_override_per_rubric() {
    for d in [
        Delivery::ExactlyOnce,
        Delivery::ExactlyOnceOutbox,
        Delivery::AtLeastOnce,
    ] {
        assert_eq!(d.to_string(), d.as_str());
        assert_eq!(d.as_str().parse::<Delivery>(), Ok(d));
        let c = load(&format!("[kafka]\ndelivery = {:?}\n", d.as_str()), &[]).unwrap();
        assert_eq!(c.kafka.delivery, d);
    }
    for f in [LogFormat::Text, LogFormat::Json] {
        assert_eq!(f.to_string(), f.as_str());
        assert_eq!(f.as_str().parse::<LogFormat>(), Ok(f));
    }
    assert_eq!(
        "JSON".parse::<LogFormat>(),
        Err(r#"must be "text" or "json", got "JSON""#.to_string())
    );
    let c = load(
        "[scoring]\ntime_unit = \"minutes\"\naggregator = \"power_mean\"\n\
         [rubrics.a]\ntime_unit = \"hours\"\naggregator = \"mean\"\n[rubrics.b]\nlambda = 1\n",
        &[],
    )
    .unwrap();
    let e = c.engine();
    assert_eq!(e.params("a").time_unit, TimeUnit::Hours);
    assert_eq!(e.params("a").aggregator, Aggregator::Mean);
    assert_eq!(e.params("b").time_unit, TimeUnit::Minutes);
    assert_eq!(e.params("b").aggregator, Aggregator::PowerMean);
    assert_eq!(e.params("b").lambda, 1.0);
    assert_eq!(e.params("other").time_unit, TimeUnit::Minutes);
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

/// Every bounded key: (section, key, its maximum as TOML, just above it).
fn bounds() -> Vec<(&'static str, &'static str, String, String)> {
    let secs = |s: &'static str, k: &'static str| {
        (
            s,
            k,
            format!("{MAX_SECONDS:?}"),
            format!("{:?}", MAX_SECONDS.next_up()),
        )
    };
    let int =
        |s: &'static str, k: &'static str, max: i64| (s, k, max.to_string(), (max + 1).to_string());
    vec![
        secs("batching", "window_seconds"),
        secs("batching", "grace_seconds"),
        secs("batching", "idle_flush_seconds"),
        secs("scoring", "initial_gap_seconds"),
        secs("input", "max_future_skew_seconds"),
        secs("dedupe", "retention_seconds"),
        secs("state", "cleanup_grace_seconds"),
        int("batching", "max_votes", MAX_VOTES),
        int("ambiguity", "min_votes", MAX_VOTES),
        int("input", "max_message_bytes", MAX_MESSAGE_BYTES),
        int("metrics", "max_label_values", MAX_LABEL_VALUES),
        int("kafka", "commit_interval_ms", MAX_MILLIS),
        int("kafka", "shutdown_timeout_ms", MAX_MILLIS),
        int("kafka", "topic_partitions", MAX_TOPIC_PARTITIONS),
        int("kafka", "replication_factor", MAX_REPLICATION_FACTOR),
    ]
}

#[test]
fn each_bound_accepts_its_maximum_and_rejects_just_above() {
    assert_eq!(MAX_SECONDS, 3_155_760_000.0);
    for (section, key, max, above) in bounds() {
        let at = format!("[{section}]\n{key} = {max}\n");
        load(&at, &[]).unwrap_or_else(|e| panic!("{at}: {e}"));
        let e = err(&format!("[{section}]\n{key} = {above}\n"), &[]);
        assert!(
            e.starts_with(&format!("{section}.{key}: must be at most ")),
            "{e}"
        );
        // The same through the environment names the variable.
        let var = format!(
            "JURYSTREAM_{}__{}",
            section.to_uppercase(),
            key.to_uppercase()
        );
        let e = err("", &[(&var, &above)]);
        assert!(
            e.starts_with(&format!("{var} ({section}.{key}): must be at most")),
            "{e}"
        );
    }
}

/// What the shells do with the configured durations, at the extremes.
fn use_durations(c: &Config) {
    let now = Instant::now();
    let wall = SystemTime::now();
    for s in [
        c.batching.window_seconds,
        c.batching.grace_seconds,
        c.batching.idle_flush_seconds,
        c.scoring.initial_gap_seconds,
        c.input.max_future_skew_seconds,
        c.dedupe.retention_seconds,
        c.state.cleanup_grace_seconds,
    ] {
        let d = Duration::from_secs_f64(s);
        assert!(now.checked_add(d).is_some() && wall.checked_add(d).is_some());
        let ns = seconds_to_ns(s);
        assert!(i64::try_from(ns).is_ok(), "{s} s is {ns} ns");
        // As the service computes it.
        let _ = (s * NANOS_PER_SEC as f64) as i128;
    }
    for ms in [c.kafka.commit_interval_ms(), c.kafka.shutdown_timeout_ms] {
        let d = Duration::from_millis(u64::try_from(ms).unwrap());
        assert!(now.checked_add(d).is_some());
        assert!(i32::try_from(d.as_millis()).is_ok());
    }
    assert!(i32::try_from(c.kafka.topic_partitions).is_ok());
    assert!(i16::try_from(c.kafka.replication_factor).is_ok());
    assert!(u32::try_from(c.batching.max_votes).is_ok());
    assert!(u32::try_from(c.ambiguity.min_votes).is_ok());
    let e = c.engine();
    // A vote in year 9999 and one in year 0 (the range of RFC 3339 times):
    // window, grace, retention and the initial gap stay far inside i128.
    for ts in [
        253_402_300_799 * NANOS_PER_SEC,
        -62_135_596_800 * NANOS_PER_SEC,
    ] {
        let start = e.window_start(ts);
        let _ = start + e.window_ns + e.grace_ns + e.retention_ns + e.initial_gap_ns;
        let _ = start - e.window_ns - e.grace_ns - e.retention_ns - e.initial_gap_ns;
    }
}

#[test]
fn no_accepted_config_makes_a_duration_conversion_panic() {
    let mut at_max = String::new();
    for (section, key, max, _) in bounds() {
        at_max.push_str(&format!("{section}.{key} = {max}\n"));
    }
    for (section, key, min) in [
        ("batching", "window_seconds", "0"),
        ("batching", "window_seconds", "1e-9"),
        ("batching", "grace_seconds", "0"),
        ("batching", "idle_flush_seconds", "5e-324"),
        ("scoring", "initial_gap_seconds", "0"),
        ("input", "max_future_skew_seconds", "0"),
        ("dedupe", "retention_seconds", "0"),
        ("state", "cleanup_grace_seconds", "0"),
        ("kafka", "commit_interval_ms", "1"),
        ("kafka", "shutdown_timeout_ms", "1"),
    ] {
        use_durations(&load(&format!("{section}.{key} = {min}\n"), &[]).unwrap());
    }
    use_durations(&load(&at_max, &[]).unwrap());
    use_durations(&load("", &[]).unwrap());
    for (section, key, _, above) in bounds() {
        assert!(load(&format!("{section}.{key} = {above}\n"), &[]).is_err());
    }
    for bad in ["1e20", "inf", "-1", "nan"] {
        assert!(load(&format!("batching.idle_flush_seconds = {bad}\n"), &[]).is_err());
    }
}

#[test]
fn environment_errors_name_the_variable_as_written() {
    let e = err("", &[("JURYSTREAM_BATCHING__WINDOW_SECS", "5")]);
    assert!(
        e.starts_with("JURYSTREAM_BATCHING__WINDOW_SECS: unknown key (batching.window_secs)"),
        "{e}"
    );
    assert_eq!(
        ConfigError(e).to_string().split(" (").next().unwrap(),
        "configuration error: JURYSTREAM_BATCHING__WINDOW_SECS: unknown key"
    );
    let e = err("", &[("JURYSTREAM_SCORING__LAMBDA", "-1")]);
    assert_eq!(
        e,
        "JURYSTREAM_SCORING__LAMBDA (scoring.lambda): must be >= 0, got -1"
    );
    let e = err("", &[("JURYSTREAM_SCORING__LAMBDA", "abc")]);
    assert!(
        e.starts_with("JURYSTREAM_SCORING__LAMBDA (scoring.lambda): "),
        "{e}"
    );
    // As written, even in another case.
    let e = err("", &[("JURYSTREAM_Kafka__Delivery", "twice")]);
    assert!(
        e.starts_with(r#"JURYSTREAM_Kafka__Delivery (kafka.delivery): must be "exactly_once""#),
        "{e}"
    );
    let e = err("", &[("JURYSTREAM_NOSUCH__X", "1")]);
    assert!(e.starts_with("JURYSTREAM_NOSUCH__X: unknown key"), "{e}");
    let e = err("", &[("JURYSTREAM_RUBRICS__X", "1")]);
    assert!(e.starts_with("JURYSTREAM_RUBRICS__X: "), "{e}");
    // A problem the environment only makes visible is still the variable's
    // when it set the key the message names.
    let e = err("", &[("JURYSTREAM_BATCHING__MAX_VOTES", "0")]);
    assert!(
        e.starts_with("JURYSTREAM_BATCHING__MAX_VOTES (batching.max_votes): must be >= 1"),
        "{e}"
    );
}

#[test]
fn file_errors_name_the_key_path_not_a_variable() {
    let env = [("JURYSTREAM_SCORING__LAMBDA", "0.5")];
    let e = err("[batching]\nwindow_secs = 5\n", &env);
    assert!(e.starts_with("batching.window_secs: unknown key"), "{e}");
    let e = err("[scoring]\ntemperature = 3\n", &env);
    assert_eq!(e, "scoring.temperature: must be in [0.1, 1.0], got 3");
    let e = err("[nosuch]\nx = 1\n", &[]);
    assert!(e.starts_with("nosuch: unknown key"), "{e}");
    let e = err("[rubrics.safety]\nlambda = -2.0\n", &env);
    assert_eq!(e, "rubrics.safety.lambda: must be >= 0, got -2");
    // The file's value, overridden by a valid variable, is no error.
    load("[scoring]\nlambda = -1\n", &env).unwrap();
}

#[test]
fn reputation_defaults_ranges_and_the_epoch_rules() {
    use crate::engine::reputation::Mode;
    let c = load("", &[]).unwrap();
    let r = &c.reputation;
    assert_eq!(r.mode, Mode::Off);
    assert_eq!(r.epoch_seconds, 86_400.0);
    assert_eq!(r.prior_votes, 20.0);
    assert_eq!(r.noise_floor, 0.03);
    assert_eq!(r.min_weight, 0.2);
    assert_eq!(r.max_weight, 3.0);
    assert_eq!(r.topic, "jury.reputation");
    assert_eq!(c.engine().reputation.epoch_ns, 86_400 * 1_000_000_000);
    let c = load("", &[("JURYSTREAM_REPUTATION__MODE", "learned")]).unwrap();
    assert_eq!(c.engine().reputation.mode, Mode::Learned);
    for (file, key) in [
        ("[reputation]\nmode = \"on\"", "reputation.mode"),
        (
            "[reputation]\nepoch_seconds = 0",
            "reputation.epoch_seconds",
        ),
        (
            "[reputation]\nepoch_seconds = 1e-10",
            "reputation.epoch_seconds",
        ),
        ("[reputation]\nprior_votes = -1", "reputation.prior_votes"),
        ("[reputation]\nnoise_floor = 0", "reputation.noise_floor"),
        ("[reputation]\nmin_weight = 0", "reputation.min_weight"),
        ("[reputation]\nmin_weight = 1.5", "reputation.min_weight"),
        ("[reputation]\nmax_weight = 0.5", "reputation.max_weight"),
        ("[reputation]\nmax_weight = inf", "reputation.max_weight"),
        ("[reputation]\ntopic = \"\"", "reputation.topic"),
        ("[reputation]\nbogus = 1", "reputation.bogus"),
    ] {
        let e = err(file, &[]);
        assert!(e.contains(key), "{file}: {e}");
    }
    // The cross-key rules: only unless the mode is off, and the command
    // checks them in every mode.
    let odd = "[reputation]\nepoch_seconds = 90";
    let c = load(odd, &[]).unwrap();
    assert!(c
        .check_epochs()
        .unwrap_err()
        .0
        .contains("reputation.epoch_seconds"));
    let e = err(odd, &[("JURYSTREAM_REPUTATION__MODE", "shadow")]);
    assert!(e.contains("reputation.epoch_seconds"), "{e}");
    let short = "[batching]\nwindow_seconds = 0\ngrace_seconds = 10\n[reputation]\nmode = \"learned\"\nepoch_seconds = 5";
    assert!(err(short, &[]).contains("reputation.epoch_seconds"));
    assert!(load("[batching]\nwindow_seconds = 0\ngrace_seconds = 0.5\n[reputation]\nmode = \"learned\"\nepoch_seconds = 0.5", &[]).is_ok());
}

#[test]
fn config_errors_are_the_users() {
    use crate::error::Classify as _;
    let e = ConfigError("x: unknown key".into());
    assert_eq!(e.fault(), crate::error::Fault::Usage);
    assert_eq!(e.retry(), crate::error::RetryHint::NoRetry);
}
