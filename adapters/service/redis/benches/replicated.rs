//! Renewals per second with replication-synchronous grants (`min_replicas(1)`: each
//! renewal followed by `WAIT 1`) against without, at K concurrent leases, against the
//! same primary and replica (which this binary starts), in alternating rounds.
//!
//! ```text
//! cargo bench -p leasehold-redis --bench replicated                       # 5 s x 3 rounds
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-redis --bench replicated   # errors only
//! ```
//!
//! Each peer is K closed-loop tasks (one renewal outstanding per lease) on ONE
//! `RedisLockService` (one connection), on one tokio thread; Redis and its replica
//! share the machine's other core. Smoke mode runs each peer at each K briefly and
//! fails on any error, never on a ratio.

#[path = "../tests/common/mod.rs"]
mod common;

use std::rc::Rc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use leasehold::{Owner, RenewOutcome, Term};
use leasehold_driver::LockService;
use leasehold_redis::{Acquired, RedisLockService};

const TTL_MS: u64 = 86_400_000;
const LEASES: [usize; 3] = [1, 100, 1_000];

fn main() {
    let smoke = std::env::var_os("LEASEHOLD_BENCH_SMOKE").is_some();
    let secs: f64 = std::env::var("LEASEHOLD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 0.3 } else { 5.0 });
    let rounds: usize = std::env::var("LEASEHOLD_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 1 } else { 3 });
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(RedisOptions {
        replica_of: Some(primary.port()),
        ..RedisOptions::default()
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let connect = |replicas: u32| {
            RedisLockService::builder(primary.url())
                .request_timeout(StdDuration::from_secs(1))
                .max_ttl(StdDuration::from_millis(TTL_MS))
                .min_replicas(replicas)
                .connect()
        };
        let services = [
            connect(0).await.expect("connect"),
            connect(1).await.expect("connect with min_replicas(1)"),
        ];
        let token = Owner([0x42; 16]).token(Term(1));
        let most = LEASES.iter().copied().max().unwrap_or(0);
        let mut fences = Vec::with_capacity(most);
        for i in 0..most {
            match services[1]
                .try_acquire(
                    &format!("r{i}"),
                    token,
                    &leasehold::Identity::EMPTY,
                    ms(TTL_MS),
                )
                .await
                .expect("acquire")
            {
                Acquired::Granted { fence, .. } => fences.push(fence),
                other => panic!("{other:?}"),
            }
        }
        let fences = Rc::new(fences);
        println!("K leases | plain renewals/s | min_replicas(1) renewals/s | ratio per round");
        for &k in &LEASES {
            let mut rates = [Vec::new(), Vec::new()];
            for round in 0..rounds {
                // Alternate which peer goes first.
                let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for peer in order {
                    let service = services[peer].clone();
                    let rate = renewals_per_second(service, k, token, &fences, secs).await;
                    rates[peer].push(rate);
                }
            }
            let ratios: Vec<String> = rates[1]
                .iter()
                .zip(&rates[0])
                .map(|(with, without)| format!("{:.2}", with / without))
                .collect();
            println!(
                "{k:>8} | {:>16.0} | {:>26.0} | {}",
                median(&rates[0]),
                median(&rates[1]),
                ratios.join(" ")
            );
        }
    });
    drop(replica);
}

/// Renewals per second of `k` closed-loop leases on `service` for `secs`.
async fn renewals_per_second(
    service: RedisLockService,
    k: usize,
    token: leasehold::OwnerToken,
    fences: &Rc<Vec<leasehold::Fence>>,
    secs: f64,
) -> f64 {
    let until = StdInstant::now() + StdDuration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..k)
        .map(|i| {
            let (service, fences) = (service.clone(), Rc::clone(fences));
            tokio::task::spawn_local(async move {
                let mut done = 0u64;
                while StdInstant::now() < until {
                    match LockService::renew(
                        &service,
                        &format!("r{i}"),
                        token,
                        fences[i],
                        ms(TTL_MS),
                    )
                    .await
                    {
                        RenewOutcome::Renewed { .. } => done += 1,
                        other => panic!("renew answered {other:?}"),
                    }
                }
                done
            })
        })
        .collect();
    let started = StdInstant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("a renewal task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}
