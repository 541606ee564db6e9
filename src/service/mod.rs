//! `jurystream run`: the Kafka service (contract §7).
//!
//! One consumer group member and one producer per session. Input records
//! go through the engine ([`ingest`]); every `kafka.commit_interval_ms` the
//! open cycle is committed in the order of the delivery mode
//! ([`delivery`]: `exactly_once` = one Kafka transaction, `exactly_once_outbox`,
//! `at_least_once`; in `exactly_once` the commit's wait overlaps the next
//! cycle, [`overlap`]). Each cycle of an input partition ends with a cycle
//! marker in that partition's changelog ([`changelog`]); RocksDB is written
//! only after the changelog is durable, with the position it reflects. On
//! assignment a partition's state is RocksDB plus the committed changelog
//! cycles after that position ([`restore`]); in outbox mode an interrupted
//! cycle's missing events are published by whoever restores it
//! ([`reconcile`]). Rebalance and delivery callbacks are in [`context`],
//! the run loop with its backoff in [`run`]. docs/ARCHITECTURE.md has the
//! picture.

mod changelog;
mod client;
mod context;
mod cycle;
mod delivery;
pub mod error;
mod ingest;
mod lanes;
mod overlap;
mod part;
mod rebalance;
mod reconcile;
mod reputation;
mod restore;
mod run;
mod session;
mod tables;
mod topics;

pub use changelog::{CycleMarker, CHANGELOG_HEADER, CYCLE_KEY};
pub use client::{Names, ORIGIN_HEADER};
pub use error::{Classify, Fault, RetryHint, ServiceError};
pub use run::run;
