//! Arbitrary bytes → `connect::intake::check`, the body parser of
//! `POST /v1/votes` (contract §12), read both as JSON and as NDJSON.
//!
//! Checked, besides "no panic": every vote of the body is answered once,
//! in request order (its index); a valid vote is a piece of the body, and
//! on its own it decodes and passes the skew check, keyed by its inference
//! id; a refused one has a reason of the contract; an NDJSON body has one
//! vote per non-blank line; a JSON array one per element.
#![no_main]

use jurystream::connect::intake::{check, BodyKind, Checked, Rules};
use jurystream::input::{check_future_skew, decode_vote, DecodeOptions, Reason};
use jurystream::time::{parse_timestamp, NANOS_PER_SEC};
use libfuzzer_sys::fuzz_target;
use serde::de::IgnoredAny;

fn rules() -> Rules {
    Rules {
        decode: DecodeOptions {
            max_message_bytes: 1 << 20,
            default_voter_prompt_id: None,
        },
        now: parse_timestamp("2025-01-01T00:00:00Z").unwrap(),
        max_skew: 300 * NANOS_PER_SEC,
    }
}

fuzz_target!(|body: &[u8]| {
    let rules = rules();
    for kind in [BodyKind::Json, BodyKind::Ndjson] {
        let got = check(body, kind, &rules);
        assert_eq!(got, check(body, kind, &rules), "deterministic");
        match got {
            Ok(c) => checked(body, kind, &c, &rules),
            Err(bad) => {
                assert!(!bad.0.is_empty());
                if kind == BodyKind::Ndjson {
                    // Only a body of blank lines is bad as NDJSON.
                    assert!(body
                        .split(|b| *b == b'\n')
                        .all(|l| l.iter().all(u8::is_ascii_whitespace)));
                }
            }
        }
    }
});

fn checked(body: &[u8], kind: BodyKind, c: &Checked<'_>, rules: &Rules) {
    let n = c.valid.len() + c.refused.len();
    assert!(n > 0, "an accepted body holds a vote");
    let mut seen = vec![false; n];
    for i in c
        .valid
        .iter()
        .map(|v| v.index)
        .chain(c.refused.iter().map(|r| r.index))
    {
        assert!(i < n && !seen[i], "index {i} of {n}");
        seen[i] = true;
    }
    assert!(c.valid.windows(2).all(|w| w[0].index < w[1].index));
    assert!(c.refused.windows(2).all(|w| w[0].index < w[1].index));

    let range = body.as_ptr_range();
    for v in &c.valid {
        let r = v.bytes.as_ptr_range();
        assert!(
            range.start <= r.start && r.end <= range.end,
            "a piece of the body"
        );
        let vote = decode_vote(v.bytes, &rules.decode).expect("a valid vote decodes");
        check_future_skew(&vote, rules.now, rules.max_skew).expect("and is not too far ahead");
        assert_eq!(v.key, vote.inference_id.as_str());
    }
    for r in &c.refused {
        assert!(Reason::ALL.iter().any(|x| x.as_str() == r.reason), "{r:?}");
        assert!(!r.detail.is_empty());
    }

    let lines = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .count();
    match kind {
        BodyKind::Ndjson => assert_eq!(n, lines),
        BodyKind::Json => {
            // The body without the ASCII whitespace around it, as the
            // intake reads it.
            let start = body.iter().position(|b| !b.is_ascii_whitespace());
            let end = body.iter().rposition(|b| !b.is_ascii_whitespace());
            let trimmed = match (start, end) {
                (Some(s), Some(e)) => &body[s..=e],
                _ => &[][..],
            };
            // Counted with serde's IgnoredAny (not `serde_json::Value`,
            // which reads an object whose first key is
            // "$serde_json::private::RawValue" as the JSON in its string).
            if trimmed.starts_with(b"[") {
                if let Ok(a) = serde_json::from_slice::<Vec<IgnoredAny>>(trimmed) {
                    assert_eq!(n, a.len());
                }
            } else if trimmed.starts_with(b"{") {
                match serde_json::from_slice::<IgnoredAny>(trimmed) {
                    Ok(_) => assert_eq!(n, 1),
                    // Several objects one per line: read as NDJSON.
                    Err(e) if e.to_string().starts_with("trailing characters") => {
                        assert_eq!(n, lines)
                    }
                    Err(_) => {}
                }
            }
        }
    }
}
