//! The rules of `leasehold::rules` (core/RULES.md), each checked through the tokio
//! adapter on a paused clock, with faults injected into the in-memory service. Run
//! once per driver shape: `task_per_lease.rs` (a task per lease) and `lease_set.rs`
//! (leases in a `LeaseSet`); `crate::shape` is the shape's `acquire`.
//!
//! Unless a test says otherwise the lease is 900 ms: renew every 300 ms, request
//! timeout 90 ms, retry after 45 ms, margin 45 ms, drift 0.9 ms — a grant or renewal
//! sent at `s` is safe until `s + 854.1 ms`.

use std::sync::{Arc, Mutex};

use crate::common::{
    config, config_fail_closed, lease_us, ms, poll_once, within, Kind, Recording, Timeline,
};
use crate::shape::{acquire, try_acquire};
use leasehold::{
    Budget, Config, Duration, Event, Fence, FenceGate, GateError, Indeterminate, LossReason,
    StaleFence,
};
use leasehold_tokio::{CheckError, LeaseEnd, LeaseHandle, LeaseState};

const KEY: &str = "orders";

/// Samples `handle.check()` every millisecond until `end_ms`; returns `(ms, ok)` pairs.
async fn sample_checks(timeline: &Timeline, handle: &LeaseHandle, end_ms: u64) -> Vec<(u64, bool)> {
    let mut samples = Vec::new();
    while timeline.now_ms() < end_ms {
        samples.push((timeline.now_ms(), handle.check().is_ok()));
        tokio::time::sleep(ms(1)).await;
    }
    samples
}

/// The first millisecond at which `samples` refused, if any.
fn first_refusal(samples: &[(u64, bool)]) -> Option<u64> {
    samples.iter().find(|(_, ok)| !ok).map(|(at, _)| *at)
}

// ----- rule 1: the deadline counts from the send time -----

#[tokio::test(start_paused = true)]
async fn deadline_counts_from_the_send_time_not_the_answer() {
    let timeline = Timeline::start();
    let service = Recording::new();
    // 30 ms to the service, 30 ms back.
    service.set_latency(leasehold_tokio::memory::Scope::All, ms(60));

    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    assert_eq!(timeline.now_ms(), 60, "the answer came back after 60 ms");
    // Sent at 0: 0 + 900 − 0.9 − 45 ms. From the answer it would be 60 ms later.
    assert_eq!(lease.deadline(), Some(lease_us(854_100)));
    let expected = config(900).safe_deadline(lease_us(0), Duration::from_millis(900));
    assert_eq!(lease.deadline(), expected);

    let mut events = lease.events();
    let renewed = within(3_000, events.recv()).await.unwrap();
    assert_eq!(renewed.lease_time, lease_us(360_000), "answered at 360 ms");
    assert!(
        matches!(
            renewed.event,
            Event::Renewed { deadline, .. } if deadline == lease_us(300_000 + 854_100)
        ),
        "the renewal was sent at 300 ms: {:?}",
        renewed.event
    );

    // The gate holds exactly until that deadline, not a microsecond longer.
    service.partition(lease.owner());
    tokio::time::advance(std::time::Duration::from_micros(1_154_099 - 360_000)).await;
    assert_eq!(lease.check(), Ok(Fence(1)));
    tokio::time::advance(std::time::Duration::from_micros(1)).await;
    assert!(lease.check().is_err());
}

// ----- rule 2: renew every T/3 -----

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl_on_the_monotonic_clock() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();

    timeline.until(2_000).await;
    assert_eq!(
        service.sent_us(&timeline, lease.token(), Kind::Renew),
        [300_000, 600_000, 900_000, 1_200_000, 1_500_000, 1_800_000]
    );
    assert_eq!(lease.check(), Ok(Fence(1)));
}

// ----- rule 3: a blip is not loss -----

#[tokio::test(start_paused = true)]
async fn a_lost_renewal_is_retried_inside_the_budget_and_the_lease_survives() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let mut events = lease.events();
    service.drop_requests(lease.owner(), 1);

    let samples = sample_checks(&timeline, &lease, 1_000).await;
    assert_eq!(first_refusal(&samples), None, "writes never stopped");
    // 300 lost → timed out at 390 → retried at 435 → confirmed; next at 435 + 300.
    assert_eq!(
        service.sent_ms(&timeline, lease.token(), Kind::Renew),
        [300, 435, 735]
    );
    let first = within(3_000, events.recv()).await.unwrap().event;
    assert!(
        matches!(
            first,
            Event::RenewFailed {
                reason: Indeterminate::Timeout,
                ..
            }
        ),
        "{first:?}"
    );
    assert!(matches!(
        within(3_000, events.recv()).await.unwrap().event,
        Event::Renewed { .. }
    ));
    assert_eq!(lease.end(), None);
    assert_eq!(lease.check(), Ok(Fence(1)));
}

