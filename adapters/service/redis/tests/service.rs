//! The scripts' semantics against a real `redis-server`: grant, re-grant, held (with
//! the holder), renew (token and fence), not-owner, release, holder queries, fences,
//! NOSCRIPT reload, cluster slots, `Send` use from many tasks, and errors as `tracing`
//! logs. Bad input and broken servers are in `tests/refusals.rs`.

mod common;

use common::*;
use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Owner, ReleaseOutcome, RenewOutcome,
    Term,
};
use leasehold_driver::LockService;
use leasehold_redis::{Acquired, Keys, RedisLockError, RedisLockService, Released, Renewed};
use redis::AsyncCommands;

fn token(owner: u8, term: u32) -> leasehold::OwnerToken {
    Owner([owner; 16]).token(Term(term))
}

fn id(text: &str) -> Identity {
    Identity::new(text).unwrap()
}

#[test]
fn acquire_regrant_held_renew_release_and_fences() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let (a, b) = (token(0xa, 1), token(0xb, 1));

        let first = service
            .try_acquire("k", a, &id("host-a:1"), ms(1_000))
            .await
            .unwrap();
        let Acquired::Granted { fence, .. } = first else {
            panic!("{first:?}")
        };
        assert_eq!(
            first,
            Acquired::Granted {
                fence,
                ttl: ms(1_000),
                regranted: false
            },
            "the TTL applied, exactly, never a PTTL read back"
        );
        // A new key's first fence is Redis's clock in µs (a restart that loses the
        // counter cannot go back below it).
        let time: Vec<u64> = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
        let clock = time[0] * 1_000_000 + time[1];
        assert!(
            fence.0 <= clock && fence.0 > clock - 60_000_000,
            "{fence} at {clock}"
        );
        let stored: String = raw.get("{k}").await.unwrap();
        assert_eq!(
            stored,
            format!("{}\n{}\nhost-a:1", a.encode().as_str(), fence.0)
        );

        // The same token again (its first answer was lost): same fence, expiry reset.
        let again = service
            .try_acquire("k", a, &id("host-a:1"), ms(2_000))
            .await
            .unwrap();
        assert_eq!(
            again,
            Acquired::Granted {
                fence,
                ttl: ms(2_000),
                regranted: true
            }
        );
        let pttl: i64 = raw.pttl("{k}").await.unwrap();
        assert!(
            pttl > 1_000 && pttl <= 2_000,
            "re-grant applied PEXPIRE: {pttl}"
        );

        // Another token: held, and the answer says by whom.
        let busy = service
            .try_acquire("k", b, &id("host-b"), ms(1_000))
            .await
            .unwrap();
        let Acquired::HeldByAnother(holder) = busy else {
            panic!("{busy:?}")
        };
        assert_eq!(holder.identity.as_str(), "host-a:1");
        assert_eq!(holder.fence, fence);
        assert!(
            holder.remaining > ms(1_000) && holder.remaining <= ms(2_000),
            "{holder:?}"
        );
        let through_trait = LockService::acquire(&service, "k", b, &id("host-b"), ms(1_000)).await;
        assert!(
            matches!(through_trait, AcquireOutcome::HeldByAnother(h) if h.identity.as_str() == "host-a:1"),
            "{through_trait:?}"
        );

        assert_eq!(
            service.try_renew("k", b, fence, ms(1_000)).await.unwrap(),
            Renewed::NotOwner
        );
        assert_eq!(
            service.try_renew("k", a, fence, ms(5_000)).await.unwrap(),
            Renewed::Renewed { ttl: ms(5_000) }
        );
        let pttl: i64 = raw.pttl("{k}").await.unwrap();
        assert!(pttl > 4_900, "renew applied PEXPIRE: {pttl}");
        // A renewal replaces the expiry, also with a shorter one.
        assert_eq!(
            LockService::renew(&service, "k", a, fence, ms(3_000)).await,
            RenewOutcome::Renewed { ttl: ms(3_000) }
        );
        let pttl: i64 = raw.pttl("{k}").await.unwrap();
        assert!(pttl <= 3_000, "{pttl}");

        assert_eq!(
            service.try_release("k", b).await.unwrap(),
            Released::NotOwner
        );
        // An older term of the same owner is another token: it cannot release either.
        assert_eq!(
            service.try_release("k", token(0xa, 0)).await.unwrap(),
            Released::NotOwner
        );
        assert_eq!(
            LockService::release(&service, "k", a).await,
            ReleaseOutcome::Released
        );
        let gone: Option<String> = raw.get("{k}").await.unwrap();
        assert_eq!(gone, None);
        assert_eq!(
            service.try_renew("k", a, fence, ms(1_000)).await.unwrap(),
            Renewed::NotOwner,
            "renew never re-creates a deleted key"
        );
        let gone: Option<String> = raw.get("{k}").await.unwrap();
        assert_eq!(gone, None);

        // The counter survives the lock key: the next grant is newer.
        let counter: String = raw.get("{k}:fence").await.unwrap();
        assert_eq!(counter, fence.0.to_string());
        assert!(matches!(
            service
                .try_acquire("k", b, &Identity::EMPTY, ms(1_000))
                .await
                .unwrap(),
            Acquired::Granted {
                fence: next,
                regranted: false,
                ..
            } if next > fence
        ));
    });
}

