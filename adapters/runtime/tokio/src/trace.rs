//! `tracing` events and the lease span, in one place so the `tracing` feature switches
//! them all.
//!
//! Every lease's driver runs inside a span `lease` with the key, the holder identity
//! and, once granted, the fence. Events have the crate as their target
//! (`leasehold_tokio`, whatever module emits them), so one filter directive covers
//! them. Times are durations a person can read (`deadline_in=854.1ms`, `rtt=10ms`),
//! relative to the event: the subscriber stamps the event itself, and the lease's own
//! clock (microseconds since it started) means nothing outside it.
//!
//! Levels: a grant, a release and an acquire that gave up are `info`; a confirmed
//! renewal (with its round trip) and a retried acquire attempt are `debug` (the steady
//! state, every T/3); a renewal that failed and is being retried is `warn`; a loss
//! and a driver gone before the term ended are `error` (writes stopped, a caller may
//! be mid-work) — all visible under an `info` filter.
//!
//! The functions take plain values (key, token), not the lease's shared state, so
//! this module depends on nothing of the adapter but [`TimedEvent`].

#[cfg(not(feature = "tracing"))]
use leasehold::{Duration, OwnerToken};

use crate::TimedEvent;

/// Why a release was requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseWhy {
    /// [`LeaseHandle::release`](crate::LeaseHandle::release).
    Requested,
    /// The last handle was dropped.
    LastHandleDropped,
    /// The acquire future was dropped before it completed.
    AcquireCancelled,
    /// The acquire's wait bound ran out with an attempt in flight.
    AcquireTimedOut,
}

#[cfg(feature = "tracing")]
mod on {
    use leasehold::{Duration, Event, Identity, Instant, OwnerToken};
    use tracing::{debug, error, info, warn, Span};

    use super::{ReleaseWhy, TimedEvent};

    /// The target of every event: the crate, not the module.
    const TARGET: &str = "leasehold_tokio";

    /// `later − now` as a std duration, whose `Debug` reads `854.1ms`, `1.5s`.
    fn until(now: Instant, later: Instant) -> std::time::Duration {
        later
            .checked_duration_since(now)
            .unwrap_or(Duration::ZERO)
            .into()
    }

    fn human(d: Duration) -> std::time::Duration {
        d.into()
    }

    /// The span a lease's driver runs in; the fence is recorded at the grant.
    pub(crate) fn lease_span(key: &str, identity: &Identity) -> Span {
        tracing::info_span!(
            target: TARGET,
            "lease",
            key,
            holder = %identity,
            fence = tracing::field::Empty
        )
    }

    /// Called from the driver, inside the lease's span. `took`: a renewal's round
    /// trip, an acquire's wait.
    pub(crate) fn event(key: &str, token: OwnerToken, timed: &TimedEvent, took: Option<Duration>) {
        let at = timed.lease_time;
        match timed.event {
            Event::Acquired {
                fence,
                deadline,
                granted,
                ..
            } => {
                Span::current().record("fence", fence.0);
                info!(
                    target: TARGET,
                    key, %token, fence = fence.0, ttl = ?human(granted),
                    deadline_in = ?until(at, deadline),
                    waited = took.map(|d| tracing::field::debug(human(d))),
                    "lease acquired"
                );
            }
            Event::AcquireFailed {
                reason,
                retry_at: Some(retry_at),
                ..
            } => debug!(
                target: TARGET,
                key, %token, %reason, retry_in = ?until(at, retry_at),
                "acquire attempt failed, retrying"
            ),
            Event::AcquireFailed {
                reason,
                retry_at: None,
                ..
            } => info!(
                target: TARGET,
                key, %token, %reason, waited = took.map(|d| tracing::field::debug(human(d))),
                "acquire gave up"
            ),
            Event::Renewed { deadline, .. } => debug!(
                target: TARGET,
                key, %token, rtt = took.map(|d| tracing::field::debug(human(d))),
                deadline_in = ?until(at, deadline),
                "lease renewed"
            ),
            Event::RenewFailed {
                reason,
                retry_at,
                deadline,
                writes_paused,
                ..
            } => warn!(
                target: TARGET,
                key, %token, %reason,
                retry_in = retry_at.map(|r| tracing::field::debug(until(at, r))),
                deadline_in = ?until(at, deadline), writes_paused,
                "renewal failed, retrying inside the remaining budget"
            ),
            Event::Lost { reason, .. } => {
                error!(target: TARGET, key, %token, %reason, "lease lost: writes stopped")
            }
            Event::Released => info!(target: TARGET, key, %token, "lease released"),
            _ => debug!(target: TARGET, key, %token, event = ?timed.event, "lease event"),
        }
    }

    pub(crate) fn release_requested(key: &str, token: OwnerToken, why: ReleaseWhy) {
        debug!(target: TARGET, key, %token, ?why, "release requested: writes stopped");
    }

    /// The hard wait bound ran out with an attempt in flight (the core, which saw a
    /// release, reports no final failure).
    pub(crate) fn acquire_timed_out(key: &str, token: OwnerToken, reason: &str) {
        info!(target: TARGET, key, %token, reason, "acquire gave up at its wait bound");
    }

    pub(crate) fn driver_stopped(key: &str, token: OwnerToken) {
        error!(
            target: TARGET,
            key, %token,
            "lease driver stopped before the term ended: writes stopped"
        );
    }
}

#[cfg(feature = "tracing")]
pub(crate) use on::{acquire_timed_out, driver_stopped, event, lease_span, release_requested};

#[cfg(not(feature = "tracing"))]
pub(crate) fn event(_: &str, _: OwnerToken, _: &TimedEvent, _: Option<Duration>) {}
#[cfg(not(feature = "tracing"))]
pub(crate) fn release_requested(_: &str, _: OwnerToken, _: ReleaseWhy) {}
#[cfg(not(feature = "tracing"))]
pub(crate) fn driver_stopped(_: &str, _: OwnerToken) {}
#[cfg(not(feature = "tracing"))]
pub(crate) fn acquire_timed_out(_: &str, _: OwnerToken, _: &str) {}