// ----- rules 3, 4, 5: a stall past the budget is Expired, before the service expires -----

#[tokio::test(start_paused = true)]
async fn a_stall_longer_than_the_budget_expires_the_lease_before_the_service_does() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    let service_expiry = service.grant(KEY).unwrap().expires_at;
    assert_eq!(service_expiry, timeline.at(900));

    // Record what the gate says the moment each request leaves.
    let seen_by_requests = Arc::new(Mutex::new(Vec::new()));
    let (probe, seen) = (lease.clone(), seen_by_requests.clone());
    service.on_send(move |sent| seen.lock().unwrap().push((sent.kind, probe.check())));

    service.stall(lease.owner());
    let watcher = {
        let lease = lease.clone();
        tokio::spawn(async move {
            let end = within(3_000, lease.lost()).await;
            (end, tokio::time::Instant::now())
        })
    };
    let samples = sample_checks(&timeline, &lease, 1_000).await;
    let (end, lost_at) = within(3_000, watcher).await.unwrap();

    assert_eq!(end, LeaseEnd::Lost(LossReason::Expired));
    // Deadline 854.1 ms; the driver's timer fires on the next millisecond tick.
    assert_eq!(lost_at, timeline.at(855));
    assert!(
        lost_at < service_expiry,
        "gate closed before the service's expiry"
    );
    assert_eq!(first_refusal(&samples), Some(855));
    assert!(samples.iter().all(|&(at, ok)| ok == (at < 855)));

    // Retried inside the budget, never past the safe deadline.
    let renewals = service.sent_us(&timeline, lease.token(), Kind::Renew);
    assert_eq!(
        renewals,
        [300_000, 435_000, 570_000, 705_000, 840_000],
        "every 90 ms timeout + 45 ms retry, the last before 854.1 ms"
    );
    // The best-effort release (retried, as the stalled service never answers it)
    // went out only after the gate had closed.
    let seen = seen_by_requests.lock().unwrap();
    let releases: Vec<_> = seen.iter().filter(|(k, _)| *k == Kind::Release).collect();
    assert!(!releases.is_empty());
    assert!(releases
        .iter()
        .all(|(_, check)| *check == Err(CheckError::Gate(GateError::Lost(LossReason::Expired)))));
}

