//! `leasehold-resp` and `leasehold-redis` on the same keys of one real server: the
//! same scripts and the same value format, so each sees the other's grants (holder,
//! identity, fence) and the fences of both increase together.

use embedded_io_adapters::tokio_1::FromTokio;
use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Owner, ReleaseOutcome, RenewOutcome,
    Term,
};
use leasehold_driver::LocalLockService;
use leasehold_redis::RedisLockService;
use leasehold_resp::RespLockService;
use leasehold_test_support::RedisServer;
use leasehold_tokio::LeaseClock;

const TTL: Duration = Duration::from_millis(30_000);

#[tokio::test(flavor = "current_thread")]
async fn both_services_share_keys_values_and_fences() {
    let server = RedisServer::start();
    let port = server.port();
    let resp: RespLockService<'_, _, _> = RespLockService::new(
        move || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map(FromTokio::new)
        },
        LeaseClock::start(),
    );
    let redis = RedisLockService::connect(&server.url()).await.unwrap();
    let (device, host) = (Owner([1; 16]).token(Term(1)), Owner([2; 16]).token(Term(1)));
    let (device_id, host_id) = (
        Identity::new("device").unwrap(),
        Identity::new("host").unwrap(),
    );

    let AcquireOutcome::Granted { fence: first, .. } =
        resp.acquire("shared", device, &device_id, TTL).await
    else {
        panic!("the device's acquire")
    };
    match LocalLockService::acquire(&redis, "shared", host, &host_id, TTL).await {
        AcquireOutcome::HeldByAnother(h) => assert_eq!((h.identity, h.fence), (device_id, first)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        resp.renew("shared", device, first, TTL).await,
        RenewOutcome::Renewed { ttl: TTL }
    );
    assert_eq!(
        resp.release("shared", device).await,
        ReleaseOutcome::Released
    );

    let AcquireOutcome::Granted { fence: second, .. } =
        LocalLockService::acquire(&redis, "shared", host, &host_id, TTL).await
    else {
        panic!("the host's acquire")
    };
    assert!(second > first, "{second:?} after {first:?}");
    match resp.holder("shared").await {
        HolderOutcome::Held(h) => assert_eq!((h.identity, h.fence), (host_id, second)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        resp.renew("shared", host, second, TTL).await,
        RenewOutcome::Renewed { ttl: TTL },
        "a grant made by one service renews through the other"
    );
    assert_eq!(
        resp.renew("shared", host, Fence(second.0 + 1), TTL).await,
        RenewOutcome::NotOwner
    );
}
