//! Bad input and broken servers against a real `redis-server`: each gets its typed
//! answer at once (a final `Refused(reason)` or a bounded `Indeterminate`), with an
//! error text that says what failed, where, and what to do.

mod common;

use std::time::Instant as StdInstant;

use common::*;
use leasehold::{
    AcquireOutcome, Fence, HolderOutcome, Identity, Indeterminate, Owner, Refusal, ReleaseOutcome,
    RenewOutcome, Term,
};
use leasehold_driver::LockService;
use leasehold_redis::{Op, RedisLockError, RedisLockService};
use redis::AsyncCommands;

fn token(owner: u8, term: u32) -> leasehold::OwnerToken {
    Owner([owner; 16]).token(Term(term))
}

/// All four requests on `key`, through the trait.
async fn all_four(
    service: &RedisLockService,
    key: &str,
) -> (AcquireOutcome, RenewOutcome, ReleaseOutcome, HolderOutcome) {
    let t = token(1, 1);
    (
        LockService::acquire(service, key, t, &Identity::EMPTY, ms(1_000)).await,
        LockService::renew(service, key, t, Fence(1), ms(1_000)).await,
        LockService::release(service, key, t).await,
        LockService::holder(service, key).await,
    )
}

#[test]
fn invalid_keys_are_refused_at_once_without_a_round_trip() {
    let server = RedisServer::start();
    run_local(async {
        // Behind a stalled proxy every request that is sent times out after 2 s; an
        // invalid key must come back at once, so it was never sent.
        let proxy = Proxy::start(server.port()).await;
        let service = service(&proxy_url(&proxy)).await;
        proxy.set_mode(ProxyMode::Stall);
        let long = "x".repeat(257);
        for key in ["", "a{b}", "x}", "{t}", "a\nb", long.as_str()] {
            let started = StdInstant::now();
            let outcomes = all_four(&service, key).await;
            assert_eq!(
                outcomes,
                (
                    AcquireOutcome::Refused(Refusal::InvalidKey),
                    RenewOutcome::Refused(Refusal::InvalidKey),
                    ReleaseOutcome::Refused(Refusal::InvalidKey),
                    HolderOutcome::Refused(Refusal::InvalidKey),
                ),
                "{key:?}"
            );
            assert!(
                started.elapsed() < std_ms(100),
                "{key:?}: {:?}",
                started.elapsed()
            );
            let err = service.raise_fence(key, Fence(1)).await.unwrap_err();
            assert!(
                matches!(
                    err,
                    RedisLockError::InvalidKey {
                        op: Op::RaiseFence,
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        let err = service
            .try_acquire("a{b}", token(1, 1), &Identity::EMPTY, ms(1))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("acquire \"a{b}\": invalid key: a brace at byte 1"),
            "{err}"
        );
        proxy.set_mode(ProxyMode::Forward);
        let mut raw = raw(&server.url()).await;
        let size: u64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
        assert_eq!(size, 1, "nothing but the data set's epoch marker");
    });
}

#[test]
fn a_key_holding_a_list_is_wrong_type_and_nothing_is_written() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let _: () = raw.rpush("{lst}", "item").await.unwrap();
        let outcomes = all_four(&service, "lst").await;
        assert_eq!(
            outcomes,
            (
                AcquireOutcome::Refused(Refusal::WrongType),
                RenewOutcome::Refused(Refusal::WrongType),
                ReleaseOutcome::Refused(Refusal::WrongType),
                HolderOutcome::Refused(Refusal::WrongType),
            )
        );
        let counter: bool = raw.exists("{lst}:fence").await.unwrap();
        assert!(!counter, "no fence spent on a refused acquire");
        let len: u64 = raw.llen("{lst}").await.unwrap();
        assert_eq!(len, 1, "the list is left alone");
        let err = service
            .try_acquire("lst", token(1, 1), &Identity::EMPTY, ms(1_000))
            .await
            .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains(&format!("acquire on 127.0.0.1:{}", server.port()))
                && shown.contains("a Redis type other than a string")
                && shown.contains("WRONGTYPE"),
            "{shown}"
        );
    });
}

