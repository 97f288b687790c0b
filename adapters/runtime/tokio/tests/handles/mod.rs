//! The handle's promises: mutual exclusion between contenders, release on drop,
//! cancel-safe acquire, and how a loss is reported (lost(), token, watch, events).
//! Run once per driver shape, like `rules`.

use std::sync::{Arc, Mutex};

use crate::common::{config, config_fail_closed, ms, poll_once, within, Kind, Recording, Timeline};
use crate::shape::{acquire, acquire_with, try_acquire};
use leasehold::{Config, Event, Fence, FenceGate, GateError, LossReason, Owner, Stats};
use leasehold_tokio::memory::Scope;
use leasehold_tokio::{
    AcquireError, AcquireOptions, CheckError, LeaseEnd, LeaseHandle, LeaseState, LeaseStats,
};

const KEY: &str = "orders";

// ----- two contenders -----

#[derive(Clone, Copy, Debug)]
enum Fault {
    Partition,
    Stall,
    AnswersTooSlow,
    ExpireAtService,
    Revoke,
    OneLostRenewal,
}

/// What one contention run saw.
struct Contention {
    a: Fence,
    b: Option<Fence>,
    /// Instants (µs) at which both `check()`s passed.
    both_passed: Vec<u64>,
    /// Writes storage refused: (µs, the error).
    refused: Vec<(u64, String)>,
}

/// A holds, B waits in `acquire`; at 250 ms `fault` hits A. Every millisecond for
/// 3 s, both check at the same virtual instant, and every fence that passes is
/// written to storage behind a `FenceGate`.
async fn contend(fault: Fault) -> Contention {
    let timeline = Timeline::start();
    let service = Recording::new();
    // Fixed owners: B's retry jitter is seeded from its owner, so the timeline is the
    // same on every run.
    let a = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new().owner(Owner([0xa; 16])),
    )
    .await
    .unwrap();
    let b_slot: Arc<Mutex<Option<LeaseHandle>>> = Arc::default();
    let b_task = {
        let (service, slot) = (service.clone(), b_slot.clone());
        tokio::spawn(async move {
            let options = AcquireOptions::new().owner(Owner([0xb; 16]));
            let b = acquire_with(service, KEY, config(900), options)
                .await
                .unwrap();
            *slot.lock().unwrap() = Some(b);
        })
    };
    let mut storage = FenceGate::new();
    let (mut both_passed, mut refused) = (Vec::new(), Vec::new());
    while timeline.now_ms() < 3_000 {
        if timeline.now_ms() == 250 {
            match fault {
                Fault::Partition => service.partition(a.owner()),
                Fault::Stall => service.stall(a.owner()),
                Fault::AnswersTooSlow => service.set_latency(a.owner(), ms(200)),
                Fault::ExpireAtService => drop(service.expire_now(KEY)),
                Fault::Revoke => drop(service.revoke(KEY)),
                Fault::OneLostRenewal => service.drop_requests(a.owner(), 1),
            }
        }
        let b = b_slot.lock().unwrap().clone();
        // Both at the same virtual instant: nothing runs between these two lines.
        let a_check = a.check();
        let b_check = b.as_ref().map(LeaseHandle::check);
        if let (Ok(_), Some(Ok(_))) = (a_check, b_check) {
            both_passed.push(timeline.now_us());
        }
        // B writes first, then A, as if A's write came late.
        for fence in [b_check.and_then(Result::ok), a_check.ok()]
            .into_iter()
            .flatten()
        {
            if let Err(stale) = storage.admit(fence) {
                refused.push((timeline.now_us(), stale.to_string()));
            }
        }
        tokio::time::sleep(ms(1)).await;
    }
    b_task.abort();
    let b = b_slot
        .lock()
        .unwrap()
        .as_ref()
        .map(LeaseHandle::granted_fence);
    Contention {
        a: a.granted_fence(),
        b,
        both_passed,
        refused,
    }
}

