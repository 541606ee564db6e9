//! `jurystream inspect`: the stored series of one inference, as JSON.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::state::{is_database, Store};
use crate::time::format_timestamp;

/// The partition databases under `dir`: `dir` itself when it is one (a
/// replay state dir), else every sub-directory that is one (a service's).
pub fn partition_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    if is_database(dir) {
        return Ok(vec![dir.to_owned()]);
    }
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read state dir {}", dir.display()))?;
    for e in entries {
        let p = e?.path();
        if is_database(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The JSON document `inspect` prints; `initial_score` is
/// `scoring.initial_score`, the part of a score its interval leaves out
/// (SPEC §13).
pub fn inspect(dir: &Path, inference_id: &str, initial_score: f64) -> Result<Value> {
    let dirs = partition_dirs(dir)?;
    if dirs.is_empty() {
        anyhow::bail!("no jurystream state under {}", dir.display());
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
