//! Renewals before acquires: a set driver starts a new lease only while the leases it
//! holds are renewed on time.
//!
//! A burst of acquires competes with the renewals of the leases already held, for the
//! service's one queue and for the driver's own time. Counting the acquires in flight
//! bounds the burst but not its cost: a service (or a process) that is busy enough
//! answers renewals late even with few acquires on the wire, and a renewal answered
//! past its request timeout is retried, which adds load, until leases are lost. So
//! admission follows what the held leases see, as of the latest renewal: one answered
//! more than half the request timeout after it was sent (half way to being retried),
//! one that failed, or a deadline the driver reached that late, closes admission; a
//! renewal answered in time opens it again, and so does one renew interval (plus a
//! request timeout) without any renewal at all, since then no held lease is left to
//! protect. While admission is closed the driver keeps one acquire in flight instead
//! of many: the leases waiting still start, one round trip at a time, so a service
//! that is slow for good delays new leases but never starves them.

use leasehold::{Config, Duration, Event, Instant};

/// When new leases may start.
pub(super) struct Admission {
    /// Lateness past which the leases held are in trouble.
    late: Duration,
    /// How long admission stays closed after the latest sign of trouble, unless a
    /// renewal in time opens it first: one renew interval and a request timeout, by
    /// when every held lease has sent a renewal and seen it answered or time out.
    hold: Duration,
    /// Closed until then.
    closed_until: Instant,
}

impl Admission {
    pub(super) fn new(config: &Config) -> Admission {
        let timeout = config.request_timeout();
        Admission {
            late: timeout.checked_div(2).unwrap_or(timeout),
            hold: config.renew_interval().saturating_add(timeout),
            closed_until: Instant::ZERO,
        }
    }

    /// Whether admission is open at `now`.
    pub(super) fn open(&self, now: Instant) -> bool {
        now >= self.closed_until
    }

    /// How many acquire requests may be in flight at `now`: `open`, or one.
    pub(super) fn acquires_in_flight(&self, now: Instant, open: usize) -> usize {
        if self.open(now) {
            open
        } else {
            1
        }
    }

    /// When admission opens again, if it is closed at `now`.
    pub(super) fn reopens(&self, now: Instant) -> Option<Instant> {
        (!self.open(now)).then_some(self.closed_until)
    }

    /// A lease reported `event` at `now`.
    pub(super) fn event(&mut self, event: &Event, now: Instant) {
        match *event {
            Event::Renewed { sent_at, .. } => self.renewed(sent_at, now),
            Event::RenewFailed { .. } => self.close(now),
            _ => {}
        }
    }

    /// A renewal sent at `sent_at` was confirmed at `now`: late, it closes admission;
    /// in time, it opens it.
    fn renewed(&mut self, sent_at: Instant, now: Instant) {
        if now.saturating_duration_since(sent_at) > self.late {
            self.close(now);
        } else {
            self.closed_until = now;
        }
    }

    /// The driver reached a deadline due at `due` at `now`: late, it closes admission.
    pub(super) fn deadline(&mut self, due: Instant, now: Instant) {
        if now.saturating_duration_since(due) > self.late {
            self.close(now);
        }
    }

    fn close(&mut self, now: Instant) {
        self.closed_until = self.closed_until.max(now.saturating_add(self.hold));
    }
}

#[cfg(test)]
mod tests {
    use leasehold::{Config, Duration, Instant};

    use super::Admission;

    fn ms(n: u64) -> Instant {
        Instant::from_micros(n * 1_000)
    }

    /// TTL 3 s: renew interval 1 s, request timeout 300 ms, so lateness past 150 ms
    /// closes admission for up to 1.3 s.
    fn admission() -> Admission {
        Admission::new(&Config::builder(Duration::from_secs(3)).build().unwrap())
    }

    #[test]
    fn a_late_renewal_closes_admission_and_one_in_time_opens_it() {
        let mut admission = admission();
        assert!(admission.open(ms(1_000)));
        admission.renewed(ms(1_000), ms(1_150)); // in time
        assert!(admission.open(ms(1_150)));
        assert_eq!(admission.acquires_in_flight(ms(1_150), 256), 256);
        admission.renewed(ms(1_000), ms(1_151));
        assert!(!admission.open(ms(1_151)));
        assert_eq!(admission.acquires_in_flight(ms(1_151), 256), 1);
        assert_eq!(admission.reopens(ms(1_200)), Some(ms(2_451)));
        admission.renewed(ms(1_300), ms(1_310));
        assert!(admission.open(ms(1_310)));
        assert_eq!(admission.reopens(ms(1_310)), None);
    }

    #[test]
    fn a_failed_renewal_or_a_late_deadline_closes_it_until_the_hold_passes() {
        let mut admission = admission();
        admission.deadline(ms(500), ms(650));
        assert!(admission.open(ms(650)));
        admission.deadline(ms(500), ms(651));
        assert_eq!(admission.reopens(ms(651)), Some(ms(1_951)));
        assert!(admission.open(ms(1_951)));

        let mut admission = self::admission();
        admission.close(ms(2_000));
        assert_eq!(admission.reopens(ms(2_000)), Some(ms(3_300)));
        // A later sign of trouble keeps it closed longer; an earlier one does not
        // shorten it.
        admission.close(ms(2_100));
        admission.close(ms(1_900));
        assert_eq!(admission.reopens(ms(2_200)), Some(ms(3_400)));
    }
}
