#![cfg(all(loom, not(leasehold_weak_gate)))]
//! Model 3: never lost-then-held within a term.
//!
//! A reader polls `gate.snapshot()` three times while the driver ends a term and then
//! receives the answers that were still in flight (a renewal's success, a grant): the
//! real `Lease` must refuse them as stale, so once the reader has seen `Lost`/`Released`
//! for term t it never sees term t in any other status (in particular not `Held`), and
//! the term it sees never goes backwards.

use leasehold::{
    AcquireOutcome, Duration, GateStatus, Handled, RenewOutcome, RequestId, Term, WriteGate,
};
use leasehold_loom_tests::{
    at, check_bounded, Driver, Ending, Witness, DEADLINE_A, DEADLINE_B, FENCE_A, FENCE_B,
};
use loom::sync::Arc;
use loom::thread;

/// How often the reader polls.
const POLLS: usize = 3;
/// How often it polls while two publishes race (each poll multiplies loom's work).
const POLLS_TWO_PUBLISHES: usize = 2;

/// Witness bit: the reader saw a term's end and then polled that term again.
const END_THEN_SAME_TERM: usize = 0;
/// Witness bit: the reader saw `Held` and then the end of that term.
const HELD_THEN_END: usize = 1;
/// Witness bit: the reader saw a term's end and then a later term `Held`.
const END_THEN_NEXT_TERM_HELD: usize = 2;

/// The reader: polls the gate and asserts the invariant across its polls.
fn poll(gate: &WriteGate, seen: &Witness, polls: usize) {
    let mut last_term = Term(0);
    let mut held_term = None;
    let mut ended: Option<(Term, GateStatus)> = None;
    for _ in 0..polls {
        let Some(snap) = gate.snapshot() else {
            continue;
        };
        assert!(
            snap.term >= last_term,
            "term went backwards: {last_term} then {snap:?}"
        );
        last_term = snap.term;
        if let Some((term, status)) = ended {
            if snap.term == term {
                seen.saw(END_THEN_SAME_TERM);
                assert_eq!(
                    snap.status, status,
                    "lost-then-held within term {term}: {status:?} then {snap:?}"
                );
            } else if snap.status == GateStatus::Held {
                seen.saw(END_THEN_NEXT_TERM_HELD);
            }
        }
        match snap.status {
            GateStatus::Lost(_) | GateStatus::Released => {
                if held_term == Some(snap.term) {
                    seen.saw(HELD_THEN_END);
                }
                ended = Some((snap.term, snap.status));
            }
            GateStatus::Held => held_term = Some(snap.term),
            GateStatus::Closed | GateStatus::Paused => {}
        }
    }
}

/// Model: `setup` runs alone, then `driver_part` runs in the model's main thread while
/// a reader polls. Returns what the readers saw across all executions.
fn model<S, D>(name: &str, setup: S, driver_part: D) -> Witness
where
    S: Fn(&mut Driver, &WriteGate) + Sync + Send + 'static,
    D: Fn(&mut Driver, &WriteGate) + Sync + Send + 'static,
{
    model_bounded(name, usize::MAX, POLLS, setup, driver_part)
}

/// [`model`] with the preemption bound capped at `cap`, and `polls` polls.
fn model_bounded<S, D>(name: &str, cap: usize, polls: usize, setup: S, driver_part: D) -> Witness
where
    S: Fn(&mut Driver, &WriteGate) + Sync + Send + 'static,
    D: Fn(&mut Driver, &WriteGate) + Sync + Send + 'static,
{
    let seen = Witness::new();
    let witness = seen.clone();
    check_bounded(name, cap, move || {
        let gate = Arc::new(WriteGate::new());
        let mut driver = Driver::new();
        setup(&mut driver, &gate);
        let reader = {
            let (gate, seen) = (Arc::clone(&gate), witness.clone());
            thread::spawn(move || poll(&gate, &seen, polls))
        };
        driver_part(&mut driver, &gate);
        reader.join().expect("reader");
    });
    seen
}

/// A renewal or grant long enough to outlast every deadline in these models: if it
/// were (wrongly) applied it would republish `Held`.
const LATE_TTL: Duration = Duration::from_micros(0x2_0000_0000);

