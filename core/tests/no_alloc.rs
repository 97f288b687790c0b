//! The lease never allocates: a whole life of a [`Lease`] — many terms of acquiring
//! (refused, held by another, granted too short, granted), renewing, failing, retrying, losing in every way and releasing, with the gate
//! checked throughout — runs under a counting global allocator and makes zero heap
//! allocations.
//!
//! The allocator is `allocation-counter`'s `#[global_allocator]`, linked into this test
//! binary only. It counts per thread and only inside `measure`, so the test harness's
//! own allocations (other threads, output capture) never count. (The workspace forbids
//! `unsafe` code everywhere, so this file cannot implement `GlobalAlloc` itself.)

use allocation_counter::measure;
use leasehold::{
    AcquireOutcome, Action, Config, Duration, Event, Fence, FenceGate, Handled, Holder, Identity,
    Indeterminate, Instant, Lease, LossReason, Owner, Refusal, ReleaseOutcome, RenewOutcome,
    RequestId, State, WriteGate,
};

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The request the lease just asked for; panics (allocating, but only on failure) if
/// there is none.
#[track_caller]
fn sent(lease: &mut Lease) -> Action {
    let action = lease.poll_action();
    assert!(lease.poll_action().is_none());
    action.unwrap()
}

/// Asserts that a response was the answer to the request in flight.
trait AssertApplied {
    fn applied(self);
}

impl AssertApplied for Handled {
    #[track_caller]
    fn applied(self) {
        assert_eq!(self, Handled::Applied);
    }
}

#[track_caller]
fn event(lease: &mut Lease) -> Event {
    let event = lease.poll_event();
    assert!(lease.poll_event().is_none());
    event.unwrap()
}

/// Acquires a new term at `t` with `fence`: the grant answers 5 ms later.
#[track_caller]
fn acquire(lease: &mut Lease, gate: &WriteGate, t: Instant, fence: Fence) {
    lease.acquire(t, gate).unwrap();
    let id = sent(lease).id();
    let ttl = lease.config().ttl();
    let granted = AcquireOutcome::Granted { fence, ttl };
    lease
        .handle_response(t + ms(5), id, granted.into(), gate)
        .applied();
    assert!(matches!(event(lease), Event::Acquired { .. }));
    assert_eq!(gate.check(t + ms(6)), Ok(fence));
}

/// Acquires that end without a grant, each way: the key held by another until the
/// wait bound runs out, a final refusal, and a grant too short to hold (released).
#[track_caller]
fn failed_acquires(lease: &mut Lease, gate: &WriteGate, t: Instant) {
    let holder = Holder {
        identity: Identity::new("host-7:4711").unwrap(),
        fence: Fence(1),
        remaining: ms(300),
    };
    let attempts = [
        AcquireOutcome::HeldByAnother(holder),
        AcquireOutcome::Refused(Refusal::Unauthorized),
        AcquireOutcome::Granted {
            fence: Fence(1),
            ttl: ms(1),
        },
    ];
    for outcome in attempts {
        // `give_up_at == now`: one attempt only.
        lease.acquire_until(t, t, gate).unwrap();
        let id = sent(lease).id();
        let _ = lease.handle_response(t + ms(5), id, outcome.into(), gate);
        while lease.poll_action().is_some() {}
        assert!(matches!(
            event(lease),
            Event::AcquireFailed { retry_at: None, .. }
        ));
        assert!(matches!(lease.state(), State::NotAcquired(_)));
        assert!(gate.check(t + ms(6)).is_err());
    }
}

/// Renews at the lease's own timer, the answer arriving 5 ms later; the renew time.
#[track_caller]
fn renew(lease: &mut Lease, gate: &WriteGate, outcome: RenewOutcome) -> Instant {
    let t = lease.poll_timeout().unwrap();
    lease.handle_timeout(t, gate);
    let id = sent(lease).id();
    lease
        .handle_response(t + ms(5), id, outcome.into(), gate)
        .applied();
    t
}