#[tokio::test(start_paused = true)]
async fn no_retry_is_scheduled_past_the_safe_deadline() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let config = Config::builder(Duration::from_millis(900))
        .retry_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let lease = acquire(service.clone(), KEY, config).await.unwrap();
    let mut events = lease.events();
    service.partition(lease.owner());

    let mut retries = Vec::new();
    loop {
        match within(3_000, events.recv()).await.unwrap().event {
            Event::RenewFailed { retry_at, .. } => retries.push(retry_at.map(|at| at.as_millis())),
            Event::Lost { reason, .. } => {
                assert_eq!(reason, LossReason::Expired);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Timeouts at 390, 580, 770; a retry at 770 + 100 = 870 would land past the
    // deadline (854.1 ms), so none is scheduled: the lease waits for its deadline.
    assert_eq!(retries, [Some(490), Some(680), None]);
    assert_eq!(
        service.sent_ms(&timeline, lease.token(), Kind::Renew),
        [300, 490, 680]
    );
}

// ----- rule 4: NOT_OWNER is definitive -----

/// A holds [`KEY`] from 0 ms; at 100 ms the service loses it (a failover, a clock
/// jump there) and B takes it with fence 2; from then on answers take `latency`.
async fn taken_over_by_another(service: &Arc<Recording>, latency: u64) -> [LeaseHandle; 2] {
    let timeline = Timeline::start();
    let a = acquire(service.clone(), KEY, config(900)).await.unwrap();
    timeline.until(100).await;
    service.expire_now(KEY).unwrap();
    let b = try_acquire(service.clone(), KEY, config(900))
        .await
        .unwrap();
    assert_eq!(b.granted_fence(), Fence(2));
    service.set_latency(leasehold_tokio::memory::Scope::All, ms(latency));
    [a, b]
}

#[tokio::test(start_paused = true)]
async fn not_owner_loses_the_lease_on_that_very_answer() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let [a, b] = taken_over_by_another(&service, 0).await;
    let b_grant = service.grant(KEY).unwrap();

    assert_eq!(
        within(3_000, a.lost()).await,
        LeaseEnd::Lost(LossReason::NotOwner)
    );
    assert_eq!(timeline.now_ms(), 300, "lost on the first renewal's answer");
    assert_eq!(
        service.sent_ms(&timeline, a.token(), Kind::Renew),
        [300],
        "no retry after a definitive answer"
    );
    assert_eq!(
        a.check(),
        Err(CheckError::Gate(GateError::Lost(LossReason::NotOwner)))
    );
    // Compare-and-expire: A's renewal did not touch B's grant.
    assert_eq!(service.grant(KEY), Some(b_grant));
    assert_eq!(b.check(), Ok(Fence(2)));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_that_comes_in_as_its_request_times_out_is_acted_on() {
    let timeline = Timeline::start();
    let service = Recording::new();
    // A's renewal, sent at 300, is answered NotOwner at 390: the very instant its
    // 90 ms request timeout runs out. An answer that is in counts before the timeout,
    // as the single-lease loop polls the request before its timer.
    let [a, b] = taken_over_by_another(&service, 90).await;

    assert_eq!(
        within(3_000, a.lost()).await,
        LeaseEnd::Lost(LossReason::NotOwner)
    );
    assert_eq!(
        timeline.now_ms(),
        390,
        "lost on the answer, not after a retry"
    );
    assert_eq!(service.sent_ms(&timeline, a.token(), Kind::Renew), [300]);
    assert_eq!(b.check(), Ok(Fence(2)));
}

#[tokio::test(start_paused = true)]
async fn an_external_revocation_loses_the_lease_at_once() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();

    timeline.until(100).await;
    service.revoke(KEY).unwrap();
    assert_eq!(
        within(3_000, lease.lost()).await,
        LeaseEnd::Lost(LossReason::Revoked)
    );
    assert_eq!(timeline.now_ms(), 100, "not at the next renewal");
    assert_eq!(
        lease.check(),
        Err(CheckError::Gate(GateError::Lost(LossReason::Revoked)))
    );
    assert!(service
        .sent_ms(&timeline, lease.token(), Kind::Renew)
        .is_empty());
}

// ----- rules 5, 6: release never delays the stop -----

#[tokio::test(start_paused = true)]
async fn a_release_that_hangs_stops_writes_at_once_and_still_ends_released() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    timeline.until(100).await;
    service.stall(lease.owner());

    let mut releasing = Box::pin(lease.release());
    assert!(
        poll_once(&mut releasing).is_none(),
        "the release is in flight"
    );
    // Before the driver even ran: writes refused, lost() resolved.
    assert_eq!(lease.check(), Err(CheckError::ReleaseRequested));
    assert_eq!(within(0, lease.lost()).await, LeaseEnd::Released);
    tokio::task::yield_now().await;
    assert_eq!(timeline.now_us(), 100_000);
    // The driver closed the gate at that same instant.
    assert_eq!(lease.check(), Err(CheckError::Gate(GateError::Released)));

    assert_eq!(within(1_000, releasing).await, LeaseEnd::Released);
    assert_eq!(
        timeline.now_ms(),
        190,
        "bounded by the 90 ms request timeout"
    );
    assert_eq!(lease.state(), LeaseState::Released);
    assert_eq!(lease.check(), Err(CheckError::Gate(GateError::Released)));
    assert_eq!(
        service.sent_ms(&timeline, lease.token(), Kind::Release),
        [100]
    );
    assert!(
        service.grant(KEY).is_some(),
        "the stalled release never arrived"
    );
}

// ----- rule 7: fail-closed -----

async fn checks_around_a_lost_renewal(fail_closed: bool) -> Vec<(u64, Result<Fence, CheckError>)> {
    let timeline = Timeline::start();
    let service = Recording::new();
    let config = config_fail_closed(900, fail_closed);
    let lease = acquire(service.clone(), KEY, config).await.unwrap();
    service.drop_requests(lease.owner(), 1);
    let mut samples = Vec::new();
    for at in [299, 389, 390, 434, 435, 600] {
        timeline.until(at).await;
        tokio::task::yield_now().await;
        samples.push((at, lease.check()));
    }
    samples
}

