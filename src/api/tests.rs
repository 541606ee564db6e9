use super::merge::*;
use super::*;

fn part<T>(topic: &str, partition: i32, ready: bool, data: Vec<T>) -> PartAnswer<T> {
    PartAnswer {
        topic: topic.into(),
        partition,
        ready,
        data,
    }
}

fn answer<T>(n: i32, partitions: Vec<PartAnswer<T>>) -> LocalAnswer<T> {
    LocalAnswer {
        topics: [("votes".to_owned(), n)].into(),
        partitions,
    }
}

fn series(vp: &str) -> SeriesOut {
    SeriesOut {
        voter_prompt_id: vp.into(),
        model_id: None,
        score: Some(0.5),
        update_seq: 1,
        last_vote_at: None,
        votes: 1,
        abstentions: 0,
        ambiguous: false,
        pending_votes: 0,
        voters: vec![],
        voters_truncated: false,
        effective_votes: Some(1.0),
        score_interval: Some((0.1, 0.9)),
    }
}

#[test]
fn an_inference_is_answered_only_when_every_partition_is_ready_somewhere() {
    // Two instances, two partitions; partition 1 restores on the first and
    // is ready on the second (a handover).
    let a = answer(
        2,
        vec![
            part("votes", 0, true, vec![series("b")]),
            part("votes", 1, false, vec![]),
        ],
    );
    let b = answer(2, vec![part("votes", 1, true, vec![series("a")])]);
    let out = merge_inference("i", vec![a.clone(), b]).unwrap().unwrap();
    let vps: Vec<&str> = out
        .series
        .iter()
        .map(|s| s.voter_prompt_id.as_str())
        .collect();
    assert_eq!(vps, ["a", "b"], "voter_prompt_id order across partitions");
    assert_eq!(
        merge_inference("i", vec![a]),
        Err(Unavailable::Partitions(vec![("votes".into(), 1)]))
    );
    // Unknown everywhere: None (a 404), but only when all are ready.
    let empty = answer::<SeriesOut>(1, vec![part("votes", 0, true, vec![])]);
    assert_eq!(merge_inference("x", vec![empty]), Ok(None));
    assert_eq!(merge_inference("x", vec![]), Err(Unavailable::NoTopics));
}

#[test]
fn the_leaderboard_sums_exactly_across_partitions_and_sorts() {
    let row = |m: Option<&str>, vp: &str, n: u64, sum: f64, amb: u64| BoardRowOut {
        model_id: m.map(str::to_owned),
        voter_prompt_id: vp.into(),
        series: n,
        score_sum_fixed: crate::engine::board::fixed(sum).to_string(),
        ambiguous_series: amb,
        votes: n * 2,
        score_squares_fixed: Some(crate::engine::board::fixed_square(sum).to_string()),
    };
    let a = answer(
        2,
        vec![
            part(
                "votes",
                0,
                true,
                vec![row(Some("m2"), "r", 1, 0.9, 0), row(None, "r", 1, 0.2, 1)],
            ),
            part(
                "votes",
                1,
                true,
                vec![
                    row(Some("m1"), "r", 2, 0.6, 0),
                    row(Some("m1"), "a", 1, 0.1, 0),
                ],
            ),
        ],
    );
    let b = answer(
        2,
        vec![part(
            "votes",
            0,
            true,
            vec![row(Some("m2"), "r", 1, 0.1, 0)],
        )],
    );
    let out = merge_board(vec![a.clone(), b], None).unwrap();
    let got: Vec<(Option<&str>, &str, u64, f64)> = out
        .rows
        .iter()
        .map(|r| {
            (
                r.model_id.as_deref(),
                r.voter_prompt_id.as_str(),
                r.series,
                r.mean_score,
            )
        })
        .collect();
    // Partition 0 counts once (the first ready answer), not twice.
    assert_eq!(
        got,
        [
            (Some("m1"), "a", 1, 0.1),
            (Some("m2"), "r", 1, 0.9),
            (Some("m1"), "r", 2, 0.3),
            (None, "r", 1, 0.2),
        ]
    );
    let only_a = merge_board(vec![a], Some("a")).unwrap();
    assert_eq!(only_a.rows.len(), 1);
    assert_eq!(only_a.rows[0].votes, 2);
}

