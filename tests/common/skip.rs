//! What a test does when something it needs is missing (a broker, a tool,
//! the shared conformance kit). Shared by `tests/common` and
//! `tests/kafka_support` (which includes this file by path), so every test
//! skips, or fails, the same way.

/// Whether a missing prerequisite fails the test instead of skipping it:
/// `JURYSTREAM_REQUIRE_BROKER=1` (scripts/test.sh and CI set it).
pub fn prerequisites_required() -> bool {
    std::env::var("JURYSTREAM_REQUIRE_BROKER").as_deref() == Ok("1")
}

/// The test cannot run because `missing` is not there (`hint`: how to get
/// it). Panics with that message under `JURYSTREAM_REQUIRE_BROKER=1`;
/// otherwise prints "SKIPPED: …" and returns, and the caller returns.
#[track_caller]
pub fn skip_or_fail(missing: &str, hint: &str) {
    if prerequisites_required() {
        panic!(
            "{missing} ({hint}); JURYSTREAM_REQUIRE_BROKER=1 makes a missing \
             prerequisite a failure, not a skip"
        );
    }
    eprintln!("SKIPPED: {missing} ({hint})");
}
