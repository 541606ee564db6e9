//! The crate's one error vocabulary: [`Fault`], whose fault a failure is,
//! and [`RetryHint`], whether trying again can help. Every error type of
//! the crate says both through [`Classify`]: the commands' own
//! ([`crate::replay::ReplayError`], also `agreement`'s;
//! [`crate::backtest::BacktestError`], [`crate::inspect::InspectError`],
//! [`crate::api::client::QueryError`],
//! [`crate::produce::ProduceError`]), the long-running ones'
//! ([`crate::service::ServiceError`], [`crate::connect::ConnectError`])
//! and the ones they wrap ([`crate::state::StoreError`],
//! [`crate::config::ConfigError`], [`crate::backtest::UsageError`]).
//!
//! An error's message names what failed; its cause is its
//! [`source`](std::error::Error::source), never also in the message:
//! [`chain`] (and `main`, through `anyhow`'s `{:#}`) prints each once.

use std::any::Any;
use std::error::Error;
use std::fmt;

/// Whose fault a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The usage or the configuration: a flag, a property, a request or a
    /// configuration key that cannot be used (a topic that does not exist,
    /// a wrong token, an address that cannot be bound, a broker without a
    /// feature the configuration needs). Fixing it helps.
    Usage,
    /// The input named on the command line: a file that cannot be opened
    /// or read, a directory that holds no state.
    Input,
    /// Where the results go: stdout (a closed pipe), a report directory,
    /// a full disk.
    Output,
    /// The local state store (RocksDB, its directory) or a record in it.
    Store,
    /// The Kafka broker or the network to it; also a producer the broker
    /// no longer accepts (fenced).
    Broker,
    /// A server or peer this process asks (the query API, Label Studio):
    /// unreachable, too slow, or answering with a server error.
    Server,
    /// This process: a thread or runtime that cannot start or panicked,
    /// an inconsistency, a bug.
    Internal,
}

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Usage => "usage",
            Fault::Input => "input",
            Fault::Output => "output",
            Fault::Store => "state store",
            Fault::Broker => "broker",
            Fault::Server => "server",
            Fault::Internal => "internal",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether trying again, as things are, can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryHint {
    /// No: something must be fixed first (a flag, the configuration, a
    /// file, the state store), or the failure is a bug. A command exits; a
    /// service stops.
    NoRetry,
    /// Yes, after a wait that grows: the broker, a server or this
    /// process's resources may be back. A command can be run again; the
    /// service rebuilds its session from committed state, `connect` tries
    /// the call again.
    WithBackoff,
}

impl RetryHint {
    /// `WithBackoff` when `retriable`.
    pub fn from_bool(retriable: bool) -> RetryHint {
        if retriable {
            RetryHint::WithBackoff
        } else {
            RetryHint::NoRetry
        }
    }

    pub fn is_retriable(self) -> bool {
        self == RetryHint::WithBackoff
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RetryHint::NoRetry => "no retry",
            RetryHint::WithBackoff => "with backoff",
        }
    }
}

impl fmt::Display for RetryHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How every error type of the crate classifies itself.
pub trait Classify: Error {
    /// Whose fault the failure is.
    fn fault(&self) -> Fault;

    /// Whether trying again (running the command again, rebuilding the
    /// service's session, repeating the call) can help as things are.
    fn retry(&self) -> RetryHint;

    /// `retry()` is [`RetryHint::WithBackoff`].
    fn is_retriable(&self) -> bool {
        self.retry().is_retriable()
    }
}

/// A Kafka client's error as the source of one of ours. rdkafka's
/// `KafkaError` prints librdkafka's error code and also returns that code
/// as its own `source()`, which a chain would print a second time; this
/// prints the client's error once and ends the chain there. It derefs to
/// the `KafkaError` (`rdkafka_error_code()` and the rest).
#[derive(Debug, Clone)]
pub struct KafkaCause(Box<rdkafka::error::KafkaError>);

impl KafkaCause {
    pub fn new(e: rdkafka::error::KafkaError) -> KafkaCause {
        KafkaCause(Box::new(e))
    }

    pub fn into_inner(self) -> rdkafka::error::KafkaError {
        *self.0
    }
}

impl From<rdkafka::error::KafkaError> for KafkaCause {
    fn from(e: rdkafka::error::KafkaError) -> KafkaCause {
        KafkaCause::new(e)
    }
}

impl std::ops::Deref for KafkaCause {
    type Target = rdkafka::error::KafkaError;

    fn deref(&self) -> &rdkafka::error::KafkaError {
        &self.0
    }
}

impl fmt::Display for KafkaCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Error for KafkaCause {}

/// An error and its sources, joined by ": " (what `main` prints), for a
/// log line or an HTTP answer: `error = %Chain(&e)`.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// An error and its sources, joined by ": " (what `main` prints).
pub fn chain(e: &(dyn Error + 'static)) -> String {
    Chain(e).to_string()
}

/// The message of a panic (its payload when that is a string).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_read_from_string_payloads() {
        let p = std::panic::catch_unwind(|| panic!("boom {}", 1)).unwrap_err();
        assert_eq!(panic_message(&*p), "boom 1");
        let p = std::panic::catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(&*p), "static");
        let p = std::panic::catch_unwind(|| std::panic::panic_any(7)).unwrap_err();
        assert_eq!(panic_message(&*p), "(no message)");
    }

    #[test]
    fn retry_hints() {
        assert_eq!(RetryHint::from_bool(true), RetryHint::WithBackoff);
        assert_eq!(RetryHint::from_bool(false), RetryHint::NoRetry);
        assert!(RetryHint::WithBackoff.is_retriable());
        assert!(!RetryHint::NoRetry.is_retriable());
        assert_eq!(Fault::Store.to_string(), "state store");
    }

    #[test]
    fn a_chain_joins_every_source_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(chain(&e), "outer: inner");
        assert_eq!(format!("{}", Chain(&e)), "outer: inner");
        let plain = std::io::Error::other("alone");
        assert_eq!(chain(&plain), "alone");
    }

    #[test]
    fn a_kafka_cause_prints_the_code_once() {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced);
        // rdkafka's own chain names the code twice.
        assert_eq!(chain(&e).matches("ProducerFenced").count(), 2);
        let cause = KafkaCause::from(e.clone());
        assert_eq!(chain(&cause), e.to_string());
        assert_eq!(chain(&cause).matches("ProducerFenced").count(), 1);
        assert_eq!(
            cause.rdkafka_error_code(),
            Some(RDKafkaErrorCode::ProducerFenced)
        );
    }
}
