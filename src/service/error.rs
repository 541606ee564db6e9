//! The service's one error type. Whose fault a failure is and whether
//! rebuilding the session from committed state can help are the crate's
//! [`Fault`] and [`RetryHint`] ([`Classify`]); the cause (the Kafka
//! client's error, the state store's, the I/O error) is its
//! [`source`](std::error::Error::source).

use std::net::{AddrParseError, SocketAddr};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

pub use crate::error::{Classify, Fault, KafkaCause, RetryHint};
use crate::state::StoreError;

/// A failure of the Kafka service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The configuration does not fit (a property the delivery mode cannot
    /// honour, a missing topic with `kafka.create_topics = false`, a state
    /// directory in use): the user's. Fatal.
    #[error("{0}")]
    Config(String),
    /// A configured address that is not one (`metrics.listen`): the
    /// user's. Fatal.
    #[error("{key}")]
    Address {
        key: &'static str,
        #[source]
        source: AddrParseError,
    },
    /// A configured address that cannot be bound (in use, no permission):
    /// the user's. Fatal.
    #[error("cannot listen on {key} {addr}")]
    Listen {
        key: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A Kafka client failure during `what`: the broker's. Fatal when
    /// librdkafka says so (a fatal producer error, a fenced producer);
    /// retriable otherwise.
    #[error("{what}{}", if fatal_kafka(source) { FENCED } else { "" })]
    Kafka {
        what: String,
        #[source]
        source: KafkaCause,
    },
    /// A transaction step the broker does not support: the configuration
    /// (`kafka.delivery`) does not fit the broker. Fatal.
    #[error(
        "{what}: this broker does not support Kafka transactions; use one that does \
         (Apache Kafka, Redpanda) or set kafka.delivery = \"exactly_once_outbox\""
    )]
    NoTransactions {
        what: String,
        #[source]
        source: KafkaCause,
    },
    /// A transient broker condition without a client error (a restore
    /// cancelled by a rebalance, a topic without partitions yet): the
    /// session is rebuilt with backoff.
    #[error("{0}")]
    Broker(String),
    /// An inconsistency inside this process (a bug or an aborted cycle):
    /// the session is rebuilt from committed state.
    #[error("{0}")]
    Internal(String),
    /// A thread or runtime that cannot start (the process is out of
    /// threads or memory): the session is rebuilt with backoff.
    #[error("cannot start {what}")]
    Thread {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A state write that did not finish in time: the session is rebuilt
    /// (the write finishes in the background, and the next open of its
    /// directory waits for it).
    #[error("{0}")]
    SlowStore(String),
    /// A local disk failure (not RocksDB itself): fatal.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Every state-store failure is fatal: the process stops without
    /// committing anything partial, and the next start restores.
    #[error("state store")]
    Store(#[from] StoreError),
}

/// What a fatal Kafka error adds to its `what`.
const FENCED: &str = ": this instance was fenced by a newer instance or hit a fatal producer error";

/// A fatal producer error or a fenced producer: the instance cannot go on.
fn fatal_kafka(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(r) if r.is_fatal())
        || matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::ProducerFenced)
        )
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

impl ServiceError {
    /// A configuration that cannot work: fatal.
    pub fn config(message: impl Into<String>) -> Self {
        ServiceError::Config(message.into())
    }

    /// A transient broker condition: the session is rebuilt with backoff.
    pub fn broker(message: impl Into<String>) -> Self {
        ServiceError::Broker(message.into())
    }

    /// An inconsistency; the session is rebuilt from committed state.
    pub fn internal(message: impl Into<String>) -> Self {
        ServiceError::Internal(message.into())
    }

    /// A state write that did not finish in time: the session is rebuilt
    /// (the write finishes in the background, and the next open of its
    /// directory waits for it).
    pub fn slow_store(message: impl Into<String>) -> Self {
        ServiceError::SlowStore(message.into())
    }

    /// A thread that cannot start (the process is out of threads or
    /// memory): the session is rebuilt with backoff.
    pub fn thread(what: &str, e: std::io::Error) -> Self {
        ServiceError::Thread {
            what: what.to_owned(),
            source: e,
        }
    }

