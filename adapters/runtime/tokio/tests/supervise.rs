//! `supervise`: the job runs only while the lease is held, is cancelled when it is lost
//! (before the service's own expiry), restarts with a newer fence once the service is
//! back, and shutdown releases.

mod common;

use std::sync::{Arc, Mutex};

use common::{config, ms, Recording, Timeline};
use leasehold::{Fence, Refusal};
use leasehold_tokio::memory::{MemoryService, Scope};
use leasehold_tokio::{supervise, AcquireError, SuperviseEnd, SuperviseOptions, SupervisedTerm};

const KEY: &str = "orders";

/// What one term of the job saw, in ms since the timeline's start.
#[derive(Clone, Debug)]
struct Seen {
    number: u32,
    fence: Fence,
    started_ms: u64,
    /// When the job saw its token fire.
    cancelled_ms: Option<u64>,
    cancelled_us: Option<u64>,
    /// The safe deadline (on tokio's clock, µs) last seen before the token fired.
    deadline_us: Option<u64>,
    /// Whether the service still held the key for this term when the token fired.
    held_at_service_when_cancelled: bool,
    /// Writes `check()` allowed, and whether one was allowed after the token fired.
    writes: u32,
    wrote_after_cancel: bool,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A job that writes every millisecond while `check()` passes and returns when its
/// token fires, logging what it saw.
fn worker(
    timeline: Timeline,
    service: Arc<MemoryService>,
    log: Log,
) -> impl FnMut(SupervisedTerm) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    move |term: SupervisedTerm| {
        let (service, log) = (service.clone(), log.clone());
        Box::pin(async move {
            let index = {
                let mut log = log.lock().unwrap();
                log.push(Seen {
                    number: term.number,
                    fence: term.granted_fence,
                    started_ms: timeline.now_ms(),
                    cancelled_ms: None,
                    cancelled_us: None,
                    deadline_us: None,
                    held_at_service_when_cancelled: false,
                    writes: 0,
                    wrote_after_cancel: false,
                });
                log.len() - 1
            };
            let clock = term.handle.clock();
            loop {
                if term.token.is_cancelled() {
                    let mut log = log.lock().unwrap();
                    let seen = &mut log[index];
                    seen.cancelled_ms = Some(timeline.now_ms());
                    seen.cancelled_us = Some(timeline.now_us());
                    seen.held_at_service_when_cancelled = service
                        .grant(KEY)
                        .is_some_and(|g| g.fence == term.granted_fence);
                    if term.handle.check().is_ok() {
                        seen.wrote_after_cancel = true;
                    }
                    return;
                }
                if let Some(deadline) = term.handle.deadline() {
                    let at = clock.to_tokio(deadline);
                    log.lock().unwrap()[index].deadline_us =
                        Some(at.duration_since(timeline.start).as_micros() as u64);
                }
                if term.handle.check().is_ok() {
                    log.lock().unwrap()[index].writes += 1;
                }
                tokio::select! {
                    () = term.token.cancelled() => {}
                    () = tokio::time::sleep(ms(1)) => {}
                }
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_stall_cancels_the_job_before_the_deadline_a_recovery_restarts_it_with_a_newer_fence_and_shutdown_releases(
) {
    let timeline = Timeline::start();
    let service = Arc::new(MemoryService::new());
    let log: Log = Arc::default();
    let faults = {
        let service = service.clone();
        tokio::spawn(async move {
            timeline.until(1_000).await;
            service.stall(Scope::All);
            timeline.until(3_000).await;
            service.unstall(Scope::All);
        })
    };
    let end = supervise(
        service.clone(),
        KEY,
        config(900),
        SuperviseOptions::new(),
        timeline.until(6_000),
        worker(timeline, service.clone(), log.clone()),
    )
    .await;
    faults.await.unwrap();
    let log = log.lock().unwrap().clone();
    println!("{log:#?}");

    assert_eq!(end, SuperviseEnd::Shutdown);
    assert_eq!(timeline.now_ms(), 6_000, "shutdown is prompt");
    assert!(service.grant(KEY).is_none(), "shutdown released the key");
    assert!(log.len() >= 2, "a second term after the recovery: {log:?}");

    let first = &log[0];
    assert_eq!((first.number, first.started_ms), (1, 0));
    let cancelled = first.cancelled_us.expect("the first term was cancelled");
    let deadline = first.deadline_us.unwrap();
    // The gate closes at the deadline (check() reads the clock); the token fires when
    // the driver's timer does, which tokio rounds up to its 1 ms resolution.
    assert!(
        (1_000_000..=deadline + 1_000).contains(&cancelled),
        "cancelled at {cancelled} µs, after the stall and by the deadline {deadline} µs (+1 ms)"
    );
    assert!(
        first.held_at_service_when_cancelled,
        "cancelled before the service's own expiry"
    );

    for (before, after) in log.iter().zip(&log[1..]) {
        assert!(after.fence > before.fence, "{log:?}");
        assert_eq!(after.number, before.number + 1);
        assert!(after.started_ms >= before.cancelled_ms.unwrap());
    }
    let second = &log[1];
    assert!(
        (3_000..=3_000 + 2 * 900).contains(&second.started_ms),
        "restarted within two TTLs of the recovery: {second:?}"
    );
    let last = log.last().unwrap();
    assert_eq!(last.cancelled_ms, Some(6_000), "shutdown cancelled the job");
    assert!(log
        .iter()
        .all(|seen| seen.writes > 0 && !seen.wrote_after_cancel));
}

#[tokio::test(start_paused = true)]
async fn a_job_that_returns_while_held_ends_supervision_and_releases() {
    let service = Arc::new(MemoryService::new());
    let fences: Arc<Mutex<Vec<Fence>>> = Arc::default();
    let end = supervise(
        service.clone(),
        KEY,
        config(900),
        SuperviseOptions::new(),
        std::future::pending(),
        |term: SupervisedTerm| {
            let fences = fences.clone();
            async move {
                tokio::time::sleep(ms(2_000)).await;
                assert!(term.handle.check().is_ok());
                fences.lock().unwrap().push(term.granted_fence);
            }
        },
    )
    .await;
    assert_eq!(end, SuperviseEnd::JobDone);
    assert_eq!(fences.lock().unwrap().len(), 1);
    assert!(service.grant(KEY).is_none(), "released");
}

#[tokio::test(start_paused = true)]
async fn a_job_that_ignores_its_token_is_aborted_after_the_grace_and_the_next_term_starts() {
    let timeline = Timeline::start();
    let service = Arc::new(MemoryService::new());
    let dropped: Arc<Mutex<Vec<(u32, u64)>>> = Arc::default();
    struct OnDrop(Arc<Mutex<Vec<(u32, u64)>>>, u32, Timeline);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.lock().unwrap().push((self.1, self.2.now_ms()));
        }
    }
    let revoker = {
        let service = service.clone();
        tokio::spawn(async move {
            timeline.until(500).await;
            service.revoke(KEY).expect("held");
        })
    };
    let end = supervise(
        service.clone(),
        KEY,
        config(900),
        SuperviseOptions::new().grace(ms(100)),
        timeline.until(2_000),
        |term: SupervisedTerm| {
            let guard = OnDrop(dropped.clone(), term.number, timeline);
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
            }
        },
    )
    .await;
    revoker.await.unwrap();
    assert_eq!(end, SuperviseEnd::Shutdown);
    let dropped = dropped.lock().unwrap().clone();
    assert_eq!(
        dropped,
        [(1, 600), (2, 2_100)],
        "aborted after the 100 ms grace"
    );
    assert!(service.grant(KEY).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_final_refusal_ends_supervision_without_running_the_job() {
    let service = Recording::new();
    service.refuse_acquires(Refusal::Unauthorized);
    let end = supervise(
        service,
        KEY,
        config(900),
        SuperviseOptions::new(),
        std::future::pending(),
        |_: SupervisedTerm| async { panic!("the job must not run") },
    )
    .await;
    assert_eq!(
        end,
        SuperviseEnd::Failed(AcquireError::Refused(Refusal::Unauthorized))
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_while_waiting_for_a_held_key_returns_at_once_and_leaves_the_holder_alone() {
    let timeline = Timeline::start();
    let service = Arc::new(MemoryService::new());
    let holder = leasehold_tokio::acquire(service.clone(), KEY, config(900))
        .await
        .unwrap();
    let end = supervise(
        service.clone(),
        KEY,
        config(900),
        SuperviseOptions::new(),
        timeline.until(1_000),
        |_: SupervisedTerm| async { panic!("the key is held by another") },
    )
    .await;
    assert_eq!(end, SuperviseEnd::Shutdown);
    assert_eq!(timeline.now_ms(), 1_000);
    assert!(holder.check().is_ok());
    assert_eq!(service.grant(KEY).unwrap().fence, holder.granted_fence());
}

#[tokio::test(start_paused = true)]
async fn a_bounded_wait_on_a_held_key_ends_as_busy() {
    let service = Arc::new(MemoryService::new());
    let _holder = leasehold_tokio::acquire(service.clone(), KEY, config(900))
        .await
        .unwrap();
    let end = supervise(
        service,
        KEY,
        config(900),
        SuperviseOptions::new().max_wait(ms(300)),
        std::future::pending(),
        |_: SupervisedTerm| async { panic!("the key is held by another") },
    )
    .await;
    assert!(
        matches!(end, SuperviseEnd::Failed(AcquireError::Busy { .. })),
        "{end:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_that_releases_its_lease_gets_a_new_term_after_the_release_back_off() {
    let timeline = Timeline::start();
    let service = Arc::new(MemoryService::new());
    let started: Arc<Mutex<Vec<(u32, u64, Fence)>>> = Arc::default();
    let end = supervise(
        service.clone(),
        KEY,
        config(900),
        SuperviseOptions::new(),
        timeline.until(1_000),
        |term: SupervisedTerm| {
            let started = started.clone();
            async move {
                started
                    .lock()
                    .unwrap()
                    .push((term.number, timeline.now_us(), term.granted_fence));
                if term.number == 1 {
                    tokio::time::sleep(ms(100)).await;
                    term.handle.release().await;
                }
                term.token.cancelled().await;
            }
        },
    )
    .await;
    assert_eq!(end, SuperviseEnd::Shutdown);
    let started = started.lock().unwrap().clone();
    assert_eq!(started.len(), 2, "{started:?}");
    let pause = started[1].1 - 100_000;
    // config(900): retry_interval 45 ms. The loop's own jittered pause, within
    // [22.5, 67.5) ms, is outlasted by the release back-off, 2 × 45 ms, which lets a
    // waiter go first (`leasehold::rules`, "Acquiring"); +1 ms of tokio's timer
    // rounding.
    assert!((90_000..=91_000).contains(&pause), "paused {pause} µs");
    assert!(started[1].2 > started[0].2);
    assert!(service.grant(KEY).is_none());
}