#[tokio::test(start_paused = true)]
async fn fail_closed_pauses_writes_until_a_renewal_is_confirmed() {
    let paused = Err(CheckError::Gate(GateError::Paused));
    assert_eq!(
        checks_around_a_lost_renewal(true).await,
        [
            (299, Ok(Fence(1))),
            (389, Ok(Fence(1))), // the renewal sent at 300 is still in flight
            (390, paused),       // it timed out: outcome unknown, writes pause
            (434, paused),
            (435, Ok(Fence(1))), // the retry was confirmed
            (600, Ok(Fence(1))),
        ]
    );
    // Without the switch, the same blip never stops writes.
    assert!(checks_around_a_lost_renewal(false)
        .await
        .iter()
        .all(|(_, check)| check.is_ok()));
}

// ----- rule 8: answers too late never extend a deadline -----

#[tokio::test(start_paused = true)]
async fn renewals_answered_after_their_timeout_never_extend_the_lease() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let lease = acquire(service.clone(), KEY, config(900)).await.unwrap();
    // Every renewal reaches the service (which extends the key) after 60 ms, but its
    // answer would come back after 120 ms, past the 90 ms request timeout.
    service.set_latency(lease.owner(), ms(120));
    let mut state = lease.subscribe();

    assert_eq!(
        within(3_000, lease.lost()).await,
        LeaseEnd::Lost(LossReason::Expired)
    );
    assert_eq!(timeline.now_ms(), 855);
    // The service did extend it, from the last renewal it handled...
    assert!(service.stats().renewals >= 4);
    assert!(service.grant(KEY).unwrap().expires_at > timeline.at(1_500));
    // ...but the lease's deadline never moved: no confirmed renewal.
    assert_eq!(
        *state.borrow_and_update(),
        LeaseState::Lost(LossReason::Expired)
    );
    assert_eq!(
        service.sent_ms(&timeline, lease.token(), Kind::Renew),
        [300, 435, 570, 705, 840]
    );
}

// ----- rule 10: a sized budget, and a pause outside it -----

#[tokio::test(start_paused = true)]
async fn a_pause_inside_the_budget_is_survived_and_one_far_outside_is_fenced() {
    let ms_ = Duration::from_millis;
    let budget = Budget {
        work_p99: ms_(200),
        renew_rtt_p99: ms_(20),
        pause_budget: ms_(150),
        margin: ms_(30),
    };
    let ttl = ms_(600);
    budget.check(ttl).unwrap();
    let config = Config::builder(ttl).margin(budget.margin).build().unwrap();
    assert_eq!(config.renew_interval(), ms_(200));

    let timeline = Timeline::start();
    let service = Recording::new();
    let a = acquire(service.clone(), KEY, config).await.unwrap();
    let b = {
        let service = service.clone();
        tokio::spawn(async move { acquire(service, KEY, config).await.unwrap() })
    };
    let mut storage = FenceGate::new();

    // A 150 ms stop-the-world pause (worker and driver frozen) right after a check.
    timeline.until(100).await;
    let fence = a.check().unwrap();
    tokio::time::advance(ms(150)).await;
    assert_eq!(
        storage.admit(fence),
        Ok(()),
        "within budget: the write is fine"
    );
    assert_eq!(a.check(), Ok(fence), "and the lease survived");

    // The renewal due at 200 went out late, at 250: safe until 250 + 569.4 ms.
    // A 400 ms pause that starts just before the next renewal (due at 450):
    timeline.until(440).await;
    let fence = a.check().unwrap();
    tokio::time::advance(ms(400)).await;
    assert!(
        matches!(
            a.check(),
            Err(CheckError::Gate(
                GateError::DeadlinePassed { .. } | GateError::Lost(LossReason::Expired)
            ))
        ),
        "the lost flag refuses the next write"
    );
    assert_eq!(
        within(3_000, a.lost()).await,
        LeaseEnd::Lost(LossReason::Expired)
    );

    // B takes over with a newer fence and writes; A's write, already past its
    // check, arrives after: storage refuses it.
    let b = within(3_000, b).await.unwrap();
    assert_eq!(b.granted_fence(), Fence(2));
    assert_eq!(storage.admit(b.check().unwrap()), Ok(()));
    assert_eq!(
        storage.admit(fence),
        Err(StaleFence {
            presented: Fence(1),
            newest: Fence(2)
        })
    );
}
