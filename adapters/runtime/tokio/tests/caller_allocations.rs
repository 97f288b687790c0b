//! An acquire allocates nothing on the thread that calls it, for a key of up to 64
//! bytes: the lease's own copy of the key is made by the thread that runs the acquire.
//! A copy made by the caller would sit, for the lease's life, between the caller's
//! short-lived allocations (a task spawned per acquire) and keep their freed memory in
//! the caller's malloc arena (`CalledKey` in `src/acquire.rs`).
//!
//! One test in a binary of its own: the counting allocator counts every thread.

use std::sync::Arc;
use std::time::Duration;

use leasehold::Config;
use leasehold_tokio::memory::MemoryService;
use leasehold_tokio::{try_acquire, LeaseSet};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Heap allocations made while `f` runs.
fn allocations<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let region = Region::new(GLOBAL);
    let made = f();
    (region.change().allocations, made)
}

#[test]
fn making_an_acquire_copies_a_short_key_into_the_future_not_to_the_heap() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let config = Config::builder(Duration::from_secs(3).into())
        .build()
        .unwrap();
    let service = Arc::new(MemoryService::new());
    let set = LeaseSet::new(Arc::clone(&service), config);
    let short = "k".repeat(64);
    let long = "k".repeat(65);

    let (made, in_set) = allocations(|| set.acquire(&short));
    assert_eq!(made, 0, "a set's acquire allocated on the caller's thread");
    let (made, alone) = allocations(|| try_acquire(Arc::clone(&service), &short, config));
    assert_eq!(made, 0, "try_acquire allocated on the caller's thread");
    let (made, long) = allocations(|| set.acquire(&long));
    assert_eq!(made, 1, "a long key is copied to the heap by the caller");

    // The futures still acquire the keys they were given.
    runtime.block_on(async {
        let held = in_set.await.unwrap();
        assert_eq!(held.key(), short);
        drop(long);
        let alone = alone.await.unwrap_err();
        assert!(
            matches!(alone, leasehold_tokio::AcquireError::Busy { .. }),
            "{alone:?}"
        );
    });
}