#[tokio::test(start_paused = true)]
async fn two_contenders_never_both_pass_check_at_the_same_instant() {
    for fault in [
        Fault::Partition,
        Fault::Stall,
        Fault::AnswersTooSlow,
        Fault::Revoke,
        Fault::OneLostRenewal,
    ] {
        let run = contend(fault).await;
        assert_eq!(run.both_passed, [] as [u64; 0], "{fault:?}: both passed");
        assert_eq!(run.refused, [] as [(u64, String); 0], "{fault:?}");
        let expected = match fault {
            Fault::OneLostRenewal => None, // a blip: A keeps it, B keeps waiting
            _ => Some(Fence(2)),
        };
        assert_eq!((run.a, run.b), (Fence(1), expected), "{fault:?}");
    }
}

/// The write gate relies on the service honouring its TTL. A service that drops a
/// key early (failover that lost it, a clock jump on the server) hands it to B while
/// A still believes it holds it, until A's next renewal: only storage's fence gate
/// stops A's writes then. This is why every write carries its fence.
#[tokio::test(start_paused = true)]
async fn when_the_service_drops_a_key_early_only_the_fence_gate_stops_the_old_holder() {
    let run = contend(Fault::ExpireAtService).await;
    assert_eq!((run.a, run.b), (Fence(1), Some(Fence(2))));
    // B acquired on its first (jittered) retry after the service dropped the key;
    // A learnt at its renewal at 300 ms. Everything in between overlaps.
    let overlap = &run.both_passed;
    assert!(!overlap.is_empty(), "{overlap:?}");
    assert_eq!(overlap.last(), Some(&300_000), "{overlap:?}");
    assert!(
        overlap.windows(2).all(|w| w[1] - w[0] == 1_000),
        "one contiguous stretch: {overlap:?}"
    );
    assert_eq!(run.refused.len(), overlap.len(), "every write of A refused");
    assert!(run
        .refused
        .iter()
        .all(|(_, err)| err
            == "stale writer: presented fence 1 but storage already admitted fence 2"));
}

// ----- release on drop -----

#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_releases_the_key_in_the_background() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let a = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let token = a.cancellation_token();
    let watch = a.subscribe();
    let b = {
        let service = service.clone();
        tokio::spawn(async move { acquire(service, KEY, config(900)).await.unwrap() })
    };

    timeline.until(100).await;
    let clone = a.clone();
    drop(a);
    tokio::task::yield_now().await;
    assert!(service.grant(KEY).is_some(), "a clone still holds it");
    assert!(clone.check().is_ok());

    drop(clone);
    assert!(token.is_cancelled(), "writes stopped with the last handle");
    let b = within(3_000, b).await.unwrap();
    assert_eq!(b.granted_fence(), Fence(2));
    // B's acquire retries about every 45 ms (jittered, 22.5 to 67.5 ms): its first
    // retry after 100 ms gets the key, long before A's 900 ms TTL would free it.
    assert!(
        (101..=168).contains(&timeline.now_ms()),
        "{}",
        timeline.now_ms()
    );
    assert_eq!(*watch.borrow(), LeaseState::Released);
}

// ----- cancel-safe acquire -----

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_acquire_stops_its_attempts() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let b = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let owner = Owner([7; 16]);
    let attempt = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new().owner(owner),
    );
    assert!(tokio::time::timeout(ms(200), attempt).await.is_err());
    let attempts = service.sent_ms(&timeline, owner.token(leasehold::Term(1)), Kind::Acquire);
    // Retries about every 45 ms, jittered between half and one and a half of it.
    assert_eq!(attempts.first(), Some(&0));
    assert!(attempts.len() >= 3, "it was retrying: {attempts:?}");
    assert!(
        attempts
            .windows(2)
            .all(|w| (22..=68).contains(&(w[1] - w[0]))),
        "{attempts:?}"
    );

    timeline.until(300).await;
    drop(b);
    timeline.until(2_000).await;
    assert_eq!(
        service
            .sent_ms(&timeline, owner.token(leasehold::Term(1)), Kind::Acquire)
            .len(),
        attempts.len(),
        "no attempt after the future was dropped"
    );
    assert_eq!(service.grant(KEY), None, "the freed key was not taken");
}

