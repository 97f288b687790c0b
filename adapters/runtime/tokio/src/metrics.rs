//! Lease metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`), in one place so the feature switches them all. Names, labels and
//! meanings are listed in the README ("Metrics and tracing").
//!
//! Everything is derived from the driver's reports ([`TimedEvent`]s; a renewal's
//! round trip from its `Renewed` event); nothing here feeds back into the lease.
//!
//! Labels are small closed sets (a result, a reason), with one exception: the safety
//! margin gauge carries the `key`, because it is per lease by nature (a process-wide
//! gauge would show whichever lease renewed last, hiding the one in trouble). Its
//! series count is the number of keys this process holds; a process that takes a
//! lease per entity (per order, per tenant) gets a series per entity.

#[cfg(not(feature = "metrics"))]
use leasehold::Duration;

use crate::TimedEvent;

#[cfg(feature = "metrics")]
mod on {
    use leasehold::{AcquireFailure, Duration, Event, Indeterminate, LossReason};
    use metrics::{counter, gauge, histogram};

    use super::TimedEvent;

    pub(crate) const ACQUIRES: &str = "leasehold_acquires_total";
    pub(crate) const RENEWALS: &str = "leasehold_renewals_total";
    pub(crate) const RENEWAL_FAILURES: &str = "leasehold_renewal_failures_total";
    pub(crate) const LOSSES: &str = "leasehold_losses_total";
    pub(crate) const RENEWAL_RTT: &str = "leasehold_renewal_rtt_seconds";
    pub(crate) const ACQUIRE_WAIT: &str = "leasehold_acquire_wait_seconds";
    pub(crate) const HELD: &str = "leasehold_leases_held";
    pub(crate) const SAFETY_MARGIN: &str = "leasehold_safety_margin_seconds";

    fn seconds(d: Duration) -> f64 {
        // µs to s; exact enough for any lease (2^53 µs is 285 years).
        d.as_micros() as f64 / 1e6
    }

    /// `took`: a renewal's round trip, an acquire's wait.
    pub(crate) fn event(key: &str, timed: &TimedEvent, took: Option<Duration>) {
        let now = timed.lease_time;
        let margin = |deadline: leasehold::Instant| {
            let left = deadline
                .checked_duration_since(now)
                .unwrap_or(Duration::ZERO);
            gauge!(SAFETY_MARGIN, "key" => key.to_owned()).set(seconds(left));
        };
        match timed.event {
            Event::Acquired { deadline, .. } => {
                counter!(ACQUIRES, "result" => "granted").increment(1);
                histogram!(ACQUIRE_WAIT).record(seconds(took.unwrap_or(Duration::ZERO)));
                margin(deadline);
            }
            Event::AcquireFailed {
                reason,
                retry_at: None,
                ..
            } => {
                let result = match reason {
                    AcquireFailure::HeldByAnother => "busy",
                    AcquireFailure::Indeterminate(_) => "unavailable",
                    AcquireFailure::Refused(_) => "refused",
                    _ => "grant_too_short",
                };
                counter!(ACQUIRES, "result" => result).increment(1);
            }
            Event::Renewed { deadline, .. } => {
                counter!(RENEWALS).increment(1);
                if let Some(rtt) = took {
                    histogram!(RENEWAL_RTT).record(seconds(rtt));
                }
                margin(deadline);
            }
            Event::RenewFailed { reason, .. } => {
                let reason = match reason {
                    Indeterminate::Timeout => "timeout",
                    Indeterminate::Transport => "transport",
                    Indeterminate::Protocol => "protocol",
                    Indeterminate::Service => "service",
                    _ => "other",
                };
                counter!(RENEWAL_FAILURES, "reason" => reason).increment(1);
            }
            Event::Lost { reason, .. } => {
                let reason = match reason {
                    LossReason::NotOwner => "not_owner",
                    LossReason::Expired => "expired",
                    LossReason::Revoked => "revoked",
                    LossReason::Shortened => "shortened",
                    LossReason::Refused => "refused",
                    _ => "other",
                };
                counter!(LOSSES, "reason" => reason).increment(1);
            }
            _ => {}
        }
    }

    pub(crate) fn held(delta: f64) {
        gauge!(HELD).increment(delta);
    }

    pub(crate) fn driver_stopped() {
        counter!(LOSSES, "reason" => "driver_stopped").increment(1);
    }

    /// The acquire's hard wait bound ran out with an attempt in flight: the core
    /// saw a release, not a final failure, so the acquire is counted here.
    pub(crate) fn acquire_timed_out(busy: bool) {
        let result = if busy { "busy" } else { "unavailable" };
        counter!(ACQUIRES, "result" => result).increment(1);
    }
}

#[cfg(feature = "metrics")]
pub(crate) use on::{acquire_timed_out, driver_stopped, event, held};

#[cfg(not(feature = "metrics"))]
pub(crate) fn event(_: &str, _: &TimedEvent, _: Option<Duration>) {}
#[cfg(not(feature = "metrics"))]
pub(crate) fn held(_: f64) {}
#[cfg(not(feature = "metrics"))]
pub(crate) fn driver_stopped() {}
#[cfg(not(feature = "metrics"))]
pub(crate) fn acquire_timed_out(_: bool) {}
