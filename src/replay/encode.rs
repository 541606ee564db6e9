//! Replay's events: the engine loop hands score updates and rejections,
//! in order and in batches, to a thread that encodes them as JSON lines and
//! writes them.

use std::io::Write;
use std::time::{Duration, Instant};

use super::Sink;
use crate::engine::{Engine, ScoreUpdate};
use crate::input::{dlq_payload, Rejection};
use crate::output::{
    processed_at, score_update_routes, vote_rejected_json, write_score_update_event, Source,
};
use crate::time::wall_clock;

/// Output bytes gathered before a write to the output.
const OUT_BUFFER: usize = 1 << 20;

/// Writes events as JSON lines, refreshing `processed_at` now and then.
/// Events are encoded straight into one buffer (no allocation per event),
/// written out once it holds [`OUT_BUFFER`] bytes.
struct EventWriter<W: Write> {
    metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>,
    out: W,
    buf: Vec<u8>,
    stamp: String,
    stamped_at: Instant,
    events: u64,
}

impl<W: Write> EventWriter<W> {
    fn new(out: W, metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>) -> Self {
        EventWriter {
            metrics,
            out,
            buf: Vec::with_capacity(OUT_BUFFER + 64 * 1024),
            stamp: processed_at(wall_clock()),
            stamped_at: Instant::now(),
            events: 0,
        }
    }

    fn tick(&mut self) {
        if self.stamped_at.elapsed() >= Duration::from_millis(1) {
            self.stamp = processed_at(wall_clock());
            self.stamped_at = Instant::now();
        }
    }

    /// Writes the buffer out once it is full (`all`: whatever it holds).
    fn drain(&mut self, all: bool) -> std::io::Result<()> {
        if self.buf.len() >= OUT_BUFFER || all {
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    fn write(&mut self, e: Produced) -> std::io::Result<()> {
        self.tick();
        match e {
            Produced::Update(u) => {
                if let Some(m) = &self.metrics {
                    m.score_update(&u, wall_clock() as f64 / 1e9);
                }
                for route in score_update_routes(&u) {
                    write_score_update_event(&mut self.buf, route, &u, &self.stamp);
                    self.buf.push(b'\n');
                    self.events += 1;
                }
            }
            Produced::Rejected(r, bytes, line) => {
                if let Some(m) = &self.metrics {
                    m.rejected(r.reason);
                }
                let payload = dlq_payload(&bytes);
                let s = vote_rejected_json(&r, &payload, &Source::Line { line }, &self.stamp);
                self.buf.extend_from_slice(s.as_bytes());
                self.buf.push(b'\n');
                self.events += 1;
            }
        }
        self.drain(false)
    }
}

/// What the engine loop produced, in order, for the encoder thread.
// Updates are nearly every item: boxing them would allocate per event.
#[allow(clippy::large_enum_variant)]
pub(super) enum Produced {
    Update(ScoreUpdate),
    /// The rejection, the line's bytes and its number.
    Rejected(Rejection, Vec<u8>, u64),
}

/// Events per batch handed to the encoder thread (one engine chunk is up
/// to 2 048 lines), and batches in flight.
const ENCODE_BATCH: usize = 1024;
const ENCODE_QUEUE: usize = 4;

/// The replay's sink: hands what the engine produced to a thread that
/// encodes it as JSON and writes it ([`encode_events`]), in order, in
/// batches. Encoding and writing were a fifth of the engine thread's time,
/// and the engine thread is what a replay waits on.
pub(super) struct Encoder {
    batch: Vec<Produced>,
    /// Dropping the encoder closes the channel, and the thread finishes.
    tx: std::sync::mpsc::SyncSender<Vec<Produced>>,
    /// Batches the encoder thread emptied, to fill again (a new one each
    /// time was a large allocation here and a large free there).
    emptied: std::sync::mpsc::Receiver<Vec<Produced>>,
    metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>,
}

/// The encoder thread's end of the channel: batches to encode, and where
/// their emptied vectors go back.
pub(super) struct Batches {
    rx: std::sync::mpsc::Receiver<Vec<Produced>>,
    emptied: std::sync::mpsc::SyncSender<Vec<Produced>>,
}

/// The engine's and the encoder thread's ends.
pub(super) fn channel(
    metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>,
) -> (Encoder, Batches) {
    let (tx, rx) = std::sync::mpsc::sync_channel(ENCODE_QUEUE);
    let (emptied_tx, emptied) = std::sync::mpsc::sync_channel(ENCODE_QUEUE);
    let encoder = Encoder {
        batch: Vec::with_capacity(ENCODE_BATCH),
        tx,
        emptied,
        metrics,
    };
    (
        encoder,
        Batches {
            rx,
            emptied: emptied_tx,
        },
    )
}

impl Encoder {
    fn push(&mut self, e: Produced) -> std::io::Result<()> {
        self.batch.push(e);
        if self.batch.len() >= ENCODE_BATCH {
            self.send()?;
        }
        Ok(())
    }

    /// Hands the batch so far to the encoder thread (called at the end for
    /// what is left).
    pub(super) fn send(&mut self) -> std::io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let next = self
            .emptied
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(ENCODE_BATCH));
        let batch = std::mem::replace(&mut self.batch, next);
        self.tx
            .send(batch)
            // The encoder stopped on a write error, which its join reports.
            .map_err(|_| std::io::Error::other("the event encoder stopped"))
    }
}

impl Sink for Encoder {
    fn updates(&mut self, updates: &mut Vec<ScoreUpdate>) -> std::io::Result<()> {
        for u in updates.drain(..) {
            self.push(Produced::Update(u))?;
        }
        Ok(())
    }

    fn rejected(&mut self, r: &Rejection, bytes: &[u8], line: u64) -> std::io::Result<()> {
        self.push(Produced::Rejected(r.clone(), bytes.to_vec(), line))
    }

    fn chunk_done(&mut self, engine: &Engine) {
        if let Some(m) = &self.metrics {
            m.observe_engine("0", engine);
        }
    }
}

/// The encoder thread: writes every event it is handed to `out`, then
/// flushes it; returns the number of events.
pub(super) fn encode_events<W: Write>(
    batches: Batches,
    out: W,
    metrics: Option<std::sync::Arc<crate::telemetry::Metrics>>,
) -> std::io::Result<u64> {
    let mut w = EventWriter::new(out, metrics);
    for mut batch in batches.rx {
        for e in batch.drain(..) {
            w.write(e)?;
        }
        // The engine may have enough (it takes one per batch it sends).
        let _ = batches.emptied.try_send(batch);
    }
    w.drain(true)?;
    w.out.flush()?;
    Ok(w.events)
}
