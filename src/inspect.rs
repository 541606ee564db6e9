//! `jurystream inspect`: the stored series of one inference, as JSON.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

pub use crate::error::{Classify, Fault, RetryHint};
use crate::state::{is_database, Store, StoreError};
use crate::time::format_timestamp;

/// A failure of `inspect`.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The directory holds no partition database: a wrong `--state-dir`
    /// (the user's). Not retriable.
    #[error("no jurystream state under {}", dir.display())]
    NoState { dir: PathBuf },
    /// The directory cannot be listed (it does not exist, no permission):
    /// the user's path. Not retriable.
    #[error("cannot read state dir {}", dir.display())]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A partition database cannot be opened or read (RocksDB, a corrupt
    /// record): the state store's. Not retriable.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for InspectError {
    fn fault(&self) -> Fault {
        match self {
            InspectError::NoState { .. } | InspectError::ReadDir { .. } => Fault::Input,
            InspectError::Store(_) => Fault::Store,
        }
    }

    /// Whether running `inspect` again as it is can help: never (each
    /// variant needs the directory or the store fixed).
    fn retry(&self) -> RetryHint {
        RetryHint::NoRetry
    }
}

type Result<T, E = InspectError> = std::result::Result<T, E>;

/// The partition databases under `dir`: `dir` itself when it is one (a
/// replay state dir), else every sub-directory that is one (a service's).
pub fn partition_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    if is_database(dir) {
        return Ok(vec![dir.to_owned()]);
    }
    let mut out = Vec::new();
    let unreadable = |source| InspectError::ReadDir {
        dir: dir.to_owned(),
        source,
    };
    for e in std::fs::read_dir(dir).map_err(unreadable)? {
        let p = e.map_err(unreadable)?.path();
        if is_database(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The JSON document `inspect` prints; `initial_score` is
/// `scoring.initial_score`, the part of a score its interval leaves out
/// (contract §13).
pub fn inspect(dir: &Path, inference_id: &str, initial_score: f64) -> Result<Value> {
    let dirs = partition_dirs(dir)?;
    if dirs.is_empty() {
        return Err(InspectError::NoState {
            dir: dir.to_owned(),
        });
    }
    let mut series = Vec::new();
    let mut open = Vec::new();
    for d in &dirs {
        let store = Store::open_read_only(d)?;
        let partition = d.file_name().map(|n| n.to_string_lossy().into_owned());
        for (k, s) in store.series_of(inference_id)? {
            series.push(json!({
                "partition": partition,
                "inference_id": &*k.inference_id,
                "voter_prompt_id": &*k.voter_prompt_id,
                "model_id": s.model_id.as_deref(),
                "score": s.score,
                "update_seq": s.update_seq,
                "last_vote_at": s.last_vote_at.map(format_timestamp),
                "votes": s.votes,
                "abstentions": s.abstentions,
                "ambiguous": s.ambiguous,
                "effective_votes": s.evidence.effective_votes(),
                "score_interval": s.evidence.interval(s.score, initial_score),
            }));
        }
        for (k, b) in store.batches_of(inference_id)? {
            open.push(json!({
                "partition": partition,
                "voter_prompt_id": &*k.series.voter_prompt_id,
                "window_start": format_timestamp(k.window_start),
                "entries": b.entries.len(),
                "counted": b.counted,
            }));
        }
    }
    Ok(json!({
        "inference_id": inference_id,
        "series": series,
        "open_batches": open,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_missing_directory_is_the_users_fault_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = inspect(dir.path(), "i", 0.5).unwrap_err();
        assert!(matches!(err, InspectError::NoState { .. }), "{err:?}");
        assert_eq!(err.fault(), Fault::Input);
        assert!(!err.is_retriable());
        assert_eq!(
            err.to_string(),
            format!("no jurystream state under {}", dir.path().display())
        );

        let missing = dir.path().join("nothing");
        let err = inspect(&missing, "i", 0.5).unwrap_err();
        assert!(matches!(err, InspectError::ReadDir { .. }), "{err:?}");
        assert_eq!(err.fault(), Fault::Input);
        assert!(
            crate::error::chain(&err)
                .starts_with(&format!("cannot read state dir {}: ", missing.display())),
            "{err}"
        );
    }

    #[test]
    fn store_errors_are_the_stores() {
        let err: InspectError = StoreError::Corrupt {
            path: "/s/0".into(),
            key: b"s".to_vec(),
            why: "truncated".into(),
        }
        .into();
        assert_eq!(err.fault(), Fault::Store);
        assert!(!err.is_retriable());
        assert!(err.to_string().contains("/s/0"), "{err}");
    }
}