#[tokio::test(start_paused = true)]
async fn dropping_an_acquire_whose_grant_is_in_flight_releases_the_grant() {
    let timeline = Timeline::start();
    let service = Recording::new();
    // 30 ms to the service, 30 ms back: granted at 30, answered at 60.
    service.set_latency(Scope::All, ms(60));
    let attempt = acquire(service.clone(), KEY, config(900));
    assert!(tokio::time::timeout(ms(40), attempt).await.is_err());
    assert!(
        service.grant(KEY).is_some(),
        "the service granted it at 30 ms"
    );

    // The release goes out when the attempt's answer comes (60 ms), never beside the
    // attempt (which it could overtake), and reaches the service 30 ms later.
    timeline.until(89).await;
    assert!(
        service.grant(KEY).is_some(),
        "not released before the answer"
    );
    timeline.until(91).await;
    assert_eq!(
        service.grant(KEY),
        None,
        "released, not left to the 900 ms TTL"
    );
    assert_eq!(service.stats().releases, 1);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_gives_up_on_the_first_held_by_another() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let a_identity = leasehold::Identity::new("host-a:4711").unwrap();
    let a = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new().identity(a_identity),
    )
    .await
    .unwrap();
    let owner = Owner([9; 16]);
    let b = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new()
            .owner(owner)
            .max_wait(std::time::Duration::ZERO),
    )
    .await;
    let Err(AcquireError::Busy {
        holder: Some(holder),
    }) = b
    else {
        panic!("{b:?}")
    };
    assert_eq!(holder.fence, a.granted_fence());
    assert_eq!(holder.identity, a_identity);
    assert_eq!(timeline.now_ms(), 0);
    timeline.until(1_000).await;
    assert_eq!(
        service.sent_ms(&timeline, owner.token(leasehold::Term(1)), Kind::Acquire),
        [0]
    );
    assert!(try_acquire(service.clone(), "free", config(900))
        .await
        .is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_an_acquire_is_retried_and_granted_idempotently() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let owner = Owner([1; 16]);
    service.drop_responses(owner, 1);
    let lease = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new().owner(owner),
    )
    .await
    .unwrap();
    // Granted at 0, answer lost; timed out at 90; retried 22.5 to 67.5 ms later: the
    // same grant.
    assert!(
        (112..=158).contains(&timeline.now_ms()),
        "{}",
        timeline.now_ms()
    );
    assert_eq!(lease.granted_fence(), Fence(1));
    assert_eq!(service.stats().acquires, 2);
    assert_eq!(lease.check(), Ok(Fence(1)));
}

#[tokio::test(start_paused = true)]
async fn random_owners_differ() {
    let service = Recording::new();
    let a = acquire(service.clone(), "a", config(900)).await.unwrap();
    let b = acquire(service.clone(), "b", config(900)).await.unwrap();
    assert_ne!(a.owner(), b.owner());
}

// ----- how a loss is reported -----

#[tokio::test(start_paused = true)]
async fn a_loss_cancels_the_token_and_shows_in_the_watch_and_the_events() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let token = lease.cancellation_token();
    let mut state = lease.subscribe();
    let mut events = lease.events();
    assert_eq!(
        *state.borrow_and_update(),
        LeaseState::Holding {
            fence: Fence(1),
            deadline: lease.deadline().unwrap()
        }
    );

    service.expire_now(KEY);
    within(3_000, token.cancelled()).await;
    assert_eq!(timeline.now_ms(), 300);
    assert!(
        lease.check().is_err(),
        "the gate closed before the token was cancelled"
    );
    within(3_000, state.changed()).await.unwrap();
    assert_eq!(*state.borrow(), LeaseState::Lost(LossReason::NotOwner));
    let lost = within(3_000, events.recv()).await.unwrap();
    assert!(
        matches!(
            lost.event,
            Event::Lost {
                reason: LossReason::NotOwner,
                ..
            }
        ),
        "{:?}",
        lost.event
    );
    assert_eq!(lost.at, timeline.at(300));

    // After the end, every observer agrees at once; release() is a no-op.
    assert_eq!(
        within(3_000, lease.lost()).await,
        LeaseEnd::Lost(LossReason::NotOwner)
    );
    assert!(lease.cancellation_token().is_cancelled());
    assert_eq!(
        within(1_000, lease.release()).await,
        LeaseEnd::Lost(LossReason::NotOwner)
    );
    assert_eq!(timeline.now_ms(), 300);
}

