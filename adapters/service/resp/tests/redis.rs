//! The service against a real `redis-server`, through `embedded-io-adapters` over a
//! tokio `TcpStream`: the conformance suite, restarts, stalls, garbage, refusals.
//!
//! The service is single-threaded (`LocalLockService`), so every test runs on a
//! current-thread runtime.

use std::time::Instant as StdInstant;

use embedded_io_adapters::tokio_1::FromTokio;
use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Indeterminate, Owner, OwnerToken,
    Refusal, ReleaseOutcome, RenewOutcome, Term,
};
use leasehold_conformance::breach::the_timing_clauses_catch_early_expiry;
use leasehold_conformance::{run_all, Capabilities};
use leasehold_driver::LocalLockService;
use leasehold_resp::{Auth, Connect, Error, ProtocolError, RespLockService};
use leasehold_test_support::redis::resp_frame_len;
use leasehold_test_support::{Proxy, ProxyMode, RedisOptions, RedisServer};
use leasehold_tokio::LeaseClock;
use tokio::net::TcpStream;

type Service<'a> = RespLockService<'a, Factory, LeaseClock>;

/// Connects to `127.0.0.1:port` (TCP_NODELAY: a request goes out in one piece).
#[derive(Clone, Copy)]
struct Factory(u16);

impl Connect for Factory {
    type Connection = FromTokio<TcpStream>;
    type Error = std::io::Error;

    async fn connect(&mut self) -> Result<Self::Connection, Self::Error> {
        let stream = TcpStream::connect(("127.0.0.1", self.0)).await?;
        stream.set_nodelay(true)?;
        Ok(FromTokio::new(stream))
    }
}

fn service<'a>(port: u16) -> Service<'a> {
    RespLockService::new(Factory(port), LeaseClock::start())
}

fn token(n: u8) -> OwnerToken {
    Owner([n; 16]).token(Term(1))
}

fn id(text: &str) -> Identity {
    Identity::new(text).unwrap()
}

const TTL: Duration = Duration::from_millis(30_000);

