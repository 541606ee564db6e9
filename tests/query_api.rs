//! The query API (contract §9) of `jurystream run` against a real
//! Kafka-protocol broker (tansu on loopback), two instances of one group
//! that know each other (`api.peers`). Skipped when tansu is not installed,
//! unless JURYSTREAM_REQUIRE_BROKER=1 (then it fails; see docs/testing.md).

mod kafka_support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kafka_support::prometheus::{prometheus_installed, Prometheus};
use kafka_support::*;
use serde_json::{json, Value};

const TOKEN: &str = "s3cret-token";

/// One broker test at a time: they are heavy on a 2-core machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Votes on ids that need percent-encoding, and an integer id, written
/// before the generated stream (their timestamps are its first).
const SPECIAL: &[(&str, &str)] = &[
    (r#""q/a b%2F?#é""#, "q/a b%2F?#é"),
    (r#""ünï cødé \"quoted\"""#, "ünï cødé \"quoted\""),
    ("12345", "12345"),
];

fn special_lines() -> String {
    let mut out = String::new();
    for (i, (json_id, _)) in SPECIAL.iter().enumerate() {
        for v in 0..3 {
            out.push_str(&format!(
                "{{\"inference_id\": {json_id}, \"voter_id\": \"sv{v}\", \"voter_prompt_id\": \"accuracy\", \
                 \"vote\": {}, \"timestamp\": \"2024-07-07T00:00:00.00{v}Z\", \"vote_id\": \"special-{i}-{v}\", \
                 \"model_id\": \"gpt-4o\"}}\n",
                ["0.9", "\"flag\"", "null"][v]
            ));
        }
    }
    out
}

/// Every byte but RFC 3986's unreserved ones percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `GET path` with an optional bearer token: (status, content type, body).
fn get(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default();
    Some((code, ctype, body.to_owned()))
}

/// A 200 answer's JSON body, or None for anything else (503 while a
/// partition is restoring or the group rebalances).
fn get_ok(port: u16, path: &str) -> Option<Value> {
    match get(port, path, Some(TOKEN))? {
        (200, _, body) => Some(serde_json::from_str(&body).unwrap()),
        _ => None,
    }
}

/// The series a replay of `input` leaves, per inference id (inspect's
/// objects), from `replay --state-dir`.
fn replay_state(config: &Path, input: &Path, dir: &Path) -> BTreeMap<String, Vec<Value>> {
    run_ok(
        "replay",
        config,
        input,
        &["--state-dir".as_ref(), dir.as_os_str()],
    );
    let mut ids = BTreeSet::new();
    for line in std::fs::read_to_string(input).unwrap().lines() {
        if let Ok(v) = serde_json::from_str::<Value>(line) {
            ids.insert(match &v["inference_id"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        }
    }
    ids.into_iter()
        .map(|id| {
            let doc = jurystream::inspect::inspect(dir, &id, 0.5).unwrap();
            (id, doc["series"].as_array().unwrap().clone())
        })
        .collect()
}

/// Distinct voter ids per (inference id, rubric) among the parseable lines
/// (the generator's only other rejects are exact redeliveries).
fn voters_of(input: &Path) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<_, BTreeSet<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(input).unwrap().lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let id = match &v["inference_id"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let rubric = v["voter_prompt_id"].as_str().unwrap().to_owned();
        out.entry((id, rubric))
            .or_default()
            .insert(v["voter_id"].as_str().unwrap().to_owned());
    }
    out
}

/// What `/v1/inferences/{id}` must answer, from inspect's series objects.
fn expected_inference(
    id: &str,
    series: &[Value],
    voters: &BTreeMap<(String, String), BTreeSet<String>>,
) -> Value {
    let mut rows: Vec<Value> = series
        .iter()
        .map(|s| {
            let rubric = s["voter_prompt_id"].as_str().unwrap();
            let scored = s["update_seq"].as_u64().unwrap() >= 1;
            let vs: Vec<&String> = voters[&(id.to_owned(), rubric.to_owned())].iter().collect();
            json!({
                "voter_prompt_id": rubric,
                "model_id": s["model_id"],
                "score": if scored { s["score"].clone() } else { Value::Null },
                "update_seq": s["update_seq"],
                "last_vote_at": if scored { s["last_vote_at"].clone() } else { Value::Null },
                "votes": s["votes"],
                "abstentions": s["abstentions"],
                "ambiguous": s["ambiguous"],
                "pending_votes": 0,
                "voters": vs,
                "voters_truncated": false,
                "effective_votes": s["effective_votes"],
                "score_interval": s["score_interval"],
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        a["voter_prompt_id"]
            .as_str()
            .unwrap()
            .cmp(b["voter_prompt_id"].as_str().unwrap())
    });
    json!({ "inference_id": id, "series": rows })
}

/// The leaderboard computed from the replay's final series (contract §9, §13:
/// `score_sd` by the two-pass formula, its interval of the mean).
fn expected_board(state: &BTreeMap<String, Vec<Value>>) -> Vec<Value> {
    /// (series, score sum, ambiguous series, votes, scores)
    type Row = (u64, f64, u64, u64, Vec<f64>);
    let mut acc: BTreeMap<(String, Option<String>), Row> = BTreeMap::new();
    for s in state.values().flatten() {
        if s["update_seq"].as_u64().unwrap() == 0 {
            continue;
        }
        let key = (
            s["voter_prompt_id"].as_str().unwrap().to_owned(),
            s["model_id"].as_str().map(str::to_owned),
        );
        let e = acc.entry(key).or_default();
        e.0 += 1;
        e.1 += s["score"].as_f64().unwrap();
        e.2 += u64::from(s["ambiguous"].as_bool().unwrap());
        e.3 += s["votes"].as_u64().unwrap();
        e.4.push(s["score"].as_f64().unwrap());
    }
    let mut rows: Vec<Value> = acc
        .into_iter()
        .map(|((rubric, model), (n, sum, amb, votes, scores))| {
            let mean = sum / n as f64;
            let sd = (n >= 2).then(|| {
                let ss: f64 = scores.iter().map(|s| (s - mean) * (s - mean)).sum();
                (ss / (n - 1) as f64).sqrt()
            });
            let interval = sd.map(|sd| {
                let half = 1.959963984540054 * sd / (n as f64).sqrt();
                json!([mean - half, mean + half])
            });
            json!({
                "model_id": model,
                "voter_prompt_id": rubric,
                "series": n,
                "mean_score": mean,
                "ambiguous_series": amb,
                "votes": votes,
                "score_sd": sd,
                "mean_score_interval": interval,
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        let r = |v: &Value| v["voter_prompt_id"].as_str().unwrap().to_owned();
        let m = |v: &Value| v["mean_score"].as_f64().unwrap();
        r(a).cmp(&r(b))
            .then(m(b).total_cmp(&m(a)))
            .then(a["model_id"].as_str().cmp(&b["model_id"].as_str()))
    });
    rows
}

/// Whether a served leaderboard equals the expected one (means, sds and
/// intervals within 1e-9: the service sums in fixed point, the test in f64).
fn same_board(have: &Value, want: &[Value]) -> bool {
    let Some(rows) = have["rows"].as_array() else {
        return false;
    };
    let near = |h: &Value, w: &Value| match (h.as_f64(), w.as_f64()) {
        (Some(h), Some(w)) => (h - w).abs() < 1e-9,
        _ => h.is_null() && w.is_null(),
    };
    let near_pair = |h: &Value, w: &Value| {
        (h.is_null() && w.is_null())
            || (h.as_array().is_some_and(|a| a.len() == 2)
                && near(&h[0], &w[0])
                && near(&h[1], &w[1]))
    };
    rows.len() == want.len()
        && rows.iter().zip(want).all(|(h, w)| {
            [
                "model_id",
                "voter_prompt_id",
                "series",
                "ambiguous_series",
                "votes",
            ]
            .iter()
            .all(|k| h[*k] == w[*k])
                && near(&h["mean_score"], &w["mean_score"])
                && near(&h["score_sd"], &w["score_sd"])
                && near_pair(&h["mean_score_interval"], &w["mean_score_interval"])
        })
}

/// A 400 with a JSON error.
fn json_error_early(port: u16, path: &str) {
    let (code, _, body) = get(port, path, Some(TOKEN)).unwrap();
    assert_eq!(code, 400, "{path}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
}

#[test]
fn two_instances_answer_what_a_replay_leaves() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "query", 4, "exactly_once_outbox", "");
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 3_000, 21);
    let generated = std::fs::read_to_string(&input).unwrap();
    std::fs::write(&input, special_lines() + &generated).unwrap();
    let expected_events = replay(&setup.config, &input);
    let state = replay_state(&setup.config, &input, &setup.dir.path().join("replay"));
    let voters = voters_of(&input);
    let board = expected_board(&state);
    assert!(state.len() > 300 && board.len() >= 9, "{board:?}");
    assert!(board
        .iter()
        .any(|r| r["ambiguous_series"].as_u64().unwrap() > 0));
    assert!(board
        .iter()
        .all(|r| r["score_sd"].as_f64().is_some_and(|sd| sd > 0.0)));

    setup.produce(&input);
    let (pa, pb) = (free_port(), free_port());
    let peers = format!("[\"http://127.0.0.1:{pa}\", \"http://127.0.0.1:{pb}\"]");
    let env = [
        ("JURYSTREAM_API__PEERS", peers.as_str()),
        ("JURYSTREAM_API__TOKEN", TOKEN),
    ];
    // Prometheus scrapes both instances from their start (the PromQL α
    // below sums their counters).
    let prom = prometheus_installed().then(|| Prometheus::start(&[pa, pb]));
    let a = instance_with(&setup, "a", "a", &format!("127.0.0.1:{pa}"), None, &env);
    let b = instance_with(&setup, "b", "b", &format!("127.0.0.1:{pb}"), None, &env);
    wait_for_events(&setup, &expected_events, Duration::from_secs(240), &a);
    wait_for(
        "both instances to hold partitions (their metrics)",
        Duration::from_secs(120),
        || (!a.ready_partitions().is_empty() && !b.ready_partitions().is_empty()).then_some(()),
    );

    // Both answer the whole group's leaderboard, and it is the replay's.
    for port in [pa, pb] {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let have = get_ok(port, "/v1/leaderboard").unwrap_or(Value::Null);
            if same_board(&have, &board) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "port {port} answers\n{have:#}\nnot\n{board:#?}\n{}",
                log_tail(&a)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The filter keeps one rubric's rows.
    let safety: Vec<Value> = board
        .iter()
        .filter(|r| r["voter_prompt_id"] == "safety")
        .cloned()
        .collect();
    let filtered = get_ok(pb, "/v1/leaderboard?voter_prompt_id=safety").unwrap();
    assert!(same_board(&filtered, &safety), "{filtered:#}");

    // Reviewer agreement (contract §11): the group's sums equal one offline
    // pass over the same log exactly, from either instance.
    let offline = agreement_of(&setup.config, &input);
    let rows = offline["voters"].as_array().unwrap();
    assert!(
        offline["rubrics"].as_array().unwrap().len() >= 3 && rows.len() >= 10,
        "{offline}"
    );
    for port in [pa, pb] {
        assert_eq!(
            get_ok(port, "/v1/rubrics").unwrap()["rubrics"],
            offline["rubrics"],
            "port {port}"
        );
    }
    let voter_ids: BTreeSet<&str> = rows
        .iter()
        .map(|r| r["voter_id"].as_str().unwrap())
        .collect();
    for (i, v) in voter_ids.iter().enumerate() {
        let want: Vec<&Value> = rows.iter().filter(|r| r["voter_id"] == *v).collect();
        let port = [pa, pb][i % 2];
        let have = get_ok(port, &format!("/v1/voters/{}", encode(v))).unwrap();
        // contract §14's weight and table_until, and §15's model and side
        // weights: null in reputation.mode off.
        const LEARNED: [&str; 5] = [
            "weight",
            "table_until",
            "model",
            "pass_weight",
            "flag_weight",
        ];
        let have: Vec<Value> = have["voters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let mut r = r.clone();
                let o = r.as_object_mut().unwrap();
                for field in LEARNED {
                    let v = o.remove(field);
                    assert_eq!(v, Some(Value::Null), "{field} of {v:?}");
                }
                r
            })
            .collect();
        let have: Vec<&Value> = have.iter().collect();
        assert_eq!(have, want, "voter {v} on port {port}");
    }
    let mut safety: Vec<&Value> = rows
        .iter()
        .filter(|r| r["voter_prompt_id"] == "safety")
        .collect();
    safety.sort_by(|a, b| {
        let d = |r: &Value| r["mean_sq_deviation"].as_f64().unwrap();
        d(b).total_cmp(&d(a))
            .then_with(|| a["voter_id"].as_str().cmp(&b["voter_id"].as_str()))
    });
    let top = get_ok(
        pa,
        "/v1/voters?voter_prompt_id=safety&order=deviation&limit=5",
    )
    .unwrap();
    let top: Vec<&Value> = top["voters"].as_array().unwrap().iter().collect();
    assert_eq!(top, safety[..5].to_vec());
    json_error_early(pa, "/v1/voters?order=deviation");
    json_error_early(pa, "/v1/voters?voter_prompt_id=safety&limit=0");
    let (code, _, _) = get(pb, "/v1/voters/nobody-at-all", Some(TOKEN)).unwrap();
    assert_eq!(code, 404);
    // The counters of both instances, summed by PromQL, give the same α
    // (partitions moved between the instances as the second joined), and
    // their leaderboard gauges the same score_sd (contract §13).
    if let Some(prom) = &prom {
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Some(wrong) = prom
            .agreement_mismatch(&offline)
            .or_else(|| prom.score_sd_mismatch(&board))
        {
            assert!(Instant::now() < deadline, "{wrong}\n{}", prom.log());
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    // Every inference, from either instance, is the replay's series.
    for (id, series) in &state {
        let want = expected_inference(id, series, &voters);
        for port in [pa, pb] {
            let path = format!("/v1/inferences/{}", encode(id));
            let have = get_ok(port, &path)
                .unwrap_or_else(|| panic!("{path} on {port}: {:?}", get(port, &path, Some(TOKEN))));
            assert_eq!(have, want, "{path} on port {port}");
        }
    }

    // The operator's client prints the same.
    let (_, id) = SPECIAL[0];
    let out = Command::new(BIN)
        .args([
            "query",
            "--url",
            &format!("http://127.0.0.1:{pa}"),
            "--inference",
            id,
        ])
        .env("JURYSTREAM_API__TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed, expected_inference(id, &state[id], &voters));

    // Errors: JSON with the contract's status.
    let json_error = |port: u16, path: &str, token: Option<&str>, status: u16| {
        let (code, ctype, body) = get(port, path, token).unwrap();
        assert_eq!(code, status, "{path}: {body}");
        assert!(ctype.starts_with("application/json"), "{path}: {ctype}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    };
    json_error(pa, "/v1/inferences/no-such-inference", Some(TOKEN), 404);
    json_error(pa, "/v1/inferences/bad%zzid", Some(TOKEN), 400);
    json_error(pa, "/v1/inferences/inf-1", None, 401);
    json_error(pb, "/v1/leaderboard", Some("wrong"), 401);
    json_error(pb, "/v1/nothing-here", Some(TOKEN), 404);
    // Metrics stay open without the token.
    assert_eq!(get(pa, "/metrics", None).map(|r| r.0), Some(200));
}

#[test]
fn a_restoring_partition_answers_503_not_a_stale_answer() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "qrestore", 2, "exactly_once_outbox", "");
    let input = setup.dir.path().join("votes.jsonl");
    generate_votes(&input, 20_000, 23);
    setup.produce(&input);
    let expected = replay(&setup.config, &input);
    let a = instance(&setup, "a", "a", "127.0.0.1:0", None);
    wait_for_events(&setup, &expected, Duration::from_secs(240), &a);
    drop(a);
    // B starts from an empty state directory and rebuilds it from the
    // changelog: until it holds both partitions it must not answer.
    let port = free_port();
    let _b = instance(&setup, "b", "b", &format!("127.0.0.1:{port}"), None);
    let mut seen: Vec<u16> = Vec::new();
    let board = wait_for("a 200 leaderboard", Duration::from_secs(180), || {
        let r = get(port, "/v1/leaderboard", None);
        let code = r.as_ref().map(|r| r.0);
        if let Some(c) = code {
            if seen.last() != Some(&c) {
                seen.push(c);
            }
        }
        r.filter(|r| r.0 == 200).map(|r| r.2)
    });
    assert_eq!(seen.first(), Some(&503), "statuses seen: {seen:?}");
    assert!(
        seen.iter().all(|c| *c == 503 || *c == 200),
        "statuses seen: {seen:?}"
    );
    let board: Value = serde_json::from_str(&board).unwrap();
    let votes: u64 = board["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["votes"].as_u64().unwrap())
        .sum();
    let scored: u64 = expected
        .iter()
        .filter(|e| e["type"] == "score_updated")
        .map(|e| e["batch"]["votes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        votes, scored,
        "the first answer is the whole restored state"
    );
}

/// `/healthz` and `/metrics` answer within 100 ms (p99) while the query
/// API is asked its heaviest answers in a loop: `/v1/voters` with
/// `limit=10000` (of 12 000 reviewers) and `/v1/leaderboard`. Store reads,
/// merges and encoding run off the runtime that serves health.
#[test]
fn health_answers_within_100_ms_p99_under_query_load() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "qhealth", 2, "exactly_once_outbox", "");
    // 6 000 inferences, each reviewed by two reviewers of their own, one
    // second apart: 12 000 reviewers of rubric "r" with a unit each.
    let input = setup.dir.path().join("votes.jsonl");
    let mut lines = String::new();
    for i in 0..6_000u64 {
        for (v, value) in [(2 * i, 1.0), (2 * i + 1, 0.0)] {
            let t = format!(
                "2024-07-07T{:02}:{:02}:{:02}Z",
                9 + i / 3600,
                i / 60 % 60,
                i % 60
            );
            lines.push_str(&format!(
                "{{\"inference_id\":\"inf-{i}\",\"voter_id\":\"rev-{v:05}\",\"voter_prompt_id\":\"r\",\
                 \"vote\":{value},\"timestamp\":\"{t}\",\"model_id\":\"m\"}}\n"
            ));
        }
    }
    std::fs::write(&input, lines).unwrap();
    setup.produce(&input);
    let svc = instance(&setup, "a", "a", "127.0.0.1:0", None);
    let voters = "/v1/voters?voter_prompt_id=r&limit=10000";
    wait_for(
        "10 000 reviewers in the answer",
        Duration::from_secs(300),
        || {
            let (code, body) = svc.get(voters)?;
            let v: Value = serde_json::from_str(&body).ok()?;
            (code == 200 && v["voters"].as_array()?.len() == 10_000).then_some(())
        },
    );
    let port = svc.port.unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (load, health) = std::thread::scope(|s| {
        let load: Vec<_> = [voters, voters, voters, "/v1/leaderboard"]
            .into_iter()
            .map(|path| {
                let stop = &stop;
                s.spawn(move || {
                    let mut answered = 0u32;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let code = get(port, path, None).map(|r| r.0);
                        assert_eq!(code, Some(200), "{path}");
                        answered += 1;
                    }
                    answered
                })
            })
            .collect();
        let mut health = Vec::new();
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            for path in ["/healthz", "/metrics"] {
                let t = Instant::now();
                let code = get(port, path, None).map(|r| r.0);
                health.push((path, t.elapsed(), code));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let load: Vec<u32> = load.into_iter().map(|h| h.join().unwrap()).collect();
        (load, health)
    });
    // The load was real: every loop got answers throughout.
    assert!(
        load.iter().all(|n| *n >= 3),
        "answers per load loop: {load:?}"
    );
    for path in ["/healthz", "/metrics"] {
        let mut ms: Vec<f64> = health
            .iter()
            .filter(|(p, ..)| *p == path)
            .map(|(_, d, code)| {
                assert_eq!(*code, Some(200), "{path}");
                d.as_secs_f64() * 1e3
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        assert!(ms.len() >= 100, "{path}: {} samples", ms.len());
        let p99 = ms[(ms.len() * 99).div_ceil(100) - 1];
        eprintln!(
            "{path} under load: {} requests, p50 {:.1} ms, p99 {p99:.1} ms, max {:.1} ms; load answers {load:?}",
            ms.len(),
            ms[ms.len() / 2],
            ms[ms.len() - 1]
        );
        assert!(p99 < 100.0, "{path}: p99 {p99:.1} ms under load");
    }
}

/// The query API as its OpenAPI document (served at `/v1/openapi.json`)
/// describes it, checked by schemathesis against a running instance with
/// data and a token: no 5xx, every answer as documented.
#[test]
fn the_query_api_answers_as_its_openapi_document_says() {
    let _g = serial();
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "qopenapi", 2, "exactly_once_outbox", "");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/votes.jsonl");
    setup.produce(&input);
    let expected = replay(&setup.config, &input);
    let a = instance_with(
        &setup,
        "a",
        "a",
        "127.0.0.1:0",
        None,
        &[("JURYSTREAM_API__TOKEN", TOKEN)],
    );
    wait_for_events(&setup, &expected, Duration::from_secs(240), &a);
    let base = format!("http://127.0.0.1:{}", a.port.unwrap());
    // The document it serves is the one in the repository.
    let (code, ctype, served) = get(a.port.unwrap(), "/v1/openapi.json", Some(TOKEN)).unwrap();
    assert_eq!((code, ctype.as_str()), (200, "application/json"));
    assert_eq!(served, jurystream::api::http::OPENAPI);
    let auth = format!("Authorization: Bearer {TOKEN}");
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api/openapi.json");
    schemathesis(schema.to_str().unwrap(), &base, &["-H", &auth]);
}
