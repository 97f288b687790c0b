//! Renewals per second over mutual TLS next to plain text, at 1, 100 and 1,000
//! leases, against one `redis-server` (started by this binary) listening on both: the
//! cost of TLS to a lease. Each side is `LockService::renew` (what the driver calls)
//! on a `RedisLockService::connect` service with its defaults but the request timeout;
//! K closed-loop tasks (one renewal outstanding per lease) on one shared connection,
//! one tokio thread (the machine's other core is Redis's); the two sides alternate,
//! round after round, each on keys of its own.
//!
//! ```text
//! cargo bench -p leasehold-redis --features tls --bench tls_renew            # 3 s x 3 rounds
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-redis --features tls --bench tls_renew
//! ```
//!
//! `bash scripts/bench-tls.sh` runs this and etcd's `tls_renew` in one go. Smoke
//! mode fails on any error or unexpected answer, never on a ratio.

#[path = "../tests/common/mod.rs"]
mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use leasehold::{Indeterminate, Owner, RenewOutcome, Term};
use leasehold_driver::LockService;
use leasehold_redis::RedisLockService;

/// Long enough that no lease expires between its turns.
const TTL_MS: u64 = 86_400_000;
const LEASES: [usize; 3] = [1, 100, 1_000];
const TIMEOUT: StdDuration = StdDuration::from_millis(500);

struct Window {
    measure_from: StdInstant,
    end: StdInstant,
    count: Cell<u64>,
    timeouts: Cell<u64>,
}

fn main() {
    let smoke = std::env::var("LEASEHOLD_BENCH_SMOKE").is_ok_and(|v| v != "0");
    let secs: f64 = env("LEASEHOLD_BENCH_SECS").unwrap_or(if smoke { 0.3 } else { 3.0 });
    let rounds: usize = env("LEASEHOLD_BENCH_ROUNDS").unwrap_or(if smoke { 1 } else { 3 });
    let warmup = StdDuration::from_millis(if smoke { 50 } else { 300 });

    let dir = scratch_dir("redis-tls-bench");
    let tls = TlsFiles::generate(dir.path());
    let server = RedisServer::start_with(RedisOptions {
        tls: Some(tls.clone()),
        tls_auth_clients: true,
        ..RedisOptions::default()
    });
    let read = |path: &std::path::Path| std::fs::read(path).expect("read a TLS file");
    let mut rows = Vec::new();
    run_local(async {
        let plain = RedisLockService::builder(server.url())
            .request_timeout(TIMEOUT)
            .max_ttl(StdDuration::from_millis(TTL_MS))
            .connect()
            .await
            .expect("plain connection");
        let tls = RedisLockService::builder(format!(
            "rediss://127.0.0.1:{}",
            server.tls_port().expect("TLS port")
        ))
        .tls_root_cert(read(&tls.ca))
        .tls_client_cert(read(&tls.client_cert), read(&tls.client_key))
        .request_timeout(TIMEOUT)
        .max_ttl(StdDuration::from_millis(TTL_MS))
        .connect()
        .await
        .expect("mutual TLS connection");
        let token = Owner([0x42; 16]).token(Term(1));
        let max = LEASES.iter().copied().max().unwrap_or(0);
        for i in 0..max {
            bench_acquire(&plain, &format!("plain:{i}"), token, ms(TTL_MS)).await;
            bench_acquire(&tls, &format!("tls:{i}"), token, ms(TTL_MS)).await;
        }
        for k in LEASES {
            let mut rates: [Vec<f64>; 2] = Default::default();
            for round in 0..rounds {
                for side in [round % 2, (round + 1) % 2] {
                    let (service, prefix) = if side == 0 {
                        (&plain, "plain")
                    } else {
                        (&tls, "tls")
                    };
                    let start = StdInstant::now();
                    let window = Rc::new(Window {
                        measure_from: start + warmup,
                        end: start + warmup + StdDuration::from_secs_f64(secs),
                        count: Cell::new(0),
                        timeouts: Cell::new(0),
                    });
                    let tasks: Vec<_> = (0..k)
                        .map(|i| {
                            let (service, window) = (service.clone(), window.clone());
                            let key = format!("{prefix}:{i}");
                            tokio::task::spawn_local(async move {
                                loop {
                                    let renewed = LockService::renew(
                                        &service,
                                        &key,
                                        token,
                                        BENCH_FENCE,
                                        ms(TTL_MS),
                                    )
                                    .await;
                                    let now = StdInstant::now();
                                    match renewed {
                                        RenewOutcome::Renewed { .. }
                                            if now >= window.measure_from && now < window.end =>
                                        {
                                            window.count.set(window.count.get() + 1);
                                        }
                                        RenewOutcome::Renewed { .. } => {}
                                        RenewOutcome::Indeterminate(Indeterminate::Timeout) => {
                                            window.timeouts.set(window.timeouts.get() + 1);
                                        }
                                        other => panic!("{prefix} renew answered {other:?}"),
                                    }
                                    if now >= window.end {
                                        break;
                                    }
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("renewal task");
                    }
                    if window.timeouts.get() > 0 {
                        eprintln!("{prefix} at K={k}: {} timed out", window.timeouts.get());
                    }
                    rates[side].push(window.count.get() as f64 / secs);
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