async fn granted(s: &Service<'_>, key: &str, token: OwnerToken) -> Fence {
    match s.acquire(key, token, &id("test"), TTL).await {
        AcquireOutcome::Granted { fence, ttl } => {
            assert_eq!(ttl, TTL);
            fence
        }
        other => panic!("acquire({key:?}): {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn conformance() {
    let server = RedisServer::start();
    let s = service(server.port());
    run_all(&s, &Capabilities::redis(Duration::from_millis(300))).await;
}

/// The timing clauses see this service on a Redis that expires keys early (grants
/// applying less than they report, renewals reporting more than they apply).
#[tokio::test(flavor = "current_thread")]
async fn the_timing_clauses_catch_a_redis_that_expires_early() {
    let server = RedisServer::start();
    let s = service(server.port());
    let caps = Capabilities::redis(Duration::from_millis(300));
    the_timing_clauses_catch_early_expiry(&s, &caps, &caps).await;
}

#[tokio::test(flavor = "current_thread")]
async fn conformance_with_auth_and_the_smallest_buffers_that_fit() {
    let server = RedisServer::start_with(RedisOptions {
        password: Some("s3cret".into()),
        ..RedisOptions::default()
    });
    // 160 bytes hold the longest answer (a 64-byte identity); 1 byte of write buffer
    // sends every request byte by byte.
    let s: RespLockService<'_, Factory, LeaseClock, 160, 1> =
        RespLockService::new(Factory(server.port()), LeaseClock::start()).with_auth(Auth {
            user: None,
            password: "s3cret",
        });
    run_all(&s, &Capabilities::redis(Duration::from_millis(300))).await;
}

#[tokio::test(flavor = "current_thread")]
async fn credentials_refused_are_unauthorized() {
    let server = RedisServer::start_with(RedisOptions {
        password: Some("s3cret".into()),
        ..RedisOptions::default()
    });
    let none = service(server.port());
    assert_eq!(
        none.acquire("k", token(1), &id("a"), TTL).await,
        AcquireOutcome::Refused(Refusal::Unauthorized),
        "NOAUTH"
    );
    let wrong = service(server.port()).with_auth(Auth {
        user: None,
        password: "wrong",
    });
    assert_eq!(
        wrong.renew("k", token(1), Fence(1), TTL).await,
        RenewOutcome::Refused(Refusal::Unauthorized),
        "WRONGPASS"
    );
    let named = service(server.port()).with_auth(Auth {
        user: Some("default"),
        password: "s3cret",
    });
    granted(&named, "k", token(1)).await;

    // A password for a Redis that has none: `-ERR AUTH <password> called without any
    // password configured…`. Not retryable either.
    let open = RedisServer::start();
    let misconfigured = service(open.port()).with_auth(Auth {
        user: None,
        password: "s3cret",
    });
    assert_eq!(
        misconfigured.acquire("k", token(1), &id("a"), TTL).await,
        AcquireOutcome::Refused(Refusal::Unauthorized),
        "ERR to AUTH"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn foreign_values_wrong_types_and_invalid_keys_are_refused() {
    let server = RedisServer::start();
    let s = service(server.port());
    assert_eq!(server.inline("LPUSH {list} x").as_deref(), Some(":1\r\n"));
    assert_eq!(
        s.acquire("list", token(1), &id("a"), TTL).await,
        AcquireOutcome::Refused(Refusal::WrongType)
    );
    assert_eq!(
        s.holder("list").await,
        HolderOutcome::Refused(Refusal::WrongType)
    );
    assert_eq!(server.inline("SET {foreign} x").as_deref(), Some("+OK\r\n"));
    assert_eq!(
        s.acquire("foreign", token(1), &id("a"), TTL).await,
        AcquireOutcome::Refused(Refusal::WrongType),
        "LEASEHOLD"
    );
    assert_eq!(
        s.acquire("a{b}", token(1), &id("a"), TTL).await,
        AcquireOutcome::Refused(Refusal::InvalidKey)
    );
    // The connection stayed usable through the error replies.
    granted(&s, "fine", token(1)).await;
    assert_eq!(s.connects(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn fences_are_exact_beyond_2_pow_53() {
    let server = RedisServer::start();
    let s = service(server.port());
    assert_eq!(
        server.inline("SET {big}:fence 9007199254740993").as_deref(),
        Some("+OK\r\n")
    );
    assert_eq!(
        granted(&s, "big", token(1)).await,
        Fence(9_007_199_254_740_994)
    );
    match s.holder("big").await {
        HolderOutcome::Held(h) => assert_eq!(h.fence, Fence(9_007_199_254_740_994)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_flushed_script_is_loaded_again() {
    let server = RedisServer::start();
    let s = service(server.port());
    let fence = granted(&s, "k", token(1)).await;
    assert_eq!(s.script_reloads(), 1, "the first EVALSHA meets NOSCRIPT");
    assert_eq!(server.inline("SCRIPT FLUSH").as_deref(), Some("+OK\r\n"));
    assert_eq!(
        s.renew("k", token(1), fence, TTL).await,
        RenewOutcome::Renewed { ttl: TTL }
    );
    assert_eq!(s.script_reloads(), 2);
    assert_eq!(s.connects(), 1);
}

/// `$request`, once more if it met the connection a restart killed
/// (`Indeterminate(Transport)`): the next one reconnects.
macro_rules! after_reconnect {
    ($request:expr, $transport:expr) => {{
        let first = $request;
        if first == $transport {
            let second = $request;
            assert_ne!(second, $transport, "still failing after reconnecting");
            second
        } else {
            first
        }
    }};
}

/// TTL and quarantine (`max_ttl`) of the restart tests: short, so they wait little.
const QUICK: Duration = Duration::from_millis(1_000);

/// A service whose quarantine after a loss of state is [`QUICK`].
fn quick<'a>(port: u16) -> Service<'a> {
    service(port).with_max_ttl(QUICK)
}

/// Acquires `key` for `token` once the quarantine is over, asking every 50 ms for at
/// most `QUICK` and a second more; the fence and how long the quarantine held it off.
async fn granted_after_quarantine(
    s: &Service<'_>,
    key: &str,
    token: OwnerToken,
) -> (Fence, std::time::Duration) {
    let started = StdInstant::now();
    loop {
        match s.acquire(key, token, &id("next"), QUICK).await {
            AcquireOutcome::Granted { fence, .. } => return (fence, started.elapsed()),
            AcquireOutcome::HeldByAnother(h) if h.is_quarantine() => {
                assert!(h.remaining <= QUICK, "{h:?}");
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(2),
                    "{h:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            other => panic!("acquire({key:?}) after a restart: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_restart_without_persistence_loses_the_grant_and_quarantines_the_key() {
    let mut server = RedisServer::start();
    let s = quick(server.port());
    let AcquireOutcome::Granted { fence, .. } = s.acquire("k", token(1), &id("test"), QUICK).await
    else {
        panic!("free")
    };
    server.restart();
    let renewed = after_reconnect!(
        s.renew("k", token(1), fence, QUICK).await,
        RenewOutcome::Indeterminate(Indeterminate::Transport)
    );
    assert_eq!(
        renewed,
        RenewOutcome::NotOwner,
        "the key is gone: never re-created"
    );
    assert_eq!(s.connects(), 2);
    // Nothing is granted for the quarantine; then the counter is gone too, but a new
    // grant's fence is at least Redis's clock in µs: above the lost one.
    let (next, waited) = granted_after_quarantine(&s, "k", token(2)).await;
    assert!(next > fence);
    assert!(
        waited >= std::time::Duration::from(QUICK) - std::time::Duration::from_millis(60),
        "{waited:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_restart_with_aof_keeps_the_grant_and_the_fences() {
    let mut server = RedisServer::start_with(RedisOptions {
        appendonly: true,
        ..RedisOptions::default()
    });
    let s = quick(server.port());
    let AcquireOutcome::Granted { fence, .. } = s.acquire("k", token(1), &id("test"), QUICK).await
    else {
        panic!("free")
    };
    server.restart();
    let renewed = after_reconnect!(
        s.renew("k", token(1), fence, QUICK).await,
        RenewOutcome::Indeterminate(Indeterminate::Transport)
    );
    assert_eq!(renewed, RenewOutcome::Renewed { ttl: QUICK });
    match s.acquire("k", token(2), &id("other"), QUICK).await {
        AcquireOutcome::HeldByAnother(h) => {
            assert_eq!((h.fence, h.identity), (fence, id("test")));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.release("k", token(1)).await, ReleaseOutcome::Released);
    // Another process holds the data now: the AOF may have lost the latest grants
    // (with `appendfsync everysec`), so the key waits out the quarantine.
    let (next, _) = granted_after_quarantine(&s, "k", token(2)).await;
    assert!(next > fence);
}

/// The quarantine clause of the conformance suite, with `FLUSHALL` as the loss.
#[tokio::test(flavor = "current_thread")]
async fn after_flushall_nothing_is_granted_until_the_quarantine_ends() {
    let server = RedisServer::start();
    let s = quick(server.port());
    let verdict = leasehold_conformance::a_lost_state_grants_nothing_until_the_quarantine_ends(
        &s,
        &Capabilities::redis(Duration::from_millis(300)),
        QUICK,
        || async {
            assert_eq!(server.inline("FLUSHALL").as_deref(), Some("+OK\r\n"));
        },
    )
    .await;
    if let Err(violation) = verdict {
        panic!("{violation}");
    }
    let too_long = QUICK.saturating_add(Duration::from_millis(1));
    assert_eq!(
        s.try_acquire("t", token(3), &id("t"), too_long).await,
        Err(Error::TtlAboveMax)
    );
    assert_eq!(
        s.renew("t", token(3), Fence(1), too_long).await,
        RenewOutcome::Refused(Refusal::Unsupported)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_stall_is_a_bounded_timeout_and_the_late_reply_is_never_read() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let timeout = Duration::from_millis(200);
    let s = RespLockService::new(Factory(proxy.port()), LeaseClock::start())
        .with_request_timeout(timeout);
    let fence = granted(&s, "k", token(1)).await;
    proxy.stall();
    let started = StdInstant::now();
    assert_eq!(
        s.holder("k").await,
        HolderOutcome::Indeterminate(Indeterminate::Timeout)
    );
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(200) && took < std::time::Duration::from_secs(2),
        "{took:?}"
    );
    // The holder reply held by the stall flows to the old connection once the proxy
    // resumes; the service has dropped it, so the renewal reads its own answer.
    proxy.resume();
    assert_eq!(
        s.renew("k", token(1), fence, TTL).await,
        RenewOutcome::Renewed { ttl: TTL }
    );
    assert_eq!(s.connects(), 2);
    // A new connection through a stalled proxy is bounded too.
    proxy.stall();
    proxy.cut();
    let started = StdInstant::now();
    let outcome = after_reconnect!(
        s.holder("k").await,
        HolderOutcome::Indeterminate(Indeterminate::Transport)
    );
    assert_eq!(
        outcome,
        HolderOutcome::Indeterminate(Indeterminate::Timeout)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(s.connects(), 3);
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_request_leaves_the_connection_to_be_made_anew() {
    let server = RedisServer::start();
    let s = service(server.port());
    let fence = granted(&s, "k", token(1)).await;
    {
        // Polled once: the request is on the wire, its answer unread.
        let mut request = std::pin::pin!(s.holder("k"));
        let polled = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(request.as_mut(), cx))
        })
        .await;
        assert!(polled.is_pending());
    }
    assert_eq!(
        s.renew("k", token(1), fence, TTL).await,
        RenewOutcome::Renewed { ttl: TTL }
    );
    assert_eq!(s.connects(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_request_in_flight_is_busy_not_mixed_up() {
    let server = RedisServer::start();
    let s = service(server.port());
    granted(&s, "k", token(1)).await;
    let first = s.holder("k");
    let second = s.try_holder("k");
    let (first, second) = tokio::join!(first, second);
    assert!(matches!(first, HolderOutcome::Held(_)), "{first:?}");
    assert_eq!(second, Err(Error::Busy));
}

#[tokio::test(flavor = "current_thread")]
async fn garbage_replies_are_typed_errors_never_grants() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let s = service(proxy.port());
    granted(&s, "warm", token(1)).await;
    let long = format!("${}\r\n{}\r\n", 300, "x".repeat(300)).into_bytes();
    for (reply, want) in [
        (
            b"*2\r\n:1\r\n$3\r\nabc\r\n".to_vec(),
            Error::Protocol(ProtocolError::Unexpected),
        ),
        (
            b"+OK\r\n".to_vec(),
            Error::Protocol(ProtocolError::Unexpected),
        ),
        (
            b"*2\r\n:1\r\n:7\r\n".to_vec(),
            Error::Protocol(ProtocolError::Unexpected),
        ),
        (long, Error::Protocol(ProtocolError::ReplyTooLong)),
    ] {
        proxy.set_mode(ProxyMode::RewriteReplies {
            reply: reply.clone(),
            frame: resp_frame_len,
        });
        let got = s
            .try_acquire("k", token(2), &id("b"), TTL)
            .await
            .unwrap_err();
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&reply));
        assert_eq!(
            s.acquire("k", token(2), &id("b"), TTL).await,
            AcquireOutcome::Indeterminate(Indeterminate::Protocol)
        );
    }
    proxy.set_mode(ProxyMode::RewriteReplies {
        reply: b"-WRONGTYPE forged\r\n".to_vec(),
        frame: resp_frame_len,
    });
    assert_eq!(
        s.acquire("k", token(2), &id("b"), TTL).await,
        AcquireOutcome::Refused(Refusal::WrongType)
    );
    proxy.set_mode(ProxyMode::Forward);
    // The forged replies carried real requests: the acquire of `k` took effect.
    let held = after_reconnect!(
        s.holder("k").await,
        HolderOutcome::Indeterminate(Indeterminate::Protocol)
    );
    assert!(
        matches!(held, HolderOutcome::Held(h) if h.identity == id("b")),
        "{held:?}"
    );
    assert_eq!(s.release("k", token(2)).await, ReleaseOutcome::Released);
}
