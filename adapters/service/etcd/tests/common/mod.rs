//! What the etcd tests share beyond `leasehold-test-support` (the cluster, the proxy,
//! `Storage` and `wait_for` come from there and are re-exported here): the service on
//! a cluster, plain `etcd_client` clients for "outside" actions, etcd's own
//! counters, and a deadline for awaits. Everything here needs `etcd_client` or
//! `EtcdLockService`, which is why it is not in the shared crate.
#![allow(dead_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Once;
use std::time::Duration as StdDuration;

use std::sync::Arc;

use leasehold::{Config, Duration, Event, Fence, Identity, LossReason, OwnerToken, Term};
use leasehold_etcd::EtcdLockService;
use leasehold_tokio::{
    acquire, acquire_with, AcquireError, AcquireOptions, LeaseHandle, TimedEvent,
};
use tokio::sync::broadcast;
use tokio::time::Instant;

#[allow(unused_imports)]
pub use leasehold_test_support::{
    binary, binary_in, free_port, scratch_dir, wait_for, EtcdCluster, Proxy, Storage, Timing,
};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn std_ms(n: u64) -> StdDuration {
    StdDuration::from_millis(n)
}

/// Logs from the crate under test, shown for failing tests (`RUST_LOG` overrides).
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| "leasehold_etcd=debug,leasehold_tokio=debug".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// A lease config for TTL `ttl_ms`: renew at T/3, and a request timeout of T/4 (etcd
/// acquires are two fsynced raft writes; a loaded 2-core machine needs the slack).
pub fn config(ttl_ms: u64) -> Config {
    Config::builder(ms(ttl_ms))
        .request_timeout(ms(ttl_ms / 4))
        .build()
        .expect("valid config")
}

/// The service on every member of `cluster`.
pub async fn service(cluster: &EtcdCluster) -> EtcdLockService {
    service_on(cluster.endpoints()).await
}

pub async fn service_on(endpoints: Vec<String>) -> EtcdLockService {
    init_tracing();
    EtcdLockService::builder(endpoints)
        .request_timeout(std_ms(2_000))
        .connect_timeout(std_ms(500))
        .watch_retry(std_ms(50))
        .connect()
        .await
        .expect("connect to the test etcd")
}

/// A fresh random owner's token for term 1.
pub fn token() -> OwnerToken {
    leasehold_etcd::random_owner()
        .expect("an OS random source")
        .token(Term(1))
}

/// An identity for a test holder.
pub fn identity(text: &str) -> Identity {
    Identity::new(text).expect("a valid identity")
}

/// Awaits `future`, failing the test if it takes longer than `limit_ms` (real time).
#[track_caller]
pub fn within<F: Future>(limit_ms: u64, future: F) -> impl Future<Output = F::Output> {
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(std_ms(limit_ms), future).await {
            Ok(output) => output,
            Err(_) => panic!("{caller}: not done within {limit_ms} ms"),
        }
    }
}

/// The leases etcd has, by id.
pub async fn leases(client: &mut etcd_client::Client) -> Vec<i64> {
    let mut ids: Vec<i64> = client
        .leases()
        .await
        .expect("list leases")
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    ids.sort_unstable();
    ids
}

