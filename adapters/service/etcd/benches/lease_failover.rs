//! Lease failover on a real 3-member etcd cluster (`Timing::FAST`: heartbeat 30 ms,
//! election 300 ms), leasehold next to a raw `etcd-client` lease with a keep-alive
//! every T/3 (a persistent `LeaseKeepAlive` stream, each exchange bounded by T/4), in
//! the same run, on the same cluster:
//!
//! * **holder killed → next grant**: the holder's connections are cut and nothing it
//!   sends gets through any more (as etcd sees a killed process); timed until a
//!   contender already waiting is granted the key (leasehold: `acquire_with`; raw: a
//!   watch for the key's deletion, then a create-if-absent transaction).
//! * **leader killed → holder's next renewal**: `LEASES` leases of each kind are held,
//!   the leader is `SIGKILL`ed; timed, per lease, until its first renewal confirmed
//!   after the kill.
//! * **leases lost per leader change**: of those, how many were lost within 2 T of
//!   the kill — leasehold: a `Lost` event (its gate closed); raw: a keep-alive that
//!   did not succeed before the lease's TTL ran out since the last one that did (the
//!   holder could no longer know it held the key).
//!
//! ```text
//! cargo bench -p leasehold-etcd --bench lease_failover
//! LEASEHOLD_BENCH_TTL_MS=2000 LEASEHOLD_BENCH_ROUNDS=3 LEASEHOLD_BENCH_LEASES=50 cargo bench -p leasehold-etcd --bench lease_failover
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{config, hold, proxy_endpoint, service, service_on, EtcdCluster, Proxy, Timing};
use etcd_client::{Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
use leasehold::Event;
use leasehold_test_support::bench::bench_setting;
use leasehold_tokio::{acquire_with, AcquireOptions, TimedEvent};
use tokio::sync::broadcast;
use tokio::time::Instant;

fn main() {
    // The shared test helpers log the crates' debug events unless told otherwise.
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "error");
    }
    // Whole seconds, at least etcd's minimum (1 s with the fast timing).
    let ttl_ms = bench_setting("LEASEHOLD_BENCH_TTL_MS", 3_000);
    let rounds = bench_setting("LEASEHOLD_BENCH_ROUNDS", 3) as usize;
    let leases = bench_setting("LEASEHOLD_BENCH_LEASES", 20) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(ttl_ms, rounds, leases));
}

async fn run(ttl_ms: u64, rounds: usize, leases: usize) {
    let ttl = Duration::from_millis(ttl_ms);
    let mut cluster = EtcdCluster::start(3, Timing::FAST);
    let mut grant = [Vec::new(), Vec::new()];
    let mut renewal = [Vec::new(), Vec::new()];
    let mut lost = [0usize, 0usize];
    for round in 0..rounds {
        grant[0].push(holder_killed_leasehold(&cluster, ttl_ms, round).await);
        grant[1].push(holder_killed_raw(&cluster, ttl, round).await);

        let service = service(&cluster).await;
        let mut held = Vec::new();
        for i in 0..leases {
            let lease = hold(&service, &format!("lh-{round}-{i}"), ttl_ms).await;
            let events = lease.events();
            held.push((lease, events));
        }
        let raw = RawLeases::start(&cluster, ttl, leases, round).await;
        // Every lease renewed at least once before the fault.
        tokio::time::sleep(ttl / 2).await;
        let leader = cluster.leader(Duration::from_secs(5)).await;
        let killed = Instant::now();
        cluster.kill(leader);
        tokio::time::sleep(2 * ttl).await;
        for (lease, events) in &mut held {
            let (next, was_lost) = after(events, killed);
            renewal[0].extend(next);
            lost[0] += usize::from(was_lost || lease.check().is_err());
        }
        let (next, raw_lost) = raw.after(killed, ttl);
        renewal[1].extend(next);
        lost[1] += raw_lost;
        for (lease, _) in &held {
            let _ = tokio::time::timeout(ttl, lease.release()).await;
        }
        raw.stop().await;
        tokio::task::block_in_place(|| {
            cluster.start_member(leader);
            cluster.wait_healthy(leader);
        });
        eprintln!("round {} of {rounds} done", round + 1);
    }
    println!(
        "etcd 3 members (election 300 ms), T = {ttl_ms} ms, {rounds} rounds, {leases} leases \
         each kind per leader kill"
    );
    println!("| | holder killed → next grant (median / max) | leader killed → next renewal (median / p99 / max) | leases lost per leader change |");
    println!("|---|---|---|---|");
    for (i, name) in ["leasehold", "raw etcd-client keep-alive"]
        .iter()
        .enumerate()
    {
        let (gm, _, gx) = stats(&mut grant[i]);
        let (rm, r99, rx) = stats(&mut renewal[i]);
        println!(
            "| {name} | {gm:.0} / {gx:.0} ms | {rm:.0} / {r99:.0} / {rx:.0} ms ({} renewals) | {:.2} ({} of {}) |",
            renewal[i].len(),
            lost[i] as f64 / rounds as f64,
            lost[i],
            rounds * leases
        );
    }
}

