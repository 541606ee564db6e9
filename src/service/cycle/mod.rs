//! A commit cycle's stages, in the order a record goes through them:
//! [`ingest`] (one record → engine → events, sent now or held for the
//! outbox; the idle flush), `tables` (contract §14's tables: the reader's
//! records each loop turn, a partition taken on, a cycle's deltas
//! published), then [`commit`] (the cycle committed in the
//! order of [`plan`], the pure list of a delivery mode's steps; in
//! `exactly_once` the commit's wait overlaps the next cycle). A restore's
//! interrupted cycle is completed here too ([`commit::complete_delivery`]).

pub mod commit;
mod ingest;
pub mod plan;
mod tables;
