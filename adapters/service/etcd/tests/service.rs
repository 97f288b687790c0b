//! The service's requests against a real single-member etcd: grants, fences, TTLs,
//! holders, contention, outside interference, bad input, and a server that is not
//! there or talks garbage.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use common::{
    binary, binary_in, client, counter, free_port, identity, leases, ms, proxy_endpoint,
    scratch_dir, service, service_on, std_ms, token, value, wait_for, within, EtcdCluster, Proxy,
    Timing,
};
use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, Indeterminate, OwnerToken,
    Refusal, ReleaseOutcome, RenewOutcome, Term,
};
use leasehold_driver::LockService;
use leasehold_etcd::{Acquired, ErrorKind, EtcdLockService, NotHeld, Released, Renewed};

async fn granted(
    service: &EtcdLockService,
    key: &str,
    token: OwnerToken,
    ttl: Duration,
) -> (Fence, Duration, i64) {
    match service
        .try_acquire(key, token, &identity("test"), ttl)
        .await
    {
        Ok(Acquired::Granted {
            fence, ttl, lease, ..
        }) => (fence, ttl, lease),
        other => panic!("expected a grant of {key}, got {other:?}"),
    }
}

/// What this crate stores for `token` granted `fence`, presenting `identity`.
fn stored(token: OwnerToken, fence: Fence, identity: &str) -> String {
    format!("{}\n{}\n{identity}", token.encode().as_str(), fence.0)
}

/// The wall clock in µs since the Unix epoch.
fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renew_release_and_fences_increase() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let owner = leasehold_etcd::random_owner().expect("an OS random source");
    let me = identity("host-7:4711");

    let mut fences = Vec::new();
    for term in 1..=3 {
        let token = owner.token(Term(term));
        let before = wall_micros();
        let outcome = LockService::acquire(&service, "orders", token, &me, ms(2_000)).await;
        let AcquireOutcome::Granted { fence, ttl } = outcome else {
            panic!("term {term}: {outcome:?}");
        };
        assert_eq!(ttl, ms(2_000), "etcd granted the 2 s asked for");
        assert_eq!(
            value(&mut outside, "orders").await,
            Some(stored(token, fence, "host-7:4711")),
            "the value is `<token>\\n<fence>\\n<identity>`"
        );
        let lease = service
            .lease_id("orders", token)
            .expect("the service tracks the lease");
        let kv = outside.get("orders", None).await.unwrap().kvs()[0].clone();
        assert_eq!(kv.lease(), lease);
        assert_eq!(
            value(&mut outside, "orders{fence}").await,
            Some(fence.0.to_string()),
            "the counter holds the last grant's fence"
        );
        assert!(
            fence.0 >= before && fence.0 <= wall_micros(),
            "the fence is at least the wall clock in µs at the grant: {fence:?}"
        );

        assert_eq!(
            LockService::renew(&service, "orders", token, fence, ttl).await,
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
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
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
/// reports that, not what was asked. Renewals (asked for the granted TTL, as the core
/// does) answer the TTL the keep-alive applied — the lease's granted 3 s — even when
/// etcd's remaining-time read-back is already lower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_ttl_is_what_etcd_granted_and_renewals_answer_it() {
    let cluster = EtcdCluster::start(1, Timing::SLOW);
    assert_eq!(Timing::SLOW.min_ttl_secs(), 3);
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let a = token();
    let outcome = LockService::acquire(&service, "slow", a, &identity("a"), ms(1_500)).await;
    let AcquireOutcome::Granted { fence, ttl } = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(ttl, Duration::from_secs(3));
    let lease = leases(&mut outside).await[0];
    assert_eq!(
        outside
            .lease_time_to_live(lease, None)
            .await
            .unwrap()
            .granted_ttl(),
        3
    );
    for _ in 0..3 {
        let outcome = LockService::renew(&service, "slow", a, fence, ttl).await;
        assert_eq!(outcome, RenewOutcome::Renewed { ttl }, "r = g, never less");
        // etcd's read-back counts down in whole seconds, rounded down: after any
        // elapsed time it is below the TTL applied.
        let left = outside.lease_time_to_live(lease, None).await.unwrap().ttl();
        assert!(left <= 3, "{left}");
    }
    // The same token acquiring again (its answer lost) gets the same fence, and the
    // TTL of the existing lease.
    let again = LockService::acquire(&service, "slow", a, &identity("a"), ms(1_500)).await;
    assert_eq!(again, AcquireOutcome::Granted { fence, ttl });
}

/// A held key is refused to any other token — another owner, or another term of the
/// same owner — with the holder's identity, fence and remaining TTL; the refusal grants
/// no lease (a waiting contender costs etcd reads, no writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_by_another_carries_the_holder_and_grants_no_lease() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let (a, b) = (token(), token());
    let a_id = identity("worker-a pid 12");
    let AcquireOutcome::Granted { fence, .. } =
        LockService::acquire(&service, "k", a, &a_id, ms(3_000)).await
    else {
        panic!("a is granted");
    };
    let lease = service.lease_id("k", a).unwrap();
    let revision = outside
        .get("k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();

    for contender in [b, a.owner.token(Term(2))] {
        let outcome =
            LockService::acquire(&service, "k", contender, &identity("b"), ms(3_000)).await;
        let AcquireOutcome::HeldByAnother(Holder {
            identity,
            fence: held_fence,
            remaining,
        }) = outcome
        else {
            panic!("{outcome:?}");
        };
        assert_eq!((identity, held_fence), (a_id, fence));
        assert!(
            remaining > Duration::ZERO && remaining <= Duration::from_secs(3),
            "{remaining:?}"
        );
    }
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
        value(&mut outside, "k").await,
        Some(stored(a, fence, "worker-a pid 12"))
    );
    assert!(matches!(
        service.try_renew("k", a, fence).await,
        Ok(Renewed::Renewed { .. })
    ));
    assert_eq!(service.lease_id("k", a), Some(lease));
}

