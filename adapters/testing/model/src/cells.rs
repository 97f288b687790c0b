//! The real core types, made hashable for the checker without changing the core.
//!
//! `Lease` is `Clone + Debug` but neither `Hash` nor `Eq`, and its fields are private
//! (some are reachable through getters, the jitter state and the request sequence are
//! not). Hashing a projection through the getters would merge states that differ in
//! those fields and could hide behaviours, so a [`LeaseCell`] hashes and compares the
//! lease's complete `Debug` rendering: every field, exact, at the price of a format per
//! hash.
//!
//! `WriteGate` is made of atomics: not `Clone`, and its writers are crate-private. A
//! [`GateCell`] holds an `Arc<WriteGate>` that is never written after it enters a
//! state: each step hands the lease a *fresh* gate and keeps it only if the lease
//! published to it (the last publish wins, as on a real gate), so states can share
//! it. Writes are checked with the real [`WriteGate::check`]; the cell hashes and
//! compares the gate's snapshot.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use leasehold::{Fence, FenceGate, GateSnapshot, GateStatus, Instant, Lease, WriteGate};

/// The real [`Lease`], hashed and compared by its full `Debug` rendering.
#[derive(Clone)]
pub struct LeaseCell(pub Lease);

/// Feeds formatted text straight into a hasher, without building a `String`.
struct HashWriter<'a, H: Hasher>(&'a mut H);

impl<H: Hasher> fmt::Write for HashWriter<'_, H> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

impl PartialEq for LeaseCell {
    fn eq(&self, other: &Self) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}
impl Eq for LeaseCell {}
impl Hash for LeaseCell {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The checker identifies states by this hash alone, so it covers every field.
        let _ = fmt::Write::write_fmt(&mut HashWriter(state), format_args!("{:?}", self.0));
    }
}
impl fmt::Debug for LeaseCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.0;
        write!(
            f,
            "{:?} term {} fence {:?} deadline {:?}",
            l.state(),
            l.term().0,
            l.fence().map(|x| x.0),
            l.deadline().map(Instant::as_micros)
        )
    }
}

/// A real [`WriteGate`], frozen once it is part of a state.
#[derive(Clone)]
pub struct GateCell(pub Arc<WriteGate>);

impl GateCell {
    /// A closed gate.
    pub fn new() -> GateCell {
        GateCell(Arc::new(WriteGate::new()))
    }
    /// The gate's reading (a frozen gate is never torn).
    pub fn snapshot(&self) -> Option<GateSnapshot> {
        self.0.snapshot()
    }
    /// What the real gate answers a worker at `now`.
    pub fn admits(&self, now: Instant) -> Option<Fence> {
        self.0.check(now).ok()
    }
}

impl Default for GateCell {
    fn default() -> Self {
        GateCell::new()
    }
}

impl PartialEq for GateCell {
    fn eq(&self, other: &Self) -> bool {
        self.snapshot() == other.snapshot()
    }
}
impl Eq for GateCell {}
impl Hash for GateCell {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self.snapshot() {
            None => 0u8.hash(state),
            Some(snap) => {
                match snap.status {
                    GateStatus::Closed => 1u8.hash(state),
                    GateStatus::Held => 2u8.hash(state),
                    GateStatus::Paused => 3u8.hash(state),
                    GateStatus::Released => 4u8.hash(state),
                    GateStatus::Lost(reason) => (5u8, reason).hash(state),
                }
                (snap.term, snap.fence, snap.deadline).hash(state);
            }
        }
    }
}
impl fmt::Debug for GateCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.snapshot() {
            Some(s) => write!(
                f,
                "{:?} term {} fence {} until {}",
                s.status,
                s.term.0,
                s.fence.0,
                s.deadline.as_micros()
            ),
            None => f.write_str("torn"),
        }
    }
}

/// The real storage-side [`FenceGate`], hashed by the newest fence it admitted.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageCell(pub FenceGate);

impl Hash for StorageCell {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.newest().hash(state);
    }
}
impl fmt::Debug for StorageCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "storage newest {:?}", self.0.newest().map(|x| x.0))
    }
}
