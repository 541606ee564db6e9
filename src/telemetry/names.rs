//! Every metric and label name (contract §8), in one place: dashboards, alert
//! rules and the tests outside the project use them.

pub const VOTES_ACCEPTED: &str = "jurystream_votes_accepted_total";
pub const VOTES_DUPLICATE: &str = "jurystream_votes_duplicate_total";
pub const VOTES_SUPERSEDED: &str = "jurystream_votes_superseded_total";
pub const VOTES_REJECTED: &str = "jurystream_votes_rejected_total";
pub const ABSTENTIONS: &str = "jurystream_abstentions_total";
pub const SCORE_UPDATES: &str = "jurystream_score_updates_total";
pub const AMBIGUITY_FLAGS: &str = "jurystream_ambiguity_flags_total";
pub const FRESHNESS: &str = "jurystream_freshness";
pub const SCORE: &str = "jurystream_score";
pub const LAST_FRESHNESS: &str = "jurystream_last_freshness";
pub const LAST_SCORE_UPDATE: &str = "jurystream_last_score_update_timestamp_seconds";
pub const BATCH_VOTES: &str = "jurystream_batch_votes";
pub const BATCH_VARIANCE: &str = "jurystream_batch_variance";
pub const OPEN_BATCHES: &str = "jurystream_open_batches";
pub const CACHE_BYTES: &str = "jurystream_state_cache_bytes";
pub const WATERMARK: &str = "jurystream_watermark_timestamp_seconds";
/// Per input partition this instance holds: 1 ready, 0 being restored.
pub const PARTITION_READY: &str = "jurystream_partition_ready";
pub const CONSUMER_LAG: &str = "jurystream_consumer_lag_messages";
pub const COMMIT_DURATION: &str = "jurystream_commit_duration_seconds";
/// Per input record: from its read off the input partition to the commit
/// of its cycle (its events visible, its offset committed).
pub const VOTE_COMMIT_LATENCY: &str = "jurystream_vote_commit_latency_seconds";
/// `exactly_once`: 1 while a cycle's transaction commits off the poll loop
/// (the next cycle is read and processed meanwhile), else 0.
pub const COMMIT_IN_FLIGHT: &str = "jurystream_commit_in_flight";
pub const RESTORE_DURATION: &str = "jurystream_state_restore_duration_seconds";
pub const BUILD_INFO: &str = "jurystream_build_info";
/// Panics in any thread of the process (`run` and `connect`): each is a
/// bug, counted so that tests and alerts need no log.
pub const PANICS: &str = "jurystream_panics_total";
/// Changelog records the restores of this process applied.
pub const RESTORED_RECORDS: &str = "jurystream_state_restored_records_total";
/// Consumer group rebalances of this process, by `event` (`assigned`,
/// `revoked`, `lost`).
pub const REBALANCES: &str = "jurystream_rebalances_total";
/// Time to hand over revoked partitions (finish or abort the open cycle,
/// release the state).
pub const REVOKE_DURATION: &str = "jurystream_revoke_duration_seconds";
/// Outbox mode: cycles a restore found not marked delivered, whose
/// missing events it published (`jurystream_outbox_republished_events_total`).
pub const OUTBOX_RECOVERED_CYCLES: &str = "jurystream_outbox_recovered_cycles_total";
pub const OUTBOX_REPUBLISHED: &str = "jurystream_outbox_republished_events_total";
/// The delivery mode of `run` (`mode` label, value 1).
pub const DELIVERY_MODE: &str = "jurystream_delivery_mode";
/// contract §8 (v3 name; v2's `jurystream_model_score_sum` broke Prometheus'
/// rule that a `_sum` suffix belongs to a histogram or summary).
pub const MODEL_SCORES: &str = "jurystream_model_scores";
/// contract §13: with the two beside it, PromQL gives the leaderboard's
/// `score_sd` over every instance.
pub const MODEL_SCORE_SQUARES: &str = "jurystream_model_score_squares";
pub const MODEL_SERIES: &str = "jurystream_model_series";
/// Reviewer agreement sums (contract §11), per rubric; α over any range is
/// 1 − (n − 1)·W / (n·S2 − S1²) of their `increase()`s.
pub const AGREEMENT_PAIRABLE: &str = "jurystream_agreement_pairable_votes_total";
pub const AGREEMENT_SUM: &str = "jurystream_agreement_vote_sum_total";
pub const AGREEMENT_SQUARE_SUM: &str = "jurystream_agreement_vote_square_sum_total";
pub const AGREEMENT_WITHIN: &str = "jurystream_agreement_within_unit_total";