/// Revoked while a renewal is in flight; the renewal's success arrives afterwards.
#[test]
fn revoked_then_late_renewal_success() {
    let seen = model(
        "lost_never_held/revoked then late renewal",
        |driver, gate| driver.acquire_granted(at(0), FENCE_A, DEADLINE_A, gate),
        |driver, gate| {
            let renewal = driver.send_renewal(at(10_000), gate);
            driver.end(Ending::Revoked, at(10_001), gate);
            let late = RenewOutcome::Renewed { ttl: LATE_TTL };
            let answer = driver
                .lease
                .handle_response(at(10_002), renewal, late.into(), gate);
            assert_eq!(answer, Handled::Stale);
        },
    );
    seen.assert_seen(HELD_THEN_END, "held, then lost");
    seen.assert_seen(END_THEN_SAME_TERM, "a poll of term 1 after its loss");
}

/// Expired while a renewal is in flight; the renewal's success arrives afterwards, and
/// the timer fires again.
#[test]
fn expired_then_late_renewal_success() {
    let seen = model(
        "lost_never_held/expired then late renewal",
        |driver, gate| driver.acquire_granted(at(0), FENCE_A, DEADLINE_A, gate),
        |driver, gate| {
            let renewal = driver.send_renewal(at(10_000), gate);
            driver.end(Ending::Expired, DEADLINE_A, gate);
            let late = RenewOutcome::Renewed { ttl: LATE_TTL };
            let answer = driver
                .lease
                .handle_response(DEADLINE_A, renewal, late.into(), gate);
            assert_eq!(answer, Handled::Stale);
            driver
                .lease
                .handle_timeout(DEADLINE_A + Duration::from_secs(10), gate);
        },
    );
    seen.assert_seen(HELD_THEN_END, "held, then lost");
    seen.assert_seen(END_THEN_SAME_TERM, "a poll of term 1 after its loss");
}

/// "Not owner" answers a renewal; a duplicate of that answer claiming success follows.
#[test]
fn not_owner_then_duplicate_success() {
    let seen = model(
        "lost_never_held/not owner then duplicate",
        |driver, gate| driver.acquire_granted(at(0), FENCE_A, DEADLINE_A, gate),
        |driver, gate| {
            // `end` sends the renewal (request 2 of term 1: the acquire was 1) and
            // answers it "not owner".
            driver.end(Ending::NotOwner, at(10_000), gate);
            let duplicate = RenewOutcome::Renewed { ttl: LATE_TTL };
            let renewal = RequestId::new(Term(1), 2);
            let answer = driver
                .lease
                .handle_response(at(10_001), renewal, duplicate.into(), gate);
            assert_eq!(answer, Handled::Stale);
        },
    );
    seen.assert_seen(HELD_THEN_END, "held, then lost");
    seen.assert_seen(END_THEN_SAME_TERM, "a poll of term 1 after its loss");
}

/// Released while the acquire is in flight; the grant arrives afterwards (the term was
/// never held, and must not become held).
#[test]
fn released_while_acquiring_then_late_grant() {
    let seen = model(
        "lost_never_held/released then late grant",
        |driver, gate| {
            let _acquire = driver.acquire(at(0), gate);
        },
        |driver, gate| {
            driver.end(Ending::Released, at(1_000), gate);
            let grant = AcquireOutcome::Granted {
                fence: FENCE_A,
                ttl: LATE_TTL,
            };
            // The term's own acquire (request 1 of term 1): its late grant may hold
            // the key, so the term is released again; the gate stays closed.
            let acquire = RequestId::new(Term(1), 1);
            let answer = driver
                .lease
                .handle_response(at(1_001), acquire, grant.into(), gate);
            assert_eq!(answer, Handled::ReleaseQueued);
        },
    );
    seen.assert_seen(END_THEN_SAME_TERM, "a poll of term 1 after its release");
}

/// Lost in term 1, then term 2 acquired and granted: `Held` again is fine, but only
/// for term 2. Two racing publishes: preemption bound capped at 1 (see
/// no_torn_snapshot.rs) and two polls (three take 3·10⁵ executions).
#[test]
fn lost_then_next_term_held() {
    let seen = model_bounded(
        "lost_never_held/lost then next term",
        1,
        POLLS_TWO_PUBLISHES,
        |driver, gate| {
            driver.acquire_granted(at(0), FENCE_A, DEADLINE_A, gate);
            driver.end(Ending::Revoked, at(1_000), gate);
        },
        |driver, gate| driver.acquire_granted(at(2_000), FENCE_B, DEADLINE_B, gate),
    );
    seen.assert_seen(END_THEN_SAME_TERM, "a poll of term 1 after its loss");
    seen.assert_seen(END_THEN_NEXT_TERM_HELD, "term 2 held after term 1's loss");
}
