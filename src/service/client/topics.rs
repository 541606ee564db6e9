//! Creates the topics the service needs when they are missing.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::config::Config;
use crate::kafka::client_config;
use crate::service::client::Names;
use crate::service::error::{Result, ServiceError};

/// Partition counts of `topics` (missing topics are absent from the map).
pub fn partition_counts(
    cfg: &Config,
    topics: &[String],
) -> Result<std::collections::HashMap<String, i32>> {
    let consumer: BaseConsumer = client_config(cfg)
        .create()
        .map_err(|e| ServiceError::kafka("create the metadata client", e))?;
    let mut out = std::collections::HashMap::new();
    for t in topics {
        let md = consumer
            .fetch_metadata(Some(t), Duration::from_secs(10))
            .map_err(|e| ServiceError::kafka(&format!("metadata for {t}"), e))?;
        for mt in md.topics() {
            if mt.error().is_none() && !mt.partitions().is_empty() {
                out.insert(mt.name().to_owned(), mt.partitions().len() as i32);
            }
        }
    }
    Ok(out)
}

/// Makes sure the input, output and changelog topics exist. With
/// `kafka.create_topics = false` a missing topic is a fatal error.
pub fn ensure(cfg: &Config, names: &Names) -> Result<()> {
    let k = &cfg.kafka;
    let mut plain: Vec<String> = k.input_topics.clone();
    plain.push(cfg.outputs.scores_topic.clone());
    plain.push(cfg.outputs.flags_topic.clone());
    plain.push(cfg.outputs.dlq_topic.clone());
    let have = partition_counts(cfg, &plain)?;
    let missing: Vec<&String> = plain.iter().filter(|t| !have.contains_key(*t)).collect();
    if !missing.is_empty() && !k.create_topics {
        return Err(ServiceError::config(format!(
            "topics {missing:?} do not exist and kafka.create_topics is false"
        )));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServiceError::thread("the tokio runtime", e))?;
    let admin: AdminClient<DefaultClientContext> = client_config(cfg)
        .create()
        .map_err(|e| ServiceError::kafka("create the admin client", e))?;
    let rf = k.replication_factor as i32;
    let new: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|t| NewTopic::new(t, k.topic_partitions as i32, TopicReplication::Fixed(rf)))
        .collect();
    create(&rt, &admin, &new)?;
    // Changelogs: compacted, as many partitions as their input topic.
    let inputs = partition_counts(cfg, &k.input_topics)?;
    let changelogs: Vec<String> = k.input_topics.iter().map(|t| names.changelog(t)).collect();
    let have_cl = partition_counts(cfg, &changelogs)?;
    let mut new_cl = Vec::new();
    for t in &k.input_topics {
        let cl = names.changelog(t);
        let want = *inputs.get(t).ok_or_else(|| {
            ServiceError::broker(format!("input topic {t} has no partitions yet"))
        })?;
        match have_cl.get(&cl) {
            Some(&n) if n < want => {
                return Err(ServiceError::config(format!(
                    "changelog topic {cl} has {n} partitions but input topic {t} has {want}: \
                     state could not follow its partitions"
                )))
            }
            Some(_) => {}
            None if k.create_topics => new_cl.push((cl, want)),
            None => {
                return Err(ServiceError::config(format!(
                    "changelog topic {cl} does not exist and kafka.create_topics is false"
                )))
            }
        }
    }
    let mut new: Vec<NewTopic<'_>> = new_cl
        .iter()
        .map(|(t, n)| {
            NewTopic::new(t, *n, TopicReplication::Fixed(rf))
                .set("cleanup.policy", "compact")
                // Records of an interrupted cycle are overwritten by the next
                // owner; compaction must not drop the committed values they
                // shadow before that happens.
                .set("min.compaction.lag.ms", "86400000")
        })
        .collect();
    // contract §14's sealed sums: compacted (one final record per key).
    let reputation = &cfg.reputation.topic;
    if cfg.reputation.mode != crate::engine::reputation::Mode::Off
        && !partition_counts(cfg, std::slice::from_ref(reputation))?.contains_key(reputation)
    {
        if !k.create_topics {
            return Err(ServiceError::config(format!(
                "reputation topic {reputation} does not exist and kafka.create_topics is false"
            )));
        }
        new.push(
            NewTopic::new(
                reputation,
                k.topic_partitions as i32,
                TopicReplication::Fixed(rf),
            )
            .set("cleanup.policy", "compact"),
        );
    }
    create(&rt, &admin, &new)
}

fn create(
    rt: &tokio::runtime::Runtime,
    admin: &AdminClient<DefaultClientContext>,
    topics: &[NewTopic<'_>],
) -> Result<()> {
    if topics.is_empty() {
        return Ok(());
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = rt
        .block_on(admin.create_topics(topics, &opts))
        .map_err(|e| ServiceError::kafka("create topics", e))?;
    for r in results {
        match r {
            Ok(t) => tracing::info!(topic = %t, "created topic"),
            Err((t, RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(topic = %t, "topic exists")
            }
            Err((t, code)) => {
                return Err(ServiceError::kafka(
                    &format!("create topic {t}"),
                    rdkafka::error::KafkaError::AdminOp(code),
                ))
            }
        }
    }
    Ok(())
}
