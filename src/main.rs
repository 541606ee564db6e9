//! CLI wiring only: parse arguments, set up logging, dispatch.

mod allocator;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use jurystream::config::{Config, ConfigError, LogFormat};
use jurystream::error::{chain, Classify, Fault};

/// jurystream turns a stream of human votes on AI outputs into time-decayed
/// quality scores and ambiguity flags (GrandJury protocol), with RocksDB state
/// and exactly-once Kafka delivery.
#[derive(Parser)]
#[command(name = "jurystream", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a JSONL file of votes as one partition and print every output
    /// event (score_updated, ambiguity_flagged, vote_rejected) as one JSON
    /// line on stdout, in emission order.
    ///
    /// Runs the same engine as `run`. Without --state-dir a fresh temporary
    /// RocksDB is used; with one, the partition continues where the last
    /// replay into that directory left it (series, open batches, dedupe
    /// memory, watermark). At the end of the file every open batch closes,
    /// unless --keep-open is given. Progress goes to stderr when it is a
    /// terminal.
    Replay(ReplayArgs),
    /// Run the Kafka service: consume votes from kafka.input_topics as
    /// consumer group kafka.group_id, score them, and publish score_updated,
    /// ambiguity_flagged and vote_rejected events to the outputs.* topics,
    /// committing every kafka.commit_interval_ms as kafka.delivery says:
    /// exactly_once (the default: each cycle is one Kafka transaction holding
    /// outputs, state changelog and input offsets), exactly_once_outbox
    /// (exactly once without broker transactions: a cycle's events go to the
    /// changelog first) or at_least_once. State: RocksDB under state.dir,
    /// which one process holds at a time.
    ///
    /// SIGTERM/SIGINT stop polling, finish (or abort) the open cycle and exit
    /// 0. A shutdown still running after kafka.shutdown_timeout_ms exits with
    /// status 3 without finishing the cycle (nothing of it is committed; the
    /// next start redoes it). Broker outages are retried with backoff; a
    /// fenced producer or a corrupt state store stops the process with exit
    /// status 1; a configuration error exits with status 2.
    Run(RunArgs),
    /// The front door between labelling tools and Kafka:
    /// POST /v1/votes (one vote, a JSON array or NDJSON; each checked and
    /// answered by index) and Label Studio webhooks (POST
    /// /hooks/label-studio) become votes on the first of kafka.input_topics,
    /// answered only after the broker acknowledged them (idempotent
    /// producer, acks=all). With label_studio.url set it also re-reads
    /// recently updated annotations every label_studio.sync_interval_seconds
    /// (a webhook Label Studio failed to deliver is not lost) and sends each
    /// ambiguity_flagged task back to Label Studio for more reviews. Listens
    /// on connect.listen with /metrics, /healthz and /readyz; stateless, so
    /// any number of instances can share one address. README: "With Label
    /// Studio".
    Connect(ConnectArgs),
    /// Publish a JSONL vote file to a Kafka topic, one message per non-blank
    /// line, keyed by inference_id when the line has one (backfills, demos).
    Produce(ProduceArgs),
    /// Print the committed messages of output topics (read_committed, from
    /// the beginning), one per line: a quick look at scores, flags and the DLQ.
    Consume(ConsumeArgs),
    /// Print the stored series of one inference (every rubric) as JSON.
    ///
    /// DIR is a replay --state-dir or a service's state.dir (every partition
    /// database under it is searched). Open it while no other process writes.
    Inspect(InspectArgs),
    /// Choose λ, window and the ambiguity threshold from your own votes.
    ///
    /// Replays the file once per (λ, window) of the grid with the engine of
    /// `replay` (in parallel; the file is decoded once) and judges how well
    /// each series' score before a batch predicts that batch's mean vote:
    /// mse, log loss and skill (1 − mse / mse of predicting with the
    /// previous batch's mean vote; higher is better), ranked by skill.
    /// For every (window, threshold) it counts the updates a threshold would
    /// flag and recommends the smallest threshold within the review budget.
    /// Bad lines are counted and skipped. Exit status 2 names a bad flag.
    Backtest(BacktestArgs),
    /// Do the reviewers agree? Krippendorff's α per rubric and each
    /// reviewer's deviation from the others, for a vote log.
    ///
    /// Replays the file with the engine of `replay` (every batch closed at
    /// the end). A unit is a scored batch with at least two counted votes
    /// (abstentions and superseded votes are not counted; reputation does
    /// not enter). alpha (interval metric): 1 = the reviewers agree, 0 = no
    /// better than chance, below 0 = systematic disagreement; null with
    /// fewer than two pairable votes or when every vote is the same.
    /// mean_sq_deviation: the mean, over a reviewer's votes in units, of
    /// (vote − mean of the unit's other votes)². Bad lines are skipped. A
    /// running service answers the same on GET /v1/rubrics and
    /// /v1/voters/{id}. Exit status 2 names a bad flag.
    Agreement(AgreementArgs),
    /// Whom to trust: each reviewer's learned weight per rubric (SPEC §14),
    /// for a vote log.
    ///
    /// Replays the file with the engine of `replay`, in any reputation.mode,
    /// and counts every epoch as sealed at the end. A unit is an item and
    /// rubric with at least two reviewers' values in an epoch (each
    /// reviewer's latest vote there; abstentions have none). rated_votes:
    /// values in units; mean_sq_deviation: the mean of (value − mean of the
    /// others' values)²; noise_variance: the rubric's pooled noise τ², or
    /// the reviewer's shrunk estimate; weight: what a batch of the next
    /// epoch would weigh the reviewer's votes by in mode learned (1 = as
    /// the rubric's typical reviewer, below 1 = noisier). A running service
    /// shows the group's weights on GET /v1/voters/{id}. Exit status 2
    /// names a bad flag or key.
    Reputation(ReputationArgs),
    /// Ask a running service's query API and print the answer as pretty JSON.
    ///
    /// Any instance of the group answers for every partition (it asks the
    /// instances in api.peers). Exit status 1 on an error answer (404 unknown
    /// inference, 503 while a partition restores, 401 wrong token), whose
    /// JSON goes to stderr.
    Query(QueryArgs),
}

