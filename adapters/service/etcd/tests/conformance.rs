//! The service contract of `leasehold-driver`, clause by clause
//! (`leasehold-conformance`), against a real single-member etcd.

use std::time::Duration as StdDuration;

use leasehold::Duration;
use leasehold_conformance::breach::{overstated_renewals_are_caught, short_grants_are_caught};
use leasehold_conformance::{run_all, Capabilities};
use leasehold_etcd::EtcdLockService;
use leasehold_test_support::EtcdCluster;

/// What the suite may expect of a single-member etcd (`Timing::FAST`), asking `ttl`.
fn caps(ttl: Duration) -> Capabilities {
    let mut caps = Capabilities::new(ttl);
    // Leases are whole seconds, at least etcd's minimum.
    caps.granularity = Duration::from_secs(1);
    caps.min_ttl = Duration::from_secs(1);
    // etcd's lessor checks expiry every 500 ms, then revokes through raft: a key
    // outlives its TTL by up to that, plus scheduling on a loaded machine.
    caps.expiry_slack = Duration::from_millis(1_500);
    // A contender's read may be handled this long after its send (a txn, fsync, a
    // loaded machine): a renewal must hold the key until 700 ms of its 1 s.
    caps.tolerance = Duration::from_millis(300);
    // The revocation watch sees a release (the key's delete).
    caps.revocation_watch = true;
    caps.holder_watch = true;
    caps
}

async fn connect(cluster: &EtcdCluster) -> EtcdLockService {
    EtcdLockService::builder(cluster.endpoints())
        .request_timeout(StdDuration::from_secs(2))
        .connect()
        .await
        .expect("connect to the test etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_the_contract() {
    // Timing::FAST: etcd's minimum lease TTL is 1 s.
    let cluster = EtcdCluster::single();
    let service = connect(&cluster).await;
    run_all(&service, &caps(Duration::from_secs(1))).await;
}

/// The timing clauses see an etcd whose grants apply less than they report, and whose
/// renewals report more than they apply. Whole-second leases and etcd's expiry lag
/// need room: the grants ask 4 s and apply 1 s, the renewals apply 1 s and report
/// 4.1 s (about 4.3 s in all: the two at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timing_clauses_catch_an_etcd_that_expires_early() {
    let cluster = EtcdCluster::single();
    let service = connect(&cluster).await;
    let (grants, renewals) = (caps(Duration::from_secs(4)), caps(Duration::from_secs(1)));
    tokio::join!(
        short_grants_are_caught(&service, &grants),
        overstated_renewals_are_caught(&service, &renewals)
    );
}

/// The whole contract against a fair service (`with_fair(true)`): every clause runs,
/// none is skipped, and none contradicts arrival order. A contender a clause turns
/// away takes a place in the queue (its own per-clause key); no clause then expects a
/// third token to take the freed key ahead of it: the next grant of a key in the suite
/// goes to the holder again, to the contender that was turned away (the head of the
/// queue), or to a key nobody queued for. The places left behind expire with their
/// TTL. (The `breach` tests above check the suite itself, so they run only on a
/// plain service.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_etcd_keeps_the_contract() {
    let cluster = EtcdCluster::single();
    let service = connect(&cluster).await.with_fair(true);
    run_all(&service, &caps(Duration::from_secs(1))).await;
}
