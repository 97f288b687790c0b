//! What the driver task and every handle of one lease share.
//!
//! The write gate is the authority on whether a write may happen; everything else here
//! is bookkeeping *about* the lease (state for observers, how the term ended, who waits
//! for what). The driver task is the gate's only writer. A handle that wants writes to
//! stop before the driver gets to run (release, or the driver gone) raises the `stop`
//! flag, which [`check`](crate::LeaseHandle::check) reads right after the gate.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

use leasehold::{
    AcquireFailure, Config, Event, Fence, GateError, Holder, Identity, Instant, LossReason, Owner,
    OwnerToken, Stats, Term, WriteGate,
};
use leasehold_driver::Report;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::set::Inboxes;
use crate::waiters::{self, Waiters};
use crate::{metrics, trace, LeaseClock, LeaseEnd, LeaseState, LeaseStats, TimedEvent};

/// How many events a late [`events`](crate::LeaseHandle::events) subscriber can lag
/// behind before it misses some.
const EVENT_CAPACITY: usize = 32;

/// Values of [`Shared::stop`].
mod stop {
    pub(super) const NONE: u8 = 0;
    pub(super) const RELEASE: u8 = 1;
    pub(super) const DRIVER_GONE: u8 = 2;
}

/// Why writes stopped before the gate said so; see [`Shared::stop_cause`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopCause {
    Release,
    DriverGone,
}

/// What every lease started the same way shares: a [`LeaseSet`](crate::LeaseSet)'s
/// leases share one (unless an acquire names its own identity), and so do the tasks
/// per lease started on one thread with the same config and identity (see
/// [`for_task`](Common::for_task)). Kept apart so that a lease does not carry
/// 88 bytes that are the same in all of them.
#[derive(Debug)]
pub(crate) struct Common {
    pub(crate) config: Config,
    pub(crate) clock: LeaseClock,
    /// The process's default identity (shared by every lease that names none), or
    /// the one an acquire named.
    pub(crate) identity: Arc<Identity>,
    /// A set's driver inboxes, by index: where its leases' wake-ups go. `None` for a
    /// task per lease.
    pub(crate) drivers: Option<Inboxes>,
}

impl Common {
    /// The block of a task per lease with `config` and `identity` (the process's
    /// default when `None`): the last one made on this thread while a lease still
    /// uses it and it matches, else a new one, whose clock starts now.
    ///
    /// A lease's clock may start before the lease (as a set's does): the core only
    /// compares instants of one lease. It must not start after *now*, though, which
    /// it could under another runtime whose paused clock is behind (every runtime
    /// has its own virtual clock, and a thread may run one after another): the lease
    /// would see no time pass until that runtime caught up. Such a block is not
    /// shared.
    pub(crate) fn for_task(config: Config, identity: Option<Identity>) -> Arc<Common> {
        thread_local! {
            static LAST: std::cell::RefCell<std::sync::Weak<Common>> =
                const { std::cell::RefCell::new(std::sync::Weak::new()) };
        }
        let identity = identity.map_or_else(crate::acquire::default_identity, Arc::new);
        let now = tokio::time::Instant::now();
        LAST.with_borrow_mut(|last| {
            if let Some(common) = last.upgrade() {
                let same = common.config == config && common.identity == identity;
                if same && common.clock.origin() <= now && common.drivers.is_none() {
                    return common;
                }
            }
            let common = Arc::new(Common {
                config,
                clock: LeaseClock::starting_at(now),
                identity,
                drivers: None,
            });
            *last = Arc::downgrade(&common);
            common
        })
    }

    /// `self`, or a copy with `identity` (the process's default when `None`) when it
    /// differs.
    pub(crate) fn with_identity(self: &Arc<Common>, identity: Option<Identity>) -> Arc<Common> {
        // Compared before anything is allocated: most acquires name the set's identity.
        let identity = match identity {
            Some(named) if named == *self.identity => return Arc::clone(self),
            Some(named) => Arc::new(named),
            None => crate::acquire::default_identity(),
        };
        if identity == self.identity {
            return Arc::clone(self);
        }
        Arc::new(Common {
            identity,
            drivers: self.drivers.clone(),
            ..**self
        })
    }
}

