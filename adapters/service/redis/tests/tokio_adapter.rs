//! The Redis service under the tokio adapter (`leasehold_tokio::acquire` with an
//! `Arc<RedisLockService>`) on a multi-threaded runtime: the production setup.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use common::*;
use leasehold::{Event, Fence, GateError, Identity, LossReason, Refusal};
use leasehold_redis::RedisLockService;
use leasehold_tokio::{acquire, acquire_with, AcquireError, AcquireOptions, CheckError, LeaseEnd};
use redis::AsyncCommands;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn shared(url: &str) -> Arc<RedisLockService> {
    Arc::new(service(url).await)
}

#[test]
fn acquire_renew_release_through_the_tokio_adapter() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = shared(&server.url()).await;
        let mut raw = raw(&server.url()).await;
        let lease = acquire(service.clone(), "tk", config(300)).await.unwrap();
        assert_eq!(lease.check(), Ok(lease.granted_fence()));
        let stored = stored_token(&mut raw, "tk").await;
        assert_eq!(stored.as_deref(), Some(lease.token().encode().as_str()));
        let mut events = lease.events();
        let mut renewals = 0;
        while renewals < 3 {
            let timed = tokio::time::timeout(std_ms(1_000), events.recv())
                .await
                .expect("renewals every T/3")
                .unwrap();
            if matches!(timed.event, Event::Renewed { .. }) {
                renewals += 1;
            }
        }
        assert_eq!(lease.release().await, LeaseEnd::Released);
        assert!(matches!(
            lease.check(),
            Err(CheckError::ReleaseRequested | CheckError::Gate(GateError::Released))
        ));
        let gone: Option<String> = raw.get("{tk}").await.unwrap();
        assert_eq!(gone, None);
    });
}

#[test]
fn outside_delete_and_long_stall_end_the_lease_through_the_adapter() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let direct = shared(&server.url()).await;
        let mut raw = raw(&server.url()).await;

        // DEL from outside: the next renewal says NotOwner.
        let lease = acquire(direct.clone(), "tkdel", config(300)).await.unwrap();
        let _: () = raw.del("{tkdel}").await.unwrap();
        let end = tokio::time::timeout(std_ms(1_000), lease.lost())
            .await
            .unwrap();
        assert_eq!(end, LeaseEnd::Lost(LossReason::NotOwner));
        assert_eq!(
            lease.check(),
            Err(CheckError::Gate(GateError::Lost(LossReason::NotOwner)))
        );

        // A stalled network: Expired at the safe deadline, before Redis's TTL.
        let proxy = Proxy::start(server.port()).await;
        let stalled = shared(&proxy_url(&proxy)).await;
        let lease = acquire(stalled, "tkstall", config(300)).await.unwrap();
        proxy.set_mode(ProxyMode::Stall);
        let end = tokio::time::timeout(std_ms(1_000), lease.lost())
            .await
            .unwrap();
        assert_eq!(end, LeaseEnd::Lost(LossReason::Expired));
        let pttl: i64 = raw.pttl("{tkstall}").await.unwrap();
        assert!(
            pttl > 0,
            "Redis still holds the key ({pttl} ms left) when the gate closes"
        );
        proxy.set_mode(ProxyMode::Forward);
    });
}

