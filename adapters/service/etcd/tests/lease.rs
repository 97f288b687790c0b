//! Leases driven by the tokio adapter (`leasehold_tokio::acquire`) on real etcd: the
//! watch ending a lease, a member restarting under a held lease, etcd down longer than
//! the TTL (the 3-member faults are in `failover.rs`). Storage behind a `FenceGate`
//! checks that no write of an old holder is admitted after a newer fence.

mod common;

use std::sync::Arc;

use common::{
    assert_busy_with, client, config, hold, identity, proxy_endpoint, renewed_after, service,
    service_on, std_ms, value, within, EtcdCluster, Proxy, Storage,
};
use leasehold::LossReason;
use leasehold_etcd::Renewed;
use leasehold_tokio::{acquire, acquire_with, try_acquire, AcquireOptions, LeaseEnd};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokio_lease_renews_and_releases() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let lease = within(
        5_000,
        acquire_with(
            Arc::new(service.clone()),
            "orders",
            config(2_000),
            AcquireOptions::new().identity(identity("renewer")),
        ),
    )
    .await
    .expect("acquire");
    let mut events = lease.events();
    let start = Instant::now();
    for _ in 0..2 {
        within(2_000, renewed_after(&mut events, start))
            .await
            .expect("renewed");
    }
    assert_eq!(lease.check(), Ok(lease.granted_fence()));
    assert_eq!(
        value(&mut outside, "orders").await,
        Some(format!(
            "{}\n{}\nrenewer",
            lease.token().encode().as_str(),
            lease.granted_fence().0
        )),
        "the value is `<token>\\n<fence>\\n<identity>`"
    );
    assert_eq!(within(2_000, lease.release()).await, LeaseEnd::Released);
    assert_eq!(value(&mut outside, "orders").await, None);
    assert_eq!(service.grants(), 0);
    assert!(lease.check().is_err());
}

/// Right after a renewal (the next one is a whole renew interval away), the key is
/// deleted from outside; then, on another key, the lease is revoked from outside. The
/// watch ends each lease with `Lost(Revoked)` within a fraction of the renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_ends_the_lease_with_revoked_promptly() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    for key in ["deleted", "revoked"] {
        // TTL 3 s: renewals every 1 s.
        let lease = hold(&service, key, 3_000).await;
        let mut events = lease.events();
        within(2_000, renewed_after(&mut events, Instant::now()))
            .await
            .expect("renewed");
        let at = Instant::now();
        match key {
            "deleted" => {
                outside.delete(key, None).await.unwrap();
            }
            _ => {
                let id = service.lease_id(key, lease.token()).expect("tracked");
                outside.lease_revoke(id).await.unwrap();
            }
        }
        let end = within(900, lease.lost()).await;
        let took = at.elapsed();
        assert_eq!(end, LeaseEnd::Lost(LossReason::Revoked), "{key}");
        assert!(lease.check().is_err());
        eprintln!("{key}: outside action → Lost(Revoked) in {took:?} (renew interval 1 s)");
        assert!(took < std_ms(500), "{key}: {took:?}");
    }
}

/// etcd keeps leases (and their keys) in its database; a restarted member restores
/// them with a fresh TTL. A holder whose renewals were only briefly refused keeps its
/// lease: same fence, renewals resume, the watch reconnects without a false loss, and a
/// contender is refused until the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restart_while_holding_keeps_the_lease() {
    let mut cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let storage = Storage::default();
    // TTL 3 s: the safe deadline is ~2.8 s after each renewal is sent.
    let a = hold(&service, "orders", 3_000).await;
    let mut events = a.events();
    within(2_000, renewed_after(&mut events, Instant::now()))
        .await
        .expect("renewed");
    storage.write(a.check().unwrap()).unwrap();

    let down = Instant::now();
    tokio::task::block_in_place(|| cluster.restart(0));
    eprintln!("etcd restarted in {:?}", down.elapsed());
    let renewed = within(3_000, renewed_after(&mut events, down))
        .await
        .expect("the lease survives the restart");
    eprintln!("first renewal after the kill: {:?} later", renewed - down);
    assert_eq!(a.check(), Ok(a.granted_fence()), "same term, same fence");
    storage.write(a.check().unwrap()).unwrap();

    let b_service = service.clone();
    let refused = within(
        3_000,
        try_acquire(Arc::new(b_service), "orders", config(3_000)),
    )
    .await;
    assert_busy_with(refused.err(), a.granted_fence());

    let a_fence = a.granted_fence();
    assert_eq!(within(2_000, a.release()).await, LeaseEnd::Released);
    let b = hold(&service, "orders", 3_000).await;
    assert!(
        b.granted_fence() > a_fence,
        "{} > {a_fence}",
        b.granted_fence()
    );
    storage.write(b.check().unwrap()).unwrap();
    assert!(storage.write(a_fence).is_err(), "A's late write is refused");
    storage.assert_no_stale_admitted();
}

