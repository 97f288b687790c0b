//! The loop of one lease: [`step`](crate::step()) it, sleep until its deadline or
//! until its I/O wakes it, repeat until the term is over.

use core::borrow::Borrow;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use futures_util::future::Either;
use leasehold::{
    AcquireFailure, Action, AlreadyActive, Config, Event, Fence, Holder, Identity, Instant, Lease,
    LossReason, Owner, Response, WriteGate,
};

use crate::step::{poll_slot, step, Hooks, LeaseIo, Stepped};
use crate::{Clock, LocalLockService};

/// How a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TermEnd {
    /// Lost; writes stopped the moment it was detected.
    Lost(LossReason),
    /// Released on request (or given up while still acquiring).
    Released,
    /// Ended without a grant: refused for good, or the wait bound ran out with this
    /// last failure.
    NotAcquired(AcquireFailure),
}

/// What [`run_term`] reports as the term goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Report {
    /// A lease event, right after the step that made it.
    Event(Event),
    /// An acquire attempt found the key held: by whom, and for how much longer. The
    /// [`Event::AcquireFailed`] of the same answer follows.
    HeldBy(Holder),
}

/// Where one term's I/O goes: the service, the key, and the owner presenting it.
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
    /// Who we are, in words: stored with the grant, shown to contenders.
    pub identity: &'a Identity,
}

// Not derived: a derive would require `S: Clone`, but only `&S` is copied.
impl<S> Clone for Target<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Target<'_, S> {}

/// Runs one term of `lease` to its end: acquires (giving up at `give_up_at`, see
/// [`Lease::acquire_until`]), keeps the lease renewed, and returns when it is lost,
/// released, or was never acquired.
///
/// The first attempt goes out at once: a runtime that keeps `lease` for its next term
/// lets [`Lease::turn`] pass first (up to `give_up_at`), so that a contender waiting
/// for the key takes its turn instead of finding it taken again. (Waiting here would
/// grow every lease's future, for a turn that a fresh lease never has.)
///
/// * `gate` is the lease's write gate; the lease flips it before this loop acts on
///   anything else of the same step, so workers stop before any request goes out.
/// * `release` completes when the user wants to let go; it is polled until it does.
/// * `report` sees every [`Event`] in order, right after the step that made it, and
///   the holder named by each "held by another" answer.
///
/// Every request is bounded by the lease's request timeout: when the lease gives up
/// on one, its future is dropped. The release (after a loss, best effort) is driven
/// until it is answered or its retries run out (see [`Lease::release`]) before this
/// returns, but it never delays the gate nor the events: `Lost` and `Released` are
/// reported when the term ends.
///
/// Fails only if `lease` is in the middle of a term already.
///
/// The future is written by hand rather than as an `async fn`: an `async fn` keeps
/// each argument twice (as it was passed and as the body's own variable), and the
/// closures that reach the service once more, which cost every lease about 200 bytes.
/// Polled again after it completed, it completes again with the same answer.
pub fn run_term<'a, L, S, C, R, F>(
    lease: &'a mut Lease<L>,
    gate: &'a WriteGate,
    target: Target<'a, S>,
    clock: &'a C,
    give_up_at: Instant,
    release: R,
    report: F,
) -> impl Future<Output = Result<TermEnd, AlreadyActive>> + 'a
where
    L: Borrow<Config>,
    S: LocalLockService,
    C: Clock,
    R: Future<Output = ()> + 'a,
    F: FnMut(Report) + 'a,
{
    RunTerm::new(
        Inputs {
            lease,
            gate,
            target,
            clock,
            give_up_at,
        },
        release,
        report,
        Wiring {
            send: |target: Target<'a, S>, action| {
                let Target {
                    service,
                    key,
                    owner,
                    identity,
                } = target;
                match action {
                    Action::Acquire { term, ttl, .. } => Either::Left(Answer {
                        future: service.acquire(key, owner.token(term), identity, ttl),
                        wrap: Response::Acquire,
                    }),
                    Action::Renew {
                        term, fence, ttl, ..
                    } => Either::Right(Either::Left(Answer {
                        future: service.renew(key, owner.token(term), fence, ttl),
                        wrap: Response::Renew,
                    })),
                    Action::Release { term, .. } => Either::Right(Either::Right(Answer {
                        future: service.release(key, owner.token(term)),
                        wrap: Response::Release,
                    })),
                }
            },
            watch: |target: Target<'a, S>, term, fence| {
                let Target {
                    service,
                    key,
                    owner,
                    ..
                } = target;
                service.revoked(key, owner.token(term), fence)
            },
            sleep: |clock: &'a C, at| clock.sleep_until(at),
        },
    )
}

/// What `run_term` was given to run the term on.
struct Inputs<'a, L, S, C> {
    lease: &'a mut Lease<L>,
    gate: &'a WriteGate,
    target: Target<'a, S>,
    clock: &'a C,
    give_up_at: Instant,
}

