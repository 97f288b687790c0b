//! One step of one lease: the rules of driving a [`Lease`] written once, for every
//! driver shape. [`run_term`](crate::run_term) steps one lease and sleeps until its
//! deadline; a driver of many leases (`leasehold_tokio::LeaseSet`) steps each one
//! when its I/O wakes it and keeps every deadline in one queue of its own.
//!
//! A step sends what the lease asks for (one request in flight: a new one supersedes
//! the old), reports its events, drops the I/O of a request the lease no longer
//! awaits, watches for revocation of exactly the grant held, and ends the term once
//! nothing is in flight and no timer is armed; then it feeds back whichever input is
//! ready, the user's release first (once no acquire attempt is in flight), then the
//! answer, then a revocation, and goes round again until nothing is ready. Only the
//! lease's timer is left to the caller.

use core::borrow::Borrow;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use leasehold::{
    AcquireOutcome, Action, Config, Fence, Instant, Lease, RequestId, Response, State, Term,
    WriteGate,
};

use crate::{Clock, Report, TermEnd};

pin_project_lite::pin_project! {
    /// The I/O one lease keeps between steps: its request in flight, the revocation
    /// watch of the grant it holds, and whether the user's release was fed.
    ///
    /// `Q` is a request's future, `W` a watch's. Start each term with a new one.
    pub struct LeaseIo<Q, W> {
        #[pin]
        request: Option<InFlight<Q>>,
        #[pin]
        // The watch of the grant with fence `watched`; `None` once it fired.
        watch: Option<W>,
        // The fence of the grant watched, when `WATCHED` is set. Beside the watch
        // rather than with it in an `Option` of its own, whose tag would cost every
        // lease 8 bytes.
        watched: Fence,
        // `WATCHED` and `RELEASE_SEEN`.
        flags: u8,
    }
}

/// A grant is watched (or its watch fired): `LeaseIo::watched` is its fence.
const WATCHED: u8 = 1;
/// The user's release was fed to the lease.
const RELEASE_SEEN: u8 = 2;

pin_project_lite::pin_project! {
    /// The one request the lease awaits, by its id.
    struct InFlight<Q> {
        id: RequestId,
        #[pin]
        future: Q,
    }
}

impl<Q, W> LeaseIo<Q, W> {
    /// No request, no watch, no release yet.
    pub const fn new() -> Self {
        LeaseIo {
            request: None,
            watch: None,
            watched: Fence(0),
            flags: 0,
        }
    }

    /// Whether a request is in flight: one the lease still awaits.
    pub fn in_flight(&self) -> bool {
        self.request.is_some()
    }

    /// The fence of the grant watched (or whose watch fired), if any.
    fn watched(&self) -> Option<Fence> {
        (self.flags & WATCHED != 0).then_some(self.watched)
    }
}

impl<Q, W> Default for LeaseIo<Q, W> {
    fn default() -> Self {
        LeaseIo::new()
    }
}

impl<Q, W> core::fmt::Debug for LeaseIo<Q, W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LeaseIo")
            .field("request", &self.request.as_ref().map(|request| request.id))
            .field("watched", &self.watched())
            .field("release_seen", &(self.flags & RELEASE_SEEN != 0))
            .finish_non_exhaustive()
    }
}

/// How a step reaches the world around the lease.
#[derive(Debug)]
pub struct Hooks<S, V, R, P> {
    /// Starts the request for an action; its future answers with the
    /// [`Response`] the lease takes.
    pub send: S,
    /// Starts the revocation watch of the grant with this term and fence; its future
    /// completes if that grant is revoked.
    pub watch: V,
    /// Ready once the user wants to let go; polled until it is (never while an acquire
    /// attempt is in flight), never after.
    pub release: R,
    /// Sees every [`Event`](leasehold::Event) in order, right after the step that made
    /// it, and the holder named by each "held by another" answer.
    pub report: P,
}

/// Where the lease stands after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stepped {
    /// The term goes on. Nothing is ready now; the caller steps again when the
    /// lease's I/O wakes it, and at the lease's next deadline (if it has one): there it
    /// calls [`Lease::handle_timeout`] and steps again. (An answer that came in at that
    /// same instant counts first if the caller steps before the timeout, as
    /// `run_term` does by polling the I/O before its sleep.)
    Waiting(Option<Instant>),
    /// The term is over, its release (and the release's retries) included.
    Ended(TermEnd),
}

