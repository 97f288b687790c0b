//! [`LeaseHandle`]: what workers hold while they write under a lease.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use leasehold::{
    Config, Fence, GateError, GateStatus, Instant, LossReason, Owner, OwnerToken, Term,
};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::shared::{Shared, StopCause};
use crate::{trace, LeaseClock, LeaseEnd, LeaseState, LeaseStats, TimedEvent};

/// A held lease: check it before every write, and present its fence with the write.
///
/// `Send + Sync + Clone`: give a clone to every worker. The lease is renewed by a
/// background task until it is lost, [released](Self::release), or the **last handle is
/// dropped** — which stops writes at once (no handle is left to pass `check()`) and
/// releases the key in the background, best effort, bounded by the request timeout.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use leasehold_tokio::{acquire, memory::MemoryService};
///
/// let service = Arc::new(MemoryService::new());
/// let config = leasehold_tokio::config(Duration::from_secs(3)).build().unwrap();
/// let lease = acquire(service, "orders", config).await.unwrap();
///
/// // Before each write: the fence to write with, only while writes may happen.
/// let fence = lease.check().unwrap();
/// // storage.write(fence, ...): storage rejects fences older than the newest it saw.
/// assert_eq!(fence, lease.granted_fence());
/// # }
/// ```
pub struct LeaseHandle {
    shared: Arc<Shared>,
}

/// Why [`LeaseHandle::check`] refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// The write gate refused: lost (with the reason), safe deadline passed, paused
    /// (fail-closed, renewal outcome unknown), released, or busy (retry).
    Gate(GateError),
    /// A release was requested; the driver is closing the gate and releasing the key.
    ReleaseRequested,
    /// The driver task is gone (runtime shut down or it panicked); nothing renews
    /// the lease.
    DriverStopped,
}

impl CheckError {
    /// Whether a later `check()` may pass again in this term: only a fail-closed pause
    /// (lifted by a confirmed renewal) and a torn read are temporary.
    pub const fn is_temporary(&self) -> bool {
        matches!(self, CheckError::Gate(GateError::Paused | GateError::Busy))
    }

    /// Why the lease was lost, when this refusal is a loss — already on the first
    /// refusal, before the driver task has run (from that refusal on,
    /// [`LeaseHandle::end`] says so too).
    ///
    /// [`GateError::Lost`] carries its reason. [`GateError::DeadlinePassed`] (the
    /// worker saw the deadline pass before the driver did) is
    /// [`LossReason::Expired`]: the core expires the term on any input past the
    /// deadline, so that is the reason the driver reports too. `None` for a release,
    /// a stopped driver, a pause or a torn read.
    pub const fn loss(&self) -> Option<LossReason> {
        match *self {
            CheckError::Gate(GateError::Lost(reason)) => Some(reason),
            CheckError::Gate(GateError::DeadlinePassed { .. }) => Some(LossReason::Expired),
            _ => None,
        }
    }
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Gate(err) => fmt::Display::fmt(err, f),
            CheckError::ReleaseRequested => f.write_str("the lease is being released"),
            CheckError::DriverStopped => f.write_str("the lease driver stopped"),
        }
    }
}

impl std::error::Error for CheckError {}

impl LeaseHandle {
    /// Wraps the first handle; the acquire future hands it out once granted.
    pub(crate) fn new(shared: Arc<Shared>) -> LeaseHandle {
        shared.handles.fetch_add(1, Ordering::Relaxed);
        LeaseHandle { shared }
    }

    /// The fence to write with, if writes may happen *now*; otherwise why not.
    ///
    /// This is the one way to the fence for a write. Reads the write gate with the
    /// lease's own clock, so it refuses once the safe deadline has passed even if the
    /// driver task has not run since (a worker waking from a long pause), and a
    /// fail-closed pause whose deadline passed too is refused as the loss it is
    /// ([`CheckError::loss`] names the reason from the first refusal on). Cheap (a few
    /// atomic loads and a clock read): call it right before every write, and send the
    /// fence with the write so storage can reject it if this task pauses between the
    /// check and the write.
    pub fn check(&self) -> Result<Fence, CheckError> {
        let now = self.shared.clock().now();
        let refused = match self.shared.gate.check(now) {
            Ok(fence) => match self.shared.stop_cause() {
                None => return Ok(fence),
                Some(StopCause::Release) => return Err(CheckError::ReleaseRequested),
                Some(StopCause::DriverGone) => return Err(CheckError::DriverStopped),
            },
            Err(GateError::Paused) => CheckError::Gate(paused_or_expired(self, now)),
            Err(refused) => CheckError::Gate(refused),
        };
        // A loss is the term's end from this refusal on, also before the driver has
        // reported it (it has not run since the gate flipped or the deadline passed):
        // `end()` and `lost()` agree with what the worker was just told.
        if let Some(reason) = refused.loss() {
            self.shared.ended_by(reason);
        }
        Err(refused)
    }

    /// The fence the service granted this term, for logs, metrics and labels.
    ///
    /// **Not a permission to write**: it stays the same after the lease is lost or
    /// released. Write with the fence [`check`](Self::check) returns.
    pub fn granted_fence(&self) -> Fence {
        self.shared.granted().map_or(Fence(0), |(fence, _)| fence)
    }