/// Contenders acquiring a free key at the same moment: several read it free and grant
/// themselves a lease (counted by etcd's `etcd_debugging_lease_granted_total`), and
/// the transaction decides. Exactly one is granted; every
/// other one gets `HeldByAnother` naming the winner, and the leases the losers granted
/// themselves are revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_a_free_key_grant_exactly_one() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let port = cluster.client_port(0);
    let granted_total = || counter(port, "etcd_debugging_lease_granted_total");
    let mut raced = 0;
    for round in 0..5 {
        let grants_before = granted_total();
        let key = format!("race-{round}");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(6));
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let (service, key, barrier) = (service.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    let me = identity(&format!("contender-{i}"));
                    barrier.wait().await;
                    let outcome =
                        LockService::acquire(&service, &key, token(), &me, ms(2_000)).await;
                    (me, outcome)
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(within(5_000, task).await.unwrap());
        }
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|(me, outcome)| match outcome {
                AcquireOutcome::Granted { fence, .. } => Some((*me, *fence)),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        let (winner, fence) = winners[0];
        for (_, outcome) in &outcomes {
            match outcome {
                AcquireOutcome::Granted { .. } => {}
                AcquireOutcome::HeldByAnother(holder) => {
                    assert_eq!((holder.identity, holder.fence), (winner, fence));
                }
                other => panic!("{other:?}"),
            }
        }
        if granted_total() - grants_before > 1 {
            raced += 1;
        }
        wait_for("the losers' leases revoked", std_ms(3_000), || {
            let mut outside = outside.clone();
            async move { leases(&mut outside).await.len() == 1 }
        })
        .await;
        outside.delete(key.as_str(), None).await.unwrap();
        for lease in leases(&mut outside).await {
            outside.lease_revoke(lease).await.unwrap();
        }
    }
    eprintln!("rounds in which a loser had granted itself a lease: {raced} of 5");
    // etcd's own lease-grant counter shows the path under test was taken.
    assert!(
        raced > 0,
        "no round raced: the transaction's refusal path went untested"
    );
}

/// `holder` reports who holds a key (identity, fence, remaining TTL of its lease), or
/// `Free`, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_reports_identity_fence_and_remaining_or_free() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    assert_eq!(
        LockService::holder(&service, "nobody").await,
        HolderOutcome::Free
    );

    let a = token();
    let (fence, ttl, lease) = granted(&service, "k", a, ms(3_000)).await;
    let before = outside
        .get("k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let HolderOutcome::Held(holder) = LockService::holder(&service, "k").await else {
        panic!("held");
    };
    assert_eq!(holder.identity, identity("test"));
    assert_eq!(holder.fence, fence);
    // etcd's LeaseTimeToLive, in whole seconds rounded down.
    let etcd_says = outside.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(holder.remaining <= ttl, "{:?}", holder.remaining);
    assert!(
        holder.remaining.as_millis() / 1_000 + 1 >= etcd_says as u64,
        "{:?} vs etcd {etcd_says} s",
        holder.remaining
    );
    assert!(
        holder.remaining >= Duration::from_secs(1),
        "{:?}",
        holder.remaining
    );
    let after = outside
        .get("k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(before, after, "the query wrote nothing");

    // An anonymous holder.
    granted(&service, "anon", a, ms(2_000)).await;
    outside.delete("anon", None).await.unwrap();
    let AcquireOutcome::Granted { .. } =
        LockService::acquire(&service, "anon", a, &Identity::EMPTY, ms(2_000)).await
    else {
        panic!("granted");
    };
    let HolderOutcome::Held(holder) = LockService::holder(&service, "anon").await else {
        panic!("held");
    };
    assert!(holder.identity.is_empty());

    assert_eq!(
        service.try_release("k", a).await.unwrap(),
        Released::Released
    );
    assert_eq!(
        LockService::holder(&service, "k").await,
        HolderOutcome::Free
    );
}