#[tokio::test(start_paused = true)]
async fn release_ends_the_term_for_every_clone() {
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let worker = lease.clone();
    assert_eq!(within(1_000, lease.release()).await, LeaseEnd::Released);
    assert_eq!(worker.check(), Err(CheckError::Gate(GateError::Released)));
    assert_eq!(within(3_000, worker.lost()).await, LeaseEnd::Released);
    assert_eq!(service.grant(KEY), None);
}

/// Not `#[tokio::test]`: the runtime is dropped mid-lease on purpose.
#[test]
fn a_runtime_shutdown_ends_the_lease_as_driver_stopped() {
    let runtime = crate::common::paused_runtime();
    let service = Recording::new();
    let lease = runtime
        .block_on(acquire(service.clone(), KEY, config(900)))
        .unwrap();
    let token = lease.cancellation_token();
    drop(runtime);
    assert_eq!(lease.end(), Some(LeaseEnd::DriverStopped));
    assert_eq!(lease.state(), LeaseState::DriverStopped);
    assert!(token.is_cancelled());
    assert_eq!(lease.check(), Err(CheckError::DriverStopped));
}

// ----- bad input and final refusals: a typed error, at once -----

#[tokio::test(start_paused = true)]
async fn an_invalid_key_is_refused_before_anything_is_sent() {
    let timeline = Timeline::start();
    let service = Recording::new();
    for (key, expected) in [
        ("", leasehold::KeyError::Empty),
        ("a{b}", leasehold::KeyError::Brace { at: 1 }),
    ] {
        let err = acquire(service.clone(), key, config(900))
            .await
            .unwrap_err();
        assert_eq!(err, AcquireError::InvalidKey(expected), "{key:?}");
        assert!(err.is_final(), "no retry can make the key valid");
        assert!(
            err.to_string().starts_with("cannot acquire: invalid key"),
            "{err}"
        );
    }
    assert_eq!(timeline.now_ms(), 0);
    assert!(service.all_sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_wait_bound_ends_an_acquire_against_a_service_that_never_answers() {
    let timeline = Timeline::start();
    let service = Recording::new();
    service.partition(leasehold_tokio::memory::Scope::All);
    let err = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new().max_wait(ms(500)),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        AcquireError::Unavailable(leasehold::Indeterminate::Timeout)
    );
    assert!(!err.is_final(), "the service may answer a later acquire");
    // Every attempt is sent before 500 ms; it gives up once the next retry (22.5 to
    // 67.5 ms after a failure) would fall at or after 500 ms, or at 500 ms with an
    // attempt in flight (the bound is hard: its request timeout is not awaited).
    assert!(
        (432..=500).contains(&timeline.now_ms()),
        "{}",
        timeline.now_ms()
    );
    // The core schedules no attempt at or after 500 ms; tokio's timer fires on whole
    // milliseconds, so one scheduled at 499.4 ms goes out at 500 ms.
    let request_timeout = config(900).request_timeout().as_millis();
    let gave_up = timeline.now_ms();
    timeline.until(gave_up + request_timeout + 1).await;
    assert!(service
        .all_sent()
        .iter()
        .filter(|sent| sent.kind == Kind::Acquire)
        .all(|sent| sent.at < timeline.at(501)));
    // Every attempt may have been granted: a release went out once no attempt was in
    // flight (never beside one, which it could overtake), within a request timeout.
    let released = service
        .all_sent()
        .iter()
        .find(|sent| sent.kind == Kind::Release)
        .map(|sent| sent.at);
    assert!(
        released.is_some_and(|at| at <= timeline.at(gave_up + request_timeout)),
        "{released:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn waiting_for_a_held_key_ends_at_the_bound_with_the_holder() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let a = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let err = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new().max_wait(ms(300)),
    )
    .await
    .unwrap_err();
    let AcquireError::Busy {
        holder: Some(holder),
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(holder.fence, a.granted_fence());
    assert!(holder.remaining <= leasehold::Duration::from_millis(900));
    assert!(timeline.now_ms() <= 300, "{}", timeline.now_ms());
    assert!(err.to_string().starts_with("the key is held by "), "{err}");
}

// ----- the wait bound is hard -----

/// A client whose every request takes 200 ms there and back (100 ms each way), with a
/// 3 s TTL (request timeout 300 ms): an attempt is in flight for 200 ms.
const SLOW: Owner = Owner([0x51; 16]);

fn slow_config() -> Config {
    leasehold_tokio::config(ms(3_000))
        .retry_interval(ms(20))
        .build()
        .unwrap()
}

/// The attempt sent at 0 reaches the service at 100 ms and is granted; its answer
/// comes back at 200 ms, after the bound (150 ms). The acquire returns at the bound;
/// the driver goes on awaiting the attempt and releases the grant its answer carries:
/// the release sent at 200 ms lands at 300 ms, and another client gets the key then,
/// not when the orphaned grant's TTL runs out (3.1 s).
#[tokio::test(start_paused = true)]
async fn an_attempt_in_flight_at_the_bound_is_not_awaited_and_its_grant_is_released() {
    let timeline = Timeline::start();
    let service = Recording::new();
    service.set_latency(SLOW, ms(200));
    let options = AcquireOptions::new().owner(SLOW).max_wait(ms(150));
    let err = acquire_with(service.clone(), KEY, slow_config(), options)
        .await
        .unwrap_err();
    assert_eq!(timeline.now_us(), 150_000, "returns at the bound exactly");
    assert_eq!(
        err,
        AcquireError::Unavailable(leasehold::Indeterminate::Timeout)
    );
    // The in-flight attempt was granted at the service.
    let grant = service.grant(KEY).expect("granted at 100 ms");
    assert_eq!(grant.token.owner, SLOW);
    timeline.until(301).await;
    // Its release went out when its answer came, not beside it.
    let releases = service.sent_ms(&timeline, SLOW.token(leasehold::Term(1)), Kind::Release);
    assert_eq!(releases, [200]);
    assert_eq!(service.grant(KEY), None, "the late grant was released");
    let b = try_acquire(service.clone(), KEY, config(900))
        .await
        .unwrap();
    assert!(b.granted_fence() > grant.fence);
    assert_eq!(timeline.now_ms(), 301);
}

/// A release can overtake the attempt it is meant to clean up (etcd serves each
/// request on its own stream, a PostgreSQL pool on another connection). Here the
/// attempt sent at 0 takes 200 ms to reach the service, a release none: sent beside
/// the attempt at the bound (150 ms), it would find the key free, answer "not owner",
/// and leave the attempt's grant (at 200 ms) to block everyone for its TTL (3 s).
/// Sent after the attempt's request timeout (300 ms), it deletes the grant.
#[tokio::test(start_paused = true)]
async fn the_release_after_the_bound_never_overtakes_the_attempt_in_flight() {
    let timeline = Timeline::start();
    let service = Recording::new();
    service.set_latency(SLOW, ms(400));
    let fast = Arc::downgrade(&service);
    service.on_send(move |sent| {
        if sent.kind == Kind::Release {
            if let Some(service) = fast.upgrade() {
                service.set_latency(SLOW, ms(0));
            }
        }
    });
    let options = AcquireOptions::new().owner(SLOW).max_wait(ms(150));
    let err = acquire_with(service.clone(), KEY, slow_config(), options)
        .await
        .unwrap_err();
    assert_eq!(timeline.now_us(), 150_000, "returns at the bound exactly");
    assert_eq!(
        err,
        AcquireError::Unavailable(leasehold::Indeterminate::Timeout)
    );
    timeline.until(301).await;
    let releases = service.sent_ms(&timeline, SLOW.token(leasehold::Term(1)), Kind::Release);
    assert_eq!(releases, [300], "after the attempt's request timeout");
    assert_eq!(
        service.grant(KEY),
        None,
        "the attempt's grant (at 200 ms) was released"
    );
    let b = try_acquire(service.clone(), KEY, config(900))
        .await
        .unwrap();
    assert!(b.check().is_ok());
}

/// A held key: the first attempt's answer (held, at 200 ms) is retried 10 to 30 ms
/// later, and that attempt is in flight at the bound (300 ms): `Busy`, at 300 ms,
/// naming the holder; the holder keeps its lease.
#[tokio::test(start_paused = true)]
async fn waiting_for_a_held_key_ends_at_the_bound_even_with_an_attempt_in_flight() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let a = acquire(service.clone(), KEY, config(900)).await.unwrap();
    service.set_latency(SLOW, ms(200));
    let options = AcquireOptions::new().owner(SLOW).max_wait(ms(300));
    let err = acquire_with(service.clone(), KEY, slow_config(), options)
        .await
        .unwrap_err();
    assert_eq!(timeline.now_us(), 300_000, "returns at the bound exactly");
    let AcquireError::Busy {
        holder: Some(holder),
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(holder.fence, a.granted_fence());
    let sent = service.sent_ms(&timeline, SLOW.token(leasehold::Term(1)), Kind::Acquire);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0], 0);
    // Its answer would come at 410 to 430 ms.
    assert!((210..=230).contains(&sent[1]), "{sent:?}");
    timeline.until(1_000).await;
    assert!(a.check().is_ok(), "the holder is not disturbed");
}

