use std::collections::HashMap;

use super::score::{Aggregator, TimeUnit};
use super::*;
use crate::input::Vote;
use crate::time::parse_timestamp;

pub(super) fn cfg() -> EngineConfig {
    EngineConfig {
        window_ns: 60 * NANOS_PER_SEC,
        window_seconds: 60.0,
        grace_ns: 5 * NANOS_PER_SEC,
        max_votes: 1000,
        initial_score: 0.5,
        initial_gap_ns: 3600 * NANOS_PER_SEC,
        min_votes: 2,
        retention_ns: 2_592_000 * NANOS_PER_SEC,
        defaults: RubricParams {
            lambda: 0.01,
            time_unit: TimeUnit::Seconds,
            variance_threshold: 0.05,
            aggregator: Aggregator::Mean,
            temperature: 0.5,
            reputation_model: super::reputation::Model::Noise,
        },
        rubrics: HashMap::new(),
        query_index: true,
        companions: Vec::new(),
        reputation: super::reputation::ReputationParams {
            mode: super::reputation::Mode::Off,
            epoch_ns: 86_400 * NANOS_PER_SEC,
            prior_votes: 20.0,
            noise_floor: 0.03,
            min_weight: 0.2,
            max_weight: 3.0,
            confusion: Default::default(),
        },
    }
}

pub(super) fn vote(inf: &str, voter: &str, value: Option<f64>, ts: &str) -> Vote {
    Vote {
        inference_id: inf.into(),
        voter_id: voter.into(),
        voter_prompt_id: "r".into(),
        value,
        timestamp: parse_timestamp(ts).unwrap(),
        vote_id: None,
        model_id: None,
        weight: 1.0,
        inference_time: None,
    }
}

fn run(e: &mut Engine, votes: &[Vote]) -> (Vec<ScoreUpdate>, Vec<Outcome>) {
    let mut out = Vec::new();
    let outcomes = votes.iter().map(|v| e.process(v, &mut out)).collect();
    (out, outcomes)
}

#[test]
fn humanjudge_single_flag_after_seven_seconds() {
    let mut e = Engine::new(cfg());
    let mut v = vote("i", "a", Some(0.0), "2024-01-01T00:00:07Z");
    v.inference_time = Some(parse_timestamp("2024-01-01T00:00:00Z").unwrap());
    let (mut out, _) = run(&mut e, &[v]);
    e.close_all(&mut out);
    assert_eq!(out.len(), 1);
    let u = &out[0];
    assert!((u.alpha - 0.9324).abs() < 5e-5);
    assert!((u.score - 0.4662).abs() < 5e-5);
    assert_eq!(u.delta_t_seconds, 7.0);
    assert_eq!(u.update_seq, 1);
    assert_eq!(u.previous_score, 0.5);
}

#[test]
fn watermark_closes_windows_and_rejects_late_votes() {
    let mut e = Engine::new(cfg());
    let (out, _) = run(
        &mut e,
        &[
            vote("i", "a", Some(1.0), "2024-01-01T00:00:10Z"),
            vote("i", "b", Some(0.0), "2024-01-01T00:00:50Z"),
            // watermark 00:01:00 closes [00:00, 00:01)
            vote("j", "a", Some(1.0), "2024-01-01T00:01:05Z"),
        ],
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].votes.len(), 2);
    assert!(out[0].ambiguous);
    let (_, outcomes) = run(&mut e, &[vote("i", "c", Some(1.0), "2024-01-01T00:00:59Z")]);
    assert!(matches!(&outcomes[0], Outcome::Late(r) if r.reason == Reason::Late));
    // within grace: window [00:01, 00:02) is still open at watermark 00:01:00
    let (_, outcomes) = run(&mut e, &[vote("j", "c", Some(1.0), "2024-01-01T00:01:00Z")]);
    assert_eq!(outcomes[0], Outcome::Accepted);
}

