//! `jurystream replay`: a JSONL file as one partition → the engine → stdout.

use std::borrow::Borrow;
use std::io::{BufReader, IsTerminal, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::engine::reputation::{Epoch, Terms, TermsKey};
use crate::engine::{Engine, Outcome, ScoreUpdate};
use crate::input::{DecodeOptions, Rejection};
use crate::state::Store;

mod chunks;
mod encode;
mod error;
mod shell;

use chunks::read_chunks;
pub(crate) use chunks::Chunk;
use encode::encode_events;
pub use error::{Fault, ReplayError};
use shell::{Shell, Workers};

type Result<T, E = ReplayError> = std::result::Result<T, E>;

/// Options of one replay run.
pub struct ReplayOptions<'a> {
    pub input: &'a Path,
    pub state_dir: Option<&'a Path>,
    pub keep_open: bool,
    /// Metrics to keep up to date (served by `--metrics-listen`).
    pub metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>,
    /// `--partition-files` (contract §14): this file is one partition of
    /// several, scored with tables over every partition's sealed deltas
    /// (all of these), never waiting.
    pub shared: Option<&'a [(TermsKey, Terms)]>,
}

/// What a replay did (also printed on stderr at the end).
#[derive(Debug, Default, Clone, Copy)]
pub struct ReplaySummary {
    pub lines: u64,
    pub rejected: u64,
    pub events: u64,
}

/// Where the engine loop hands what it produces: replay writes events,
/// the backtest judges score updates.
pub(crate) trait Sink {
    /// The score updates of one vote (or of the end-of-input close).
    fn updates(&mut self, updates: &mut Vec<ScoreUpdate>) -> std::io::Result<()>;
    /// A rejected line (bad input or a late vote).
    fn rejected(&mut self, r: &Rejection, bytes: &[u8], line: u64) -> std::io::Result<()>;
    /// After each chunk of lines.
    fn chunk_done(&mut self, _engine: &Engine) {}
}

/// Progress on stderr, only when it is a terminal.
pub(crate) struct Progress {
    what: &'static str,
    enabled: bool,
    started: Instant,
    last: Instant,
    total_bytes: u64,
}

impl Progress {
    pub(crate) fn new(what: &'static str, total_bytes: u64) -> Self {
        let now = Instant::now();
        Progress {
            what,
            enabled: std::io::stderr().is_terminal(),
            started: now,
            last: now,
            total_bytes,
        }
    }

    pub(crate) fn update(&mut self, lines: u64, bytes: u64, votes: u64) {
        if !self.enabled || self.last.elapsed() < Duration::from_millis(500) {
            return;
        }
        self.last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let pct = if self.total_bytes > 0 {
            100.0 * bytes as f64 / self.total_bytes as f64
        } else {
            100.0
        };
        eprint!(
            "\r{}: {lines} lines ({pct:.1}%), {votes} votes, {:.0} lines/s   ",
            self.what,
            lines as f64 / secs
        );
    }

    pub(crate) fn finish(&self) {
        if self.enabled {
            eprintln!();
        }
    }
}

