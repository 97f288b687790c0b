//! The write gate: the lost flag, readable from any thread or interrupt handler.
//!
//! One writer (the [`Lease`](crate::Lease) that owns the gate's term), any number of
//! readers. The gate holds the status, the fence and the safe deadline, published
//! together with a single-writer seqlock over six 32-bit words, so it needs nothing but
//! atomic `load` and `store` of `u32` (thumbv6m has no CAS and no 64-bit atomics).
//!
//! # Protocol
//!
//! Writer (only ever one): bump `seq` to odd, store every data word with `Release`,
//! bump `seq` to the next even value with `Release`.
//!
//! Reader: load `seq` with `Acquire`; if it is odd a write is in progress; load every
//! data word with `Acquire`; load `seq` again. The snapshot is consistent iff both `seq`
//! loads are equal and even: a reader that observed any word of a newer write
//! synchronises with that `Release` store, so its second `seq` load cannot return the
//! old value. A reader gives up after [`READ_ATTEMPTS`] and *refuses* ([`GateError::Busy`])
//! — it never spins on the writer, which matters when the reader is an interrupt handler
//! that preempted the writer on the same core.

use core::fmt;

use crate::sync::{AtomicU32, Ordering, OBSERVE, PUBLISH};
use crate::{Fence, Instant, LossReason, Term};

/// How often a reader retries a snapshot torn by a concurrent write before refusing.
pub const READ_ATTEMPTS: u32 = 4;

/// Lowest bits of the status word: what the term is doing.
mod status {
    pub(super) const CLOSED: u32 = 0;
    pub(super) const HELD: u32 = 1;
    pub(super) const PAUSED: u32 = 2;
    pub(super) const RELEASED: u32 = 3;
    pub(super) const LOST_NOT_OWNER: u32 = 4;
    pub(super) const LOST_EXPIRED: u32 = 5;
    pub(super) const LOST_REVOKED: u32 = 6;
    pub(super) const LOST_SHORTENED: u32 = 7;
    pub(super) const LOST_REFUSED: u32 = 8;
    /// The status takes the low 4 bits, the term the other 28 (a lease's terms wrap
    /// within them: [`MAX_TERM`](crate::MAX_TERM)).
    pub(super) const BITS: u32 = 4;
    pub(super) const MASK: u32 = (1 << BITS) - 1;
}

/// The lost flag: tells workers whether they may write, and with which fence.
///
/// Share it by reference (`&'static` from a `static`, or inside an `Arc`); the
/// [`Lease`](crate::Lease) driving it is its only writer. Workers call
/// [`check`](WriteGate::check) right before each write and send the returned fence
/// with the write, so storage's [`FenceGate`](crate::FenceGate) can reject the write if
/// the holder paused between `check` and the write.
///
/// ```
/// use leasehold::{GateError, Instant, WriteGate};
///
/// static GATE: WriteGate = WriteGate::new();
/// // Nothing acquired yet: closed.
/// assert_eq!(GATE.check(Instant::ZERO), Err(GateError::NotHeld));
/// ```
pub struct WriteGate {
    seq: AtomicU32,
    status: AtomicU32,
    fence_lo: AtomicU32,
    fence_hi: AtomicU32,
    deadline_lo: AtomicU32,
    deadline_hi: AtomicU32,
}

/// One consistent reading of a [`WriteGate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct GateSnapshot {
    /// What the term is doing.
    pub status: GateStatus,
    /// The term this snapshot belongs to.
    pub term: Term,
    /// The term's fence (zero before the first grant).
    pub fence: Fence,
    /// The safe deadline the writes are bounded by.
    pub deadline: Instant,
}

/// The status part of a [`GateSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GateStatus {
    /// Not acquired (yet) in this term.
    Closed,
    /// Held: writes pass until the deadline.
    Held,
    /// Held, but a renewal's outcome is unknown and the lease is fail-closed.
    Paused,
    /// The term was released by the user.
    Released,
    /// The term was lost.
    Lost(LossReason),
}

/// Why [`WriteGate::check`] refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum GateError {
    /// No lease has been granted in the current term.
    NotHeld,
    /// Fail-closed mode: a renewal's outcome is unknown; writes resume once a renewal
    /// is confirmed.
    Paused,
    /// The lease's safe deadline has passed (e.g. the worker woke from a long pause
    /// before the driver could run). The driver will report the loss.
    DeadlinePassed {
        /// The deadline that passed.
        deadline: Instant,
    },
    /// The lease was lost.
    Lost(LossReason),
    /// The lease was released.
    Released,
    /// A concurrent update kept tearing the snapshot; refused to be safe. Retry.
    Busy,
}