#[test]
fn duplicates_are_dropped_before_lateness_and_do_not_move_the_watermark() {
    let mut e = Engine::new(cfg());
    let mut v = vote("i", "a", Some(1.0), "2024-01-01T00:00:10Z");
    v.vote_id = Some("x".into());
    let (_, o) = run(&mut e, &[v.clone(), v.clone()]);
    assert_eq!(o, vec![Outcome::Accepted, Outcome::Duplicate]);
    let wm = e.watermark();
    run(&mut e, &[vote("k", "a", Some(1.0), "2024-01-01T00:05:00Z")]);
    // now the window of v is closed, but a redelivery is still a duplicate
    let (_, o) = run(&mut e, std::slice::from_ref(&v));
    assert_eq!(o, vec![Outcome::Duplicate]);
    assert_ne!(e.watermark(), wm);
    // same vote_id in another series is another vote
    let mut w = v.clone();
    w.voter_prompt_id = "other".into();
    w.timestamp = parse_timestamp("2024-01-01T00:05:01Z").unwrap();
    let (_, o) = run(&mut e, &[w]);
    assert_eq!(o, vec![Outcome::Accepted]);
}

#[test]
fn supersede_keeps_the_later_vote_of_a_voter() {
    let mut e = Engine::new(cfg());
    let (mut out, _) = run(
        &mut e,
        &[
            vote("i", "a", Some(1.0), "2024-01-01T00:00:20Z"),
            vote("i", "a", Some(0.0), "2024-01-01T00:00:10Z"), // earlier: loses
            vote("i", "b", Some(0.5), "2024-01-01T00:00:30Z"),
            // tie: later arrival wins (a vote_id, or it would be a duplicate)
            Vote {
                vote_id: Some("again".into()),
                ..vote("i", "b", None, "2024-01-01T00:00:30Z")
            },
        ],
    );
    e.close_all(&mut out);
    assert_eq!(out.len(), 1);
    let u = &out[0];
    assert_eq!(u.votes.len(), 1);
    assert_eq!(u.votes[0].value, Some(1.0));
    assert_eq!(u.superseded, 2);
    assert_eq!(u.abstentions, 1);
    assert_eq!(e.counters.superseded, 2);
}

#[test]
fn full_batches_close_at_once_and_a_new_batch_opens() {
    let mut c = cfg();
    c.max_votes = 2;
    let mut e = Engine::new(c);
    let (mut out, _) = run(
        &mut e,
        &[
            vote("i", "a", Some(1.0), "2024-01-01T00:00:01Z"),
            vote("i", "b", Some(1.0), "2024-01-01T00:00:02Z"),
            vote("i", "a", Some(0.0), "2024-01-01T00:00:03Z"),
        ],
    );
    assert_eq!(out.len(), 1);
    assert_eq!(e.open_batches(), 1);
    e.close_all(&mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].update_seq, 2);
    assert_eq!(out[1].superseded, 0);
}

#[test]
fn abstention_only_batches_emit_nothing() {
    let mut e = Engine::new(cfg());
    let (mut out, _) = run(&mut e, &[vote("i", "a", None, "2024-01-01T00:00:01Z")]);
    e.close_all(&mut out);
    assert!(out.is_empty());
    let key = SeriesKey {
        inference_id: "i".into(),
        voter_prompt_id: "r".into(),
    };
    assert_eq!(e.series(&key).unwrap().abstentions, 1);
    assert_eq!(e.series(&key).unwrap().update_seq, 0);
}

#[test]
fn zero_window_is_one_window_per_instant() {
    let mut c = cfg();
    c.window_ns = 0;
    c.grace_ns = 0;
    let mut e = Engine::new(c);
    let (out, o) = run(
        &mut e,
        &[
            vote("i", "a", Some(1.0), "2024-01-01T00:00:01Z"),
            vote("i", "b", Some(1.0), "2024-01-01T00:00:01Z"),
            vote("i", "c", Some(1.0), "2024-01-01T00:00:02Z"),
            vote("i", "d", Some(1.0), "2024-01-01T00:00:02Z"),
        ],
    );
    assert!(o.iter().all(|x| *x == Outcome::Accepted));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].votes.len(), 2);
    assert_eq!(out[0].window_end, None);
    let (_, o) = run(&mut e, &[vote("i", "e", Some(1.0), "2024-01-01T00:00:01Z")]);
    assert!(matches!(o[0], Outcome::Late(_)));
}

