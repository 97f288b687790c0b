//! Election failover on a real etcd (one member): five `leasehold_tokio::Election` candidates,
//! each on its own connection through its own fault proxy.
//!
//! * **Stalled leader**: the leader's connection stops forwarding (a partition, a
//!   frozen host); timed from the stall until another candidate's `campaign()`
//!   returned. Bound: the TTL etcd has left at the stall (at most T) + the longest
//!   jittered retry (1.5 × T/20).
//! * **Stopped server** (`SIGSTOP` for 2 T): timed from `SIGCONT` until a candidate's
//!   `campaign()` returned.
//!
//! "At most one leader" is sampled every millisecond throughout.
//!
//! ```text
//! cargo bench -p leasehold-etcd --bench election_failover
//! LEASEHOLD_BENCH_TTL_MS=15000 LEASEHOLD_BENCH_ROUNDS=4 cargo bench -p leasehold-etcd --bench election_failover
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use common::{config, proxy_endpoint, service_on, std_ms, EtcdCluster, Proxy};
use leasehold_test_support::election::min_median_max;
use leasehold_test_support::Candidates;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // The shared test helpers log the crates' debug events unless told otherwise.
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    // Whole seconds, at least etcd's minimum (1 s with the fast test timing).
    let ttl_ms = env("LEASEHOLD_BENCH_TTL_MS", 3_000);
    let rounds = env("LEASEHOLD_BENCH_ROUNDS", 8) as usize;
    let cluster = EtcdCluster::single();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let mut proxies = Vec::new();
        let mut services = Vec::new();
        for _ in 0..5 {
            let proxy = Proxy::start(cluster.client_port(0)).await;
            services.push(Arc::new(service_on(vec![proxy_endpoint(&proxy)]).await));
            proxies.push(proxy);
        }
        let config = config(ttl_ms);
        let ttl = std_ms(ttl_ms);
        let limit = ttl * 3;
        let candidates = Candidates::start(services, "election", config);
        let stalls = candidates
            .stalled_leader_failovers(&proxies, rounds, ttl / 3, limit)
            .await;
        let stops = candidates
            .stopped_server_failovers(
                rounds.div_ceil(2),
                ttl * 2,
                ttl,
                || cluster.pause(0),
                || cluster.resume(0),
                limit,
            )
            .await;
        let retry = std::time::Duration::from(config.retry_interval());
        println!("etcd, 5 candidates, TTL {ttl_ms} ms (retry {retry:?}, jittered 0.5–1.5×):");
        println!("  stalled leader → new leader: {}", min_median_max(&stalls));
        println!(
            "    bound: TTL left at the stall (≤ {ttl_ms} ms) + {:?}",
            retry.mul_f64(1.5)
        );
        println!(
            "  server SIGCONT → leader again: {}",
            min_median_max(&stops)
        );
    });
}
