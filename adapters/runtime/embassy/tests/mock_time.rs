//! The embassy adapter on embassy-time's mock driver: virtual time moves only when a
//! test advances it, one millisecond at a time, and the lease future is polled only
//! when something woke it (a lost wake-up hangs the test instead of being papered
//! over by polling).
//!
//! The lock service is a gateway with a hard TTL that answers after a one-way delay on
//! the same virtual clock, applies the key rules, stores the holder's identity, and can
//! be scripted to blip, refuse or stall.
//!
//! Timing of every test: TTL 3 s, so renew every 1 s, request timeout 300 ms, retry
//! 150 ms, margin 150 ms, drift 1,000 ppm (3 ms): a grant for a request sent at `s`
//! is safe until `s + 2,847 ms`.

use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use embassy_time::{MockDriver, Timer};
use leasehold_embassy::leasehold::{
    check_key, AcquireFailure, AcquireOutcome, AlreadyActive, Config, Duration, Event, Fence,
    GateError, GateStatus, Holder, HolderOutcome, Identity, Indeterminate, Instant, Lease,
    LossReason, Owner, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, Term,
};
use leasehold_embassy::{LeaseShared, LocalLockService, Report, Target, TermEnd};

/// One term that waits for the key as long as it takes, as the firmware does.
async fn run_term<L: Borrow<Config>, F: FnMut(Report)>(
    lease: &mut Lease<L>,
    shared: &LeaseShared,
    target: Target<'_, Gateway<'_>>,
    on_report: F,
) -> Result<TermEnd, AlreadyActive> {
    leasehold_embassy::run_term(lease, shared, target, Instant::MAX, on_report).await
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn config() -> Config {
    Config::builder(ms(3_000)).build().unwrap()
}

/// The mock driver is one global clock: tests take turns, each from time zero.
fn virtual_clock() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    MockDriver::get().reset();
    guard
}

fn now() -> Instant {
    leasehold_embassy::now()
}

struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `future` once, then advances virtual time 1 ms at a time up to `until`,
/// re-polling only when it was woken. `each` runs at every instant twice: right after
/// the tick, before the woken future runs (an interrupt handler that preempts the
/// executor), and after it ran (another task). Returns the output and when it came.
#[track_caller]
fn drive<F: Future>(
    future: F,
    until: Instant,
    mut each: impl FnMut(Instant),
) -> Option<(Instant, F::Output)> {
    let woken = Arc::new(Woken(AtomicBool::new(true)));
    let waker = Waker::from(woken.clone());
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        each(now());
        let mut polls = 0;
        while woken.0.swap(false, Ordering::SeqCst) {
            polls += 1;
            assert!(
                polls < 100,
                "the loop spins without time passing at {}",
                now()
            );
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                each(now());
                return Some((now(), output));
            }
        }
        each(now());
        if now() >= until {
            return None;
        }
        MockDriver::get().advance(embassy_time::Duration::from_millis(1));
    }
}

/// How the gateway answers one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    /// Handle it after the one-way delay and answer after another.
    Normal,
    /// The link drops the request: "transport failure" after the one-way delay.
    Blip,
    /// The key was taken over: "not owner" after the one-way delay.
    NotOwner,
    /// Never answer (the link went silent).
    Stall,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Acquire,
    Renew,
    Release,
}

/// A request as the gateway saw it: when it was sent, and what the write gate said at
/// that moment.
#[derive(Clone, Copy, Debug)]
struct Sent {
    kind: Kind,
    at: Instant,
    gate: Option<GateStatus>,
}

/// A lock service with a hard TTL, on the same virtual clock.
struct Gateway<'a> {
    gate: &'a LeaseShared,
    one_way: embassy_time::Duration,
    /// Replies for the coming renewals, in order; `Normal` once empty.
    renew_script: RefCell<VecDeque<Reply>>,
    release_reply: Cell<Reply>,
    holder: Cell<Option<(OwnerToken, Identity)>>,
    /// When the service's own TTL runs out.
    expires: Cell<Instant>,
    fence: Cell<u64>,
    sent: RefCell<Vec<Sent>>,
}

impl<'a> Gateway<'a> {
    fn new(gate: &'a LeaseShared) -> Self {
        Gateway {
            gate,
            one_way: embassy_time::Duration::from_millis(10),
            renew_script: RefCell::default(),
            release_reply: Cell::new(Reply::Normal),
            holder: Cell::new(None),
            expires: Cell::new(Instant::ZERO),
            fence: Cell::new(0),
            sent: RefCell::default(),
        }
    }