pub(crate) struct Shared {
    pub(crate) gate: WriteGate,
    common: Arc<Common>,
    pub(crate) key: Box<str>,
    pub(crate) owner: Owner,
    /// A [`stop`] value: raised by a release request or the driver's end.
    stop: AtomicU8,
    /// For a lease in a [`LeaseSet`](crate::LeaseSet), where its wake-ups go: its
    /// driver (an index into [`Common::drivers`]) and its slot there, and whether it is
    /// queued there already. The lease's record is its own waker (see `set::wake`):
    /// these 7 bytes fit beside `stop`, and the lease needs no 32-byte waker
    /// allocation of its own.
    pub(crate) queued: AtomicBool,
    pub(crate) driver: AtomicU16,
    pub(crate) slot: AtomicU32,
    /// Live [`LeaseHandle`](crate::LeaseHandle)s; the last one to go releases.
    pub(crate) handles: AtomicUsize,
    /// Wakes the driver for a release; the driver's release future is
    /// [`ReleaseWanted`], 8 bytes, where a `Notified` would add 64 to every lease.
    /// Lock-free, not under the status lock: the driver registers it at every step,
    /// and a lock there costs a task per lease on Redis about 5 % more CPU per
    /// renewal.
    release_waker: AtomicWaker,
    status: Mutex<Status>,
}

/// Bookkeeping about the lease, for observers. Never consulted by `check()`.
///
/// The state is kept as its [`Phase`] beside the one fence and deadline it can carry:
/// a held state's fence is always the grant's, and a whole `LeaseState` beside the
/// grant would cost every lease 24 more bytes.
struct Status {
    /// The deadline of a held state; before the grant, when the acquire began (its
    /// wait is reported from there: the lease's clock may have started long before,
    /// with its set or with another task's lease).
    deadline: Instant,
    /// The grant's fence, once granted; also the fence of a held state.
    fence: Fence,
    /// Created on first use, and dropped again once empty (see [`Status::tidy`]):
    /// most leases are granted, never retry, never wait for a holder, and have no
    /// handle waiting nor observing once granted; inline these would cost every lease
    /// 160 bytes.
    rare: Option<Box<Rare>>,
    /// The grant's term, once [`GRANTED`].
    term: Term,
    phase: Phase,
    /// How the term ended, set once: the first of loss, release request, driver gone.
    end: Option<LeaseEnd>,
    /// [`GRANTED`] and [`FINISHED`], in one byte: an `Option` around the term and a
    /// flag of their own would take 8 bytes more than the 32 this keeps to.
    flags: u8,
}

/// A [`Status::flags`] bit: the lease was granted; the term and fence are the grant's.
const GRANTED: u8 = 1;
/// A [`Status::flags`] bit: the driver task returned (or was dropped).
const FINISHED: u8 = 2;

/// A [`LeaseState`] without its fence and deadline (see [`Status`]).
#[derive(Clone, Copy)]
enum Phase {
    Acquiring,
    Holding,
    RenewPending { writes_paused: bool },
    Releasing,
    Lost(LossReason),
    Released,
    DriverStopped,
}

/// What only some leases need, or a lease only for a while: a contender waiting for a
/// held key, a lease someone observes or waits for, one that retried, or an acquire
/// that failed.
#[derive(Default)]
struct Rare {
    /// The handles' futures waiting for any change: woken under the status lock,
    /// which every change takes anyway.
    waiters: Waiters,
    /// The acquire ended without a grant, and why.
    not_acquired: Option<AcquireFailure>,
    /// Retries counted from the events, and the core's counters at the term's end
    /// (zero for every lease of this runtime's drivers, so only kept when not).
    stats: LeaseStats,
    /// The holder named by the latest "held by another" answer.
    last_holder: Option<Holder>,
    token: Option<CancellationToken>,
    watch: Option<watch::Sender<LeaseState>>,
    events: Option<broadcast::Sender<TimedEvent>>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        let Rare {
            waiters,
            not_acquired,
            stats,
            last_holder,
            token,
            watch,
            events,
        } = self;
        waiters.is_empty()
            && not_acquired.is_none()
            && *stats == LeaseStats::default()
            && last_holder.is_none()
            && token.is_none()
            && watch.is_none()
            && events.is_none()
    }
}

impl Status {
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Lets go of what only some leases need once nothing is kept there: the acquire
    /// that waited for the grant leaves it empty in most leases.
    fn tidy(&mut self) {
        if self.rare.as_deref().is_some_and(Rare::is_empty) {
            self.rare = None;
        }
    }

    /// Wakes every waiting future: something changed.
    fn wake_all(&self) {
        if let Some(rare) = &self.rare {
            rare.waiters.wake_all();
        }
    }

