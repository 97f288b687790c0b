//! What a lease handle reports: where the lease is, how its term ended, and its
//! events with the time they happened.

use std::fmt;

use leasehold::{Event, Fence, Instant, LossReason, Stats};

/// Where a lease is in its life, as seen by its handles.
///
/// Instants are on the lease's own clock ([`LeaseHandle::clock`]); convert with
/// [`LeaseClock::to_tokio`](crate::LeaseClock::to_tokio).
///
/// [`LeaseHandle::clock`]: crate::LeaseHandle::clock
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseState {
    /// Waiting for a grant.
    Acquiring,
    /// Held, no renewal outstanding: `check()` passes until `deadline`.
    Holding {
        /// The term's fence.
        fence: Fence,
        /// The safe deadline.
        deadline: Instant,
    },
    /// Held, but the last renewal's outcome is unknown and it is being retried inside
    /// the remaining budget.
    RenewPending {
        /// The term's fence.
        fence: Fence,
        /// The unchanged safe deadline.
        deadline: Instant,
        /// Whether writes are paused until a renewal is confirmed (fail-closed).
        writes_paused: bool,
    },
    /// A release was requested: writes stopped; the release request may be in flight.
    Releasing,
    /// The term ended in loss: writes stopped. A best-effort release may be in flight.
    Lost(LossReason),
    /// The term ended by release.
    Released,
    /// The driver task is gone before the term ended (the runtime shut down, or the
    /// task panicked): nothing renews the lease, so writes stopped.
    DriverStopped,
}

impl LeaseState {
    /// The fence while the lease is held.
    pub const fn fence(&self) -> Option<Fence> {
        match *self {
            LeaseState::Holding { fence, .. } | LeaseState::RenewPending { fence, .. } => {
                Some(fence)
            }
            _ => None,
        }
    }

    /// The safe deadline while the lease is held.
    pub const fn deadline(&self) -> Option<Instant> {
        match *self {
            LeaseState::Holding { deadline, .. } | LeaseState::RenewPending { deadline, .. } => {
                Some(deadline)
            }
            _ => None,
        }
    }

    /// How the term ended, once writes stopped for good.
    pub const fn end(&self) -> Option<LeaseEnd> {
        match *self {
            LeaseState::Releasing | LeaseState::Released => Some(LeaseEnd::Released),
            LeaseState::Lost(reason) => Some(LeaseEnd::Lost(reason)),
            LeaseState::DriverStopped => Some(LeaseEnd::DriverStopped),
            LeaseState::Acquiring
            | LeaseState::Holding { .. }
            | LeaseState::RenewPending { .. } => None,
        }
    }
}

/// Why writes stopped for good: what [`LeaseHandle::lost`] resolves to.
///
/// [`LeaseHandle::lost`]: crate::LeaseHandle::lost
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseEnd {
    /// The lease was lost (expired, not owner, revoked, shortened).
    Lost(LossReason),
    /// The lease was released: [`release`](crate::LeaseHandle::release) was called or
    /// the last handle was dropped.
    Released,
    /// The driver task is gone (runtime shutdown or panic); nobody renews the lease,
    /// so it must be treated as lost.
    DriverStopped,
}

impl LeaseEnd {
    /// The loss reason, if the lease was lost.
    pub const fn loss_reason(&self) -> Option<LossReason> {
        match *self {
            LeaseEnd::Lost(reason) => Some(reason),
            _ => None,
        }
    }
}

impl fmt::Display for LeaseEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseEnd::Lost(reason) => write!(f, "lease lost: {reason}"),
            LeaseEnd::Released => f.write_str("lease released"),
            LeaseEnd::DriverStopped => f.write_str("lease driver stopped"),
        }
    }
}

/// A [`leasehold::Event`] and when the driver saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedEvent {
    /// When, on tokio's clock.
    pub at: tokio::time::Instant,
    /// When, on the lease's clock (comparable with the deadlines inside `event`).
    pub lease_time: Instant,
    /// What happened.
    pub event: Event,
}

/// Counters of one lease's term, from [`LeaseHandle::stats`](crate::LeaseHandle::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Acquire attempts that failed and were retried (held by another, or an
    /// unknown outcome), counted as each retry is scheduled.
    pub acquire_retries: u32,
    /// Renewals whose outcome was unknown and that were retried inside the budget,
    /// counted as each retry is scheduled.
    pub renewal_retries: u32,
    /// The core's counters: answers refused as stale and events overwritten before
    /// the driver took them. The core keeps them inside the driver task, which hands
    /// them over when the term ends (zero until then). Both stay zero with this
    /// runtime's driver, which drops the answers the lease stopped waiting for and
    /// takes every event after each step: a non-zero value is worth a bug report.
    pub core: Stats,
}
