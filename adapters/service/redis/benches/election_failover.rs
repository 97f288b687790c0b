//! Election failover on a real Redis: five `leasehold_tokio::Election` candidates,
//! each on its own connection through its own fault proxy.
//!
//! * **Stalled leader**: the leader's connection stops forwarding (a partition, a
//!   frozen host); timed from the stall until another candidate's `campaign()`
//!   returned. Bound: the TTL Redis has left at the stall (at most T) + the longest
//!   jittered retry (1.5 × T/20).
//! * **Stopped server** (`SIGSTOP` for 2 T): timed from `SIGCONT` until a candidate's
//!   `campaign()` returned.
//!
//! "At most one leader" is sampled every millisecond throughout.
//!
//! ```text
//! cargo bench -p leasehold-redis --bench election_failover
//! LEASEHOLD_BENCH_TTL_MS=15000 LEASEHOLD_BENCH_ROUNDS=4 cargo bench -p leasehold-redis --bench election_failover
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use common::*;
use leasehold_test_support::bench::bench_setting;
use leasehold_test_support::election::failover_figures;

fn main() {
    let ttl_ms = bench_setting("LEASEHOLD_BENCH_TTL_MS", 3_000);
    let rounds = bench_setting("LEASEHOLD_BENCH_ROUNDS", 8) as usize;
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let mut proxies = Vec::new();
        let mut services = Vec::new();
        for _ in 0..5 {
            let proxy = Proxy::start(server.port()).await;
            services.push(Arc::new(service(&proxy_url(&proxy)).await));
            proxies.push(proxy);
        }
        failover_figures(
            "Redis",
            services,
            &proxies,
            config(ttl_ms),
            rounds,
            || server.pause(),
            || server.resume(),
        )
        .await;
    });
}
