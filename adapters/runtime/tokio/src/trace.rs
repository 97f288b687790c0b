//! `tracing` events, in one place so the `tracing` feature switches them all.
//!
//! Levels: a grant, a release and a failed acquire attempt are `debug`; a confirmed
//! renewal is `trace` (it is the steady state, every T/3); a renewal that failed and is
//! being retried is `warn`; a loss and a driver gone before the term ended are `error`
//! (writes stopped, a caller may be mid-work). Every event carries the key, the owner
//! token and, once granted, the fence.

use crate::shared::Shared;
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
    /// `try_acquire` found the key held by another.
    HeldByAnother,
}

#[cfg(feature = "tracing")]
mod on {
    use std::fmt;

    use leasehold::{Event, Term};
    use tracing::{debug, error, trace, warn};

    use super::{ReleaseWhy, Shared, TimedEvent};

    /// The owner token, rendered only if an event is actually recorded.
    struct Token<'a>(&'a Shared);

    impl fmt::Display for Token<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let term = self.0.granted().map_or(Term(1), |(_, term)| term);
            fmt::Display::fmt(&self.0.owner.token(term), f)
        }
    }

    pub(crate) fn event(shared: &Shared, timed: &TimedEvent) {
        let key = &*shared.key;
        let token = Token(shared);
        let at = timed.lease_time;
        match timed.event {
            Event::Acquired {
                fence, deadline, ..
            } => debug!(key, %token, %at, fence = fence.0, %deadline, "lease acquired"),
            Event::AcquireFailed { reason, retry_at } => {
                debug!(key, %token, %at, ?reason, %retry_at, "acquire attempt failed, retrying")
            }
            Event::Renewed { deadline } => trace!(key, %token, %at, %deadline, "lease renewed"),
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

    pub(crate) fn release_requested(shared: &Shared, why: ReleaseWhy) {
        debug!(key = &*shared.key, token = %Token(shared), ?why,
            "release requested: writes stopped");
    }

    pub(crate) fn driver_stopped(shared: &Shared) {
        error!(key = &*shared.key, token = %Token(shared),
            "lease driver stopped before the term ended: writes stopped");
    }
}

#[cfg(feature = "tracing")]
pub(crate) use on::{driver_stopped, event, release_requested};

#[cfg(not(feature = "tracing"))]
pub(crate) fn event(_: &Shared, _: &TimedEvent) {}
#[cfg(not(feature = "tracing"))]
pub(crate) fn release_requested(_: &Shared, _: ReleaseWhy) {}
#[cfg(not(feature = "tracing"))]
pub(crate) fn driver_stopped(_: &Shared) {}
