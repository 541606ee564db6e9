//! The shared conformance kit (`../shared/conformance/check.sh`, next to
//! this repository) against the built binary: every case must pass. Skipped
//! with a note when the kit is not there, unless JURYSTREAM_REQUIRE_BROKER=1
//! (then a missing kit fails).

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn shared_conformance_kit_passes() {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/check.sh");
    if !kit.is_file() {
        return common::skip_or_fail(
            &format!("conformance kit not found at {}", kit.display()),
            "the shared kit lives in ../shared/conformance, next to this repository",
        );
    }
    let out = Command::new("bash")
        .arg(&kit)
        .arg(env!("CARGO_BIN_EXE_jurystream"))
        .output()
        .expect("cannot run check.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "conformance kit failed (exit {:?}):\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout
            .lines()
            .last()
            .is_some_and(|l| l.ends_with(" 0 failed")),
        "unexpected summary:\n{stdout}"
    );
}
