//! The firmware's gateway keeps the contract: its lock table (`leasehold-gateway`, the
//! crate the firmware links) runs every clause, on tokio's paused clock.
//!
//! The firmware cannot host tests (its own workspace, bare-metal only), and the table
//! is pure: it reads no clock and is handed the instant at which it handles each
//! request. So this wrapper hands it tokio's clock, the clock the suite sleeps on.
//! Paused time is the honest choice for a hard TTL here: the suite's sleeps move
//! exactly the instant the table compares expiries with, to the microsecond, so a
//! grant that outlives its TTL by one tick fails `the_ttl_is_hard` every run, where
//! real time would only add scheduling jitter (and seconds of waiting).
//!
//! Every one of the 23 clauses applies and runs. The gateway cannot watch, so
//! `revocation_watch` stays false: `revoked_fires_only_when_the_grant_is_gone` checks
//! only that `revoked` never completes while the grant stands (the gateway pushes
//! nothing to the device; its lease learns of a loss from its own renewals).
//!
//! What this does not cover: the link's sequence numbers (`link.rs`), which need
//! embassy channels and the firmware's executor. The wrapper stands in for the link
//! with one yield each way, so a request the abandon clause drops may be dropped
//! before the table handles it or after (its answer lost), both of which the table
//! must survive.

use std::cell::RefCell;

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Indeterminate, Instant, Owner,
    OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, Term,
};
use leasehold_conformance::breach::the_timing_clauses_catch_early_expiry;
use leasehold_conformance::{check_all, run_all, Capabilities, CLAUSES};
use leasehold_driver::LocalLockService;
use leasehold_gateway::{Answer, Gateway, KeyBytes, Op, MAX_TTL};

/// Keys held at once in the host runs: one run of the suite holds fewer than 32 at its
/// peak (clauses that wait out no TTL leave theirs to expire), two runs at once fewer
/// than 64; a table too small fails the clauses that meet it full (`Indeterminate`).
const KEYS: usize = 128;

/// The gateway's table behind a stand-in for the link, on tokio's clock.
struct GatewayService {
    table: RefCell<Gateway<KEYS>>,
    boot: tokio::time::Instant,
}

impl GatewayService {
    fn new() -> Self {
        GatewayService {
            table: RefCell::new(Gateway::new(MAX_TTL)),
            boot: tokio::time::Instant::now(),
        }
    }

    /// The link: the key travels as the firmware's frames carry it, a yield on the way
    /// up, the table handles the request at the current instant, a yield on the way
    /// down.
    async fn call(&self, key: &str, token: OwnerToken, op: Op) -> Answer {
        let key = KeyBytes::new(key);
        tokio::task::yield_now().await;
        let since_boot = self.boot.elapsed().as_micros();
        let now = Instant::from_micros(u64::try_from(since_boot).unwrap_or(u64::MAX));
        let answer = self.table.borrow_mut().handle(now, key.as_str(), token, op);
        tokio::task::yield_now().await;
        answer
    }
}

impl LocalLockService for GatewayService {
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        self.call(key, token, Op::Acquire(ttl, *identity))
            .await
            .acquire()
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        self.call(key, token, Op::Renew(fence, ttl)).await.renew()
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        self.call(key, token, Op::Release).await.release()
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        self.call(key, anyone(), Op::Holder).await.holder()
    }
}

fn anyone() -> OwnerToken {
    Owner([0; 16]).token(Term(0))
}

/// The gateway applies any TTL to the microsecond up to `MAX_TTL` (3 s), expires on
/// the clock it is handed (no lag), and cannot watch. The clauses ask for 1 s and for
/// 2 s (a renewal that shortens a grant), both within `MAX_TTL`, so both are granted
/// as asked; the 3 s ask of `grants_are_a_function_of_the_ttl_asked` meets the clamp.
fn caps() -> Capabilities {
    let mut caps = Capabilities::new(Duration::from_secs(1));
    caps.granularity = Duration::from_micros(1);
    caps.min_ttl = Duration::from_micros(1);
    caps
}

#[tokio::test(start_paused = true)]
async fn the_firmware_gateway_keeps_the_contract() {
    assert!(
        caps().ttl.saturating_mul(3) >= MAX_TTL,
        "the clamp is reached"
    );
    run_all(&GatewayService::new(), &caps()).await;
}

/// Two full runs at once on one table: keys are separate, and fences from the one
/// counter still grow per key.
#[tokio::test(start_paused = true)]
async fn concurrent_runs_on_one_gateway_do_not_interfere() {
    let service = GatewayService::new();
    let caps = caps();
    tokio::join!(run_all(&service, &caps), run_all(&service, &caps));
}

#[tokio::test(start_paused = true)]
async fn every_clause_runs_against_the_gateway() {
    assert_eq!(CLAUSES.len(), 26);
    assert!(check_all(&GatewayService::new(), &caps()).await.is_empty());
}