#[tokio::test(start_paused = true)]
async fn a_bound_ends_an_acquire_that_the_service_does_not_answer_at_the_bound() {
    let timeline = Timeline::start();
    let service = Recording::new();
    service.stall(SLOW);
    let options = AcquireOptions::new().owner(SLOW).max_wait(ms(100));
    let err = acquire_with(service.clone(), KEY, slow_config(), options)
        .await
        .unwrap_err();
    // Not at the request timeout (300 ms).
    assert_eq!(timeline.now_us(), 100_000, "returns at the bound exactly");
    assert_eq!(
        err,
        AcquireError::Unavailable(leasehold::Indeterminate::Timeout)
    );
    service.unstall(SLOW);
    let b = try_acquire(service.clone(), KEY, config(900))
        .await
        .unwrap();
    assert!(b.check().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_final_refusal_returns_at_once_even_without_a_wait_bound() {
    let timeline = Timeline::start();
    let service = Recording::new();
    service.refuse_acquires(leasehold::Refusal::Unauthorized);
    let err = acquire(service.clone(), KEY, config(900))
        .await
        .unwrap_err();
    assert_eq!(err, AcquireError::Refused(leasehold::Refusal::Unauthorized));
    assert_eq!(timeline.now_ms(), 0);
    let acquires = service
        .all_sent()
        .iter()
        .filter(|sent| sent.kind == Kind::Acquire)
        .count();
    assert_eq!(acquires, 1, "never retried");
    assert!(err.to_string().contains("credentials"), "{err}");
}

// ----- the fence to write with, why writes stopped, and the counters -----

/// Moves the clock forward by `by` without letting any other task run: a worker
/// waking from a pause before the driver task gets to run.
fn jump_without_yielding(by: std::time::Duration) {
    let mut advance = Box::pin(tokio::time::advance(by));
    // The first poll moves the clock, then yields: Pending, and nothing else runs.
    assert!(poll_once(&mut advance).is_none());
}

#[tokio::test(start_paused = true)]
async fn the_first_refusal_names_the_loss_before_the_driver_has_run() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    service.stall(lease.owner());
    // Renewals go unanswered; until the safe deadline (854.1 ms) writes may go on.
    timeline.until(854).await;
    assert_eq!(lease.check(), Ok(Fence(1)));

    jump_without_yielding(ms(1));
    assert_eq!(
        lease.end(),
        None,
        "the driver has not seen the deadline yet"
    );
    let refused = lease.check().unwrap_err();
    assert_eq!(refused.loss(), Some(LossReason::Expired), "{refused}");
    assert!(!refused.is_temporary());
    // From that refusal on, the handle says the term ended, and why.
    assert_eq!(lease.end(), Some(LeaseEnd::Lost(LossReason::Expired)));
    assert_eq!(
        poll_once(&mut Box::pin(lease.lost())),
        Some(LeaseEnd::Lost(LossReason::Expired))
    );
    assert!(lease.cancellation_token().is_cancelled());
    assert_eq!(
        lease.granted_fence(),
        Fence(1),
        "the granted fence stays: a label, not a permission"
    );

    // The driver then reports that very reason.
    assert_eq!(
        within(10, lease.lost()).await,
        LeaseEnd::Lost(LossReason::Expired)
    );
    assert_eq!(lease.check().unwrap_err().loss(), Some(LossReason::Expired));
}

#[tokio::test(start_paused = true)]
async fn a_revoked_lease_names_its_reason_at_the_first_refusal() {
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    service.revoke(KEY).unwrap();
    // Poll check() every millisecond: the first refusal already carries the reason.
    let refused = within(1_000, async {
        loop {
            match lease.check() {
                Ok(_) => tokio::time::sleep(ms(1)).await,
                Err(refused) => return refused,
            }
        }
    })
    .await;
    assert_eq!(refused.loss(), Some(LossReason::Revoked), "{refused}");
    assert_eq!(
        within(10, lease.lost()).await,
        LeaseEnd::Lost(LossReason::Revoked)
    );
}

/// Two waits on one lease in one task (a `join!` over `lost()` and a timeout of it,
/// say): giving up on one leaves the other woken by the end, at once, not at the
/// task's next wake-up for something else.
#[tokio::test(start_paused = true)]
async fn a_wait_given_up_leaves_the_other_wait_of_its_task_woken() {
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let start = tokio::time::Instant::now();
    let revoke = service.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(500)).await;
        revoke.revoke(KEY).unwrap();
    });
    let waits = async {
        tokio::time::sleep(ms(10)).await;
        let end = lease.lost().await;
        (end, start.elapsed())
    };
    let given_up = async {
        let waited = tokio::time::timeout(ms(100), lease.lost()).await;
        assert!(waited.is_err(), "nothing ended the lease yet");
    };
    // The wait given up on began first; `waits` is polled first, so after the other
    // wait goes at 100 ms, nothing but the end wakes this task.
    let ((end, at), ()) = within(3_000, async { tokio::join!(biased; waits, given_up) }).await;
    assert_eq!(end, LeaseEnd::Lost(LossReason::Revoked));
    assert!(
        at < ms(510),
        "lost() completed {at:?} after the acquire, the revocation came at 500 ms"
    );
}