/// An acquire whose answer was lost is asked again with the same token: etcd already
/// holds it, so the same fence (and lease) is answered and kept alive; no other lease
/// is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_answer_is_granted_again_with_the_same_fence() {
    let cluster = EtcdCluster::single();
    let mut outside = client(&cluster).await;
    let first = service(&cluster).await;
    let a = token();
    let (fence, _, lease) = granted(&first, "k", a, ms(2_000)).await;

    // A second service instance (as after a client restart) knows nothing of it.
    let second = service(&cluster).await;
    match second
        .try_acquire("k", a, &identity("test"), ms(2_000))
        .await
        .unwrap()
    {
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
        Ok(Renewed::Renewed { .. })
    ));
    assert_eq!(
        second.try_release("k", a).await.unwrap(),
        Released::Released
    );
    assert_eq!(
        first.try_renew("k", a, fence).await.unwrap(),
        Renewed::NotOwner(NotHeld::LeaseGone)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_is_not_owner_after_the_lease_is_revoked_from_outside() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
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
    let (newer, _, _) = granted(&service, "k", token(), ms(2_000)).await;
    assert!(newer > fence);
}

/// The key is deleted from outside and a late duplicate of the same term's acquire
/// creates it again: a newer grant (new fence) for the very same token. The client
/// still holds the old fence; its renewal (right token, older fence) is `NotOwner` and
/// must not keep the newer grant alive — from this instance, and from one that never
/// saw either grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_with_the_right_token_and_an_older_fence_is_not_owner() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let a = token();
    let (old, _, _) = granted(&service, "k", a, ms(2_000)).await;
    outside.delete("k", None).await.unwrap();
    let (newer, _, lease) = granted(&service, "k", a, ms(2_000)).await;
    assert!(newer > old);
    assert_eq!(
        LockService::renew(&service, "k", a, old, ms(2_000)).await,
        RenewOutcome::NotOwner
    );
    assert_eq!(
        service.try_renew("k", a, old).await.unwrap(),
        Renewed::NotOwner(NotHeld::NewerGrant)
    );
    let fresh = service_on(cluster.endpoints()).await;
    assert_eq!(
        LockService::renew(&fresh, "k", a, old, ms(2_000)).await,
        RenewOutcome::NotOwner
    );
    assert_eq!(
        service.lease_id("k", a),
        Some(lease),
        "the newer grant is kept"
    );
    assert!(matches!(
        service.try_renew("k", a, newer).await,
        Ok(Renewed::Renewed { .. })
    ));

    // The other way round: an instance that remembers the *older* grant is asked to
    // renew the newer one (made through another instance): it asks etcd, and renews.
    let (older, _, _) = granted(&service, "k2", a, ms(2_000)).await;
    outside.delete("k2", None).await.unwrap();
    let (newer, _, _) = granted(&fresh, "k2", a, ms(2_000)).await;
    assert!(newer > older);
    assert!(matches!(
        service.try_renew("k2", a, newer).await,
        Ok(Renewed::Renewed { .. })
    ));
    assert_eq!(
        service.try_renew("k2", a, older).await.unwrap(),
        Renewed::NotOwner(NotHeld::NewerGrant)
    );
}

/// A key deleted from outside leaves its lease alive: a keep-alive alone still
/// succeeds. The renewal's ownership check is what answers `NotOwner`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_is_not_owner_after_the_key_is_deleted_from_outside() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
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
    wait_for("the orphaned lease revoked", std_ms(2_000), || {
        let mut outside = outside.clone();
        async move { leases(&mut outside).await.is_empty() }
    })
    .await;

    // Deleted and created again with our value but by someone else (another lease):
    // not ours either.
    let (fence, _, _) = granted(&service, "k2", a, ms(2_000)).await;
    outside.delete("k2", None).await.unwrap();
    let foreign = outside.lease_grant(5, None).await.unwrap().id();
    outside
        .put(
            "k2",
            stored(a, fence, "test"),
            Some(etcd_client::PutOptions::new().with_lease(foreign)),
        )
        .await
        .unwrap();
    assert_eq!(
        LockService::renew(&service, "k2", a, fence, ms(2_000)).await,
        RenewOutcome::NotOwner
    );
}