    /// A local disk failure (not RocksDB itself): fatal.
    pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> Self {
        ServiceError::Io {
            what: what.to_string(),
            source: e,
        }
    }

    /// A Kafka client failure during `what`. Fatal when librdkafka says so
    /// (a fatal producer error, a fenced producer); retriable otherwise.
    pub fn kafka(what: &str, e: KafkaError) -> Self {
        ServiceError::Kafka {
            what: what.to_owned(),
            source: e.into(),
        }
    }

    /// A Kafka transaction step during `what`: as [`ServiceError::kafka`],
    /// except that a broker without transaction support is a fatal
    /// configuration error that names the way out.
    pub fn kafka_txn(what: &str, e: KafkaError) -> Self {
        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnsupportedFeature) {
            return ServiceError::NoTransactions {
                what: what.to_owned(),
                source: e.into(),
            };
        }
        Self::kafka(what, e)
    }

    /// A failed delivery report (the broker did not take a record).
    pub fn delivery(what: &str, e: &KafkaError) -> Self {
        Self::kafka(&format!("{what}: delivery failed"), e.clone())
    }

    /// A configured address that is not one.
    pub fn address(key: &'static str, e: AddrParseError) -> Self {
        ServiceError::Address { key, source: e }
    }

    /// A configured address that cannot be bound.
    pub fn listen(key: &'static str, addr: SocketAddr, e: std::io::Error) -> Self {
        ServiceError::Listen {
            key,
            addr,
            source: e,
        }
    }

    /// librdkafka's error code, if a Kafka client reported the failure.
    pub fn kafka_code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            ServiceError::Kafka { source, .. } | ServiceError::NoTransactions { source, .. } => {
                source.rdkafka_error_code()
            }
            _ => None,
        }
    }
}

impl Classify for ServiceError {
    fn fault(&self) -> Fault {
        match self {
            ServiceError::Config(_)
            | ServiceError::Address { .. }
            | ServiceError::Listen { .. }
            | ServiceError::NoTransactions { .. } => Fault::Usage,
            ServiceError::Kafka { .. } | ServiceError::Broker(_) => Fault::Broker,
            ServiceError::Internal(_) | ServiceError::Thread { .. } => Fault::Internal,
            ServiceError::SlowStore(_) | ServiceError::Io { .. } | ServiceError::Store(_) => {
                Fault::Store
            }
        }
    }

    /// Whether rebuilding the session (with backoff) can help.
    fn retry(&self) -> RetryHint {
        match self {
            ServiceError::Kafka { source, .. } => RetryHint::from_bool(!fatal_kafka(source)),
            ServiceError::Broker(_)
            | ServiceError::Internal(_)
            | ServiceError::Thread { .. }
            | ServiceError::SlowStore(_) => RetryHint::WithBackoff,
            ServiceError::Config(_)
            | ServiceError::Address { .. }
            | ServiceError::Listen { .. }
            | ServiceError::NoTransactions { .. }
            | ServiceError::Io { .. }
            | ServiceError::Store(_) => RetryHint::NoRetry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::chain;

    #[test]
    fn kafka_errors_are_classified_by_code_not_text() {
        let transient = ServiceError::kafka(
            "flush",
            KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut),
        );
        assert!(transient.is_retriable());
        assert_eq!(transient.retry(), RetryHint::WithBackoff);
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
        assert_eq!(fenced.fault(), Fault::Broker);
        assert_eq!(fenced.kafka_code(), Some(RDKafkaErrorCode::ProducerFenced));
        assert!(fenced.to_string().contains("fenced"), "{fenced}");

        let unsupported = ServiceError::kafka_txn(
            "commit transaction",
            KafkaError::MessageProduction(RDKafkaErrorCode::UnsupportedFeature),
        );
        assert_eq!(unsupported.fault(), Fault::Usage);
        assert!(!unsupported.is_retriable());
        assert_eq!(
            unsupported.kafka_code(),
            Some(RDKafkaErrorCode::UnsupportedFeature)
        );
        assert!(unsupported.to_string().contains("exactly_once_outbox"));
        // Outside a transaction step the same code is an ordinary broker error.
        let plain = ServiceError::kafka(
            "produce",
            KafkaError::MessageProduction(RDKafkaErrorCode::UnsupportedFeature),
        );
        assert_eq!(plain.fault(), Fault::Broker);
        assert!(plain.is_retriable());

        let delivery = ServiceError::delivery(
            "flush",
            &KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
        );
        assert!(delivery.is_retriable());
        assert_eq!(
            delivery.kafka_code(),
            Some(RDKafkaErrorCode::MessageTimedOut)
        );
    }

    #[test]
    fn the_kafka_error_is_the_source_and_printed_once() {
        let cause = KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced);
        let fenced = ServiceError::kafka("commit transaction", cause.clone());
        let source = std::error::Error::source(&fenced).expect("the client's error");
        assert_eq!(source.to_string(), cause.to_string());
        let text = chain(&fenced);
        assert_eq!(
            text,
            format!("commit transaction{FENCED}: {cause}"),
            "the cause after the message"
        );
        assert_eq!(text.matches(&cause.to_string()).count(), 1, "{text}");

        let delivery = ServiceError::delivery(
            "flush",
            &KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
        );
        let text = chain(&delivery);
        assert!(text.starts_with("flush: delivery failed: "), "{text}");

        let unsupported = ServiceError::kafka_txn(
            "begin transaction (probe)",
            KafkaError::MessageProduction(RDKafkaErrorCode::UnsupportedFeature),
        );
        let cause = std::error::Error::source(&unsupported).unwrap().to_string();
        assert_eq!(chain(&unsupported).matches(&cause).count(), 1);
    }