    fn not_acquired(&self) -> Option<AcquireFailure> {
        self.rare.as_ref().and_then(|rare| rare.not_acquired)
    }

    fn state(&self) -> LeaseState {
        let (fence, deadline) = (self.fence, self.deadline);
        match self.phase {
            Phase::Acquiring => LeaseState::Acquiring,
            Phase::Holding => LeaseState::Holding { fence, deadline },
            Phase::RenewPending { writes_paused } => LeaseState::RenewPending {
                fence,
                deadline,
                writes_paused,
            },
            Phase::Releasing => LeaseState::Releasing,
            Phase::Lost(reason) => LeaseState::Lost(reason),
            Phase::Released => LeaseState::Released,
            Phase::DriverStopped => LeaseState::DriverStopped,
        }
    }

    /// The grant's fence and term, once granted.
    fn granted(&self) -> Option<(Fence, Term)> {
        (self.flags & GRANTED != 0).then_some((self.fence, self.term))
    }

    /// Whether the lease counts in the "leases held" gauge: granted, not yet ended.
    fn counted_held(&self) -> bool {
        self.flags & GRANTED != 0 && self.end.is_none()
    }
}

impl Shared {
    /// A lease whose acquire began at `began` (on `common`'s clock).
    pub(crate) fn new(key: Box<str>, owner: Owner, common: Arc<Common>, began: Instant) -> Shared {
        Shared {
            gate: WriteGate::new(),
            common,
            key,
            owner,
            stop: AtomicU8::new(stop::NONE),
            queued: AtomicBool::new(false),
            driver: AtomicU16::new(0),
            slot: AtomicU32::new(0),
            handles: AtomicUsize::new(0),
            release_waker: AtomicWaker::new(),
            status: Mutex::new(Status {
                deadline: began,
                fence: Fence(0),
                rare: None,
                term: Term(0),
                phase: Phase::Acquiring,
                end: None,
                flags: 0,
            }),
        }
    }

    /// What the lease shares with the others started the same way.
    pub(crate) fn common(&self) -> &Common {
        &self.common
    }

    /// The lease's config.
    pub(crate) fn config(&self) -> Config {
        self.common.config
    }

    /// The clock of the lease's instants.
    pub(crate) fn clock(&self) -> &LeaseClock {
        &self.common.clock
    }

    /// The identity stored with the grant.
    pub(crate) fn identity(&self) -> &Identity {
        &self.common.identity
    }