    fn script_renewals(&self, replies: &[Reply]) -> &Self {
        self.renew_script.borrow_mut().extend(replies);
        self
    }

    fn record(&self, kind: Kind) {
        let gate = self.gate.gate().snapshot().map(|s| s.status);
        self.sent.borrow_mut().push(Sent {
            kind,
            at: now(),
            gate,
        });
    }

    fn sent(&self, kind: Kind) -> Vec<Instant> {
        let sent = self.sent.borrow();
        sent.iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.at)
            .collect()
    }

    fn holds(&self, token: OwnerToken) -> bool {
        self.current().is_some_and(|(holder, _)| holder == token)
    }

    /// The holder, unless its TTL ran out.
    fn current(&self) -> Option<(OwnerToken, Identity)> {
        self.holder.get().filter(|_| now() < self.expires.get())
    }

    /// Another client holds the key as `identity` until `until`.
    fn held_by(&self, identity: &str, until: Instant) {
        let other = Owner([9; 16]).token(Term(1));
        self.holder
            .set(Some((other, Identity::new(identity).unwrap())));
        self.expires.set(until);
        self.fence.set(self.fence.get() + 1);
    }

    fn holder_now(&self, identity: Identity) -> Holder {
        Holder {
            identity,
            fence: Fence(self.fence.get()),
            remaining: self.expires.get().saturating_duration_since(now()),
        }
    }

    async fn reply<T>(&self, reply: Reply, handle: impl FnOnce() -> T, refused: T) -> T {
        match reply {
            Reply::Stall => core::future::pending().await,
            Reply::Blip => {
                Timer::after(self.one_way).await;
                refused
            }
            Reply::NotOwner => {
                Timer::after(self.one_way).await;
                self.holder.set(None);
                refused
            }
            Reply::Normal => {
                Timer::after(self.one_way).await;
                let answer = handle();
                Timer::after(self.one_way).await;
                answer
            }
        }
    }
}

impl LocalLockService for Gateway<'_> {
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        self.record(Kind::Acquire);
        let grant = || {
            if check_key(key).is_err() {
                return AcquireOutcome::Refused(Refusal::InvalidKey);
            }
            if let Some((_, held_by)) = self.current() {
                return AcquireOutcome::HeldByAnother(self.holder_now(held_by));
            }
            self.holder.set(Some((token, *identity)));
            self.expires.set(now() + ttl);
            self.fence.set(self.fence.get() + 1);
            AcquireOutcome::Granted {
                fence: Fence(self.fence.get()),
                ttl,
            }
        };
        let unknown = AcquireOutcome::Indeterminate(Indeterminate::Transport);
        self.reply(Reply::Normal, grant, unknown).await
    }

    async fn renew(
        &self,
        _key: &str,
        token: OwnerToken,
        _fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        self.record(Kind::Renew);
        let reply = self
            .renew_script
            .borrow_mut()
            .pop_front()
            .unwrap_or(Reply::Normal);
        let refused = match reply {
            Reply::Blip => RenewOutcome::Indeterminate(Indeterminate::Transport),
            _ => RenewOutcome::NotOwner,
        };
        let extend = || {
            if !self.holds(token) {
                return RenewOutcome::NotOwner;
            }
            self.expires.set(now() + ttl);
            RenewOutcome::Renewed { ttl }
        };
        self.reply(reply, extend, refused).await
    }

    async fn release(&self, _key: &str, token: OwnerToken) -> ReleaseOutcome {
        self.record(Kind::Release);
        let delete = || {
            if !self.holds(token) {
                return ReleaseOutcome::NotOwner;
            }
            self.holder.set(None);
            ReleaseOutcome::Released
        };
        self.reply(self.release_reply.get(), delete, ReleaseOutcome::NotOwner)
            .await
    }

    async fn holder(&self, _key: &str) -> HolderOutcome {
        match self.current() {
            Some((_, identity)) => HolderOutcome::Held(self.holder_now(identity)),
            None => HolderOutcome::Free,
        }
    }
}

static IDENTITY: std::sync::LazyLock<Identity> =
    std::sync::LazyLock::new(|| Identity::new("pump-controller-1").unwrap());

fn target<'a, 'g>(gateway: &'a Gateway<'g>) -> Target<'a, Gateway<'g>> {
    Target {
        service: gateway,
        key: "pump-7",
        owner: Owner([7; 16]),
        identity: &IDENTITY,
    }
}

