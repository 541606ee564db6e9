//! `jurystream connect`'s `POST /v1/votes` (contract §12) against the real
//! broker, with `run` scoring what it produces: votes answered by index
//! (objects, arrays, NDJSON), 401 without the token, 413 and 400, and every
//! accepted vote reaching `run` exactly as a replay of them says. Skipped
//! when tansu is not installed, unless JURYSTREAM_REQUIRE_BROKER=1.

mod kafka_support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kafka_support::*;
use serde_json::Value;

const TOKEN: &str = "connect-s3cret";

/// `connect` as a child process, with its listener on `port`.
pub struct Connect {
    child: Child,
    pub port: u16,
    pub log: std::path::PathBuf,
}

impl Connect {
    pub fn start(config: &Path, dir: &Path, env: &[(&str, &str)]) -> Connect {
        Self::start_on(free_port(), config, dir, env)
    }

    /// [`Connect::start`] on `port` (a restart keeps its address).
    pub fn start_on(port: u16, config: &Path, dir: &Path, env: &[(&str, &str)]) -> Connect {
        let log = dir.join(format!("connect-{port}.log"));
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(BIN)
            .args(["connect", "--config"])
            .arg(config)
            .env("JURYSTREAM_LOG", "info,rdkafka=warn")
            .env("JURYSTREAM_CONNECT__LISTEN", &listen)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .expect("start jurystream connect");
        let c = Connect { child, port, log };
        wait_for("connect's /readyz", Duration::from_secs(60), || {
            (request(port, "GET", "/readyz", &[], b"").map(|r| r.0) == Some(200)).then_some(())
        });
        c
    }

