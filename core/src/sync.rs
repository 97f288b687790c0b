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

/// Ordering of the gate's publishing stores.
///
/// `Release` is what makes a reader that sees any new word also see that a write was in
/// progress. `loom-tests` weakens it to `Relaxed` under `cfg(leasehold_weak_gate)` to
/// show that the model checker catches the torn read that results; never set that cfg
/// anywhere else.
#[cfg(not(leasehold_weak_gate))]
pub(crate) const PUBLISH: Ordering = Ordering::Release;
#[cfg(leasehold_weak_gate)]
pub(crate) const PUBLISH: Ordering = Ordering::Relaxed;

/// Ordering of the gate's reading loads; the counterpart of [`PUBLISH`].
#[cfg(not(leasehold_weak_gate))]
pub(crate) const OBSERVE: Ordering = Ordering::Acquire;
#[cfg(leasehold_weak_gate)]
pub(crate) const OBSERVE: Ordering = Ordering::Relaxed;
