//! A whole lease (core + driver) over this service, through a fault proxy to a real
//! `redis-server`: when the network goes silent, the lease is lost and its gate
//! closed while Redis still holds the key.

use embedded_io_adapters::tokio_1::FromTokio;
use leasehold::{Config, Duration, Event, Identity, Instant, Lease, Owner, WriteGate};
use leasehold_driver::{run_term, Report, Target};
use leasehold_resp::RespLockService;
use leasehold_test_support::{Proxy, RedisServer};
use leasehold_tokio::LeaseClock;
use tokio::sync::mpsc;

#[tokio::test(flavor = "current_thread")]
async fn a_stall_ends_the_lease_before_redis_expires_the_key() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let port = proxy.port();
    let clock = LeaseClock::start();
    let service: RespLockService<'_, _, _> = RespLockService::new(
        move || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map(FromTokio::new)
        },
        clock,
    )
    .with_request_timeout(Duration::from_millis(300));
    let config = Config::builder(Duration::from_millis(3_000))
        .build()
        .unwrap();
    let mut lease = Lease::new(config, Owner([9; 16]));
    let gate = WriteGate::new();
    let identity = Identity::new("device").unwrap();
    let target = Target {
        service: &service,
        key: "stalled",
        owner: Owner([9; 16]),
        identity: &identity,
    };
    let (events, mut received) = mpsc::unbounded_channel();
    let term = run_term(
        &mut lease,
        &gate,
        target,
        &clock,
        Instant::MAX,
        std::future::pending(),
        move |report| {
            if let Report::Event(event) = report {
                let _ = events.send(event);
            }
        },
    );
    let watch = async {
        let mut renewals = 0;
        loop {
            match received.recv().await.expect("the driver runs") {
                Event::Renewed { .. } => {
                    renewals += 1;
                    if renewals == 2 {
                        break;
                    }
                }
                Event::Acquired { .. } => {}
                other => panic!("before the stall: {other:?}"),
            }
        }
        assert!(gate.check(clock.now()).is_ok());
        proxy.stall();
        let stalled_at = std::time::Instant::now();
        loop {
            match received.recv().await.expect("the driver runs") {
                Event::Lost { .. } => break,
                Event::RenewFailed { .. } => {}
                other => panic!("during the stall: {other:?}"),
            }
        }
        let lost_after = stalled_at.elapsed();
        assert!(gate.check(clock.now()).is_err(), "the gate is closed");
        // Redis itself still holds the key (the proxy stalls the client, not it).
        let pttl = server.inline("PTTL {stalled}").expect("redis answers");
        let pttl: i64 = pttl.trim().trim_start_matches(':').parse().unwrap();
        assert!(
            pttl > 0,
            "lost {lost_after:?} into the stall; Redis's PTTL {pttl}"
        );
        (lost_after, pttl)
    };
    let (lost_after, pttl) = tokio::select! {
        end = term => panic!("the term ended first: {end:?}"),
        seen = watch => seen,
    };
    println!("lost {lost_after:?} into the stall, {pttl} ms before Redis's expiry");
}
