//! The one place where tokio's clock meets the core's: conversions both ways, and the
//! [`Clock`] the shared driver sleeps on.
//!
//! A clock's origin is when its first lease started (a set's, when the set was made;
//! tasks started on one thread with the same config share one), not one for the
//! process: tokio's paused-time tests give every runtime its own virtual clock, so an
//! origin taken under one runtime may lie in the future of the next. Only differences
//! between instants of the *same* lease matter to the core.

use std::future::Future;

use leasehold_driver::Clock;

/// How far in the future "never" is when a core instant does not fit tokio's clock;
/// the value tokio itself uses for a far-away deadline.
const FAR_FUTURE: std::time::Duration = std::time::Duration::from_secs(86_400 * 365 * 30);

/// A lease's monotonic clock: tokio's [`Instant`](tokio::time::Instant) measured from
/// the clock's origin (at or before the moment the lease started), plus the time the
/// machine was suspended since then.
///
/// Honours tokio's paused time (`start_paused`, `tokio::time::advance`), so a lease
/// driven on a virtual clock checks its gate against that same virtual clock. Reading it
/// from a thread outside the runtime reads real time: call [`LeaseHandle::check`]
/// from the runtime's threads when the clock is paused.
///
/// **Suspend.** tokio's clock (`CLOCK_MONOTONIC` on Linux) stops while the machine is
/// suspended, but the lock service's clock does not: a laptop or VM resumed after its
/// lease expired would still pass `check()` on it. So on Linux and Android this clock
/// also counts the suspended time (`CLOCK_BOOTTIME` − `CLOCK_MONOTONIC`, which grows
/// only during a suspend), and after a resume `check()` refuses at once if the
/// deadline passed meanwhile. Elsewhere it is tokio's clock alone (macOS's and
/// Windows' monotonic clocks are documented to keep counting, or not, by platform).
///
/// [`LeaseHandle::check`]: crate::LeaseHandle::check
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseClock {
    origin: tokio::time::Instant,
    /// The suspended time (see above) at the origin, in nanoseconds (584 years fit),
    /// 8 B less than a `Duration` in every lease.
    suspended_at_origin: u64,
}

impl LeaseClock {
    /// A clock whose origin is now.
    pub fn start() -> LeaseClock {
        LeaseClock::starting_at(tokio::time::Instant::now())
    }

