//! What the lease task shares with the rest of the firmware.

use core::fmt;
use core::future::Future;

use embassy_sync::blocking_mutex::raw::{CriticalSectionRawMutex, RawMutex};
use embassy_sync::signal::Signal;
use leasehold::{Fence, GateError, LossReason, WriteGate};

/// The write gate plus the lease task's two signals: "the lease was lost" (out) and
/// "please release" (in). Lives in a `static`; every method takes `&self`.
///
/// ```
/// use leasehold_embassy::leasehold::{GateError, Instant};
/// use leasehold_embassy::LeaseShared;
///
/// static LEASE: LeaseShared = LeaseShared::new();
/// // Nothing acquired yet: the gate is closed. (`LEASE.check()` reads embassy's clock
/// // for `now`; that needs a time driver, which this example has none of.)
/// assert_eq!(LEASE.gate().check(Instant::ZERO), Err(GateError::NotHeld));
/// ```
///
/// * [`check`](Self::check) (or [`gate`](Self::gate)`.check(now)`) from any task or
///   interrupt handler right before each write; it needs only atomic loads, so it works
///   on a Cortex-M0.
/// * [`wait_lost`](Self::wait_lost): a future that completes when the running term is
///   lost — for a worker task that should stop at once. One waiter at a time (an
///   embassy [`Signal`]); other code polls the gate.
/// * [`request_release`](Self::request_release): ends the term politely; the gate
///   closes before the release request is sent. A request made while no term runs
///   ends the next term as soon as it starts (never holds longer than asked).
///
/// `M` is the mutex guarding the two signals. The default,
/// [`CriticalSectionRawMutex`], works from interrupt handlers and on every core; it
/// needs a `critical-section` implementation in the firmware (on Cortex-M, `cortex-m`'s
/// `critical-section-single-core` feature; it uses no CAS, so thumbv6m is fine). With
/// one executor and no interrupt handler touching the signals,
/// [`NoopRawMutex`](embassy_sync::blocking_mutex::raw::NoopRawMutex) is cheaper.
pub struct LeaseShared<M: RawMutex = CriticalSectionRawMutex> {
    gate: WriteGate,
    lost: Signal<M, LossReason>,
    release: Signal<M, ()>,
}

impl<M: RawMutex> LeaseShared<M> {
    /// A closed gate and two empty signals; `const`, for a `static`.
    pub const fn new() -> Self {
        LeaseShared {
            gate: WriteGate::new(),
            lost: Signal::new(),
            release: Signal::new(),
        }
    }

    /// The write gate, for readers that bring their own `now`.
    pub const fn gate(&self) -> &WriteGate {
        &self.gate
    }

    /// The fence to write with, if the lease is held and embassy-time's `now` is before
    /// its safe deadline; otherwise why not. Call it right before each write and send
    /// the fence with the write.
    pub fn check(&self) -> Result<Fence, GateError> {
        self.gate.check(crate::now())
    }

    /// Asks the lease task to release the lease.
    pub fn request_release(&self) {
        self.release.signal(());
    }

    /// Completes with the reason when the running term is lost. The gate was already
    /// closed when this completes.
    pub async fn wait_lost(&self) -> LossReason {
        self.lost.wait().await
    }

    /// The loss not yet taken by [`wait_lost`](Self::wait_lost), if any.
    pub fn take_lost(&self) -> Option<LossReason> {
        self.lost.try_take()
    }

    pub(crate) fn start_term(&self) {
        // A loss of an earlier term says nothing about the new one.
        self.lost.reset();
    }

    pub(crate) fn release_requested(&self) -> impl Future<Output = ()> + '_ {
        self.release.wait()
    }

    pub(crate) fn signal_lost(&self, reason: LossReason) {
        self.lost.signal(reason);
    }
}

impl<M: RawMutex> Default for LeaseShared<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: RawMutex> fmt::Debug for LeaseShared<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseShared")
            .field("gate", &self.gate.snapshot())
            .field("lost_pending", &self.lost.signaled())
            .field("release_pending", &self.release.signaled())
            .finish()
    }
}

#[cfg(feature = "defmt")]
impl<M: RawMutex> defmt::Format for LeaseShared<M> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "LeaseShared {{ gate: {}, lost_pending: {}, release_pending: {} }}",
            self.gate.snapshot(),
            self.lost.signaled(),
            self.release.signaled()
        );
    }
}