/// Millisecond readings of a list of instants, for readable assertions.
fn millis(instants: &[Instant]) -> Vec<u64> {
    instants.iter().map(|i| i.as_millis()).collect()
}

#[test]
fn renews_every_third_of_the_ttl_counted_from_send_time() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let mut refused = Vec::new();

    let end = drive(
        run_term(&mut lease, &shared, target(&gateway), |_| {}),
        at(9_500),
        |t| {
            // Granted at 20 ms (10 ms each way); after that every write passes.
            if t > at(20) && shared.check().is_err() {
                refused.push(t);
            }
        },
    );

    assert!(end.is_none(), "the term must still be running: {end:?}");
    assert_eq!(millis(&gateway.sent(Kind::Acquire)), [0]);
    assert_eq!(
        millis(&gateway.sent(Kind::Renew)),
        [1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000, 8_000, 9_000]
    );
    assert!(refused.is_empty(), "writes refused at {refused:?}");
    assert_eq!(shared.check(), Ok(Fence(1)));
}

/// Leases may share one `static` config, each keeping a reference (40 bytes less RAM
/// per lease on a 32-bit target): the term runs the same.
#[test]
fn a_lease_that_borrows_a_static_config_renews_the_same() {
    static CONFIG: Config = match Config::builder(ms(3_000)).build() {
        Ok(config) => config,
        Err(_) => panic!("invalid config"),
    };
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    let mut lease = Lease::new(&CONFIG, Owner([7; 16]));

    let end = drive(
        run_term(&mut lease, &shared, target(&gateway), |_| {}),
        at(3_500),
        |_| {},
    );

    assert!(end.is_none(), "the term must still be running: {end:?}");
    assert_eq!(millis(&gateway.sent(Kind::Acquire)), [0]);
    assert_eq!(millis(&gateway.sent(Kind::Renew)), [1_000, 2_000, 3_000]);
    assert_eq!(shared.check(), Ok(Fence(1)));
}

#[test]
fn a_blip_is_retried_inside_the_budget_and_is_not_a_loss() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    gateway.script_renewals(&[Reply::Normal, Reply::Blip]);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let mut events = Vec::new();
    let mut refused = Vec::new();

    let end = drive(
        run_term(&mut lease, &shared, target(&gateway), |report| {
            if let Report::Event(e) = report {
                events.push((now(), e));
            }
        }),
        at(5_000),
        |t| {
            if t > at(20) && shared.check().is_err() {
                refused.push(t);
            }
        },
    );

    assert!(end.is_none(), "a blip ended the term: {end:?}");
    // The renewal sent at 2,000 ms fails at 2,010 ms; retried 150 ms later; the cadence
    // then follows the retry's send time.
    assert_eq!(
        millis(&gateway.sent(Kind::Renew)),
        [1_000, 2_000, 2_160, 3_160, 4_160]
    );
    assert!(events.iter().any(|(t, e)| *t == at(2_010)
        && matches!(
            e,
            Event::RenewFailed {
                reason: Indeterminate::Transport,
                ..
            }
        )));
    assert!(refused.is_empty(), "writes refused at {refused:?}");
    assert_eq!(shared.take_lost(), None, "a blip raised the lost signal");
}