/// etcd is down for longer than the TTL. The holder's gate closes at its safe deadline
/// (`Lost(Expired)`). The restarted member restores the lease with a fresh TTL, so the
/// key is only free a TTL later: the contender gets it then, with a higher fence, and
/// the old holder's late write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_longer_than_the_ttl_loses_the_lease_safely() {
    let mut cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let storage = Storage::default();
    let a = hold(&service, "orders", 2_000).await;
    let a_fence = a.check().unwrap();
    storage.write(a_fence).unwrap();

    let down = Instant::now();
    cluster.kill(0);
    let end = within(3_000, a.lost()).await;
    let a_lost = Instant::now();
    assert_eq!(end, LeaseEnd::Lost(LossReason::Expired));
    assert!(a.check().is_err());
    eprintln!("etcd killed; A lost its lease {:?} later", a_lost - down);

    tokio::task::block_in_place(|| {
        cluster.start_member(0);
        cluster.wait_healthy(0);
    });
    let back = Instant::now();
    let b = within(
        8_000,
        acquire(Arc::new(service.clone()), "orders", config(2_000)),
    )
    .await
    .expect("B acquires once etcd expires A's lease");
    let b_granted = Instant::now();
    eprintln!(
        "etcd back {:?} after the kill; B granted {:?} after that (etcd restored A's lease \
         with a fresh TTL), {:?} after A's gate closed",
        back - down,
        b_granted - back,
        b_granted - a_lost
    );
    assert!(
        b.granted_fence() > a_fence,
        "{} > {a_fence}",
        b.granted_fence()
    );
    assert!(a_lost < b_granted);
    storage.write(b.check().unwrap()).unwrap();
    assert!(storage.write(a_fence).is_err(), "A's late write is refused");
    storage.assert_no_stale_admitted();
    // A's token is not the owner at etcd either.
    let renewed = service
        .try_renew("orders", a.token(), a_fence)
        .await
        .unwrap();
    assert!(matches!(renewed, Renewed::NotOwner(_)), "{renewed:?}");
}

/// Three clients take turns on one key through the tokio adapter, each holding it
/// briefly, writing to fenced storage before every write check. Every grant has a
/// higher fence than the one before, no two holders' checks ever pass at once, and
/// storage never refuses a write made while `check()` passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_take_turns_with_increasing_fences() {
    let cluster = EtcdCluster::single();
    let service = Arc::new(service(&cluster).await);
    let storage = Storage::default();
    let holders = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let grants = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (service, storage, holders, grants) = (
            service.clone(),
            storage.clone(),
            holders.clone(),
            grants.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let lease = acquire(service.clone(), "turns", config(2_000))
                    .await
                    .expect("acquire");
                let inside = holders.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(inside, 0, "two holders at once");
                grants.lock().unwrap().push(lease.granted_fence());
                for _ in 0..5 {
                    let fence = lease.check().expect("held");
                    storage
                        .write(fence)
                        .expect("a current holder's write is admitted");
                    tokio::time::sleep(std_ms(10)).await;
                }
                holders.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(lease.release().await, LeaseEnd::Released);
            }
        }));
    }
    for task in tasks {
        within(30_000, task).await.expect("contender");
    }
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), 9);
    assert!(grants.windows(2).all(|w| w[0] < w[1]), "{grants:?}");
    storage.assert_no_stale_admitted();
}