/// A key holding a value this crate did not write — garbage, a bare token (no
/// identity), or a grant's value without a lease — is a final refusal for acquire and
/// holder (`WrongType`) and `NotOwner` for renew and release; it is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_holding_a_foreign_value_is_wrong_type() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let a = token();
    let id = identity("a");

    let foreign = [
        ("garbage", "\u{0}\u{ff}not a token".to_owned()),
        ("bare", a.encode().as_str().to_owned()),
        ("no-lease", stored(a, Fence(1), "a")),
    ];
    for (key, written) in &foreign {
        outside.put(*key, written.as_str(), None).await.unwrap();
        assert_eq!(
            LockService::acquire(&service, key, a, &id, ms(2_000)).await,
            AcquireOutcome::Refused(Refusal::WrongType),
            "{key}"
        );
        assert_eq!(
            LockService::holder(&service, key).await,
            HolderOutcome::Refused(Refusal::WrongType),
            "{key}"
        );
        assert_eq!(
            LockService::renew(&service, key, a, Fence(1), ms(2_000)).await,
            RenewOutcome::NotOwner,
            "{key}"
        );
        assert_eq!(
            LockService::release(&service, key, a).await,
            ReleaseOutcome::NotOwner,
            "{key}"
        );
        assert_eq!(value(&mut outside, key).await.as_ref(), Some(written));
    }
    let err = service
        .try_acquire("garbage", a, &id, ms(2_000))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType);
    assert!(err.to_string().contains("\"garbage\""), "{err}");
    assert!(leases(&mut outside).await.is_empty(), "no lease granted");

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
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;

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

/// Keys that break the key rules are refused at once, without a round trip: the
/// service here points at a port nobody listens on, with a long request timeout, so
/// any request sent would take seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_keys_are_refused_at_once_without_a_round_trip() {
    let port = free_port();
    let service = EtcdLockService::builder([format!("127.0.0.1:{port}")])
        .request_timeout(std_ms(10_000))
        .connect()
        .await
        .expect("connecting is lazy");
    let a = token();
    let long = "x".repeat(leasehold::MAX_KEY_LEN + 1);
    for key in ["", "a{b}", "a}", "line\nbreak", long.as_str()] {
        let started = std::time::Instant::now();
        assert_eq!(
            LockService::acquire(&service, key, a, &identity("a"), ms(2_000)).await,
            AcquireOutcome::Refused(Refusal::InvalidKey),
            "{key:?}"
        );
        assert_eq!(
            LockService::renew(&service, key, a, Fence(1), ms(2_000)).await,
            RenewOutcome::Refused(Refusal::InvalidKey)
        );
        assert_eq!(
            LockService::release(&service, key, a).await,
            ReleaseOutcome::Refused(Refusal::InvalidKey)
        );
        assert_eq!(
            LockService::holder(&service, key).await,
            HolderOutcome::Refused(Refusal::InvalidKey)
        );
        assert!(
            started.elapsed() < std_ms(100),
            "{key:?}: {:?}",
            started.elapsed()
        );
    }
    let err = service
        .try_acquire("a{b}", a, &identity("a"), ms(2_000))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
    assert_eq!(
        std::error::Error::source(&err).unwrap().to_string(),
        leasehold::check_key("a{b}").unwrap_err().to_string()
    );
    // The watch refuses too (it would retry forever otherwise).
    assert_eq!(
        service
            .watch_revocation("", a, Fence(1))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidKey
    );
}

/// A TTL above etcd's maximum lease TTL cannot be granted: a final refusal, nothing
/// sent, nothing granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_etcd_cannot_grant_is_refused() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let too_long = Duration::from_secs(9_000_000_001);
    assert_eq!(
        LockService::acquire(&service, "k", token(), &identity("a"), too_long).await,
        AcquireOutcome::Refused(Refusal::Unsupported)
    );
    let mut outside = client(&cluster).await;
    assert!(leases(&mut outside).await.is_empty());
}

/// Nobody listens: with the default settings every request is indeterminate (no
/// panic, no grant) within the request timeout (5 s), never a hang; with short
/// timeouts, within those. The revocation watch keeps retrying and never reports a
/// loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_indeterminate_within_the_timeouts() {
    let port = free_port();
    let a = token();
    let id = identity("a");

    let defaults = EtcdLockService::connect([format!("127.0.0.1:{port}")])
        .await
        .expect("connecting is lazy");
    let started = std::time::Instant::now();
    let outcome = within(
        10_000,
        LockService::acquire(&defaults, "k", a, &id, ms(2_000)),
    )
    .await;
    let took = started.elapsed();
    eprintln!("default settings, nobody listening: {outcome:?} after {took:?}");
    assert!(
        matches!(
            outcome,
            AcquireOutcome::Indeterminate(Indeterminate::Transport | Indeterminate::Timeout)
        ),
        "{outcome:?}"
    );
    assert!(took < std_ms(5_500), "{took:?}");

    let service = EtcdLockService::builder([format!("127.0.0.1:{port}")])
        .request_timeout(std_ms(300))
        .connect_timeout(std_ms(100))
        .connect()
        .await
        .expect("connecting is lazy");
    let started = std::time::Instant::now();
    let outcome = LockService::acquire(&service, "k", a, &id, ms(2_000)).await;
    assert!(
        matches!(
            outcome,
            AcquireOutcome::Indeterminate(Indeterminate::Transport | Indeterminate::Timeout)
        ),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < std_ms(1_000),
        "bounded by the request timeout: {:?}",
        started.elapsed()
    );
    assert!(matches!(
        LockService::renew(&service, "k", a, Fence(1), ms(2_000)).await,
        RenewOutcome::Indeterminate(_)
    ));
    assert!(matches!(
        LockService::release(&service, "k", a).await,
        ReleaseOutcome::Indeterminate(_)
    ));
    assert!(matches!(
        LockService::holder(&service, "k").await,
        HolderOutcome::Indeterminate(_)
    ));
    let err = service
        .try_acquire("k", a, &id, ms(2_000))
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Transport | ErrorKind::Timeout(_)),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    eprintln!("{text}");
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

