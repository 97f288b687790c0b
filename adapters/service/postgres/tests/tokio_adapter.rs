//! What works on Redis and etcd through `leasehold-tokio`, on PostgreSQL: the
//! election (five candidates through fault proxies, a paused server), the supervised
//! worker (a term per grant, the job stopped when its lease is lost), and a
//! `LeaseSet` of 1,000 leases on one service.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use leasehold::Fence;
use leasehold_postgres::PostgresLockService;
use leasehold_test_support::election::{five_candidates_scenario, Scenario};
use leasehold_tokio::{supervise, LeaseSet, SuperviseEnd, SuperviseOptions, SupervisedTerm};

const TTL_MS: u64 = 1_000;

/// A service on `port` with a 200 ms request timeout; it connects on first use (the
/// leases retry while a loaded machine is slow to connect).
async fn service_on(port: u16) -> PostgresLockService {
    PostgresLockService::builder(url_on(port))
        .request_timeout(std_ms(200))
        .connect_lazily()
        .unwrap()
}

#[test]
fn five_candidates_keep_one_leader_through_stalled_leaders_and_a_stopped_server() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        fresh_service(&server).await;
        let mut proxies = Vec::new();
        let mut services = Vec::new();
        for _ in 0..5 {
            let proxy = Proxy::start(server.port()).await;
            services.push(Arc::new(service_on(proxy.port()).await));
            proxies.push(proxy);
        }
        five_candidates_scenario(Scenario {
            services,
            proxies,
            outsider: Arc::new(service_on(server.port()).await),
            key: "election",
            config: config(TTL_MS),
            stop: || server.pause(),
            resume: || server.resume(),
            limit: std_ms(5_000),
        })
        .await;
    });
}

/// A supervised job runs only while its key is held: its connection stalled past the
/// TTL ends the first term (the job is stopped), the next grant starts a second
/// term, and the shutdown releases the key.
#[test]
fn a_supervised_job_runs_term_after_term_and_the_shutdown_releases_the_key() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let direct = fresh_service(&server).await;
        let proxy = Proxy::start(server.port()).await;
        let service = Arc::new(service_on(proxy.port()).await);
        let terms: Arc<Mutex<Vec<(u32, Fence)>>> = Arc::default();
        let (second, shutdown) = tokio::sync::oneshot::channel::<()>();
        let second = Mutex::new(Some(second));
        let job = {
            let terms = Arc::clone(&terms);
            move |term: SupervisedTerm| {
                let mut started = terms.lock().unwrap();
                started.push((term.number, term.granted_fence));
                if started.len() == 2 {
                    if let Some(second) = second.lock().unwrap().take() {
                        let _ = second.send(());
                    }
                }
                // Works until its lease is lost (or the shutdown begins).
                async move { term.token.cancelled().await }
            }
        };
        let supervising = tokio::spawn({
            let service = Arc::clone(&service);
            async move {
                supervise(
                    service,
                    "worker",
                    config(600),
                    SuperviseOptions::new(),
                    async {
                        let _ = shutdown.await;
                    },
                    job,
                )
                .await
            }
        });
        wait_for("the first term", std_ms(5_000), || async {
            !terms.lock().unwrap().is_empty()
        })
        .await;
        proxy.stall();
        wait_for("the key to be free", std_ms(5_000), || async {
            matches!(direct.try_holder("worker").await, Ok(None))
        })
        .await;
        proxy.resume();
        let end = tokio::time::timeout(std_ms(10_000), supervising)
            .await
            .expect("a second term, then the shutdown")
            .unwrap();
        assert_eq!(end, SuperviseEnd::Shutdown);
        let terms = terms.lock().unwrap().clone();
        assert_eq!(terms.len(), 2, "{terms:?}");
        assert!(terms[1].1 > terms[0].1, "a newer fence for the second term");
        assert_eq!(direct.try_holder("worker").await.unwrap(), None, "released");
    });
}

/// 1,000 leases in one `LeaseSet` on one service (four connections): all granted,
/// all still held after a TTL of renewals (each renewed at least twice), all
/// released. The TTL is 4 s: 750 renewals/s, about half of what one PostgreSQL on
/// this 2-core machine confirms with a debug-built client (the bench has the
/// figures; with a 1 s TTL the renewals outrun the server and leases are lost).
#[test]
fn a_lease_set_holds_a_thousand_leases() {
    const N: usize = 1_000;
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = Arc::new(fresh_service(&server).await);
        const SET_TTL_MS: u64 = 4_000;
        let set = LeaseSet::new(Arc::clone(&service), config(SET_TTL_MS));
        let started = tokio::time::Instant::now();
        let mut acquiring = Vec::new();
        for i in 0..N {
            acquiring.push(set.acquire(&format!("lease-{i}")));
        }
        let mut leases = Vec::new();
        for lease in acquiring {
            leases.push(lease.await.expect("granted"));
        }
        let granted = started.elapsed();
        tokio::time::sleep(std_ms(SET_TTL_MS)).await;
        let held = leases.iter().filter(|l| l.check().is_ok()).count();
        eprintln!("{N} leases granted in {granted:?}; {held} still held a TTL later");
        assert_eq!(held, N);
        for lease in &leases {
            lease.release().await;
        }
        let raw = raw(server.port()).await;
        let left: i64 = raw
            .query_one(
                "SELECT count(*) FROM leasehold_leases WHERE owner IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "every lease released");
    });
}