    /// A lease's shared state for the size tests: key `k`, TTL 3 s.
    #[cfg(test)]
    pub(crate) fn sample() -> Arc<Shared> {
        let config = Config::builder(leasehold::Duration::from_secs(3))
            .build()
            .unwrap();
        let common = Arc::new(Common {
            config,
            clock: LeaseClock::start(),
            identity: Arc::new(Identity::EMPTY),
            drivers: None,
        });
        Arc::new(Shared::new(
            "k".into(),
            Owner([0; 16]),
            common,
            Instant::ZERO,
        ))
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        // Nothing panics while holding the lock; if something did, the data is still
        // plain values, so keep going rather than poison every handle.
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why writes stopped ahead of the gate, if they did.
    pub(crate) fn stop_cause(&self) -> Option<StopCause> {
        match self.stop.load(Ordering::Acquire) {
            stop::NONE => None,
            stop::RELEASE => Some(StopCause::Release),
            _ => Some(StopCause::DriverGone),
        }
    }

    pub(crate) fn state(&self) -> LeaseState {
        self.status().state()
    }

    /// A `check()` was refused for a loss the driver may not have reported yet: the
    /// term ended by it, unless it had ended already.
    pub(crate) fn ended_by(&self, reason: LossReason) {
        {
            let mut status = self.status();
            if status.end.is_some() {
                return;
            }
            end_once(&mut status, LeaseEnd::Lost(reason));
            status.wake_all();
        }
    }

    pub(crate) fn end(&self) -> Option<LeaseEnd> {
        self.status().end
    }

    pub(crate) fn granted(&self) -> Option<(Fence, Term)> {
        self.status().granted()
    }

    /// What an acquire waits for, read under one lock: whether it was granted, how it
    /// failed, the holder named by the last refusal, and the state. Read one by one,
    /// a grant published between the reads looks like neither a grant nor a failure,
    /// with the state already `Holding`.
    pub(crate) fn acquire_view(
        &self,
    ) -> (bool, Option<AcquireFailure>, Option<Holder>, LeaseState) {
        let status = self.status();
        (
            status.granted().is_some(),
            status.not_acquired(),
            status.rare.as_ref().and_then(|rare| rare.last_holder),
            status.state(),
        )
    }

    /// The owner token this lease presents (every handle runs one term).
    pub(crate) fn token(&self) -> OwnerToken {
        let term = self.granted().map_or(Term(1), |(_, term)| term);
        self.owner.token(term)
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        let status = self.status();
        status
            .rare
            .as_ref()
            .map(|rare| rare.stats)
            .unwrap_or_default()
    }

    /// The driver's term is over: the core's counters, for the handles.
    pub(crate) fn record_core_stats(&self, core: Stats) {
        if core != Stats::default() {
            self.status().rare().stats.core = core;
        }
    }

    pub(crate) fn finished(&self) -> bool {
        self.status().flags & FINISHED != 0
    }

    // ----- observers -----

    pub(crate) fn cancellation_token(&self) -> CancellationToken {
        let mut status = self.status();
        let ended = status.end.is_some();
        let token = status
            .rare()
            .token
            .get_or_insert_with(CancellationToken::new);
        if ended {
            token.cancel();
        }
        token.clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LeaseState> {
        let mut status = self.status();
        let state = status.state();
        let rare = status.rare();
        match &rare.watch {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(state);
                rare.watch = Some(sender);
                receiver
            }
        }
    }

    pub(crate) fn events(&self) -> broadcast::Receiver<TimedEvent> {
        self.status()
            .rare()
            .events
            .get_or_insert_with(|| broadcast::channel(EVENT_CAPACITY).0)
            .subscribe()
    }

    /// Waits until `ready` says yes, re-checking after every change.
    pub(crate) async fn wait_for<T>(&self, ready: impl Fn(&Shared) -> Option<T>) -> T {
        let waiter = Waiter {
            shared: self,
            id: waiters::next_id(),
        };
        let mut at = 0;
        std::future::poll_fn(|cx| {
            // Register before looking, so a change between the look and the return
            // still wakes us.
            self.status()
                .rare()
                .waiters
                .register(waiter.id, cx.waker(), &mut at);
            ready(self).map_or(Poll::Pending, Poll::Ready)
        })
        .await
        // `waiter` leaves the list here, or wherever the future is dropped.
    }

    /// Completes once a release was requested (or the driver is gone); the driver's
    /// `release` future.
    pub(crate) fn release_wanted(&self) -> ReleaseWanted<'_> {
        ReleaseWanted(self)
    }

