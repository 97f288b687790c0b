//! An etcd that lost grants — restored from a snapshot, or emptied — grants nothing
//! until every grant it may have forgotten has expired: the quarantine, against real
//! `etcd` processes.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use common::*;
use leasehold::{AcquireOutcome, Duration, Refusal};
use leasehold_conformance::{a_lost_state_grants_nothing_until_the_quarantine_ends, Capabilities};
use leasehold_driver::LockService;
use leasehold_etcd::{Acquired, EtcdLockService};
use leasehold_test_support::Contest;

/// The quarantine (the services' `max_ttl`) these tests configure: whole seconds.
const QUARANTINE: StdDuration = StdDuration::from_secs(2);

async fn quarantined_service(endpoints: Vec<String>) -> EtcdLockService {
    init_tracing();
    EtcdLockService::builder(endpoints)
        .request_timeout(std_ms(2_000))
        .connect_timeout(std_ms(500))
        .max_ttl(QUARANTINE)
        .connect()
        .await
        .expect("connect to the test etcd")
}

fn caps() -> Capabilities {
    let mut caps = Capabilities::new(Duration::from_secs(1));
    caps.granularity = Duration::from_secs(1);
    caps.min_ttl = Duration::from_secs(1);
    caps.expiry_slack = Duration::from_millis(1_500);
    caps
}

async fn clause<F: std::future::Future<Output = ()>>(
    service: &EtcdLockService,
    lose: impl FnOnce() -> F,
) {
    let verdict = a_lost_state_grants_nothing_until_the_quarantine_ends(
        service,
        &caps(),
        QUARANTINE.into(),
        lose,
    )
    .await;
    if let Err(violation) = verdict {
        panic!("{violation}");
    }
}

/// Every key deleted (an emptied data set): the epoch marker is gone with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_etcd_starts_a_quarantine() {
    let cluster = EtcdCluster::single();
    let service = quarantined_service(cluster.endpoints()).await;
    let mut raw = client(&cluster).await;
    clause(&service, || async move {
        raw.delete("", Some(etcd_client::DeleteOptions::new().with_all_keys()))
            .await
            .expect("delete every key");
    })
    .await;
}

/// A snapshot from before the grant, restored as an operator would (same name, peer
/// URL and cluster token: the cluster keeps its id and starts again at raft term 1).
/// The client saw a newer revision before the restore: the store went back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_an_older_snapshot_starts_a_quarantine() {
    let cluster = Mutex::new(EtcdCluster::single());
    let dir = scratch_dir("etcd-snapshot");
    let snapshot = dir.path().join("before.db");
    cluster.lock().unwrap().save_snapshot(0, &snapshot);
    let endpoints = cluster.lock().unwrap().endpoints();
    let service = quarantined_service(endpoints).await;
    clause(&service, || async {
        tokio::task::block_in_place(|| cluster.lock().unwrap().restore_snapshot(&snapshot));
    })
    .await;
}

/// The clause can fail: an emptied data set marked new again (a loss nothing records)
/// lets a contender in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clause_catches_a_loss_that_starts_no_quarantine() {
    let cluster = EtcdCluster::single();
    let service = quarantined_service(cluster.endpoints()).await;
    let mut raw = client(&cluster).await;
    let verdict = a_lost_state_grants_nothing_until_the_quarantine_ends(
        &service,
        &caps(),
        QUARANTINE.into(),
        || async {
            raw.delete("", Some(etcd_client::DeleteOptions::new().with_all_keys()))
                .await
                .expect("delete every key");
            cluster.mark_data_set_new();
        },
    )
    .await;
    let violation = verdict.expect_err("an unnoticed loss must break the clause");
    assert!(
        violation
            .detail
            .contains("expected HeldByAnother(quarantine)"),
        "{violation}"
    );
}

