//! The lease rules and the handle's promises, each lease driven by a task of its own
//! (`leasehold_tokio::acquire`).

mod common;
mod handles;
mod rules;

mod shape {
    pub use leasehold_tokio::{acquire, acquire_with, try_acquire};
}

/// A runtime that is shutting down drops what is spawned on it without polling it:
/// the lease's driver task never runs a single step. The acquire must still end
/// (as "driver stopped"), not wait for ever.
#[test]
fn an_acquire_whose_task_is_dropped_unpolled_ends_as_driver_stopped() {
    use std::sync::Arc;

    use leasehold_tokio::memory::MemoryService;
    use leasehold_tokio::AcquireError;

    let dead = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let spawn_on = dead.handle().clone();
    drop(dead);
    let (answer, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let outcome = runtime.block_on(async {
            let service = Arc::new(MemoryService::new());
            // `acquire` spawns its driver here: on the runtime that is gone.
            let _on_the_dead_runtime = spawn_on.enter();
            shape::acquire(service, "k", common::config(900))
                .await
                .map(|_| ())
        });
        let _ = answer.send(outcome);
    });
    // Only a failing run waits this long.
    let outcome = answered
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the acquire returned");
    assert!(
        matches!(outcome, Err(AcquireError::DriverStopped)),
        "{outcome:?}"
    );
}

/// Tasks started on one thread with the same config share their config block and its
/// clock, which starts before most of them: harmless, the core only compares instants
/// of one lease. But every runtime has its own paused clock, and one thread may run
/// several: a lease started under a runtime whose clock is behind the block's start
/// must get a clock of its own, or it sees no time pass. It would then never renew,
/// and its `check()` would pass long after the service let the key go.
#[test]
fn a_lease_under_a_runtime_whose_clock_is_behind_keeps_time_and_its_key() {
    use std::sync::Arc;

    use leasehold_tokio::memory::MemoryService;

    let config = common::config(900);
    // A lease under a runtime an hour ahead, held while the next one starts.
    let ahead = common::paused_runtime();
    let first = ahead.block_on(async {
        tokio::time::advance(common::ms(3_600_000)).await;
        let service = Arc::new(MemoryService::new());
        shape::acquire(service, "a", config).await.unwrap()
    });
    common::paused_runtime().block_on(async {
        let service = Arc::new(MemoryService::new());
        let lease = shape::acquire(service.clone(), "b", config).await.unwrap();
        let started = lease.clock().now();
        for _ in 0..10 {
            tokio::time::sleep(common::ms(900)).await;
            assert_eq!(
                lease.check(),
                Ok(lease.granted_fence()),
                "held after renewals"
            );
            let contender = shape::try_acquire(service.clone(), "b", config).await;
            assert!(contender.is_err(), "a second holder of the key");
        }
        let elapsed = lease.clock().now().checked_duration_since(started);
        assert_eq!(elapsed, Some(leasehold::Duration::from_secs(9)));
    });
    drop(first);
}
