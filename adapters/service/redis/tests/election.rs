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
use leasehold::{Config, Identity};
use leasehold_test_support::election::{
    five_candidates_scenario, observer_sees_each_change_by_the_watch, run_scenario, RunScenario,
    Scenario,
};
use leasehold_tokio::Election;

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
        five_candidates_scenario(Scenario {
            services,
            proxies,
            outsider: Arc::new(service(&server.url()).await),
            key: KEY,
            config: config(TTL_MS),
            stop: || server.pause(),
            resume: || server.resume(),
            limit: std_ms(5_000),
        })
        .await;
    });
}

/// `Election::run` with five candidates on one server: one between
/// `started_leading` and `stopped_leading` at a time, release on cancel, and an
/// observer that reports `Unknown` while the server is stopped.
#[test]
fn five_runners_lead_one_at_a_time_and_the_observer_reports_a_stopped_server() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut services = Vec::new();
        for _ in 0..5 {
            services.push(Arc::new(service(&server.url()).await));
        }
        run_scenario(RunScenario {
            services,
            observer: Arc::new(service(&server.url()).await),
            key: KEY,
            config: config(TTL_MS),
            stop: || server.pause(),
            resume: || server.resume(),
            limit: std_ms(5_000),
        })
        .await;
    });
}

/// With keyspace notifications on (`notify-keyspace-events K$gxe`), `Election::observe`
/// on Redis is pushed: an observer that polls only every 20 s reports an election, a
/// resignation and the next election within a second of each. (Without them, the
/// default, the observer polls: the tests above.)
#[test]
fn with_keyspace_notifications_the_observer_sees_each_change_by_the_watch() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let url = server.url();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("K$gxe")
            .query_async(&mut raw(&url).await)
            .await
            .unwrap();
        let observer_config = Config::builder(ms(60_000))
            .retry_interval(ms(20_000))
            .build()
            .expect("valid config");
        let election = |name: &'static str, config: Config| {
            let url = &url;
            async move {
                let service = Arc::new(service(url).await);
                Election::new(service, KEY, Identity::new(name).unwrap(), config).unwrap()
            }
        };
        observer_sees_each_change_by_the_watch(
            election("observer", observer_config).await,
            election("a", config(TTL_MS)).await,
            election("b", config(TTL_MS)).await,
            std_ms(20_000),
            std_ms(1_000),
        )
        .await;
    });
}
