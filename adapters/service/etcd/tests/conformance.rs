//! The service contract of `leasehold-driver`, clause by clause
//! (`leasehold-conformance`), against a real single-member etcd.

use std::time::Duration as StdDuration;

use leasehold::Duration;
use leasehold_conformance::{run_all, Capabilities};
use leasehold_etcd::EtcdLockService;
use leasehold_test_support::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_the_contract() {
    // Timing::FAST: etcd's minimum lease TTL is 1 s.
    let cluster = EtcdCluster::single();
    let service = EtcdLockService::builder(cluster.endpoints())
        .request_timeout(StdDuration::from_secs(2))
        .connect()
        .await
        .expect("connect to the test etcd");
    let mut caps = Capabilities::new(Duration::from_secs(1));
    // Leases are whole seconds, at least etcd's minimum.
    caps.granularity = Duration::from_secs(1);
    caps.min_ttl = Duration::from_secs(1);
    // etcd's lessor checks expiry every 500 ms, then revokes through raft: a key
    // outlives its TTL by up to that, plus scheduling on a loaded machine.
    caps.expiry_slack = Duration::from_millis(1_500);
    // The revocation watch sees a release (the key's delete).
    caps.revocation_watch = true;
    run_all(&service, &caps).await;
}
