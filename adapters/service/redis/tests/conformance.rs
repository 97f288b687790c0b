//! The service contract of `leasehold-driver`, clause by clause
//! (`leasehold-conformance`), against a real `redis-server`.

use std::time::Duration as StdDuration;

use leasehold::Duration;
use leasehold_conformance::breach::the_timing_clauses_catch_early_expiry;
use leasehold_conformance::{run_all, Capabilities};
use leasehold_redis::RedisLockService;
use leasehold_test_support::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_contract() {
    let server = RedisServer::start();
    let service = RedisLockService::builder(server.url())
        .request_timeout(StdDuration::from_secs(2))
        .connect()
        .await
        .expect("connect to the test redis-server");
    // 300 ms leaves the "still held halfway" checks room for a loaded machine (see the
    // conformance README).
    run_all(&service, &Capabilities::redis(Duration::from_millis(300))).await;
}

/// The timing clauses see a Redis whose grants apply less than they report, and whose
/// renewals report more than they apply, on Redis's own clock (about 0.7 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timing_clauses_catch_a_redis_that_expires_early() {
    let server = RedisServer::start();
    let service = RedisLockService::builder(server.url())
        .request_timeout(StdDuration::from_secs(2))
        .connect()
        .await
        .expect("connect to the test redis-server");
    let caps = Capabilities::redis(Duration::from_millis(300));
    the_timing_clauses_catch_early_expiry(&service, &caps, &caps).await;
}
