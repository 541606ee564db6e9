//! `jurystream replay`: a JSONL file as one partition → the engine → stdout.

use std::borrow::Borrow;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::config::Config;
use crate::engine::{vote_identity, Engine, Outcome, ScoreUpdate, Wants};
use crate::input::{decode_vote, DecodeOptions, Rejection, Vote};
use crate::state::{BulkWrite, Loaded, Store, StoreError};

mod encode;

use encode::encode_events;

/// Pending changes (series, batches, identities) above which the engine's
/// change list is pruned of batches that closed unwritten. The rest of it
/// is bounded by the cache (dirty entries count against it) and the open
/// batches: the state is written only when the cache is full, or at the end.
const PRUNE_AT: usize = 200_000;

/// Options of one replay run.
pub struct ReplayOptions<'a> {
    pub input: &'a Path,
    pub state_dir: Option<&'a Path>,
    pub keep_open: bool,
    /// Metrics to keep up to date (served by `--metrics-listen`).
    pub metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>,
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
    let file = std::fs::File::open(opts.input)
        .with_context(|| format!("cannot open input {}", opts.input.display()))?;
    let total_bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    let tmp;
    let dir = match opts.state_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create state dir {}", d.display()))?;
            d.to_owned()
        }
        None => {
            tmp = tempfile::tempdir().context("cannot create a temporary state directory")?;
            tmp.path().to_owned()
        }
    };
    let store = match opts.state_dir {
        Some(_) => Store::open(&dir)?,
        None => Store::open_temporary(&dir)?,
    };
    let (mut engine, stats) = store.load(cfg.engine())?;
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
        let encoder = scope.spawn(move || encode_events(batches, out, metrics));
        let result = (|| -> Result<ReplaySummary> {
            let mut shell = Shell {
                engine: &mut engine,
                store: &store,
                budget: cfg.cache_bytes(),
                persist,
                evictions: 0,
                load_time: Duration::ZERO,
                wait_time: Duration::ZERO,
                keys_read: 0,
            };
            let summary = process_lines(
                BufReader::with_capacity(1 << 20, file),
                &decode,
                &mut shell,
                &mut sink,
                total_bytes,
            )?;
            tracing::debug!(
                load_ms = shell.load_time.as_millis() as u64,
                wait_ms = shell.wait_time.as_millis() as u64,
                keys_read = shell.keys_read,
                "replay: time waiting for the state store (reads; its writer thread), keys read"
            );
            let mut updates = Vec::new();
            if !opts.keep_open {
                engine.close_all(&mut updates);
                sink.updates(&mut updates)?;
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
            sink.send()?;
            Ok(summary)
        })();
        // Dropped on an error too, so that the encoder finishes.
        drop(sink);
        let written = encoder
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match (result, written) {
            // The engine loop's error is then most likely that the encoder
            // stopped: the write error is the cause.
            (_, Err(e)) => Err(anyhow::Error::new(e).context("cannot write to stdout")),
            (Err(e), Ok(_)) => Err(e),
            (Ok(summary), Ok(events)) => Ok(ReplaySummary { events, ..summary }),
        }
    })
}

/// A run of input lines, read and decoded off the engine's thread.
///
/// Dropped, it goes back to the reader that filled it, to be filled again:
/// the engine thread then neither frees its buffers (freeing one that
/// large made glibc consolidate its heap, on the thread the replay waits
/// for) nor the decoded votes (freed by the reader, which allocated them).
pub(crate) struct Chunk {
    buf: Vec<u8>,
    /// (start, end, line number) of each non-blank line in `buf`.
    pub(crate) lines: Vec<(usize, usize, u64)>,
    pub(crate) decoded: Vec<Result<Vote, Rejection>>,
    /// Each decoded vote's identity (`engine::vote_identity`, hashed here
    /// rather than on the engine's thread; 0 for a rejected line).
    identities: Vec<u128>,
    /// Input bytes consumed up to the end of this chunk.
    pub(crate) bytes: u64,
    /// The reader's pool (`None` once the chunk is back there).
    home: Option<std::sync::mpsc::SyncSender<Chunk>>,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            // A full pool or a reader that finished: freed here instead.
            let _ = home.try_send(Chunk {
                buf: std::mem::take(&mut self.buf),
                lines: std::mem::take(&mut self.lines),
                decoded: std::mem::take(&mut self.decoded),
                identities: std::mem::take(&mut self.identities),
                bytes: 0,
                home: None,
            });
        }
    }
}