    /// Ready once a release was requested (or the driver is gone); pending until
    /// then, with `cx`'s waker registered to hear of it. The driver's step polls it
    /// only while no acquire attempt is in flight.
    pub(crate) fn poll_release(&self, cx: &mut Context<'_>) -> Poll<()> {
        // Register first, then look: a request in between still wakes us.
        self.release_waker.register(cx.waker());
        if self.stop.load(Ordering::Acquire) == stop::NONE {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    // ----- transitions -----

    /// Writes must stop and the term end: raises the stop flag at once (so `check()`
    /// refuses from now on), then wakes the driver, which closes the gate and sends
    /// the release. Idempotent.
    pub(crate) fn request_release(&self, why: trace::ReleaseWhy) {
        // Only ever raise: a driver already gone stays gone.
        let _ = self.stop.compare_exchange(
            stop::NONE,
            stop::RELEASE,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        // Past the safe deadline the term has already ended by expiry (a client
        // paused past it calls `release()` before the driver has run): that is how it
        // ended, not by this release.
        let expired = matches!(
            self.gate.check(self.clock().now()),
            Err(GateError::DeadlinePassed { .. })
        );
        let first = {
            let mut status = self.status();
            let first = status.end.is_none();
            if first && expired {
                end_once(&mut status, LeaseEnd::Lost(LossReason::Expired));
            } else if first {
                end_once(&mut status, LeaseEnd::Released);
                set_state(&mut status, LeaseState::Releasing);
            }
            status.wake_all();
            first
        };
        if first {
            trace::release_requested(&self.key, self.token(), why);
        }
        self.release_waker.wake();
    }

    /// The driver reported `report` at `at`: update the state, tell subscribers.
    pub(crate) fn publish(&self, report: Report, at: tokio::time::Instant) {
        let event = match report {
            Report::Event(event) => event,
            Report::HeldBy(holder) => {
                self.status().rare().last_holder = Some(holder);
                return;
            }
            // Reports a newer driver adds are not for the handles.
            _ => return,
        };
        let timed = TimedEvent {
            at,
            lease_time: self.clock().to_lease(at),
            event,
        };
        // How long the event took: a renewal's round trip, or an acquire's wait.
        let took = match event {
            Event::Renewed { sent_at, .. } => timed.lease_time.checked_duration_since(sent_at),
            Event::Acquired { .. } | Event::AcquireFailed { retry_at: None, .. } => {
                // Before the grant is published, the deadline field holds the start.
                let began = self.status().deadline;
                timed.lease_time.checked_duration_since(began)
            }
            _ => None,
        };
        trace::event(&self.key, self.token(), &timed, took);
        metrics::event(&self.key, &timed, took);
        {
            let mut status = self.status();
            match event {
                Event::AcquireFailed {
                    retry_at: Some(_), ..
                } => {
                    let stats = &mut status.rare().stats;
                    stats.acquire_retries = stats.acquire_retries.saturating_add(1);
                }
                Event::RenewFailed {
                    retry_at: Some(_), ..
                } => {
                    let stats = &mut status.rare().stats;
                    stats.renewal_retries = stats.renewal_retries.saturating_add(1);
                }
                _ => {}
            }
            let next = match event {
                Event::Acquired {
                    term,
                    fence,
                    deadline,
                    ..
                } => {
                    let counted = status.counted_held();
                    (status.fence, status.term) = (fence, term);
                    status.flags |= GRANTED;
                    if status.counted_held() && !counted {
                        metrics::held(1.0);
                    }
                    Some(LeaseState::Holding { fence, deadline })
                }
                Event::AcquireFailed {
                    reason,
                    retry_at: None,
                    ..
                } => {
                    status.rare().not_acquired = Some(reason);
                    None
                }
                Event::Renewed { deadline, .. } => status
                    .granted()
                    .map(|(fence, _)| LeaseState::Holding { fence, deadline }),
                Event::RenewFailed {
                    deadline,
                    writes_paused,
                    ..
                } => status.granted().map(|(fence, _)| LeaseState::RenewPending {
                    fence,
                    deadline,
                    writes_paused,
                }),
                Event::Lost { reason, .. } => {
                    end_once(&mut status, LeaseEnd::Lost(reason));
                    Some(LeaseState::Lost(reason))
                }
                Event::Released => {
                    end_once(&mut status, LeaseEnd::Released);
                    Some(LeaseState::Released)
                }
                _ => None,
            };
            if let Some(state) = next {
                set_state(&mut status, state);
            }
            if let Some(events) = status.rare.as_ref().and_then(|rare| rare.events.as_ref()) {
                // No receiver left is fine: nobody listens.
                let _ = events.send(timed);
            }
            status.wake_all();
        }
    }

    /// The driver task is over (returned, panicked, or dropped with its runtime). If the
    /// term had not ended, it ends now: nothing renews the lease any more.
    pub(crate) fn finish(&self) {
        // Nothing waits for a release any more. In a set, the waker is this lease
        // itself, which would otherwise keep itself in memory for good.
        drop(self.release_waker.take());
        let stopped = {
            let mut status = self.status();
            status.flags |= FINISHED;
            // A term that ended without a grant (refused, or the wait bound ran out)
            // ended normally: nothing was held, nothing stopped early.
            let stopped = status.end.is_none() && status.not_acquired().is_none();
            if stopped {
                self.stop.store(stop::DRIVER_GONE, Ordering::Release);
                end_once(&mut status, LeaseEnd::DriverStopped);
                set_state(&mut status, LeaseState::DriverStopped);
            }
            status.wake_all();
            stopped
        };
        if stopped {
            trace::driver_stopped(&self.key, self.token());
            metrics::driver_stopped();
        }
    }
}

/// A handle's future registered in [`Waiters`]; leaves the list when it goes.
struct Waiter<'a> {
    shared: &'a Shared,
    id: waiters::WaiterId,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut status = self.shared.status();
        if let Some(rare) = &mut status.rare {
            rare.waiters.remove(self.id);
        }
        status.tidy();
    }
}

/// See [`Shared::release_wanted`].
pub(crate) struct ReleaseWanted<'a>(&'a Shared);

impl Future for ReleaseWanted<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_release(cx)
    }
}

/// Records the end of the term (first cause wins) and cancels the token.
fn end_once(status: &mut Status, end: LeaseEnd) {
    if status.counted_held() {
        metrics::held(-1.0);
    }
    if status.end.is_none() {
        status.end = Some(end);
    }
    if let Some(token) = status.rare.as_ref().and_then(|rare| rare.token.as_ref()) {
        token.cancel();
    }
}