/// contract §13: a row's squares add across partitions like its sum; a part
/// from an instance that sends no squares (an older version) makes the
/// row's sd unknown, not wrong.
#[test]
fn the_leaderboard_sd_combines_partitions() {
    use crate::engine::board::{fixed, fixed_square};
    let row = |score: f64, squares: bool| BoardRowOut {
        model_id: Some("m".into()),
        voter_prompt_id: "r".into(),
        series: 1,
        score_sum_fixed: fixed(score).to_string(),
        ambiguous_series: 0,
        votes: 1,
        score_squares_fixed: squares.then(|| fixed_square(score).to_string()),
    };
    let board = |second_has_squares: bool| {
        let a = answer(2, vec![part("votes", 0, true, vec![row(0.2, true)])]);
        let b = answer(
            2,
            vec![part("votes", 1, true, vec![row(0.4, second_has_squares)])],
        );
        merge_board(vec![a, b], None).unwrap().rows
    };
    let rows = board(true);
    assert_eq!(rows.len(), 1);
    let sd = rows[0].score_sd.unwrap();
    assert!((sd - 0.02f64.sqrt()).abs() < 1e-12, "{sd}");
    let (low, high) = rows[0].mean_score_interval.unwrap();
    let half = 1.959963984540054 * 0.02f64.sqrt() / 2f64.sqrt();
    assert!((low - (0.3 - half)).abs() < 1e-12 && (high - (0.3 + half)).abs() < 1e-12);
    let json = serde_json::to_value(&rows[0]).unwrap();
    assert!(json["mean_score_interval"]
        .as_array()
        .is_some_and(|a| a.len() == 2));
    let rows = board(false);
    assert_eq!(
        (rows[0].score_sd, rows[0].mean_score_interval),
        (None, None)
    );
    assert_eq!(rows[0].series, 2);
}