/// Fail-closed pauses writes while a renewal's outcome is unknown; once the deadline
/// has passed too, no renewal can lift the pause, and `check()` says so at once
/// instead of a temporary `Paused`.
#[tokio::test(start_paused = true)]
async fn a_fail_closed_pause_past_its_deadline_is_refused_as_expired() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let config = config_fail_closed(900, true);
    let lease = acquire(service.clone(), KEY, config).await.unwrap();
    service.stall(lease.owner());
    // The renewal sent at 300 ms times out at 390 ms: writes pause.
    timeline.until(854).await;
    let paused = lease.check().unwrap_err();
    assert_eq!(paused, CheckError::Gate(GateError::Paused));
    assert!(paused.is_temporary() && paused.loss().is_none());

    jump_without_yielding(ms(1));
    assert_eq!(
        lease.end(),
        None,
        "the driver has not seen the deadline yet"
    );
    let refused = lease.check().unwrap_err();
    assert!(
        matches!(refused, CheckError::Gate(GateError::DeadlinePassed { .. })),
        "{refused:?}"
    );
    assert!(!refused.is_temporary());
    assert_eq!(refused.loss(), Some(LossReason::Expired));
    assert_eq!(
        within(10, lease.lost()).await,
        LeaseEnd::Lost(LossReason::Expired)
    );
}