/// The value stored at `key`, if any.
pub async fn value(client: &mut etcd_client::Client, key: &str) -> Option<String> {
    let answer = client.get(key, None).await.expect("get");
    answer
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

/// `http://127.0.0.1:<port>` of a proxy in front of a member.
pub fn proxy_endpoint(proxy: &Proxy) -> String {
    format!("http://127.0.0.1:{}", proxy.port())
}

/// A plain etcd client on every member (for "outside" actions and inspection).
pub async fn client(cluster: &EtcdCluster) -> etcd_client::Client {
    connect_client(cluster.endpoints(), StdDuration::from_secs(5)).await
}

/// A plain client on member `i` only.
pub async fn client_of(cluster: &EtcdCluster, i: usize) -> etcd_client::Client {
    connect_client(vec![cluster.endpoint(i)], StdDuration::from_secs(2)).await
}

async fn connect_client(endpoints: Vec<String>, timeout: StdDuration) -> etcd_client::Client {
    etcd_client::Client::connect(
        endpoints,
        Some(
            etcd_client::ConnectOptions::new()
                .with_connect_timeout(StdDuration::from_secs(1))
                .with_timeout(timeout),
        ),
    )
    .await
    .expect("an outside etcd client")
}

/// The value of the Prometheus counter `name` on the member at `port` (`GET
/// /metrics`), e.g. `etcd_debugging_lease_granted_total`.
pub fn counter(port: u16, name: &str) -> u64 {
    let body = http_get(port, "/metrics").expect("GET /metrics");
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .unwrap_or_else(|| panic!("no counter {name} in /metrics"))
}

/// etcd's count of gRPC messages received, by method (`Txn`, `LeaseGrant`,
/// `LeaseKeepAlive`, …): one per unary request, one per keep-alive on a stream.
pub fn grpc_messages(port: u16) -> std::collections::BTreeMap<String, u64> {
    let body = http_get(port, "/metrics").expect("GET /metrics");
    let mut counts = std::collections::BTreeMap::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_msg_received_total{") else {
            continue;
        };
        let method = rest
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|m| m.split('"').next());
        let value = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(method), Some(value)) = (method, value) {
            *counts.entry(method.to_owned()).or_insert(0) += value as u64;
        }
    }
    counts
}

/// `GET path` over a fresh socket (HTTP/1.0, so the body is not chunked); the body.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(StdDuration::from_millis(1_000)))
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.split("\r\n\r\n").nth(1).map(str::to_owned)
}

/// A lease on `key` through the tokio adapter (TTL `ttl_ms`, see [`config`]).
pub async fn hold(service: &EtcdLockService, key: &str, ttl_ms: u64) -> LeaseHandle {
    within(
        5_000,
        acquire(Arc::new(service.clone()), key, config(ttl_ms)),
    )
    .await
    .unwrap_or_else(|e| panic!("acquire {key}: {e}"))
}

/// The next `Renewed` event seen after `after`, or the loss if one comes first.
pub async fn renewed_after(
    events: &mut broadcast::Receiver<TimedEvent>,
    after: Instant,
) -> Result<Instant, LossReason> {
    loop {
        match events.recv().await {
            Ok(TimedEvent {
                at,
                event: Event::Renewed { .. },
                ..
            }) if at > after => return Ok(at),
            Ok(TimedEvent {
                event: Event::Lost { reason, .. },
                ..
            }) => return Err(reason),
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => panic!("the lease's events ended"),
        }
    }
}

/// A contender was refused because the key is held by the holder with `fence`, and
/// says who that is. `remaining` may be 0 right after a fault: the service reports 0
/// when the `LeaseTimeToLive` after its read fails (the service tests check it on a
/// settled cluster).
#[track_caller]
pub fn assert_busy_with(refused: Option<AcquireError>, fence: Fence) {
    match refused {
        Some(AcquireError::Busy {
            holder: Some(holder),
        }) => {
            assert_eq!(holder.fence, fence);
            assert!(!holder.identity.is_empty(), "hostname:pid by default");
            assert!(holder.remaining <= Duration::from_secs(3), "{holder:?}");
        }
        other => panic!("expected Busy with the holder, got {other:?}"),
    }
}

/// A contender that keeps trying `key` for up to 2 s, as one would while a cluster
/// settles after a fault (a single attempt may meet a leader change): its error.
pub async fn contend(service: &EtcdLockService, key: &str) -> Option<AcquireError> {
    let options = AcquireOptions::new().max_wait(std_ms(2_000));
    let contender = acquire_with(Arc::new(service.clone()), key, config(3_000), options);
    within(6_000, contender).await.err()
}
