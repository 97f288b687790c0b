//! Fencing tokens, and the storage-side gate that rejects stale writers.
//!
//! The write gate stops a holder that *knows* it lost the lease. It cannot stop a
//! holder that passed `check()` and then paused (GC, SIGSTOP, a preempting interrupt)
//! past the service's expiry: that write is already on its way. Storage stops it, by
//! refusing any write whose fence is older than the newest one it has seen.

use core::fmt;

/// A fencing token: a number the lock service hands out with each grant, strictly
/// increasing across grants of the same lock.
///
/// Storage admits a write only with a fence at least as new as the newest it has seen
/// (see [`FenceGate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fence {}", self.0)
    }
}

/// Storage-side check: admits a fence no older than the newest admitted, rejects the rest.
///
/// Put one in front of each resource the lock protects, on the storage side (it is a
/// plain value: wrap it in the storage's own lock, or keep it per shard).
///
/// ```
/// use leasehold::{Fence, FenceGate, StaleFence};
///
/// let mut storage = FenceGate::new();
/// assert_eq!(storage.admit(Fence(7)), Ok(()));
/// assert_eq!(storage.admit(Fence(7)), Ok(()), "the same holder may write again");
/// assert_eq!(storage.admit(Fence(9)), Ok(()), "a newer holder takes over");
/// // The old holder wakes from a pause and tries to write:
/// assert_eq!(
///     storage.admit(Fence(7)),
///     Err(StaleFence { presented: Fence(7), newest: Fence(9) })
/// );
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FenceGate {
    newest: Option<Fence>,
}

impl FenceGate {
    /// A gate that has admitted nothing yet.
    pub const fn new() -> FenceGate {
        FenceGate { newest: None }
    }

    /// A gate that starts from a fence already persisted by the storage (for example
    /// after a restart), so that holders older than it stay rejected.
    pub const fn starting_at(newest: Fence) -> FenceGate {
        FenceGate {
            newest: Some(newest),
        }
    }

    /// The newest fence admitted so far.
    pub const fn newest(&self) -> Option<Fence> {
        self.newest
    }

    /// Admits `fence` if it is at least as new as every fence admitted before.
    ///
    /// On success the gate remembers it; on failure nothing changes and the error
    /// names both values.
    pub fn admit(&mut self, fence: Fence) -> Result<(), StaleFence> {
        match self.newest {
            Some(newest) if fence < newest => Err(StaleFence {
                presented: fence,
                newest,
            }),
            _ => {
                self.newest = Some(fence);
                Ok(())
            }
        }
    }
}

/// A write was refused because its fence is older than one storage already admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StaleFence {
    /// The fence the writer presented.
    pub presented: Fence,
    /// The newest fence storage has admitted.
    pub newest: Fence,
}

impl fmt::Display for StaleFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stale writer: presented {} but storage already admitted {}",
            self.presented, self.newest
        )
    }
}

impl core::error::Error for StaleFence {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_equal_or_newer_and_rejects_older_with_both_values() {
        let mut gate = FenceGate::new();
        assert_eq!(gate.newest(), None);
        assert_eq!(gate.admit(Fence(3)), Ok(()));
        assert_eq!(gate.admit(Fence(3)), Ok(()));
        assert_eq!(gate.admit(Fence(4)), Ok(()));
        let err = gate.admit(Fence(3)).unwrap_err();
        assert_eq!(
            err,
            StaleFence {
                presented: Fence(3),
                newest: Fence(4)
            }
        );
        assert_eq!(gate.newest(), Some(Fence(4)), "a refusal changes nothing");
    }

    #[test]
    fn a_gate_restored_after_restart_keeps_rejecting_old_holders() {
        let mut gate = FenceGate::starting_at(Fence(10));
        assert!(gate.admit(Fence(9)).is_err());
        assert_eq!(gate.admit(Fence(10)), Ok(()));
    }
}
