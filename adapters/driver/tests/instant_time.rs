//! The shared loop on a clock that jumps straight to every deadline, with a service
//! that answers at once: a deterministic check of the loop's wiring, independent of
//! any runtime. The adapters test it again on their own virtual clocks.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::task::Poll;

use futures::executor::block_on;
use leasehold::{
    AcquireFailure, AcquireOutcome, AlreadyActive, Config, Duration, Event, Fence, GateError,
    Holder, HolderOutcome, Identity, Instant, Lease, LossReason, Owner, OwnerToken, Refusal,
    ReleaseOutcome, RenewOutcome, WriteGate,
};
use leasehold_driver::{run_term, Clock, LocalLockService, Report, Target, TermEnd};

/// A sleep, when polled, jumps the clock to its deadline. The loop polls its timer
/// last, so an answer that is ready wins over the jump.
struct JumpClock(Cell<Instant>);

impl Clock for JumpClock {
    fn now(&self) -> Instant {
        self.0.get()
    }
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> {
        poll_fn(move |_| {
            self.0.set(self.0.get().max(deadline));
            Poll::Ready(())
        })
    }
}

/// One key; answers at once; can be told to start refusing renewals, or to refuse
/// every acquire for good.
#[derive(Default)]
struct OneKey {
    holder: RefCell<Option<(OwnerToken, Identity)>>,
    fence: Cell<u64>,
    renewals: Cell<u32>,
    refuse_renewals_after: Cell<Option<u32>>,
    refuse_acquires: Cell<Option<Refusal>>,
    /// The fence of each revocation watch started, in order.
    watched: RefCell<Vec<Fence>>,
}

impl OneKey {
    fn holder_token(&self) -> Option<OwnerToken> {
        self.holder.borrow().map(|(token, _)| token)
    }
}

impl LocalLockService for OneKey {
    async fn acquire(
        &self,
        _key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        if let Some(why) = self.refuse_acquires.get() {
            return AcquireOutcome::Refused(why);
        }
        let mut holder = self.holder.borrow_mut();
        if let Some((_, identity)) = *holder {
            return AcquireOutcome::HeldByAnother(Holder {
                identity,
                fence: Fence(self.fence.get()),
                remaining: ttl,
            });
        }
        *holder = Some((token, *identity));
        self.fence.set(self.fence.get() + 1);
        AcquireOutcome::Granted {
            fence: Fence(self.fence.get()),
            ttl,
        }
    }
    async fn renew(
        &self,
        _key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        self.renewals.set(self.renewals.get() + 1);
        let refused = self
            .refuse_renewals_after
            .get()
            .is_some_and(|n| self.renewals.get() > n);
        let current = Fence(self.fence.get());
        if refused || self.holder_token() != Some(token) || fence != current {
            RenewOutcome::NotOwner
        } else {
            RenewOutcome::Renewed { ttl }
        }
    }
    async fn release(&self, _key: &str, token: OwnerToken) -> ReleaseOutcome {
        if self.holder_token() == Some(token) {
            *self.holder.borrow_mut() = None;
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwner
        }
    }
    fn revoked(&self, _key: &str, _token: OwnerToken, fence: Fence) -> impl Future<Output = ()> {
        self.watched.borrow_mut().push(fence);
        std::future::pending()
    }
    async fn holder(&self, _key: &str) -> HolderOutcome {
        match *self.holder.borrow() {
            Some((_, identity)) => HolderOutcome::Held(Holder {
                identity,
                fence: Fence(self.fence.get()),
                remaining: Duration::ZERO,
            }),
            None => HolderOutcome::Free,
        }
    }
}

fn config() -> Config {
    Config::builder(Duration::from_millis(900)).build().unwrap()
}

/// A clock at zero, a closed gate and a lease that never held: where each test starts.
fn fresh() -> (JumpClock, WriteGate, Lease) {
    (
        JumpClock(Cell::new(Instant::ZERO)),
        WriteGate::new(),
        Lease::new(config(), Owner([1; 16])),
    )
}

static IDENTITY: Identity = Identity::EMPTY;

fn target(service: &OneKey) -> Target<'_, OneKey> {
    Target {
        service,
        key: "k",
        owner: Owner([1; 16]),
        identity: &IDENTITY,
    }
}

/// One term of `lease` on `service` that is never released, its reports ignored.
fn unreleased_term<'a, C: Clock>(
    lease: &'a mut Lease,
    gate: &'a WriteGate,
    service: &'a OneKey,
    clock: &'a C,
) -> impl Future<Output = Result<TermEnd, AlreadyActive>> + 'a {
    run_term(
        lease,
        gate,
        target(service),
        clock,
        Instant::MAX,
        std::future::pending(),
        |_| {},
    )
}