#[test]
fn a_renewal_with_the_right_token_and_another_fence_is_not_owner() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let a = token(0xa, 1);
        let who = id("a");
        // A grant to `a`; the key is deleted (released, expired); a late duplicate
        // acquire by the same token re-creates it with a newer fence.
        let Acquired::Granted { fence: first, .. } =
            service.try_acquire("f", a, &who, ms(1_000)).await.unwrap()
        else {
            panic!("free")
        };
        service.try_release("f", a).await.unwrap();
        let Acquired::Granted {
            fence: second,
            regranted: false,
            ..
        } = service.try_acquire("f", a, &who, ms(1_000)).await.unwrap()
        else {
            panic!("free")
        };
        assert!(second > first);
        // The renewal of the first grant must not extend the second.
        assert_eq!(
            LockService::renew(&service, "f", a, first, ms(1_000)).await,
            RenewOutcome::NotOwner
        );
        assert_eq!(
            service
                .try_renew("f", a, Fence(second.0 + 1), ms(1_000))
                .await
                .unwrap(),
            Renewed::NotOwner
        );
        // Nor a fence that is a prefix of the stored one, or has a leading zero: past
        // the clock, the counter decides (fences 20 · 10^15 and 20 · 10^15 + 1).
        service
            .raise_fence("f", Fence(20_000_000_000_000_000))
            .await
            .unwrap();
        service.try_release("f", a).await.unwrap();
        assert!(matches!(
            service.try_acquire("f", a, &who, ms(1_000)).await.unwrap(),
            Acquired::Granted {
                fence: Fence(20_000_000_000_000_001),
                ..
            }
        ));
        for other in [2_000_000_000_000_000, 20_000_000_000_000_000] {
            assert_eq!(
                service
                    .try_renew("f", a, Fence(other), ms(1_000))
                    .await
                    .unwrap(),
                Renewed::NotOwner
            );
        }
        assert_eq!(
            service
                .try_renew("f", a, Fence(20_000_000_000_000_001), ms(1_000))
                .await
                .unwrap(),
            Renewed::Renewed { ttl: ms(1_000) }
        );
    });
}

#[test]
fn holder_reports_identity_fence_and_remaining_ttl_or_free() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        assert_eq!(
            LockService::holder(&service, "h").await,
            HolderOutcome::Free
        );
        let a = token(1, 1);
        let Acquired::Granted { fence, .. } = service
            .try_acquire("h", a, &id("worker-3 (pid 4711)"), ms(2_000))
            .await
            .unwrap()
        else {
            panic!("free")
        };
        let HolderOutcome::Held(holder) = LockService::holder(&service, "h").await else {
            panic!("held")
        };
        assert_eq!(holder.identity.as_str(), "worker-3 (pid 4711)");
        assert_eq!(holder.fence, fence);
        assert!(
            holder.remaining > ms(1_500) && holder.remaining <= ms(2_000),
            "{holder:?}"
        );
        // It changes nothing: the same answer again, and the holder still renews.
        assert_eq!(service.try_holder("h").await.unwrap().unwrap().fence, fence);
        assert!(matches!(
            service.try_renew("h", a, fence, ms(2_000)).await.unwrap(),
            Renewed::Renewed { .. }
        ));
        // An anonymous holder, and non-ASCII text.
        let b = token(2, 1);
        service.try_release("h", a).await.unwrap();
        service
            .try_acquire("h", b, &Identity::EMPTY, ms(2_000))
            .await
            .unwrap();
        let held = service.try_holder("h").await.unwrap().unwrap();
        assert!(held.identity.is_empty());
        assert!(held.fence > fence);
        service.try_release("h", b).await.unwrap();
        service
            .try_acquire("h", b, &id("nœud-é"), ms(2_000))
            .await
            .unwrap();
        assert_eq!(
            service
                .try_holder("h")
                .await
                .unwrap()
                .unwrap()
                .identity
                .as_str(),
            "nœud-é"
        );
        service.try_release("h", b).await.unwrap();
        assert_eq!(service.try_holder("h").await.unwrap(), None);
    });
}

