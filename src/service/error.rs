//! The service's one error type: whose fault a failure is and whether
//! rebuilding the session from committed state can help.

use std::fmt;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::state::StoreError;

/// Whose fault a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The configuration does not fit (the broker lacks a feature the
    /// chosen delivery mode needs, a property the mode cannot honour, an
    /// address that cannot be bound). Fixing the configuration helps;
    /// retrying does not.
    Config,
    /// The broker or the network: unreachable, timed out, a failed
    /// delivery; or this instance lost its producer identity (fenced).
    Broker,
    /// The local state store (RocksDB, its directory) or a record in it.
    Store,
    /// An inconsistency inside this process (a bug or an aborted cycle):
    /// the session is rebuilt from committed state.
    Internal,
}

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Config => "configuration",
            Fault::Broker => "broker",
            Fault::Store => "state store",
            Fault::Internal => "internal",
        }
    }
}

/// A failure of the Kafka service.
#[derive(Debug)]
pub struct ServiceError {
    fault: Fault,
    retriable: bool,
    /// librdkafka's error code, when the failure came from a Kafka client.
    code: Option<RDKafkaErrorCode>,
    message: String,
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

impl ServiceError {
    fn new(fault: Fault, retriable: bool, message: impl Into<String>) -> Self {
        ServiceError {
            fault,
            retriable,
            code: None,
            message: message.into(),
        }
    }

    /// A configuration that cannot work: fatal.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(Fault::Config, false, message)
    }

    /// A transient broker failure: the session is rebuilt with backoff.
    pub fn broker(message: impl Into<String>) -> Self {
        Self::new(Fault::Broker, true, message)
    }

    /// An inconsistency; the session is rebuilt from committed state.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Fault::Internal, true, message)
    }

    /// A state write that did not finish in time: the session is rebuilt
    /// (the write finishes in the background, and the next open of its
    /// directory waits for it).
    pub fn slow_store(message: impl Into<String>) -> Self {
        Self::new(Fault::Store, true, message)
    }

    /// A thread that cannot start (the process is out of threads or
    /// memory): the session is rebuilt with backoff.
    pub fn thread(what: &str, e: std::io::Error) -> Self {
        Self::new(Fault::Internal, true, format!("cannot start {what}: {e}"))
    }

    /// A local disk failure (not RocksDB itself): fatal.
    pub fn io(what: impl fmt::Display, e: std::io::Error) -> Self {
        Self::new(Fault::Store, false, format!("{what}: {e}"))
    }

    /// A Kafka client failure during `what`. Fatal when librdkafka says so
    /// (a fatal producer error, a fenced producer); retriable otherwise.
    pub fn kafka(what: &str, e: KafkaError) -> Self {
        let code = e.rdkafka_error_code();
        let fatal_txn = matches!(&e, KafkaError::Transaction(r) if r.is_fatal());
        let fenced = matches!(
            code,
            Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::ProducerFenced)
        );
        let mut err = if fatal_txn || fenced {
            Self::new(
                Fault::Broker,
                false,
                format!(
                    "{what}: {e} (this instance was fenced by a newer instance or hit a fatal producer error)"
                ),
            )
        } else {
            Self::new(Fault::Broker, true, format!("{what}: {e}"))
        };
        err.code = code;
        err
    }

    /// A Kafka transaction step during `what`: as [`ServiceError::kafka`],
    /// except that a broker without transaction support is a fatal
    /// configuration error that names the way out.
    pub fn kafka_txn(what: &str, e: KafkaError) -> Self {
        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnsupportedFeature) {
            let mut err = Self::config(format!(
                "{what}: {e}: this broker does not support Kafka transactions; use one that does \
                 (Apache Kafka, Redpanda) or set kafka.delivery = \"exactly_once_outbox\""
            ));
            err.code = Some(RDKafkaErrorCode::UnsupportedFeature);
            return err;
        }
        Self::kafka(what, e)
    }

    /// A failed delivery report (the broker did not take a record).
    pub fn delivery(what: &str, e: &KafkaError) -> Self {
        let mut err = Self::kafka(what, e.clone());
        err.message = format!("{what}: delivery failed: {e}");
        err
    }

    pub fn fault(&self) -> Fault {
        self.fault
    }

    /// Whether rebuilding the session (with backoff) can help.
    pub fn is_retriable(&self) -> bool {
        self.retriable
    }

    /// librdkafka's error code, if a Kafka client reported the failure.
    pub fn kafka_code(&self) -> Option<RDKafkaErrorCode> {
        self.code
    }
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ServiceError {}

/// Every state-store failure is fatal: the process stops without
/// committing anything partial, and the next start restores.
impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        Self::new(
            Fault::Store,
            false,
            format!("state store: {}", crate::error::chain(&e)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_errors_are_classified_by_code_not_text() {
        let transient = ServiceError::kafka(
            "flush",
            KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut),
        );
        assert!(transient.is_retriable());
        assert_eq!(transient.fault(), Fault::Broker);
        assert_eq!(
            transient.kafka_code(),
            Some(RDKafkaErrorCode::OperationTimedOut)
        );

        let fenced = ServiceError::kafka(
            "commit transaction",
            KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
        );
        assert!(!fenced.is_retriable());
        assert!(fenced.to_string().contains("fenced"), "{fenced}");

        let unsupported = ServiceError::kafka_txn(
            "commit transaction",
            KafkaError::MessageProduction(RDKafkaErrorCode::UnsupportedFeature),
        );
        assert_eq!(unsupported.fault(), Fault::Config);
        assert!(!unsupported.is_retriable());
        assert!(unsupported.to_string().contains("exactly_once_outbox"));
        // Outside a transaction step the same code is an ordinary broker error.
        let plain = ServiceError::kafka(
            "produce",
            KafkaError::MessageProduction(RDKafkaErrorCode::UnsupportedFeature),
        );
        assert_eq!(plain.fault(), Fault::Broker);
    }

    #[test]
    fn store_errors_are_fatal() {
        let e: ServiceError = StoreError::Corrupt {
            path: "/x".into(),
            key: b"c".to_vec(),
            why: "truncated".into(),
        }
        .into();
        assert_eq!(e.fault(), Fault::Store);
        assert!(!e.is_retriable());
        assert!(e.to_string().contains("corrupt"), "{e}");
    }
}