#[test]
fn escapes_are_checked_and_ids_encode_for_a_path_segment() {
    use percent_encoding::percent_decode_str;
    assert_eq!(malformed_escape("a%2Fb%20c%c3%A9"), None);
    assert_eq!(malformed_escape("bad%zz"), Some(3));
    assert_eq!(malformed_escape("abc%4"), Some(3));
    assert_eq!(malformed_escape("%%41"), Some(0));
    for id in ["plain", "a/b?c#d %+&=", "é\u{1F600}", "%41", "-._~"] {
        let enc = percent_encode(id);
        assert!(enc
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-._~%".contains(&c)));
        assert_eq!(malformed_escape(&enc), None);
        assert_eq!(percent_decode_str(&enc).decode_utf8().unwrap(), id);
    }
    assert_eq!(percent_encode("a b+c"), "a%20b%2Bc");
}

#[test]
// (The closures return `params`'s own `Result`, its error a `Response`.)
#[allow(clippy::result_large_err)]
fn query_strings_parse_into_the_query_structs() {
    use super::http::{canonical_query, params, LeaderboardParams, NoParams, VotersParams};
    let status = |r: axum::response::Response| r.status().as_u16();
    assert_eq!(canonical_query("&&a=1&b&&a=2+3&").unwrap(), "b&a=2+3");
    assert_eq!(canonical_query("a%3D=1&a==2").unwrap(), "a%3D=1&a==2");
    assert!(canonical_query("a=%zz").unwrap_err().contains("byte 2"));
    assert!(canonical_query("a=%FF").is_err(), "not UTF-8");
    assert!(canonical_query("%C3=1").is_err(), "not UTF-8");

    let board = |q: &str| params::<LeaderboardParams>(q).map(|p| p.voter_prompt_id);
    assert_eq!(board("").unwrap(), None);
    assert_eq!(
        board("voter_prompt_id=a&voter_prompt_id=b+c%2B").unwrap(),
        Some("b c+".into()),
        "the last occurrence wins; + is a space"
    );
    assert_eq!(board("voter_prompt_id").unwrap(), Some(String::new()));
    assert_eq!(board("model=x").map_err(status), Err(400));
    assert_eq!(board("voter_prompt_id=%zz").map_err(status), Err(400));
    assert!(params::<NoParams>("&&").is_ok());
    assert_eq!(params::<NoParams>("a=1").map_err(status).err(), Some(400));

    let voters = |q: &str| params::<VotersParams>(q).map(|p| (p.voter_prompt_id, p.order, p.limit));
    assert_eq!(
        voters("voter_prompt_id=r").unwrap(),
        ("r".into(), VoterOrder::VoterId, 100)
    );
    assert_eq!(
        voters("order=deviation&limit=10000&voter_prompt_id=r").unwrap(),
        ("r".into(), VoterOrder::Deviation, 10_000)
    );
    assert_eq!(
        voters("voter_prompt_id=r&order=voter_id&limit=1").unwrap(),
        ("r".into(), VoterOrder::VoterId, 1)
    );
    for bad in [
        "limit=5",
        "voter_prompt_id=r&limit=0",
        "voter_prompt_id=r&limit=10001",
        "voter_prompt_id=r&limit=x",
        "voter_prompt_id=r&order=x",
        "voter_prompt_id=r&sort=x",
    ] {
        assert_eq!(voters(bad).map_err(status).err(), Some(400), "{bad}");
    }
}

mod served {
    use super::super::http::{routes, Api};
    use super::super::*;
    use crate::engine::Engine;
    use crate::input::Vote;
    use crate::server::serve;
    use crate::telemetry::Metrics;
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    fn vote(
        inf: &str,
        vp: &str,
        voter: &str,
        v: Option<f64>,
        ts: &str,
        model: Option<&str>,
    ) -> Vote {
        Vote {
            inference_id: inf.into(),
            voter_id: voter.into(),
            voter_prompt_id: vp.into(),
            value: v,
            timestamp: crate::time::parse_timestamp(ts).unwrap(),
            vote_id: None,
            model_id: model.map(Into::into),
            weight: 1.0,
            inference_time: None,
        }
    }

    /// A store holding `votes` processed (windows left open unless `close`).
    fn store_with(dir: &std::path::Path, votes: &[Vote], close: bool) -> Arc<Store> {
        let store = Store::open(dir).unwrap();
        let cfg = crate::config::Config::load(None).unwrap().engine();
        let (mut e, _): (Engine, _) = store.load(cfg).unwrap();
        let mut out = Vec::new();
        for v in votes {
            e.process(v, &mut out);
        }
        if close {
            e.close_all(&mut out);
        }
        let mut records = Vec::new();
        store.encode_changes(&mut e, &mut records).unwrap();
        store.apply(&records, &[]).unwrap();
        Arc::new(store)
    }

    fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let code = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (code, json)
    }

    fn server(holdings: Arc<Holdings>, peers: &[String]) -> SocketAddr {
        let api = Api::new(holdings, "tok", peers, Duration::from_secs(2));
        serve(
            "127.0.0.1:0".parse().unwrap(),
            Metrics::new(10),
            routes(api),
        )
        .unwrap()
        .addr
    }

    /// The extractors' refusals are the API's JSON errors (the rejection
    /// handler), with a message that says what is wrong, and well-formed
    /// requests get through to the answer (here a 503: no topic yet).
    #[test]
    fn unknown_parameters_and_bad_ids_are_json_400s() {
        let a = server(Arc::new(Holdings::new(0.5)), &[]);
        for (path, says) in [
            ("/v1/leaderboard?model=x", "model"),
            ("/v1/rubrics?voter_prompt_id=r", "voter_prompt_id"),
            ("/v1/voters?voter_prompt_id=r&sort=x", "sort"),
            ("/v1/voters?limit=5", "voter_prompt_id"),
            ("/v1/voters?voter_prompt_id=r&limit=0", "limit"),
            ("/v1/voters?voter_prompt_id=r&order=up", "order"),
            ("/v1/inferences/i?x", "x"),
            ("/v1/local/leaderboard?a=1", "a"),
            ("/v1/local/voters", "voter_prompt_id"),
            ("/v1/local/voters/v?voter_prompt_id=r", "voter_prompt_id"),
            ("/v1/leaderboard?voter_prompt_id=%zz", "malformed"),
            ("/v1/leaderboard?voter_prompt_id=%FF", "UTF-8"),
            (
                "/v1/inferences/bad%zz",
                "inference_id: malformed percent-encoding at byte 3",
            ),
            ("/v1/inferences/a%4", "inference_id: malformed"),
            ("/v1/local/inferences/%zz", "inference_id: malformed"),
            ("/v1/voters/v%", "voter_id: malformed"),
            ("/v1/local/voters/%C3%28", "voter_id"),
            ("/v1/inferences/%FF", "inference_id"),
        ] {
            let (code, body) = get(a, path, Some("tok"));
            assert_eq!(code, 400, "{path}: {body}");
            let msg = body["error"]
                .as_str()
                .unwrap_or_else(|| panic!("{path}: {body}"));
            assert!(msg.contains(says), "{path}: {msg}");
        }
        let long = format!("/v1/voters/{}", "%C3%A9".repeat(129));
        let (code, body) = get(a, &long, Some("tok"));
        assert_eq!(code, 400, "{body}");
        assert!(body["error"]
            .as_str()
            .unwrap()
            .contains("voter_id: must be 1..=256"));
        for path in [
            "/v1/inferences/%25zz",
            "/v1/voters/%C3%A9",
            "/v1/leaderboard?voter_prompt_id=a&voter_prompt_id=b",
            "/v1/voters?voter_prompt_id=r&order=deviation&limit=10000&limit=1",
            "/v1/rubrics?&&",
        ] {
            let (code, body) = get(a, path, Some("tok"));
            assert_eq!(code, 503, "{path}: {body}");
        }
        // The token is looked at first.
        assert_eq!(get(a, "/v1/leaderboard?model=x", None).0, 401);
    }

    #[test]
    fn answers_errors_and_two_instances() {
        let d0 = tempfile::tempdir().unwrap();
        let d1 = tempfile::tempdir().unwrap();
        let s0 = store_with(
            d0.path(),
            &[
                vote(
                    "inf/1 é",
                    "r2",
                    "v2",
                    Some(1.0),
                    "2024-01-01T00:00:01Z",
                    Some("m"),
                ),
                vote(
                    "inf/1 é",
                    "r2",
                    "v1",
                    Some(0.0),
                    "2024-01-01T00:00:02Z",
                    None,
                ),
                vote("inf/1 é", "r1", "v1", None, "2024-01-01T00:00:03Z", None),
                // Still open: pending.
                vote(
                    "inf/1 é",
                    "r1",
                    "v3",
                    Some(1.0),
                    "2024-01-01T00:10:00Z",
                    None,
                ),
            ],
            false,
        );
        let s1 = store_with(
            d1.path(),
            &[vote(
                "other",
                "r2",
                "v9",
                Some(0.5),
                "2024-01-01T00:00:01Z",
                Some("m"),
            )],
            true,
        );
        let h0 = Arc::new(Holdings::new(0.5));
        h0.set_topics([("votes".to_owned(), 2)].into());
        h0.set_held([(("votes".to_owned(), 0), Some(s0))].into());
        let h1 = Arc::new(Holdings::new(0.5));
        h1.set_topics([("votes".to_owned(), 2)].into());
        h1.set_held([(("votes".to_owned(), 1), Some(s1.clone()))].into());
        let a1 = server(h1.clone(), &[]);
        let a0 = server(
            h0.clone(),
            &[format!("http://{a1}"), format!("http://{a1}/")],
        );
        let id = format!("/v1/inferences/{}", percent_encode("inf/1 é"));

        // Alone, instance 1 misses partition 0: 503, not an empty answer.
        let (code, body) = get(a1, "/v1/inferences/other", Some("tok"));
        assert_eq!(code, 503, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("votes-0"),
            "{body}"
        );

        let (code, body) = get(a0, &id, Some("tok"));
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["inference_id"], "inf/1 é");
        let series = body["series"].as_array().unwrap();
        assert_eq!(series.len(), 2);
        assert_eq!(series[0]["voter_prompt_id"], "r1");
        assert_eq!(series[0]["score"], serde_json::Value::Null);
        assert_eq!(series[0]["update_seq"], 0);
        assert_eq!(series[0]["abstentions"], 1);
        assert_eq!(series[0]["pending_votes"], 1);
        assert_eq!(series[0]["voters"], serde_json::json!(["v1", "v3"]));
        assert_eq!(series[1]["voter_prompt_id"], "r2");
        assert_eq!(series[1]["model_id"], "m");
        assert_eq!(series[1]["update_seq"], 1);
        assert_eq!(series[1]["votes"], 2);
        assert_eq!(series[1]["ambiguous"], true);
        assert_eq!(series[1]["last_vote_at"], "2024-01-01T00:00:02Z");
        assert_eq!(series[1]["voters"], serde_json::json!(["v1", "v2"]));
        assert_eq!(series[1]["voters_truncated"], false);
        // The other instance's inference, through instance 0.
        let (code, body) = get(a0, "/v1/inferences/other", Some("tok"));
        assert_eq!(code, 200, "{body}");
        assert!(body["series"][0]["score"].as_f64().unwrap() > 0.0);

        let (code, board) = get(a0, "/v1/leaderboard", Some("tok"));
        assert_eq!(code, 200, "{board}");
        let rows = board["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{board}");
        assert_eq!(rows[0]["model_id"], "m");
        assert_eq!(rows[0]["series"], 2);
        assert_eq!(rows[0]["ambiguous_series"], 1);
        assert_eq!(rows[0]["votes"], 3);
        let (_, none) = get(a0, "/v1/leaderboard?voter_prompt_id=r1", Some("tok"));
        assert_eq!(none["rows"], serde_json::json!([]));

        // Errors: JSON, with the right status.
        for (path, token, want) in [
            (id.as_str(), None, 401),
            (id.as_str(), Some("nope"), 401),
            ("/v1/inferences/unknown", Some("tok"), 404),
            ("/v1/inferences/bad%zz", Some("tok"), 400),
            ("/v1/inferences/%FF", Some("tok"), 400),
            ("/v1/leaderboard?model=x", Some("tok"), 400),
            ("/v1/nothing", Some("tok"), 404),
            ("/nothing", None, 404),
        ] {
            let (code, body) = get(a0, path, token);
            assert_eq!(code, want, "{path}: {body}");
            assert!(body["error"].is_string(), "{path}: {body}");
        }
        let long = format!("/v1/inferences/{}", "a".repeat(300));
        assert_eq!(get(a0, &long, Some("tok")).0, 400);

        // A restoring partition: 503 with Retry-After, never stale.
        h1.set_held([(("votes".to_owned(), 1), None)].into());
        let (code, body) = get(a0, &id, Some("tok"));
        assert_eq!(code, 503, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("votes-1"),
            "{body}"
        );
        assert_eq!(get(a0, "/v1/leaderboard", Some("tok")).0, 503);
        h1.set_held([(("votes".to_owned(), 1), Some(s1))].into());
        assert_eq!(get(a0, &id, Some("tok")).0, 200);
    }
}