impl fmt::Display for GateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateError::NotHeld => f.write_str("the lease is not held"),
            GateError::Paused => f.write_str("writes paused: a renewal's outcome is unknown"),
            GateError::DeadlinePassed { deadline } => {
                write!(f, "the lease's safe deadline {deadline} has passed")
            }
            GateError::Lost(reason) => write!(f, "the lease was lost: {reason}"),
            GateError::Released => f.write_str("the lease was released"),
            GateError::Busy => f.write_str("the gate was being updated; retry"),
        }
    }
}

impl core::error::Error for GateError {}

impl Default for WriteGate {
    fn default() -> Self {
        WriteGate::new()
    }
}

impl fmt::Debug for WriteGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WriteGate").field(&self.snapshot()).finish()
    }
}

impl WriteGate {
    /// A closed gate, usable in a `static`.
    #[cfg(not(loom))]
    pub const fn new() -> WriteGate {
        WriteGate {
            seq: AtomicU32::new(0),
            status: AtomicU32::new(status::CLOSED),
            fence_lo: AtomicU32::new(0),
            fence_hi: AtomicU32::new(0),
            deadline_lo: AtomicU32::new(0),
            deadline_hi: AtomicU32::new(0),
        }
    }

    /// A closed gate (loom's atomics have no `const` constructor).
    #[cfg(loom)]
    pub fn new() -> WriteGate {
        WriteGate {
            seq: AtomicU32::new(0),
            status: AtomicU32::new(status::CLOSED),
            fence_lo: AtomicU32::new(0),
            fence_hi: AtomicU32::new(0),
            deadline_lo: AtomicU32::new(0),
            deadline_hi: AtomicU32::new(0),
        }
    }

    /// The fence to write with, if the lease is held and `now` is before its safe
    /// deadline; otherwise why not.
    ///
    /// `now` must come from the same monotonic clock that drives the lease. Cheap
    /// enough to call before every write: eight atomic loads.
    pub fn check(&self, now: Instant) -> Result<Fence, GateError> {
        let snap = self.snapshot().ok_or(GateError::Busy)?;
        match snap.status {
            GateStatus::Held if now < snap.deadline => Ok(snap.fence),
            GateStatus::Held => Err(GateError::DeadlinePassed {
                deadline: snap.deadline,
            }),
            GateStatus::Closed => Err(GateError::NotHeld),
            GateStatus::Paused => Err(GateError::Paused),
            GateStatus::Released => Err(GateError::Released),
            GateStatus::Lost(reason) => Err(GateError::Lost(reason)),
        }
    }

    /// A consistent reading, or `None` if concurrent updates tore every attempt.
    pub fn snapshot(&self) -> Option<GateSnapshot> {
        for _ in 0..READ_ATTEMPTS {
            let before = self.seq.load(OBSERVE);
            if before % 2 == 1 {
                core::hint::spin_loop();
                continue;
            }
            let word = self.status.load(OBSERVE);
            let fence = join(self.fence_lo.load(OBSERVE), self.fence_hi.load(OBSERVE));
            let deadline = join(
                self.deadline_lo.load(OBSERVE),
                self.deadline_hi.load(OBSERVE),
            );
            if self.seq.load(Ordering::Relaxed) == before {
                return Some(GateSnapshot {
                    status: decode_status(word & status::MASK),
                    term: Term(word >> status::BITS),
                    fence: Fence(fence),
                    deadline: Instant::from_micros(deadline),
                });
            }
        }
        None
    }

    /// Opens (or keeps open) the gate for `term` with `fence` until `deadline`.
    pub(crate) fn publish_held(&self, term: Term, fence: Fence, deadline: Instant) {
        self.publish(status::HELD, term, fence, deadline);
    }

    /// Fail-closed: writes wait until a renewal is confirmed.
    pub(crate) fn publish_paused(&self, term: Term, fence: Fence, deadline: Instant) {
        self.publish(status::PAUSED, term, fence, deadline);
    }

    /// Closed for a term that has not been granted yet.
    pub(crate) fn publish_closed(&self, term: Term) {
        self.publish(status::CLOSED, term, Fence(0), Instant::ZERO);
    }

    /// Closed for good in `term`: released by the user.
    pub(crate) fn publish_released(&self, term: Term, fence: Fence) {
        self.publish(status::RELEASED, term, fence, Instant::ZERO);
    }

