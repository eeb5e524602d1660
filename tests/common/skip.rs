//! Why a test skips: printed, or a failure when `MEMTRACE_REQUIRE_ALL=1`
//! (set by `cargo xtask test` as root, after it installed every tool, so a
//! test that would pass without checking fails instead). Shared by the eBPF
//! tests (through `mod.rs`) and tests/formats.rs (included by path).

/// The variable that turns skips into failures.
pub const REQUIRE_ALL: &str = "MEMTRACE_REQUIRE_ALL";

/// Whether skips are failures here (`MEMTRACE_REQUIRE_ALL=1`).
pub fn skips_fail() -> bool {
    std::env::var_os(REQUIRE_ALL).is_some_and(|v| v == "1")
}

/// Reports that the calling test skips because of `why`: prints it, or
/// panics when [`skips_fail`].
pub fn skip(why: &str) {
    assert!(
        !skips_fail(),
        "{REQUIRE_ALL}=1 but this test would skip: {why}"
    );
    println!("skipping: {why}");
}
