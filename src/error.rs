//! Whose fault a failure of a command is, shared by the error types of the
//! commands a user runs by hand: [`crate::replay::ReplayError`] (also
//! `agreement`'s), [`crate::backtest::BacktestError`],
//! [`crate::inspect::InspectError`], [`crate::api::http::QueryError`] and
//! [`crate::service::produce::ProduceError`]. Each of them also says
//! whether running the command again can help (`is_retriable`).
//!
//! The long-running commands have their own: the service's
//! [`crate::service::error::Fault`] and connect's
//! [`crate::connect::error::Fault`].

use std::any::Any;

/// Whose fault a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A flag, a property or a request that cannot be used (a topic that
    /// does not exist, a wrong token): fixing the command line helps.
    Usage,
    /// The input named on the command line: a file that cannot be opened
    /// or read, a directory that holds no state.
    Input,
    /// Where the results go: stdout (a closed pipe), a report directory,
    /// a full disk.
    Output,
    /// The local state store (RocksDB, its directory) or a record in it.
    Store,
    /// The Kafka broker or the network to it.
    Broker,
    /// The service asked (the query API): unreachable, too slow, or
    /// answering with a server error.
    Server,
    /// This process: a thread that cannot start or panicked, a bug.
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

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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

/// An error and its sources, joined by ": " (what `main` prints).
#[cfg(test)]
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
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
}
