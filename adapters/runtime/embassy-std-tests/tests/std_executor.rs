//! The embassy adapter on a real embassy executor (the std platform) and embassy-time's
//! std driver, in real time: TTL 600 ms, so each test is over in about a second.
//!
//! Real time jitters (a loaded machine answers late, and a late answer is retried), so
//! these tests assert only what holds however late a thread is scheduled: the gate
//! never admits a write at or after the service's expiry, signals cross threads, and
//! the term ends the way the scenario says. The exact timings (renew at T/3, when the
//! gate closes) are the mock-driver tests' job (`adapters/runtime/embassy/tests/mock_time.rs`). Nothing
//! here waits for a fixed time to let something happen: threads wait for each other.
//!
//! Another OS thread reads the gate the whole time, as an interrupt handler or a
//! worker on another core would.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration as StdDuration;

use embassy_executor::{Executor, Spawner};
use embassy_time::Timer;
use leasehold_embassy::leasehold::{
    AcquireOutcome, AlreadyActive, Config, Duration, Event, Fence, GateError, GateStatus,
    HolderOutcome, Identity, Instant, Lease, LossReason, Owner, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_embassy::{LeaseShared, LocalLockService, Report as LeaseReport, Target, TermEnd};

/// One term that waits for the key as long as it takes.
async fn run_term(
    lease: &mut Lease,
    shared: &LeaseShared,
    target: Target<'_, Gateway>,
    on_report: impl FnMut(LeaseReport),
) -> Result<TermEnd, AlreadyActive> {
    leasehold_embassy::run_term(lease, shared, target, Instant::MAX, on_report).await
}

/// TTL 600 ms: renew every 200 ms, request timeout 60 ms, retry 30 ms, margin 30 ms.
fn config() -> Config {
    Config::builder(Duration::from_millis(600)).build().unwrap()
}

/// The longest a scenario may take before the test gives up on it.
const LIMIT: StdDuration = StdDuration::from_secs(2);

/// A lock service with a hard TTL that answers after 2 ms each way, or goes silent for
/// good after `answer_renewals` renewals.
struct Gateway {
    shared: &'static LeaseShared,
    answer_renewals: usize,
    holder: Cell<Option<OwnerToken>>,
    expires: Cell<Instant>,
    renewals_sent: RefCell<Vec<Instant>>,
    /// The gate's status when the release request reached the gateway.
    gate_at_release: Cell<Option<GateStatus>>,
}

impl Gateway {
    fn new(shared: &'static LeaseShared, answer_renewals: usize) -> Self {
        Gateway {
            shared,
            answer_renewals,
            holder: Cell::new(None),
            expires: Cell::new(Instant::ZERO),
            renewals_sent: RefCell::default(),
            gate_at_release: Cell::new(None),
        }
    }

    async fn one_way(&self) {
        Timer::after_millis(2).await;
    }

    fn holds(&self, token: OwnerToken) -> bool {
        self.holder.get() == Some(token) && leasehold_embassy::now() < self.expires.get()
    }
}

impl LocalLockService for Gateway {
    async fn acquire(
        &self,
        _key: &str,
        token: OwnerToken,
        _identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        self.one_way().await;
        self.holder.set(Some(token));
        self.expires.set(leasehold_embassy::now() + ttl);
        self.one_way().await;
        AcquireOutcome::Granted {
            fence: Fence(1),
            ttl,
        }
    }

    async fn renew(
        &self,
        _key: &str,
        token: OwnerToken,
        _fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        let sent = leasehold_embassy::now();
        let n = {
            let mut renewals = self.renewals_sent.borrow_mut();
            renewals.push(sent);
            renewals.len()
        };
        if n > self.answer_renewals {
            return core::future::pending().await;
        }
        self.one_way().await;
        if !self.holds(token) {
            return RenewOutcome::NotOwner;
        }
        self.expires.set(leasehold_embassy::now() + ttl);
        self.one_way().await;
        RenewOutcome::Renewed { ttl }
    }

    async fn release(&self, _key: &str, token: OwnerToken) -> ReleaseOutcome {
        let gate = self.shared.gate().snapshot().map(|s| s.status);
        self.gate_at_release.set(gate);
        self.one_way().await;
        if self.holds(token) {
            self.holder.set(None);
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwner
        }
    }

    async fn holder(&self, _key: &str) -> HolderOutcome {
        // The driver never asks; these scenarios never query it.
        HolderOutcome::Free
    }
}

/// What a scenario saw, sent back to the test thread.
#[derive(Debug)]
struct Report {
    end: Result<TermEnd, AlreadyActive>,
    ended_at: Instant,
    renewals_sent: Vec<Instant>,
    service_expiry: Instant,
    gate_at_release: Option<GateStatus>,
    lost_signal: Option<LossReason>,
    key_still_held: bool,
}

/// What the reader saw: every instant a write passed, and the first refusal after one.
type Seen = (Vec<Instant>, Option<(Instant, GateError)>);

/// Reads the gate from another OS thread every 200 µs until `stop`, and once more
/// after it, recording every instant it admitted a write and the first refusal after
/// a pass.
struct Reader {
    stop: &'static AtomicBool,
    handle: thread::JoinHandle<Seen>,
}

impl Reader {
    fn start(shared: &'static LeaseShared, stop: &'static AtomicBool) -> Reader {
        let handle = thread::spawn(move || {
            let (mut passed, mut refused) = (Vec::new(), None);
            loop {
                // One more read after `stop`, so the state the scenario ended in is seen.
                let stopping = stop.load(Ordering::SeqCst);
                let now = leasehold_embassy::now();
                match shared.check() {
                    Ok(_) => {
                        assert!(refused.is_none(), "a write passed after the gate closed");
                        passed.push(now);
                    }
                    Err(e) if !passed.is_empty() && refused.is_none() => {
                        refused = Some((now, e));
                    }
                    Err(_) => {}
                }
                if stopping {
                    break;
                }
                thread::sleep(StdDuration::from_micros(200));
            }
            (passed, refused)
        });
        Reader { stop, handle }
    }

    fn finish(self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().expect("reader thread")
    }
}

/// Runs `spawn` on a fresh std executor in its own thread until the scenario reports.
fn run_scenario(spawn: impl FnOnce(Spawner, mpsc::Sender<Report>) + Send + 'static) -> Report {
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        let executor: &'static mut Executor = Box::leak(Box::new(Executor::new()));
        executor.run_until(
            move |spawner| spawn(spawner, tx),
            move || done_rx.try_recv().is_ok(),
        );
    });
    let report = rx
        .recv_timeout(LIMIT)
        .expect("the scenario finishes within 2 s");
    let _ = done_tx.send(());
    report
}

