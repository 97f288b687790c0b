//! `CLOCK_BOOTTIME`: the clock the reaper's timer runs on. It is system-wide (both
//! processes read the same value) and counts the time the machine was suspended, as
//! the lock service's clock does, so a laptop resumed past the deadline stops the
//! command at once.

use leasehold_tokio::LeaseClock;

/// Now, in nanoseconds since boot.
pub fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    })
}

/// The boot-time instant of `at` (a tokio instant of the lease whose clock is
/// `clock`). Boot time is read first, then the lease's clock (which counts a suspend
/// too): whatever happens between the two readings makes the remaining time smaller,
/// so the answer is never later than the true instant.
pub fn of(clock: &LeaseClock, at: tokio::time::Instant) -> u64 {
    let boot = now_ns();
    let remaining = clock.to_lease(at).saturating_duration_since(clock.now());
    boot.saturating_add(remaining.as_micros().saturating_mul(1_000))
}
