//! The loop: drain the lease's outputs, start the requests it asks for, wait for the
//! first of (an answer, a revocation, the user's release, the lease's timer), feed it
//! back, repeat until the term is over.

use core::future::{poll_fn, Future};
use core::pin::{pin, Pin};
use core::task::{Context, Poll};

use leasehold::{
    AcquireOutcome, Action, AlreadyActive, Event, Fence, Lease, LossReason, Owner, ReleaseOutcome,
    RenewOutcome, RequestId, State, WriteGate,
};

use crate::{Clock, LocalLockService};

/// How a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TermEnd {
    /// Lost; writes stopped the moment it was detected.
    Lost(LossReason),
    /// Released on request (or given up while still acquiring).
    Released,
}

/// Where one term's I/O goes: the service, the key and the owner presenting it.
///
/// `Copy` whatever the service is (it is held by reference), so a task can keep one
/// and pass it to [`run_term`] for every term.
#[derive(Debug)]
pub struct Target<'a, S> {
    /// The lock service.
    pub service: &'a S,
    /// The key to lock.
    pub key: &'a str,
    /// Who we are; the term is added by the lease.
    pub owner: Owner,
}

// Not derived: a derive would require `S: Clone`, but only `&S` is copied.
impl<S> Clone for Target<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Target<'_, S> {}

/// What woke the loop.
enum Wake {
    Acquired(RequestId, AcquireOutcome),
    Renewed(RequestId, RenewOutcome),
    ReleaseAnswered(RequestId, ReleaseOutcome),
    Revoked(Fence),
    ReleaseRequested,
    Timer,
}

/// Runs one term of `lease` to its end: acquires, keeps the lease renewed, and returns
/// when it is lost or released.
///
/// * `gate` is the lease's write gate; the lease flips it before this loop acts on
///   anything else of the same step, so workers stop before any request goes out.
/// * `release` completes when the user wants to let go; it is polled until it does.
/// * `on_event` sees every [`Event`] in order, right after the step that made it.
///
/// Every request is bounded by the lease's request timeout: when the lease gives up
/// on one, its future is dropped. The best-effort release after a loss is driven to
/// its answer or timeout before this returns, but it never delays the gate.
///
/// Fails only if `lease` is in the middle of a term already.
pub async fn run_term<S, C, R, F>(
    lease: &mut Lease,
    gate: &WriteGate,
    target: Target<'_, S>,
    clock: &C,
    release: R,
    mut on_event: F,
) -> Result<TermEnd, AlreadyActive>
where
    S: LocalLockService,
    C: Clock,
    R: Future<Output = ()>,
    F: FnMut(Event),
{
    let Target {
        service,
        key,
        owner,
    } = target;
    lease.acquire(clock.now(), gate)?;

    let mut release = pin!(Some(release));
    let mut acquiring = pin!(None);
    let mut renewing = pin!(None);
    let mut releasing = pin!(None);
    let mut watching = pin!(None);
    let (mut acquire_id, mut renew_id, mut release_id) = (None, None, None);
    let mut watched = None;

    loop {
        while let Some(action) = lease.poll_action() {
            match action {
                Action::Acquire { id, term, ttl } => {
                    acquiring.set(Some(service.acquire(key, owner.token(term), ttl)));
                    acquire_id = Some(id);
                }
                Action::Renew { id, term, ttl } => {
                    renewing.set(Some(service.renew(key, owner.token(term), ttl)));
                    renew_id = Some(id);
                }
                Action::Release { id, term } => {
                    releasing.set(Some(service.release(key, owner.token(term))));
                    release_id = Some(id);
                }
            }
        }
        while let Some(event) = lease.poll_event() {
            on_event(event);
        }

        // Drop the I/O of requests the lease no longer waits for.
        drop_unless_awaited(lease, &mut acquire_id, acquiring.as_mut());
        drop_unless_awaited(lease, &mut renew_id, renewing.as_mut());
        drop_unless_awaited(lease, &mut release_id, releasing.as_mut());

        // Watch for revocation of exactly the grant we hold.
        let held = lease.fence();
        if held != watched {
            watching.set(held.map(|fence| {
                let term = lease.term();
                async move {
                    service.revoked(key, owner.token(term), fence).await;
                    fence
                }
            }));
            watched = held;
        }

        match lease.state() {
            State::Lost(reason) if release_id.is_none() => return Ok(TermEnd::Lost(reason)),
            State::Released if release_id.is_none() => return Ok(TermEnd::Released),
            _ => {}
        }

        let timer = lease.poll_timeout();
        let mut sleep = pin!(timer.map(|at| clock.sleep_until(at)));
        let wake = poll_fn(|cx| {
            if let Some(()) = poll_slot(&mut release, cx) {
                return Poll::Ready(Wake::ReleaseRequested);
            }
            if let Some(answer) = poll_slot(&mut acquiring, cx) {
                return Poll::Ready(id_or_timer(acquire_id, |id| Wake::Acquired(id, answer)));
            }
            if let Some(answer) = poll_slot(&mut renewing, cx) {
                return Poll::Ready(id_or_timer(renew_id, |id| Wake::Renewed(id, answer)));
            }
            if let Some(answer) = poll_slot(&mut releasing, cx) {
                return Poll::Ready(id_or_timer(release_id, |id| {
                    Wake::ReleaseAnswered(id, answer)
                }));
            }
            if let Some(fence) = poll_slot(&mut watching, cx) {
                return Poll::Ready(Wake::Revoked(fence));
            }
            if let Some(()) = poll_slot(&mut sleep, cx) {
                return Poll::Ready(Wake::Timer);
            }
            Poll::Pending
        })
        .await;

        let now = clock.now();
        // Refusals (a stale answer, a release with no term left) change nothing; the
        // lease counts stale answers in its stats.
        match wake {
            Wake::Acquired(id, answer) => {
                acquire_id = None;
                let _ = lease.handle_acquire_response(now, id, answer, gate);
            }
            Wake::Renewed(id, answer) => {
                renew_id = None;
                let _ = lease.handle_renew_response(now, id, answer, gate);
            }
            Wake::ReleaseAnswered(id, answer) => {
                release_id = None;
                let _ = lease.handle_release_response(now, id, answer, gate);
            }
            Wake::Revoked(fence) => {
                let _ = lease.handle_revoked(now, fence, gate);
            }
            Wake::ReleaseRequested => {
                let _ = lease.release(now, gate);
            }
            Wake::Timer => lease.handle_timeout(now, gate),
        }
    }
}

/// Polls an optional future in place: `Some(output)` once it completes (the slot is
/// emptied), `None` while it is pending or the slot is empty.
fn poll_slot<F: Future>(slot: &mut Pin<&mut Option<F>>, cx: &mut Context<'_>) -> Option<F::Output> {
    let future = slot.as_mut().as_pin_mut()?;
    match future.poll(cx) {
        Poll::Ready(output) => {
            slot.set(None);
            Some(output)
        }
        Poll::Pending => None,
    }
}

fn id_or_timer(id: Option<RequestId>, wake: impl FnOnce(RequestId) -> Wake) -> Wake {
    id.map_or(Wake::Timer, wake)
}

fn drop_unless_awaited<F>(
    lease: &Lease,
    id: &mut Option<RequestId>,
    mut slot: Pin<&mut Option<F>>,
) {
    if id.is_some_and(|id| !lease.is_awaiting(id)) {
        *id = None;
        slot.set(None);
    }
}
