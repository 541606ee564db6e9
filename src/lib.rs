//! jurystream: time-decayed quality scores and ambiguity flags from human
//! votes on AI outputs (GrandJury protocol), over Kafka with RocksDB state.
//!
//! The pipeline, one way through: [`input`] decodes and validates a message,
//! [`engine`] (pure) batches and scores it, [`state`] remembers it, [`output`]
//! encodes the events. [`replay`] and [`service`] are the two shells.

pub mod agreement;
pub mod api;
pub mod backtest;
pub mod config;
pub mod connect;
pub mod engine;
pub mod error;
pub mod input;
pub mod inspect;
pub mod kafka;
pub mod output;
pub mod produce;
pub mod replay;
pub mod reputation;
pub mod server;
pub mod service;
pub mod state;
pub mod telemetry;
pub mod time;