#[test]
fn a_busy_key_names_its_holder_and_a_wrong_type_is_refused_at_once() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = shared(&server.url()).await;
        let holder = acquire_with(
            service.clone(),
            "tkbusy",
            config(1_000),
            AcquireOptions::new().identity(Identity::new("first-holder").unwrap()),
        )
        .await
        .unwrap();
        let err = acquire_with(
            service.clone(),
            "tkbusy",
            config(1_000),
            AcquireOptions::new().max_wait(std_ms(50)),
        )
        .await
        .unwrap_err();
        let AcquireError::Busy { holder: Some(who) } = err else {
            panic!("{err:?}")
        };
        assert_eq!(who.identity.as_str(), "first-holder");
        assert_eq!(who.fence, holder.granted_fence());
        holder.release().await;

        // A key another program made a list: refused at once, though unbounded.
        let mut raw = raw(&server.url()).await;
        let _: () = raw.rpush("{tklist}", "x").await.unwrap();
        let started = std::time::Instant::now();
        let err = acquire(service.clone(), "tklist", config(1_000))
            .await
            .unwrap_err();
        assert_eq!(err, AcquireError::Refused(Refusal::WrongType));
        assert!(started.elapsed() < std_ms(500), "{:?}", started.elapsed());
        let err = acquire(service, "a{b}", config(1_000)).await.unwrap_err();
        assert!(matches!(err, AcquireError::InvalidKey(_)), "{err:?}");
    });
}

