//! The one place that chooses the atomics: `core`'s normally, loom's under `cfg(loom)`.
//!
//! `loom-tests/` builds this crate with `--cfg loom`, so the model checker explores the
//! real [`WriteGate`](crate::WriteGate) code, not a copy of it.
//!
//! Only `AtomicU32` `load`/`store` are used: thumbv6m (Cortex-M0) has no compare-and-swap
//! and no 64-bit atomics.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, Ordering};

// The weakened orderings below exist for loom's models only: a build of the real
// atomics with them would be a gate that can hand out a torn fence.
#[cfg(all(leasehold_weak_gate, not(loom)))]
compile_error!(
    "`--cfg leasehold_weak_gate` weakens the write gate's orderings and is only for the \
     loom models: set it together with `--cfg loom` (scripts/loom.sh), never in a build \
     that runs"
);

/// Ordering of the gate's publishing stores.
///
/// `Release` is what makes a reader that sees any new word also see that a write was in
/// progress. `loom-tests` weakens it to `Relaxed` under `cfg(leasehold_weak_gate)`
/// (with `cfg(loom)` only: without it the crate does not compile) to show that the
/// model checker catches the torn read that results.
#[cfg(not(all(loom, leasehold_weak_gate)))]
pub(crate) const PUBLISH: Ordering = Ordering::Release;
#[cfg(all(loom, leasehold_weak_gate))]
pub(crate) const PUBLISH: Ordering = Ordering::Relaxed;

/// Ordering of the gate's reading loads; the counterpart of [`PUBLISH`].
#[cfg(not(all(loom, leasehold_weak_gate)))]
pub(crate) const OBSERVE: Ordering = Ordering::Acquire;
#[cfg(all(loom, leasehold_weak_gate))]
pub(crate) const OBSERVE: Ordering = Ordering::Relaxed;
