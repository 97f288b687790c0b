//! The scripts' semantics against a real `redis-server`: grant, re-grant, held,
//! renew, not-owner, release, fences, NOSCRIPT reload, password, cluster slots,
//! `Send` use from many tasks, and errors as `Indeterminate` + `tracing` logs.

mod support;

use leasehold::{Fence, Owner, Term};
use leasehold_redis::{Acquired, Keys, Op, RedisLockError, RedisLockService, Released, Renewed};
use redis::AsyncCommands;
use support::*;

fn token(owner: u8, term: u32) -> leasehold::OwnerToken {
    Owner([owner; 16]).token(Term(term))
}

#[test]
fn acquire_regrant_held_renew_release_and_fences() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let (a, b) = (token(0xa, 1), token(0xb, 1));

        let first = service.try_acquire("k", a, ms(1_000)).await.unwrap();
        let Acquired::Granted {
            fence,
            ttl,
            regranted,
        } = first
        else {
            panic!("{first:?}")
        };
        assert_eq!(fence, Fence(1));
        assert!(ttl <= ms(1_000) && ttl >= ms(990), "{ttl:?}");
        assert!(!regranted);
        let stored: String = raw.get("{k}").await.unwrap();
        assert_eq!(
            stored,
            a.encode().as_str(),
            "the value is the owner+term token"
        );

        // The same token again (its first answer was lost): same fence, fresh TTL.
        let again = service.try_acquire("k", a, ms(2_000)).await.unwrap();
        assert!(
            matches!(again, Acquired::Granted { fence: Fence(1), regranted: true, ttl } if ttl > ms(1_000)),
            "{again:?}"
        );

        let busy = service.try_acquire("k", b, ms(1_000)).await.unwrap();
        assert!(
            matches!(busy, Acquired::HeldByAnother { remaining: Some(r) } if r > ms(1_000)),
            "{busy:?}"
        );

        assert_eq!(
            service
                .try_renew("k", b, Fence(1), ms(1_000))
                .await
                .unwrap(),
            Renewed::NotOwner
        );
        assert!(matches!(
            service.try_renew("k", a, Fence(1), ms(5_000)).await.unwrap(),
            Renewed::Renewed { ttl } if ttl > ms(4_900)
        ));
        let pttl: i64 = raw.pttl("{k}").await.unwrap();
        assert!(pttl > 4_900, "renew applied PEXPIRE: {pttl}");

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
            service.try_release("k", a).await.unwrap(),
            Released::Released
        );
        let gone: Option<String> = raw.get("{k}").await.unwrap();
        assert_eq!(gone, None);
        assert_eq!(
            service
                .try_renew("k", a, Fence(1), ms(1_000))
                .await
                .unwrap(),
            Renewed::NotOwner
        );

        // The counter survives the lock key: the next grant is newer.
        let counter: String = raw.get("{k}:fence").await.unwrap();
        assert_eq!(counter, "1");
        assert!(matches!(
            service.try_acquire("k", b, ms(1_000)).await.unwrap(),
            Acquired::Granted {
                fence: Fence(2),
                regranted: false,
                ..
            }
        ));
    });
}

#[test]
fn raise_fence_seeds_the_counter_and_never_lowers_it() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        assert_eq!(
            service.raise_fence("r", Fence(41)).await.unwrap(),
            Fence(41)
        );
        assert_eq!(service.raise_fence("r", Fence(7)).await.unwrap(), Fence(41));
        assert!(matches!(
            service
                .try_acquire("r", token(1, 1), ms(1_000))
                .await
                .unwrap(),
            Acquired::Granted {
                fence: Fence(42),
                ..
            }
        ));
        // Exact past 2^53 (Lua numbers are doubles; the scripts compare strings).
        let big = Fence((1 << 60) + 1);
        assert_eq!(service.raise_fence("big", big).await.unwrap(), big);
        assert!(matches!(
            service.try_acquire("big", token(1, 1), ms(1_000)).await.unwrap(),
            Acquired::Granted { fence, .. } if fence == Fence((1 << 60) + 2)
        ));
    });
}

#[test]
fn invalid_names_and_ttls_are_typed_errors_and_nothing_is_sent() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        for name in ["", "a{b", "x}", "{t}"] {
            let err = service
                .try_acquire(name, token(1, 1), ms(100))
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    RedisLockError::InvalidRequest {
                        op: Op::Acquire,
                        ..
                    }
                ),
                "{name:?}: {err:?}"
            );
            assert_eq!(err.indeterminate(), leasehold::Indeterminate::Protocol);
        }
        let err = service
            .try_acquire("k", token(1, 1), leasehold::Duration::from_micros(999))
            .await
            .unwrap_err();
        assert!(
            matches!(err, RedisLockError::InvalidRequest { .. }),
            "{err}"
        );
        let mut raw = raw(&server.url()).await;
        let size: u64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
        assert_eq!(size, 0);
    });
}

