#![cfg(all(loom, not(leasehold_weak_gate)))]
//! Model 1: a worker that learns of the loss through any synchronisation never passes
//! `gate.check(now)` afterwards.
//!
//! The driver holds term 1 (fence A), then ends it — every way a term can end — and
//! tells the worker through one synchronisation mechanism per test. Once the worker
//! has learned of it, `check` must refuse *with the loss itself* (not `Busy`, not
//! `DeadlinePassed`): the loss was published inside the `Lease` call, before the
//! signal, so it is visible to anyone the signal reaches. Before it has learned,
//! `check` may answer from the held or the lost snapshot, or refuse with `Busy`.

use leasehold::{Config, Duration, GateError, GateStatus, Instant, State, WriteGate};
use leasehold_loom_tests::{
    assert_check_published, at, builder, check, config, published, Driver, Ending, Witness,
    DEADLINE_A, FENCE_A,
};
use loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use loom::sync::{mpsc, Arc, Mutex};
use loom::thread;

/// Witness bit: the worker had learned of the end when it checked.
const LEARNED: usize = 0;
/// Witness bit: the worker had not learned of it yet.
const NOT_YET: usize = 1;

/// Runs `model(ending, witness)` for every ending and asserts that each one exercised
/// both the "learned" and the "not yet" branch.
fn for_every_ending<M, F>(mechanism: &str, model: M)
where
    M: Fn(Ending, Witness) -> F,
    F: Fn() + Sync + Send + 'static,
{
    for ending in Ending::ALL {
        let witness = Witness::new();
        check(
            &format!("learn_of_loss/{mechanism}/{ending:?}"),
            model(ending, witness.clone()),
        );
        witness.assert_seen(LEARNED, "a worker that learned of the end");
        witness.assert_seen(NOT_YET, "a worker that had not learned of it yet");
    }
}

/// A driver holding term 1 (fence A until deadline A), granted before any worker runs.
fn held(config: Config, gate: &WriteGate) -> Driver {
    let mut driver = Driver::with_config(config);
    driver.acquire_granted(at(0), FENCE_A, DEADLINE_A, gate);
    driver
}

/// `check(now)` by a worker that has not (yet) learned that the term ended: anything
/// from before or after the end, or `Busy`.
#[track_caller]
fn check_before_learning(gate: &WriteGate, ending: Ending, now: Instant) {
    let window = [
        published(GateStatus::Held, 1, FENCE_A, DEADLINE_A),
        published(ending.status(), 1, FENCE_A, Instant::ZERO),
    ];
    assert_check_published(gate.check(now), now, &window);
}

/// `check(now)` by a worker that has learned that the term ended.
#[track_caller]
fn check_after_learning(gate: &WriteGate, ending: Ending, now: Instant) {
    assert_eq!(
        gate.check(now),
        Err(ending.error()),
        "worker passed (or misread) the gate after learning of {ending:?}"
    );
}

#[test]
fn learns_through_release_acquire_flag() {
    for_every_ending("flag", |ending, witness| {
        move || {
            let gate = Arc::new(WriteGate::new());
            let mut driver = held(config(), &gate);
            let ended = Arc::new(AtomicBool::new(false));
            let now = ending.time(DEADLINE_A);
            let worker = {
                let (gate, ended, witness) =
                    (Arc::clone(&gate), Arc::clone(&ended), witness.clone());
                thread::spawn(move || {
                    if ended.load(Ordering::Acquire) {
                        witness.saw(LEARNED);
                        check_after_learning(&gate, ending, now);
                    } else {
                        witness.saw(NOT_YET);
                        check_before_learning(&gate, ending, now);
                    }
                })
            };
            driver.end(ending, now, &gate);
            ended.store(true, Ordering::Release);
            worker.join().expect("worker");
        }
    });
}