/// Runs one replay, printing events on `out`.
pub fn run(
    cfg: &Config,
    opts: &ReplayOptions<'_>,
    out: impl Write + Send,
) -> Result<ReplaySummary> {
    let file = open_input(opts.input)?;
    let total_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let tmp;
    let dir = match opts.state_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|source| ReplayError::CreateStateDir {
                path: d.to_owned(),
                source,
            })?;
            d.to_owned()
        }
        None => {
            tmp = error::temp_dir()?;
            tmp.path().to_owned()
        }
    };
    let store = match opts.state_dir {
        Some(_) => Store::open(&dir)?,
        None => Store::open_temporary(&dir)?,
    };
    let (mut engine, stats) = store.load(cfg.engine())?;
    if let Some(deltas) = opts.shared {
        engine.share_tables();
        for ((rubric, epoch, voter), t) in deltas {
            engine.add_delta(rubric, *epoch, voter, t);
        }
        // Every other partition's input has ended: every epoch is sealed.
        engine.set_group_sealed(Some(Epoch::MAX), &mut Vec::new());
    }
    if opts.state_dir.is_some() && !engine.is_complete() {
        tracing::info!(
            open_batches = stats.batches,
            series = stats.series,
            watermark = ?engine.watermark().map(crate::time::format_timestamp),
            "continuing the partition state in {}",
            dir.display()
        );
    }
    let persist = opts.state_dir.is_some();
    if persist {
        store.begin_bulk()?;
    }
    let decode = cfg.decode_options();
    if let Some(m) = &opts.metrics {
        m.set_ready(true);
    }
    std::thread::scope(|scope| {
        let (mut sink, batches) = encode::channel(opts.metrics.clone());
        let metrics = opts.metrics.clone();
        let encoder = std::thread::Builder::new()
            .name("event-encoder".into())
            .spawn_scoped(scope, move || encode_events(batches, out, metrics))
            .map_err(ReplayError::spawn("event encoder"))?;
        let result = (|| -> Result<ReplaySummary> {
            let mut shell = Shell::new(&mut engine, &store, cfg.cache_bytes(), persist);
            let summary = process_lines(
                BufReader::with_capacity(1 << 20, file),
                &decode,
                &mut shell,
                &mut sink,
                total_bytes,
            )
            .map_err(|e| e.at_input(opts.input))?;
            tracing::debug!(
                load_ms = shell.load_time().as_millis() as u64,
                wait_ms = shell.wait_time().as_millis() as u64,
                keys_read = shell.keys_read(),
                "replay: time waiting for the state store (reads; its writer thread), keys read"
            );
            let mut updates = Vec::new();
            if !opts.keep_open {
                engine.close_all(&mut updates);
                checked(&mut engine, &store)?;
                sink.updates(&mut updates).map_err(to_output)?;
            }
            // Written in bounded batches whenever the cache fills, and the
            // rest at the end (a replay that fails is re-run from the start
            // of its file: until then the directory is marked incomplete).
            // A temporary state is written only to make room in the cache.
            if persist {
                store.finish_bulk(&mut engine)?;
            }
            if let Some(m) = &opts.metrics {
                m.observe_engine("0", &engine);
            }
            sink.send().map_err(to_output)?;
            Ok(summary)
        })();
        // Dropped on an error too, so that the encoder finishes.
        drop(sink);
        let written = join_thread("event encoder", encoder)?;
        match (result, written) {
            // The engine loop's error is then most likely that the encoder
            // stopped: the write error is the cause.
            (_, Err(source)) => Err(ReplayError::Write {
                to: "stdout",
                source,
            }),
            (Err(e), Ok(_)) => Err(e),
            (Ok(summary), Ok(events)) => Ok(ReplaySummary { events, ..summary }),
        }
    })
}

/// Opens the input file.
pub(crate) fn open_input(path: &Path) -> Result<std::fs::File> {
    std::fs::File::open(path).map_err(|source| ReplayError::OpenInput {
        path: path.to_owned(),
        source,
    })
}

/// A sink's write error (the engine loop's output).
fn to_output(source: std::io::Error) -> ReplayError {
    ReplayError::Write {
        to: "the output",
        source,
    }
}

/// Waits for a thread of a scope: its panic is an error (the scope would
/// panic on it otherwise).
pub(crate) fn join_thread<T>(
    thread: &'static str,
    handle: std::thread::ScopedJoinHandle<'_, T>,
) -> Result<T> {
    handle.join().map_err(|panic| ReplayError::Panicked {
        thread,
        message: crate::error::panic_message(&*panic),
    })
}

/// The thread that reads and decodes the input ([`spawn_reader`]).
pub(crate) const INPUT_READER: &str = "input reader";

/// Starts [`read_chunks`] of `reader` on its own thread of `scope`. Once
/// the receiver of `tx` is dropped, the thread stops at its next chunk;
/// [`join_thread`] it then (if it panicked, the chunks just ended early).
pub(crate) fn spawn_reader<'scope, R: Read + Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    reader: BufReader<R>,
    decode: &'scope DecodeOptions,
    tx: std::sync::mpsc::SyncSender<std::io::Result<Chunk>>,
) -> Result<std::thread::ScopedJoinHandle<'scope, ()>> {
    std::thread::Builder::new()
        .name("input-reader".into())
        .spawn_scoped(scope, move || read_chunks(reader, decode, tx))
        .map_err(ReplayError::spawn(INPUT_READER))
}

/// Decodes `reader` on its own thread and runs it through the shell.
fn process_lines<R: Read + Send, K: Sink>(
    reader: BufReader<R>,
    decode: &DecodeOptions,
    shell: &mut Shell<'_>,
    sink: &mut K,
    total_bytes: u64,
) -> Result<ReplaySummary> {
    let mut progress = Progress::new("replay", total_bytes);
    let summary = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Chunk>>(8);
        let reader = spawn_reader(scope, reader, decode, tx)?;
        let result = drive(rx.into_iter(), shell, sink, Some(&mut progress));
        join_thread(INPUT_READER, reader)?;
        result
    })?;
    progress.finish();
    Ok(summary)
}

