//! `jurystream run`: the Kafka service (contract §7).
//!
//! Folders are the stages a session goes through, each importing only
//! those below it:
//!
//! - [`run`]: the loop: topics, sessions rebuilt with backoff, polling.
//! - [`rebalance`]: revoke (commit or abort, release) and assign (queue a
//!   restore); a finished restore taken into service (adopt, seek,
//!   resume).
//! - [`cycle`]: one commit cycle: records through the engine
//!   (`cycle::ingest`), contract §14's tables fed and published
//!   (`cycle::tables`), then the cycle committed in the order of the
//!   delivery mode (`cycle::plan`, `cycle::commit`).
//! - [`session`]: what one consumer-group session holds: the assigned
//!   partitions, the producer, the open cycle and the commit in flight
//!   (`session::overlap`).
//! - [`reputation`]: contract §14's topic, the group's view and its reader.
//! - [`partition`]: one input partition's state: RocksDB plus its
//!   changelog (`partition::changelog`), rebuilt on assignment
//!   (`partition::restore`), an interrupted outbox cycle's missing events
//!   found in the outputs (`partition::reconcile`).
//! - [`client`]: Kafka plumbing: names, the sender, librdkafka callbacks
//!   (`client::context`), per-partition queues (`client::lanes`), topic
//!   creation (`client::topics`).
//! - [`error`]: `ServiceError`, retriable or fatal.
//!
//! docs/ARCHITECTURE.md has the picture.

mod client;
mod cycle;
pub mod error;
mod partition;
mod rebalance;
mod reputation;
mod run;
mod session;

pub use client::{Names, ORIGIN_HEADER};
pub use error::{Classify, Fault, RetryHint, ServiceError};
pub use partition::changelog::{CycleMarker, CHANGELOG_HEADER, CYCLE_KEY};
pub use run::run;