/// Steps `lease` until nothing is ready (see the module docs). `io` must be the one
/// kept with this lease since its term began; the gate is `lease`'s write gate.
pub fn step<L, C, S, Q, V, W, R, P>(
    lease: &mut Lease<L>,
    gate: &WriteGate,
    clock: &C,
    mut io: Pin<&mut LeaseIo<Q, W>>,
    cx: &mut Context<'_>,
    hooks: &mut Hooks<S, V, R, P>,
) -> Stepped
where
    L: Borrow<Config>,
    C: Clock,
    S: FnMut(Action) -> Q,
    Q: Future<Output = Response>,
    V: FnMut(Term, Fence) -> W,
    W: Future<Output = ()>,
    R: FnMut(&mut Context<'_>) -> Poll<()>,
    P: FnMut(Report),
{
    loop {
        let mut this = io.as_mut().project();
        while let Some(action) = lease.poll_action() {
            let id = action.id();
            let future = (hooks.send)(action);
            this.request.set(Some(InFlight { id, future }));
        }
        while let Some(event) = lease.poll_event() {
            (hooks.report)(Report::Event(event));
        }
        // Drop the I/O of a request the lease no longer waits for.
        let awaited = this.request.as_ref().get_ref().as_ref().map(|r| r.id);
        if awaited.is_some_and(|id| !lease.is_awaiting(id)) {
            this.request.set(None);
        }
        // Watch for revocation of exactly the grant held.
        let held = lease.fence();
        let watched = (*this.flags & WATCHED != 0).then_some(*this.watched);
        if held != watched {
            let term = lease.term();
            this.watch.set(held.map(|fence| (hooks.watch)(term, fence)));
            match held {
                Some(fence) => {
                    *this.watched = fence;
                    *this.flags |= WATCHED;
                }
                None => *this.flags &= !WATCHED,
            }
        }
        // No request awaited and no timer armed: nothing is left to send.
        let next = lease.poll_timeout();
        if next.is_none() && this.request.is_none() {
            return Stepped::Ended(match lease.state() {
                State::Lost(reason) => TermEnd::Lost(reason),
                State::NotAcquired(why) => TermEnd::NotAcquired(why),
                _ => TermEnd::Released,
            });
        }

        // Feed back whatever is ready. Refusals (a stale answer, a release with no
        // term left) change nothing; the lease counts stale answers in its stats.
        //
        // The user's release waits for an acquire attempt in flight: sent beside it,
        // it could reach the service first (etcd serves each request on a stream of
        // its own, a PostgreSQL pool on another connection), answer "not owner", and
        // leave the attempt's grant to block the next contender for a whole TTL. The
        // attempt's answer comes first (a grant is then released as a held lease is),
        // or the lease gives up on it at its request timeout.
        let attempt_in_flight = this.request.is_some() && matches!(lease.state(), State::Acquiring);
        let release_seen = *this.flags & RELEASE_SEEN != 0;
        if !release_seen && !attempt_in_flight && (hooks.release)(cx).is_ready() {
            *this.flags |= RELEASE_SEEN;
            let _ = lease.release(clock.now(), gate);
            continue;
        }
        let answered = this.request.as_mut().as_pin_mut().and_then(|request| {
            let request = request.project();
            match request.future.poll(cx) {
                Poll::Ready(response) => Some((*request.id, response)),
                Poll::Pending => None,
            }
        });
        if let Some((id, response)) = answered {
            this.request.set(None);
            if let Response::Acquire(AcquireOutcome::HeldByAnother(holder)) = response {
                (hooks.report)(Report::HeldBy(holder));
            }
            let _ = lease.handle_response(clock.now(), id, response, gate);
            continue;
        }
        if poll_slot(this.watch.as_mut(), cx).is_some() {
            let _ = lease.handle_revoked(clock.now(), *this.watched, gate);
            continue;
        }
        return Stepped::Waiting(next);
    }
}

/// Polls an optional future in place: `Some(output)` once it completes (the slot is
/// emptied), `None` while it is pending or the slot is empty.
pub(crate) fn poll_slot<F: Future>(
    mut slot: Pin<&mut Option<F>>,
    cx: &mut Context<'_>,
) -> Option<F::Output> {
    let future = slot.as_mut().as_pin_mut()?;
    match future.poll(cx) {
        Poll::Ready(output) => {
            slot.set(None);
            Some(output)
        }
        Poll::Pending => None,
    }
}