#[test]
fn retention_forgets_old_identities() {
    let mut c = cfg();
    c.retention_ns = 3600 * NANOS_PER_SEC;
    c.window_ns = 86_400 * NANOS_PER_SEC;
    let mut e = Engine::new(c);
    let v = vote("i", "a", Some(1.0), "2024-01-01T00:00:00Z");
    run(
        &mut e,
        &[v.clone(), vote("j", "a", Some(1.0), "2024-01-01T01:00:05Z")],
    );
    // watermark 01:00:00: exactly the retention, not more → still a duplicate
    let (_, o) = run(&mut e, std::slice::from_ref(&v));
    assert_eq!(o, vec![Outcome::Duplicate]);
    run(&mut e, &[vote("j", "b", Some(1.0), "2024-01-01T01:00:06Z")]);
    let (_, o) = run(&mut e, std::slice::from_ref(&v));
    assert_eq!(o, vec![Outcome::Accepted]);
}

#[test]
fn an_identity_accepted_again_reports_the_vote_time_it_replaces() {
    let mut c = cfg();
    c.retention_ns = 3600 * NANOS_PER_SEC;
    c.window_ns = 60 * NANOS_PER_SEC;
    let mut e = Engine::new(c);
    let with_id = |ts| Vote {
        vote_id: Some("v1".into()),
        ..vote("i", "a", Some(1.0), ts)
    };
    let drain = |e: &mut Engine| {
        let mut seen = Vec::new();
        e.drain_changes(|c| {
            if let Change::Dedupe(id, at, before, _) = c {
                seen.push((id, at, before));
            }
        });
        seen
    };
    let first = with_id("2024-01-01T00:00:00Z");
    run(&mut e, std::slice::from_ref(&first));
    let stored = drain(&mut e);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].2, None);
    run(&mut e, &[vote("j", "b", Some(1.0), "2024-01-01T02:00:00Z")]);
    let again = with_id("2024-01-01T02:00:01Z");
    let (_, o) = run(&mut e, std::slice::from_ref(&again));
    assert_eq!(o, vec![Outcome::Accepted]);
    let changes = drain(&mut e);
    let mine: Vec<_> = changes.iter().filter(|c| c.0 == stored[0].0).collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].1, again.timestamp);
    assert_eq!(mine[0].2, Some(first.timestamp));
    // Written once, nothing is replaced any more.
    assert!(drain(&mut e).is_empty());
}

/// A model of the state store: the records the engine's changes make.
#[derive(Default)]
pub(super) struct Model {
    pub(super) meta: Meta,
    series: HashMap<SeriesKey, SeriesState>,
    batches: BTreeMap<BatchKey, Batch>,
    dedupe: HashMap<u128, Nanos>,
    /// The vote each identity names: series, voter, and its value when
    /// contract §14 collects.
    identity_votes: HashMap<u128, (SeriesKey, Id, Option<Option<f64>>)>,
    voters: std::collections::BTreeSet<(SeriesKey, String)>,
    board: HashMap<BoardKey, BoardRow>,
    agreement: BTreeMap<String, agreement::RubricSums>,
    reviewers: BTreeMap<(String, String), agreement::ReviewerStats>,
    /// Each series' open values, as its record holds them.
    series_open: HashMap<SeriesKey, Vec<(reputation::Epoch, Id, reputation::OpenValue)>>,
    pub(super) terms: BTreeMap<reputation::TermsKey, reputation::Terms>,
    pub(super) pending: BTreeMap<u64, Pending>,
}

impl Model {
    /// The open values a restore finds: of the epochs the watermark has
    /// not sealed, those its series' records hold, and those of the
    /// identities (as `OpenFold` folds them).
    pub(super) fn open(
        &self,
        cfg: &EngineConfig,
    ) -> BTreeMap<reputation::OpenKey, (reputation::OpenValue, Held)> {
        let p = &cfg.reputation;
        let sealed = self.meta.watermark.map(|wm| p.sealed_by(wm));
        let is_open = |epoch: reputation::Epoch| sealed.is_none_or(|s| epoch > s);
        let mut fold = OpenFold::default();
        for (series, values) in &self.series_open {
            for (epoch, voter, v) in values {
                if is_open(*epoch) {
                    fold.record((*epoch, series.clone(), voter.clone()), *v, Held::Series);
                }
            }
        }
        for (id, (series, voter, value)) in &self.identity_votes {
            let at = self.dedupe[id];
            let epoch = p.epoch_of(cfg.window_start(at));
            if let (Some(value), true) = (value, is_open(epoch)) {
                let v = reputation::OpenValue {
                    timestamp: at,
                    value: *value,
                };
                fold.identity((epoch, series.clone(), voter.clone()), v);
            }
        }
        fold.finish().map(|(k, v, held)| (k, (v, held))).collect()
    }