const CHUNK_LINES: usize = 2048;

/// Chunks kept for reuse: those in flight come back as they are processed.
const CHUNK_POOL: usize = 4;

/// Reads lines and decodes them into chunks, sent to the engine thread. The
/// order of lines is kept; decoding is pure, so doing it on another thread
/// changes nothing but speed.
pub(crate) fn read_chunks<R: Read>(
    mut reader: BufReader<R>,
    decode: &DecodeOptions,
    tx: std::sync::mpsc::SyncSender<std::io::Result<Chunk>>,
) {
    let (home, pool) = std::sync::mpsc::sync_channel::<Chunk>(CHUNK_POOL);
    let mut line_no = 0u64;
    let mut bytes = 0u64;
    loop {
        let mut chunk = match pool.try_recv() {
            Ok(mut c) => {
                c.buf.clear();
                c.lines.clear();
                c.decoded.clear();
                c.identities.clear();
                c
            }
            Err(_) => Chunk {
                buf: Vec::with_capacity(CHUNK_LINES * 256),
                lines: Vec::with_capacity(CHUNK_LINES),
                decoded: Vec::with_capacity(CHUNK_LINES),
                identities: Vec::with_capacity(CHUNK_LINES),
                bytes: 0,
                home: None,
            },
        };
        chunk.home = Some(home.clone());
        let mut eof = false;
        while chunk.lines.len() < CHUNK_LINES {
            let start = chunk.buf.len();
            let n = match reader.read_until(b'\n', &mut chunk.buf) {
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            if n == 0 {
                eof = true;
                break;
            }
            bytes += n as u64;
            line_no += 1;
            let mut end = chunk.buf.len();
            if chunk.buf[end - 1] == b'\n' {
                end -= 1;
            }
            if chunk.buf[start..end].iter().all(u8::is_ascii_whitespace) {
                chunk.buf.truncate(start);
                continue;
            }
            chunk.lines.push((start, end, line_no));
        }
        for &(a, b, _) in &chunk.lines {
            let decoded = decode_vote(&chunk.buf[a..b], decode);
            chunk
                .identities
                .push(decoded.as_ref().map_or(0, vote_identity));
            chunk.decoded.push(decoded);
        }
        chunk.bytes = bytes;
        if (!chunk.lines.is_empty() || eof) && tx.send(Ok(chunk)).is_err() {
            return;
        }
        if eof {
            return;
        }
    }
}

/// The engine and its state store: loads what a chunk needs before it, and
/// writes and evicts after it when the cache is over its budget. Reads and
/// writes run on their own threads ([`Workers`]) while the engine goes on.
struct Shell<'a> {
    engine: &'a mut Engine,
    store: &'a Store,
    budget: usize,
    /// A --state-dir (identities past the retention are swept from it).
    persist: bool,
    /// Evictions so far (see [`Workers`]).
    evictions: u64,
    /// Time spent reading from the store on the engine's thread, and
    /// waiting for its writer (debug log).
    load_time: Duration,
    wait_time: Duration,
    /// Series and identity keys read from the store (debug log).
    keys_read: usize,
}

/// The store's reader and writer threads.
///
/// The writer writes a drained bulk while the engine goes on; the engine
/// evicts what it wrote once it is done. The reader reads what the next
/// chunk needs while the engine processes this one. Its values are current
/// unless the engine evicted meanwhile: a key the cache lacked when the
/// read was asked for had been evicted after its last write completed, and
/// one cached since then wins over the read value. After an eviction the
/// shell drops the read and reads on its own thread instead.
struct Workers {
    write: std::sync::mpsc::SyncSender<BulkWrite>,
    written: std::sync::mpsc::Receiver<Result<(), StoreError>>,
    /// Writes sent, and those whose result the shell has taken (one at
    /// most is in flight).
    writes_sent: u64,
    writes_taken: u64,
    read: std::sync::mpsc::SyncSender<Vec<Wants>>,
    /// The read's result, and its list of wants back for the next one.
    loaded: std::sync::mpsc::Receiver<(Result<Loaded, StoreError>, Vec<Wants>)>,
    spare: Vec<Wants>,
    /// A read in flight: the shell's eviction count when it was asked for.
    read_asked: Option<u64>,
}

