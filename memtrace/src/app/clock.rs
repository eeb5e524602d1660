//! The session's clock, below every app step (the session, the census
//! worker's thread, allocator mode and the report's end time read it): the
//! kernel side's record times are CLOCK_MONOTONIC (`bpf_ktime_get_ns`).

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub(super) fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
        .unwrap_or(0)
}