/// Moves to `state`, unless the term already ended and `state` would reopen it: a
/// renewal answered in the same instant as a release request must not show "holding".
fn set_state(status: &mut Status, state: LeaseState) {
    if status.end.is_some() && state.end().is_none() {
        return;
    }
    status.phase = match state {
        LeaseState::Acquiring => Phase::Acquiring,
        LeaseState::Holding { fence, deadline } => {
            (status.fence, status.deadline) = (fence, deadline);
            Phase::Holding
        }
        LeaseState::RenewPending {
            fence,
            deadline,
            writes_paused,
        } => {
            (status.fence, status.deadline) = (fence, deadline);
            Phase::RenewPending { writes_paused }
        }
        LeaseState::Releasing => Phase::Releasing,
        LeaseState::Lost(reason) => Phase::Lost(reason),
        LeaseState::Released => Phase::Released,
        LeaseState::DriverStopped => Phase::DriverStopped,
    };
    if let Some(watch) = status.rare.as_ref().and_then(|rare| rare.watch.as_ref()) {
        watch.send_replace(state);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use leasehold::{AcquireOutcome, Action, Config, Fence, Identity, Lease, LossReason};

    use super::{Common, Shared};
    use crate::state::LeaseEnd;
    use crate::trace::ReleaseWhy;

    /// Tasks started on one thread with the same config and identity keep one config
    /// block between them, as a set's leases do, not 104 B each; another config or
    /// identity gets its own.
    #[tokio::test(start_paused = true)]
    async fn tasks_with_one_config_and_identity_share_one_block() {
        let config = Config::builder(leasehold::Duration::from_secs(3))
            .build()
            .unwrap();
        let first = Common::for_task(config, None);
        let second = Common::for_task(config, None);
        assert!(Arc::ptr_eq(&first, &second));
        let named = Common::for_task(config, Some(Identity::lossy("worker-7")));
        assert!(!Arc::ptr_eq(&first, &named));
        let longer = Config::builder(leasehold::Duration::from_secs(30))
            .build()
            .unwrap();
        assert!(!Arc::ptr_eq(&first, &Common::for_task(longer, None)));
    }

    /// The acquire's wait is over once granted: a lease nobody else waits for nor
    /// observes keeps nothing of what only some leases need (160 bytes), in either
    /// shape, until a handle waits again.
    #[tokio::test(start_paused = true)]
    async fn a_granted_lease_keeps_nothing_for_waiters_once_none_waits() {
        let service = Arc::new(crate::memory::MemoryService::new());
        let config = crate::config(std::time::Duration::from_secs(3))
            .build()
            .unwrap();
        let set = crate::LeaseSet::with_drivers(Arc::clone(&service), config, 1);
        let leases = [
            crate::acquire(Arc::clone(&service), "task", config)
                .await
                .unwrap(),
            set.acquire("set").await.unwrap(),
        ];
        for lease in &leases {
            assert!(lease.shared().status().rare.is_none());
        }
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(10), leases[0].lost());
        assert!(waiting.await.is_err(), "not lost");
        assert!(
            leases[0].shared().status().rare.is_none(),
            "kept after the wait"
        );
    }

    /// A client paused past its safe deadline asks to release before its driver has
    /// run: the term ended by expiry, and that is what every handle must say.
    #[tokio::test(start_paused = true)]
    async fn a_release_asked_for_past_the_deadline_reports_the_expiry() {
        let shared = Shared::sample();
        let mut lease = Lease::new(shared.config(), shared.owner);
        lease.acquire(shared.clock().now(), &shared.gate).unwrap();
        let Some(Action::Acquire { id, ttl, .. }) = lease.poll_action() else {
            panic!("an acquire");
        };
        let granted = AcquireOutcome::Granted {
            fence: Fence(1),
            ttl,
        };
        let handled = lease.handle_response(shared.clock().now(), id, granted.into(), &shared.gate);
        assert_eq!(handled, leasehold::Handled::Applied);
        assert_eq!(shared.gate.check(shared.clock().now()), Ok(Fence(1)));

        // The whole process stops for longer than the TTL; nothing ran meanwhile.
        tokio::time::advance(std::time::Duration::from_secs(4)).await;
        shared.request_release(ReleaseWhy::Requested);
        assert_eq!(shared.end(), Some(LeaseEnd::Lost(LossReason::Expired)));
    }
}