#[test]
fn raise_fence_seeds_the_next_grant_and_leaves_a_held_grant_alone() {
    // Above Redis's clock in µs (about 1.8 · 10^15 now), so the counter decides.
    const ABOVE: u64 = 10_000_000_000_000_000;
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let who = id("r");
        assert_eq!(
            service.raise_fence("r", Fence(ABOVE + 41)).await.unwrap(),
            Fence(ABOVE + 41)
        );
        assert_eq!(
            service.raise_fence("r", Fence(ABOVE + 7)).await.unwrap(),
            Fence(ABOVE + 41)
        );
        let a = token(1, 1);
        assert!(matches!(
            service.try_acquire("r", a, &who, ms(1_000)).await.unwrap(),
            Acquired::Granted {
                fence: f,
                ..
            } if f == Fence(ABOVE + 42)
        ));
        // Raising it while held: the holder keeps fence 42 and keeps renewing.
        assert_eq!(
            service.raise_fence("r", Fence(ABOVE + 100)).await.unwrap(),
            Fence(ABOVE + 100)
        );
        assert_eq!(
            service
                .try_renew("r", a, Fence(ABOVE + 42), ms(1_000))
                .await
                .unwrap(),
            Renewed::Renewed { ttl: ms(1_000) }
        );
        assert_eq!(
            service.try_holder("r").await.unwrap().unwrap().fence,
            Fence(ABOVE + 42)
        );
        service.try_release("r", a).await.unwrap();
        assert!(matches!(
            service.try_acquire("r", a, &who, ms(1_000)).await.unwrap(),
            Acquired::Granted {
                fence: f,
                ..
            } if f == Fence(ABOVE + 101)
        ));
    });
}

#[test]
fn fences_are_exact_beyond_2_pow_53_up_to_the_counter_limit() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let who = id("big");
        let a = token(1, 1);
        // 2^60 + 1 is not a double: a Lua number would round it.
        let big = Fence((1 << 60) + 1);
        assert_eq!(service.raise_fence("big", big).await.unwrap(), big);
        let granted = service
            .try_acquire("big", a, &who, ms(1_000))
            .await
            .unwrap();
        let next = Fence((1 << 60) + 2);
        assert!(
            matches!(granted, Acquired::Granted { fence, .. } if fence == next),
            "{granted:?}"
        );
        assert_eq!(
            service.try_holder("big").await.unwrap().unwrap().fence,
            next
        );
        assert_eq!(
            service.try_renew("big", a, next, ms(1_000)).await.unwrap(),
            Renewed::Renewed { ttl: ms(1_000) }
        );
        assert_eq!(
            service
                .try_renew("big", a, Fence((1 << 60) + 3), ms(1_000))
                .await
                .unwrap(),
            Renewed::NotOwner
        );

        // The counter is a Redis integer: the last grant is 2^63 - 1; after that the
        // acquire is refused for good, and nothing is written.
        let top = Fence((i64::MAX - 1) as u64);
        assert_eq!(service.raise_fence("top", top).await.unwrap(), top);
        assert!(matches!(
            service.try_acquire("top", a, &who, ms(1_000)).await.unwrap(),
            Acquired::Granted { fence, .. } if fence == Fence(i64::MAX as u64)
        ));
        service.try_release("top", a).await.unwrap();
        assert_eq!(
            LockService::acquire(&service, "top", a, &who, ms(1_000)).await,
            AcquireOutcome::Refused(leasehold::Refusal::Unsupported)
        );
        let mut raw = raw(&server.url()).await;
        let lock: Option<String> = raw.get("{top}").await.unwrap();
        assert_eq!(lock, None);
        let err = service
            .raise_fence("other", Fence(i64::MAX as u64))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at most 2^63 - 2"), "{err}");
    });
}