fn target(gateway: &Gateway) -> Target<'_, Gateway> {
    Target {
        service: gateway,
        key: "pump-7",
        owner: Owner([7; 16]),
        identity: &Identity::EMPTY,
    }
}

static STALL: LeaseShared = LeaseShared::new();

#[embassy_executor::task]
async fn stall_scenario(report: mpsc::Sender<Report>) {
    // Two renewals are answered; from the third on the link is silent.
    let gateway = Gateway::new(&STALL, 2);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let lease_task = run_term(&mut lease, &STALL, target(&gateway), |_| {});
    let (end, lost_signal) = futures::future::join(lease_task, STALL.wait_lost()).await;
    let _ = report.send(Report {
        end,
        ended_at: leasehold_embassy::now(),
        renewals_sent: gateway.renewals_sent.take(),
        service_expiry: gateway.expires.get(),
        gate_at_release: gateway.gate_at_release.get(),
        lost_signal: Some(lost_signal),
        key_still_held: gateway.holder.get().is_some(),
    });
}

#[test]
fn renews_then_a_silent_link_closes_the_gate_before_the_service_expiry() {
    static STOP: AtomicBool = AtomicBool::new(false);
    let reader = Reader::start(&STALL, &STOP);
    let report = run_scenario(|spawner, tx| spawner.spawn(stall_scenario(tx).unwrap()));
    let (passed, refused) = reader.finish();

    assert_eq!(report.end, Ok(TermEnd::Lost(LossReason::Expired)));
    assert_eq!(report.lost_signal, Some(LossReason::Expired));
    let sent = &report.renewals_sent;
    assert!(
        sent.len() >= 3,
        "two renewals answered, a third sent: {sent:?}"
    );
    // The other thread saw writes pass, then refused — and never admitted one at or
    // after the moment the service expired the lease.
    assert!(!passed.is_empty(), "the reader never saw the lease held");
    let last_pass = *passed.last().unwrap();
    assert!(
        last_pass < report.service_expiry,
        "a write passed at {last_pass}, the service expired the lease at {}",
        report.service_expiry
    );
    let (refused_at, why) = refused.expect("the reader saw the gate close");
    assert!(matches!(
        why,
        GateError::DeadlinePassed { .. } | GateError::Lost(LossReason::Expired)
    ));
    assert!(refused_at >= last_pass);
    // The best-effort release went out with the gate already closed.
    assert_eq!(
        report.gate_at_release,
        Some(GateStatus::Lost(LossReason::Expired))
    );
}

static RELEASE: LeaseShared = LeaseShared::new();

#[embassy_executor::task]
async fn release_scenario(report: mpsc::Sender<Report>, renewed: mpsc::Sender<()>) {
    let gateway = Gateway::new(&RELEASE, usize::MAX);
    let mut lease = Lease::new(config(), Owner([7; 16]));
    let end = run_term(&mut lease, &RELEASE, target(&gateway), |report| {
        if matches!(report, LeaseReport::Event(Event::Renewed { .. })) {
            let _ = renewed.send(());
        }
    })
    .await;
    let _ = report.send(Report {
        end,
        ended_at: leasehold_embassy::now(),
        renewals_sent: gateway.renewals_sent.take(),
        service_expiry: gateway.expires.get(),
        gate_at_release: gateway.gate_at_release.get(),
        lost_signal: RELEASE.take_lost(),
        key_still_held: gateway.holder.get().is_some(),
    });
}

#[test]
fn a_release_asked_from_another_thread_closes_the_gate_first_and_frees_the_key() {
    static STOP: AtomicBool = AtomicBool::new(false);
    let reader = Reader::start(&RELEASE, &STOP);
    // Another OS thread asks for the release once the lease has been renewed.
    let (renewed_tx, renewed_rx) = mpsc::channel();
    let asker = thread::spawn(move || {
        renewed_rx.recv().expect("a renewal");
        let asked = leasehold_embassy::now();
        RELEASE.request_release();
        asked
    });
    let report = run_scenario(move |spawner, tx| {
        spawner.spawn(release_scenario(tx, renewed_tx).unwrap());
    });
    let asked = asker.join().expect("asker thread");
    let (passed, refused) = reader.finish();

    assert_eq!(report.end, Ok(TermEnd::Released));
    assert_eq!(report.lost_signal, None);
    assert!(
        !report.renewals_sent.is_empty(),
        "renewed before the release"
    );
    assert_eq!(report.gate_at_release, Some(GateStatus::Released));
    assert!(!report.key_still_held, "the release freed the key");
    assert!(report.ended_at >= asked);
    assert!(!passed.is_empty());
    let (_, why) = refused.expect("the reader saw the gate close");
    assert_eq!(why, GateError::Released);
}
