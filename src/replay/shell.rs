//! The engine and its state store during a replay: what a chunk needs is
//! read before it (the next chunk's on a reader thread), and the cache is
//! written out and evicted when it is over its budget (on a writer thread).

use std::time::{Duration, Instant};

use super::{join_thread, Chunk, ReplayError};
use crate::engine::{Engine, Wants};
use crate::state::{BulkWrite, Loaded, Store, StoreError};

/// Pending changes (series, batches, identities) above which the engine's
/// change list is pruned of batches that closed unwritten. The rest of it
/// is bounded by the cache (dirty entries count against it) and the open
/// batches: the state is written only when the cache is full, or at the end.
const PRUNE_AT: usize = 200_000;

type Result<T, E = ReplayError> = std::result::Result<T, E>;

/// The engine and its state store: loads what a chunk needs before it, and
/// writes and evicts after it when the cache is over its budget. Reads and
/// writes run on their own threads ([`Workers`]) while the engine goes on.
pub(super) struct Shell<'a> {
    pub(super) engine: &'a mut Engine,
    pub(super) store: &'a Store,
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
pub(super) struct Workers<'s> {
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
    writer: std::thread::ScopedJoinHandle<'s, ()>,
    reader: std::thread::ScopedJoinHandle<'s, ()>,
}

impl<'s> Workers<'s> {
    pub(super) fn start(scope: &'s std::thread::Scope<'s, '_>, store: &'s Store) -> Result<Self> {
        let (write, rx) = std::sync::mpsc::sync_channel::<BulkWrite>(1);
        let (done_tx, written) = std::sync::mpsc::sync_channel(1);
        let writer = std::thread::Builder::new()
            .name("state-writer".into())
            .spawn_scoped(scope, move || {
                for bulk in rx {
                    if done_tx.send(store.write_prepared(bulk)).is_err() {
                        return;
                    }
                }
            })
            .map_err(ReplayError::spawn(WRITER))?;
        let (read, rx) = std::sync::mpsc::sync_channel::<Vec<Wants>>(1);
        let (loaded_tx, loaded) = std::sync::mpsc::sync_channel(1);
        let reader = std::thread::Builder::new()
            .name("state-reader".into())
            .spawn_scoped(scope, move || {
                for mut wants in rx {
                    let read = store.read(&wants);
                    wants.clear();
                    if loaded_tx.send((read, wants)).is_err() {
                        return;
                    }
                }
            })
            .map_err(ReplayError::spawn(READER))?;
        Ok(Workers {
            write,
            written,
            writes_sent: 0,
            writes_taken: 0,
            read,
            loaded,
            spare: Vec::new(),
            read_asked: None,
            writer,
            reader,
        })
    }

    /// Stops both threads and waits for them (a write in flight finishes
    /// first). A thread that panicked is an error here rather than a
    /// panic of the scope: it explains the [`ReplayError::Stopped`] the
    /// shell met.
    pub(super) fn join(self) -> Result<()> {
        let Workers {
            write,
            written,
            read,
            loaded,
            writer,
            reader,
            ..
        } = self;
        drop((write, written, read, loaded));
        let wrote = join_thread(WRITER, writer);
        let read = join_thread(READER, reader);
        wrote.and(read)
    }
}

const READER: &str = "state reader";
const WRITER: &str = "state writer";

fn stopped(thread: &'static str) -> ReplayError {
    ReplayError::Stopped { thread }
}

impl<'a> Shell<'a> {
    pub(super) fn new(
        engine: &'a mut Engine,
        store: &'a Store,
        budget: usize,
        persist: bool,
    ) -> Self {
        Shell {
            engine,
            store,
            budget,
            persist,
            evictions: 0,
            load_time: Duration::ZERO,
            wait_time: Duration::ZERO,
            keys_read: 0,
        }
    }

    /// Time spent reading on the engine's thread, waiting for the writer,
    /// and keys read (the debug log).
    pub(super) fn load_time(&self) -> Duration {
        self.load_time
    }

    pub(super) fn wait_time(&self) -> Duration {
        self.wait_time
    }

    pub(super) fn keys_read(&self) -> usize {
        self.keys_read
    }

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
    pub(super) fn prefetch(&mut self, workers: &mut Workers<'_>, chunk: &Chunk) -> Result<()> {
        let mut wants = std::mem::take(&mut workers.spare);
        self.wants(chunk, &mut wants);
        if wants.is_empty() {
            workers.spare = wants;
            return Ok(());
        }
        workers.read.send(wants).map_err(|_| stopped(READER))?;
        workers.read_asked = Some(self.evictions);
        Ok(())
    }

    /// Loads what `chunk` needs: the prefetched values if no eviction
    /// happened since they were asked for; otherwise reads on this thread.
    pub(super) fn load(
        &mut self,
        workers: &mut Workers<'_>,
        chunk: &Chunk,
        wants: &mut Vec<Wants>,
    ) -> Result<()> {
        if let Some(asked) = workers.read_asked.take() {
            let (loaded, spare) = workers.loaded.recv().map_err(|_| stopped(READER))?;
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
    pub(super) fn finish_write(&mut self, workers: &mut Workers<'_>, block: bool) -> Result<bool> {
        if workers.writes_sent == workers.writes_taken {
            return Ok(true);
        }
        let started = Instant::now();
        let result = if block {
            Some(workers.written.recv().map_err(|_| stopped(WRITER))?)
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
    pub(super) fn make_room(&mut self, workers: &mut Workers<'_>) -> Result<()> {
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
        workers.write.send(bulk).map_err(|_| stopped(WRITER))?;
        workers.writes_sent += 1;
        Ok(())
    }
}