#[test]
fn ttls_are_whole_milliseconds_rounded_up() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let a = token(1, 1);
        let granted = service
            .try_acquire("t", a, &Identity::EMPTY, Duration::from_micros(999))
            .await
            .unwrap();
        assert!(
            matches!(granted, Acquired::Granted { ttl, .. } if ttl == ms(1)),
            "{granted:?}"
        );
        // Fence 1 again, or fence 2 when the 1 ms grant expired first (a busy machine).
        let Acquired::Granted { fence, .. } = service
            .try_acquire("t", a, &Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        else {
            panic!("the key is free or ours: granted");
        };
        // A renewal never applies less than asked: 1000.001 ms → 1001 ms.
        assert_eq!(
            service
                .try_renew("t", a, fence, Duration::from_micros(1_000_001))
                .await
                .unwrap(),
            Renewed::Renewed { ttl: ms(1_001) }
        );
    });
}

#[test]
fn scripts_are_reloaded_transparently_after_script_flush() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let a = token(1, 1);
        let Acquired::Granted { fence, .. } = service
            .try_acquire("s", a, &Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        else {
            panic!("free")
        };
        assert_eq!(service.script_reloads(), 0);
        let mut raw = raw(&server.url()).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(matches!(
            service.try_renew("s", a, fence, ms(1_000)).await.unwrap(),
            Renewed::Renewed { .. }
        ));
        assert_eq!(service.script_reloads(), 1);
        // Loaded again: no further reload of that script…
        service.try_renew("s", a, fence, ms(1_000)).await.unwrap();
        assert_eq!(service.script_reloads(), 1);
        // …while each other script is reloaded when first needed.
        assert_eq!(
            service.try_release("s", a).await.unwrap(),
            Released::Released
        );
        assert_eq!(service.script_reloads(), 2);
        assert_eq!(service.try_holder("s").await.unwrap(), None);
        assert_eq!(service.script_reloads(), 3);
    });
}

#[test]
fn both_keys_live_in_one_cluster_slot() {
    let server = RedisServer::start_with(RedisOptions {
        cluster: true,
        ..RedisOptions::default()
    });
    run_local(async {
        let mut raw = raw(&server.url()).await;
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query_async(&mut raw)
            .await
            .unwrap();
        wait_for("cluster_state:ok", std_ms(10_000), || {
            let mut raw = raw.clone();
            async move {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                info.contains("cluster_state:ok")
            }
        })
        .await;

        let keys = Keys::new("orders").unwrap();
        let slot = |key: String| {
            let mut raw = raw.clone();
            async move {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                slot
            }
        };
        assert_eq!(
            slot(keys.lock.clone()).await,
            slot(keys.fence.clone()).await
        );

        // Cluster mode refuses a script whose keys span slots (the control)…
        let err = redis::cmd("EVAL")
            .arg("return 1")
            .arg(2)
            .arg("a")
            .arg("b")
            .query_async::<i64>(&mut raw)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("CROSSSLOT"));
        // …and a standalone service's acquire too: the data set's epoch marker is in
        // another slot than the lock. A final refusal that says what to use instead
        // (`tests/cluster.rs` runs the cluster service, one marker per slot).
        let service = service(&server.url()).await;
        let err = service
            .try_acquire("orders", token(1, 1), &id("c"), ms(1_000))
            .await
            .unwrap_err();
        assert_eq!(
            err.refusal(),
            Some(leasehold::Refusal::Unsupported),
            "{err}"
        );
        assert!(err.to_string().contains("connect_cluster"), "{err}");
    });
}

