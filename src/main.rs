//! CLI wiring only: parse arguments, set up logging, dispatch.

mod allocator;
mod cli;

use cli::*;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use jurystream::config::{Config, ConfigError, LogFormat};
use jurystream::error::{chain, Classify, Fault};

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("JURYSTREAM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = if json {
        b.json().try_init()
    } else {
        b.try_init()
    };
}

/// Set by SIGTERM/SIGINT: the service stops polling and ends the open cycle.
static STOP: AtomicBool = AtomicBool::new(false);

/// Exit status of a shutdown that ran past `kafka.shutdown_timeout_ms`
/// (stated in `run --help`).
const EXIT_SHUTDOWN_TIMEOUT: u8 = 3;

/// SIGTERM/SIGINT set [`STOP`]. The first one also arms the shutdown
/// watchdog: if the process is still running `timeout` later, it exits with
/// [`EXIT_SHUTDOWN_TIMEOUT`] without finishing the cycle (an unfinished
/// transaction is aborted by the next start; nothing partial is committed).
fn install_signal_handlers(timeout: Duration) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("shutdown-watchdog".into())
        .spawn(move || {
            // Blocks until the first signal arrives.
            if signals.forever().next().is_none() {
                return;
            }
            STOP.store(true, Ordering::SeqCst);
            std::thread::sleep(timeout);
            eprintln!(
                "jurystream: shutdown took longer than kafka.shutdown_timeout_ms; \
                 exiting with status {EXIT_SHUTDOWN_TIMEOUT} without finishing the cycle"
            );
            std::process::exit(i32::from(EXIT_SHUTDOWN_TIMEOUT));
        })?;
    Ok(())
}

/// How a command failed, by whose fault (the same in every command, listed
/// in `jurystream --help`): the user's — a flag, the configuration, or a
/// setting the environment refuses (`Fault::Usage`) — exits with status 2,
/// any other failure with 1. The message is printed once, by `main`.
enum Failure {
    Usage(String),
    Failed(anyhow::Error),
}

/// A command's error as a [`Failure`], by its [`Classify::fault`].
fn failure<E: Classify + std::error::Error + Send + Sync + 'static>(e: E) -> Failure {
    if e.fault() == Fault::Usage {
        Failure::Usage(chain(&e))
    } else {
        Failure::Failed(e.into())
    }
}

type Outcome = Result<(), Failure>;

/// A long-running command's start (`run`, `connect`): its configuration
/// with `--log-format` applied, logging, and the signal handlers with the
/// shutdown deadline `timeout` gives.
fn start_service(
    config: Option<PathBuf>,
    log_format: Option<LogFormatArg>,
    timeout: impl Fn(&Config) -> Duration,
) -> Result<Config, Failure> {
    let mut cfg = load_config(config.as_deref())?;
    if let Some(f) = log_format {
        cfg.log.format = f.into();
    }
    init_logging(cfg.log.format == LogFormat::Json);
    install_signal_handlers(timeout(&cfg)).map_err(|e| {
        Failure::Failed(anyhow::Error::new(e).context("cannot install the signal handlers"))
    })?;
    Ok(cfg)
}

fn load_config(path: Option<&std::path::Path>) -> Result<Config, Failure> {
    Config::load(path).map_err(|e: ConfigError| Failure::Usage(e.to_string()))
}

fn run(a: ServiceArgs) -> Outcome {
    let cfg = start_service(a.config, a.log_format, |c| {
        Duration::from_millis(c.kafka.shutdown_timeout_ms as u64)
    })?;
    jurystream::service::run(cfg, &STOP).map_err(failure)
}

fn connect(a: ServiceArgs) -> Outcome {
    // The drain, then a request in progress waiting on the broker.
    let cfg = start_service(a.config, a.log_format, |c| {
        Duration::from_secs_f64(c.connect.drain_seconds)
            + Duration::from_millis(c.connect.produce_timeout_ms as u64)
            + Duration::from_secs(10)
    })?;
    jurystream::connect::run(cfg, &STOP).map_err(failure)
}

fn produce(a: ProduceArgs) -> Outcome {
    let mut props = Vec::new();
    for p in a.properties {
        match p.split_once('=') {
            Some((k, v)) => props.push((k.to_owned(), v.to_owned())),
            None => {
                return Err(Failure::Usage(format!(
                    "--property takes KEY=VALUE, got {p:?}"
                )))
            }
        }
    }
    let n =
        jurystream::produce::produce(&a.input, &a.topic, &a.brokers, &props).map_err(failure)?;
    eprintln!(
        "produced {n} messages to {}, every one acknowledged by the broker",
        a.topic
    );
    Ok(())
}

fn consume(a: ConsumeArgs) -> Outcome {
    jurystream::produce::consume(
        &a.brokers,
        &a.topics,
        a.idle_exit.map(Duration::from_secs_f64),
    )
    .map(drop)
    .map_err(failure)
}

fn replay(a: ReplayArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    let metrics = match a.metrics_listen {
        None => None,
        Some(addr) => {
            let m = jurystream::telemetry::Metrics::new(cfg.metrics.max_label_values as usize);
            jurystream::server::serve(addr, m.clone(), Default::default()).map_err(|e| {
                Failure::Usage(format!("--metrics-listen: cannot listen on {addr}: {e}"))
            })?;
            Some(m)
        }
    };
    let result = match &a.input {
        Some(input) => {
            let opts = jurystream::replay::ReplayOptions {
                input,
                state_dir: a.state_dir.as_deref(),
                keep_open: a.keep_open,
                metrics: metrics.clone(),
                shared: None,
            };
            jurystream::replay::run(&cfg, &opts, std::io::stdout())
        }
        None => replay_partitions(&cfg, &a.partition_files, &metrics),
    };
    if let Ok(s) = &result {
        tracing::debug!(
            lines = s.lines,
            rejected = s.rejected,
            events = s.events,
            "replay done"
        );
    }
    if metrics.is_some() && a.metrics_linger > 0 {
        std::thread::sleep(Duration::from_secs(a.metrics_linger));
    }
    result.map(drop).map_err(failure)
}