/// The engine loop: each chunk's series and identities loaded (the next
/// chunk's prefetched meanwhile), its lines processed in order into
/// `sink`, then the cache kept within budget. Chunks may be shared
/// (the backtest hands one decoded chunk to every grid point).
fn drive<C: Borrow<Chunk>, K: Sink>(
    chunks: impl Iterator<Item = std::io::Result<C>>,
    shell: &mut Shell<'_>,
    sink: &mut K,
    progress: Option<&mut Progress>,
) -> Result<ReplaySummary> {
    let mut summary = ReplaySummary::default();
    std::thread::scope(|scope| -> Result<()> {
        let mut workers = Workers::start(scope, shell.store)?;
        let result = drive_chunks(chunks, shell, &mut workers, sink, progress, &mut summary);
        // A worker that panicked is the cause of the error it made here.
        workers.join()?;
        result
    })?;
    Ok(summary)
}

/// [`drive`]'s loop, with the store's worker threads running.
fn drive_chunks<C: Borrow<Chunk>, K: Sink>(
    mut chunks: impl Iterator<Item = std::io::Result<C>>,
    shell: &mut Shell<'_>,
    workers: &mut Workers<'_>,
    sink: &mut K,
    mut progress: Option<&mut Progress>,
    summary: &mut ReplaySummary,
) -> Result<()> {
    let mut updates = Vec::new();
    let mut wants = Vec::new();
    let mut next = chunks.next();
    while let Some(chunk) = next {
        let chunk = chunk.map_err(|source| ReplayError::ReadInput { path: None, source })?;
        let chunk: &Chunk = chunk.borrow();
        shell.load(workers, chunk, &mut wants)?;
        next = chunks.next();
        if let Some(Ok(following)) = &next {
            shell.prefetch(workers, following.borrow())?;
        }
        let engine = &mut *shell.engine;
        let lines = chunk.lines.iter().zip(&chunk.decoded);
        for ((&(a, b, line_no), decoded), &identity) in lines.zip(&chunk.identities) {
            let line = &chunk.buf[a..b];
            summary.lines = line_no;
            match decoded {
                Err(r) => {
                    summary.rejected += 1;
                    sink.rejected(r, line, line_no).map_err(to_output)?;
                }
                Ok(vote) => match engine.process_with_identity(vote, identity, &mut updates) {
                    Outcome::Accepted => sink.updates(&mut updates).map_err(to_output)?,
                    Outcome::Duplicate => {}
                    Outcome::Late(r) => {
                        summary.rejected += 1;
                        sink.rejected(&r, line, line_no).map_err(to_output)?;
                    }
                },
            }
        }
        if let Some(p) = progress.as_deref_mut() {
            p.update(summary.lines, chunk.bytes, engine.counters.accepted);
        }
        checked(engine, shell.store)?;
        sink.chunk_done(engine);
        shell.make_room(workers)?;
    }
    shell.finish_write(workers, true).map(|_| ())
}

/// Runs `chunks` through a fresh engine for `cfg` on a temporary store
/// (cache `budget` bytes), closes every batch at the end, and hands the
/// score updates and rejections to `sink`: a replay without `--state-dir`
/// that prints nothing.
pub(crate) fn run_detached<C: Borrow<Chunk>, K: Sink>(
    cfg: &Config,
    budget: usize,
    chunks: impl Iterator<Item = std::io::Result<C>>,
    sink: &mut K,
) -> Result<ReplaySummary> {
    run_detached_then(cfg, budget, chunks, sink, |_| (), |_| ()).map(|(summary, ())| summary)
}

/// [`run_detached`] on an engine `prepare` has seen first, then `then`
/// on it (its batches closed).
pub(crate) fn run_detached_then<C: Borrow<Chunk>, K: Sink, T>(
    cfg: &Config,
    budget: usize,
    chunks: impl Iterator<Item = std::io::Result<C>>,
    sink: &mut K,
    prepare: impl FnOnce(&mut Engine),
    then: impl FnOnce(&mut Engine) -> T,
) -> Result<(ReplaySummary, T)> {
    let tmp = error::temp_dir()?;
    let store = Store::open_temporary(tmp.path())?;
    let (mut engine, _) = store.load(cfg.engine())?;
    prepare(&mut engine);
    let mut shell = Shell::new(&mut engine, &store, budget, false);
    let summary = drive(chunks, &mut shell, sink, None)?;
    let mut updates = Vec::new();
    engine.close_all(&mut updates);
    checked(&mut engine, &store)?;
    sink.updates(&mut updates).map_err(to_output)?;
    Ok((summary, then(&mut engine)))
}