/// The driver counts the ends it saw with a read-modify-write; the worker reads the
/// counter, then checks twice (a later `check` cannot pass either).
#[test]
fn learns_through_read_modify_write_counter() {
    for_every_ending("counter", |ending, witness| {
        move || {
            let gate = Arc::new(WriteGate::new());
            let mut driver = held(config(), &gate);
            let ends = Arc::new(AtomicUsize::new(0));
            let now = ending.time(DEADLINE_A);
            let worker = {
                let (gate, ends, witness) = (Arc::clone(&gate), Arc::clone(&ends), witness.clone());
                thread::spawn(move || {
                    if ends.load(Ordering::Acquire) > 0 {
                        witness.saw(LEARNED);
                        check_after_learning(&gate, ending, now);
                        check_after_learning(&gate, ending, now + Duration::from_secs(1));
                    } else {
                        witness.saw(NOT_YET);
                        check_before_learning(&gate, ending, now);
                    }
                })
            };
            driver.end(ending, now, &gate);
            ends.fetch_add(1, Ordering::AcqRel);
            worker.join().expect("worker");
        }
    });
}

/// A relaxed flag ordered by explicit fences: release fence before the store, acquire
/// fence after the load.
#[test]
fn learns_through_relaxed_flag_and_fences() {
    for_every_ending("fences", |ending, witness| {
        move || {
            let gate = Arc::new(WriteGate::new());
            let mut driver = held(config(), &gate);
            let ended = Arc::new(AtomicBool::new(false));
            let now = ending.time(DEADLINE_A);
            let worker = {
                let (gate, ended, witness) =
                    (Arc::clone(&gate), Arc::clone(&ended), witness.clone());
                thread::spawn(move || {
                    if ended.load(Ordering::Relaxed) {
                        fence(Ordering::Acquire);
                        witness.saw(LEARNED);
                        check_after_learning(&gate, ending, now);
                    } else {
                        witness.saw(NOT_YET);
                        check_before_learning(&gate, ending, now);
                    }
                })
            };
            driver.end(ending, now, &gate);
            fence(Ordering::Release);
            ended.store(true, Ordering::Relaxed);
            worker.join().expect("worker");
        }
    });
}

/// Control: a relaxed flag with no fences is *not* synchronisation, and loom shows
/// that a worker which sees it can still pass the gate. This is what keeps the models
/// above from being vacuous: the guarantee comes from the signal's ordering.
#[test]
#[should_panic(expected = "worker passed (or misread) the gate after learning of Revoked")]
fn a_relaxed_flag_is_not_synchronisation() {
    check("learn_of_loss/relaxed flag (must fail)/Revoked", || {
        let ending = Ending::Revoked;
        let gate = Arc::new(WriteGate::new());
        let mut driver = held(config(), &gate);
        let ended = Arc::new(AtomicBool::new(false));
        let now = ending.time(DEADLINE_A);
        let worker = {
            let (gate, ended) = (Arc::clone(&gate), Arc::clone(&ended));
            thread::spawn(move || {
                if ended.load(Ordering::Relaxed) {
                    check_after_learning(&gate, ending, now);
                }
            })
        };
        driver.end(ending, now, &gate);
        ended.store(true, Ordering::Relaxed);
        worker.join().expect("worker");
    });
}

/// The driver sends the lease's new state over a channel; the worker polls it.
#[test]
fn learns_through_a_channel() {
    for_every_ending("channel", |ending, witness| {
        move || {
            let gate = Arc::new(WriteGate::new());
            let mut driver = held(config(), &gate);
            let (tx, rx) = mpsc::channel();
            let now = ending.time(DEADLINE_A);
            let worker = {
                let (gate, witness) = (Arc::clone(&gate), witness.clone());
                thread::spawn(move || {
                    match rx.try_recv() {
                        Ok(state) => {
                            witness.saw(LEARNED);
                            assert_eq!(state, ending.state());
                            check_after_learning(&gate, ending, now);
                        }
                        Err(_) => {
                            witness.saw(NOT_YET);
                            check_before_learning(&gate, ending, now);
                        }
                    }
                    rx
                })
            };
            driver.end(ending, now, &gate);
            tx.send(driver.lease.state()).expect("receiver alive");
            // Drain what the worker did not take: loom reports unread messages as leaks.
            let rx = worker.join().expect("worker");
            let _ = rx.try_recv();
        }
    });
}

