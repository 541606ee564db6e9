//! Bad input through the binary (contract §1, §5): every rejection reason, a
//! line over 1 MiB, invalid UTF-8, 10 000 seeded garbage lines, and the
//! 64 KiB payload cut. The process must exit 0 and every non-blank bad line
//! must yield exactly one `vote_rejected` whose `source.line` is its line.

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{json, Value};

/// splitmix64: a tiny seeded generator, so failures reproduce exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

fn vote(i: usize) -> serde_json::Map<String, Value> {
    let v = json!({
        "inference_id": format!("inf-{}", i % 17),
        "voter_id": format!("voter-{}", i % 23),
        "voter_prompt_id": "accuracy",
        "vote": 0.5,
        "timestamp": format!("2024-07-07T00:00:{:02}Z", i % 50),
        "vote_id": format!("v-{i}"),
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn line_of(m: &serde_json::Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(m).unwrap()
}

/// Rejections by line number: (reason, detail).
fn rejections(events: &[Value]) -> BTreeMap<u64, Vec<(String, String)>> {
    let mut out: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    for e in events {
        if e["type"] == "vote_rejected" {
            assert_eq!(e["schema_version"], 1);
            assert!(e["processed_at"].is_string());
            assert!(e["payload"].is_string());
            let line = e["source"]["line"]
                .as_u64()
                .unwrap_or_else(|| panic!("source.line missing: {e}"));
            out.entry(line).or_default().push((
                e["reason"].as_str().unwrap().to_owned(),
                e["detail"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

fn replay_bytes(data: &[u8], config: Option<&str>) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.jsonl");
    std::fs::write(&input, data).unwrap();
    let cfg_path = config.map(|text| {
        let p = dir.path().join("config.toml");
        std::fs::write(&p, text).unwrap();
        p
    });
    replay(cfg_path.as_deref(), &input, None, false)
}

#[test]
fn every_rejection_reason_names_its_field_and_line() {
    let with = |k: &str, v: Value| {
        let mut m = vote(1);
        m.insert(k.into(), v);
        line_of(&m)
    };
    let without = |k: &str| {
        let mut m = vote(1);
        m.remove(k);
        line_of(&m)
    };
    // (line bytes, reason, a word the detail must contain)
    let cases: Vec<(Vec<u8>, &str, &str)> = vec![
        (b"{oops".to_vec(), "malformed_json", ""),
        (b"42".to_vec(), "malformed_json", ""),
        (b"null".to_vec(), "malformed_json", ""),
        (b"[{}]".to_vec(), "malformed_json", ""),
        (
            [b"\xef\xbb\xbf".as_slice(), &line_of(&vote(1))].concat(),
            "malformed_json",
            "",
        ),
        (without("inference_id"), "missing_field", "inference_id"),
        (without("voter_id"), "missing_field", "voter_id"),
        (
            without("voter_prompt_id"),
            "missing_field",
            "voter_prompt_id",
        ),
        (without("vote"), "missing_field", "vote"),
        (without("timestamp"), "missing_field", "timestamp"),
        (with("voter_id", Value::Null), "missing_field", "voter_id"),
        (
            with("inference_id", json!("")),
            "invalid_field",
            "inference_id",
        ),
        (
            with("inference_id", json!({"a": 1})),
            "invalid_field",
            "inference_id",
        ),
        (
            with("voter_id", json!("é".repeat(129))),
            "invalid_field",
            "voter_id",
        ),
        (
            with("voter_prompt_id", json!(false)),
            "invalid_field",
            "voter_prompt_id",
        ),
        (with("vote_id", json!(1.25)), "invalid_field", "vote_id"),
        (with("vote", json!(1.0000001)), "invalid_field", "vote"),
        (with("vote", json!("yes")), "invalid_field", "vote"),
        (with("vote", json!({"v": 1})), "invalid_field", "vote"),
        (
            with("reputation", json!(0.0)),
            "invalid_field",
            "reputation",
        ),
        (
            with("reputation", json!([1])),
            "invalid_field",
            "reputation",
        ),
        (with("model_id", json!("")), "invalid_field", "model_id"),
        (
            with("timestamp", json!("2024-13-01T00:00:00Z")),
            "invalid_timestamp",
            "timestamp",
        ),
        (
            with("timestamp", json!(true)),
            "invalid_timestamp",
            "timestamp",
        ),
        (
            with("timestamp", json!("2024-07-07")),
            "invalid_timestamp",
            "timestamp",
        ),
        (
            with("inference_time", json!("2024-07-07T00:00:00+24:00")),
            "invalid_timestamp",
            "inference_time",
        ),
        (
            with("inference_time", json!(1720310400)),
            "invalid_timestamp",
            "inference_time",
        ),
        (
            {
                let mut m = vote(1);
                m.remove("timestamp");
                m.insert("vote_time".into(), json!("07/07/2024"));
                line_of(&m)
            },
            "invalid_timestamp",
            "vote_time",
        ),
    ];
    let mut data = Vec::new();
    // Line 1: a valid vote at 00:00:01; line 2 moves the watermark past its
    // window; line 3 is then late.
    data.extend(line_of(&vote(1)));
    data.push(b'\n');
    let mut m = vote(2);
    m.insert("timestamp".into(), json!("2024-07-07T00:01:10Z"));
    data.extend(line_of(&m));
    data.push(b'\n');
    let mut late = vote(3);
    late.insert("timestamp".into(), json!("2024-07-07T00:00:59.9Z"));
    data.extend(line_of(&late));
    data.push(b'\n');
    let first_case_line = 4;
    for (bytes, _, _) in &cases {
        data.extend(bytes);
        data.push(b'\n');
    }
    // too_large with a small limit: one byte over.
    let big = {
        let mut m = vote(4);
        m.insert("pad".into(), json!(""));
        let base = line_of(&m).len();
        m.insert("pad".into(), json!("p".repeat(2000 - base + 1)));
        line_of(&m)
    };
    assert_eq!(big.len(), 2001);
    data.extend(&big);
    data.push(b'\n');
    let events = replay_bytes(&data, Some("[input]\nmax_message_bytes = 2000\n"));
    let got = rejections(&events);

    let mut want: BTreeMap<u64, (&str, &str)> = BTreeMap::new();
    want.insert(3, ("late", "timestamp"));
    for (i, (_, reason, field)) in cases.iter().enumerate() {
        want.insert((first_case_line + i) as u64, (reason, field));
    }
    want.insert((first_case_line + cases.len()) as u64, ("too_large", ""));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "rejected lines: {got:#?}"
    );
    for (line, (reason, field)) in &want {
        let r = &got[line];
        assert_eq!(r.len(), 1, "line {line}: {r:?}");
        assert_eq!(r[0].0, *reason, "line {line}: {r:?}");
        assert!(!r[0].1.is_empty(), "line {line}: empty detail");
        assert!(
            r[0].1.contains(field),
            "line {line}: detail {:?} does not name {field}",
            r[0].1
        );
    }
    // Every reason of the contract appears.
    let reasons: std::collections::BTreeSet<&str> = want.values().map(|(r, _)| *r).collect();
    let every: std::collections::BTreeSet<&str> = jurystream::input::Reason::ALL
        .iter()
        .map(|r| r.as_str())
        .collect();
    assert_eq!(reasons, every);
}

#[test]
fn a_line_over_one_mebibyte_is_too_large_and_exactly_one_is_not() {
    // Default input.max_message_bytes = 1 MiB; the limit is on the line
    // without its LF.
    let sized = |i: usize, len: usize| {
        let mut m = vote(i);
        m.insert("pad".into(), json!(""));
        let base = line_of(&m).len();
        m.insert("pad".into(), json!("a".repeat(len - base)));
        let l = line_of(&m);
        assert_eq!(l.len(), len);
        l
    };
    let exact = sized(1, 1 << 20);
    let over = sized(2, (1 << 20) + 1);
    let data = [exact.as_slice(), b"\n", &over, b"\n"].concat();
    let events = replay_bytes(&data, None);
    let got = rejections(&events);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[&2][0].0, "too_large");
    let rejected = events
        .iter()
        .find(|e| e["type"] == "vote_rejected")
        .unwrap();
    let payload = rejected["payload"].as_str().unwrap();
    assert!(
        payload.len() <= 65_536,
        "payload is {} bytes",
        payload.len()
    );
    assert!(over.starts_with(payload.as_bytes()));
    // The exact-size line was accepted and scored.
    let scored: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "score_updated")
        .collect();
    assert_eq!(scored.len(), 1);
    assert_eq!(scored[0]["batch"]["vote_ids"], json!(["v-1"]));
}

#[test]
fn invalid_utf8_is_malformed_json_with_a_lossy_payload() {
    let good = line_of(&vote(5));
    let mut bad = line_of(&vote(6));
    // Break the voter id's bytes: a lone continuation byte and a cut-off
    // three-byte sequence.
    let at = bad.windows(6).position(|w| w == b"voter-").unwrap();
    bad.splice(at..at + 2, [0x80, 0xE2, 0x82]);
    let data = [bad.as_slice(), b"\n", &good, b"\n", b"\xff\xfe\n"].concat();
    let events = replay_bytes(&data, None);
    let got = rejections(&events);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), [1, 3]);
    assert_eq!(got[&1][0].0, "malformed_json");
    assert_eq!(got[&3][0].0, "malformed_json");
    let payloads: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "vote_rejected")
        .map(|e| e["payload"].as_str().unwrap())
        .collect();
    assert_eq!(payloads[0], String::from_utf8_lossy(&bad));
    assert!(payloads[0].contains('\u{FFFD}'));
    assert_eq!(payloads[1], "\u{FFFD}\u{FFFD}");
}

#[test]
fn payloads_over_64_kib_are_cut_at_a_character_boundary() {
    // Prefixes of 8 and 9 ASCII bytes put byte 65536 inside a 3-byte '€'
    // and inside a 4-byte '🦀'; the line itself lacks required fields.
    let mut data = Vec::new();
    let mut originals = Vec::new();
    for (prefix, ch) in [
        ("{\"ab\": \"", '€'),
        ("{\"abc\": \"", '🦀'),
        ("{\"a\": \"", 'é'),
    ] {
        let body: String = std::iter::repeat_n(ch, 70_000 / ch.len_utf8()).collect();
        let line = format!("{prefix}{body}\"}}");
        assert!(line.len() > 65_536);
        data.extend(line.as_bytes());
        data.push(b'\n');
        originals.push(line);
    }
    let events = replay_bytes(&data, None);
    let rejected: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "vote_rejected")
        .collect();
    assert_eq!(rejected.len(), 3);
    for (e, original) in rejected.iter().zip(&originals) {
        assert_eq!(e["reason"], "missing_field");
        let p = e["payload"].as_str().unwrap();
        assert!(p.len() <= 65_536, "{} bytes", p.len());
        assert!(p.len() > 65_536 - 4, "cut too short: {} bytes", p.len());
        assert!(original.starts_with(p), "payload is not a prefix");
        assert!(original.is_char_boundary(p.len()));
    }
}

/// What one generated line should produce.
enum Expect {
    Blank,
    Valid,
    Reason(&'static str),
}

fn garbage_line(rng: &mut Rng, i: usize) -> (Vec<u8>, Expect) {
    match rng.below(100) {
        // Random bytes, never LF; the first byte is neither whitespace nor
        // '{', so the line is never blank and never a JSON object.
        0..=24 => {
            let len = 1 + rng.below(200) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            for x in b.iter_mut() {
                if *x == b'\n' {
                    *x = b'?';
                }
            }
            loop {
                let c = rng.below(256) as u8;
                if !c.is_ascii_whitespace() && c != 0x0B && c != b'{' && c != b'\n' {
                    b[0] = c;
                    break;
                }
            }
            (b, Expect::Reason("malformed_json"))
        }
        // A vote cut short: every proper prefix of an object is incomplete.
        25..=44 => {
            let full = line_of(&vote(i));
            let cut = 1 + rng.below(full.len() as u64 - 1) as usize;
            (full[..cut].to_vec(), Expect::Reason("malformed_json"))
        }
        // One field of the wrong type or value.
        45..=64 => {
            let mut m = vote(i);
            let (field, value, reason): (&str, Value, &'static str) = rng
                .pick(&[
                    ("inference_id", json!([1]), "invalid_field"),
                    ("inference_id", json!(2.5), "invalid_field"),
                    ("voter_id", json!(true), "invalid_field"),
                    ("voter_prompt_id", json!({}), "invalid_field"),
                    ("vote", json!(2), "invalid_field"),
                    ("vote", json!(-0.5), "invalid_field"),
                    ("vote", json!("sure"), "invalid_field"),
                    ("vote", json!([0.5]), "invalid_field"),
                    ("vote_id", json!(""), "invalid_field"),
                    ("reputation", json!(-1), "invalid_field"),
                    ("reputation", json!("1"), "invalid_field"),
                    ("timestamp", json!(12345), "invalid_timestamp"),
                    (
                        "timestamp",
                        json!("2024-07-07T00:00:61Z"),
                        "invalid_timestamp",
                    ),
                    ("timestamp", json!("noon"), "invalid_timestamp"),
                    ("inference_time", json!([]), "invalid_timestamp"),
                ])
                .clone();
            m.insert(field.into(), value);
            (line_of(&m), Expect::Reason(reason))
        }
        // A required field missing.
        65..=74 => {
            let mut m = vote(i);
            let field = *rng.pick(&[
                "inference_id",
                "voter_id",
                "voter_prompt_id",
                "vote",
                "timestamp",
            ]);
            m.remove(field);
            (line_of(&m), Expect::Reason("missing_field"))
        }
        // Nesting of 160 to 400 levels, alone or inside an otherwise valid vote.
        75..=84 => {
            let depth = 160 + rng.below(241) as usize;
            let (open, close) = if rng.below(2) == 0 {
                ("[", "]")
            } else {
                ("{\"k\":", "}")
            };
            let inner = if close == "]" { "" } else { "0" };
            let nested = format!("{}{inner}{}", open.repeat(depth), close.repeat(depth));
            let mut l = line_of(&vote(i));
            l.pop();
            l.extend(format!(",\"deep\":{nested}}}").as_bytes());
            (l, Expect::Reason("malformed_json"))
        }
        // Blank lines: skipped, but counted.
        85..=89 => {
            let b = rng.pick(&[&b""[..], b" ", b"\t", b"  \r", b"\r"]).to_vec();
            (b, Expect::Blank)
        }
        // Valid votes (in time order, so never late).
        _ => {
            let mut m = vote(i);
            m.insert(
                "timestamp".into(),
                json!(format!(
                    "2024-07-07T01:{:02}:{:02}Z",
                    i / 6000,
                    (i / 100) % 60
                )),
            );
            (line_of(&m), Expect::Valid)
        }
    }
}

#[test]
fn ten_thousand_garbage_lines_each_yield_one_rejection() {
    let mut rng = Rng(0x5EED_2024);
    let mut data = Vec::new();
    let mut expect = Vec::new();
    for i in 0..10_000 {
        let (line, e) = garbage_line(&mut rng, i);
        data.extend(&line);
        data.push(b'\n');
        expect.push(e);
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("garbage.jsonl");
    std::fs::write(&input, &data).unwrap();
    let out = replay_output(None, &input, None, false);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = parse_lines(&out.stdout);
    let got = rejections(&events);
    let mut bad = 0;
    for (i, e) in expect.iter().enumerate() {
        let line = i as u64 + 1;
        match e {
            Expect::Blank | Expect::Valid => {
                assert!(
                    !got.contains_key(&line),
                    "line {line} was rejected: {:?}",
                    got[&line]
                );
            }
            Expect::Reason(reason) => {
                bad += 1;
                let r = got
                    .get(&line)
                    .unwrap_or_else(|| panic!("line {line} was not rejected"));
                assert_eq!(r.len(), 1, "line {line}: {r:?}");
                assert_eq!(r[0].0, *reason, "line {line}: {r:?}");
            }
        }
    }
    assert_eq!(got.len(), bad, "rejections on lines that were not bad");
    assert!(bad > 8_000, "only {bad} bad lines generated");
    // The valid votes were all scored.
    let valid = expect.iter().filter(|e| matches!(e, Expect::Valid)).count() as u64;
    let counted: u64 = events
        .iter()
        .filter(|e| e["type"] == "score_updated")
        .map(|e| e["batch"]["votes"].as_u64().unwrap() + e["batch"]["superseded"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, valid, "every valid vote is counted or superseded");
}
