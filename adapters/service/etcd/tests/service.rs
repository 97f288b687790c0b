//! The service's requests against a real single-member etcd: grants, fences, TTLs,
//! contention, outside interference, and a server that is not there or talks garbage.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;

use leasehold::{
    AcquireOutcome, Duration, Fence, Indeterminate, OwnerToken, ReleaseOutcome, RenewOutcome, Term,
};
use leasehold_driver::LockService;
use leasehold_etcd::{Acquired, EtcdLockError, EtcdLockService, NotHeld, Released, Renewed};
use support::{
    leases, ms, service, service_on, std_ms, token, value, wait_for, within, Cluster, Timing,
};

async fn granted(
    service: &EtcdLockService,
    key: &str,
    token: OwnerToken,
    ttl: Duration,
) -> (Fence, Duration, i64) {
    match service.try_acquire(key, token, ttl).await {
        Ok(Acquired::Granted {
            fence, ttl, lease, ..
        }) => (fence, ttl, lease),
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_and_fences_increase() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    let owner = leasehold_etcd::random_owner();

    let mut fences = Vec::new();
    for term in 1..=3 {
        let token = owner.token(Term(term));
        let outcome = LockService::acquire(&service, "orders", token, ms(2_000)).await;
        let AcquireOutcome::Granted { fence, ttl } = outcome else {
            panic!("term {term}: {outcome:?}");
        };
        assert_eq!(ttl, ms(2_000), "etcd granted the 2 s asked for");
        assert_eq!(
            value(&mut outside, "orders").await.as_deref(),
            Some(token.encode().as_str())
        );
        let lease = service
            .lease_id("orders", token)
            .expect("the service tracks the lease");
        let kv = outside.get("orders", None).await.unwrap().kvs()[0].clone();
        assert_eq!(
            (kv.lease(), kv.create_revision()),
            (lease, fence.0 as i64),
            "fence = create_revision"
        );

        assert_eq!(
            LockService::renew(&service, "orders", token, fence, ms(2_000)).await,
            RenewOutcome::Renewed { ttl: ms(2_000) }
        );
        assert_eq!(
            LockService::release(&service, "orders", token).await,
            ReleaseOutcome::Released
        );
        assert_eq!(
            value(&mut outside, "orders").await,
            None,
            "release deleted the key"
        );
        let ttl_left = outside.lease_time_to_live(lease, None).await.unwrap().ttl();
        assert_eq!(ttl_left, -1, "release revoked the lease");
        assert_eq!(service.grants(), 0);

        // Unrelated writes move the revision on; fences must still only grow.
        outside
            .put("unrelated", format!("{term}"), None)
            .await
            .unwrap();
        fences.push(fence);
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences strictly increase: {fences:?}"
    );
    // A released token cannot renew or release again.
    let token = owner.token(Term(1));
    assert_eq!(
        LockService::renew(&service, "orders", token, fences[0], ms(2_000)).await,
        RenewOutcome::NotOwner
    );
    assert_eq!(
        LockService::release(&service, "orders", token).await,
        ReleaseOutcome::NotOwner
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_ttl_is_rounded_up_to_whole_seconds() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    for (asked_ms, secs) in [(1_200, 2), (300, 1), (2_000, 2), (2_001, 3)] {
        let key = format!("ttl-{asked_ms}");
        let (_, ttl, lease) = granted(&service, &key, token(), ms(asked_ms)).await;
        assert_eq!(ttl, Duration::from_secs(secs), "asked {asked_ms} ms");
        let etcd = outside.lease_time_to_live(lease, None).await.unwrap();
        assert_eq!(etcd.granted_ttl(), secs as i64, "what etcd itself says");
    }
}

/// etcd's minimum lease TTL is 1.5 × the election timeout, rounded up to seconds: with
/// a 2 s election timeout it grants 3 s for any smaller request, and the service
/// reports that, not what was asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_ttl_is_what_etcd_granted_not_what_was_asked() {
    let cluster = Cluster::start(1, Timing::SLOW);
    assert_eq!(Timing::SLOW.min_ttl_secs(), 3);
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    let outcome = LockService::acquire(&service, "slow", token(), ms(1_500)).await;
    assert!(
        matches!(outcome, AcquireOutcome::Granted { ttl, .. } if ttl == Duration::from_secs(3)),
        "{outcome:?}"
    );
    let lease = leases(&mut outside).await[0];
    assert_eq!(
        outside
            .lease_time_to_live(lease, None)
            .await
            .unwrap()
            .granted_ttl(),
        3
    );
}

/// A held key is refused to any other token — another owner, or another term of the
/// same owner — and the refusal grants no lease (a waiting contender costs etcd a read
/// per attempt, no writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_by_another_grants_no_lease() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    let (a, b) = (token(), token());
    let (fence, _, lease) = granted(&service, "k", a, ms(2_000)).await;
    let revision = outside
        .get("k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();

    assert_eq!(
        LockService::acquire(&service, "k", b, ms(2_000)).await,
        AcquireOutcome::HeldByAnother
    );
    let a2 = a.owner.token(Term(2));
    assert_eq!(
        LockService::acquire(&service, "k", a2, ms(2_000)).await,
        AcquireOutcome::HeldByAnother
    );
    assert_eq!(
        leases(&mut outside).await,
        [lease],
        "no lease granted for a refusal"
    );
    let after = outside
        .get("k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(after, revision, "refusals wrote nothing");

    assert_eq!(
        service.try_renew("k", b, fence).await.unwrap(),
        Renewed::NotOwner(NotHeld::KeyTaken)
    );
    assert_eq!(
        service.try_release("k", b).await.unwrap(),
        Released::NotOwner
    );
    // A is untouched and renews.
    assert_eq!(
        value(&mut outside, "k").await.as_deref(),
        Some(a.encode().as_str())
    );
    assert!(matches!(
        service.try_renew("k", a, fence).await,
        Ok(Renewed::Extended { .. })
    ));
    assert_eq!(service.lease_id("k", a), Some(lease));
}

/// An acquire whose answer was lost is asked again with the same token: etcd already
/// holds it, so the same fence (and lease) is answered and kept alive; no other lease
/// is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_answer_is_granted_again_with_the_same_fence() {
    let cluster = Cluster::single();
    let mut outside = cluster.client().await;
    let first = service(&cluster).await;
    let a = token();
    let (fence, _, lease) = granted(&first, "k", a, ms(2_000)).await;

    // A second service instance (as after a client restart) knows nothing of it.
    let second = service(&cluster).await;
    match second.try_acquire("k", a, ms(2_000)).await.unwrap() {
        Acquired::Granted {
            fence: again,
            ttl,
            lease: same,
            regranted,
        } => {
            assert_eq!((again, same, regranted), (fence, lease, true));
            assert_eq!(ttl, ms(2_000));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(leases(&mut outside).await, [lease]);
    // Renew and release work from either instance.
    assert!(matches!(
        second.try_renew("k", a, fence).await,
        Ok(Renewed::Extended { .. })
    ));
    assert_eq!(second.try_release("k", a).await.unwrap(), Released::Deleted);
    assert_eq!(
        first.try_renew("k", a, fence).await.unwrap(),
        Renewed::NotOwner(NotHeld::LeaseGone)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_is_not_owner_after_the_lease_is_revoked_from_outside() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    let a = token();
    let (fence, _, lease) = granted(&service, "k", a, ms(2_000)).await;

    outside
        .lease_revoke(lease)
        .await
        .expect("revoke from outside");
    assert_eq!(
        value(&mut outside, "k").await,
        None,
        "the key went with its lease"
    );
    assert_eq!(
        LockService::renew(&service, "k", a, fence, ms(2_000)).await,
        RenewOutcome::NotOwner
    );
    assert_eq!(service.lease_id("k", a), None, "forgotten");
    assert_eq!(
        service.try_renew("k", a, fence).await.unwrap(),
        Renewed::NotOwner(NotHeld::KeyGone)
    );
    // Someone else can have it now, with a higher fence.
    let (_, _, _) = granted(&service, "k", token(), ms(2_000)).await;
}

/// The key is deleted from outside and a late duplicate of the same term's acquire
/// creates it again: a newer grant (new fence) for the very same token. The client
/// still holds the old fence; its renewal must not keep the newer grant alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_never_extends_a_newer_grant_to_the_same_token() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    let a = token();
    let (old, _, _) = granted(&service, "k", a, ms(2_000)).await;
    outside.delete("k", None).await.unwrap();
    let (newer, _, _) = granted(&service, "k", a, ms(2_000)).await;
    assert!(newer > old);
    assert_eq!(
        service.try_renew("k", a, old).await.unwrap(),
        Renewed::NotOwner(NotHeld::KeyTaken)
    );
    assert!(matches!(
        service.try_renew("k", a, newer).await,
        Ok(Renewed::Extended { .. })
    ));
}

/// A key deleted from outside leaves its lease alive: a keep-alive alone still
/// succeeds. The renewal's ownership check is what answers `NotOwner`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_is_not_owner_after_the_key_is_deleted_from_outside() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    let a = token();
    let (fence, _, lease) = granted(&service, "k", a, ms(2_000)).await;

    outside
        .delete("k", None)
        .await
        .expect("delete from outside");
    // etcd-client's keep-alive fails unless the first answer has TTL > 0.
    let _stream = outside
        .lease_keep_alive(lease)
        .await
        .expect("keep-alive alone: the lease still lives");
    assert!(outside.lease_time_to_live(lease, None).await.unwrap().ttl() > 0);

    assert_eq!(
        service.try_renew("k", a, fence).await.unwrap(),
        Renewed::NotOwner(NotHeld::KeyGone)
    );
    wait_for("the orphaned lease revoked", 2_000, || {
        let mut outside = outside.clone();
        async move { leases(&mut outside).await.is_empty() }
    })
    .await;

    // Deleted and created again with our value but by someone else (another lease):
    // not ours either.
    let (fence, _, lease) = granted(&service, "k2", a, ms(2_000)).await;
    outside.delete("k2", None).await.unwrap();
    let foreign = outside.lease_grant(5, None).await.unwrap().id();
    outside
        .put(
            "k2",
            a.encode().as_str(),
            Some(etcd_client::PutOptions::new().with_lease(foreign)),
        )
        .await
        .unwrap();
    assert_eq!(
        LockService::renew(&service, "k2", a, fence, ms(2_000)).await,
        RenewOutcome::NotOwner
    );
    let _ = lease;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_holding_a_foreign_value_is_never_ours() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;
    let a = token();

    // Garbage with no lease.
    outside
        .put("k", "\u{0}\u{ff}not a token", None)
        .await
        .unwrap();
    assert_eq!(
        LockService::acquire(&service, "k", a, ms(2_000)).await,
        AcquireOutcome::HeldByAnother
    );
    assert_eq!(
        LockService::renew(&service, "k", a, Fence(1), ms(2_000)).await,
        RenewOutcome::NotOwner
    );
    assert_eq!(
        LockService::release(&service, "k", a).await,
        ReleaseOutcome::NotOwner
    );
    assert_eq!(
        value(&mut outside, "k").await.as_deref(),
        Some("\u{0}\u{ff}not a token")
    );

    // Our exact token, but without a lease (written by hand): not a grant we can renew.
    outside.put("k3", a.encode().as_str(), None).await.unwrap();
    assert_eq!(
        LockService::acquire(&service, "k3", a, ms(2_000)).await,
        AcquireOutcome::HeldByAnother
    );

    // Held, then overwritten from outside while the lease lives.
    let (fence2, _, _) = granted(&service, "k2", a, ms(2_000)).await;
    outside.put("k2", "someone else", None).await.unwrap();
    assert_eq!(
        service.try_renew("k2", a, fence2).await.unwrap(),
        Renewed::NotOwner(NotHeld::KeyTaken)
    );
    assert_eq!(
        service.try_release("k2", a).await.unwrap(),
        Released::NotOwner
    );
    assert_eq!(
        value(&mut outside, "k2").await.as_deref(),
        Some("someone else")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_reports_deletion_overwrite_and_expiry() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let mut outside = cluster.client().await;

    // Deleted while watched.
    let a = token();
    let (fence, _, _) = granted(&service, "del", a, ms(1_000)).await;
    let watch = tokio::spawn({
        let service = service.clone();
        async move { service.watch_revocation("del", a, fence).await }
    });
    // Give the watch a chance to be established: if the delete comes first, the
    // initial read sees it instead; both must answer KeyGone.
    tokio::task::yield_now().await;
    outside.delete("del", None).await.unwrap();
    let revoked = within(2_000, watch).await.unwrap().unwrap();
    assert_eq!(revoked.why, NotHeld::KeyGone);

    // Overwritten.
    let (fence, _, _) = granted(&service, "put", a, ms(1_000)).await;
    let watch = tokio::spawn({
        let service = service.clone();
        async move { service.watch_revocation("put", a, fence).await }
    });
    outside.put("put", "mine now", None).await.unwrap();
    assert_eq!(
        within(2_000, watch).await.unwrap().unwrap().why,
        NotHeld::KeyTaken
    );

    // Expired with its lease (1 s, never renewed): etcd deletes the key.
    let (fence, _, _) = granted(&service, "exp", a, ms(1_000)).await;
    let revoked = within(5_000, service.watch_revocation("exp", a, fence))
        .await
        .unwrap();
    assert_eq!(revoked.why, NotHeld::KeyGone);

    // Already gone when the watch starts: answered from the initial read.
    let revoked = within(1_000, service.watch_revocation("exp", a, fence))
        .await
        .unwrap();
    assert_eq!(revoked.why, NotHeld::KeyGone);
    // The trait's future completes the same way.
    within(1_000, LockService::revoked(&service, "exp", a, fence)).await;
}

/// Nobody listens: every request is indeterminate (no panic, no grant), within the
/// request timeout; the revocation watch keeps retrying and never reports a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_indeterminate() {
    let port = support::etcd::free_port();
    let service = EtcdLockService::builder([format!("127.0.0.1:{port}")])
        .request_timeout(Some(std_ms(300)))
        .connect_timeout(std_ms(100))
        .connect()
        .await
        .expect("connecting is lazy");
    let a = token();
    let started = std::time::Instant::now();
    let outcome = LockService::acquire(&service, "k", a, ms(2_000)).await;
    assert!(
        matches!(
            outcome,
            AcquireOutcome::Indeterminate(Indeterminate::Transport | Indeterminate::Timeout)
        ),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < std_ms(1_000),
        "bounded by the request timeout"
    );
    assert!(matches!(
        LockService::renew(&service, "k", a, Fence(1), ms(2_000)).await,
        RenewOutcome::Indeterminate(_)
    ));
    assert!(matches!(
        LockService::release(&service, "k", a).await,
        ReleaseOutcome::Indeterminate(_)
    ));
    let err = service.try_acquire("k", a, ms(2_000)).await.unwrap_err();
    assert!(
        matches!(
            err,
            EtcdLockError::Transport { .. } | EtcdLockError::Timeout { .. }
        ),
        "{err:?}"
    );
    assert!(
        tokio::time::timeout(
            std_ms(500),
            LockService::revoked(&service, "k", a, Fence(7))
        )
        .await
        .is_err(),
        "an unreachable server is no evidence of revocation"
    );
}

/// A "server" that answers every connection with bytes that are not HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_answers_are_indeterminate() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let _ = stream.set_read_timeout(Some(std_ms(200)));
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello\xff\x00\x13garbage",
                );
            });
        }
    });
    let service = service_on(vec![format!("http://127.0.0.1:{port}")]).await;
    let service = service.with_request_timeout(Some(std_ms(500)));
    let a = token();
    for _ in 0..3 {
        let outcome = LockService::acquire(&service, "k", a, ms(2_000)).await;
        assert!(
            matches!(outcome, AcquireOutcome::Indeterminate(_)),
            "{outcome:?}"
        );
        let outcome = LockService::renew(&service, "k", a, Fence(1), ms(2_000)).await;
        assert!(
            matches!(outcome, RenewOutcome::Indeterminate(_)),
            "{outcome:?}"
        );
        let outcome = LockService::release(&service, "k", a).await;
        assert!(
            matches!(outcome, ReleaseOutcome::Indeterminate(_)),
            "{outcome:?}"
        );
    }
    let err = service.try_acquire("k", a, ms(2_000)).await.unwrap_err();
    eprintln!("garbage server: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_etcd_cannot_express_are_refused_before_sending() {
    let cluster = Cluster::single();
    let service = service(&cluster).await;
    let a = token();
    let err = service.try_acquire("", a, ms(2_000)).await.unwrap_err();
    assert!(
        matches!(err, EtcdLockError::InvalidRequest { .. }),
        "{err:?}"
    );
    let err = service
        .try_acquire("k", a, Duration::from_secs(9_000_000_001))
        .await
        .unwrap_err();
    assert!(
        matches!(err, EtcdLockError::InvalidRequest { .. }),
        "{err:?}"
    );
    assert_eq!(
        LockService::acquire(&service, "", a, ms(2_000)).await,
        AcquireOutcome::Indeterminate(Indeterminate::Protocol)
    );
    // Nothing was granted.
    let mut outside = cluster.client().await;
    assert!(leases(&mut outside).await.is_empty());
}

/// Without the `etcd` binary the tests fail, naming the package to install.
#[test]
fn a_missing_etcd_binary_fails_naming_the_debian_package() {
    let empty = std::env::temp_dir().join(format!(
        "leasehold-etcd-no-binary-here-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&empty).unwrap();
    let failure = std::panic::catch_unwind(|| {
        support::etcd::find_binary(Some(empty.clone().into_os_string()))
    })
    .expect_err("no etcd in an empty directory");
    let message = failure
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| failure.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    let _ = std::fs::remove_dir(&empty);
    assert!(message.contains("etcd-server"), "{message}");
    // And the real lookup finds it on this machine.
    assert!(support::etcd::binary().is_file());
}