/// Completes once the clock reaches `at`.
fn at_time(clock: &JumpClock, at: Instant) -> impl Future<Output = ()> + '_ {
    poll_fn(move |_| {
        if clock.now() >= at {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
}

#[test]
fn renews_every_third_then_releases_on_request() {
    let service = OneKey::default();
    let (clock, gate, mut lease) = fresh();
    let mut events = Vec::new();

    let end = block_on(run_term(
        &mut lease,
        &gate,
        target(&service),
        &clock,
        Instant::MAX,
        at_time(&clock, Instant::from_millis(1_000)),
        |report| {
            if let Report::Event(e) = report {
                events.push((clock.now(), e));
            }
        },
    ))
    .unwrap();

    assert_eq!(end, TermEnd::Released);
    // Renewals at 300, 600 and 900 ms. The next wake-up, at 1,200 ms, finds the
    // release requested: the user's release wins over the renewal due at that instant.
    assert_eq!(service.renewals.get(), 3);
    let renewed: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e, Event::Renewed { .. }))
        .map(|(t, _)| t.as_millis())
        .collect();
    assert_eq!(renewed, [300, 600, 900]);
    assert!(matches!(events.last(), Some((_, Event::Released))));
    assert_eq!(gate.check(clock.now()), Err(GateError::Released));
    assert_eq!(service.holder_token(), None, "the key was deleted");
    // The grant was watched once, not at every step: a watch started anew at each
    // renewal would send a watch request per renewal (etcd) and could miss a
    // revocation between two watches.
    assert_eq!(*service.watched.borrow(), [Fence(1)]);
}

#[test]
fn not_owner_ends_the_term_with_the_gate_closed() {
    let service = OneKey::default();
    service.refuse_renewals_after.set(Some(2));
    let (clock, gate, mut lease) = fresh();

    let end = block_on(unreleased_term(&mut lease, &gate, &service, &clock)).unwrap();

    assert_eq!(end, TermEnd::Lost(LossReason::NotOwner));
    assert_eq!(clock.now(), Instant::from_millis(900), "the third renewal");
    assert_eq!(
        gate.check(clock.now()),
        Err(GateError::Lost(LossReason::NotOwner))
    );
}

/// A clock whose sleeps never end: a loop on it returns as soon as it waits.
struct StoppedClock;

impl Clock for StoppedClock {
    fn now(&self) -> Instant {
        Instant::ZERO
    }
    fn sleep_until(&self, _: Instant) -> impl Future<Output = ()> {
        std::future::pending()
    }
}

/// A lease in the middle of a term is refused, and the loop never drives that term:
/// polled again, it refuses again and sends nothing.
#[test]
fn a_running_term_cannot_be_driven_twice() {
    let service = OneKey::default();
    let gate = WriteGate::new();
    let mut lease = Lease::new(config(), Owner([1; 16]));
    lease.acquire(Instant::ZERO, &gate).unwrap();
    let term = unreleased_term(&mut lease, &gate, &service, &StoppedClock);
    let mut term = std::pin::pin!(term);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for poll in 1..=2 {
        let result = term.as_mut().poll(&mut cx);
        assert!(
            matches!(result, Poll::Ready(Err(_))),
            "poll {poll}: {result:?}"
        );
    }
    assert_eq!(
        service.fence.get(),
        0,
        "the running term's acquire was sent"
    );
}

#[test]
fn a_target_is_copy_for_any_service() {
    // `OneKey` is neither `Clone` nor `Copy`; a task reuses its target for every term.
    let service = OneKey::default();
    let (clock, gate, mut lease) = fresh();
    let target = target(&service);
    for _ in 0..2 {
        let end = block_on(run_term(
            &mut lease,
            &gate,
            target,
            &clock,
            Instant::MAX,
            std::future::ready(()),
            |_| {},
        ));
        assert_eq!(end, Ok(TermEnd::Released));
    }
}