/// A new etcd that nobody marked: the first grant waits the quarantine, and a TTL above
/// `max_ttl` is refused for good before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmarked_etcd_quarantines_its_first_grant_and_long_ttls_are_refused() {
    let cluster = EtcdCluster::start_unmarked(1, Timing::FAST);
    let service = quarantined_service(cluster.endpoints()).await;
    let too_long = Duration::from(QUARANTINE).saturating_add(Duration::from_secs(1));
    assert_eq!(
        LockService::acquire(&service, "k", token(), &identity("a"), too_long).await,
        AcquireOutcome::Refused(Refusal::Unsupported)
    );
    let err = service
        .try_acquire("k", token(), &identity("a"), too_long)
        .await
        .unwrap_err();
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        cause.as_deref().is_some_and(|c| c.contains("max_ttl")),
        "{err}: {cause:?}"
    );
    let started = tokio::time::Instant::now();
    match service
        .try_acquire("k", token(), &identity("a"), ms(1_000))
        .await
        .unwrap()
    {
        Acquired::Quarantined { remaining } => {
            assert!(
                remaining <= QUARANTINE.into() && !remaining.is_zero(),
                "{remaining:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    let granted = loop {
        match service
            .try_acquire("k", token(), &identity("a"), ms(1_000))
            .await
            .unwrap()
        {
            Acquired::Granted { .. } => break tokio::time::Instant::now(),
            Acquired::Quarantined { .. } => tokio::time::sleep(std_ms(50)).await,
            other => panic!("{other:?}"),
        }
    };
    let waited = granted - started;
    assert!(
        waited >= QUARANTINE && waited <= QUARANTINE + std_ms(2_000),
        "{waited:?}"
    );
}

/// The end-to-end check: two keys, three clients each (holders and
/// contenders), etcd restored from a snapshot taken before they started (the restore
/// forgets every grant they hold, and their holders still pass `check()` until their
/// next renewal). Every client's
/// `check()` is sampled every millisecond: never two per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_while_clients_run_never_lets_two_holders_pass_check() {
    // Renewals every 2 s: a holder whose grant the restore forgot still passes its
    // check for up to that long after etcd is back, unless nobody else is granted.
    const TTL_MS: u64 = 6_000;
    let cluster = Arc::new(Mutex::new(EtcdCluster::single()));
    let dir = scratch_dir("etcd-snapshot");
    let snapshot = dir.path().join("before.db");
    let endpoints = cluster.lock().unwrap().endpoints();
    // A backup from before any of the grants: the restore forgets every one of them.
    cluster.lock().unwrap().save_snapshot(0, &snapshot);
    let service = Arc::new(
        quarantined_service(endpoints)
            .await
            .with_max_ttl(std_ms(TTL_MS)),
    );
    let contest = Contest::start(
        service,
        &["orders", "payments"],
        3,
        config(TTL_MS),
        std_ms(1_500),
    );
    wait_for("grants on both keys", std_ms(10_000), || async {
        let grants = contest.grants();
        grants.iter().filter(|g| g.key == "orders").count() >= 1
            && grants.iter().filter(|g| g.key == "payments").count() >= 1
    })
    .await;
    let restored = tokio::task::spawn_blocking({
        let cluster = Arc::clone(&cluster);
        move || {
            cluster.lock().unwrap().restore_snapshot(&snapshot);
            tokio::time::Instant::now()
        }
    })
    .await
    .unwrap();
    wait_for("a grant after the restore", std_ms(20_000), || async {
        contest.grants().iter().any(|g| g.at > restored)
    })
    .await;
    tokio::time::sleep(std_ms(1_000)).await;
    let outcome = contest.stop().await;
    let first = outcome.first_grant_since(restored).unwrap();
    eprintln!(
        "first grant {:?} after etcd was back (quarantine {TTL_MS} ms); {} samples, \
         longest gap {:?}, {} grants, {} overlaps",
        first.at - restored,
        outcome.samples,
        outcome.longest_gap,
        outcome.grants.len(),
        outcome.overlaps.len()
    );
    assert!(
        outcome.overlaps.is_empty(),
        "two holders passed check(): {:?}",
        &outcome.overlaps[..outcome.overlaps.len().min(5)]
    );
    assert!(outcome.samples > 1_000, "{} samples", outcome.samples);
    assert!(
        first.at - restored >= std_ms(TTL_MS),
        "granted {:?} after the restore, inside the quarantine",
        first.at - restored
    );
}

/// A quarantine longer than etcd's longest lease is a configuration error, at once.
#[tokio::test]
async fn a_max_ttl_above_etcds_longest_lease_is_refused_at_connect() {
    let err = EtcdLockService::builder(["127.0.0.1:1"])
        .max_ttl(StdDuration::from_secs(10_000_000_000))
        .connect()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), leasehold_etcd::ErrorKind::Config);
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        cause.as_deref().is_some_and(|c| c.contains("max_ttl")),
        "{err}: {cause:?}"
    );
}
