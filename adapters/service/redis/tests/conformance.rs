//! The service contract of `leasehold-driver`, clause by clause
//! (`leasehold-conformance`), against a real `redis-server`.

use std::time::Duration as StdDuration;

use leasehold::Duration;
use leasehold_conformance::breach::the_timing_clauses_catch_early_expiry;
use leasehold_conformance::{run_all, Capabilities};
use leasehold_redis::RedisLockService;
use leasehold_test_support::RedisServer;

/// A service on `server`, with a request timeout that leaves a loaded machine room.
async fn connect(server: &RedisServer) -> RedisLockService {
    RedisLockService::builder(server.url())
        .request_timeout(StdDuration::from_secs(2))
        .connect()
        .await
        .expect("connect to the test redis-server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_contract() {
    let server = RedisServer::start();
    let service = connect(&server).await;
    // 300 ms leaves the "still held halfway" checks room for a loaded machine (see the
    // conformance README).
    run_all(&service, &Capabilities::redis(Duration::from_millis(300))).await;
}

/// With keyspace notifications on, `holder_changed` is a watch: the clause checks it
/// completes on every change of holder (and never while the holder stays), keys with
/// odd characters included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keyspace_notifications_holder_changed_fires_on_every_change() {
    let server = RedisServer::start();
    let service = connect(&server).await;
    let mut conn = service.connection().clone();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("KA")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut caps = Capabilities::redis(Duration::from_millis(300));
    caps.holder_watch = true;
    let verdict =
        leasehold_conformance::holder_changed_fires_on_every_change(&service, &caps).await;
    assert!(verdict.is_ok(), "{verdict:?}");
}

/// The timing clauses see a Redis whose grants apply less than they report, and whose
/// renewals report more than they apply, on Redis's own clock (about 0.7 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timing_clauses_catch_a_redis_that_expires_early() {
    let server = RedisServer::start();
    let service = connect(&server).await;
    let caps = Capabilities::redis(Duration::from_millis(300));
    the_timing_clauses_catch_early_expiry(&service, &caps, &caps).await;
}

/// The contract on a fair service (`with_fair(true)`): every clause runs, and every
/// clause holds but the two in [`FIFO_CLAUSES`], which contradict first-in,
/// first-out waiting by design and fail only at the step that does.
///
/// Both make a contender (`conformance contender`) probe the key while it is held
/// (each probe takes, then keeps, a place in the queue for the TTL it asked), let the
/// grant expire, check that the key is free (it is: the TTL is as hard as without the
/// queue), and then expect a *fresh* token to be granted the free key at once. A fair
/// service answers it that it is the contender's turn (`Holder::turn_of`, fence 0),
/// for as long as the contender's place lasts: the contender asked first. Nothing
/// after that step runs for these two clauses. Every other clause, including the
/// rest of the timing clauses, runs as it does on a service that is not fair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_redis_keeps_the_contract_but_where_it_contradicts_fifo() {
    let server = RedisServer::start();
    let service = connect(&server).await.with_fair(true);
    let caps = Capabilities::redis(Duration::from_millis(300));
    let violations = leasehold_conformance::check_all(&service, &caps).await;
    let broken: Vec<&str> = violations.iter().map(|v| v.clause).collect();
    assert_eq!(broken, FIFO_CLAUSES, "{violations:#?}");
    for v in &violations {
        // Only the step where a fresh token meets the contender's turn.
        assert!(
            v.detail.contains("acquire by another token once the")
                && v.detail.contains(
                    "expected Granted, got HeldByAnother(Holder { identity: \"conformance contender\", fence: Fence(0)"
                ),
            "{v}"
        );
    }
}

/// The clauses that expect a fresh token to take a freed key while an earlier
/// contender still waits (see above).
const FIFO_CLAUSES: &[&str] = &["the_ttl_is_hard", "a_renewal_holds_for_the_ttl_it_reports"];
