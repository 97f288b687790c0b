//! Renewals per second over mutual TLS next to plain text, at 1, 100 and 1,000
//! leases, against one etcd (started by this binary, `--client-cert-auth`) serving
//! both: the cost of TLS to a lease. Each side is `LockService::renew` (what the
//! driver calls: a keep-alive on the lease's warm stream and the ownership check) on
//! a service of its own, one gRPC channel each; K closed-loop tasks (one renewal
//! outstanding per lease) on one thread (the machine's other core is etcd's); the two
//! sides alternate, round after round, each on keys of its own.
//!
//! ```text
//! cargo bench -p leasehold-etcd --features tls --bench tls_renew             # 2 s x 3 rounds
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-etcd --features tls --bench tls_renew
//! ```
//!
//! `bash scripts/bench-tls.sh` runs this and Redis's `tls_renew` in one go. Smoke
//! mode fails on any error or unexpected answer, never on a ratio.

#[path = "../tests/common/mod.rs"]
mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use leasehold::{Fence, RenewOutcome};
use leasehold_driver::LockService;
use leasehold_etcd::{Acquired, EtcdLockService};
use leasehold_test_support::TlsFiles;

/// No longer than the service's default `max_ttl` (30 s); renewed long before.
const TTL_SECS: u64 = 30;
const KS: [usize; 3] = [1, 100, 1_000];

fn run_local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    tokio::task::LocalSet::new().block_on(&rt, f)
}

/// Acquires keys named `<prefix>/<i>` until `grants` holds `k`, 100 at a time (just
/// before they are measured: a lease not renewed for its TTL would expire).
async fn grow(
    service: &EtcdLockService,
    prefix: &str,
    grants: &mut Vec<(String, Fence)>,
    k: usize,
) {
    let token = token_of_bench();
    while grants.len() < k {
        let start = grants.len();
        let batch: Vec<_> = (start..k.min(start + 100))
            .map(|i| {
                let service = service.clone();
                let key = format!("{prefix}/{i:05}");
                tokio::task::spawn_local(async move {
                    let granted = service
                        .try_acquire(&key, token, &identity("bench"), ms(TTL_SECS * 1_000))
                        .await
                        .unwrap_or_else(|e| panic!("acquire {key}: {e}"));
                    let Acquired::Granted { fence, .. } = granted else {
                        panic!("acquire {key}: {granted:?}");
                    };
                    (key, fence)
                })
            })
            .collect();
        for task in batch {
            grants.push(task.await.expect("acquire task"));
        }
    }
}

/// One owner for every lease of the bench.
fn token_of_bench() -> leasehold::OwnerToken {
    leasehold::Owner([0x42; 16]).token(leasehold::Term(1))
}

fn main() {
    let smoke = std::env::var("LEASEHOLD_BENCH_SMOKE").is_ok_and(|v| v != "0");
    let secs: f64 = env("LEASEHOLD_BENCH_SECS").unwrap_or(if smoke { 0.4 } else { 2.0 });
    let rounds: usize = env("LEASEHOLD_BENCH_ROUNDS").unwrap_or(if smoke { 1 } else { 3 });
    let warmup = StdDuration::from_millis(if smoke { 100 } else { 300 });

    let dir = scratch_dir("etcd-tls-bench");
    let tls = TlsFiles::generate(dir.path());
    let cluster = EtcdCluster::single_tls(tls.clone());
    let read = |path: &std::path::Path| std::fs::read(path).expect("read a TLS file");
    let mut rows = Vec::new();
    run_local(async {
        let plain = EtcdLockService::builder([cluster.endpoint(0)])
            .request_timeout(StdDuration::from_secs(2))
            .connect()
            .await
            .expect("plain connection");
        let mutual = EtcdLockService::builder([cluster.tls_endpoint(0).expect("TLS endpoint")])
            .request_timeout(StdDuration::from_secs(2))
            .tls_root_cert(read(&tls.ca))
            .tls_client_cert(read(&tls.client_cert), read(&tls.client_key))
            .connect()
            .await
            .expect("mutual TLS connection");
        let mut sides = [(plain, "plain", Vec::new()), (mutual, "tls", Vec::new())];
        let token = token_of_bench();
        let ttl = ms(TTL_SECS * 1_000);
        for k in KS {
            for (service, prefix, grants) in &mut sides {
                grow(service, prefix, grants, k).await;
            }
            let mut rates: [Vec<f64>; 2] = Default::default();
            for round in 0..rounds {
                for side in [round % 2, (round + 1) % 2] {
                    let (service, _, grants) = &sides[side];
                    let start = StdInstant::now();
                    let (measure_from, end) = (
                        start + warmup,
                        start + warmup + StdDuration::from_secs_f64(secs),
                    );
                    let count = Rc::new(Cell::new(0u64));
                    let tasks: Vec<_> = grants[..k]
                        .iter()
                        .cloned()
                        .map(|(key, fence)| {
                            let (service, count) = (service.clone(), count.clone());
                            tokio::task::spawn_local(async move {
                                loop {
                                    let renewed =
                                        LockService::renew(&service, &key, token, fence, ttl).await;
                                    assert!(
                                        matches!(renewed, RenewOutcome::Renewed { .. }),
                                        "renew {key}: {renewed:?}"
                                    );
                                    let now = StdInstant::now();
                                    if now >= measure_from && now < end {
                                        count.set(count.get() + 1);
                                    }
                                    if now >= end {
                                        break;
                                    }
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("renewal task");
                    }
                    rates[side].push(count.get() as f64 / secs);
                }
            }
            rows.push((k, rates));
        }
    });
    println!();
    println!("| leases K | plain renewals/s | mutual TLS renewals/s | TLS ÷ plain (median) |");
    println!("|---:|---:|---:|---:|");
    for (k, [plain, tls]) in rows {
        let ratios: Vec<f64> = plain.iter().zip(&tls).map(|(p, t)| t / p).collect();
        println!(
            "| {k} | {:.0} | {:.0} | {:.2} |",
            median(plain),
            median(tls),
            median(ratios)
        );
    }
}

/// The number in environment variable `name`, if it is set and parses.
fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}