#[derive(Args)]
struct ReplayArgs {
    /// Configuration file (TOML); keys not set keep their defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Votes, one JSON object per line.
    #[arg(
        long,
        value_name = "VOTES.jsonl",
        required_unless_present = "partition_files"
    )]
    input: Option<PathBuf>,
    /// Replay several files, each as its own input partition, with learned
    /// reputation tables over all of them (SPEC §14; what `run` gives each
    /// partition): the events of each file, file after file. Instead of
    /// --input; no --state-dir.
    #[arg(long, value_name = "VOTES.jsonl", num_args = 1.., conflicts_with_all = ["input", "state_dir", "keep_open"])]
    partition_files: Vec<PathBuf>,
    /// RocksDB state directory to continue from and save to.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Leave open batches open at the end of the file (to continue later).
    #[arg(long)]
    keep_open: bool,
    /// Serve /metrics, /healthz and /readyz on this address while replaying.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// With --metrics-listen: keep serving for this many seconds after the
    /// replay (so a scraper can read the final values).
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    metrics_linger: u64,
}

#[derive(Args)]
struct RunArgs {
    /// Configuration file (TOML); keys not set keep their defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormatArg>,
}

#[derive(Args)]
struct ConnectArgs {
    /// Configuration file (TOML); keys not set keep their defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormatArg>,
}

#[derive(Args)]
struct ProduceArgs {
    /// Votes, one JSON object per line.
    #[arg(long, value_name = "FILE")]
    input: PathBuf,
    /// Topic to publish to.
    #[arg(long, value_name = "TOPIC", default_value = "votes")]
    topic: String,
    /// Bootstrap servers.
    #[arg(long, value_name = "HOST:PORT", default_value = "localhost:9092")]
    brokers: String,
    /// Extra librdkafka properties, KEY=VALUE (repeatable).
    #[arg(long = "property", value_name = "KEY=VALUE")]
    properties: Vec<String>,
}

#[derive(Args)]
struct ConsumeArgs {
    /// Topics to read.
    #[arg(long = "topic", value_name = "TOPIC", default_values_t = ["jury.scores".to_string(), "jury.flags".to_string()])]
    topics: Vec<String>,
    /// Bootstrap servers.
    #[arg(long, value_name = "HOST:PORT", default_value = "localhost:9092")]
    brokers: String,
    /// Exit after this many seconds without a new message (default: never).
    #[arg(long, value_name = "SECONDS")]
    idle_exit: Option<f64>,
}

