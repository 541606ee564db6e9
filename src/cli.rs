//! The command line: every subcommand, its arguments and their `--help`
//! (clap's derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use jurystream::config::LogFormat;

/// jurystream turns a stream of human votes on AI outputs into time-decayed
/// quality scores and ambiguity flags (GrandJury protocol), with RocksDB state
/// and exactly-once Kafka delivery.
#[derive(Parser)]
#[command(
    name = "jurystream",
    version,
    about,
    long_about = None,
    after_help = "Exit status, the same in every command: 0 done; 2 the user's to fix: a \
                  flag, the configuration (the message names the key), or a setting the \
                  environment refuses (an address in use, a property librdkafka rejects, a \
                  broker without transactions for exactly_once, a missing topic, a 4xx answer \
                  to `query`); 1 any other failure (the broker, the state store, a server, the \
                  input, an internal error); 3 `run` or `connect` stopped by a shutdown that \
                  ran past its deadline."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
    /// status 1; a configuration error, or a broker without the
    /// transactions exactly_once needs, exits with status 2.
    Run(ServiceArgs),
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
    Connect(ServiceArgs),
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
    Agreement(ReportArgs),
    /// Whom to trust: each reviewer's learned weight per rubric (contract §14),
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
    Reputation(ReportArgs),
    /// Ask a running service's query API and print the answer as pretty JSON.
    ///
    /// Any instance of the group answers for every partition (it asks the
    /// instances in api.peers). An error answer's JSON goes to stderr; the
    /// exit status is 2 for a 4xx (404 unknown inference, 401 wrong
    /// token) and 1 for a 5xx (503 while a partition restores).
    Query(QueryArgs),
}

#[derive(Args)]
pub struct ReplayArgs {
    /// Configuration file (TOML); keys not set keep their defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Votes, one JSON object per line.
    #[arg(
        long,
        value_name = "VOTES.jsonl",
        required_unless_present = "partition_files"
    )]
    pub input: Option<PathBuf>,
    /// Replay several files, each as its own input partition, with learned
    /// reputation tables over all of them (contract §14; what `run` gives each
    /// partition): the events of each file, file after file. Instead of
    /// --input; no --state-dir.
    #[arg(long, value_name = "VOTES.jsonl", num_args = 1.., conflicts_with_all = ["input", "state_dir", "keep_open"])]
    pub partition_files: Vec<PathBuf>,
    /// RocksDB state directory to continue from and save to.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Leave open batches open at the end of the file (to continue later).
    #[arg(long)]
    pub keep_open: bool,
    /// Serve /metrics, /healthz and /readyz on this address while replaying.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// With --metrics-listen: keep serving for this many seconds after the
    /// replay (so a scraper can read the final values).
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub metrics_linger: u64,
}

/// The arguments of the long-running commands (`run`, `connect`).
#[derive(Args)]
pub struct ServiceArgs {
    /// Configuration file (TOML); keys not set keep their defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormatArg>,
}

#[derive(Args)]
pub struct ProduceArgs {
    /// Votes, one JSON object per line.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// Topic to publish to.
    #[arg(long, value_name = "TOPIC", default_value = "votes")]
    pub topic: String,
    /// Bootstrap servers.
    #[arg(long, value_name = "HOST:PORT", default_value = "localhost:9092")]
    pub brokers: String,
    /// Extra librdkafka properties, KEY=VALUE (repeatable).
    #[arg(long = "property", value_name = "KEY=VALUE")]
    pub properties: Vec<String>,
}

#[derive(Args)]
pub struct ConsumeArgs {
    /// Topics to read.
    #[arg(long = "topic", value_name = "TOPIC", default_values_t = ["jury.scores".to_string(), "jury.flags".to_string()])]
    pub topics: Vec<String>,
    /// Bootstrap servers.
    #[arg(long, value_name = "HOST:PORT", default_value = "localhost:9092")]
    pub brokers: String,
    /// Exit after this many seconds without a new message (default: never).
    #[arg(long, value_name = "SECONDS")]
    pub idle_exit: Option<f64>,
}

#[derive(Args)]
pub struct InspectArgs {
    /// State directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The configuration the state was written with (its
    /// scoring.initial_score places each score's interval; default: the
    /// built-in defaults and JURYSTREAM_* overrides).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The inference id (integers in their decimal form).
    #[arg(long, value_name = "ID")]
    pub inference: String,
}