/// With a user, connecting authenticates (a request): with nobody listening it fails
/// within the connect timeout plus the request timeout, naming the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_with_a_user_to_nobody_fails_promptly() {
    let port = free_port();
    let started = std::time::Instant::now();
    let connecting = EtcdLockService::builder([format!("127.0.0.1:{port}")])
        .request_timeout(std_ms(300))
        .connect_timeout(std_ms(100))
        .user("app", "secret")
        .connect();
    // A hang fails the test instead of stalling it.
    let err = within(3_000, connecting)
        .await
        .expect_err("nobody to authenticate with");
    let took = started.elapsed();
    eprintln!("{err} ({took:?})");
    assert!(took < std_ms(1_000), "{took:?}");
    assert!(
        matches!(err.kind(), ErrorKind::Transport | ErrorKind::Timeout(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")));
}

/// A peer that accepts TCP connections and never answers (a hung process, a
/// black-holing middlebox): requests time out within the request timeout, and a
/// connect that must authenticate within the connect plus request timeouts — never a
/// hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_times_out_never_hangs() {
    // Bound, listening, never accepted: the kernel completes TCP handshakes into the
    // backlog, and nothing ever answers the HTTP/2 preface.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("127.0.0.1:{}", silent.local_addr().unwrap().port());
    let service = EtcdLockService::builder([endpoint.clone()])
        .request_timeout(std_ms(300))
        .connect_timeout(std_ms(200))
        .connect()
        .await
        .expect("connecting is lazy");
    let a = token();
    let started = std::time::Instant::now();
    let outcome = within(
        3_000,
        LockService::acquire(&service, "k", a, &identity("a"), ms(2_000)),
    )
    .await;
    let took = started.elapsed();
    assert!(
        matches!(
            outcome,
            AcquireOutcome::Indeterminate(Indeterminate::Timeout | Indeterminate::Transport)
        ),
        "{outcome:?}"
    );
    assert!(took < std_ms(1_000), "{took:?}");
    let started = std::time::Instant::now();
    let connecting = EtcdLockService::builder([endpoint.clone()])
        .request_timeout(std_ms(300))
        .connect_timeout(std_ms(200))
        .user("app", "secret")
        .connect();
    // A hang fails the test instead of stalling it.
    let err = within(3_000, connecting)
        .await
        .expect_err("nobody answers the authentication");
    let took = started.elapsed();
    eprintln!("{err} ({took:?})");
    assert!(took < std_ms(1_000), "{took:?}");
    assert!(
        matches!(err.kind(), ErrorKind::Timeout(_) | ErrorKind::Transport),
        "{err:?}"
    );
    assert!(err.to_string().contains(&endpoint), "{err}");
    drop(silent);
}

/// etcd with authentication on: a wrong password fails `connect` as `Unauthorized`;
/// a user without permission on the key, and a client without a user, are refused
/// for good (`Refused(Unauthorized)`), never retried as indeterminate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_refusals_are_final() {
    let cluster = EtcdCluster::single();
    let mut admin = client(&cluster).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("nobody", "pw", None).await.unwrap();
    // The permission the README documents: read and write on the lock keys.
    admin.role_add("locker").await.unwrap();
    admin
        .role_grant_permission(
            "locker",
            etcd_client::Permission::read_write("locks/").with_prefix(),
        )
        .await
        .unwrap();
    admin.user_add("locker", "pw", None).await.unwrap();
    admin.user_grant_role("locker", "locker").await.unwrap();
    // The data set's epoch marker under the prefix the role covers (a new data set).
    admin
        .put("locks/{leasehold}epoch", "0 0", None)
        .await
        .unwrap();
    admin.auth_enable().await.unwrap();
    let endpoint = cluster.endpoint(0);

    let err = EtcdLockService::builder([endpoint.clone()])
        .user("root", "wrong")
        .connect()
        .await
        .expect_err("wrong password");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&endpoint) && text.contains("Builder::user"),
        "{text}"
    );
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.contains("authentication failed"), "{cause}");

    let a = token();
    let id = identity("a");
    let limited = EtcdLockService::builder([endpoint.clone()])
        .user("nobody", "pw")
        .connect()
        .await
        .expect("the password is right");
    let anonymous = service_on(vec![endpoint.clone()]).await;
    for service in [&limited, &anonymous] {
        assert_eq!(
            LockService::acquire(service, "k", a, &id, ms(2_000)).await,
            AcquireOutcome::Refused(Refusal::Unauthorized)
        );
        assert_eq!(
            LockService::holder(service, "k").await,
            HolderOutcome::Refused(Refusal::Unauthorized)
        );
        assert_eq!(
            LockService::renew(service, "k", a, Fence(1), ms(2_000)).await,
            RenewOutcome::Refused(Refusal::Unauthorized)
        );
        assert_eq!(
            LockService::release(service, "k", a).await,
            ReleaseOutcome::Refused(Refusal::Unauthorized)
        );
    }

    // Read and write on the keys is all a user needs: acquire, holder, renew and
    // release (whose lease revoke needs write on the lease's keys) all go through.
    // With its epoch marker under the prefix too (see `Builder::epoch_prefix`).
    let locker = EtcdLockService::builder([endpoint])
        .user("locker", "pw")
        .epoch_prefix("locks/")
        .connect()
        .await
        .expect("locker");
    let AcquireOutcome::Granted { fence, ttl } =
        LockService::acquire(&locker, "locks/k", a, &id, ms(2_000)).await
    else {
        panic!("locker is granted its own keys");
    };
    assert!(matches!(
        LockService::holder(&locker, "locks/k").await,
        HolderOutcome::Held(holder) if holder.fence == fence
    ));
    assert_eq!(
        LockService::renew(&locker, "locks/k", a, fence, ttl).await,
        RenewOutcome::Renewed { ttl }
    );
    assert_eq!(
        LockService::release(&locker, "locks/k", a).await,
        ReleaseOutcome::Released
    );
    let mut root = etcd_client::Client::connect(
        [cluster.endpoint(0)],
        Some(etcd_client::ConnectOptions::new().with_user("root", "rootpw")),
    )
    .await
    .unwrap();
    assert!(
        root.leases().await.unwrap().leases().is_empty(),
        "the release revoked the lease"
    );
    assert_eq!(
        LockService::acquire(&locker, "k", a, &id, ms(2_000)).await,
        AcquireOutcome::Refused(Refusal::Unauthorized),
        "but only its own keys"
    );
}

