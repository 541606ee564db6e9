use super::*;

fn opts() -> DecodeOptions {
    DecodeOptions {
        max_message_bytes: 1 << 20,
        default_voter_prompt_id: None,
    }
}

fn reason(s: &str) -> Reason {
    decode_vote(s.as_bytes(), &opts()).expect_err(s).reason
}

const OK: &str = r#"{"inference_id":"i","voter_id":"v","voter_prompt_id":"r","vote":0.5,"timestamp":"2024-07-07T00:00:00Z"}"#;

fn with(field: &str, value: &str) -> String {
    let mut m: serde_json::Map<String, serde_json::Value> = serde_json::from_str(OK).unwrap();
    m.remove(field);
    let body = serde_json::to_string(&m).unwrap();
    if value.is_empty() {
        body
    } else {
        format!("{},\"{field}\":{value}}}", &body[..body.len() - 1])
    }
}

#[test]
fn accepts_a_plain_vote_and_integer_ids() {
    let v = decode_vote(OK.as_bytes(), &opts()).unwrap();
    assert_eq!(&*v.inference_id, "i");
    assert_eq!(v.value, Some(0.5));
    assert_eq!(v.weight, 1.0);
    let v = decode_vote(with("inference_id", "7").as_bytes(), &opts()).unwrap();
    assert_eq!(&*v.inference_id, "7");
    let v = decode_vote(with("voter_id", "-9223372036854775808").as_bytes(), &opts()).unwrap();
    assert_eq!(&*v.voter_id, "-9223372036854775808");
    let v = decode_vote(with("voter_id", "18446744073709551615").as_bytes(), &opts()).unwrap();
    assert_eq!(&*v.voter_id, "18446744073709551615");
}

#[test]
fn vote_values_and_labels() {
    for (raw, want) in [
        ("true", Some(1.0)),
        ("false", Some(0.0)),
        ("null", None),
        ("1", Some(1.0)),
        ("0", Some(0.0)),
        ("\"PASS\"", Some(1.0)),
        ("\"Flag\"", Some(0.0)),
        ("\"fully\"", Some(1.0)),
        ("\"MOSTLY\"", Some(0.9)),
        ("\"partial\"", Some(0.7)),
        ("\"minor\"", Some(0.3)),
        ("\"None\"", Some(0.0)),
    ] {
        let v = decode_vote(with("vote", raw).as_bytes(), &opts()).unwrap();
        assert_eq!(v.value, want, "{raw}");
    }
    for raw in [
        "\" pass\"",
        "\"true\"",
        "1.0000001",
        "-0.1",
        "[]",
        "{}",
        "\"NaN\"",
    ] {
        assert_eq!(reason(&with("vote", raw)), Reason::InvalidField, "{raw}");
    }
    assert_eq!(reason(&with("vote", "")), Reason::MissingField);
}