/// 8 contenders on one key through the adapter for a few seconds: every write that
/// passed `check()` is admitted by the fenced storage, fences increase from holder to
/// holder, and every holder's writes end before the next holder's begin.
#[test]
fn contenders_through_the_adapter_never_overlap() {
    let secs: u64 = std::env::var("LEASEHOLD_REDIS_CONTENTION_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(5, |s: u64| s.min(5));
    let server = RedisServer::start();
    let terms = runtime().block_on(async {
        let storage = Storage::default();
        let terms = Arc::new(Mutex::new(Vec::new()));
        let end = tokio::time::Instant::now() + StdDuration::from_secs(secs);
        let mut tasks = Vec::new();
        for contender in 0..8u64 {
            let service = shared(&server.url()).await;
            let storage = storage.clone();
            let terms = terms.clone();
            tasks.push(tokio::spawn(async move {
                let mut round = 0;
                while tokio::time::Instant::now() < end {
                    round += 1;
                    let Ok(Ok(lease)) =
                        tokio::time::timeout_at(end, acquire(service.clone(), "tkc", config(300)))
                            .await
                    else {
                        break;
                    };
                    let fence = lease.granted_fence();
                    let hold = std_ms(10 + (contender * 37 + round * 53) % 200);
                    let until = tokio::time::Instant::now() + hold;
                    let mut first_write = None;
                    let mut last_write = None;
                    while tokio::time::Instant::now() < until {
                        let Ok(f) = lease.check() else { break };
                        let at = mono_now();
                        storage
                            .write(f)
                            .expect("a write that passed check() is never stale");
                        first_write.get_or_insert(at);
                        last_write = Some(at);
                        tokio::time::sleep(std_ms(2)).await;
                    }
                    lease.release().await;
                    if let (Some(first), Some(last)) = (first_write, last_write) {
                        terms.lock().unwrap().push((fence, first, last));
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        storage.assert_no_stale_admitted();
        let terms = terms.lock().unwrap().clone();
        terms
    });
    let mut terms = terms;
    terms.sort_by_key(|t| t.1);
    assert!(terms.len() >= 4, "too few terms: {}", terms.len());
    for pair in terms.windows(2) {
        let ((fa, _, last_a), (fb, first_b, _)) = (pair[0], pair[1]);
        assert!(fb > fa, "fences increase: {fa} then {fb}");
        assert!(last_a < first_b, "{fa} still writing after {fb} started");
    }
}

/// A lock service that counts the acquire attempts it is asked for: how the test
/// knows the acquire has already tried before Redis comes up.
struct Observed {
    inner: RedisLockService,
    attempts: tokio::sync::watch::Sender<usize>,
}

impl leasehold_driver::LockService for Observed {
    async fn acquire(
        &self,
        key: &str,
        token: leasehold::OwnerToken,
        identity: &Identity,
        ttl: leasehold::Duration,
    ) -> leasehold::AcquireOutcome {
        self.attempts.send_modify(|n| *n += 1);
        self.inner.acquire(key, token, identity, ttl).await
    }
    async fn renew(
        &self,
        key: &str,
        token: leasehold::OwnerToken,
        fence: Fence,
        ttl: leasehold::Duration,
    ) -> leasehold::RenewOutcome {
        self.inner.renew(key, token, fence, ttl).await
    }
    async fn release(&self, key: &str, token: leasehold::OwnerToken) -> leasehold::ReleaseOutcome {
        self.inner.release(key, token).await
    }
    async fn holder(&self, key: &str) -> leasehold::HolderOutcome {
        self.inner.holder(key).await
    }
}

/// A client started during an outage: `connect()` fails, `connect_lazily()` does not,
/// and an acquire begun while Redis is down keeps trying inside its wait bound (each
/// attempt an unknown outcome: a transport error, or no answer within the request
/// timeout while the connection is retried) and is granted once a `redis-server`
/// comes up on that port.
#[test]
fn a_lazily_connected_service_acquires_once_redis_comes_up_inside_the_wait_bound() {
    let mut server = RedisServer::start();
    server.stop();
    runtime().block_on(async {
        let url = server.url();
        let eager = RedisLockService::connect(&url).await.unwrap_err();
        assert!(
            matches!(eager, leasehold_redis::RedisLockError::Transport { .. }),
            "{eager:?}"
        );

        let (attempts, mut seen) = tokio::sync::watch::channel(0);
        let inner = RedisLockService::connect_lazily(&url).await.unwrap();
        let service = Arc::new(Observed { inner, attempts });
        let options = AcquireOptions::new().max_wait(StdDuration::from_secs(20));
        let acquiring = tokio::spawn(acquire_with(service, "outage", config(1_000), options));

        // Three attempts while nothing listens (the third starts after the first two
        // ended without a grant).
        tokio::time::timeout(StdDuration::from_secs(10), seen.wait_for(|n| *n >= 3))
            .await
            .expect("three attempts within 10 s")
            .unwrap();
        assert!(!acquiring.is_finished(), "still trying, not failed");

        // A new Redis comes up on the same port, after the acquire began.
        tokio::task::block_in_place(|| {
            server.restart();
            server.mark_data_set_new();
        });
        let lease = tokio::time::timeout(StdDuration::from_secs(10), acquiring)
            .await
            .expect("granted within 10 s of Redis coming up")
            .unwrap()
            .expect("granted");
        assert!(lease.check().is_ok());
        assert_eq!(lease.release().await, LeaseEnd::Released);
    });
}

/// The same lazy service, Redis never coming up: the acquire keeps trying, and ends
/// by its wait bound with a typed error — not at the first failed connection, and
/// not never. (The core gives up as soon as the next retry would fall past the
/// bound, so the end may come a retry interval before it.)
#[test]
fn a_lazily_connected_service_ends_at_the_wait_bound_while_redis_stays_down() {
    let mut server = RedisServer::start();
    server.stop();
    runtime().block_on(async {
        let (attempts, seen) = tokio::sync::watch::channel(0);
        let inner = RedisLockService::connect_lazily(&server.url())
            .await
            .unwrap();
        let service = Arc::new(Observed { inner, attempts });
        let bound = StdDuration::from_millis(1_500);
        let started = tokio::time::Instant::now();
        let options = AcquireOptions::new().max_wait(bound);
        let err = tokio::time::timeout(
            StdDuration::from_secs(10),
            acquire_with(service, "outage", config(1_000), options),
        )
        .await
        .expect("the acquire ends")
        .unwrap_err();
        let took = started.elapsed();
        assert!(matches!(err, AcquireError::Unavailable(_)), "{err:?}");
        let attempts = *seen.borrow();
        assert!(attempts >= 3, "kept trying: {attempts} attempts");
        // The bound, plus at most one request timeout (100 ms at T = 1 s), with room
        // for a loaded machine.
        assert!(
            took < bound + StdDuration::from_millis(1_000),
            "ended after {took:?}"
        );
    });
}
