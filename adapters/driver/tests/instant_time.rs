//! The shared loop on a clock that jumps straight to every deadline, with a service
//! that answers at once: a deterministic check of the loop's wiring, independent of
//! any runtime. The adapters test it again on their own virtual clocks.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::task::Poll;

use futures::executor::block_on;
use leasehold::{
    AcquireOutcome, Config, Duration, Event, Fence, GateError, Instant, Lease, LossReason, Owner,
    OwnerToken, ReleaseOutcome, RenewOutcome, WriteGate,
};
use leasehold_driver::{run_term, Clock, LocalLockService, Target, TermEnd};

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

/// One key; answers at once; can be told to start refusing renewals.
#[derive(Default)]
struct OneKey {
    holder: RefCell<Option<OwnerToken>>,
    fence: Cell<u64>,
    renewals: Cell<u32>,
    refuse_renewals_after: Cell<Option<u32>>,
}

impl LocalLockService for OneKey {
    async fn acquire(&self, _key: &str, token: OwnerToken, ttl: Duration) -> AcquireOutcome {
        let mut holder = self.holder.borrow_mut();
        if holder.is_some() {
            return AcquireOutcome::HeldByAnother;
        }
        *holder = Some(token);
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
        if refused || *self.holder.borrow() != Some(token) || fence != current {
            RenewOutcome::NotOwner
        } else {
            RenewOutcome::Renewed { ttl }
        }
    }
    async fn release(&self, _key: &str, token: OwnerToken) -> ReleaseOutcome {
        let mut holder = self.holder.borrow_mut();
        if *holder == Some(token) {
            *holder = None;
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwner
        }
    }
}

fn config() -> Config {
    Config::builder(Duration::from_millis(900)).build().unwrap()
}

fn target(service: &OneKey) -> Target<'_, OneKey> {
    Target {
        service,
        key: "k",
        owner: Owner([1; 16]),
    }
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
    let clock = JumpClock(Cell::new(Instant::ZERO));
    let gate = WriteGate::new();
    let mut lease = Lease::new(config());
    let mut events = Vec::new();

    let end = block_on(run_term(
        &mut lease,
        &gate,
        target(&service),
        &clock,
        at_time(&clock, Instant::from_millis(1_000)),
        |e| events.push((clock.now(), e)),
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
    assert_eq!(*service.holder.borrow(), None, "the key was deleted");
}

#[test]
fn not_owner_ends_the_term_with_the_gate_closed() {
    let service = OneKey::default();
    service.refuse_renewals_after.set(Some(2));
    let clock = JumpClock(Cell::new(Instant::ZERO));
    let gate = WriteGate::new();
    let mut lease = Lease::new(config());

    let end = block_on(run_term(
        &mut lease,
        &gate,
        target(&service),
        &clock,
        std::future::pending(),
        |_| {},
    ))
    .unwrap();

    assert_eq!(end, TermEnd::Lost(LossReason::NotOwner));
    assert_eq!(clock.now(), Instant::from_millis(900), "the third renewal");
    assert_eq!(
        gate.check(clock.now()),
        Err(GateError::Lost(LossReason::NotOwner))
    );
}

#[test]
fn a_running_term_cannot_be_driven_twice() {
    let service = OneKey::default();
    let clock = JumpClock(Cell::new(Instant::ZERO));
    let gate = WriteGate::new();
    let mut lease = Lease::new(config());
    lease.acquire(Instant::ZERO, &gate).unwrap();
    let result = block_on(run_term(
        &mut lease,
        &gate,
        target(&service),
        &clock,
        std::future::pending(),
        |_| {},
    ));
    assert!(result.is_err());
}

#[test]
fn a_target_is_copy_for_any_service() {
    // `OneKey` is neither `Clone` nor `Copy`; a task reuses its target for every term.
    let service = OneKey::default();
    let clock = JumpClock(Cell::new(Instant::ZERO));
    let gate = WriteGate::new();
    let mut lease = Lease::new(config());
    let target = target(&service);
    for _ in 0..2 {
        let end = block_on(run_term(
            &mut lease,
            &gate,
            target,
            &clock,
            std::future::ready(()),
            |_| {},
        ));
        assert_eq!(end, Ok(TermEnd::Released));
    }
}
