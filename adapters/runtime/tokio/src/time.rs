//! The one place where tokio's clock meets the core's: conversions both ways, and the
//! [`Clock`] the shared driver sleeps on.
//!
//! Each lease takes its own origin when it starts instead of sharing a process-wide
//! one: tokio's paused-time tests give every runtime its own virtual clock, so an origin
//! taken under one runtime would be meaningless under the next. Only differences
//! between instants of the *same* lease matter to the core.

use std::future::Future;

use leasehold_driver::Clock;

/// How far in the future "never" is when a core instant does not fit tokio's clock;
/// the value tokio itself uses for a far-away deadline.
const FAR_FUTURE: std::time::Duration = std::time::Duration::from_secs(86_400 * 365 * 30);

/// A lease's monotonic clock: tokio's [`Instant`](tokio::time::Instant) measured from
/// the moment the lease started.
///
/// Honours tokio's paused time (`start_paused`, `tokio::time::advance`), so a lease
/// driven on a virtual clock checks its gate against that same virtual clock. Reading it
/// from a thread outside the runtime reads real time: call [`LeaseHandle::check`]
/// from the runtime's threads when the clock is paused.
///
/// [`LeaseHandle::check`]: crate::LeaseHandle::check
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseClock {
    origin: tokio::time::Instant,
}

impl LeaseClock {
    /// A clock whose origin is now.
    pub fn start() -> LeaseClock {
        LeaseClock::starting_at(tokio::time::Instant::now())
    }

    /// A clock whose origin is `origin`.
    pub const fn starting_at(origin: tokio::time::Instant) -> LeaseClock {
        LeaseClock { origin }
    }

    /// The tokio instant that is [`leasehold::Instant::ZERO`] on this clock.
    pub const fn origin(&self) -> tokio::time::Instant {
        self.origin
    }

    /// The current instant on this clock.
    pub fn now(&self) -> leasehold::Instant {
        self.to_lease(tokio::time::Instant::now())
    }

    /// `at` on this clock. Instants before the origin map to the origin (the core never
    /// sees time before its lease started); microseconds are truncated.
    pub fn to_lease(&self, at: tokio::time::Instant) -> leasehold::Instant {
        let since = at.saturating_duration_since(self.origin);
        leasehold::Instant::from_micros(u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }

    /// The tokio instant of `at`. An instant too far away for tokio (such as
    /// [`leasehold::Instant::MAX`]) maps to 30 years from the origin.
    pub fn to_tokio(&self, at: leasehold::Instant) -> tokio::time::Instant {
        let since = std::time::Duration::from_micros(at.as_micros());
        self.origin
            .checked_add(since)
            .or_else(|| self.origin.checked_add(FAR_FUTURE))
            .unwrap_or(self.origin)
    }
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

    #[tokio::test(start_paused = true)]
    async fn round_trips_and_counts_from_its_own_origin() {
        let clock = LeaseClock::start();
        assert_eq!(clock.now(), leasehold::Instant::ZERO);
        tokio::time::advance(std::time::Duration::from_micros(1_500)).await;
        let now = clock.now();
        assert_eq!(now, leasehold::Instant::from_micros(1_500));
        assert_eq!(clock.to_tokio(now), tokio::time::Instant::now());

        // A second lease started later has its own origin.
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