    /// The leaderboard computed from scratch from the stored series.
    fn board_from_series(&self) -> HashMap<BoardKey, BoardRow> {
        let mut rows: HashMap<BoardKey, BoardRow> = HashMap::new();
        for (k, s) in &self.series {
            let (key, row) = board::placement(&k.voter_prompt_id, s);
            if let Some(row) = row {
                rows.entry(key).or_default().add(&row);
            }
        }
        rows
    }

    /// Stored `pending` of every series equals the entries of its stored
    /// open batches; the stored board equals one computed from the series.
    fn check_derived(&self) {
        for (k, s) in &self.series {
            let n: usize = self
                .batches
                .iter()
                .filter(|(b, _)| b.series == *k)
                .map(|(_, b)| b.entries.len())
                .sum();
            assert_eq!(s.pending, n as u64, "pending of {k:?}");
        }
        assert_eq!(self.board, self.board_from_series());
    }

    pub(super) fn persist(&mut self, e: &mut Engine) {
        for k in e.reviewers_unknown() {
            let stored = self.reviewers.get(&(k.0.to_string(), k.1.to_string()));
            e.provide_reviewer(&k, stored.copied());
        }
        e.drain_changes(|c| match c {
            Change::Series(k, s, open) => {
                self.series.insert(k.clone(), s.clone());
                let open = open.iter().map(|(e, v, x)| (e, v.clone(), x)).collect();
                self.series_open.insert(k.clone(), open);
            }
            Change::Batch(k, Some(b)) => {
                self.batches.insert(k.clone(), b.clone());
            }
            Change::Batch(k, None) => {
                self.batches.remove(k);
            }
            Change::Dedupe(id, t, _, voted) => {
                self.dedupe.insert(id, t);
                match voted {
                    Some(v) => {
                        self.voters.insert((v.series.clone(), v.voter.to_owned()));
                        let vote = (v.series.clone(), v.voter.into(), v.open);
                        self.identity_votes.insert(id, vote);
                    }
                    None => {
                        self.identity_votes.remove(&id);
                    }
                }
            }
            Change::Meta(m) => self.meta = *m,
            Change::Board(k, Some(r)) => {
                self.board.insert(k.clone(), *r);
            }
            Change::Board(k, None) => {
                self.board.remove(k);
            }
            Change::Agreement(k, a) => {
                self.agreement.insert(k.to_owned(), *a);
            }
            Change::Reviewer((r, v), st) => {
                self.reviewers.insert((r.to_string(), v.to_string()), *st);
            }
            Change::OpenUnitGone(epoch, series) => {
                panic!("no format-9 unit was restored: {epoch} {series:?}")
            }
            Change::OpenValueGone(k) => panic!("no format-8 record was restored: {k:?}"),
            Change::Terms(k, t) => {
                assert!(
                    self.terms.insert(k.clone(), t.clone()).is_none(),
                    "{k:?} sealed twice"
                );
            }
            Change::Pending(order, Some(p)) => {
                self.pending.insert(order, p.clone());
            }
            Change::Pending(order, None) => {
                assert!(self.pending.remove(&order).is_some(), "{order} not stored");
            }
        });
    }

    fn restore(&self) -> Engine {
        self.restore_with(cfg())
    }

    pub(super) fn restore_with(&self, cfg: EngineConfig) -> Engine {
        let series: Vec<_> = self
            .batches
            .keys()
            .chain(self.pending.values().map(|p| &p.key))
            .map(|k| (k.series.clone(), self.series[&k.series].clone()))
            .collect();
        let open = self.open(&cfg);
        let mut e = Engine::restore(cfg, self.meta, series, self.batches.clone(), false);
        e.restore_reputation(
            open.into_iter().map(|(k, (v, held))| (k, v, held)),
            self.terms.iter().map(|(k, t)| (k.clone(), t.clone())),
            self.pending.iter().map(|(o, p)| (*o, p.clone())),
        );
        e.restore_board(self.board.clone());
        e.restore_agreement(
            self.agreement
                .iter()
                .map(|(k, a)| (Id::from(k.as_str()), *a)),
        );
        e
    }