#[test]
fn garbage_in_the_lock_value_is_wrong_type_to_acquire_and_not_owner_to_renew() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let t = token(1, 1);
        let ours = t.encode().as_str().to_owned();
        for (i, garbage) in [
            "garbage".to_owned(),
            ours.clone(),
            format!("{ours}\n1"),
            format!("{ours}\n0\nid"),
            format!("{ours}\n-3\nid"),
            format!("{ours}\nx\nid"),
            format!("{ours}\n01\nid"),
            format!("{ours}\n1\nid\nextra"),
            "\n1\nid".to_owned(),
        ]
        .iter()
        .enumerate()
        {
            let key = format!("g{i}");
            let _: () = raw.set(format!("{{{key}}}"), garbage).await.unwrap();
            assert_eq!(
                LockService::acquire(&service, &key, t, &Identity::EMPTY, ms(1_000)).await,
                AcquireOutcome::Refused(Refusal::WrongType),
                "{garbage:?}"
            );
            assert_eq!(
                LockService::holder(&service, &key).await,
                HolderOutcome::Refused(Refusal::WrongType),
                "{garbage:?}"
            );
            let err = service.try_holder(&key).await.unwrap_err();
            assert!(
                err.to_string().contains("a value leasehold did not write"),
                "{err}"
            );
            let stored: String = raw.get(format!("{{{key}}}")).await.unwrap();
            assert_eq!(&stored, garbage, "left alone");
            let counter: bool = raw.exists(format!("{{{key}}}:fence")).await.unwrap();
            assert!(!counter, "no fence spent");
        }
        // A foreign value means the grant is not ours: renew and release say so, and
        // touch nothing.
        let _: () = raw.set("{gr}", "someone else's").await.unwrap();
        assert_eq!(
            LockService::renew(&service, "gr", t, Fence(1), ms(1_000)).await,
            RenewOutcome::NotOwner
        );
        assert_eq!(
            LockService::release(&service, "gr", t).await,
            ReleaseOutcome::NotOwner
        );
        let stored: String = raw.get("{gr}").await.unwrap();
        assert_eq!(stored, "someone else's");
    });
}

#[test]
fn a_garbage_fence_counter_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    run_local(async {
        let service = service(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let t = token(1, 1);
        let _: () = raw.set("{text}:fence", "abc").await.unwrap();
        let _: () = raw.set("{neg}:fence", "-5").await.unwrap();
        let _: () = raw.set("{zeros}:fence", "007").await.unwrap();
        let _: () = raw.hset("{hash}:fence", "f", "v").await.unwrap();
        let _: () = raw.set("{max}:fence", i64::MAX).await.unwrap();
        for (name, refusal, code) in [
            ("text", Refusal::WrongType, "LEASEHOLD"),
            ("neg", Refusal::WrongType, "LEASEHOLD"),
            ("zeros", Refusal::WrongType, "LEASEHOLD"),
            ("hash", Refusal::WrongType, "WRONGTYPE"),
            ("max", Refusal::Unsupported, "LEASEHOLD_EXHAUSTED"),
        ] {
            let err = service
                .try_acquire(name, t, &Identity::EMPTY, ms(1_000))
                .await
                .unwrap_err();
            assert_eq!(err.service_code(), Some(code), "{name}: {err}");
            assert_eq!(err.refusal(), Some(refusal), "{name}: {err}");
            let lock: Option<String> = raw.get(format!("{{{name}}}")).await.unwrap();
            assert_eq!(lock, None, "{name}: nothing written before the refusal");
            eprintln!("[garbage counter] {name}: {err}");
        }
        assert_eq!(
            service
                .raise_fence("text", Fence(3))
                .await
                .unwrap_err()
                .refusal(),
            Some(Refusal::WrongType)
        );
    });
}