/// `replay --partition-files`: every file's sealed deltas first, then each
/// file replayed with tables over all of them.
fn replay_partitions(
    cfg: &Config,
    files: &[PathBuf],
    metrics: &Option<std::sync::Arc<jurystream::telemetry::Metrics>>,
) -> Result<jurystream::replay::ReplaySummary, jurystream::replay::ReplayError> {
    let mut deltas = Vec::new();
    for f in files {
        deltas.extend(jurystream::reputation::partition_deltas(cfg, f)?);
    }
    let mut total = jurystream::replay::ReplaySummary::default();
    for f in files {
        let opts = jurystream::replay::ReplayOptions {
            input: f,
            state_dir: None,
            keep_open: false,
            metrics: metrics.clone(),
            shared: Some(&deltas),
        };
        let s = jurystream::replay::run(cfg, &opts, std::io::stdout())?;
        total.lines += s.lines;
        total.rejected += s.rejected;
        total.events += s.events;
    }
    Ok(total)
}

fn backtest(a: BacktestArgs) -> Outcome {
    use jurystream::backtest;
    let cfg = load_config(a.config.as_deref())?;
    let usage = |e: backtest::UsageError| Failure::Usage(e.to_string());
    let raw = backtest::RawOptions {
        input: a.input,
        lambda: a.lambda,
        time_unit: a.time_unit.map(|u| u.as_str().to_owned()),
        window: a.window,
        variance_threshold: a.variance_threshold,
        review_budget: Some(a.review_budget),
        step: Some(a.step),
        report: a.report,
    };
    let opts = raw.resolve(&cfg).map_err(usage)?;
    backtest::grid(&cfg, &opts).map_err(usage)?;
    backtest::run_and_print(&cfg, &opts, a.format == Format::Json).map_err(failure)
}

fn agreement(a: ReportArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    let (tally, summary) = jurystream::agreement::tally_file(&cfg, &a.input).map_err(failure)?;
    print_report(
        "agreement",
        a.format,
        &tally.report(),
        || jurystream::agreement::table(&tally),
        &summary,
        (tally.rubrics.len(), tally.reviewers.len()),
    );
    Ok(())
}

fn reputation(a: ReportArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    cfg.check_epochs()
        .map_err(|e: ConfigError| Failure::Usage(e.to_string()))?;
    let (out, summary) = jurystream::reputation::report_file(&cfg, &a.input).map_err(failure)?;
    print_report(
        "reputation",
        a.format,
        &out,
        || jurystream::reputation::table(&out),
        &summary,
        (out.rubrics.len(), out.voters.len()),
    );
    Ok(())
}

/// A report command's answer on stdout (one JSON object, or tables), and
/// what it read on stderr.
fn print_report<T: serde::Serialize>(
    command: &str,
    format: Format,
    json: &T,
    table: impl FnOnce() -> String,
    summary: &jurystream::replay::ReplaySummary,
    (rubrics, reviewers): (usize, usize),
) {
    match format {
        Format::Json => println!("{}", serde_json::to_string(json).unwrap_or_default()),
        Format::Table => print!("{}", table()),
    }
    eprintln!(
        "jurystream: {command}: {} lines, {} rejected, {rubrics} rubrics, {reviewers} reviewer rows",
        summary.lines, summary.rejected,
    );
}

fn inspect(a: InspectArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    let initial_score = cfg.engine().initial_score;
    let v =
        jurystream::inspect::inspect(&a.state_dir, &a.inference, initial_score).map_err(failure)?;
    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    Ok(())
}

fn query(a: QueryArgs) -> Outcome {
    use jurystream::api::percent_encode;
    let rubric = a.voter_prompt_id.map(|r| percent_encode(&r));
    let path = match (a.inference, a.voter, a.voters, rubric) {
        (Some(id), ..) => format!("/v1/inferences/{}", percent_encode(&id)),
        (_, Some(id), ..) => format!("/v1/voters/{}", percent_encode(&id)),
        (_, _, Some(n), Some(r)) => {
            format!("/v1/voters?voter_prompt_id={r}&order=deviation&limit={n}")
        }
        _ if a.rubrics => "/v1/rubrics".to_owned(),
        (.., Some(r)) => format!("/v1/leaderboard?voter_prompt_id={r}"),
        _ => "/v1/leaderboard".to_owned(),
    };
    let text =
        jurystream::api::client::query(&a.url, &path, a.token.as_deref()).map_err(failure)?;
    println!("{text}");
    Ok(())
}

fn main() -> ExitCode {
    allocator::tune_allocator();
    jurystream::telemetry::count_panics();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run(_) | Command::Connect(_)) {
        init_logging(false);
    }
    let outcome = match cli.command {
        Command::Run(a) => run(a),
        Command::Connect(a) => connect(a),
        Command::Produce(a) => produce(a),
        Command::Consume(a) => consume(a),
        Command::Replay(a) => replay(a),
        Command::Backtest(a) => backtest(a),
        Command::Agreement(a) => agreement(a),
        Command::Reputation(a) => reputation(a),
        Command::Inspect(a) => inspect(a),
        Command::Query(a) => query(a),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("jurystream: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(e)) => {
            eprintln!("jurystream: {e:#}");
            ExitCode::FAILURE
        }
    }
}