/// Replays the file `input` on a fresh engine for `cfg` (a temporary
/// store, every batch closed at the end) into `sink`, with progress on
/// stderr as `what`: [`run_detached_then`] of its decoded chunks.
pub(crate) fn run_file_detached<K: Sink, T>(
    cfg: &Config,
    input: &Path,
    what: &'static str,
    sink: &mut K,
    prepare: impl FnOnce(&mut Engine),
    then: impl FnOnce(&mut Engine) -> T,
) -> Result<(ReplaySummary, T)> {
    let file = open_input(input)?;
    let total_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let decode = cfg.decode_options();
    let mut progress = Progress::new(what, total_bytes);
    let out = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Chunk>>(8);
        let reader = spawn_reader(scope, BufReader::with_capacity(1 << 20, file), &decode, tx)?;
        let mut votes = 0u64;
        let chunks = rx.into_iter().inspect(|c| {
            if let Ok(c) = c {
                votes += c.decoded.iter().filter(|d| d.is_ok()).count() as u64;
                progress.update(c.lines.last().map_or(0, |l| l.2), c.bytes, votes);
            }
        });
        let result = run_detached_then(cfg, cfg.cache_bytes(), chunks, sink, prepare, then);
        join_thread(INPUT_READER, reader)?;
        result
    })
    .map_err(|e| e.at_input(input))?;
    progress.finish();
    Ok(out)
}

/// An inconsistency the engine met (`Engine::take_inconsistency`) stops
/// the replay with a fatal store error naming the series.
fn checked(engine: &mut Engine, store: &Store) -> Result<()> {
    match engine.take_inconsistency() {
        Some(i) => Err(store.inconsistent(i).into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Classify;

    /// A writer that fails once it has taken `room` bytes.
    struct Full {
        room: usize,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if buf.len() > self.room {
                return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
            }
            self.room -= buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn input(dir: &Path, votes: usize) -> std::path::PathBuf {
        let mut text = String::new();
        for i in 0..votes {
            text.push_str(&format!(
                "{{\"inference_id\":\"i{}\",\"voter_id\":\"v{i}\",\"voter_prompt_id\":\"r\",\
                 \"vote\":1.0,\"timestamp\":\"2024-01-01T00:{:02}:{:02}Z\"}}\n",
                i / 3,
                i / 60 % 60,
                i % 60
            ));
            if i % 100 == 0 {
                text.push_str("not json\n");
            }
        }
        let path = dir.join("votes.jsonl");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn options(input: &Path) -> ReplayOptions<'_> {
        ReplayOptions {
            input,
            state_dir: None,
            keep_open: false,
            metrics: None,
            shared: None,
        }
    }

    #[test]
    fn the_encoder_writes_every_event_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = input(dir.path(), 3000);
        let cfg = Config::from_layers(None, &[]).unwrap();
        let mut out = Vec::new();
        let summary = run(&cfg, &options(&path), &mut out).unwrap();
        let lines: Vec<&str> = std::str::from_utf8(&out).unwrap().lines().collect();
        assert_eq!(summary.events, lines.len() as u64);
        assert_eq!(summary.rejected, 30);
        // Rejections come in input order, between the vote events.
        let rejected: Vec<u64> = lines
            .iter()
            .filter(|l| l.contains("\"vote_rejected\""))
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["source"]["line"].as_u64().unwrap()
            })
            .collect();
        assert_eq!(rejected, (0..30).map(|k| k * 101 + 2).collect::<Vec<_>>());
        assert!(
            lines
                .iter()
                .filter(|l| l.contains("\"score_updated\""))
                .count()
                >= 1000
        );
    }

    #[test]
    fn a_write_error_stops_the_replay_with_that_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = input(dir.path(), 30_000);
        let cfg = Config::from_layers(None, &[]).unwrap();
        let err = run(&cfg, &options(&path), Full { room: 4096 }).unwrap_err();
        assert_eq!(err.fault(), Fault::Output);
        let text = crate::error::chain(&err);
        assert!(text.contains("cannot write to stdout"), "{text}");
        assert!(text.contains("roken pipe"), "{text}");
    }

    /// A writer that panics.
    struct OnFire;

    impl Write for OnFire {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            panic!("the disk is on fire")
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_panicking_thread_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = input(dir.path(), 30_000);
        let cfg = Config::from_layers(None, &[]).unwrap();
        let err = run(&cfg, &options(&path), OnFire).unwrap_err();
        assert!(matches!(err, ReplayError::Panicked { .. }), "{err:?}");
        assert_eq!(err.fault(), Fault::Internal);
        assert!(!err.is_retriable());
        assert_eq!(
            err.to_string(),
            "the event encoder thread panicked: the disk is on fire"
        );
    }

    #[test]
    fn a_missing_input_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nothing.jsonl");
        let cfg = Config::from_layers(None, &[]).unwrap();
        let err = run(&cfg, &options(&path), Vec::new()).unwrap_err();
        assert_eq!(err.fault(), Fault::Input);
        assert_eq!(
            err.to_string(),
            format!("cannot open input {}", path.display())
        );
    }
}