    pub(super) fn load(&self, e: &mut Engine, v: &Vote) {
        let w = e.wants(v);
        if let Some(k) = w.series {
            let s = self.series.get(&k).cloned();
            e.provide_series(k, s);
        }
        if let Some(id) = w.identity {
            e.provide_identity(id, self.dedupe.get(&id).copied());
        }
    }
}

#[test]
fn changes_round_trip_through_restore() {
    let mut e = Engine::new(cfg());
    run(
        &mut e,
        &[
            vote("i", "a", Some(1.0), "2024-01-01T00:00:01Z"),
            vote("i", "b", Some(0.0), "2024-01-01T00:01:10Z"),
        ],
    );
    let mut m = Model::default();
    m.persist(&mut e);
    assert_eq!(m.batches.len(), 1);
    let mut r = m.restore();
    assert_eq!(r.cached(), (1, 0), "only the open batch's series is loaded");
    let mut a = Vec::new();
    let mut b = Vec::new();
    let next = vote("i", "c", Some(0.5), "2024-01-01T00:01:20Z");
    e.process(&next, &mut a);
    m.load(&mut r, &next);
    r.process(&next, &mut b);
    e.close_all(&mut a);
    r.close_all(&mut b);
    assert_eq!(a, b);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].update_seq, 2);
}

#[test]
fn an_empty_cache_gives_the_same_answers_as_a_full_one() {
    // Duplicates across evictions, series scored again after eviction,
    // open batches across persists.
    let with_model = |mut v: Vote, m: &str| {
        v.model_id = Some(m.into());
        v
    };
    let votes = [
        vote("i", "a", Some(1.0), "2024-01-01T00:00:01Z"),
        vote("j", "a", Some(0.0), "2024-01-01T00:00:02Z"),
        vote("k", "a", Some(0.9), "2024-01-01T00:00:03Z"),
        vote("k", "b", Some(0.1), "2024-01-01T00:00:04Z"),
        vote("i", "a", Some(1.0), "2024-01-01T00:00:01Z"),
        vote("i", "b", Some(0.0), "2024-01-01T00:01:10Z"),
        vote("j", "b", None, "2024-01-01T00:01:11Z"),
        vote("i", "a", Some(1.0), "2024-01-01T00:00:01Z"),
        vote("i", "c", Some(0.5), "2024-01-01T00:03:20Z"),
        vote("j", "c", Some(0.5), "2024-01-01T00:05:20Z"),
        vote("j", "b", None, "2024-01-01T00:01:11Z"),
        // A series scored without a model gets one: its row moves.
        with_model(vote("k", "c", Some(0.2), "2024-01-01T00:05:21Z"), "m1"),
        with_model(vote("i", "d", Some(0.3), "2024-01-01T00:05:22Z"), "m1"),
        // Reviewer "a" in units after evictions: read back, added to.
        with_model(vote("k", "a", Some(0.4), "2024-01-01T00:05:25Z"), "m1"),
        with_model(vote("i", "a", Some(0.6), "2024-01-01T00:05:30Z"), "m1"),
    ];
    let mut full = Engine::new(cfg());
    let (mut want, want_o) = run(&mut full, &votes);
    full.close_all(&mut want);

    let mut m = Model::default();
    let mut e = Engine::new(cfg());
    let mut got = Vec::new();
    let mut got_o = Vec::new();
    for (i, v) in votes.iter().enumerate() {
        m.load(&mut e, v);
        got_o.push(e.process(v, &mut got));
        m.persist(&mut e);
        m.check_derived();
        e.evict(0);
        assert!(!e.is_complete());
        if i % 3 == 2 {
            // A restart now and then: only open batches come back.
            e = m.restore();
        }
    }
    e.close_all(&mut got);
    assert_eq!(got_o, want_o);
    assert_eq!(got, want);
    assert!(want_o.contains(&Outcome::Duplicate));
    m.persist(&mut e);
    m.check_derived();
    let mut whole = Model::default();
    whole.persist(&mut full);
    assert_eq!(m.board, whole.board);
    assert_eq!(m.voters, whole.voters);
    assert_eq!(m.agreement, whole.agreement);
    assert_eq!(m.reviewers, whole.reviewers);
    // Units: k's first window (a, b), k's and i's last (c, a; d, a).
    assert_eq!(m.agreement["r"].units, 3, "{:?}", m.agreement);
    assert_eq!(m.reviewers[&("r".to_owned(), "a".to_owned())].rated, 3);
    let rows: Vec<_> = m
        .board
        .iter()
        .map(|(k, r)| (k.model_id.as_deref(), &*k.voter_prompt_id, r.series))
        .collect();
    assert!(rows.contains(&(Some("m1"), "r", 2)), "{rows:?}");
    let voters_of_i: Vec<&str> = m
        .voters
        .iter()
        .filter(|(k, _)| &*k.inference_id == "i")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(voters_of_i, ["a", "b", "c", "d"]);
}

