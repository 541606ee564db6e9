//! `connect`'s one error type: whose fault, and whether trying again helps.

use std::fmt;

/// Whose fault a failure of `connect` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The configuration (an address that cannot be bound, a missing
    /// topic, a refused token): fixing it helps, retrying does not.
    Config,
    /// The broker did not acknowledge in time, or is unreachable.
    Broker,
    /// Label Studio did not answer, or answered an error.
    LabelStudio,
}

#[derive(Debug, Clone)]
pub struct ConnectError {
    pub fault: Fault,
    pub retriable: bool,
    pub message: String,
}

impl ConnectError {
    pub fn config(message: impl Into<String>) -> Self {
        ConnectError {
            fault: Fault::Config,
            retriable: false,
            message: message.into(),
        }
    }

    pub fn broker(message: impl Into<String>) -> Self {
        ConnectError {
            fault: Fault::Broker,
            retriable: true,
            message: message.into(),
        }
    }

    pub fn label_studio(retriable: bool, message: impl Into<String>) -> Self {
        ConnectError {
            fault: Fault::LabelStudio,
            retriable,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whose = match self.fault {
            Fault::Config => "configuration",
            Fault::Broker => "broker",
            Fault::LabelStudio => "Label Studio",
        };
        let kind = if self.retriable { "retriable" } else { "fatal" };
        write!(f, "{whose} error ({kind}): {}", self.message)
    }
}

impl std::error::Error for ConnectError {}
