//! `tracing` events, in one place so the `tracing` feature switches them all.
//!
//! Levels: a grant, a release and a failed acquire attempt are `debug`; a confirmed
//! renewal is `trace` (it is the steady state, every T/3); a renewal that failed and is
//! being retried is `warn`; a loss and a driver gone before the term ended are `error`
//! (writes stopped, a caller may be mid-work). Every event carries the key, the owner
//! token and, once granted, the fence.
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
}

#[cfg(feature = "tracing")]
mod on {
    use leasehold::{Duration, Event, OwnerToken};
    use tracing::{debug, error, trace, warn};

    use super::{ReleaseWhy, TimedEvent};

    pub(crate) fn event(key: &str, token: OwnerToken, timed: &TimedEvent, rtt: Option<Duration>) {
        let at = timed.lease_time;
        match timed.event {
            Event::Acquired {
                fence, deadline, ..
            } => debug!(key, %token, %at, fence = fence.0, %deadline, "lease acquired"),
            Event::AcquireFailed {
                reason,
                retry_at: Some(retry_at),
            } => {
                debug!(key, %token, %at, %reason, %retry_at, "acquire attempt failed, retrying")
            }
            Event::AcquireFailed {
                reason,
                retry_at: None,
            } => debug!(key, %token, %at, %reason, "acquire gave up"),
            Event::Renewed { deadline } => {
                trace!(key, %token, %at, %deadline, rtt = ?rtt, "lease renewed")
            }
            Event::RenewFailed {
                reason,
                retry_at,
                deadline,
                writes_paused,
            } => warn!(
                key, %token, %at, %reason, retry_at = ?retry_at, %deadline, writes_paused,
                "renewal failed, retrying inside the remaining budget"
            ),
            Event::Lost { reason } => {
                error!(key, %token, %at, %reason, "lease lost: writes stopped")
            }
            Event::Released => debug!(key, %token, %at, "lease released"),
            _ => debug!(key, %token, %at, event = ?timed.event, "lease event"),
        }
    }

    pub(crate) fn release_requested(key: &str, token: OwnerToken, why: ReleaseWhy) {
        debug!(key, %token, ?why, "release requested: writes stopped");
    }

    pub(crate) fn driver_stopped(key: &str, token: OwnerToken) {
        error!(key, %token, "lease driver stopped before the term ended: writes stopped");
    }
}

#[cfg(feature = "tracing")]
pub(crate) use on::{driver_stopped, event, release_requested};

#[cfg(not(feature = "tracing"))]
pub(crate) fn event(_: &str, _: OwnerToken, _: &TimedEvent, _: Option<Duration>) {}
#[cfg(not(feature = "tracing"))]
pub(crate) fn release_requested(_: &str, _: OwnerToken, _: ReleaseWhy) {}
#[cfg(not(feature = "tracing"))]
pub(crate) fn driver_stopped(_: &str, _: OwnerToken) {}