#[test]
fn eviction_keeps_dirty_and_pinned_entries() {
    let mut e = Engine::new(cfg());
    run(&mut e, &[vote("i", "a", Some(1.0), "2024-01-01T00:00:01Z")]);
    assert!(e.cache_bytes() > 0);
    e.evict(0);
    assert_eq!(e.cached(), (1, 1), "dirty entries stay");
    assert!(e.is_complete());
    e.drain_changes(|_| {});
    e.evict(0);
    assert_eq!(e.cached(), (1, 0), "the open batch pins its series");
    let mut out = Vec::new();
    e.close_all(&mut out);
    e.drain_changes(|_| {});
    e.evict(0);
    assert_eq!(e.cached(), (0, 0));
    assert_eq!(e.cache_bytes(), 0);
    assert!(!e.is_complete());
}

/// Bytes of a hash table's slots (`(K, V)` and a control byte each) from
/// its capacity: hashbrown's buckets are a power of two holding 7/8 of it.
fn table_bytes<K, V>(m: &rustc_hash::FxHashMap<K, V>) -> usize {
    if m.capacity() == 0 {
        return 0;
    }
    let buckets = (m.capacity() * 8).div_ceil(7).next_power_of_two();
    buckets * (std::mem::size_of::<(K, V)>() + 1)
}

#[test]
fn tables_stay_within_what_their_entries_are_charged() {
    let mut e = Engine::new(cfg());
    let votes: Vec<Vote> = (0..5000)
        .map(|i| {
            let ts = format!(
                "2024-01-01T{:02}:{:02}:{:02}Z",
                i / 3600,
                i / 60 % 60,
                i % 60
            );
            vote(
                &format!("inference-{i}"),
                &format!("voter-{}", i % 7),
                Some(1.0),
                &ts,
            )
        })
        .collect();
    run(&mut e, &votes);
    let mut out = Vec::new();
    e.close_all(&mut out);
    e.drain_changes(|_| {});
    let tables =
        |e: &Engine| table_bytes(&e.series) + table_bytes(&e.dedupe) + table_bytes(&e.reviewers);
    assert!(
        tables(&e) <= e.cache_bytes(),
        "{} > {}",
        tables(&e),
        e.cache_bytes()
    );
    for fraction in [2, 3, 5, 9, 17, 100] {
        let budget = e.cache_bytes() / fraction;
        e.evict(budget);
        assert!(
            e.cache_bytes() <= budget,
            "1/{fraction}: {} > {budget}, cached {:?}",
            e.cache_bytes(),
            e.cached()
        );
        assert!(
            tables(&e) <= e.cache_bytes(),
            "after evicting to 1/{fraction}: tables {} > charged {}",
            tables(&e),
            e.cache_bytes()
        );
    }
}

