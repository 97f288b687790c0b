//! Renewals per second on a real local Redis Cluster (3 primaries + 3 replicas, which
//! this binary starts): `leasehold-redis`'s cluster service against redis-rs's own
//! cluster client (`ClusterConnection`) sending a plain script, in alternating rounds.
//! The ratio compares two cluster clients, routing included on both sides; it is not
//! a comparison with a raw loop per node.
//!
//! ```text
//! cargo bench -p leasehold-redis --features cluster --bench cluster_renew       # 3 rounds of 5 s
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-redis --features cluster --bench cluster_renew
//! ```
//!
//! Each peer runs K closed-loop tasks (one renewal outstanding per lease; the keys
//! spread over all slots) on one tokio thread; the six servers share the machine's
//! cores. The raw peer sends `EVALSHA` of a plain compare-and-`PEXPIRE` script (no
//! typed answer; its command built per renewal, as leasehold builds its key); leasehold sends its renew script
//! through `LockService::renew`. Smoke mode runs K = 100 for a fraction of a second
//! per peer and fails on any error.

#[path = "../tests/common/mod.rs"]
mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration as StdDuration, Instant};

use common::{bench_acquire, ms, raw_value, BENCH_FENCE, COMPARE_PEXPIRE};
use leasehold::{Owner, OwnerToken, RenewOutcome, Term};
use leasehold_driver::LockService;
use leasehold_redis::{RedisClusterLockService, RedisLockService};
use leasehold_test_support::bench::load_average;
use leasehold_test_support::RedisCluster;

/// Long enough that no lease expires during the rounds.
const TTL_MS: u64 = 86_400_000;

fn main() {
    let smoke = std::env::var("LEASEHOLD_BENCH_SMOKE").is_ok_and(|v| v != "0");
    let (k, secs, rounds) = if smoke {
        (100, 0.3, 1)
    } else {
        (1_000, 5.0, 3)
    };
    let cluster = RedisCluster::start(3, 1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let token = Owner([0x42; 16]).token(Term(1));
        let leasehold = RedisLockService::connect_cluster(cluster.urls())
            .await
            .expect("connect leasehold to the cluster")
            .with_max_ttl(StdDuration::from_millis(TTL_MS));
        // A new cluster: its first grants wait no quarantine.
        leasehold
            .mark_data_set_new()
            .await
            .expect("mark every slot's epoch");
        let raw_client = redis::cluster::ClusterClient::builder(cluster.urls())
            .response_timeout(StdDuration::from_secs(1))
            .build()
            .expect("cluster client");
        let mut raw = raw_client
            .get_async_connection()
            .await
            .expect("raw cluster connection");
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(COMPARE_PEXPIRE)
            .query_async(&mut raw)
            .await
            .expect("SCRIPT LOAD");
        for i in 0..k {
            bench_acquire(&leasehold, &format!("lh:{i}"), token, ms(TTL_MS)).await;
            let _: () = redis::cmd("SET")
                .arg(format!("raw:{i}"))
                .arg(raw_value(token))
                .arg("PX")
                .arg(TTL_MS)
                .query_async(&mut raw)
                .await
                .expect("raw SET");
        }

        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for round in 0..rounds {
            // Alternate which peer goes first.
            for leasehold_turn in [round % 2 == 0, round % 2 != 0] {
                if leasehold_turn {
                    let leasehold = leasehold.clone();
                    let renew = move |i| {
                        let service = leasehold.clone();
                        async move { renew_leasehold(&service, i, token).await }
                    };
                    ours.push(rate(k, secs, renew).await);
                } else {
                    let (raw, sha) = (raw.clone(), sha.clone());
                    let renew = move |i| {
                        let mut conn = raw.clone();
                        let mut cmd = redis::cmd("EVALSHA");
                        cmd.arg(&sha)
                            .arg(1)
                            .arg(format!("raw:{i}"))
                            .arg(raw_value(token))
                            .arg(TTL_MS);
                        async move {
                            let answer: i64 = cmd.query_async(&mut conn).await.expect("raw EVALSHA");
                            assert_eq!(answer, 1, "raw EVALSHA refused");
                        }
                    };
                    theirs.push(rate(k, secs, renew).await);
                }
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ours, theirs) = (median(ours), median(theirs));
        println!("cluster_renew: K = {k}, {rounds} rounds of {secs} s, load average {}", load_average());
        println!("| K | leasehold-redis cluster renew/s | redis-rs cluster EVALSHA compare-PEXPIRE /s | ratio |");
        println!("|---:|---:|---:|---:|");
        println!("| {k} | {ours:.0} | {theirs:.0} | {:.2} |", ours / theirs);
    });
}

/// Renewals per second of `k` closed-loop tasks each repeating `renew(i)` for `secs`.
async fn rate<F, Fut>(k: usize, secs: f64, renew: F) -> f64
where
    F: Fn(usize) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let end = Instant::now() + StdDuration::from_secs_f64(secs);
    let count = Rc::new(Cell::new(0u64));
    let renew = Rc::new(renew);
    let tasks: Vec<_> = (0..k)
        .map(|i| {
            let (count, renew) = (count.clone(), renew.clone());
            tokio::task::spawn_local(async move {
                while Instant::now() < end {
                    renew(i).await;
                    count.set(count.get() + 1);
                }
            })
        })
        .collect();
    let start = Instant::now();
    for task in tasks {
        task.await.expect("a renewing task");
    }
    count.get() as f64 / start.elapsed().as_secs_f64()
}

async fn renew_leasehold(service: &RedisClusterLockService, i: usize, token: OwnerToken) {
    let key = format!("lh:{i}");
    let answer = LockService::renew(service, &key, token, BENCH_FENCE, ms(TTL_MS)).await;
    assert!(
        matches!(answer, RenewOutcome::Renewed { .. }),
        "leasehold renew: {answer:?}"
    );
}