#[test]
fn the_service_is_send_and_shared_by_many_tasks_on_a_multi_threaded_runtime() {
    use std::sync::Arc;

    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let service = Arc::new(service(&server.url()).await);
        let tasks: Vec<_> = (0..32u8)
            .map(|i| {
                let service = service.clone();
                tokio::spawn(async move {
                    let key = format!("mt{i}");
                    let t = token(i, 1);
                    let who = Identity::new(&format!("task-{i}")).unwrap();
                    let granted = LockService::acquire(&*service, &key, t, &who, ms(1_000)).await;
                    let AcquireOutcome::Granted {
                        fence,
                        ttl: applied,
                    } = granted
                    else {
                        panic!("{granted:?}")
                    };
                    assert_eq!(applied, ms(1_000));
                    for _ in 0..20 {
                        let renewed =
                            LockService::renew(&*service, &key, t, fence, ms(1_000)).await;
                        assert_eq!(renewed, RenewOutcome::Renewed { ttl: ms(1_000) });
                    }
                    let held = LockService::holder(&*service, &key).await;
                    assert!(
                        matches!(held, HolderOutcome::Held(h) if h.identity == who),
                        "{held:?}"
                    );
                    let released = LockService::release(&*service, &key, t).await;
                    assert_eq!(released, ReleaseOutcome::Released);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

#[test]
fn a_missing_redis_server_binary_fails_naming_the_debian_package() {
    // A PATH without redis-server on it: the starter's lookup must fail (the starters
    // panic with this message), never skip, and say which package to install.
    let empty = scratch_dir("no-redis-server");
    let err = binary_in("redis-server", "redis-server", empty.path())
        .expect_err("a missing binary must fail, never skip");
    let message = err.to_string();
    assert!(
        message.contains("Debian package `redis-server`"),
        "{message}"
    );
}

/// `calls` of `cmdstat_evalsha` in `INFO commandstats`: how many scripts Redis ran.
fn scripts_run(server: &RedisServer) -> u64 {
    let info = server.inline("INFO commandstats").expect("INFO answered");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_stalled_server_is_sent_at_most_the_in_flight_bound_and_calls_that_time_out_waiting_are_never_sent(
) {
    // The default bound, and one set in the builder.
    for bound in [None, Some(100)] {
        stalled_server_sees_at_most(bound);
    }
}

/// A service with a 300 ms request timeout (and `max_in_flight`, when given) that
/// holds key `k` for a minute: its token and fence.
async fn holding_k(
    server: &RedisServer,
    max_in_flight: Option<usize>,
) -> (RedisLockService, leasehold::OwnerToken, Fence) {
    let mut builder = RedisLockService::builder(server.url())
        .request_timeout(std_ms(300))
        .max_ttl(std_ms(60_000));
    if let Some(bound) = max_in_flight {
        builder = builder.max_in_flight(bound);
    }
    let service = builder.connect().await.unwrap();
    let t = token(1, 1);
    let granted = service
        .try_acquire("k", t, &id("host-a:1"), ms(60_000))
        .await;
    let Ok(Acquired::Granted { fence, .. }) = granted else {
        panic!("{granted:?}")
    };
    (service, t, fence)
}

/// A call whose caller gave up (its request timeout ran out while Redis was stopped)
/// keeps its place on the wire until Redis has run it: with one place, the next call
/// waits for it and runs out of time unsent, and once Redis is back a call goes out
/// as soon as the stale one is done. Freed at its timeout instead, the place would
/// let the second call pile up behind the first in Redis's queue.
#[test]
fn a_call_given_up_keeps_its_place_until_redis_has_run_it() {
    let server = RedisServer::start();
    run_local(async {
        let (service, t, fence) = holding_k(&server, Some(1)).await;
        let before = scripts_run(&server);

        server.pause();
        tokio::time::pause();
        for call in ["sent, then given up", "never sent"] {
            let answer = service.try_renew("k", t, fence, ms(60_000)).await;
            assert!(
                matches!(answer, Err(RedisLockError::Timeout { .. })),
                "{call}: {answer:?}"
            );
        }
        tokio::time::resume();
        server.resume();

        let renewed = service.try_renew("k", t, fence, ms(60_000)).await;
        assert!(
            matches!(renewed, Ok(Renewed::Renewed { .. })),
            "{renewed:?}"
        );
        assert_eq!(
            scripts_run(&server) - before,
            2,
            "the call given up and the last one ran; the one that waited was never sent"
        );
    });
}

fn stalled_server_sees_at_most(bound: Option<usize>) {
    const CALLS: usize = 10_000;
    let most = bound.unwrap_or(leasehold_redis::MAX_IN_FLIGHT) as u64;
    let server = RedisServer::start();
    run_local(async {
        let (service, t, fence) = holding_k(&server, bound).await;
        let before = scripts_run(&server);

        // Redis stops (SIGSTOP) with ten thousand renewals to send. On the virtual
        // clock, every call runs out of its 300 ms at the same instant.
        server.pause();
        tokio::time::pause();
        let renewals = (0..CALLS).map(|_| service.try_renew("k", t, fence, ms(60_000)));
        let answers = futures::future::join_all(renewals).await;
        tokio::time::resume();
        server.resume();
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(RedisLockError::Timeout { .. }))),
            "every call timed out"
        );

        // A PING on the same connection is answered after everything sent before it.
        let mut conn = service.connection().clone();
        let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        assert_eq!(pong, "PONG");
        let sent = scripts_run(&server) - before;
        assert!(
            (1..=most).contains(&sent),
            "{sent} of {CALLS} timed-out calls reached Redis"
        );
        // The connection is as good as before.
        let renewed = service.try_renew("k", t, fence, ms(60_000)).await;
        assert!(
            matches!(renewed, Ok(Renewed::Renewed { .. })),
            "{renewed:?}"
        );
    });
}