/// One life of a lease: every kind of term, `terms` times over.
fn lifetime(config: Config, terms: u64) {
    let gate = WriteGate::new();
    let owner = Owner([7; 16]);
    let mut lease = Lease::new(config, owner);
    let mut storage = FenceGate::new();
    let mut t = Instant::ZERO;
    let renewed = RenewOutcome::Renewed { ttl: config.ttl() };
    for n in 0..terms {
        let fence = Fence(n + 1);
        failed_acquires(&mut lease, &gate, t);
        acquire(&mut lease, &gate, t, fence);
        // Drivers render the owner token for text protocols: no allocation either.
        assert!(owner.token(lease.term()).encode().as_bytes().len() > 32);

        // A few confirmed renewals, a write after each.
        for _ in 0..5 {
            let at = renew(&mut lease, &gate, renewed);
            assert!(matches!(event(&mut lease), Event::Renewed { .. }));
            assert_eq!(gate.check(at + ms(6)), Ok(fence));
            assert!(storage.admit(gate.check(at + ms(6)).unwrap()).is_ok());
        }
        // A blip: the renewal times out, is retried inside the budget, succeeds.
        let at = lease.poll_timeout().unwrap();
        lease.handle_timeout(at, &gate);
        let lost_id = sent(&mut lease).id();
        let timeout = lease.poll_timeout().unwrap();
        lease.handle_timeout(timeout, &gate);
        assert!(matches!(event(&mut lease), Event::RenewFailed { .. }));
        let late = RenewOutcome::Renewed { ttl: config.ttl() };
        assert_eq!(
            lease.handle_response(timeout, lost_id, late.into(), &gate),
            Handled::Stale
        );
        renew(&mut lease, &gate, renewed);
        assert!(matches!(event(&mut lease), Event::Renewed { .. }));
        // An indeterminate answer, then a stale duplicate, then another success.
        let why = RenewOutcome::Indeterminate(Indeterminate::Service);
        renew(&mut lease, &gate, why);
        assert!(matches!(event(&mut lease), Event::RenewFailed { .. }));
        let stale = lease.handle_response(t, RequestId(0), renewed.into(), &gate);
        assert_eq!(stale, Handled::Stale);
        renew(&mut lease, &gate, renewed);
        assert!(matches!(event(&mut lease), Event::Renewed { .. }));

        // End the term, each way in turn.
        match n % 5 {
            0 => {
                lease.release(lease.latest_instant(), &gate).unwrap();
                let id = sent(&mut lease).id();
                let done = ReleaseOutcome::Released;
                lease
                    .handle_response(lease.latest_instant() + ms(5), id, done.into(), &gate)
                    .applied();
                assert_eq!(event(&mut lease), Event::Released);
            }
            1 => {
                renew(&mut lease, &gate, RenewOutcome::NotOwner);
                let lost = event(&mut lease);
                assert!(
                    matches!(
                        lost,
                        Event::Lost {
                            reason: LossReason::NotOwner,
                            ..
                        }
                    ),
                    "{lost:?}"
                );
            }
            2 => {
                // No answer ever again: the deadline passes.
                while matches!(lease.state(), State::Holding | State::RenewPending) {
                    let at = lease.poll_timeout().unwrap();
                    lease.handle_timeout(at, &gate);
                    while lease.poll_action().is_some() {}
                    while lease.poll_event().is_some() {}
                }
                assert_eq!(lease.state(), State::Lost(LossReason::Expired));
            }
            3 => {
                lease
                    .handle_revoked(lease.latest_instant(), fence, &gate)
                    .applied();
                let lost = event(&mut lease);
                assert!(
                    matches!(
                        lost,
                        Event::Lost {
                            reason: LossReason::Revoked,
                            ..
                        }
                    ),
                    "{lost:?}"
                );
            }
            _ => {
                // Granted, but ending before the lease it replaces.
                let half = config.ttl().checked_div(2).unwrap();
                renew(&mut lease, &gate, RenewOutcome::Renewed { ttl: half });
                let lost = event(&mut lease);
                assert!(
                    matches!(
                        lost,
                        Event::Lost {
                            reason: LossReason::Shortened,
                            ..
                        }
                    ),
                    "{lost:?}"
                );
            }
        }
        while lease.poll_action().is_some() {}
        assert!(gate.check(lease.latest_instant()).is_err());
        assert!(
            storage.admit(Fence(n)).is_err(),
            "an older fence is refused"
        );
        t = lease.latest_instant() + config.ttl();
    }
    assert!(lease.stats().stale_responses >= terms as u32 * 2);
}

#[test]
fn the_counter_is_installed_and_counts_this_thread() {
    // Without this, a zero below could mean "not measured".
    let info = measure(|| {
        std::hint::black_box(Box::new(7u64));
    });
    assert_eq!(info.count_total, 1);
}

#[test]
fn a_full_lifetime_of_a_lease_makes_no_heap_allocation() {
    let lesson = Config::builder(ms(600));
    for config in [
        lesson.build().unwrap(),
        lesson.fail_closed(true).build().unwrap(),
        Config::builder(ms(3_000))
            .drift_ppm(20_000)
            .build()
            .unwrap(),
    ] {
        let info = measure(|| lifetime(config, 100));
        assert_eq!(info.count_total, 0, "{config:?}: {info:?}");
        assert_eq!(info.bytes_total, 0);
    }
}