/// What `state()` says through a term: holding, with the grant's fence and a deadline
/// ahead; while a renewal's outcome is unknown, renew-pending with that deadline
/// unchanged and writes paused exactly when the lease fails closed; holding again,
/// with a later deadline, once the retry is confirmed; released at the end.
#[tokio::test(start_paused = true)]
async fn the_state_follows_the_term_with_the_grant_s_fence_and_deadline() {
    for fail_closed in [false, true] {
        let timeline = Timeline::start();
        let service = Recording::new();
        let config = config_fail_closed(900, fail_closed);
        let lease = acquire(service.clone(), KEY, config).await.unwrap();
        let fence = lease.granted_fence();
        let first = held(&lease, fence);
        assert!(first > lease.clock().now(), "{first:?}");

        // The renewal sent at 300 ms gets no answer: it times out at 390 ms and is
        // retried at 435 ms, which is confirmed.
        service.drop_requests(lease.owner(), 1);
        timeline.until(400).await;
        assert_eq!(
            lease.state(),
            LeaseState::RenewPending {
                fence,
                deadline: first,
                writes_paused: fail_closed,
            }
        );
        timeline.until(500).await;
        let renewed = held(&lease, fence);
        assert!(renewed > first, "{renewed:?} after {first:?}");

        assert_eq!(lease.release().await, LeaseEnd::Released);
        assert_eq!(lease.state(), LeaseState::Released);
    }
}