/// A token etcd no longer accepts (here: auth disabled and enabled again, which
/// drops every token; in production a JWT past its TTL, or an idle simple token):
/// the service authenticates again, and a held key keeps renewing. A forgotten
/// token is never a final `Unauthorized`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_auth_token_is_replaced_and_the_lease_renews() {
    let cluster = EtcdCluster::single();
    let mut admin = client(&cluster).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let service = EtcdLockService::builder([cluster.endpoint(0)])
        .user("root", "rootpw")
        .connect()
        .await
        .expect("root");
    let a = token();
    let AcquireOutcome::Granted { fence, ttl } =
        LockService::acquire(&service, "k", a, &identity("a"), ms(10_000)).await
    else {
        panic!("granted");
    };
    assert_eq!(
        LockService::renew(&service, "k", a, fence, ttl).await,
        RenewOutcome::Renewed { ttl }
    );

    let mut root = etcd_client::Client::connect(
        [cluster.endpoint(0)],
        Some(etcd_client::ConnectOptions::new().with_user("root", "rootpw")),
    )
    .await
    .unwrap();
    root.auth_disable().await.unwrap();
    admin.auth_enable().await.unwrap();

    assert_eq!(
        LockService::renew(&service, "k", a, fence, ttl).await,
        RenewOutcome::Renewed { ttl }
    );
    assert!(matches!(
        LockService::holder(&service, "k").await,
        HolderOutcome::Held(holder) if holder.fence == fence
    ));
}

/// Settings that cannot work are a `Config` error from `connect`, at once, naming
/// what was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_settings_fail_connect_with_a_config_error() {
    let err = within(1_000, EtcdLockService::connect(Vec::<String>::new()))
        .await
        .expect_err("no endpoints");
    assert_eq!(err.kind(), ErrorKind::Config, "{err:?}");
    assert_eq!(
        std::error::Error::source(&err).unwrap().to_string(),
        "no endpoints given"
    );
    assert!(err.to_string().contains("(no endpoints)"), "{err}");
    let err = within(1_000, EtcdLockService::connect(["http://bad host:2379"]))
        .await
        .expect_err("not a URI");
    assert_eq!(err.kind(), ErrorKind::Config, "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("http://bad host:2379") && text.contains("host:port"),
        "{text}"
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
    let service = service.with_request_timeout(std_ms(500));
    let a = token();
    let id = identity("a");
    for _ in 0..3 {
        let outcome = LockService::acquire(&service, "k", a, &id, ms(2_000)).await;
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
        let outcome = LockService::holder(&service, "k").await;
        assert!(
            matches!(outcome, HolderOutcome::Indeterminate(_)),
            "{outcome:?}"
        );
    }
    let err = service
        .try_acquire("k", a, &id, ms(2_000))
        .await
        .unwrap_err();
    eprintln!("garbage server: {err}");
}