    /// A clock whose origin is `origin`.
    pub fn starting_at(origin: tokio::time::Instant) -> LeaseClock {
        LeaseClock {
            origin,
            suspended_at_origin: u64::try_from(suspended().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// The tokio instant that was [`leasehold::Instant::ZERO`] on this clock (before
    /// any suspend; see [`to_tokio`](Self::to_tokio)).
    pub const fn origin(&self) -> tokio::time::Instant {
        self.origin
    }

    /// The current instant on this clock.
    pub fn now(&self) -> leasehold::Instant {
        self.to_lease(tokio::time::Instant::now())
    }

    /// How long the machine was suspended since the origin: the growth of
    /// [`suspended`], when it is at least [`SUSPEND_FLOOR`] (below it, what moved is
    /// the readings' own jitter, not a suspend).
    fn suspended_since_origin(&self) -> std::time::Duration {
        let at_origin = std::time::Duration::from_nanos(self.suspended_at_origin);
        let grown = suspended().saturating_sub(at_origin);
        if grown >= SUSPEND_FLOOR {
            grown
        } else {
            std::time::Duration::ZERO
        }
    }

    /// `at` on this clock, counting the suspends up to now. Instants before the origin
    /// map to the origin (no lease on this clock started before it);
    /// microseconds are truncated.
    pub fn to_lease(&self, at: tokio::time::Instant) -> leasehold::Instant {
        let since = at
            .saturating_duration_since(self.origin)
            .saturating_add(self.suspended_since_origin());
        leasehold::Instant::from_micros(u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }

    /// The tokio instant of `at`, for a timer: the suspends up to now are taken out,
    /// since tokio's clock did not count them. An instant too far away for tokio (such
    /// as [`leasehold::Instant::MAX`]) maps to 30 years from the origin.
    pub fn to_tokio(&self, at: leasehold::Instant) -> tokio::time::Instant {
        let since = std::time::Duration::from_micros(at.as_micros())
            .saturating_sub(self.suspended_since_origin());
        self.origin
            .checked_add(since)
            .or_else(|| self.origin.checked_add(FAR_FUTURE))
            .unwrap_or(self.origin)
    }
}

/// The smallest growth of the suspended time a lease's clock counts. Real suspends
/// last seconds; the readings differ by far less than this unless the machine slept
/// (see [`suspended`]), and a suspend this short is within every lease's drift
/// allowance.
const SUSPEND_FLOOR: std::time::Duration = std::time::Duration::from_millis(1);

/// How long the machine has been suspended since it booted: `CLOCK_BOOTTIME` −
/// `CLOCK_MONOTONIC` (the two advance together except during a suspend).
///
/// The two clocks cannot be read at one instant, so monotonic is read on both sides of
/// the boot-time read: the answer is at most the gap between those two reads below the
/// true value, and a gap over 50 µs (the thread was preempted in between) is read
/// again, up to three times. So it errs by microseconds, far below
/// [`SUSPEND_FLOOR`].
///
/// A lease reads its clock several times a renewal, so each thread keeps its last
/// answer with the boot time it was read at, and gives it again while the boot time
/// has moved less than [`REREAD_AFTER`] since: one clock read instead of three (see
/// [`Reading::reuse`]).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn suspended() -> std::time::Duration {
    #[cfg(test)]
    if let Some(fake) = tests::FAKE_SUSPENDED.with(std::cell::Cell::get) {
        return fake;
    }
    use rustix::time::{clock_gettime, ClockId};
    std::thread_local! {
        static LAST: std::cell::Cell<Option<Reading>> = const { std::cell::Cell::new(None) };
    }
    let read = |id| {
        let t = clock_gettime(id);
        std::time::Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    };
    let last = LAST.with(std::cell::Cell::get);
    if let Some(suspended) = last.and_then(|last| last.reuse(read(ClockId::Boottime))) {
        return suspended;
    }
    let mut reading = Reading::default();
    for _ in 0..3 {
        let before = read(ClockId::Monotonic);
        let boottime = read(ClockId::Boottime);
        let after = read(ClockId::Monotonic);
        reading = Reading {
            boottime,
            suspended: boottime.saturating_sub(after),
        };
        if after.saturating_sub(before) <= std::time::Duration::from_micros(50) {
            break;
        }
    }
    LAST.with(|last| last.set(Some(reading)));
    reading.suspended
}

/// How far the boot time may move before a thread reads the suspended time again.
const REREAD_AFTER: std::time::Duration = std::time::Duration::from_micros(100);

/// A reading of the suspended time, and the boot time it was taken at.
#[derive(Clone, Copy, Debug, Default)]
struct Reading {
    boottime: std::time::Duration,
    suspended: std::time::Duration,
}

impl Reading {
    /// This reading's answer when the boot time is now `boottime`, if it is still
    /// good. A suspend since the reading advanced the boot time by at least its
    /// length, so while the boot time has moved less than [`REREAD_AFTER`], any
    /// suspend the reading missed is shorter than that: the answer is at most 100 µs
    /// short, again far below [`SUSPEND_FLOOR`]. A longer suspend moves the boot time
    /// past the bound, and the next read sees it.
    fn reuse(self, boottime: std::time::Duration) -> Option<std::time::Duration> {
        let moved = boottime.checked_sub(self.boottime)?;
        (moved < REREAD_AFTER).then_some(self.suspended)
    }
}

/// Elsewhere: no suspended time is counted (see [`LeaseClock`]).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn suspended() -> std::time::Duration {
    std::time::Duration::ZERO
}

impl Clock for LeaseClock {
    fn now(&self) -> leasehold::Instant {
        LeaseClock::now(self)
    }

    fn sleep_until(&self, deadline: leasehold::Instant) -> impl Future<Output = ()> {
        // tokio's timer rounds up to whole milliseconds, so this completes at or after
        // `deadline`, never before: the lease never sees a deadline early.
        tokio::time::sleep_until(self.to_tokio(deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    std::thread_local! {
        /// A suspended time to report instead of the machine's (Linux), for tests.
        pub(super) static FAKE_SUSPENDED: std::cell::Cell<Option<std::time::Duration>> =
            const { std::cell::Cell::new(None) };
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[tokio::test(start_paused = true)]
    async fn a_suspend_counts_on_the_lease_clock_and_timers_take_it_out() {
        FAKE_SUSPENDED.with(|s| s.set(Some(std::time::Duration::from_secs(40))));
        let clock = LeaseClock::start();
        assert_eq!(clock.now(), leasehold::Instant::ZERO);
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        // The machine sleeps 5 s: tokio's clock does not move, the lease's does.
        FAKE_SUSPENDED.with(|s| s.set(Some(std::time::Duration::from_secs(45))));
        assert_eq!(clock.now(), leasehold::Instant::from_secs(6));
        // A timer for the lease's 8 s is tokio's now + 2 s.
        assert_eq!(
            clock.to_tokio(leasehold::Instant::from_secs(8)),
            tokio::time::Instant::now() + std::time::Duration::from_secs(2)
        );
        assert_eq!(clock.to_tokio(clock.now()), tokio::time::Instant::now());
        FAKE_SUSPENDED.with(|s| s.set(None));
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[tokio::test(start_paused = true)]
    async fn growth_below_the_floor_is_jitter_not_a_suspend() {
        FAKE_SUSPENDED.with(|s| s.set(Some(std::time::Duration::from_secs(40))));
        let clock = LeaseClock::start();
        tokio::time::advance(std::time::Duration::from_millis(300)).await;
        let just_below =
            std::time::Duration::from_secs(40) + SUSPEND_FLOOR - std::time::Duration::from_nanos(1);
        FAKE_SUSPENDED.with(|s| s.set(Some(just_below)));
        assert_eq!(clock.now(), leasehold::Instant::from_millis(300));
        assert_eq!(
            clock.to_tokio(leasehold::Instant::from_millis(900)),
            clock.origin() + std::time::Duration::from_millis(900)
        );
        FAKE_SUSPENDED.with(|s| s.set(None));
    }

    /// The rule: after the machine slept past the lease's deadline, the gate refuses at
    /// once on resume, before the driver has run (its timers are tokio's and did not
    /// count the suspend).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[tokio::test(start_paused = true)]
    async fn a_lease_resumed_past_its_deadline_refuses_writes_at_once() {
        use std::sync::Arc;
        FAKE_SUSPENDED.with(|s| s.set(Some(std::time::Duration::ZERO)));
        let service = Arc::new(crate::memory::MemoryService::new());
        let config = leasehold::Config::builder(leasehold::Duration::from_secs(3))
            .build()
            .unwrap();
        let lease = crate::acquire(service, "k", config).await.unwrap();
        assert!(lease.check().is_ok());
        FAKE_SUSPENDED.with(|s| s.set(Some(std::time::Duration::from_secs(10))));
        let refused = lease.check();
        assert_eq!(
            refused.err().and_then(|e| e.loss()),
            Some(leasehold::LossReason::Expired),
            "{refused:?}"
        );
        FAKE_SUSPENDED.with(|s| s.set(None));
    }

    /// A reading is given again only while the boot time moved less than the bound:
    /// a suspend moves it at least as far as the suspend lasted.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_suspended_time_is_read_again_once_the_boot_time_moved_a_tenth_of_a_millisecond() {
        let reading = Reading {
            boottime: std::time::Duration::from_secs(100),
            suspended: std::time::Duration::from_secs(7),
        };
        let after =
            |micros| reading.reuse(reading.boottime + std::time::Duration::from_micros(micros));
        assert_eq!(after(0), Some(reading.suspended));
        assert_eq!(after(99), Some(reading.suspended));
        // A suspend of 100 µs or longer since the reading: read again.
        assert_eq!(after(100), None);
        assert_eq!(after(5_000_000), None);
        // A boot time before the reading's is not this thread's newer read: read again.
        assert_eq!(reading.reuse(std::time::Duration::from_secs(99)), None);
    }

    #[test]
    fn the_machine_suspended_time_is_read_without_failing() {
        // On this machine: some non-negative duration, stable between two reads
        // (no suspend in between) to well within a millisecond.
        let (a, b) = (suspended(), suspended());
        assert!(
            a.abs_diff(b) < std::time::Duration::from_millis(1),
            "{a:?} {b:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn round_trips_and_counts_from_its_own_origin() {
        let clock = LeaseClock::start();
        assert_eq!(clock.now(), leasehold::Instant::ZERO);
        tokio::time::advance(std::time::Duration::from_micros(1_500)).await;
        let now = clock.now();
        assert_eq!(now, leasehold::Instant::from_micros(1_500));
        assert_eq!(clock.to_tokio(now), tokio::time::Instant::now());

        // A clock started later has its own origin.
        let later = LeaseClock::start();
        assert_eq!(later.now(), leasehold::Instant::ZERO);
        assert_eq!(later.to_lease(clock.origin()), leasehold::Instant::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn never_is_far_away_but_representable() {
        let clock = LeaseClock::start();
        let never = clock.to_tokio(leasehold::Instant::MAX);
        assert!(never > clock.origin() + std::time::Duration::from_secs(86_400 * 365));
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_until_wakes_at_the_deadline_not_before() {
        let clock = LeaseClock::start();
        let deadline = leasehold::Instant::from_micros(2_300);
        Clock::sleep_until(&clock, deadline).await;
        assert!(clock.now() >= deadline);
        assert!(clock.now() < leasehold::Instant::from_millis(4));
    }
}