#[test]
fn scripts_are_reloaded_transparently_after_script_flush() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let a = token(1, 1);
        service.try_acquire("s", a, ms(1_000)).await.unwrap();
        assert_eq!(service.script_reloads(), 0);
        let mut raw = raw(&server.url()).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(matches!(
            service
                .try_renew("s", a, Fence(1), ms(1_000))
                .await
                .unwrap(),
            Renewed::Renewed { .. }
        ));
        assert_eq!(service.script_reloads(), 1);
        // Loaded again: no further reload of that script…
        service
            .try_renew("s", a, Fence(1), ms(1_000))
            .await
            .unwrap();
        assert_eq!(service.script_reloads(), 1);
        // …while each other script is reloaded when first needed.
        assert_eq!(
            service.try_release("s", a).await.unwrap(),
            Released::Released
        );
        assert_eq!(service.script_reloads(), 2);
    });
}

#[test]
fn password_from_the_url_is_used_and_a_wrong_one_is_a_typed_error() {
    let server = RedisServer::start_with(ServerOptions {
        password: Some("s3cret".into()),
        ..ServerOptions::default()
    });
    run_local(async {
        let service = service(&server.url()).await;
        assert!(matches!(
            service
                .try_acquire("p", token(1, 1), ms(1_000))
                .await
                .unwrap(),
            Acquired::Granted { .. }
        ));
        for url in [
            format!("redis://127.0.0.1:{}", server.port),
            format!("redis://:wrong@127.0.0.1:{}", server.port),
        ] {
            let err = RedisLockService::builder(url.as_str())
                .reconnect_backoff(std_ms(1), std_ms(1), 0)
                .connect()
                .await
                .unwrap_err();
            assert_eq!(err.op(), Op::Connect, "{err}");
            assert!(
                matches!(err, RedisLockError::Service { .. }),
                "{url}: {err:?}"
            );
        }
    });
}

#[test]
fn unusable_urls_are_config_errors() {
    run_local(async {
        let err = RedisLockService::connect("http://127.0.0.1:1")
            .await
            .unwrap_err();
        assert!(matches!(err, RedisLockError::Config(_)), "{err:?}");
        #[cfg(not(feature = "tls"))]
        {
            let err = RedisLockService::connect("rediss://127.0.0.1:1")
                .await
                .unwrap_err();
            assert!(matches!(err, RedisLockError::Config(_)), "{err:?}");
        }
    });
}

#[test]
fn both_keys_live_in_one_cluster_slot() {
    let server = RedisServer::start_with(ServerOptions {
        cluster: true,
        ..ServerOptions::default()
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
        // …and runs ours.
        let service = service(&server.url()).await;
        let a = token(1, 1);
        assert!(matches!(
            service.try_acquire("orders", a, ms(1_000)).await.unwrap(),
            Acquired::Granted {
                fence: Fence(1),
                ..
            }
        ));
        assert!(matches!(
            service
                .try_renew("orders", a, Fence(1), ms(1_000))
                .await
                .unwrap(),
            Renewed::Renewed { .. }
        ));
        assert_eq!(
            service.raise_fence("orders", Fence(5)).await.unwrap(),
            Fence(5)
        );
        assert_eq!(
            service.try_release("orders", a).await.unwrap(),
            Released::Released
        );
    });
}

#[test]
fn the_service_is_send_and_shared_by_many_tasks_on_a_multi_threaded_runtime() {
    use leasehold::{AcquireOutcome, ReleaseOutcome, RenewOutcome};
    use leasehold_driver::LockService;
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
                    let granted = LockService::acquire(&*service, &key, t, ms(1_000)).await;
                    assert!(matches!(
                        granted,
                        AcquireOutcome::Granted {
                            fence: Fence(1),
                            ..
                        }
                    ));
                    for _ in 0..20 {
                        let renewed =
                            LockService::renew(&*service, &key, t, Fence(1), ms(1_000)).await;
                        assert!(
                            matches!(renewed, RenewOutcome::Renewed { .. }),
                            "{renewed:?}"
                        );
                    }
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
    let panic = std::panic::catch_unwind(|| support::server::binary("redis-server-not-installed"))
        .expect_err("a missing binary must fail, never skip");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("Debian package `redis-server`"),
        "{message}"
    );
}

#[test]
fn errors_reach_the_lease_as_indeterminate_and_are_logged_with_tracing() {
    use leasehold::{AcquireOutcome, Indeterminate, RenewOutcome};
    use leasehold_driver::LockService;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let server = RedisServer::start();
    let logs = Buffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        run_local(async {
            let service = service(&server.url()).await;
            let mut raw = raw(&server.url()).await;
            let _: () = raw.hset("{typed}", "f", "v").await.unwrap();
            let t = token(1, 1);
            assert_eq!(
                LockService::acquire(&service, "typed", t, ms(1_000)).await,
                AcquireOutcome::Indeterminate(Indeterminate::Service)
            );
            assert_eq!(
                LockService::renew(&service, "typed", t, Fence(1), ms(1_000)).await,
                RenewOutcome::Indeterminate(Indeterminate::Service)
            );
            assert_eq!(
                LockService::acquire(&service, "", t, ms(1_000)).await,
                AcquireOutcome::Indeterminate(Indeterminate::Protocol)
            );
        })
    });
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("WARN"), "{text}");
    assert!(
        text.contains("op=acquire") && text.contains("op=renew"),
        "{text}"
    );
    assert!(text.contains("WRONGTYPE"), "{text}");
    assert!(
        text.contains("ERROR") && text.contains("must not be empty"),
        "{text}"
    );
}