#[test]
fn a_wrong_or_missing_password_is_a_clear_error_at_connect() {
    let server = RedisServer::start_with(RedisOptions {
        password: Some("s3cret".into()),
        ..RedisOptions::default()
    });
    run_local(async {
        let service = service(&server.url()).await;
        assert!(matches!(
            service
                .try_acquire("p", token(1, 1), &Identity::EMPTY, ms(1_000))
                .await
                .unwrap(),
            leasehold_redis::Acquired::Granted { .. }
        ));
        let at = format!("127.0.0.1:{}", server.port());
        for (url, code) in [
            (format!("redis://:wrong@{at}"), "WRONGPASS"),
            (format!("redis://{at}"), "NOAUTH"),
        ] {
            let started = StdInstant::now();
            let err = RedisLockService::connect(&url).await.unwrap_err();
            let shown = err.to_string();
            eprintln!("[password] {url}: {shown} (after {:?})", started.elapsed());
            assert!(started.elapsed() < std_ms(2_000), "{:?}", started.elapsed());
            assert_eq!(err.op(), Op::Connect);
            assert_eq!(err.refusal(), Some(Refusal::Unauthorized), "{err:?}");
            assert_eq!(err.service_code(), Some(code), "{err:?}");
            assert!(
                shown.contains(&at) && shown.contains("authentication failed: check the password"),
                "{shown}"
            );
            assert!(!shown.contains("ERR "), "{shown}");
            assert!(!shown.contains("wrong@"), "no secrets in messages: {shown}");
        }
    });
}

#[test]
fn credentials_refused_on_a_later_call_are_unauthorized() {
    let server = RedisServer::start();
    run_local(async {
        let mut raw = raw(&server.url()).await;
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "app", "on", ">pw", "~*", "+@all"])
            .query_async(&mut raw)
            .await
            .unwrap();
        let url = format!("redis://app:pw@127.0.0.1:{}", server.port());
        let service = service(&url).await;
        let t = token(1, 1);
        assert!(matches!(
            LockService::acquire(&service, "acl", t, &Identity::EMPTY, ms(1_000)).await,
            AcquireOutcome::Granted { .. }
        ));
        // The permissions go: NOPERM on the open connection.
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "app", "-@all"])
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(
            LockService::renew(&service, "acl", t, Fence(1), ms(1_000)).await,
            RenewOutcome::Refused(Refusal::Unauthorized)
        );
        let err = service.try_holder("acl").await.unwrap_err();
        assert!(err.to_string().contains("permission denied"), "{err}");

        // The password changes and the connection is dropped: the reconnection's AUTH
        // is refused.
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "app", "+@all", "resetpass", ">new"])
            .query_async(&mut raw)
            .await
            .unwrap();
        let _: () = redis::cmd("CLIENT")
            .arg(&["KILL", "USER", "app"])
            .query_async(&mut raw)
            .await
            .unwrap();
        let started = StdInstant::now();
        let mut outcomes = Vec::new();
        // The first request may meet the dropped connection itself (Transport); the
        // ones after it meet the refused AUTH.
        for _ in 0..3 {
            outcomes.push(LockService::renew(&service, "acl", t, Fence(1), ms(1_000)).await);
        }
        eprintln!(
            "[credentials] after the password change: {outcomes:?} in {:?}",
            started.elapsed()
        );
        assert_eq!(
            outcomes.last(),
            Some(&RenewOutcome::Refused(Refusal::Unauthorized)),
            "{outcomes:?}"
        );
    });
}

