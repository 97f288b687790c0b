//! `leasehold_tokio::Election` on a real etcd (one member): five candidates, each on
//! its own connection through its own fault proxy. One leader at a time (sampled every
//! millisecond through the leaders' own `check()`), a stalled leader replaced by one
//! with a newer fence after its check has started failing, a follower refused with
//! the leader's name, and no leader at all while the server is stopped (`SIGSTOP`).
//! The failover times are measured by `cargo bench -p leasehold-etcd --bench
//! election_failover`.

mod common;

use std::sync::Arc;

use common::{config, proxy_endpoint, service, service_on, std_ms, EtcdCluster, Proxy};
use leasehold::{Config, Identity};
use leasehold_test_support::election::{
    five_candidates_scenario, observer_sees_each_change_by_the_watch, run_scenario, RunScenario,
    Scenario,
};
use leasehold_tokio::Election;

const KEY: &str = "election";
// etcd TTLs are whole seconds, at least its minimum (1 s with the fast test timing).
const TTL_MS: u64 = 2_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn five_candidates_keep_one_leader_through_stalled_leaders_and_a_stopped_server() {
    let cluster = EtcdCluster::single();
    runtime().block_on(async {
        let mut proxies = Vec::new();
        let mut services = Vec::new();
        for _ in 0..5 {
            let proxy = Proxy::start(cluster.client_port(0)).await;
            services.push(Arc::new(service_on(vec![proxy_endpoint(&proxy)]).await));
            proxies.push(proxy);
        }
        five_candidates_scenario(Scenario {
            services,
            proxies,
            outsider: Arc::new(service(&cluster).await),
            key: KEY,
            config: config(TTL_MS),
            stop: || cluster.pause(0),
            resume: || cluster.resume(0),
            limit: std_ms(8_000),
        })
        .await;
    });
}

/// `Election::run` with five candidates on one member: one between
/// `started_leading` and `stopped_leading` at a time, release on cancel, and an
/// observer that reports `Unknown` while the member is stopped.
#[test]
fn five_runners_lead_one_at_a_time_and_the_observer_reports_a_stopped_server() {
    let cluster = EtcdCluster::single();
    runtime().block_on(async {
        let mut services = Vec::new();
        for _ in 0..5 {
            services.push(Arc::new(service(&cluster).await));
        }
        run_scenario(RunScenario {
            services,
            observer: Arc::new(service(&cluster).await),
            key: KEY,
            config: config(TTL_MS),
            stop: || cluster.pause(0),
            resume: || cluster.resume(0),
            limit: std_ms(8_000),
        })
        .await;
    });
}

/// `Election::observe` on etcd is pushed by a watch of the key: an observer that
/// polls only every 20 s still reports the leader resigning and the next one elected
/// within a second of each change (one watch event and one query).
#[test]
fn the_observer_sees_each_change_of_leader_by_the_watch_not_the_poll() {
    let cluster = EtcdCluster::single();
    runtime().block_on(async {
        let poll = std_ms(20_000);
        let observer_config = Config::builder(common::ms(60_000))
            .retry_interval(common::ms(20_000))
            .build()
            .expect("valid config");
        let election = |name: &'static str, config: Config| {
            let cluster = &cluster;
            async move {
                let service = Arc::new(service(cluster).await);
                Election::new(service, KEY, Identity::new(name).unwrap(), config).unwrap()
            }
        };
        observer_sees_each_change_by_the_watch(
            election("observer", observer_config).await,
            election("a", config(TTL_MS)).await,
            election("b", config(TTL_MS)).await,
            poll,
            std_ms(1_000),
        )
        .await;
    });
}