/// Median, p99 (nearest rank) and max of `samples`, in ms.
fn stats(samples: &mut [f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    samples.sort_by(f64::total_cmp);
    let rank =
        |q: f64| samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1];
    (rank(0.5), rank(0.99), samples[samples.len() - 1])
}

/// From the events queued: the first renewal after `fault` (ms after it), and
/// whether the lease was lost.
fn after(events: &mut broadcast::Receiver<TimedEvent>, fault: Instant) -> (Option<f64>, bool) {
    let mut first = None;
    let mut lost = false;
    while let Ok(TimedEvent { at, event, .. }) = events.try_recv() {
        match event {
            Event::Renewed { .. } if at > fault && first.is_none() => {
                first = Some((at - fault).as_secs_f64() * 1e3);
            }
            Event::Lost { .. } => lost = true,
            _ => {}
        }
    }
    (first, lost)
}

/// A leasehold holder behind a proxy; the proxy stalls and cuts; a contender waiting
/// on the key directly: ms from the cut to its grant.
async fn holder_killed_leasehold(cluster: &EtcdCluster, ttl_ms: u64, round: usize) -> f64 {
    let proxy = Proxy::start(cluster.client_port(0)).await;
    let holder = service_on(vec![proxy_endpoint(&proxy)]).await;
    let key = format!("killed-lh-{round}");
    let lease = hold(&holder, &key, ttl_ms).await;
    let contender = service(cluster).await;
    let options = AcquireOptions::new().max_wait(Duration::from_millis(4 * ttl_ms));
    let waiting = tokio::spawn(acquire_with(
        Arc::new(contender),
        &key,
        config(ttl_ms),
        options,
    ));
    // The contender has asked and been refused once.
    tokio::time::sleep(Duration::from_millis(ttl_ms / 3)).await;
    let killed = Instant::now();
    proxy.stall();
    proxy.cut();
    let next = waiting
        .await
        .expect("contender task")
        .expect("the contender is granted the key");
    let took = killed.elapsed().as_secs_f64() * 1e3;
    let _ = next.release().await;
    drop(lease);
    took
}

/// The same with raw etcd-client: a holder keeping its lease alive every T/3 through
/// a proxy; a contender that watches the key's deletion and then creates it.
async fn holder_killed_raw(cluster: &EtcdCluster, ttl: Duration, round: usize) -> f64 {
    let proxy = Proxy::start(cluster.client_port(0)).await;
    let key = format!("killed-raw-{round}");
    let mut holder = raw_client(vec![proxy_endpoint(&proxy)]).await;
    let lease = raw_grant(&mut holder, ttl).await;
    create(&mut holder, &key, lease).await;
    let keeper = tokio::spawn(async move {
        let (mut keeper, mut answers) = holder.lease_keep_alive(lease).await.expect("keep-alive");
        loop {
            tokio::time::sleep(ttl / 3).await;
            if keeper.keep_alive().await.is_err() {
                continue;
            }
            let _ = tokio::time::timeout(ttl / 4, answers.message()).await;
        }
    });
    let mut contender = raw_client(cluster.endpoints()).await;
    // Granted up front, so that the grant of the key is one transaction; it must
    // outlive the wait (a put on an expired lease is refused).
    let contender_lease = raw_grant(&mut contender, 5 * ttl).await;
    let waiting = tokio::spawn(async move {
        loop {
            if create(&mut contender, &key, contender_lease).await {
                return;
            }
            // A failed request (a member restarted the round before) is tried
            // again, as a careful raw client would.
            let Ok(mut stream) = contender
                .watch(key.as_str(), Some(WatchOptions::new()))
                .await
            else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            if create(&mut contender, &key, contender_lease).await {
                return;
            }
            while let Ok(Some(answer)) = stream.message().await {
                if answer
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    break;
                }
            }
        }
    });
    tokio::time::sleep(ttl / 3).await;
    let killed = Instant::now();
    proxy.stall();
    proxy.cut();
    tokio::time::timeout(4 * ttl, waiting)
        .await
        .expect("the raw contender is granted within 4 T")
        .expect("contender task");
    let took = killed.elapsed().as_secs_f64() * 1e3;
    keeper.abort();
    took
}