/// The lease lives in a `Mutex` that the driver and the worker share: a worker that
/// sees, under the lock, that the lease is no longer held must be refused.
#[test]
fn learns_through_the_lease_behind_a_mutex() {
    for_every_ending("mutex", |ending, witness| {
        move || {
            let gate = Arc::new(WriteGate::new());
            let driver = Arc::new(Mutex::new(held(config(), &gate)));
            let now = ending.time(DEADLINE_A);
            let worker = {
                let (gate, driver, witness) =
                    (Arc::clone(&gate), Arc::clone(&driver), witness.clone());
                thread::spawn(move || {
                    let state = driver.lock().expect("lock").lease.state();
                    if state == State::Holding {
                        witness.saw(NOT_YET);
                        check_before_learning(&gate, ending, now);
                    } else {
                        witness.saw(LEARNED);
                        assert_eq!(state, ending.state());
                        check_after_learning(&gate, ending, now);
                    }
                })
            };
            driver.lock().expect("lock").end(ending, now, &gate);
            worker.join().expect("worker");
        }
    });
}

/// The worker races the driver thread once, then learns of the end by joining it.
#[test]
fn learns_through_thread_join() {
    for_every_ending("join", |ending, witness| {
        move || {
            let gate = Arc::new(WriteGate::new());
            let mut driver = held(config(), &gate);
            let now = ending.time(DEADLINE_A);
            let driver_thread = {
                let gate = Arc::clone(&gate);
                thread::spawn(move || driver.end(ending, now, &gate))
            };
            witness.saw(NOT_YET);
            check_before_learning(&gate, ending, now);
            driver_thread.join().expect("driver");
            witness.saw(LEARNED);
            check_after_learning(&gate, ending, now);
        }
    });
}

/// Fail-closed mode: once a worker learns that a renewal timed out, writes are paused.
/// (Not a loss, but the same promise: what the driver published before the signal
/// holds for whoever the signal reaches.)
#[test]
fn learns_of_fail_closed_pause_through_flag() {
    let witness = Witness::new();
    let seen = witness.clone();
    check("learn_of_loss/flag/fail-closed pause", move || {
        let config = builder().fail_closed(true).build().expect("config");
        let gate = Arc::new(WriteGate::new());
        let mut driver = held(config, &gate);
        // The renewal goes out at 10 s and is given up at 13 s (request timeout T/10).
        let _renewal = driver.send_renewal(at(10_000), &gate);
        let paused = Arc::new(AtomicBool::new(false));
        let now = at(13_000);
        let worker = {
            let (gate, paused, witness) = (Arc::clone(&gate), Arc::clone(&paused), seen.clone());
            thread::spawn(move || {
                if paused.load(Ordering::Acquire) {
                    witness.saw(LEARNED);
                    assert_eq!(gate.check(now), Err(GateError::Paused));
                } else {
                    witness.saw(NOT_YET);
                    let window = [
                        published(GateStatus::Held, 1, FENCE_A, DEADLINE_A),
                        published(GateStatus::Paused, 1, FENCE_A, DEADLINE_A),
                    ];
                    assert_check_published(gate.check(now), now, &window);
                }
            })
        };
        driver.lease.handle_timeout(now, &gate);
        assert!(driver.lease.writes_paused());
        paused.store(true, Ordering::Release);
        worker.join().expect("worker");
    });
    witness.assert_seen(LEARNED, "a worker that learned of the pause");
    witness.assert_seen(NOT_YET, "a worker that had not learned of it yet");
}
