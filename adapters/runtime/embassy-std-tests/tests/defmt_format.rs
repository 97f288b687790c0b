//! With the `defmt` feature on (`leasehold-embassy/defmt`, which forwards to
//! `leasehold/defmt` and `leasehold-driver/defmt`), every public type of the three
//! crates formats with defmt. This is a host build, so the logger only counts the
//! bytes defmt encodes: the point is that it compiles, links and encodes something.

// defmt's logger contract is an `unsafe` trait; nothing else in this file is unsafe.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use leasehold_embassy::leasehold::{
    AcquireFailure, AcquireOutcome, Action, AlreadyActive, Budget, BudgetPart, Config,
    ConfigBuilder, ConfigError, Duration, Event, Fence, FenceGate, GateError, GateStatus, Handled,
    Holder, HolderOutcome, Identity, IdentityError, Indeterminate, Instant, KeyError, Lease,
    LossReason, NotActive, Owner, Refusal, ReleaseOutcome, RenewOutcome, RequestId, Response,
    StaleFence, State, Stats, Term, WriteGate,
};
use leasehold_embassy::{EmbassyClock, LeaseShared, Report, TermEnd};

static ENCODED: AtomicUsize = AtomicUsize::new(0);

#[defmt::global_logger]
struct CountingLogger;

// SAFETY: the logger keeps no state but an atomic counter, so it is sound to call from
// any thread, re-entrantly or not.
unsafe impl defmt::Logger for CountingLogger {
    fn acquire() {}
    unsafe fn flush() {}
    unsafe fn release() {}
    unsafe fn write(bytes: &[u8]) {
        ENCODED.fetch_add(bytes.len(), Ordering::Relaxed);
    }
}

defmt::timestamp!("{=u64:us}", 0);

/// Logs `value` with defmt and returns how many bytes that encoded.
fn encoded<T: defmt::Format>(value: T) -> usize {
    let before = ENCODED.load(Ordering::Relaxed);
    // `println!` is not filtered by `DEFMT_LOG` (which hides `info!` by default).
    defmt::println!("{}", value);
    ENCODED.load(Ordering::Relaxed) - before
}

#[test]
fn every_public_type_formats_with_defmt() {
    let config = Config::builder(Duration::from_secs(3)).build().unwrap();
    let shared: LeaseShared = LeaseShared::new();
    let snapshot = shared.gate().snapshot().unwrap();
    let token = Owner([1; 16]).token(Term(2));
    let holder = Holder {
        identity: Identity::new("host-7:4711").unwrap(),
        fence: Fence(4),
        remaining: Duration::from_millis(250),
    };
    let sizes = [
        // leasehold
        encoded(Instant::from_millis(5)),
        encoded(Duration::from_millis(5)),
        encoded(config),
        encoded::<ConfigBuilder>(Config::builder(Duration::from_secs(1))),
        encoded(ConfigError::ZeroTtl),
        encoded(Budget::default()),
        encoded(Budget::default().check(Duration::ZERO).unwrap_err()),
        encoded(BudgetPart::Margin),
        encoded(Fence(3)),
        encoded(FenceGate::new()),
        encoded(StaleFence {
            presented: Fence(1),
            newest: Fence(2),
        }),
        encoded(snapshot),
        encoded(GateStatus::Held),
        encoded(GateError::Busy),
        encoded(State::Idle),
        encoded(first_action()),
        encoded(Event::Released),
        encoded(AcquireFailure::HeldByAnother),
        encoded(Stats::default()),
        encoded(Handled::WrongKind),
        encoded(AlreadyActive { state: State::Idle }),
        encoded(NotActive { state: State::Idle }),
        encoded(RequestId(9)),
        encoded(Term(9)),
        encoded(token.owner),
        encoded(token),
        encoded(Indeterminate::Timeout),
        encoded(Refusal::InvalidKey),
        encoded(AcquireOutcome::HeldByAnother(holder)),
        encoded(RenewOutcome::NotOwner),
        encoded(ReleaseOutcome::Released),
        encoded(HolderOutcome::Held(holder)),
        encoded(Response::Renew(RenewOutcome::Refused(
            Refusal::Unauthorized,
        ))),
        encoded(LossReason::Shortened),
        encoded(holder),
        encoded(holder.identity),
        encoded(IdentityError::TooLong { len: 65 }),
        encoded(KeyError::Empty),
        // leasehold-driver
        encoded(TermEnd::Lost(LossReason::NotOwner)),
        encoded(TermEnd::NotAcquired(AcquireFailure::GrantTooShort)),
        encoded(Report::HeldBy(holder)),
        // leasehold-embassy
        encoded(&shared),
        encoded(EmbassyClock),
    ];
    let silent: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] == 0).collect();
    assert!(silent.is_empty(), "values that encoded nothing: {silent:?}");
}

/// An action as a lease hands it out (a driver never builds one).
fn first_action() -> Action {
    let gate = WriteGate::new();
    let config = Config::builder(Duration::from_secs(3)).build().unwrap();
    let mut lease = Lease::new(config, Owner([1; 16]));
    lease.acquire(Instant::ZERO, &gate).unwrap();
    lease.poll_action().unwrap()
}
