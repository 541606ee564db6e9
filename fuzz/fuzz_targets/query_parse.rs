//! Arbitrary text → the query API's request parsing (SPEC §9, §11), the
//! pure functions its handlers call (`api::http`): the id of
//! `/v1/inferences/{id}` and `/v1/voters/{id}`, the query parameters of
//! every route (`voter_prompt_id`, `order`, `limit`; none for
//! `/v1/rubrics`), and the percent-decoding under them.
//!
//! Checked, besides "no panic": an accepted id has 1..=256 bytes; what an
//! instance forwards to its peers (`/v1/local/inferences/{enc(id)}`,
//! `/v1/local/voters?voter_prompt_id={enc(rubric)}`) is a valid URI that
//! the peer parses back to the same id or rubric; a parameter map holds
//! only allowed names; `limit` is in 1..=10000; `percent_encode` is
//! undone by `percent_decode`.
#![no_main]

use axum::http::Uri;
use jurystream::api::http::{
    id_from_path, query_params, rubric_from, voters_query, VOTERS_DEFAULT_LIMIT, VOTERS_MAX_LIMIT,
};
use jurystream::api::{percent_decode, percent_encode, VoterOrder};
use libfuzzer_sys::fuzz_target;

const VOTERS: [&str; 3] = ["voter_prompt_id", "order", "limit"];

fuzz_target!(|data: &[u8]| {
    // The handlers see `Uri::path()` and `Uri::query()` (ASCII); the
    // functions take any text.
    let text = String::from_utf8_lossy(data);
    let s: &str = &text;

    // Encoding round trip, for any text.
    let enc = percent_encode(s);
    assert!(enc
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"-._~%".contains(&c)));
    assert_eq!(percent_decode(&enc, false).as_deref(), Ok(s));
    assert_eq!(percent_decode(&enc, true).as_deref(), Ok(s));

    // Decoding: never longer; in a query, '+' is what %20 is.
    if let Ok(d) = percent_decode(s, false) {
        assert!(d.len() <= s.len());
    }
    assert_eq!(
        percent_decode(s, true).ok(),
        percent_decode(&s.replace('+', "%20"), false).ok()
    );

    // `/v1/inferences/{id}` and `/v1/voters/{id}`: the text as the path.
    for what in ["inference id", "voter id"] {
        if let Ok(id) = id_from_path(s, what) {
            assert!((1..=256).contains(&id.len()), "id of {} bytes", id.len());
            let last = s.rsplit('/').next().unwrap();
            assert_eq!(percent_decode(last, false).as_deref(), Ok(id.as_str()));
            // The peer request (`inference`, `voter` in api/http.rs).
            for route in ["/v1/local/inferences/", "/v1/local/voters/"] {
                let path = format!("{route}{}", percent_encode(&id));
                let uri: Uri = path.parse().expect("the forwarded path is a URI");
                assert_eq!(uri.path(), path);
                assert_eq!(id_from_path(uri.path(), what).as_deref(), Ok(id.as_str()));
            }
        }
    }

    // The text as the query string (after `?`), for each route's names.
    for allowed in [&[][..], &["voter_prompt_id"][..], &VOTERS[..]] {
        if let Ok(p) = query_params(s, allowed) {
            assert!(p.keys().all(|k| allowed.contains(&k.as_str())), "{p:?}");
            if allowed.is_empty() {
                assert!(
                    s.split('&').all(str::is_empty),
                    "/v1/rubrics takes no parameter"
                );
            }
        }
    }

    // `/v1/leaderboard?voter_prompt_id=R`
    if let Ok(r) = rubric_from(s) {
        let p = query_params(s, &["voter_prompt_id"]).expect("same parameters");
        assert_eq!(r.as_ref(), p.get("voter_prompt_id"));
    }

    // `/v1/voters?voter_prompt_id=R&order=…&limit=N`
    match voters_query(s) {
        Ok((rubric, order, limit)) => {
            assert!((1..=VOTERS_MAX_LIMIT).contains(&limit), "limit {limit}");
            let p = query_params(s, &VOTERS).expect("same parameters");
            assert_eq!(p.get("voter_prompt_id"), Some(&rubric));
            match p.get("limit") {
                None => assert_eq!(limit, VOTERS_DEFAULT_LIMIT),
                Some(l) => assert_eq!(l.parse::<usize>(), Ok(limit)),
            }
            match p.get("order").map(String::as_str) {
                Some("deviation") => assert_eq!(order, VoterOrder::Deviation),
                _ => assert_eq!(order, VoterOrder::VoterId),
            }
            // The peer request (`voters` in api/http.rs).
            let path = format!(
                "/v1/local/voters?voter_prompt_id={}",
                percent_encode(&rubric)
            );
            let uri: Uri = path.parse().expect("the forwarded path is a URI");
            let back = query_params(uri.query().unwrap_or_default(), &["voter_prompt_id"]);
            assert_eq!(back.unwrap().get("voter_prompt_id"), Some(&rubric));
        }
        Err(m) => {
            assert!(!m.is_empty());
            // A well-formed query that names the rubric fails only on a
            // bad order or limit.
            if let Ok(p) = query_params(s, &VOTERS) {
                if p.contains_key("voter_prompt_id") {
                    assert!(m.starts_with("order") || m.starts_with("limit"), "{m}");
                }
            }
        }
    }
});