/// Without the `etcd` binary the tests fail, naming the Debian package to install.
#[test]
fn a_missing_etcd_binary_fails_naming_the_debian_package() {
    // A PATH that is one empty directory: the lookup the starters use (they panic
    // with this message) fails, never skips, and names the package to install.
    let empty = scratch_dir("no-etcd-here");
    let missing =
        binary_in("etcd", "etcd-server", empty.path()).expect_err("no etcd in an empty directory");
    let message = missing.to_string();
    assert!(message.contains("etcd-server"), "{message}");
    // And the real lookup finds it on this machine.
    assert!(binary("etcd", "etcd-server").is_ok_and(|path| path.is_file()));
}

/// etcd's count of `LeaseKeepAlive` streams started, and of keep-alives received.
fn keep_alive_counts(cluster: &EtcdCluster) -> (u64, u64) {
    const LABELS: &str = r#"{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"}"#;
    let port = cluster.client_port(0);
    (
        counter(port, &format!("grpc_server_started_total{LABELS}")),
        counter(port, &format!("grpc_server_msg_received_total{LABELS}")),
    )
}

/// Renewals of one lease share one keep-alive stream: five renewals open one stream
/// and send six keep-alives (etcd-client's first one when the stream opens, then one
/// per renewal), each answering the granted TTL. Two leases have two streams; a
/// release closes its lease's stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_share_one_keep_alive_stream_per_lease() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let a = token();
    let (fence, ttl, _) = granted(&service, "k", a, ms(2_000)).await;
    let (started, received) = keep_alive_counts(&cluster);
    for _ in 0..5 {
        assert_eq!(
            service.try_renew("k", a, fence).await.unwrap(),
            Renewed::Renewed { ttl }
        );
    }
    assert_eq!(
        keep_alive_counts(&cluster),
        (started + 1, received + 6),
        "one stream, one keep-alive per renewal after the first"
    );
    assert_eq!(service.keep_alive_streams(), 1);

    let b = token();
    let (b_fence, _, _) = granted(&service, "k2", b, ms(2_000)).await;
    assert!(matches!(
        service.try_renew("k2", b, b_fence).await.unwrap(),
        Renewed::Renewed { .. }
    ));
    assert_eq!(service.keep_alive_streams(), 2);
    assert_eq!(keep_alive_counts(&cluster).0, started + 2);

    assert_eq!(
        service.try_release("k", a).await.unwrap(),
        Released::Released
    );
    assert_eq!(service.keep_alive_streams(), 1);
    assert_eq!(
        service.try_release("k2", b).await.unwrap(),
        Released::Released
    );
    assert_eq!(service.keep_alive_streams(), 0);
}

/// A renewal that times out takes its stream with it: the late answer to its
/// keep-alive (held by a stalled network, then delivered) is never read as the answer
/// to the next renewal, which opens a stream of its own. A stream broken under an idle
/// lease (the connection cut) is replaced within the next renewal, which succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_renewal_never_leaves_its_stream_to_the_next() {
    let cluster = EtcdCluster::single();
    let proxy = Proxy::start(cluster.client_port(0)).await;
    let service = service_on(vec![proxy_endpoint(&proxy)])
        .await
        .with_request_timeout(std_ms(300));
    let a = token();
    let (fence, ttl, _) = granted(&service, "k", a, ms(5_000)).await;
    let (started, _) = keep_alive_counts(&cluster);
    assert_eq!(
        service.try_renew("k", a, fence).await.unwrap(),
        Renewed::Renewed { ttl }
    );
    assert_eq!(keep_alive_counts(&cluster).0, started + 1);

    proxy.stall();
    let err = service.try_renew("k", a, fence).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout(Some(std_ms(300))), "{err}");
    proxy.resume();
    assert_eq!(
        service.try_renew("k", a, fence).await.unwrap(),
        Renewed::Renewed { ttl }
    );
    assert_eq!(
        keep_alive_counts(&cluster).0,
        started + 2,
        "the renewal after the timeout opened a new stream"
    );

    proxy.cut();
    assert_eq!(
        service.try_renew("k", a, fence).await.unwrap(),
        Renewed::Renewed { ttl }
    );
    assert_eq!(keep_alive_counts(&cluster).0, started + 3);
}

/// etcd's count of unary KV calls of `method` (`Range`, `Txn`) started.
fn kv_calls(cluster: &EtcdCluster, method: &str) -> u64 {
    let name = format!(
        r#"grpc_server_started_total{{grpc_method="{method}",grpc_service="etcdserverpb.KV",grpc_type="unary"}}"#
    );
    counter(cluster.client_port(0), &name)
}

