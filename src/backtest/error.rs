//! `backtest`'s one error type: whose fault a failure is and whether
//! running the backtest again can help.

use std::io;
use std::path::PathBuf;

use super::UsageError;
use crate::config::ConfigError;
pub use crate::error::{Classify, Fault, RetryHint};
use crate::replay::ReplayError;

/// A failure of a backtest.
#[derive(Debug, thiserror::Error)]
pub enum BacktestError {
    /// A flag value that cannot be used, found while running (more steps
    /// of event time than `--step` allows): the user's, exit status 2.
    /// Not retriable; the message names the flag.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// A replay of the grid failed (its input, its temporary store, its
    /// threads): as [`ReplayError`] says.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The report's second pass cannot configure a point the grid
    /// accepted: a bug. Not retriable.
    #[error(transparent)]
    Config(ConfigError),
    /// `--report DIR` cannot be created (no permission, a file in the
    /// way): the output's. Not retriable.
    #[error("--report: cannot create {}", path.display())]
    ReportDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The report's `index.html` cannot be written (a full disk): the
    /// output's. Not retriable until there is room.
    #[error("cannot write {}", path.display())]
    ReportFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A chart of the report cannot be drawn (`plotters`, into a string):
    /// a bug. Not retriable.
    #[error("cannot draw the {chart} chart")]
    Plot {
        /// The chart's id (`report::CHARTS`).
        chart: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The results cannot be encoded as JSON (`--format json`): a bug.
    /// Not retriable.
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
    /// A backtest thread panicked: a bug. Not retriable.
    #[error("the {thread} thread panicked: {message}")]
    Panicked { thread: String, message: String },
    /// A backtest thread cannot be started (the process is out of threads
    /// or memory): this process's. Retriable: the limit may be free later,
    /// or with a smaller grid.
    #[error("cannot start the {thread} thread")]
    Spawn {
        thread: String,
        #[source]
        source: io::Error,
    },
}

impl Classify for BacktestError {
    fn fault(&self) -> Fault {
        match self {
            BacktestError::Usage(_) => Fault::Usage,
            BacktestError::Replay(e) => e.fault(),
            BacktestError::ReportDir { .. } | BacktestError::ReportFile { .. } => Fault::Output,
            BacktestError::Config(_)
            | BacktestError::Plot { .. }
            | BacktestError::Json(_)
            | BacktestError::Panicked { .. }
            | BacktestError::Spawn { .. } => Fault::Internal,
        }
    }

    /// Whether running the backtest again as it is can help: see each
    /// variant.
    fn retry(&self) -> RetryHint {
        match self {
            BacktestError::Replay(e) => e.retry(),
            BacktestError::Spawn { .. } => RetryHint::WithBackoff,
            _ => RetryHint::NoRetry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::chain;

    #[test]
    fn faults_and_retries() {
        let usage = BacktestError::from(UsageError("--step: more than 10 steps".into()));
        assert_eq!(usage.fault(), Fault::Usage);
        assert!(!usage.is_retriable());
        assert_eq!(usage.to_string(), "--step: more than 10 steps");

        let report = BacktestError::ReportDir {
            path: "/ro/report".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        assert_eq!(report.fault(), Fault::Output);
        assert!(!report.is_retriable());
        assert!(chain(&report).starts_with("--report: cannot create /ro/report: "));

        let file = BacktestError::ReportFile {
            path: "/r/index.html".into(),
            source: io::Error::from(io::ErrorKind::StorageFull),
        };
        assert_eq!(file.to_string(), "cannot write /r/index.html");

        let replay = BacktestError::from(ReplayError::OpenInput {
            path: "/no/votes.jsonl".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        });
        assert_eq!(replay.fault(), Fault::Input);
        assert!(!replay.is_retriable());
        assert_eq!(replay.to_string(), "cannot open input /no/votes.jsonl");

        let plot = BacktestError::Plot {
            chart: "trajectories",
            source: "bad layout".into(),
        };
        assert_eq!(plot.fault(), Fault::Internal);
        assert_eq!(
            chain(&plot),
            "cannot draw the trajectories chart: bad layout"
        );

        let spawn = BacktestError::Spawn {
            thread: "backtest-3".into(),
            source: io::Error::from(io::ErrorKind::OutOfMemory),
        };
        assert_eq!(spawn.fault(), Fault::Internal);
        assert!(spawn.is_retriable());
        assert_eq!(spawn.to_string(), "cannot start the backtest-3 thread");
    }
}