/// contract §13 computed directly, not by the recursion: each counted vote i of
/// update k weighs w = (1 − α_k) Π_{j>k} α_j · r_i / Σ r in the score, so
/// V = Σ w, effective_votes = (Σ w)² / Σ w², and the votes' part of the
/// score is p̂ = Σ_k (1 − α_k) Π_{j>k} α_j a_k / V (a_k the batch's
/// aggregate; Σ w v / V for the mean). The interval is Wilson's, written
/// out here again.
fn direct_certainty(series: &[ScoreUpdate], s0: f64) -> (Option<f64>, Option<(f64, f64)>) {
    let mut weights = Vec::new();
    let mut votes_part = 0.0;
    for (k, u) in series.iter().enumerate() {
        let later: f64 = series[k + 1..].iter().map(|x| x.alpha).product();
        let r_sum: f64 = u.votes.iter().map(|e| e.weight).sum();
        for e in &u.votes {
            weights.push((1.0 - u.alpha) * later * e.weight / r_sum);
        }
        votes_part += (1.0 - u.alpha) * later * u.aggregate;
    }
    let v: f64 = weights.iter().sum();
    let q: f64 = weights.iter().map(|w| w * w).sum();
    if v == 0.0 || q == 0.0 {
        return (None, None);
    }
    let n = v * v / q;
    let p = (votes_part / v).clamp(0.0, 1.0);
    let z = 1.959963984540054f64;
    let c = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let h = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    let prior = (1.0 - v) * s0;
    (Some(n), Some((prior + v * (c - h), prior + v * (c + h))))
}

fn weighted(inf: &str, voter: &str, value: f64, weight: f64, ts: &str) -> Vote {
    Vote {
        weight,
        ..vote(inf, voter, Some(value), ts)
    }
}

/// Every update of every series against [`direct_certainty`] over the
/// series' updates so far (within 1e-12).
fn assert_certainty_direct(out: &[ScoreUpdate], s0: f64) {
    let mut by_series: BTreeMap<SeriesKey, Vec<ScoreUpdate>> = BTreeMap::new();
    for u in out {
        let so_far = by_series.entry(u.series.clone()).or_default();
        so_far.push(u.clone());
        let (n, interval) = direct_certainty(so_far, s0);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        match (u.effective_votes, n) {
            (Some(a), Some(b)) => assert!(close(a, b), "effective_votes {a} vs direct {b}"),
            (a, b) => assert_eq!(a, b, "effective_votes"),
        }
        match (u.score_interval, interval) {
            (Some(a), Some(b)) => assert!(
                close(a.0, b.0) && close(a.1, b.1),
                "score_interval {a:?} vs direct {b:?}"
            ),
            (a, b) => assert_eq!(a, b, "score_interval"),
        }
        if let Some((low, high)) = u.score_interval {
            assert!(low <= u.score + 1e-12 && u.score <= high + 1e-12, "{u:?}");
        }
    }
}

#[test]
fn certainty_matches_the_per_vote_weights_on_hand_made_series() {
    let mut e = Engine::new(cfg());
    let (mut out, _) = run(
        &mut e,
        &[
            weighted("i", "a", 0.9, 1.0, "2024-01-01T00:00:10Z"),
            weighted("i", "b", 0.2, 0.5, "2024-01-01T00:00:20Z"),
            weighted("i", "c", 0.7, 2.0, "2024-01-01T00:00:30Z"),
            weighted("j", "a", 1.0, 1.0, "2024-01-01T00:00:31Z"),
            // 40 s later: α = e^(−0.4), the first batch still counts.
            weighted("i", "a", 0.4, 1.0, "2024-01-01T00:01:10Z"),
            weighted("i", "d", 0.6, 1.3, "2024-01-01T00:01:11Z"),
            weighted("j", "b", 0.0, 0.7, "2024-01-01T00:01:40Z"),
            weighted("i", "e", 1.0, 1.0, "2024-01-01T00:02:05Z"),
            weighted("i", "a", 0.0, 0.2, "2024-01-01T00:03:00Z"),
            weighted("i", "b", 0.3, 1.0, "2024-01-01T00:03:01Z"),
        ],
    );
    e.close_all(&mut out);
    assert_eq!(
        out.iter()
            .filter(|u| &*u.series.inference_id == "i")
            .count(),
        4
    );
    assert!(
        out.iter().any(|u| u.alpha > 0.1),
        "a decay that keeps old votes"
    );
    assert_certainty_direct(&out, 0.5);
    // Old batches count for less: fewer effective votes than votes.
    let last = out
        .iter()
        .rev()
        .find(|u| &*u.series.inference_id == "i")
        .unwrap();
    assert!(last.effective_votes.unwrap() < last.series_votes as f64);
}