#[test]
fn a_stalled_link_closes_the_gate_before_the_service_expires_the_lease() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    // The first renewal works (handled at 1,010 ms: the service expires the lease at
    // 4,010 ms); then the link goes silent, the release after the loss included.
    gateway.script_renewals(&[Reply::Normal, Reply::Stall, Reply::Stall, Reply::Stall]);
    gateway.script_renewals(&[Reply::Stall, Reply::Stall, Reply::Stall]);
    gateway.release_reply.set(Reply::Stall);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let mut first_refusal = None;
    let mut lost_signal = None;
    let lost_event = Cell::new(None);

    let lease_task = run_term(&mut lease, &shared, target(&gateway), |report| {
        if let Report::Event(Event::Lost { .. }) = report {
            lost_event.set(Some(now()));
        }
    });
    // A worker task that waits for the loss notification.
    let worker = async {
        let reason = shared.wait_lost().await;
        lost_signal = Some((now(), reason));
    };
    let end = drive(futures::future::join(lease_task, worker), at(12_000), |t| {
        if t > at(20) && first_refusal.is_none() {
            first_refusal = shared.check().err().map(|e| (t, e));
        }
    });

    let service_expiry = gateway.expires.get();
    assert_eq!(service_expiry, at(4_010));
    // The safe deadline of the renewal sent at 1,000 ms: 1,000 + 2,847.
    let deadline = at(3_847);
    assert_eq!(
        first_refusal,
        Some((deadline, GateError::DeadlinePassed { deadline }))
    );
    assert_eq!(lost_signal, Some((deadline, LossReason::Expired)));
    assert!(deadline < service_expiry);
    // The best-effort release went out after the gate closed and got no answer: it
    // never held the gate open. It was retried, for up to twice the TTL (6 s) after
    // its first send, and the term's loop ended when the retries did.
    assert_eq!(lost_event.get(), Some(deadline));
    let releases: Vec<_> = gateway
        .sent
        .borrow()
        .iter()
        .filter(|s| s.kind == Kind::Release)
        .copied()
        .collect();
    assert_eq!(releases[0].at, deadline);
    assert!(releases.len() > 1, "{releases:?}");
    assert!(releases
        .iter()
        .all(|r| r.gate == Some(GateStatus::Lost(LossReason::Expired))));
    let (ended, (end, ())) = end.expect("the term ends");
    assert_eq!(end, Ok(TermEnd::Lost(LossReason::Expired)));
    assert!(ended > releases[releases.len() - 1].at && ended <= at(3_847 + 6_300));
}

#[test]
fn not_owner_is_a_loss_at_once_not_at_the_deadline() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    gateway.script_renewals(&[Reply::Normal, Reply::NotOwner]);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let mut first_refusal = None;
    let mut lost_signal = None;

    let end = drive(
        run_term(&mut lease, &shared, target(&gateway), |_| {}),
        at(6_000),
        |t| {
            if t > at(20) && first_refusal.is_none() {
                first_refusal = shared.check().err().map(|e| (t, e));
            }
            if lost_signal.is_none() {
                lost_signal = shared.take_lost().map(|reason| (t, reason));
            }
        },
    );

    // The renewal sent at 2,000 ms is refused at 2,010 ms; the deadline was 3,847 ms.
    let refused_at = at(2_010);
    let (ended, end) = end.expect("the term ends");
    assert_eq!(end, Ok(TermEnd::Lost(LossReason::NotOwner)));
    assert_eq!(ended, refused_at);
    assert_eq!(
        first_refusal,
        Some((refused_at, GateError::Lost(LossReason::NotOwner)))
    );
    assert_eq!(lost_signal, Some((refused_at, LossReason::NotOwner)));
    assert!(
        gateway.sent(Kind::Release).is_empty(),
        "nothing to release: the key is someone else's"
    );
}

#[test]
fn a_release_closes_the_gate_before_the_request_goes_out_and_never_waits_for_it() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    // The gateway never answers the release: the term still ends, one request
    // timeout (300 ms) after the release was asked for.
    gateway.release_reply.set(Reply::Stall);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let mut first_refusal = None;
    let released = Cell::new(None);

    let lease_task = run_term(&mut lease, &shared, target(&gateway), |report| {
        if let Report::Event(Event::Released) = report {
            released.set(Some(now()));
        }
    });
    let user = async {
        Timer::at(embassy_time::Instant::from_millis(1_500)).await;
        shared.request_release();
    };
    let end = drive(futures::future::join(lease_task, user), at(12_000), |t| {
        if t > at(20) && first_refusal.is_none() {
            first_refusal = shared.check().err().map(|e| (t, e));
        }
    });

    // Asked at 1,500 ms: the gate is closed at that same instant, before the release
    // request went out.
    let asked = at(1_500);
    assert_eq!(first_refusal, Some((asked, GateError::Released)));
    let release = gateway
        .sent
        .borrow()
        .iter()
        .find(|s| s.kind == Kind::Release)
        .copied();
    let release = release.expect("a release request");
    assert_eq!(release.at, asked);
    assert_eq!(release.gate, Some(GateStatus::Released));
    // The term ended one request timeout later; the unanswered release went on, for
    // up to twice the TTL, and the loop ended with it.
    assert_eq!(released.get(), Some(at(1_500 + 300)));
    assert!(gateway.sent(Kind::Release).len() > 1);
    let (ended, (end, ())) = end.expect("the term ends");
    assert_eq!(end, Ok(TermEnd::Released));
    assert!(ended > at(1_800) && ended <= at(1_500 + 6_300));
    assert_eq!(shared.take_lost(), None);
}

