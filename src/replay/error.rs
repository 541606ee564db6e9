//! `replay`'s one error type (also that of `agreement`, and inside the
//! backtest's): whose fault a failure is and whether running the replay
//! again can help. A replay that fails is run again from the start of its
//! file (its `--state-dir` stays marked incomplete until then).
//!
//! The message names what failed; the cause (the I/O error) is its
//! [`source`](std::error::Error::source), which `main` prints after it.

use std::io;
use std::path::{Path, PathBuf};

pub use crate::error::{Classify, Fault, RetryHint};
use crate::state::StoreError;

/// A failure of a replay.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The input file cannot be opened (no such file, no permission): the
    /// user's path. Retrying does not help; fixing the path does.
    #[error("cannot open input {}", path.display())]
    OpenInput {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading the input failed after it opened: a disk or network file
    /// system error, retriable (the path is right, and a replay runs again
    /// from the start of its file); or the path is not a file that can be
    /// read (a directory), which retrying does not change. The input's.
    #[error("cannot read input{}", at(path))]
    ReadInput {
        /// `None` where the engine loop meets it (it reads chunks, not a
        /// file); [`ReplayError::at_input`] fills it in.
        path: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
    /// `--state-dir` cannot be created (no permission, a file in the way,
    /// a read-only file system): the state store's. Not retriable.
    #[error("cannot create state dir {}", path.display())]
    CreateStateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// No temporary state directory can be created under `parent` (the
    /// system's temporary directory, `TMPDIR`): the state store's. Not
    /// retriable until `TMPDIR` or the disk is fixed.
    #[error("cannot create a temporary state directory in {}", parent.display())]
    CreateTempDir {
        parent: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Writing the results failed: stdout closed (the reader of a pipe
    /// exited) or its disk is full. The output's; not retriable.
    #[error("cannot write to {to}")]
    Write {
        /// Where: "stdout", or "the output" (the engine loop's sink).
        to: &'static str,
        #[source]
        source: io::Error,
    },
    /// The state store failed (RocksDB, its directory, a corrupt record):
    /// the store's. Not retriable (a directory held by another process is
    /// free again once it exits).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A worker thread stopped before its work was done (the state store's
    /// reader or writer, which stop only when they panic): a bug. Not
    /// retriable.
    #[error("the {thread} thread stopped")]
    Stopped { thread: &'static str },
    /// A worker thread panicked (the event encoder): a bug. Not retriable.
    #[error("the {thread} thread panicked: {message}")]
    Panicked {
        thread: &'static str,
        message: String,
    },
    /// A thread cannot be started (the process is out of threads or
    /// memory): this process's. Retriable: the limit may be free later.
    #[error("cannot start the {thread} thread")]
    Spawn {
        thread: &'static str,
        #[source]
        source: io::Error,
    },
}

fn at(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map_or_else(String::new, |p| format!(" {}", p.display()))
}

impl Classify for ReplayError {
    fn fault(&self) -> Fault {
        match self {
            ReplayError::OpenInput { .. } | ReplayError::ReadInput { .. } => Fault::Input,
            ReplayError::CreateStateDir { .. }
            | ReplayError::CreateTempDir { .. }
            | ReplayError::Store(_) => Fault::Store,
            ReplayError::Write { .. } => Fault::Output,
            ReplayError::Stopped { .. }
            | ReplayError::Panicked { .. }
            | ReplayError::Spawn { .. } => Fault::Internal,
        }
    }

    /// Whether running the replay again (from the start of its file) can
    /// help as things are: see each variant.
    fn retry(&self) -> RetryHint {
        RetryHint::from_bool(match self {
            ReplayError::ReadInput { source, .. } => !matches!(
                source.kind(),
                io::ErrorKind::IsADirectory | io::ErrorKind::InvalidInput
            ),
            ReplayError::Spawn { .. } => true,
            _ => false,
        })
    }
}

impl ReplayError {
    /// Names `input` in a read error that does not name its file yet.
    pub(crate) fn at_input(self, input: &Path) -> Self {
        match self {
            ReplayError::ReadInput { path: None, source } => ReplayError::ReadInput {
                path: Some(input.to_owned()),
                source,
            },
            e => e,
        }
    }

    pub(crate) fn spawn(thread: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| ReplayError::Spawn { thread, source }
    }
}

/// A new temporary state directory (removed when dropped).
pub(super) fn temp_dir() -> Result<tempfile::TempDir, ReplayError> {
    tempfile::tempdir().map_err(|source| ReplayError::CreateTempDir {
        parent: std::env::temp_dir(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::chain;

    #[test]
    fn faults_and_retries() {
        let open = ReplayError::OpenInput {
            path: "/no/such/votes.jsonl".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(open.fault(), Fault::Input);
        assert!(!open.is_retriable());
        assert_eq!(open.to_string(), "cannot open input /no/such/votes.jsonl");
        assert!(chain(&open).starts_with("cannot open input /no/such/votes.jsonl: "));

        let read = ReplayError::ReadInput {
            path: None,
            source: io::Error::other("EIO"),
        };
        assert_eq!(read.to_string(), "cannot read input");
        let read = read.at_input(Path::new("v.jsonl"));
        assert_eq!(read.fault(), Fault::Input);
        assert!(read.is_retriable());
        assert_eq!(chain(&read), "cannot read input v.jsonl: EIO");

        let write = ReplayError::Write {
            to: "stdout",
            source: io::Error::from(io::ErrorKind::BrokenPipe),
        };
        assert_eq!(write.fault(), Fault::Output);
        assert!(!write.is_retriable());
        assert_eq!(write.to_string(), "cannot write to stdout");

        let dir = ReplayError::CreateStateDir {
            path: "/ro/state".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        assert_eq!(dir.fault(), Fault::Store);
        assert!(dir.to_string().contains("/ro/state"), "{dir}");

        let store: ReplayError = StoreError::Corrupt {
            path: "/s".into(),
            key: b"k".to_vec(),
            why: "truncated".into(),
        }
        .into();
        assert_eq!(store.fault(), Fault::Store);
        assert!(!store.is_retriable());
        assert!(
            store.to_string().contains("corrupt state record in /s"),
            "{store}"
        );

        let stopped = ReplayError::Stopped {
            thread: "state writer",
        };
        assert_eq!(stopped.fault(), Fault::Internal);
        assert!(!stopped.is_retriable());
        assert_eq!(stopped.to_string(), "the state writer thread stopped");

        let spawn =
            ReplayError::spawn("event encoder")(io::Error::from(io::ErrorKind::OutOfMemory));
        assert_eq!(spawn.fault(), Fault::Internal);
        assert!(spawn.is_retriable());
        assert_eq!(spawn.to_string(), "cannot start the event encoder thread");
    }
}