#[test]
fn certainty_edge_cases() {
    // One vote: one effective vote, the Wilson interval of one trial.
    let mut e = Engine::new(cfg());
    let (mut out, _) = run(&mut e, &[vote("i", "a", Some(1.0), "2024-01-01T00:00:10Z")]);
    e.close_all(&mut out);
    assert!((out[0].effective_votes.unwrap() - 1.0).abs() < 1e-12);
    assert_certainty_direct(&out, 0.5);

    // All-equal votes of equal weight: n effective votes; the interval of
    // p̂ = 1 ends at 1.
    let mut e = Engine::new(cfg());
    let votes: Vec<Vote> = (0..5)
        .map(|k| vote("i", &format!("v{k}"), Some(1.0), "2024-01-01T00:00:10Z"))
        .collect();
    let (mut out, _) = run(&mut e, &votes);
    e.close_all(&mut out);
    assert!((out[0].effective_votes.unwrap() - 5.0).abs() < 1e-9);
    assert!((out[0].score_interval.unwrap().1 - out[0].score).abs() < 1e-12);
    assert_certainty_direct(&out, 0.5);

    // λ = 0: the score never leaves the initial score, no evidence.
    let mut c = cfg();
    c.defaults.lambda = 0.0;
    c.initial_score = 0.3;
    let mut e = Engine::new(c);
    let (mut out, _) = run(
        &mut e,
        &[
            vote("i", "a", Some(1.0), "2024-01-01T00:00:10Z"),
            vote("i", "a", Some(0.0), "2024-01-01T00:02:10Z"),
        ],
    );
    e.close_all(&mut out);
    assert_eq!(out.len(), 2);
    for u in &out {
        assert_eq!((u.effective_votes, u.score_interval), (None, None));
        assert_eq!(u.score, 0.3);
    }
    assert_certainty_direct(&out, 0.3);

    // power_mean: p̂ from the batches' aggregates, not their mean votes.
    let mut c = cfg();
    c.defaults.aggregator = Aggregator::PowerMean;
    c.defaults.temperature = 0.2;
    c.defaults.lambda = 0.005;
    let mut e = Engine::new(c);
    let (mut out, _) = run(
        &mut e,
        &[
            weighted("i", "a", 0.9, 1.0, "2024-01-01T00:00:10Z"),
            weighted("i", "b", 0.1, 2.0, "2024-01-01T00:00:20Z"),
            weighted("i", "a", 0.8, 1.0, "2024-01-01T00:01:30Z"),
            weighted("i", "c", 0.0, 1.0, "2024-01-01T00:01:35Z"),
            weighted("i", "d", 0.6, 0.5, "2024-01-01T00:03:35Z"),
        ],
    );
    e.close_all(&mut out);
    assert_eq!(out.len(), 3);
    assert!(out.iter().any(|u| (u.aggregate - u.mean_vote).abs() > 0.01));
    assert_certainty_direct(&out, 0.5);
}

/// A batch whose pinned series is missing at its close (excluded by the
/// engine's rules: a bug) loses no update silently: the engine reports an
/// inconsistency naming the series, which the shells turn into a fatal
/// store error.
#[test]
fn a_missing_pinned_series_is_reported_not_dropped() {
    let mut e = Engine::new(cfg());
    let (out, _) = run(
        &mut e,
        &[
            vote("i", "a", Some(1.0), "2024-01-01T00:00:00Z"),
            vote("i", "b", Some(0.0), "2024-01-01T00:00:01Z"),
        ],
    );
    assert!(out.is_empty());
    assert_eq!(e.take_inconsistency(), None);
    let key = e.series.keys().next().cloned().unwrap();
    e.series.clear();
    let mut out = Vec::new();
    e.close_all(&mut out);
    assert!(out.is_empty());
    let i = e.take_inconsistency().expect("reported");
    assert_eq!(i.series, key);
    assert!(i.what.contains("not in the cache"), "{}", i.what);
    // Reported once.
    assert_eq!(e.take_inconsistency(), None);
}