    /// Closed for good in `term`: lost.
    pub(crate) fn publish_lost(&self, term: Term, fence: Fence, reason: LossReason) {
        self.publish(encode_loss(reason), term, fence, Instant::ZERO);
    }

    /// The writer's side of the protocol: one seqlock write of every word.
    ///
    /// Out of line: each `publish_*` is a call to this one copy, where inlined each
    /// would carry its own seven stores and barriers.
    #[inline(never)]
    fn publish(&self, code: u32, term: Term, fence: Fence, deadline: Instant) {
        // Only the single writer ever stores `seq`, so this load sees its own last store.
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        let (fence_lo, fence_hi) = split(fence.0);
        let (deadline_lo, deadline_hi) = split(deadline.as_micros());
        self.status.store(code | (term.0 << status::BITS), PUBLISH);
        self.fence_lo.store(fence_lo, PUBLISH);
        self.fence_hi.store(fence_hi, PUBLISH);
        self.deadline_lo.store(deadline_lo, PUBLISH);
        self.deadline_hi.store(deadline_hi, PUBLISH);
        self.seq.store(seq.wrapping_add(2), PUBLISH);
    }
}

const fn split(value: u64) -> (u32, u32) {
    (value as u32, (value >> 32) as u32)
}

const fn join(lo: u32, hi: u32) -> u64 {
    ((hi as u64) << 32) | lo as u64
}

const fn encode_loss(reason: LossReason) -> u32 {
    match reason {
        LossReason::NotOwner => status::LOST_NOT_OWNER,
        LossReason::Expired => status::LOST_EXPIRED,
        LossReason::Revoked => status::LOST_REVOKED,
        LossReason::Shortened => status::LOST_SHORTENED,
        LossReason::Refused => status::LOST_REFUSED,
    }
}

const fn decode_status(code: u32) -> GateStatus {
    match code {
        status::HELD => GateStatus::Held,
        status::PAUSED => GateStatus::Paused,
        status::RELEASED => GateStatus::Released,
        status::LOST_NOT_OWNER => GateStatus::Lost(LossReason::NotOwner),
        status::LOST_EXPIRED => GateStatus::Lost(LossReason::Expired),
        status::LOST_REVOKED => GateStatus::Lost(LossReason::Revoked),
        status::LOST_SHORTENED => GateStatus::Lost(LossReason::Shortened),
        status::LOST_REFUSED => GateStatus::Lost(LossReason::Refused),
        // CLOSED, and any code this version never writes: closed is the safe reading.
        _ => GateStatus::Closed,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn held_gate_passes_until_its_deadline_then_refuses() {
        let gate = WriteGate::new();
        gate.publish_held(Term(1), Fence(42), at(100));
        assert_eq!(gate.check(at(99)), Ok(Fence(42)));
        assert_eq!(
            gate.check(at(100)),
            Err(GateError::DeadlinePassed { deadline: at(100) })
        );
    }

    #[test]
    fn every_status_round_trips_with_full_64_bit_values() {
        let gate = WriteGate::new();
        let big = Fence(u64::MAX - 1);
        let far = Instant::from_micros(u64::MAX - 2);
        gate.publish_held(crate::MAX_TERM, big, far);
        let snap = gate.snapshot().unwrap();
        assert_eq!(
            snap,
            GateSnapshot {
                status: GateStatus::Held,
                term: crate::MAX_TERM,
                fence: big,
                deadline: far
            }
        );
        gate.publish_paused(Term(2), big, far);
        assert_eq!(gate.check(at(0)), Err(GateError::Paused));
        gate.publish_released(Term(2), big);
        assert_eq!(gate.check(at(0)), Err(GateError::Released));
        for reason in [
            LossReason::NotOwner,
            LossReason::Expired,
            LossReason::Revoked,
            LossReason::Shortened,
            LossReason::Refused,
        ] {
            gate.publish_lost(Term(3), big, reason);
            assert_eq!(gate.check(at(0)), Err(GateError::Lost(reason)));
        }
        gate.publish_closed(Term(4));
        assert_eq!(gate.check(at(0)), Err(GateError::NotHeld));
    }

    #[test]
    fn a_reader_that_always_sees_a_write_in_progress_refuses() {
        let gate = WriteGate::new();
        gate.publish_held(Term(1), Fence(1), at(100));
        // Simulate a writer preempted mid-publish (odd sequence number).
        gate.seq.store(7, Ordering::Relaxed);
        assert_eq!(gate.check(at(1)), Err(GateError::Busy));
    }

    #[test]
    fn gate_is_at_most_24_bytes() {
        assert!(core::mem::size_of::<WriteGate>() <= 24);
    }
}