/// How a term reaches its service and its clock: closures that capture nothing (and
/// so take no room), given the target or clock when called. Named types for the
/// service's and the clock's futures, which a struct cannot name otherwise.
struct Wiring<N, V, Z> {
    send: N,
    watch: V,
    sleep: Z,
}

pin_project_lite::pin_project! {
    /// The future of [`run_term`]. `Q`, `W` and `P` are the futures of a request, a
    /// revocation watch and a sleep.
    struct RunTerm<'a, L, S, C, R, F, N, V, Z, Q, W, P> {
        inputs: Inputs<'a, L, S, C>,
        wiring: Wiring<N, V, Z>,
        // Whether the term began (the first poll starts it, as an `async fn` would).
        started: bool,
        #[pin]
        release: R,
        report: F,
        // The lease has at most one request in flight (a new one supersedes the
        // old), so one slot holds it, whatever its kind: a driver runs per lease, and
        // its size is most of a lease's memory.
        #[pin]
        io: LeaseIo<Q, W>,
        // The sleep until the lease's next deadline, kept across passes while the
        // deadline stays the same: a runtime timer is registered once per deadline,
        // not once per answer or wake-up. `sleeping_until` is its deadline while the
        // slot holds one.
        #[pin]
        sleep: Option<P>,
        sleeping_until: Instant,
    }
}

impl<'a, L, S, C, R, F, N, V, Z, Q, W, P> RunTerm<'a, L, S, C, R, F, N, V, Z, Q, W, P>
where
    N: Fn(Target<'a, S>, Action) -> Q,
    V: Fn(Target<'a, S>, leasehold::Term, Fence) -> W,
    Z: Fn(&'a C, Instant) -> P,
{
    /// Ties the futures' types to the closures that make them.
    fn new(inputs: Inputs<'a, L, S, C>, release: R, report: F, wiring: Wiring<N, V, Z>) -> Self {
        RunTerm {
            inputs,
            wiring,
            started: false,
            release,
            report,
            io: LeaseIo::new(),
            sleep: None,
            sleeping_until: Instant::ZERO,
        }
    }
}

impl<'a, L, S, C, R, F, N, V, Z, Q, W, P> Future for RunTerm<'a, L, S, C, R, F, N, V, Z, Q, W, P>
where
    L: Borrow<Config>,
    C: Clock,
    R: Future<Output = ()>,
    F: FnMut(Report),
    N: Fn(Target<'a, S>, Action) -> Q,
    Q: Future<Output = Response>,
    V: Fn(Target<'a, S>, leasehold::Term, Fence) -> W,
    W: Future<Output = ()>,
    Z: Fn(&'a C, Instant) -> P,
    P: Future<Output = ()>,
{
    type Output = Result<TermEnd, AlreadyActive>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Inputs {
            lease,
            gate,
            target,
            clock,
            give_up_at,
        } = this.inputs;
        let (target, clock) = (*target, *clock);
        if !*this.started {
            if let Err(active) = lease.acquire_until(clock.now(), *give_up_at, gate) {
                // Not started: polled again, it answers the same, and never drives
                // the term it found running.
                return Poll::Ready(Err(active));
            }
            *this.started = true;
        }
        let wiring = &*this.wiring;
        let mut release = this.release;
        let mut hooks = Hooks {
            send: |action| (wiring.send)(target, action),
            watch: |term, fence| (wiring.watch)(target, term, fence),
            release: |cx: &mut Context<'_>| release.as_mut().poll(cx),
            report: this.report,
        };
        let (mut io, mut sleep) = (this.io, this.sleep);
        loop {
            let next = match step(lease, gate, clock, io.as_mut(), cx, &mut hooks) {
                Stepped::Ended(end) => return Poll::Ready(Ok(end)),
                Stepped::Waiting(next) => next,
            };
            match next {
                Some(at) if sleep.is_none() || at != *this.sleeping_until => {
                    sleep.set(Some((wiring.sleep)(clock, at)));
                    *this.sleeping_until = at;
                }
                Some(_) => {}
                None => sleep.set(None),
            }
            if poll_slot(sleep.as_mut(), cx).is_none() {
                return Poll::Pending;
            }
            lease.handle_timeout(clock.now(), gate);
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's future, its output wrapped as the lease takes it (`wrap`, a
    /// `Response` variant). Unlike `futures_util`'s `map` it keeps no state of its own,
    /// and so has no "polled after completion" panic path: the loop empties the slot
    /// the moment the future completes, and never polls it again.
    struct Answer<F, W> {
        #[pin]
        future: F,
        wrap: W,
    }
}

impl<F: Future, W: Fn(F::Output) -> Response> Future for Answer<F, W> {
    type Output = Response;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Response> {
        let this = self.project();
        this.future.poll(cx).map(|output| (this.wrap)(output))
    }
}