/// The timing clauses see a gateway that expires keys early: its grants applying 55 %
/// of the TTL they report, its renewals reporting twice what they apply (each hiding
/// it in the remaining time it tells contenders).
#[tokio::test(start_paused = true)]
async fn the_timing_clauses_catch_a_gateway_that_expires_early() {
    let service = GatewayService::new();
    the_timing_clauses_catch_early_expiry(&service, &caps(), &caps()).await;
}

// What the suite does not ask: the gateway's own limits, each a clear answer.

fn token(n: u8) -> OwnerToken {
    Owner([n; 16]).token(Term(1))
}

fn at(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

const TTL: Duration = Duration::from_secs(1);

#[test]
fn a_full_table_answers_indeterminate_until_a_grant_expires() {
    let mut table = Gateway::<2>::new(MAX_TTL);
    let me = Identity::EMPTY;
    for (n, key) in [(1, "a"), (2, "b")] {
        let answer = table.handle(at(0), key, token(n), Op::Acquire(TTL, me));
        assert!(matches!(answer.acquire(), AcquireOutcome::Granted { .. }));
    }
    // Full: the outcome is unknown to the device, and retrying later can succeed.
    let full = table.handle(at(999), "c", token(3), Op::Acquire(TTL, me));
    assert_eq!(
        full.acquire(),
        AcquireOutcome::Indeterminate(Indeterminate::Service)
    );
    assert_eq!(
        table.handle(at(999), "c", anyone(), Op::Holder).holder(),
        HolderOutcome::Free
    );
    // Held keys still work while full.
    let renewed = table.handle(at(999), "a", token(1), Op::Renew(Fence(1), TTL));
    assert_eq!(renewed.renew(), RenewOutcome::Renewed { ttl: TTL });
    // "b" expires at 1 s exactly: its slot is free for "c", with the next fence.
    let later = table.handle(at(1_000), "c", token(3), Op::Acquire(TTL, me));
    assert_eq!(
        later.acquire(),
        AcquireOutcome::Granted {
            fence: Fence(3),
            ttl: TTL
        }
    );
}

#[test]
fn ttls_it_cannot_apply_as_asked_are_refused_or_clamped() {
    let mut table = Gateway::<1>::new(MAX_TTL);
    let me = Identity::EMPTY;
    let zero = table.handle(at(0), "k", token(1), Op::Acquire(Duration::ZERO, me));
    assert_eq!(
        zero.acquire(),
        AcquireOutcome::Refused(Refusal::Unsupported)
    );
    let long = MAX_TTL.saturating_mul(10);
    let clamped = table.handle(at(0), "k", token(1), Op::Acquire(long, me));
    assert_eq!(
        clamped.acquire(),
        AcquireOutcome::Granted {
            fence: Fence(1),
            ttl: MAX_TTL
        }
    );
    // A renewal asks for its grant's TTL; more than the gateway ever grants, or
    // nothing, cannot be applied as asked (`r >= ttl`), and the grant stands.
    for ttl in [Duration::ZERO, long] {
        let renew = table.handle(at(1), "k", token(1), Op::Renew(Fence(1), ttl));
        assert_eq!(renew.renew(), RenewOutcome::Refused(Refusal::Unsupported));
    }
    let held = table.handle(at(1), "k", anyone(), Op::Holder).holder();
    assert!(matches!(held, HolderOutcome::Held(h) if h.fence == Fence(1)));
}

#[test]
fn an_answer_to_another_operation_is_a_protocol_error() {
    let released = Answer::Release(ReleaseOutcome::Released);
    let protocol = Indeterminate::Protocol;
    assert_eq!(released.acquire(), AcquireOutcome::Indeterminate(protocol));
    assert_eq!(released.renew(), RenewOutcome::Indeterminate(protocol));
    assert_eq!(released.holder(), HolderOutcome::Indeterminate(protocol));
    let free = Answer::Holder(HolderOutcome::Free);
    assert_eq!(free.release(), ReleaseOutcome::Indeterminate(protocol));
}

#[test]
fn time_never_goes_back_inside_the_table() {
    let mut table = Gateway::<1>::new(MAX_TTL);
    let granted = table.handle(at(1_000), "k", token(1), Op::Acquire(TTL, Identity::EMPTY));
    assert!(matches!(granted.acquire(), AcquireOutcome::Granted { .. }));
    // A clock read that went back is taken as the latest seen: never more than the
    // TTL left.
    let held = table.handle(at(0), "k", anyone(), Op::Holder).holder();
    assert!(matches!(held, HolderOutcome::Held(h) if h.remaining == TTL));
    let expired = table.handle(at(2_000), "k", anyone(), Op::Holder).holder();
    assert_eq!(expired, HolderOutcome::Free);
}
