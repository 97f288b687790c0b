//! `MemoryService` keeps the contract, on tokio's paused clock (TTL waits cost no
//! real time).

use leasehold::Duration;
use leasehold_conformance::breach::the_timing_clauses_catch_early_expiry;
use leasehold_conformance::{check_all, run_all, Capabilities, CLAUSES};
use leasehold_tokio::memory::MemoryService;

/// The memory service applies any TTL to the microsecond and expires exactly on
/// time; its `revoked` fires on an operator's revoke only, not on a release.
fn caps() -> Capabilities {
    let mut caps = Capabilities::new(Duration::from_secs(1));
    caps.granularity = Duration::from_micros(1);
    caps.min_ttl = Duration::from_micros(1);
    caps
}

#[tokio::test(start_paused = true)]
async fn memory_service_keeps_the_contract() {
    run_all(&MemoryService::new(), &caps()).await;
}

/// Two full runs at once on one service: every clause keeps to keys of its own.
#[tokio::test(start_paused = true)]
async fn concurrent_runs_on_one_service_do_not_interfere() {
    let service = MemoryService::new();
    let caps = caps();
    tokio::join!(run_all(&service, &caps), run_all(&service, &caps));
}

#[tokio::test(start_paused = true)]
async fn every_clause_runs() {
    assert_eq!(CLAUSES.len(), 26);
    let unique: std::collections::HashSet<_> = CLAUSES.iter().collect();
    assert_eq!(unique.len(), CLAUSES.len());
    assert!(check_all(&MemoryService::new(), &caps()).await.is_empty());
}

/// The timing clauses see the memory service made to expire keys early (grants
/// applying less than they report, renewals reporting more than they apply).
#[tokio::test(start_paused = true)]
async fn the_timing_clauses_catch_early_expiry_on_the_memory_service() {
    let service = MemoryService::new();
    the_timing_clauses_catch_early_expiry(&service, &caps(), &caps()).await;
}
