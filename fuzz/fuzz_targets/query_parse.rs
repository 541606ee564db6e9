//! Arbitrary text → the query API's request parsing (contract §9, §11) short
//! of a request (`query_router` sends whole requests): the query string
//! of every route (`canonical_query`, then axum's `Query` into the route's
//! struct, `params`), the check of `%` escapes (`malformed_escape`) and
//! the encoding of what an instance forwards to its peers
//! (`percent_encode`).
//!
//! Checked, besides "no panic": a canonical query is its own canonical
//! form and names each parameter once; a route without parameters takes
//! only an empty query; `limit` is in 1..=10000; what an instance forwards
//! to its peers (`/v1/local/inferences/{enc(id)}`,
//! `/v1/local/voters?voter_prompt_id={enc(rubric)}`) is a valid URI with
//! well-formed escapes that decodes (or parses) back to the same id or
//! rubric.
#![no_main]

use axum::http::Uri;
use jurystream::api::http::{
    canonical_query, params, LeaderboardParams, NoParams, RubricParams, VotersParams,
    VOTERS_DEFAULT_LIMIT, VOTERS_MAX_LIMIT,
};
use jurystream::api::{malformed_escape, percent_encode, VoterOrder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Handlers see `Uri::path()` and `Uri::query()` (ASCII); the
    // functions take any text.
    let text = String::from_utf8_lossy(data);
    let s: &str = &text;

    // Encoding, for any text: unreserved bytes and escapes only, decoded
    // back as is, and a path segment the peer's router sees whole.
    let enc = percent_encode(s);
    assert!(enc
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"-._~%".contains(&c)));
    assert_eq!(malformed_escape(&enc), None);
    assert_eq!(
        percent_encoding::percent_decode_str(&enc).decode_utf8().as_deref(),
        Ok(s)
    );
    for route in ["/v1/local/inferences/", "/v1/local/voters/"] {
        let path = format!("{route}{enc}");
        let uri: Uri = path.parse().expect("the forwarded path is a URI");
        assert_eq!(uri.path(), path);
    }

    // A malformed escape is one: '%' without two hex digits after it.
    if let Some(i) = malformed_escape(s) {
        assert_eq!(s.as_bytes()[i], b'%');
        let next = &s.as_bytes()[i + 1..];
        assert!(next.len() < 2 || !next[..2].iter().all(u8::is_ascii_hexdigit));
    }

    // The text as the query string (after `?`).
    if let Ok(c) = canonical_query(s) {
        assert_eq!(canonical_query(&c).as_deref(), Ok(c.as_str()), "idempotent");
        assert!(c.len() <= s.len());
        let names: Vec<&str> = c
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').map_or(p, |(k, _)| k))
            .collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name twice in {c:?}");
        if params::<NoParams>(s).is_ok() {
            assert!(c.is_empty(), "/v1/rubrics takes no parameter: {s:?}");
        }
    } else {
        assert!(params::<NoParams>(s).is_err());
    }

    // `/v1/leaderboard?voter_prompt_id=R`: the same rubric as the peers'
    // route reads.
    if let Ok(LeaderboardParams { voter_prompt_id }) = params(s) {
        match params::<RubricParams>(s) {
            Ok(r) => assert_eq!(Some(r.voter_prompt_id), voter_prompt_id),
            Err(_) => assert_eq!(voter_prompt_id, None),
        }
    }

    // `/v1/voters?voter_prompt_id=R&order=…&limit=N`
    if let Ok(VotersParams {
        voter_prompt_id,
        order,
        limit,
    }) = params(s)
    {
        assert!((1..=VOTERS_MAX_LIMIT).contains(&limit), "limit {limit}");
        if !s.contains("limit") && !s.contains('%') {
            assert_eq!(limit, VOTERS_DEFAULT_LIMIT);
        }
        if !s.contains("deviation") && !s.contains('%') {
            assert_eq!(order, VoterOrder::VoterId);
        }
        // The peer request (`voters` in api/http.rs).
        let path = format!(
            "/v1/local/voters?voter_prompt_id={}",
            percent_encode(&voter_prompt_id)
        );
        let uri: Uri = path.parse().expect("the forwarded path is a URI");
        let back = params::<RubricParams>(uri.query().unwrap_or_default());
        assert_eq!(back.ok().map(|r| r.voter_prompt_id), Some(voter_prompt_id));
    }
});