    /// Counters of the term: retries (acquire attempts and renewals retried after
    /// an unknown outcome, counted as they happen) and the core's own
    /// [`Stats`](leasehold::Stats) (see [`LeaseStats::core`] for when they are
    /// filled in).
    pub fn stats(&self) -> LeaseStats {
        self.shared.stats()
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The owner presented to the service.
    pub fn owner(&self) -> Owner {
        self.shared.owner
    }

    /// What the service stores as the holder: owner plus term.
    pub fn token(&self) -> OwnerToken {
        let term = self.shared.granted().map_or(Term(1), |(_, term)| term);
        self.shared.owner.token(term)
    }

    /// The lease's clock: `check()` and every instant in [`LeaseState`] and events
    /// are on it.
    pub fn clock(&self) -> LeaseClock {
        *self.shared.clock()
    }

    /// The configuration the lease runs with.
    pub fn config(&self) -> Config {
        self.shared.config()
    }

    /// Where the lease is, as of the driver's last step: for display and metrics,
    /// never to decide a write. After a pause the driver has not run since (a
    /// stopped process, a starved runtime), this still says `Holding` with a
    /// deadline in the past; [`check`](Self::check) reads the clock and refuses.
    pub fn state(&self) -> LeaseState {
        self.shared.state()
    }

    /// The safe deadline while held, on the lease's clock (as of the driver's last
    /// step, like [`state`](Self::state): it may already be past).
    pub fn deadline(&self) -> Option<Instant> {
        self.shared.state().deadline()
    }

    /// How the term ended, once writes stopped for good.
    pub fn end(&self) -> Option<LeaseEnd> {
        self.shared.end()
    }

    /// Completes once writes must stop for good, saying why:
    ///
    /// * [`LeaseEnd::Lost`] — at the moment the driver closed the gate for a loss
    ///   (expired, not owner, revoked, shortened);
    /// * [`LeaseEnd::Released`] — at the moment a release was requested (by
    ///   [`release`](Self::release) or by dropping the last handle): the gate is
    ///   closing, the release request may still be in flight;
    /// * [`LeaseEnd::DriverStopped`] — the driver task is gone (runtime shutdown, panic).
    ///
    /// The first of these wins and never changes. A paused (fail-closed) lease is not
    /// ended. Completes at once if the term already ended. This future holds a handle,
    /// so it keeps the lease alive; to watch without holding, use
    /// [`cancellation_token`](Self::cancellation_token) or [`subscribe`](Self::subscribe).
    pub async fn lost(&self) -> LeaseEnd {
        self.shared.wait_for(Shared::end).await
    }

    /// A token cancelled at the same moment [`lost`](Self::lost) completes. Hand it to
    /// work that must stop with the lease (`tokio::select!` on `cancelled()`); it does
    /// not keep the lease alive.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.cancellation_token()
    }

    /// The lease's state, updated by the driver after every step (latest value only).
    /// Does not keep the lease alive.
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.shared.subscribe()
    }

    /// Every [`leasehold::Event`] from now on, with when it happened. A receiver that
    /// falls more than 32 events behind skips the oldest (see
    /// [`broadcast`](tokio::sync::broadcast)). Does not keep the lease alive.
    pub fn events(&self) -> broadcast::Receiver<TimedEvent> {
        self.shared.events()
    }

    /// Ends the lease for every handle: writes stop at once, then the key is deleted at
    /// the service (compare-and-delete), best effort.
    ///
    /// Completes when the term has ended: when the release is answered or times out
    /// (after at most the request timeout), or at once if the term already ended.
    /// Returns how the term ended — [`LeaseEnd::Released`], or the loss that came
    /// first. Writes never wait on this: they stopped when it was called.
    ///
    /// A release whose outcome is unknown (a timeout, a broken connection) goes on in
    /// the background, retried until the service answers or twice the TTL has passed
    /// (see [`Lease::release`](leasehold::Lease::release)), as long as the runtime
    /// runs; [`settled`](Self::settled) waits for it.
    pub async fn release(&self) -> LeaseEnd {
        self.shared.request_release(trace::ReleaseWhy::Requested);
        self.shared
            .wait_for(|shared| {
                let ended = shared.finished()
                    || matches!(
                        shared.state(),
                        LeaseState::Released | LeaseState::Lost(_) | LeaseState::DriverStopped
                    );
                ended.then(|| shared.end()).flatten()
            })
            .await
    }

    /// The lease's shared state, for the memory tests.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Asks for the release without waiting: writes stop at once (as in
    /// [`release`](Self::release)), [`lost`](Self::lost) completes.
    pub(crate) fn request_release(&self) {
        self.shared.request_release(trace::ReleaseWhy::Requested);
    }

    /// Completes when nothing is left to send for the term: it ended, and its release
    /// (after a release or a loss) was answered, or its retries ran out, at most twice
    /// the TTL after it was first sent. Bound it with a timeout before a process exits
    /// (`leasehold run` waits at most a few retry intervals): what it waits for is
    /// only that the next holder need not wait for the key's TTL.
    pub async fn settled(&self) {
        self.shared
            .wait_for(|shared| shared.finished().then_some(()))
            .await;
    }
}

/// A fail-closed pause (`Paused`) refuses for as long as a renewal's outcome is
/// unknown, and the gate keeps the deadline beside it: once that deadline has passed
/// as well, no renewal can reopen the gate (the core expires the term on its next
/// input), so the refusal is `DeadlinePassed`, not a temporary pause.
fn paused_or_expired(handle: &LeaseHandle, now: Instant) -> GateError {
    match handle.shared.gate.snapshot() {
        Some(snap) if snap.status == GateStatus::Paused && now >= snap.deadline => {
            GateError::DeadlinePassed {
                deadline: snap.deadline,
            }
        }
        _ => GateError::Paused,
    }
}

impl Clone for LeaseHandle {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        LeaseHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The last handle releases the lease in the background: writes stop at once (no
/// handle is left to pass `check()`, and the stop flag is raised before anything
/// else), the driver closes the gate and sends a best-effort release.
impl Drop for LeaseHandle {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared
                .request_release(trace::ReleaseWhy::LastHandleDropped);
        }
    }
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("state", &self.state())
            .finish()
    }
}