#[test]
fn every_rejection_reason() {
    assert_eq!(reason("{"), Reason::MalformedJson);
    assert_eq!(reason("true"), Reason::MalformedJson);
    assert_eq!(reason("[1]"), Reason::MalformedJson);
    assert_eq!(reason("{'a': 1}"), Reason::MalformedJson);
    assert_eq!(reason(&format!("\u{feff}{OK}")), Reason::MalformedJson);
    assert_eq!(reason(&format!("{OK} x")), Reason::MalformedJson);
    let deep = format!("{}{}", "[".repeat(160), "]".repeat(160));
    assert_eq!(reason(&with("extra", &deep)), Reason::MalformedJson);
    let ok_deep = format!("{}{}", "[".repeat(99), "]".repeat(99));
    assert!(decode_vote(with("extra", &ok_deep).as_bytes(), &opts()).is_ok());
    let mut bad_utf8 = OK.as_bytes().to_vec();
    bad_utf8.splice(20..20, [0xff]);
    assert_eq!(
        decode_vote(&bad_utf8, &opts()).unwrap_err().reason,
        Reason::MalformedJson
    );
    assert_eq!(reason(&with("voter_id", "")), Reason::MissingField);
    assert_eq!(reason(&with("voter_id", "null")), Reason::MissingField);
    assert_eq!(reason(&with("inference_id", "1.5")), Reason::InvalidField);
    assert_eq!(reason(&with("inference_id", "1e3")), Reason::InvalidField);
    assert_eq!(
        reason(&with("inference_id", "18446744073709551616")),
        Reason::InvalidField
    );
    assert_eq!(reason(&with("inference_id", "\"\"")), Reason::InvalidField);
    assert_eq!(
        reason(&with("inference_id", &format!("\"{}\"", "x".repeat(257)))),
        Reason::InvalidField
    );
    assert!(decode_vote(
        with("inference_id", &format!("\"{}\"", "x".repeat(256))).as_bytes(),
        &opts()
    )
    .is_ok());
    assert_eq!(reason(&with("model_id", "5")), Reason::InvalidField);
    assert_eq!(reason(&with("reputation", "0")), Reason::InvalidField);
    assert_eq!(reason(&with("reputation", "\"1\"")), Reason::InvalidField);
    assert_eq!(
        reason(&with("timestamp", "1720310400")),
        Reason::InvalidTimestamp
    );
    assert_eq!(
        reason(&with("timestamp", "\"2024-07-07\"")),
        Reason::InvalidTimestamp
    );
    assert_eq!(
        reason(&with("inference_time", "\"x\"")),
        Reason::InvalidTimestamp
    );
    let small = DecodeOptions {
        max_message_bytes: 10,
        ..opts()
    };
    assert_eq!(
        decode_vote(OK.as_bytes(), &small).unwrap_err().reason,
        Reason::TooLarge
    );
    assert_eq!(
        decode_vote(b"{{{{{{{{{{{{", &small).unwrap_err().reason,
        Reason::TooLarge
    );
}

#[test]
fn timestamp_falls_back_to_vote_time_and_null_means_absent() {
    let s = with("timestamp", "null");
    assert_eq!(reason(&s), Reason::MissingField);
    let s = format!(
        "{},\"vote_time\":\"2024-07-07T00:00:01Z\"}}",
        &s[..s.len() - 1]
    );
    let v = decode_vote(s.as_bytes(), &opts()).unwrap();
    assert_eq!(
        v.timestamp,
        crate::time::parse_timestamp("2024-07-07T00:00:01Z").unwrap()
    );
}

#[test]
fn default_voter_prompt_id_fills_in() {
    let o = DecodeOptions {
        default_voter_prompt_id: Some("def".into()),
        ..opts()
    };
    let v = decode_vote(with("voter_prompt_id", "").as_bytes(), &o).unwrap();
    assert_eq!(&*v.voter_prompt_id, "def");
}

#[test]
fn last_duplicate_key_wins_and_unknown_fields_are_ignored() {
    let s = r#"{"inference_id":"a","inference_id":"b","voter_id":"v","voter_prompt_id":"r","vote":1,"timestamp":"2024-07-07T00:00:00Z","Vote":"x","extra":{"n":1.5e300}}"#;
    let v = decode_vote(s.as_bytes(), &opts()).unwrap();
    assert_eq!(&*v.inference_id, "b");
}

#[test]
fn dlq_payload_is_lossy_and_cut_at_a_char_boundary() {
    assert_eq!(dlq_payload(b"a\xffb"), "a\u{fffd}b");
    let long = "é".repeat(40_000);
    let p = dlq_payload(long.as_bytes());
    assert!(p.len() <= 65_536);
    assert_eq!(p.len(), 65_536);
    let odd = format!("x{long}");
    let p = dlq_payload(odd.as_bytes());
    assert_eq!(p.len(), 65_535);
}

#[test]
fn future_skew_is_measured_from_the_given_now() {
    let v = decode_vote(OK.as_bytes(), &opts()).unwrap();
    let s = crate::time::NANOS_PER_SEC;
    // Exactly at the limit is accepted; one nanosecond beyond is not.
    assert!(check_future_skew(&v, v.timestamp - 300 * s, 300 * s).is_ok());
    let r = check_future_skew(&v, v.timestamp - 300 * s - 1, 300 * s).unwrap_err();
    assert_eq!(r.reason, Reason::InvalidTimestamp);
    assert!(r.detail.contains("max_future_skew_seconds"), "{}", r.detail);
    // A huge skew never overflows.
    assert!(check_future_skew(&v, i128::MAX - 1, i128::MAX).is_ok());
}