#[derive(Args)]
struct InspectArgs {
    /// State directory.
    #[arg(long, value_name = "DIR")]
    state_dir: PathBuf,
    /// The configuration the state was written with (its
    /// scoring.initial_score places each score's interval; default: the
    /// built-in defaults and JURYSTREAM_* overrides).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The inference id (integers in their decimal form).
    #[arg(long, value_name = "ID")]
    inference: String,
}

#[derive(Args)]
struct BacktestArgs {
    /// Configuration file (TOML); the grid varies λ and the window, the
    /// rest is used as given (a rubric's own lambda still wins).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Votes, one JSON object per line.
    #[arg(long, value_name = "VOTES.jsonl")]
    input: PathBuf,
    /// Decay constants to try, comma-separated (default: scoring.lambda).
    #[arg(long, value_name = "L1,L2,…", allow_hyphen_values = true)]
    lambda: Option<String>,
    /// Unit of the --lambda values (default: scoring.time_unit).
    #[arg(long, value_enum, value_name = "U")]
    time_unit: Option<TimeUnitArg>,
    /// Windows to try, comma-separated, in seconds or with s, m, h, d
    /// (default: batching.window_seconds).
    #[arg(long, value_name = "W1,W2,…", allow_hyphen_values = true)]
    window: Option<String>,
    /// Variance thresholds to count flags for, comma-separated
    /// (default: 0.01,0.02,0.03,0.05,0.075,0.1,0.125,0.15,0.2).
    #[arg(long, value_name = "T1,T2,…", allow_hyphen_values = true)]
    variance_threshold: Option<String>,
    /// Largest share of score updates reviewers can look at: the
    /// recommended threshold is the smallest whose flag rate is within it.
    #[arg(
        long,
        value_name = "B",
        default_value = "0.05",
        allow_hyphen_values = true
    )]
    review_budget: String,
    /// Step of event time for the metrics over time (e.g. 1d, 6h, 3600).
    #[arg(
        long,
        value_name = "D",
        default_value = "1d",
        allow_hyphen_values = true
    )]
    step: String,
    /// Output: a ranking for a terminal (table) or one JSON object (json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Table)]
    format: Format,
    /// Also write DIR/index.html: charts of skill and log loss against λ,
    /// batch variances with the thresholds, score trajectories of the
    /// most-voted series, skill per step.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
}

#[derive(Args)]
struct AgreementArgs {
    /// Configuration file (TOML), as for replay.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Votes, one JSON object per line.
    #[arg(long, value_name = "VOTES.jsonl")]
    input: PathBuf,
    /// Output: tables for a terminal (table) or one JSON object (json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Table)]
    format: Format,
}

#[derive(Args)]
struct ReputationArgs {
    /// Configuration file (TOML), as for replay; its [reputation] section
    /// sets the epochs, prior_votes, noise_floor and the weights' bounds.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Votes, one JSON object per line.
    #[arg(long, value_name = "VOTES.jsonl")]
    input: PathBuf,
    /// Output: tables for a terminal (table) or one JSON object (json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Table)]
    format: Format,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["inference", "leaderboard", "rubrics", "voter", "voters"])))]
struct QueryArgs {
    /// Base URL of an instance (its metrics.listen), e.g. http://127.0.0.1:9464.
    #[arg(long, value_name = "URL")]
    url: String,
    /// Print one inference's series (GET /v1/inferences/{id}).
    #[arg(long, value_name = "ID")]
    inference: Option<String>,
    /// Print the model leaderboard (GET /v1/leaderboard).
    #[arg(long)]
    leaderboard: bool,
    /// Print reviewer agreement per rubric: Krippendorff's α (GET /v1/rubrics).
    #[arg(long)]
    rubrics: bool,
    /// Print one reviewer's agreement numbers per rubric (GET /v1/voters/{id}).
    #[arg(long, value_name = "ID")]
    voter: Option<String>,
    /// Print the reviewers of --voter-prompt-id who deviate most from the
    /// others (GET /v1/voters?voter_prompt_id=R&order=deviation&limit=N).
    #[arg(long, value_name = "N", requires = "voter_prompt_id")]
    voters: Option<usize>,
    /// With --leaderboard: only this rubric; with --voters: the rubric.
    #[arg(long, value_name = "R", conflicts_with_all = ["inference", "rubrics", "voter"])]
    voter_prompt_id: Option<String>,
    /// Bearer token (the service's api.token).
    #[arg(long, env = "JURYSTREAM_API__TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// `--format` of the reporting commands.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Text for a terminal.
    Table,
    /// One JSON object.
    Json,
}