/// Concurrent renewals share their ownership reads: ten renewals at once make at most
/// ten transactions and no plain read (a renewal that finds no read in flight sends its
/// own compare-or-read transaction, the others queue for a transaction of reads), and
/// each answer is its own key's — three keys deleted from outside are
/// `NotOwner(KeyGone)`, the seven others extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_renewals_share_their_ownership_reads() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let a = token();
    let mut grants = Vec::new();
    for i in 0..10 {
        let key = format!("batch/{i}");
        let (fence, ttl, _) = granted(&service, &key, a, ms(5_000)).await;
        grants.push((key, fence, ttl));
    }
    for (key, _, _) in &grants[..3] {
        outside.delete(key.as_str(), None).await.unwrap();
    }
    let (ranges, txns) = (kv_calls(&cluster, "Range"), kv_calls(&cluster, "Txn"));
    let renewals = grants.iter().map(|(key, fence, _)| {
        let service = service.clone();
        let (key, fence) = (key.clone(), *fence);
        tokio::spawn(async move { service.try_renew(&key, a, fence).await })
    });
    let renewals: Vec<_> = renewals.collect();
    for (i, renewal) in renewals.into_iter().enumerate() {
        let answer = within(5_000, renewal).await.unwrap().unwrap();
        if i < 3 {
            assert_eq!(
                answer,
                Renewed::NotOwner(NotHeld::KeyGone),
                "{}",
                grants[i].0
            );
        } else {
            assert_eq!(
                answer,
                Renewed::Renewed { ttl: grants[i].2 },
                "{}",
                grants[i].0
            );
        }
    }
    assert_eq!(kv_calls(&cluster, "Range"), ranges, "no plain read");
    let reads = kv_calls(&cluster, "Txn") - txns;
    assert!((1..=10).contains(&reads), "{reads} transactions");
    eprintln!("10 concurrent renewals: {reads} transactions");
}

/// The fence counter `<key>{fence}` decides a grant's fence while it is ahead of the
/// wall clock; one that is not a decimal, or at the top of `u64`, refuses the acquire
/// and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_counter_decides_while_ahead_and_is_checked() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let (a, id) = (token(), identity("a"));

    let ahead = wall_micros() + 3_600_000_000;
    outside
        .put("k{fence}", ahead.to_string(), None)
        .await
        .unwrap();
    let outcome = LockService::acquire(&service, "k", a, &id, ms(2_000)).await;
    assert!(
        matches!(outcome, AcquireOutcome::Granted { fence, .. } if fence == Fence(ahead + 1)),
        "{outcome:?}"
    );
    assert_eq!(
        value(&mut outside, "k{fence}").await,
        Some((ahead + 1).to_string())
    );

    for (counter, refusal) in [
        ("x", Refusal::WrongType),
        ("007", Refusal::WrongType),
        ("18446744073709551615", Refusal::WrongType),
        ("9223372036854775807", Refusal::Unsupported),
    ] {
        outside.put("k2{fence}", counter, None).await.unwrap();
        assert_eq!(
            LockService::acquire(&service, "k2", a, &id, ms(2_000)).await,
            AcquireOutcome::Refused(refusal),
            "{counter}"
        );
        assert_eq!(value(&mut outside, "k2").await, None, "{counter}");
        assert_eq!(
            value(&mut outside, "k2{fence}").await.as_deref(),
            Some(counter)
        );
    }
    assert_eq!(leases(&mut outside).await.len(), 1, "only k's lease");
}

/// `raise_fence` raises the counter (never lowers it), so the next grant's fence is
/// above the fence given; a held grant keeps its fence and renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raise_fence_moves_the_next_fence_and_never_lowers_it() {
    let cluster = EtcdCluster::single();
    let service = service(&cluster).await;
    let mut outside = client(&cluster).await;
    let (a, b, id) = (token(), token(), identity("a"));

    let (held, ttl, _) = granted(&service, "k", a, ms(2_000)).await;
    let high = Fence(wall_micros() + 36_000_000_000);
    assert_eq!(service.raise_fence("k", high).await.unwrap(), high);
    assert_eq!(
        service.raise_fence("k", Fence(5)).await.unwrap(),
        high,
        "never lowered"
    );
    assert_eq!(
        value(&mut outside, "k{fence}").await,
        Some(high.0.to_string())
    );
    assert_eq!(
        LockService::renew(&service, "k", a, held, ttl).await,
        RenewOutcome::Renewed { ttl },
        "the held grant keeps its fence"
    );
    assert_eq!(
        LockService::release(&service, "k", a).await,
        ReleaseOutcome::Released
    );
    let outcome = LockService::acquire(&service, "k", b, &id, ms(2_000)).await;
    assert!(
        matches!(outcome, AcquireOutcome::Granted { fence, .. } if fence == Fence(high.0 + 1)),
        "{outcome:?}"
    );

    let top = Fence(i64::MAX as u64);
    let err = service.raise_fence("k", top).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    outside.put("g{fence}", "x", None).await.unwrap();
    let err = service.raise_fence("g", Fence(7)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    let err = service.raise_fence("a{b}", Fence(7)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
}