async fn raw_client(endpoints: Vec<String>) -> Client {
    Client::connect(
        endpoints,
        Some(
            etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(500))
                .with_require_leader(true),
        ),
    )
    .await
    .expect("raw client")
}

/// A lease of TTL `ttl`; a failed request (a member restarted the round before) is
/// tried again.
async fn raw_grant(client: &mut Client, ttl: Duration) -> i64 {
    for _ in 0..50 {
        if let Ok(answer) = client.lease_grant(ttl.as_secs().max(1) as i64, None).await {
            return answer.id();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no lease granted in 50 attempts");
}

/// Puts `key` attached to `lease` if it does not exist; whether it did.
async fn create(client: &mut Client, key: &str, lease: i64) -> bool {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "raw",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    client.txn(txn).await.is_ok_and(|answer| answer.succeeded())
}

/// Raw leases, each kept alive every T/3 by a task of its own on one client, which
/// records when each keep-alive succeeded.
struct RawLeases {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    renewed: Vec<Arc<Mutex<Vec<Instant>>>>,
}

impl RawLeases {
    async fn start(cluster: &EtcdCluster, ttl: Duration, n: usize, round: usize) -> RawLeases {
        let client = raw_client(cluster.endpoints()).await;
        let mut tasks = Vec::new();
        let mut renewed = Vec::new();
        for i in 0..n {
            let mut client = client.clone();
            let log = Arc::new(Mutex::new(Vec::new()));
            renewed.push(log.clone());
            let lease = raw_grant(&mut client, ttl).await;
            create(&mut client, &format!("raw-{round}-{i}"), lease).await;
            log.lock().unwrap().push(Instant::now());
            tasks.push(tokio::spawn(async move {
                let mut stream = None;
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    let exchange = async {
                        if stream.is_none() {
                            stream = Some(client.lease_keep_alive(lease).await.ok()?);
                        }
                        let (keeper, answers) = stream.as_mut()?;
                        keeper.keep_alive().await.ok()?;
                        answers.message().await.ok()?
                    };
                    match tokio::time::timeout(ttl / 4, exchange).await {
                        Ok(Some(answer)) if answer.ttl() > 0 => {
                            log.lock().unwrap().push(Instant::now());
                        }
                        _ => stream = None,
                    }
                }
            }));
        }
        RawLeases { tasks, renewed }
    }

    /// Per lease, ms from `fault` to its first keep-alive after it; and how many
    /// leases went a whole TTL without a successful keep-alive.
    fn after(&self, fault: Instant, ttl: Duration) -> (Vec<f64>, usize) {
        let mut next = Vec::new();
        let mut lost = 0;
        for log in &self.renewed {
            let log = log.lock().unwrap();
            if let Some(at) = log.iter().find(|&&at| at > fault) {
                next.push((*at - fault).as_secs_f64() * 1e3);
            }
            if log.windows(2).any(|w| w[1] - w[0] >= ttl)
                || log.last().is_none_or(|&last| last.elapsed() >= ttl)
            {
                lost += 1;
            }
        }
        (next, lost)
    }

    async fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}