impl Workers {
    fn start<'s>(scope: &'s std::thread::Scope<'s, '_>, store: &'s Store) -> Workers {
        let (write, rx) = std::sync::mpsc::sync_channel::<BulkWrite>(1);
        let (done_tx, written) = std::sync::mpsc::sync_channel(1);
        scope.spawn(move || {
            for bulk in rx {
                if done_tx.send(store.write_prepared(bulk)).is_err() {
                    return;
                }
            }
        });
        let (read, rx) = std::sync::mpsc::sync_channel::<Vec<Wants>>(1);
        let (loaded_tx, loaded) = std::sync::mpsc::sync_channel(1);
        scope.spawn(move || {
            for mut wants in rx {
                let read = store.read(&wants);
                wants.clear();
                if loaded_tx.send((read, wants)).is_err() {
                    return;
                }
            }
        });
        Workers {
            write,
            written,
            writes_sent: 0,
            writes_taken: 0,
            read,
            loaded,
            spare: Vec::new(),
            read_asked: None,
        }
    }
}

fn stopped(what: &str) -> anyhow::Error {
    anyhow::anyhow!("the state {what} thread stopped")
}

impl Shell<'_> {
    /// What `chunk` needs from the store and the cache lacks.
    fn wants(&self, chunk: &Chunk, wants: &mut Vec<Wants>) {
        wants.clear();
        if self.engine.is_complete() {
            return;
        }
        let none = Wants::default();
        for (decoded, &identity) in chunk.decoded.iter().zip(&chunk.identities) {
            let Ok(vote) = decoded else { continue };
            let w = self.engine.wants_with_identity(vote, identity);
            if w != none {
                wants.push(w);
            }
        }
    }

    /// Asks the reader thread for what `chunk` needs (it runs while the
    /// engine processes the chunk before it).
    fn prefetch(&mut self, workers: &mut Workers, chunk: &Chunk) -> Result<()> {
        let mut wants = std::mem::take(&mut workers.spare);
        self.wants(chunk, &mut wants);
        if wants.is_empty() {
            workers.spare = wants;
            return Ok(());
        }
        workers.read.send(wants).map_err(|_| stopped("reader"))?;
        workers.read_asked = Some(self.evictions);
        Ok(())
    }

    /// Loads what `chunk` needs: the prefetched values if no eviction
    /// happened since they were asked for; otherwise reads on this thread.
    fn load(&mut self, workers: &mut Workers, chunk: &Chunk, wants: &mut Vec<Wants>) -> Result<()> {
        if let Some(asked) = workers.read_asked.take() {
            let (loaded, spare) = workers.loaded.recv().map_err(|_| stopped("reader"))?;
            workers.spare = spare;
            let loaded = loaded?;
            // Counted even when dropped: the read was made.
            self.keys_read += loaded.keys_read;
            if asked == self.evictions {
                loaded.provide(self.engine);
                return Ok(());
            }
        }
        self.wants(chunk, wants);
        if wants.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        self.keys_read += self.store.provide(self.engine, wants)?;
        self.load_time += started.elapsed();
        Ok(())
    }

    /// Waits for the write in flight (if any; or only takes its result
    /// when it is done, without `block`), then evicts what it wrote and
    /// is least recently used.
    fn finish_write(&mut self, workers: &mut Workers, block: bool) -> Result<bool> {
        if workers.writes_sent == workers.writes_taken {
            return Ok(true);
        }
        let started = Instant::now();
        let result = if block {
            Some(workers.written.recv().map_err(|_| stopped("writer"))?)
        } else {
            workers.written.try_recv().ok()
        };
        self.wait_time += started.elapsed();
        let Some(result) = result else {
            return Ok(false);
        };
        result?;
        workers.writes_taken += 1;
        self.evictions += 1;
        // Over two thirds of the budget, down to half of it.
        self.engine.evict(self.budget - self.budget / 3);
        Ok(true)
    }

    /// Keeps the cache within its budget: once it is three quarters full,
    /// its changes go to the writer thread while the engine goes on, and
    /// once they are written the least recently used entries are evicted
    /// down to half the budget. The engine waits for the write only if the
    /// cache reaches its budget meanwhile.
    fn make_room(&mut self, workers: &mut Workers) -> Result<()> {
        if self.engine.pending_changes() > PRUNE_AT {
            self.engine.forget_closed_batches();
        }
        let idle = self.finish_write(workers, false)?;
        if self.engine.cache_bytes() <= self.budget - self.budget / 4 {
            return Ok(());
        }
        if !idle {
            if self.engine.cache_bytes() <= self.budget {
                return Ok(());
            }
            self.finish_write(workers, true)?;
            if self.engine.cache_bytes() <= self.budget - self.budget / 4 {
                return Ok(());
            }
        }
        let bulk = self.store.prepare_bulk(self.engine, self.persist)?;
        workers.write.send(bulk).map_err(|_| stopped("writer"))?;
        workers.writes_sent += 1;
        Ok(())
    }
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
        scope.spawn(move || read_chunks(reader, decode, tx));
        drive(rx.into_iter(), shell, sink, Some(&mut progress))
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
    mut progress: Option<&mut Progress>,
) -> Result<ReplaySummary> {
    let mut summary = ReplaySummary::default();
    let mut updates = Vec::new();
    let mut wants = Vec::new();
    std::thread::scope(|scope| -> Result<()> {
        let mut workers = Workers::start(scope, shell.store);
        let mut chunks = chunks;
        let mut next = chunks.next();
        while let Some(chunk) = next {
            let chunk = chunk.context("cannot read input")?;
            let chunk: &Chunk = chunk.borrow();
            shell.load(&mut workers, chunk, &mut wants)?;
            next = chunks.next();
            if let Some(Ok(following)) = &next {
                shell.prefetch(&mut workers, following.borrow())?;
            }
            let engine = &mut *shell.engine;
            let lines = chunk.lines.iter().zip(&chunk.decoded);
            for ((&(a, b, line_no), decoded), &identity) in lines.zip(&chunk.identities) {
                let line = &chunk.buf[a..b];
                summary.lines = line_no;
                match decoded {
                    Err(r) => {
                        summary.rejected += 1;
                        sink.rejected(r, line, line_no)?;
                    }
                    Ok(vote) => match engine.process_with_identity(vote, identity, &mut updates) {
                        Outcome::Accepted => sink.updates(&mut updates)?,
                        Outcome::Duplicate => {}
                        Outcome::Late(r) => {
                            summary.rejected += 1;
                            sink.rejected(&r, line, line_no)?;
                        }
                    },
                }
            }
            if let Some(p) = progress.as_deref_mut() {
                p.update(summary.lines, chunk.bytes, engine.counters.accepted);
            }
            sink.chunk_done(engine);
            shell.make_room(&mut workers)?;
        }
        shell.finish_write(&mut workers, true).map(|_| ())
    })?;
    Ok(summary)
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
    let tmp = tempfile::tempdir().context("cannot create a temporary state directory")?;
    let store = Store::open_temporary(tmp.path())?;
    let (mut engine, _) = store.load(cfg.engine())?;
    let mut shell = Shell {
        engine: &mut engine,
        store: &store,
        budget,
        persist: false,
        evictions: 0,
        load_time: Duration::ZERO,
        wait_time: Duration::ZERO,
        keys_read: 0,
    };
    let summary = drive(chunks, &mut shell, sink, None)?;
    let mut updates = Vec::new();
    engine.close_all(&mut updates);
    sink.updates(&mut updates)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let text = format!("{err:#}");
        assert!(text.contains("cannot write to stdout"), "{text}");
        assert!(text.contains("roken pipe"), "{text}");
    }
}
