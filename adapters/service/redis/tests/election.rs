//! `leasehold_tokio::Election` on a real Redis: five candidates, each on its own
//! connection through its own fault proxy. One leader at a time (sampled every
//! millisecond through the leaders' own `check()`), a stalled leader replaced by one
//! with a newer fence after its check has started failing, a follower refused with
//! the leader's name, and no leader at all while the server is stopped (`SIGSTOP`).
//! The failover times are measured by `cargo bench -p leasehold-redis --bench
//! election_failover`.

mod common;

use std::sync::Arc;

use common::*;
use leasehold::Identity;
use leasehold_test_support::election::min_median_max;
use leasehold_test_support::Candidates;
use leasehold_tokio::{AcquireError, Election};

const KEY: &str = "election";
const TTL_MS: u64 = 1_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn five_candidates_keep_one_leader_through_stalled_leaders_and_a_stopped_server() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut proxies = Vec::new();
        let mut services = Vec::new();
        for _ in 0..5 {
            let proxy = Proxy::start(server.port()).await;
            services.push(Arc::new(service(&proxy_url(&proxy)).await));
            proxies.push(proxy);
        }
        let candidates = Candidates::start(services, KEY, config(TTL_MS));
        let last = candidates.elected_after(None, std_ms(5_000)).await;

        // A follower is refused, and told who leads.
        let outsider = Election::new(
            Arc::new(service(&server.url()).await),
            KEY,
            Identity::new("outsider").unwrap(),
            config(TTL_MS),
        )
        .unwrap();
        match outsider.campaign_for(std_ms(200)).await {
            Err(AcquireError::Busy { holder: Some(h) }) => {
                assert_eq!(h.identity, Candidates::identity(last.index));
                assert_eq!(h.fence, last.fence);
            }
            other => panic!("a follower campaign: {other:?}"),
        }
        let named = outsider.leader().await.unwrap().unwrap();
        assert_eq!(named.identity, Candidates::identity(last.index));

        // Stall the leader's connection past T, three times: another candidate leads,
        // with a newer fence, and the stalled one's check already fails.
        let ttl = std_ms(TTL_MS);
        let stalls = candidates
            .stalled_leader_failovers(&proxies, 3, ttl / 3, std_ms(5_000))
            .await;
        println!(
            "failover after a stalled leader: {}",
            min_median_max(&stalls)
        );

        // Stop the server for 2 T: no leader once T has passed; after it resumes, a
        // new leadership with a newer fence.
        let stops = candidates
            .stopped_server_failovers(
                1,
                ttl * 2,
                ttl,
                || server.pause(),
                || server.resume(),
                std_ms(5_000),
            )
            .await;
        println!(
            "leader again after the server resumed: {}",
            min_median_max(&stops)
        );
    });
}
