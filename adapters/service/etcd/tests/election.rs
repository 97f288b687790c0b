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
use leasehold_test_support::election::{
    five_candidates_scenario, run_scenario, RunScenario, Scenario,
};

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
/// polls only every 20 s still reports the leader resigning and the next one
/// elected within a second of each change (one watch event and one query).
#[test]
fn the_observer_sees_each_change_of_leader_by_the_watch_not_the_poll() {
    use futures_util::StreamExt;
    use leasehold::{Config, Identity};
    use leasehold_tokio::{Election, LeaderView};

    let cluster = EtcdCluster::single();
    runtime().block_on(async {
        let poll = std_ms(20_000);
        let observer_config = Config::builder(common::ms(60_000))
            .retry_interval(common::ms(20_000))
            .build()
            .expect("valid config");
        let observer = Election::new(
            Arc::new(service(&cluster).await),
            KEY,
            Identity::new("observer").unwrap(),
            observer_config,
        )
        .unwrap();
        let candidate = |name: &'static str| {
            let cluster = &cluster;
            async move {
                Election::new(
                    Arc::new(service(cluster).await),
                    KEY,
                    Identity::new(name).unwrap(),
                    config(TTL_MS),
                )
                .unwrap()
            }
        };
        let (a, b) = (candidate("a").await, candidate("b").await);
        let within = std_ms(1_000);
        let mut views = observer.observe();

        assert_eq!(views.next().await, Some(LeaderView::Vacant));
        let leader_a = a.campaign().await.unwrap();
        let started = tokio::time::Instant::now();
        let seen = tokio::time::timeout(poll / 2, views.next()).await;
        let Ok(Some(LeaderView::Led(info))) = seen else {
            panic!("no new leader reported within {:?}: {seen:?}", poll / 2)
        };
        assert_eq!(info.fence, leader_a.granted_fence());
        assert!(
            started.elapsed() < within,
            "a's election reported after {:?}",
            started.elapsed()
        );

        let started = tokio::time::Instant::now();
        leader_a.resign().await;
        assert_eq!(
            tokio::time::timeout(poll / 2, views.next())
                .await
                .ok()
                .flatten(),
            Some(LeaderView::Vacant)
        );
        assert!(
            started.elapsed() < within,
            "a's resignation reported after {:?}",
            started.elapsed()
        );

        let leader_b = b.campaign().await.unwrap();
        let started = tokio::time::Instant::now();
        let seen = tokio::time::timeout(poll / 2, views.next()).await;
        let Ok(Some(LeaderView::Led(info))) = seen else {
            panic!("no new leader reported within {:?}: {seen:?}", poll / 2)
        };
        assert_eq!(info.fence, leader_b.granted_fence());
        assert!(
            started.elapsed() < within,
            "b's election reported after {:?}",
            started.elapsed()
        );
    });
}
