//! Test support: real etcd members on loopback ([`etcd`]), a proxy that can stall
//! ([`proxy`]), the service on them, a fence-guarded storage, and bounded,
//! event-driven waits.
#![allow(dead_code)]

pub mod etcd;
pub mod proxy;

use std::future::Future;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration as StdDuration;

use leasehold::{Config, Duration, Fence, FenceGate, Identity, OwnerToken, StaleFence, Term};
use leasehold_etcd::EtcdLockService;

pub use etcd::{Cluster, Timing};

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
pub async fn service(cluster: &Cluster) -> EtcdLockService {
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
    leasehold_etcd::random_owner().token(Term(1))
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

/// Polls `cond` every few milliseconds until it holds; fails after `limit_ms`.
pub async fn wait_for<F, Fut>(what: &str, limit_ms: u64, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = tokio::time::Instant::now() + std_ms(limit_ms);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < give_up,
            "timed out after {limit_ms} ms waiting for {what}"
        );
        tokio::time::sleep(std_ms(5)).await;
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

/// Storage guarded by a fence gate: what the protected resource does with writes.
#[derive(Clone, Default)]
pub struct Storage {
    inner: Arc<Mutex<StorageInner>>,
}

#[derive(Default)]
struct StorageInner {
    gate: FenceGate,
    /// Every write: its fence and whether it was admitted.
    log: Vec<(Fence, bool)>,
}

impl Storage {
    pub fn write(&self, fence: Fence) -> Result<(), StaleFence> {
        let mut inner = self.inner.lock().unwrap();
        let result = inner.gate.admit(fence);
        inner.log.push((fence, result.is_ok()));
        result
    }

    /// No fence was admitted after a newer one.
    pub fn assert_no_stale_admitted(&self) {
        let mut newest: Option<Fence> = None;
        for &(fence, admitted) in &self.inner.lock().unwrap().log {
            if admitted {
                assert!(
                    newest.is_none_or(|n| fence >= n),
                    "{fence} admitted after {newest:?}"
                );
                newest = Some(fence);
            }
        }
    }
}