    #[test]
    fn io_and_thread_errors_keep_their_cause() {
        let io = ServiceError::io(
            "cannot create /s",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert_eq!(io.fault(), Fault::Store);
        assert!(!io.is_retriable());
        assert_eq!(io.to_string(), "cannot create /s");
        assert_eq!(
            chain(&io),
            format!(
                "cannot create /s: {}",
                std::io::Error::from(std::io::ErrorKind::PermissionDenied)
            )
        );

        let thread = ServiceError::thread(
            "the restore thread",
            std::io::Error::other("out of threads"),
        );
        assert_eq!(thread.fault(), Fault::Internal);
        assert!(thread.is_retriable());
        assert_eq!(
            chain(&thread),
            "cannot start the restore thread: out of threads"
        );

        let listen = ServiceError::listen(
            "metrics.listen",
            "127.0.0.1:9464".parse().unwrap(),
            std::io::Error::from(std::io::ErrorKind::AddrInUse),
        );
        assert_eq!(listen.fault(), Fault::Usage);
        assert!(!listen.is_retriable());
        assert!(chain(&listen).starts_with("cannot listen on metrics.listen 127.0.0.1:9464: "));

        let bad = ServiceError::address("metrics.listen", "x".parse::<SocketAddr>().unwrap_err());
        assert_eq!(bad.fault(), Fault::Usage);
        assert_eq!(chain(&bad), "metrics.listen: invalid socket address syntax");

        assert!(ServiceError::broker("restore cancelled by a rebalance").is_retriable());
        assert_eq!(ServiceError::internal("x").fault(), Fault::Internal);
        assert!(ServiceError::internal("x").is_retriable());
        let slow = ServiceError::slow_store("a state write outlasted 30 s");
        assert_eq!(
            (slow.fault(), slow.retry()),
            (Fault::Store, RetryHint::WithBackoff)
        );
        let config = ServiceError::config("topics [\"x\"] do not exist");
        assert_eq!(
            (config.fault(), config.retry()),
            (Fault::Usage, RetryHint::NoRetry)
        );
    }

    #[test]
    fn store_errors_are_fatal_and_keep_their_cause() {
        let e: ServiceError = StoreError::Corrupt {
            path: "/x".into(),
            key: b"c".to_vec(),
            why: "truncated".into(),
        }
        .into();
        assert_eq!(e.fault(), Fault::Store);
        assert!(!e.is_retriable());
        assert_eq!(
            chain(&e),
            "state store: corrupt state record in /x (key [99]): truncated"
        );

        let e: ServiceError = StoreError::Io {
            path: "/x/outbox".into(),
            source: std::io::Error::other("disk full"),
        }
        .into();
        assert_eq!(chain(&e), "state store: cannot write /x/outbox: disk full");
    }
}