/// The holder talks to etcd through a proxy that stops forwarding (connections stay
/// open, nothing moves): renewals time out, and the holder's gate closes at its safe
/// deadline — before etcd expires the key, as seen by an outside watcher. A contender
/// connected directly then gets the key with a higher fence; the holder's late write is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_network_closes_the_gate_before_etcd_expires_the_key() {
    let cluster = EtcdCluster::single();
    let proxy = Proxy::start(cluster.client_port(0)).await;
    let through_proxy = service_on(vec![proxy_endpoint(&proxy)]).await;
    let direct = service(&cluster).await;
    let storage = Storage::default();

    let a = hold(&through_proxy, "orders", 2_000).await;
    let a_fence = a.check().unwrap();
    storage.write(a_fence).unwrap();

    // Outside: when does etcd delete the key?
    let mut outside = client(&cluster).await;
    let mut watch = outside.watch("orders", None).await.unwrap();
    let deleted = tokio::spawn(async move {
        while let Ok(Some(answer)) = watch.message().await {
            if answer
                .events()
                .iter()
                .any(|e| e.event_type() == etcd_client::EventType::Delete)
            {
                return Instant::now();
            }
        }
        panic!("the outside watch ended");
    });

    let mut events = a.events();
    within(2_000, renewed_after(&mut events, Instant::now()))
        .await
        .expect("renewed");
    let stalled = Instant::now();
    proxy.stall();

    let end = within(3_000, a.lost()).await;
    let a_lost = Instant::now();
    assert_eq!(end, LeaseEnd::Lost(LossReason::Expired));
    assert!(a.check().is_err());
    let etcd_deleted = within(5_000, deleted).await.unwrap();
    eprintln!(
        "stalled; A's gate closed after {:?}, etcd deleted the key after {:?} ({:?} later)",
        a_lost - stalled,
        etcd_deleted - stalled,
        etcd_deleted - a_lost
    );
    assert!(
        a_lost < etcd_deleted,
        "the gate closes before etcd's expiry"
    );

    let b = within(
        3_000,
        acquire(Arc::new(direct.clone()), "orders", config(2_000)),
    )
    .await
    .expect("B acquires after etcd's expiry");
    assert!(b.granted_fence() > a_fence);
    storage.write(b.check().unwrap()).unwrap();
    assert!(storage.write(a_fence).is_err(), "A's late write is refused");
    storage.assert_no_stale_admitted();
    proxy.resume();
}

/// Copies the directory tree `from` to `to` (a member's data dir, etcd stopped).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A holds and writes; then etcd's revisions go back: its data is lost (a member on
/// tmpfs, a rebuilt volume) or restored from a backup taken before A's grant (without
/// `--bump-revision`). B is granted on that etcd. B's fence must still be above A's,
/// so storage refuses A's late write (a fence from the key's create revision was the
/// same for both: etcd reissues revisions after such a loss).
async fn fences_survive(lose: impl FnOnce(&mut EtcdCluster, &std::path::Path)) {
    let mut cluster = EtcdCluster::single();
    let data = cluster.dir().join("m0");
    let backup = cluster.dir().join("backup");
    tokio::task::block_in_place(|| {
        cluster.stop(0);
        copy_dir(&data, &backup);
        cluster.start_member(0);
        cluster.wait_healthy(0);
    });
    let storage = Storage::default();
    // TTLs up to 3 s: the quarantine after the loss lasts 3 s.
    let service = Arc::new(service(&cluster).await.with_max_ttl(std_ms(3_000)));
    let a = within(
        5_000,
        acquire(Arc::clone(&service), "orders", config(3_000)),
    )
    .await
    .unwrap();
    let a_fence = a.check().unwrap();
    storage.write(a_fence).unwrap();

    tokio::task::block_in_place(|| {
        cluster.kill(0);
        std::fs::remove_dir_all(&data).unwrap();
        lose(&mut cluster, &backup);
        cluster.start_member(0);
        cluster.wait_healthy(0);
    });
    // The data set is new (no epoch marker), or older than what this client saw (the
    // revision went back): nothing is granted for the quarantine.
    let back = Instant::now();
    let b = within(
        8_000,
        acquire(Arc::clone(&service), "orders", config(3_000)),
    )
    .await
    .unwrap();
    assert!(
        back.elapsed() >= std_ms(3_000),
        "granted {:?} after etcd was back, inside the quarantine",
        back.elapsed()
    );
    let b_fence = b.check().unwrap();
    storage.write(b_fence).unwrap();
    assert!(b_fence > a_fence, "A {a_fence:?}, then B {b_fence:?}");
    assert!(storage.write(a_fence).is_err(), "A's late write refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_that_lost_its_data_quarantines_then_hands_out_a_newer_fence() {
    fences_survive(|_, _| {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_restored_from_an_older_backup_quarantines_then_hands_out_a_newer_fence() {
    fences_survive(|cluster, backup| copy_dir(backup, &cluster.dir().join("m0"))).await;
}
