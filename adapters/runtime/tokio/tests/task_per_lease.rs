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