#[test]
fn redis_stopped_after_connect_is_indeterminate_within_the_request_timeout() {
    let mut server = RedisServer::start();
    run_local(async {
        let timeout = std_ms(1_000);
        let service = RedisLockService::builder(server.url())
            .request_timeout(timeout)
            .connect()
            .await
            .unwrap();
        let t = token(1, 1);
        assert!(matches!(
            LockService::acquire(&service, "down", t, &Identity::EMPTY, ms(5_000)).await,
            AcquireOutcome::Granted { .. }
        ));
        server.kill();
        // The first request meets the broken connection and fails at once; the ones
        // after it wait for the reconnection attempts (bounded by the backoff and the
        // request timeout).
        for attempt in 0..3 {
            let started = StdInstant::now();
            let renewed = LockService::renew(&service, "down", t, Fence(1), ms(5_000)).await;
            let took = started.elapsed();
            eprintln!("[stopped] renew: {renewed:?} after {took:?}");
            assert!(
                matches!(
                    renewed,
                    RenewOutcome::Indeterminate(Indeterminate::Transport | Indeterminate::Timeout)
                ),
                "{renewed:?}"
            );
            assert!(took <= timeout + std_ms(100), "{took:?}");
            if attempt == 0 {
                assert_eq!(
                    renewed,
                    RenewOutcome::Indeterminate(Indeterminate::Transport)
                );
                assert!(took < std_ms(100), "{took:?}");
            }
        }
        let err = service.try_holder("down").await.unwrap_err();
        let shown = err.to_string();
        eprintln!("[stopped] {shown}");
        assert!(
            matches!(
                err.indeterminate(),
                Some(Indeterminate::Transport | Indeterminate::Timeout)
            ),
            "{err:?}"
        );
        assert!(
            shown.contains(&format!("on 127.0.0.1:{}: ", server.port())),
            "{shown}"
        );
    });
}

/// A Redis that accepts connections but answers nothing (SIGSTOPped: the kernel still
/// completes the TCP handshake) fails `connect` within its bounds, with a typed
/// error: each connection attempt by the connect timeout (here one attempt, no
/// retries; by default the first connection is retried like a reconnection), loading
/// the scripts by the request timeout.
#[test]
fn connect_to_a_stopped_redis_fails_within_its_bounds() {
    let server = RedisServer::start();
    server.pause();
    run_local(async {
        let (connect, request) = (std_ms(300), std_ms(400));
        let started = StdInstant::now();
        let result = RedisLockService::builder(server.url())
            .connect_timeout(connect)
            .request_timeout(request)
            .reconnect_backoff(std_ms(10), std_ms(10), 0)
            .connect()
            .await;
        let took = started.elapsed();
        let err = result.expect_err("nothing answers");
        eprintln!("[stopped before connect] {err} after {took:?}");
        assert!(
            matches!(
                err.indeterminate(),
                Some(Indeterminate::Transport | Indeterminate::Timeout)
            ),
            "{err:?}"
        );
        assert!(took <= connect + request + std_ms(200), "{took:?}");
    });
    server.resume();
}

#[test]
fn a_read_only_replica_is_indeterminate_never_a_refusal() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    });
    run_local(async {
        let on_primary = service(&primary.url()).await;
        let on_replica = service(&replica.url()).await;
        let t = token(1, 1);
        // A grant made on the primary, replicated.
        let leasehold_redis::Acquired::Granted { fence, .. } = on_primary
            .try_acquire("ro", t, &Identity::new("p").unwrap(), ms(10_000))
            .await
            .unwrap()
        else {
            panic!("free")
        };
        let replica_conn = raw(&replica.url()).await;
        wait_for("replication", std_ms(5_000), || {
            let mut conn = replica_conn.clone();
            async move {
                let value: Option<String> = conn.get("{ro}").await.unwrap();
                value.is_some()
            }
        })
        .await;
        // Writes on the replica answer READONLY: may clear (a failover), so the lease
        // retries; never a final refusal, never a grant.
        assert_eq!(
            LockService::acquire(&on_replica, "free", t, &Identity::EMPTY, ms(1_000)).await,
            AcquireOutcome::Indeterminate(Indeterminate::Service)
        );
        assert_eq!(
            LockService::renew(&on_replica, "ro", t, fence, ms(1_000)).await,
            RenewOutcome::Indeterminate(Indeterminate::Service)
        );
        let err = on_replica
            .try_renew("ro", t, fence, ms(1_000))
            .await
            .unwrap_err();
        assert_eq!(err.service_code(), Some("READONLY"), "{err}");
        assert!(err.to_string().contains("may clear"), "{err}");
        // Reads work: the replica reports the holder.
        let HolderOutcome::Held(holder) = LockService::holder(&on_replica, "ro").await else {
            panic!("the replicated grant")
        };
        assert_eq!((holder.identity.as_str(), holder.fence), ("p", fence));
    });
}