/// `--log-format`.
#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(f: LogFormatArg) -> LogFormat {
        match f {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

/// `backtest --time-unit`.
#[derive(Clone, Copy, ValueEnum)]
enum TimeUnitArg {
    Seconds,
    Minutes,
    Hours,
    Days,
}

impl TimeUnitArg {
    fn as_str(self) -> &'static str {
        match self {
            TimeUnitArg::Seconds => "seconds",
            TimeUnitArg::Minutes => "minutes",
            TimeUnitArg::Hours => "hours",
            TimeUnitArg::Days => "days",
        }
    }
}

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

/// How a command failed: a bad flag or configuration (exit status 2) or
/// a failure while running (exit status 1); the message is printed once,
/// by `main`.
enum Failure {
    Usage(String),
    Failed(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
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
    install_signal_handlers(timeout(&cfg))
        .map_err(|e| anyhow::anyhow!("cannot install the signal handlers: {e}"))?;
    Ok(cfg)
}

fn load_config(path: Option<&std::path::Path>) -> Result<Config, Failure> {
    Config::load(path).map_err(|e: ConfigError| Failure::Usage(e.to_string()))
}

fn run(a: RunArgs) -> Outcome {
    let cfg = start_service(a.config, a.log_format, |c| {
        Duration::from_millis(c.kafka.shutdown_timeout_ms as u64)
    })?;
    // Exit status 1 for every failure once the configuration loaded (a
    // broker without transactions, a state directory in use: operations.md).
    jurystream::service::run(cfg, &STOP)?;
    Ok(())
}

fn connect(a: ConnectArgs) -> Outcome {
    // The drain, then a request in progress waiting on the broker.
    let cfg = start_service(a.config, a.log_format, |c| {
        Duration::from_secs_f64(c.connect.drain_seconds)
            + Duration::from_millis(c.connect.produce_timeout_ms as u64)
            + Duration::from_secs(10)
    })?;
    match jurystream::connect::run(cfg, &STOP) {
        // The user's (an address, a property librdkafka rejects): exit
        // status 2, as a configuration error.
        Err(e) if e.fault() == Fault::Usage => Err(Failure::Usage(chain(&e))),
        r => Ok(r?),
    }
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
    let n = jurystream::produce::produce(&a.input, &a.topic, &a.brokers, &props)?;
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
    )?;
    Ok(())
}

fn replay(a: ReplayArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    let metrics = match a.metrics_listen {
        None => None,
        Some(addr) => {
            let m = jurystream::telemetry::Metrics::new(cfg.metrics.max_label_values as usize);
            jurystream::server::serve(addr, m.clone(), Default::default())
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
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
    result?;
    Ok(())
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
    match backtest::run_and_print(&cfg, &opts, a.format == Format::Json) {
        Err(backtest::BacktestError::Usage(u)) => Err(usage(u)),
        r => Ok(r?),
    }
}

fn agreement(a: AgreementArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    let (tally, summary) = jurystream::agreement::tally_file(&cfg, &a.input)?;
    match a.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string(&tally.report()).unwrap_or_default()
        ),
        Format::Table => print!("{}", jurystream::agreement::table(&tally)),
    }
    eprintln!(
        "jurystream: agreement: {} lines, {} rejected, {} rubrics, {} reviewer rows",
        summary.lines,
        summary.rejected,
        tally.rubrics.len(),
        tally.reviewers.len()
    );
    Ok(())
}

fn reputation(a: ReputationArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    cfg.check_epochs()
        .map_err(|e: ConfigError| Failure::Usage(e.to_string()))?;
    let (out, summary) = jurystream::reputation::report_file(&cfg, &a.input)?;
    match a.format {
        Format::Json => println!("{}", serde_json::to_string(&out).unwrap_or_default()),
        Format::Table => print!("{}", jurystream::reputation::table(&out)),
    }
    eprintln!(
        "jurystream: reputation: {} lines, {} rejected, {} rubrics, {} reviewer rows",
        summary.lines,
        summary.rejected,
        out.rubrics.len(),
        out.voters.len()
    );
    Ok(())
}

fn inspect(a: InspectArgs) -> Outcome {
    let cfg = load_config(a.config.as_deref())?;
    let initial_score = cfg.engine().initial_score;
    let v = jurystream::inspect::inspect(&a.state_dir, &a.inference, initial_score)?;
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
    let text = jurystream::api::http::query(&a.url, &path, a.token.as_deref())?;
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
