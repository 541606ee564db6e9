//! The process's metrics registered: every family with its help text,
//! as the exposition shows them ([`Metrics::with_reputation`]).

use super::*;

impl Metrics {
    pub fn new(max_label_values: usize) -> std::sync::Arc<Metrics> {
        Self::with_reputation(max_label_values, false)
    }

    /// [`Metrics::new`], with contract §14's metrics when `reputation` (modes
    /// `shadow` and `learned`).
    pub fn with_reputation(max_label_values: usize, reputation: bool) -> std::sync::Arc<Metrics> {
        let mut registry = Registry::default();
        let r = &mut registry;
        let by_source = Family::<SourceLabel, Counter>::default();
        let accepted =
            VOTE_SOURCES.map(|source| by_source.get_or_create(&SourceLabel { source }).clone());
        register(
            r,
            VOTES_ACCEPTED,
            "Votes accepted into a batch, by where they came from.",
            by_source,
            true,
        );
        let duplicate = Counter::default();
        register(
            r,
            VOTES_DUPLICATE,
            "Redelivered votes dropped as duplicates.",
            duplicate.clone(),
            true,
        );
        let superseded = Counter::default();
        register(
            r,
            VOTES_SUPERSEDED,
            "Votes replaced by a later vote of the same voter in a batch.",
            superseded.clone(),
            true,
        );
        let rejected = Family::<ReasonLabel, Counter>::default();
        // Every reason is exported from the start, at 0.
        for reason in crate::input::Reason::ALL {
            rejected.get_or_create_owned(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        register(
            r,
            VOTES_REJECTED,
            "Messages sent to the DLQ, by reason.",
            rejected.clone(),
            true,
        );
        let abstentions = Counter::default();
        register(
            r,
            ABSTENTIONS,
            "Abstentions (null votes) in closed batches.",
            abstentions.clone(),
            true,
        );
        let families = SeriesFamilies {
            updates: Family::default(),
            flags: Family::default(),
            freshness: Family::new_with_constructor(|| histogram(FRESHNESS_BUCKETS)),
            score: Family::new_with_constructor(|| histogram(SCORE_BUCKETS)),
            last_freshness: Family::default(),
            last_update: Family::default(),
        };
        register(
            r,
            SCORE_UPDATES,
            "score_updated events emitted.",
            families.updates.clone(),
            true,
        );
        register(
            r,
            AMBIGUITY_FLAGS,
            "ambiguity_flagged events emitted.",
            families.flags.clone(),
            true,
        );
        register(
            r,
            FRESHNESS,
            "Freshness (1 - alpha) of score updates.",
            families.freshness.clone(),
            false,
        );
        register(
            r,
            SCORE,
            "Scores after update.",
            families.score.clone(),
            false,
        );
        register(
            r,
            LAST_FRESHNESS,
            "Freshness of the latest score update.",
            families.last_freshness.clone(),
            false,
        );
        register(
            r,
            LAST_SCORE_UPDATE,
            "Wall-clock time of the latest score update (Unix seconds).",
            families.last_update.clone(),
            false,
        );
        let batch_votes = histogram(BATCH_VOTE_BUCKETS);
        register(
            r,
            BATCH_VOTES,
            "Counted votes per scored batch.",
            batch_votes.clone(),
            false,
        );
        let batch_variance = histogram(VARIANCE_BUCKETS);
        register(
            r,
            BATCH_VARIANCE,
            "Weighted vote variance per scored batch.",
            batch_variance.clone(),
            false,
        );
        let open_batches = Gauge::default();
        register(
            r,
            OPEN_BATCHES,
            "Batches open (waiting for their window to close).",
            open_batches.clone(),
            false,
        );
        let cache_bytes = Gauge::default();
        register(
            r,
            CACHE_BYTES,
            "Approximate bytes of series states and vote identities cached in memory (state.cache_mb bounds it).",
            cache_bytes.clone(),
            false,
        );
        let watermark = Family::default();
        register(
            r,
            WATERMARK,
            "Event-time watermark per input partition (Unix seconds).",
            Family::clone(&watermark),
            false,
        );
        let partition_ready = Family::default();
        register(
            r,
            PARTITION_READY,
            "Input partitions this instance holds: 1 ready (restored, consuming), 0 being restored.",
            Family::clone(&partition_ready),
            false,
        );
        let lag = Family::default();
        register(
            r,
            CONSUMER_LAG,
            "Messages behind the end of each input partition (librdkafka statistics).",
            Family::clone(&lag),
            false,
        );
        let commit = histogram(SECONDS_BUCKETS);
        register(
            r,
            COMMIT_DURATION,
            "Duration of one commit cycle: the wait for the previous cycle's state write, then changelog, events and offsets (the state write itself runs after it, off the poll loop).",
            commit.clone(),
            false,
        );
        let vote_latency = histogram(LATENCY_BUCKETS);
        register(
            r,
            VOTE_COMMIT_LATENCY,
            "Time from an input record's read to the commit of its cycle (its events visible, its offset committed).",
            vote_latency.clone(),
            false,
        );
        let commit_in_flight = Gauge::default();
        register(
            r,
            COMMIT_IN_FLIGHT,
            "1 while a cycle's transaction commits off the poll loop (exactly_once; the next cycle is processed meanwhile), else 0.",
            commit_in_flight.clone(),
            false,
        );
        let restore = histogram(SECONDS_BUCKETS);
        register(
            r,
            RESTORE_DURATION,
            "Duration of one partition state restore.",
            restore.clone(),
            false,
        );
        let restored_records = Counter::default();
        register(
            r,
            RESTORED_RECORDS,
            "Changelog records applied by state restores.",
            restored_records.clone(),
            true,
        );
        let rebalances = Family::<EventLabel, Counter>::default();
        for event in ["assigned", "revoked", "lost"] {
            let _ = rebalances.get_or_create(&EventLabel { event });
        }
        register(
            r,
            REBALANCES,
            "Consumer group rebalances, by event (assigned, revoked, lost).",
            rebalances.clone(),
            true,
        );
        let revoke = histogram(SECONDS_BUCKETS);
        register(
            r,
            REVOKE_DURATION,
            "Duration of one hand-over of revoked partitions (finish or abort the open cycle, release the state).",
            revoke.clone(),
            false,
        );
        let outbox_recovered = Counter::default();
        register(
            r,
            OUTBOX_RECOVERED_CYCLES,
            "Outbox mode: cycles a restore found not marked delivered and completed.",
            outbox_recovered.clone(),
            true,
        );
        let outbox_republished = Counter::default();
        register(
            r,
            OUTBOX_REPUBLISHED,
            "Outbox mode: events of such cycles missing from the outputs, published by the restore.",
            outbox_republished.clone(),
            true,
        );
        let delivery_mode = Family::<ModeLabel, Gauge>::default();
        register(
            r,
            DELIVERY_MODE,
            "The delivery mode of run (kafka.delivery): 1 for the mode in use.",
            delivery_mode.clone(),
            false,
        );
        let board = Board {
            scores: Family::default(),
            squares: Family::default(),
            series: Family::default(),
            exported: FxHashSet::default(),
        };
        register(
            r,
            MODEL_SCORES,
            "Sum of the current scores of this instance's scored series, per model and rubric.",
            board.scores.clone(),
            false,
        );
        register(
            r,
            MODEL_SCORE_SQUARES,
            "Sum of the squared current scores of this instance's scored series, per model and rubric.",
            board.squares.clone(),
            false,
        );
        register(
            r,
            MODEL_SERIES,
            "Scored series (update_seq >= 1) this instance holds, per model and rubric.",
            board.series.clone(),
            false,
        );
        let agreement: [Family<Rubric, FloatCounter>; 4] = Default::default();
        for (family, (name, help)) in agreement.iter().zip([
            (
                AGREEMENT_PAIRABLE,
                "Counted votes in closed batches with at least two (pairable votes n of Krippendorff's alpha), per rubric.",
            ),
            (
                AGREEMENT_SUM,
                "Sum of the pairable votes' values (S1), per rubric.",
            ),
            (
                AGREEMENT_SQUARE_SUM,
                "Sum of the pairable votes' squared values (S2), per rubric.",
            ),
            (
                AGREEMENT_WITHIN,
                "Sum over batches of (m*sum(v^2) - sum(v)^2)/(m-1) (W); alpha = 1 - (n-1)*W/(n*S2 - S1^2), per rubric.",
            ),
        ]) {
            register(r, name, help, family.clone(), true);
        }
        let reputation = reputation.then(|| ReputationMetrics::register(r));
        build_info(r);

        std::sync::Arc::new(Metrics {
            reputation,
            registry,
            ready: AtomicBool::new(false),
            accepted,
            duplicate,
            superseded,
            abstentions,
            rejected,
            families,
            series: Mutex::new(SeriesTable {
                models: LabelCap::new(max_label_values),
                rubrics: LabelCap::new(max_label_values),
                series: FxHashMap::default(),
            }),
            batch_votes,
            batch_variance,
            open_batches,
            cache_bytes,
            watermark,
            partition_ready,
            held: Mutex::new(FxHashSet::default()),
            lag,
            commit,
            vote_latency,
            commit_in_flight,
            restore,
            restored_records,
            rebalances,
            revoke,
            outbox_recovered,
            outbox_republished,
            delivery_mode,
            board: Mutex::new(board),
            agreement,
            agreement_pending: Mutex::new(FxHashMap::default()),
            partitions: Mutex::new(Partitions::default()),
        })
    }
}