/// `jurystream connect` (contract §12; its own `/metrics`). Votes in, by
/// `source` (`api`: `POST /v1/votes`; `webhook`: Label Studio's webhooks;
/// `sync`: the periodic read of Label Studio's API) and `result`
/// (`produced`: acknowledged by the broker, including mapped votes `run`
/// will reject to its DLQ; `rejected`: refused by the §1 rules, never
/// produced; `failed`: not acknowledged in time, the request answered 503).
pub const CONNECT_VOTES: &str = "jurystream_connect_votes_total";
/// Label Studio webhooks received, by `action` (`ANNOTATION_CREATED`,
/// `ANNOTATION_UPDATED`, `ANNOTATIONS_DELETED`, else `other`).
pub const CONNECT_WEBHOOKS: &str = "jurystream_connect_webhooks_total";
/// Sync passes over Label Studio's API, by `result` (`ok`, `error`).
pub const CONNECT_SYNC_RUNS: &str = "jurystream_connect_sync_runs_total";
/// When the last sync pass succeeded (Unix seconds).
pub const CONNECT_LAST_SYNC: &str = "jurystream_connect_last_sync_timestamp_seconds";
/// Flags routed back to Label Studio, by `result` (`requested`: the task's
/// overlap raised and the task unlabelled; `at_cap`: already at
/// `label_studio.max_annotations`; `task_missing`: the task is gone;
/// `skipped`: no Label Studio vote in the flag; `error`: a Label Studio
/// call failed, retried).
pub const CONNECT_ROUTING: &str = "jurystream_connect_routing_total";
/// Time from a request's produce to the broker's last acknowledgement.
pub const CONNECT_PRODUCE_DURATION: &str = "jurystream_connect_produce_duration_seconds";
/// Label names of the connect metrics.
pub const SOURCE: &str = "source";
pub const RESULT: &str = "result";
pub const ACTION: &str = "action";

/// contract §14 (modes `shadow` and `learned` only): (e + 1)·E of the newest
/// epoch each of this instance's partitions has sealed (Unix seconds).
pub const REPUTATION_SEALED: &str = "jurystream_reputation_sealed_timestamp_seconds";
/// (k* + 1)·E, k* the newest epoch every input partition has sealed: the
/// newest table in use is T_{k*+2} (Unix seconds).
pub const REPUTATION_TABLE: &str = "jurystream_reputation_table_timestamp_seconds";
/// (series, epoch, reviewer) votes held for epochs not yet sealed.
pub const REPUTATION_OPEN_VALUES: &str = "jurystream_reputation_open_values";
/// Closed batches waiting at the barrier (`learned`).
pub const REPUTATION_PENDING: &str = "jurystream_reputation_pending_batches";
/// ω of each counted vote scored (`learned`), per rubric.
pub const REPUTATION_WEIGHT: &str = "jurystream_reputation_weight";
/// contract §15: the evidence g of each counted 0/1 vote scored with a
/// `confusion` table (`learned`), per rubric and side (`pass`, `flag`: the
/// vote's own side).
pub const REPUTATION_SIDE_WEIGHT: &str = "jurystream_reputation_side_weight";
/// contract §15: votes counted for the other side (a side worse than
/// chance), per rubric.
pub const REPUTATION_INVERTED: &str = "jurystream_reputation_inverted_votes_total";
/// The label of the side a vote was cast on (`pass`, `flag`).
pub const SIDE: &str = "side";

/// The label names (contract §8). No label ever carries an inference or voter id.
pub const MODEL_ID: &str = "model_id";
pub const VOTER_PROMPT_ID: &str = "voter_prompt_id";
pub const REASON: &str = "reason";
pub const PARTITION: &str = "partition";
pub const TOPIC: &str = "topic";
pub const VERSION: &str = "version";
/// The `model_id` of a score update without one.
pub const UNKNOWN_MODEL: &str = "unknown";
/// What a label value becomes once its label has `metrics.max_label_values`
/// distinct values.
pub const OTHER: &str = "other";

/// The content type of [`Metrics::render`]'s text (the Prometheus text
/// format 0.0.4, as before the move to `prometheus-client`).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";