/// The deadline of `lease`, which must be holding with `fence`.
fn held(lease: &LeaseHandle, fence: Fence) -> leasehold::Instant {
    match lease.state() {
        LeaseState::Holding {
            fence: held,
            deadline,
        } if held == fence => deadline,
        other => panic!("expected holding with {fence:?}, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn stats_count_retries_as_they_happen_and_the_core_counters_stay_zero() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let a = acquire_with(
        service.clone(),
        KEY,
        config(900),
        AcquireOptions::new().owner(Owner([0xa; 16])),
    )
    .await
    .unwrap();
    assert_eq!(a.stats(), LeaseStats::default());
    let b = {
        let service = service.clone();
        tokio::spawn(acquire_with(
            service,
            KEY,
            config(900),
            AcquireOptions::new().owner(Owner([0xb; 16])),
        ))
    };

    // Two renewals of A get no answer (300 ms, retried at 435 ms), the third goes
    // through (570 ms).
    service.drop_requests(a.owner(), 2);
    timeline.until(600).await;
    let stats = a.stats();
    assert_eq!(stats.renewal_retries, 2, "{stats:?}");
    assert_eq!(stats.acquire_retries, 0);

    assert_eq!(a.release().await, LeaseEnd::Released);
    let b = within(1_000, b).await.unwrap().unwrap();
    let b_attempts = service.sent_ms(&timeline, b.token(), Kind::Acquire).len();
    let b_stats = b.stats();
    assert!(b_attempts > 2, "B waited: {b_attempts} attempts");
    assert_eq!(
        b_stats.acquire_retries as usize,
        b_attempts - 1,
        "every attempt but the granted one was a retry: {b_stats:?}"
    );
    assert_eq!(b_stats.renewal_retries, 0);

    // A's term is over: the core's counters were handed over, and this driver never
    // feeds the lease a stale answer nor lets an event be overwritten.
    let a_stats = a.stats();
    assert_eq!(a_stats.core, Stats::default(), "{a_stats:?}");
    assert_eq!(a_stats.renewal_retries, 2);
}

// ----- who holds it -----

/// A grant names its holder: the identity the acquire names, or else this process's
/// `host:pid`, which every lease that names none shares.
#[tokio::test(start_paused = true)]
async fn a_grant_names_the_acquires_identity_or_else_host_and_pid() {
    let service = Recording::new();
    let worker = leasehold::Identity::new("worker-7").unwrap();
    let plain = acquire(Arc::clone(&service), "plain", config(3_000))
        .await
        .unwrap();
    let named = acquire_with(
        Arc::clone(&service),
        "named",
        config(3_000),
        AcquireOptions::new().identity(worker),
    )
    .await
    .unwrap();

    let pid = format!(":{}", std::process::id());
    let plain_holder = service.grant("plain").unwrap().identity;
    assert!(plain_holder.as_str().ends_with(&pid), "{plain_holder}");
    assert_eq!(service.grant("named").unwrap().identity, worker);
    drop((plain, named));
}