    /// `jurystream_panics_total` as connect's /metrics says it now.
    pub fn panics(&self) -> f64 {
        let (_, text) = request(self.port, "GET", "/metrics", &[], b"").expect("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix("jurystream_panics_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no jurystream_panics_total in\n{text}"))
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on a new connection: (status, body).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).ok()?;
    // A refused body (413) may close the connection before it is sent.
    let _ = s.write_all(body);
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

fn post_votes(port: u16, content_type: &str, body: &[u8]) -> (u16, Value) {
    let auth = format!("Bearer {TOKEN}");
    let (code, body) = request(
        port,
        "POST",
        "/v1/votes",
        &[("Authorization", &auth), ("Content-Type", content_type)],
        body,
    )
    .expect("connect answers");
    (
        code,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

/// The lines of [`generate_votes`] that are JSON (every one of them a
/// valid vote; redeliveries included).
fn valid_votes(setup: &Setup, n: usize, seed: u64) -> Vec<String> {
    let generated = setup.dir.path().join("generated.jsonl");
    generate_votes(&generated, n, seed);
    std::fs::read_to_string(&generated)
        .unwrap()
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).is_ok())
        .map(str::to_owned)
        .collect()
}

fn rejected(answer: &Value) -> Vec<(u64, String)> {
    answer["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["detail"].as_str().is_some_and(|d| !d.is_empty()), "{r}");
            (
                r["index"].as_u64().unwrap(),
                r["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn votes_are_answered_by_index_and_reach_run_exactly() {
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "connect", 2, "exactly_once_outbox", "");
    create_topic(&setup.bootstrap, &setup.input_topic, 2);
    // The generator's valid lines (its broken ones are the test's own below).
    let valid = valid_votes(&setup, 400, 5);
    assert!(valid.len() > 350);
    let svc = instance(&setup, "run", "a", "127.0.0.1:0", None);
    let connect = Connect::start(
        &setup.config,
        setup.dir.path(),
        &[
            ("JURYSTREAM_CONNECT__TOKEN", TOKEN),
            ("JURYSTREAM_CONNECT__MAX_BODY_BYTES", "200000"),
        ],
    );
    let port = connect.port;

    // No token: 401, JSON.
    let (code, body) = request(port, "POST", "/v1/votes", &[], valid[0].as_bytes()).unwrap();
    assert_eq!(code, 401, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string());

    // A JSON array with three bad votes among 100 good ones.
    let mut array: Vec<String> = valid[..100].to_vec();
    array.insert(5, r#"{"inference_id": "x", "voter_prompt_id": "r", "vote": 1, "timestamp": "2024-07-07T00:00:00Z"}"#.into());
    array.insert(50, r#"{"inference_id": "x", "voter_id": "v", "voter_prompt_id": "r", "vote": 2.5, "timestamp": "2024-07-07T00:00:00Z"}"#.into());
    array.insert(77, "\"not a vote\"".into());
    let body = format!("[{}]", array.join(",\n"));
    let (code, answer) = post_votes(port, "application/json", body.as_bytes());
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["accepted"], 100);
    assert_eq!(
        rejected(&answer),
        [
            (5, "missing_field".to_owned()),
            (50, "invalid_field".to_owned()),
            (77, "malformed_json".to_owned())
        ]
    );

    // NDJSON: the rest, with a blank line (not a vote) and a broken one.
    let mut lines: Vec<String> = valid[100..valid.len() - 1].to_vec();
    lines.insert(10, String::new());
    lines.insert(20, "{\"inference_id\": ".into());
    let (code, answer) = post_votes(port, "application/x-ndjson", lines.join("\n").as_bytes());
    assert_eq!(code, 200, "{answer}");
    assert_eq!(
        answer["accepted"].as_u64().unwrap() as usize,
        valid.len() - 101
    );
    // The blank line is not a vote: the broken one is vote 19.
    assert_eq!(rejected(&answer), [(19, "malformed_json".to_owned())]);

    // One object.
    let (code, answer) = post_votes(port, "application/json", valid.last().unwrap().as_bytes());
    assert_eq!(
        (code, answer["accepted"].as_u64()),
        (200, Some(1)),
        "{answer}"
    );

    // Too large: 413; neither JSON nor NDJSON: 400; both JSON errors.
    let big = format!("[{}]", vec![valid[0].as_str(); 2000].join(","));
    let (code, answer) = post_votes(port, "application/json", big.as_bytes());
    assert_eq!(code, 413, "{answer}");
    assert!(answer["error"].is_string(), "{answer}");
    let (code, answer) = post_votes(port, "application/json", b"hello");
    assert_eq!(code, 400, "{answer}");
    assert!(answer["error"].is_string(), "{answer}");

    // run scored exactly the accepted votes, in the order sent.
    let accepted = setup.dir.path().join("accepted.jsonl");
    std::fs::write(&accepted, valid.join("\n") + "\n").unwrap();
    let expected = replay(&setup.config, &accepted);
    assert!(expected.len() > 50);
    wait_for_events(&setup, &expected, Duration::from_secs(120), &svc);
    assert_same_events(&setup, &expected);

    // The counters say the same.
    let (_, metrics) = request(port, "GET", "/metrics", &[], b"").unwrap();
    for line in [
        format!(
            "jurystream_connect_votes_total{{result=\"produced\",source=\"api\"}} {}",
            valid.len()
        ),
        "jurystream_connect_votes_total{result=\"rejected\",source=\"api\"} 4".to_owned(),
    ] {
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
    assert_eq!(connect.panics(), 0.0);
    // Every vote carried `jurystream-source: api` to run (contract §12).
    let by = |source: &str| {
        svc.metric(&format!(
            "jurystream_votes_accepted_total{{source=\"{source}\"}}"
        ))
        .unwrap_or_else(|| panic!("no accepted votes series for source {source}"))
    };
    assert!(by("api") > 50.0, "{}", by("api"));
    for other in ["kafka", "webhook", "sync", "other"] {
        assert_eq!(by(other), 0.0, "{other}");
    }
}

/// With the broker stopped a request is answered 503 (JSON, Retry-After)
/// within `connect.produce_timeout_ms`; the same request sent again once
/// the broker is back is 200, and `run` scores every vote once.
#[test]
fn a_stopped_broker_is_a_503_and_the_retry_doubles_nothing() {
    let Some(mut broker) = broker_or_skip(Some("s3")) else {
        return;
    };
    // Members wait out the broker's restart (as in kafka_service's
    // broker_restart_mid_stream_is_ridden_out).
    let setup = Setup::at(
        &broker.bootstrap(),
        "connect503",
        1,
        "exactly_once_outbox",
        "",
        20_000,
    );
    create_topic(&setup.bootstrap, &setup.input_topic, 1);
    let valid = valid_votes(&setup, 200, 9);
    let (first, second) = valid.split_at(valid.len() / 2);
    let svc = instance(&setup, "run", "a", "127.0.0.1:0", None);
    let connect = Connect::start(
        &setup.config,
        setup.dir.path(),
        &[
            ("JURYSTREAM_CONNECT__TOKEN", TOKEN),
            ("JURYSTREAM_CONNECT__PRODUCE_TIMEOUT_MS", "3000"),
        ],
    );
    let ndjson = |votes: &[String]| votes.join("\n").into_bytes();
    let (code, answer) = post_votes(connect.port, "application/x-ndjson", &ndjson(first));
    assert_eq!(code, 200, "{answer}");

    broker.kill();
    let started = std::time::Instant::now();
    let (code, answer) = post_votes(connect.port, "application/x-ndjson", &ndjson(second));
    assert_eq!(code, 503, "{answer}");
    assert!(answer["error"].is_string(), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered after {:?}",
        started.elapsed()
    );

    broker.restart();
    wait_for(
        "the retry to be acknowledged",
        Duration::from_secs(120),
        || {
            let (code, answer) = post_votes(connect.port, "application/x-ndjson", &ndjson(second));
            (code == 200)
                .then(|| assert_eq!(answer["accepted"].as_u64(), Some(second.len() as u64)))
        },
    );
    let all = setup.dir.path().join("all.jsonl");
    std::fs::write(&all, valid.join("\n") + "\n").unwrap();
    let expected = replay(&setup.config, &all);
    wait_for_events(&setup, &expected, Duration::from_secs(300), &svc);
    assert_same_events(&setup, &expected);
}

/// `connect`'s routes as its OpenAPI document (served at
/// `/v1/openapi.json`) describes them, checked by schemathesis against a
/// running instance with a token: no 5xx, every answer as documented.
#[test]
fn connect_answers_as_its_openapi_document_says() {
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "copenapi", 1, "exactly_once_outbox", "");
    create_topic(&setup.bootstrap, &setup.input_topic, 1);
    let connect = Connect::start(
        &setup.config,
        setup.dir.path(),
        &[("JURYSTREAM_CONNECT__TOKEN", TOKEN)],
    );
    let auth = format!("Authorization: Bearer {TOKEN}");
    let (code, served) = request(
        connect.port,
        "GET",
        "/v1/openapi.json",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        b"",
    )
    .unwrap();
    assert_eq!(code, 200);
    assert_eq!(served, jurystream::connect::http::OPENAPI);
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/connect/openapi.json");
    let base = format!("http://127.0.0.1:{}", connect.port);
    schemathesis(schema.to_str().unwrap(), &base, &["-H", &auth]);
    assert_eq!(connect.panics(), 0.0);
}

/// contract §12 (v4): told to stop (SIGTERM), connect answers `/readyz` 503
/// at once, keeps serving votes for `connect.drain_seconds`, then exits
/// with status 0.
#[test]
fn sigterm_answers_503_serves_the_drain_then_exits() {
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "drain", 1, "at_least_once", "");
    create_topic(&setup.bootstrap, &setup.input_topic, 1);
    let valid = valid_votes(&setup, 20, 11);
    let mut connect = Connect::start(
        &setup.config,
        setup.dir.path(),
        &[
            ("JURYSTREAM_CONNECT__TOKEN", TOKEN),
            ("JURYSTREAM_CONNECT__DRAIN_SECONDS", "4"),
        ],
    );
    let port = connect.port;
    let told = std::time::Instant::now();
    unsafe {
        libc::kill(connect.child.id() as i32, libc::SIGTERM);
    }
    wait_for("/readyz 503 after SIGTERM", Duration::from_secs(3), || {
        (request(port, "GET", "/readyz", &[], b"").map(|r| r.0) == Some(503)).then_some(())
    });
    // Out of rotation, still serving: a vote is produced.
    assert_eq!(
        request(port, "GET", "/healthz", &[], b"").map(|r| r.0),
        Some(200)
    );
    let (code, answer) = post_votes(port, "application/json", valid[0].as_bytes());
    assert_eq!(
        (code, answer["accepted"].as_u64()),
        (200, Some(1)),
        "{answer}"
    );
    assert!(
        connect.child.try_wait().unwrap().is_none(),
        "connect exited before its drain ended"
    );
    let status = wait_for("connect to exit", Duration::from_secs(30), || {
        connect.child.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}");
    assert!(
        told.elapsed() >= Duration::from_secs(4),
        "exited {:?} after SIGTERM, before the drain ended",
        told.elapsed()
    );
}

fn sigterm(child: &Child) {
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
}

/// contract §12 (v4): two connect instances behind a real load balancer
/// (haproxy, health check on `/readyz`, no retries) restart one after the
/// other while a client posts a vote every 20 ms through the balancer:
/// every post is answered 200, and `run` scores every vote exactly once,
/// none late and nothing in the DLQ. What makes it work is the drain: an
/// instance told to stop answers `/readyz` 503 and serves on until the
/// balancer has taken it out (with `drain_seconds = 0` 3 of 198 posts
/// failed with the balancer's 503).
#[test]
fn a_rolling_restart_behind_a_load_balancer_loses_no_vote() {
    let Some(broker) = broker_or_skip(None) else {
        return;
    };
    let setup = Setup::new(&broker, "lbroll", 1, "at_least_once", "");
    let text = std::fs::read_to_string(&setup.config).unwrap().replace(
        "idle_flush_seconds = 2",
        "window_seconds = 1\ngrace_seconds = 1\nidle_flush_seconds = 2",
    );
    std::fs::write(&setup.config, text).unwrap();
    create_topic(&setup.bootstrap, &setup.input_topic, 1);
    let svc = instance(&setup, "run", "a", "127.0.0.1:0", None);
    let env = [
        ("JURYSTREAM_CONNECT__TOKEN", TOKEN),
        ("JURYSTREAM_CONNECT__DRAIN_SECONDS", "2"),
    ];
    let dir = setup.dir.path();
    let ports = [free_port(), free_port()];
    let mut instances: Vec<Connect> = ports
        .iter()
        .map(|p| Connect::start_on(*p, &setup.config, dir, &env))
        .collect();
    let Some(lb) = Haproxy::start(dir, &ports) else {
        return;
    };
    wait_for("haproxy to pass a request", Duration::from_secs(20), || {
        (request(lb.port, "GET", "/readyz", &[], b"").map(|r| r.0) == Some(200)).then_some(())
    });

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let (stop, port) = (stop.clone(), lb.port);
        std::thread::spawn(move || {
            let mut answers: Vec<(String, u16)> = Vec::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                n += 1;
                let id = format!("lb-{n}");
                let now = jurystream::time::format_timestamp(jurystream::time::wall_clock());
                let vote = format!(
                    r#"{{"inference_id":"item-{}","voter_id":"r{n}","voter_prompt_id":"quality","vote":{},"timestamp":"{now}","vote_id":"{id}"}}"#,
                    n % 7,
                    (n % 3) as f64 / 2.0
                );
                let (code, _) = post_votes(port, "application/json", vote.as_bytes());
                answers.push((id, code));
                std::thread::sleep(Duration::from_millis(20));
            }
            answers
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    for (i, port) in ports.iter().enumerate() {
        let old = &mut instances[i];
        sigterm(&old.child);
        let status = wait_for(
            "the instance to drain and exit",
            Duration::from_secs(30),
            || old.child.try_wait().unwrap(),
        );
        assert!(status.success(), "{status:?}");
        instances[i] = Connect::start_on(*port, &setup.config, dir, &env);
        // Back in rotation before the next one goes.
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let answers = client.join().unwrap();
    let failed: Vec<&(String, u16)> = answers.iter().filter(|(_, c)| *c != 200).collect();
    assert!(answers.len() > 100, "{} posts", answers.len());
    assert!(
        failed.is_empty(),
        "{} of {} posts failed: {failed:?}",
        failed.len(),
        answers.len()
    );

    // Every vote scored exactly once; none late, nothing in the DLQ.
    let want: BTreeSet<String> = answers.into_iter().map(|(id, _)| id).collect();
    let scored = wait_for("every vote scored", Duration::from_secs(60), || {
        let records = read_records(&setup.bootstrap, &setup.output_topics());
        let ids = scored_vote_ids(&records, &setup.scores);
        (ids.len() >= want.len()).then_some((ids, records))
    });
    let (ids, records) = scored;
    let dlq: Vec<&Record> = records.iter().filter(|r| r.topic == setup.dlq).collect();
    assert!(dlq.is_empty(), "{dlq:?}");
    let distinct: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(ids.len(), distinct.len(), "a vote scored twice");
    assert_eq!(distinct, want);
    assert_eq!(
        svc.metric("jurystream_votes_accepted_total{source=\"api\"}"),
        Some(want.len() as f64)
    );
}
