//! Input lines read and decoded on their own thread, in chunks that go
//! back to that thread to be filled again.

use std::io::{BufRead, BufReader, Read};

use crate::engine::vote_identity;
use crate::input::{decode_vote, DecodeOptions, Rejection, Vote};

/// A run of input lines, read and decoded off the engine's thread.
///
/// Dropped, it goes back to the reader that filled it, to be filled again:
/// the engine thread then neither frees its buffers (freeing one that
/// large made glibc consolidate its heap, on the thread the replay waits
/// for) nor the decoded votes (freed by the reader, which allocated them).
pub(crate) struct Chunk {
    pub(super) buf: Vec<u8>,
    /// (start, end, line number) of each non-blank line in `buf`.
    pub(crate) lines: Vec<(usize, usize, u64)>,
    pub(crate) decoded: Vec<Result<Vote, Rejection>>,
    /// Each decoded vote's identity (`engine::vote_identity`, hashed here
    /// rather than on the engine's thread; 0 for a rejected line).
    pub(super) identities: Vec<u128>,
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
