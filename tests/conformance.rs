//! The shared conformance kit (`../shared/conformance/check.sh`, next to
//! this repository) against the built binary: every case of `cases/` and
//! of `cases-v3/` (SPEC §13's fields) must pass. Skipped
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
    // Once with the default cache and once with none (state.cache_mb = 0).
    // The kit removes JURYSTREAM_* variables, so the second run goes
    // through a wrapper that sets it.
    let work = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_jurystream");
    let wrapper = work.path().join("jurystream-cache0");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nJURYSTREAM_STATE__CACHE_MB=0 exec '{bin}' \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let v3 = kit.with_file_name("cases-v3");
    assert!(v3.is_dir(), "{} is missing", v3.display());
    let sets = [("cases", None), ("cases-v3", Some(v3.as_path()))];
    for ((mb, program), (set, cases)) in
        [("64 (default)", Path::new(bin)), ("0", wrapper.as_path())]
            .into_iter()
            .flat_map(|p| sets.iter().map(move |s| (p, *s)))
    {
        let mut cmd = Command::new("bash");
        cmd.arg(&kit).arg(program);
        if let Some(dir) = cases {
            cmd.env("CHECK_CASES", dir);
        }
        let out = cmd.output().expect("cannot run check.sh");
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{set}, state.cache_mb {mb}:\n{stdout}");
        assert!(
            out.status.success(),
            "conformance kit ({set}) failed with state.cache_mb {mb} (exit {:?}):\n{stdout}\n{}",
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
}