#[derive(Args)]
pub struct BacktestArgs {
    /// Configuration file (TOML); the grid varies λ and the window, the
    /// rest is used as given (a rubric's own lambda still wins).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Votes, one JSON object per line.
    #[arg(long, value_name = "VOTES.jsonl")]
    pub input: PathBuf,
    /// Decay constants to try, comma-separated (default: scoring.lambda).
    #[arg(long, value_name = "L1,L2,…", allow_hyphen_values = true)]
    pub lambda: Option<String>,
    /// Unit of the --lambda values (default: scoring.time_unit).
    #[arg(long, value_enum, value_name = "U")]
    pub time_unit: Option<TimeUnitArg>,
    /// Windows to try, comma-separated, in seconds or with s, m, h, d
    /// (default: batching.window_seconds).
    #[arg(long, value_name = "W1,W2,…", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Variance thresholds to count flags for, comma-separated
    /// (default: 0.01,0.02,0.03,0.05,0.075,0.1,0.125,0.15,0.2).
    #[arg(long, value_name = "T1,T2,…", allow_hyphen_values = true)]
    pub variance_threshold: Option<String>,
    /// Largest share of score updates reviewers can look at: the
    /// recommended threshold is the smallest whose flag rate is within it.
    #[arg(
        long,
        value_name = "B",
        default_value = "0.05",
        allow_hyphen_values = true
    )]
    pub review_budget: String,
    /// Step of event time for the metrics over time (e.g. 1d, 6h, 3600).
    #[arg(
        long,
        value_name = "D",
        default_value = "1d",
        allow_hyphen_values = true
    )]
    pub step: String,
    /// Output: a ranking for a terminal (table) or one JSON object (json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Table)]
    pub format: Format,
    /// Also write DIR/index.html: charts of skill and log loss against λ,
    /// batch variances with the thresholds, score trajectories of the
    /// most-voted series, skill per step.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
}

#[derive(Args)]
pub struct ReportArgs {
    /// Configuration file (TOML), as for replay; for `reputation`, its
    /// [reputation] section sets the epochs, prior_votes, noise_floor and
    /// the weights' bounds.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Votes, one JSON object per line.
    #[arg(long, value_name = "VOTES.jsonl")]
    pub input: PathBuf,
    /// Output: tables for a terminal (table) or one JSON object (json).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["inference", "leaderboard", "rubrics", "voter", "voters"])))]
pub struct QueryArgs {
    /// Base URL of an instance (its metrics.listen), e.g. http://127.0.0.1:9464.
    #[arg(long, value_name = "URL")]
    pub url: String,
    /// Print one inference's series (GET /v1/inferences/{id}).
    #[arg(long, value_name = "ID")]
    pub inference: Option<String>,
    /// Print the model leaderboard (GET /v1/leaderboard).
    #[arg(long)]
    pub leaderboard: bool,
    /// Print reviewer agreement per rubric: Krippendorff's α (GET /v1/rubrics).
    #[arg(long)]
    pub rubrics: bool,
    /// Print one reviewer's agreement numbers per rubric (GET /v1/voters/{id}).
    #[arg(long, value_name = "ID")]
    pub voter: Option<String>,
    /// Print the reviewers of --voter-prompt-id who deviate most from the
    /// others (GET /v1/voters?voter_prompt_id=R&order=deviation&limit=N).
    #[arg(long, value_name = "N", requires = "voter_prompt_id")]
    pub voters: Option<usize>,
    /// With --leaderboard: only this rubric; with --voters: the rubric.
    #[arg(long, value_name = "R", conflicts_with_all = ["inference", "rubrics", "voter"])]
    pub voter_prompt_id: Option<String>,
    /// Bearer token (the service's api.token).
    #[arg(long, env = "JURYSTREAM_API__TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// `--format` of the reporting commands.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Text for a terminal.
    Table,
    /// One JSON object.
    Json,
}

/// `--log-format`.
#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
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
pub enum TimeUnitArg {
    Seconds,
    Minutes,
    Hours,
    Days,
}

impl TimeUnitArg {
    pub fn as_str(self) -> &'static str {
        match self {
            TimeUnitArg::Seconds => "seconds",
            TimeUnitArg::Minutes => "minutes",
            TimeUnitArg::Hours => "hours",
            TimeUnitArg::Days => "days",
        }
    }
}