#[test]
fn a_held_key_is_reported_with_its_holder_and_the_wait_bound_ends_the_term() {
    let service = OneKey::default();
    let taken = Identity::new("other-host:77").unwrap();
    *service.holder.borrow_mut() = Some((Owner([2; 16]).token(leasehold::Term(1)), taken));
    service.fence.set(41);
    let (clock, gate, mut lease) = fresh();
    let mut reports = Vec::new();

    let end = block_on(run_term(
        &mut lease,
        &gate,
        target(&service),
        &clock,
        Instant::from_millis(200),
        std::future::pending(),
        |report| reports.push(report),
    ))
    .unwrap();

    assert_eq!(end, TermEnd::NotAcquired(AcquireFailure::HeldByAnother));
    assert!(
        clock.now() < Instant::from_millis(200),
        "no attempt at or after the bound"
    );
    // Each answer: the holder first, then the lease's event.
    assert!(matches!(
        reports.first(),
        Some(Report::HeldBy(Holder { identity, fence: Fence(41), .. })) if *identity == taken
    ));
    assert!(matches!(
        reports.last(),
        Some(Report::Event(Event::AcquireFailed { retry_at: None, .. }))
    ));
    assert_eq!(gate.check(clock.now()), Err(GateError::NotHeld));
}

#[test]
fn a_final_refusal_ends_the_term_at_once() {
    let service = OneKey::default();
    service.refuse_acquires.set(Some(Refusal::Unauthorized));
    let (clock, gate, mut lease) = fresh();
    let end = block_on(unreleased_term(&mut lease, &gate, &service, &clock)).unwrap();
    assert_eq!(
        end,
        TermEnd::NotAcquired(AcquireFailure::Refused(Refusal::Unauthorized))
    );
    assert_eq!(clock.now(), Instant::ZERO, "not retried");
}

/// A [`JumpClock`] that also records every sleep the loop builds, and whether it ran
/// to its end.
struct RecordingClock {
    clock: JumpClock,
    /// (deadline, completed) per sleep built, in order.
    sleeps: RefCell<Vec<(Instant, Cell<bool>)>>,
}

impl Clock for RecordingClock {
    fn now(&self) -> Instant {
        self.clock.now()
    }
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> {
        let index = {
            let mut sleeps = self.sleeps.borrow_mut();
            sleeps.push((deadline, Cell::new(false)));
            sleeps.len() - 1
        };
        let jump = self.clock.sleep_until(deadline);
        async move {
            jump.await;
            self.sleeps.borrow()[index].1.set(true);
        }
    }
}

#[test]
fn a_sleep_is_built_only_when_the_deadline_changes_or_the_last_one_ended() {
    let service = OneKey::default();
    let clock = RecordingClock {
        clock: JumpClock(Cell::new(Instant::ZERO)),
        sleeps: RefCell::new(Vec::new()),
    };
    let gate = WriteGate::new();
    let mut lease = Lease::new(config(), Owner([1; 16]));

    let end = block_on(run_term(
        &mut lease,
        &gate,
        target(&service),
        &clock,
        Instant::MAX,
        at_time(&clock.clock, Instant::from_millis(2_000)),
        |_| {},
    ))
    .unwrap();

    assert_eq!(end, TermEnd::Released);
    let sleeps = clock.sleeps.borrow();
    assert!(
        sleeps.len() >= 6,
        "a sleep per renewal at least: {sleeps:?}"
    );
    for pair in sleeps.windows(2) {
        let ((before, ended), (next, _)) = (&pair[0], &pair[1]);
        assert!(
            before != next || ended.get(),
            "a sleep until {before:?} was rebuilt while the first still waited: {sleeps:?}"
        );
    }
}

/// A lease's loop is most of its memory (a tokio task, an embassy task's static), so
/// it holds each argument once, beside its request slot, its watch and its sleep: an
/// `async fn` would keep every argument twice and the closures that reach the service
/// once more (184 B more with this service).
#[test]
fn the_loop_holds_each_argument_once() {
    let service = OneKey::default();
    let (clock, gate, mut lease) = fresh();
    let (token, ttl) = (Owner([1; 16]).token(leasehold::Term(1)), Duration::ZERO);
    let request = [
        size_of_val(&service.acquire("k", token, &IDENTITY, ttl)),
        size_of_val(&service.renew("k", token, Fence(1), ttl)),
        size_of_val(&service.release("k", token)),
    ];
    let request = request.into_iter().max().unwrap_or(0);
    let sleep = size_of_val(&clock.sleep_until(Instant::ZERO));
    let arguments = size_of::<&mut Lease>()
        + size_of::<&WriteGate>()
        + size_of::<Target<'_, OneKey>>()
        + size_of::<&JumpClock>()
        + size_of::<Instant>();
    let term = unreleased_term(&mut lease, &gate, &service, &clock);
    let size = size_of_val(&term);
    println!("loop {size} B: arguments {arguments} B, request {request} B, sleep {sleep} B");
    // What is left (56 B here): the request's id and the watched fence, the sleep's
    // deadline, a few flags and the slots' tags.
    assert!(
        size <= arguments + request + sleep + 64,
        "the loop is {size} B"
    );
}