/// A lease that released a held key lets `Config::release_backoff` (two retry
/// intervals, 300 ms) pass before its next term contends, so a contender that waits
/// for the key (retrying at most 225 ms apart) takes its turn first. A term after a
/// loss or a first term contends at once.
#[test]
fn the_next_term_after_a_release_yields_a_turn() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    let mut lease = Lease::new(config(), Owner([7; 16]));

    let first = async {
        let end = run_term(&mut lease, &shared, target(&gateway), |_| {}).await;
        let second = run_term(&mut lease, &shared, target(&gateway), |_| {}).await;
        (end, second)
    };
    let user = async {
        Timer::at(embassy_time::Instant::from_millis(1_500)).await;
        shared.request_release();
    };
    let ran = drive(futures::future::join(first, user), at(3_000), |_| {});

    assert!(ran.is_none(), "the second term holds the key until the end");
    let acquires = millis(&gateway.sent(Kind::Acquire));
    let release_backoff = config().release_backoff().as_millis();
    assert_eq!(release_backoff, 300);
    // The release went out at 1,500 ms (answered at 1,520 ms, when the first term
    // ended); the second term's first attempt waited 300 ms after its send.
    assert_eq!(acquires, [0, 1_500 + 300]);
    assert_eq!(shared.check(), Ok(Fence(2)));
}

#[test]
fn an_acquire_gives_up_at_its_bound_and_names_the_holder() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    gateway.held_by("other-controller", at(60_000));
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let mut holders = Vec::new();
    let mut opened = false;

    let give_up_at = at(1_000);
    let term = leasehold_embassy::run_term(
        &mut lease,
        &shared,
        target(&gateway),
        give_up_at,
        |report| {
            if let Report::HeldBy(holder) = report {
                holders.push(holder);
            }
        },
    );
    let end = drive(term, at(5_000), |_| opened |= shared.check().is_ok());

    let (ended, end) = end.expect("the acquire ends at its bound");
    assert_eq!(end, Ok(TermEnd::NotAcquired(AcquireFailure::HeldByAnother)));
    // Every attempt was answered: the acquire ends with the last answer (no retry is
    // sent at or after the bound; the one in flight there is awaited, for at most the
    // request timeout), and nothing needs releasing.
    let request_timeout = config().request_timeout();
    assert!(ended <= give_up_at + request_timeout, "ended at {ended}");
    assert!(gateway.sent(Kind::Release).is_empty());
    let attempts = gateway.sent(Kind::Acquire);
    assert!(attempts.len() >= 2, "retried: {attempts:?}");
    assert!(attempts.iter().all(|&sent| sent < give_up_at));
    assert_eq!(holders.len(), attempts.len());
    assert!(holders
        .iter()
        .all(|h| h.identity.as_str() == "other-controller" && h.fence == Fence(1)));
    assert!(!opened, "the gate opened for a key held by another");
    assert_eq!(shared.take_lost(), None);
}

#[test]
fn a_refused_acquire_ends_at_once_whatever_the_bound() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let target = Target {
        key: "pump{7}",
        ..target(&gateway)
    };

    let end = drive(
        run_term(&mut lease, &shared, target, |_| {}),
        at(5_000),
        |_| {
            assert!(shared.check().is_err());
        },
    );

    let (ended, end) = end.expect("a final refusal ends the acquire");
    assert_eq!(
        end,
        Ok(TermEnd::NotAcquired(AcquireFailure::Refused(
            Refusal::InvalidKey
        )))
    );
    assert_eq!(ended, at(20), "ended with the answer, not retried");
    assert_eq!(millis(&gateway.sent(Kind::Acquire)), [0]);
    assert!(gateway.sent(Kind::Release).is_empty());
}

#[test]
fn the_holder_query_names_who_holds_the_key() {
    let _clock = virtual_clock();
    let shared = LeaseShared::new();
    let gateway = Gateway::new(&shared);
    let mut lease = Lease::new(config(), Owner([7; 16]));

    let term = run_term(&mut lease, &shared, target(&gateway), |_| {});
    let end = drive(term, at(100), |_| {});
    assert!(end.is_none(), "the term must still be running");

    let query = drive(gateway.holder("pump-7"), at(101), |_| {});
    let Some((_, HolderOutcome::Held(holder))) = query else {
        panic!("held: {query:?}")
    };
    assert_eq!(holder.identity.as_str(), "pump-controller-1");
    assert_eq!(holder.fence, Fence(1));
}