#[test]
fn a_refused_connection_names_the_address() {
    let port = free_port();
    run_local(async {
        let started = StdInstant::now();
        let err = RedisLockService::connect(&format!("redis://127.0.0.1:{port}"))
            .await
            .unwrap_err();
        let shown = err.to_string();
        eprintln!("[refused] {shown} (after {:?})", started.elapsed());
        assert!(started.elapsed() < std_ms(3_000));
        assert_eq!(
            err.indeterminate(),
            Some(Indeterminate::Transport),
            "{err:?}"
        );
        assert!(
            shown.starts_with(&format!("connect on 127.0.0.1:{port}: connection failed: "))
                && shown.contains("is redis-server running"),
            "{shown}"
        );
        assert_eq!(
            shown.to_lowercase().matches("connection refused").count(),
            1,
            "the cause once: {shown}"
        );
        assert!(std::error::Error::source(&err).is_none());
    });
}

#[test]
fn unusable_urls_say_what_is_wrong_with_them() {
    run_local(async {
        for (url, says) in [
            ("http://127.0.0.1:1", "the scheme is `http`"),
            ("redis://127.0.0.1:99999", "invalid port number"),
            ("127.0.0.1:6379", "expected redis://"),
            (
                "redis://:pw@127.0.0.1:6379/db",
                "the database `/db` is not a number",
            ),
        ] {
            let err = RedisLockService::connect(url).await.unwrap_err();
            assert!(matches!(err, RedisLockError::Config { .. }), "{err:?}");
            let shown = err.to_string();
            assert!(shown.contains(says), "{url}: {shown}");
            assert!(!shown.contains(":pw@"), "{shown}");
            eprintln!("[url] {shown}");
        }
        #[cfg(not(feature = "tls"))]
        {
            let err = RedisLockService::connect("rediss://127.0.0.1:1")
                .await
                .unwrap_err();
            assert!(err.to_string().contains("feature `tls`"), "{err}");
        }
    });
}

#[test]
fn failures_are_logged_with_tracing() {
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
            let proxy = Proxy::start(server.port()).await;
            let service = RedisLockService::builder(proxy_url(&proxy))
                .request_timeout(std_ms(100))
                .connect()
                .await
                .unwrap();
            let mut raw = raw(&server.url()).await;
            let _: () = raw.hset("{typed}", "f", "v").await.unwrap();
            let t = token(1, 1);
            assert_eq!(
                LockService::acquire(&service, "typed", t, &Identity::EMPTY, ms(1_000)).await,
                AcquireOutcome::Refused(Refusal::WrongType)
            );
            assert_eq!(
                LockService::acquire(&service, "", t, &Identity::EMPTY, ms(1_000)).await,
                AcquireOutcome::Refused(Refusal::InvalidKey)
            );
            proxy.set_mode(ProxyMode::Stall);
            assert_eq!(
                LockService::renew(&service, "k", t, Fence(1), ms(1_000)).await,
                RenewOutcome::Indeterminate(Indeterminate::Timeout)
            );
        })
    });
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
            .to_owned()
    };
    let wrongtype = line("WRONGTYPE");
    assert!(
        wrongtype.contains("ERROR") && wrongtype.contains("op=acquire"),
        "{wrongtype}"
    );
    let invalid = line("invalid key: it is empty");
    assert!(invalid.contains("ERROR"), "{invalid}");
    let timeout = line("no answer within 100ms");
    assert!(
        timeout.contains("WARN") && timeout.contains("op=renew"),
        "{timeout}"
    );
}
