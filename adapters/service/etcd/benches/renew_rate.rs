//! Renewals per second through `leasehold-etcd` next to the raw `etcd-client`
//! alternatives, at the same concurrency, against the same `etcd` (which this binary
//! starts):
//!
//! * **leasehold-etcd**: `LockService::renew`, the call the driver makes;
//! * **raw keep-alive**: one persistent `LeaseKeepAlive` stream per lease, a
//!   keep-alive sent and its answer awaited, again and again;
//! * **raw keep-alive + txn**: the same, each keep-alive followed by the ownership
//!   check a careful client needs (a keep-alive alone does not notice the key deleted
//!   from outside): a transaction comparing the key's value, version (1: never
//!   written since its creation) and lease.
//!
//! ```text
//! cargo bench -p leasehold-etcd --bench renew_rate
//! LEASEHOLD_BENCH_SECS=3 LEASEHOLD_BENCH_ROUNDS=5 cargo bench -p leasehold-etcd --bench renew_rate
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-etcd --bench renew_rate   # ~10 s, fails only on errors
//! ```
//!
//! K leases, each a task in a closed loop (one renewal outstanding at a time), all on
//! ONE client (one gRPC channel), on one thread: the machine's other core is etcd's.
//! Every peer renews over warm streams: before the first round at each K, every lease
//! renews once through leasehold-etcd (which opens its keep-alive stream and keeps it)
//! and the raw peers open one keep-alive stream per lease, which both raw peers use,
//! round after round, as leasehold keeps its own. Each round runs the three in
//! another order (round r starts with peer r mod 3), so a noisy neighbour or a cache
//! warmed by the peer before hits all alike; the table shows medians and the median
//! of the per-round ratios.

#[path = "../tests/common/mod.rs"]
mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use etcd_client::{Client, Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, Txn};
use leasehold::{Fence, OwnerToken, RenewOutcome};
use leasehold_driver::LockService;
use leasehold_etcd::{Acquired, EtcdLockService};

/// Long enough that no lease expires during a run, even between rounds (every peer
/// renews every lease, one after the other), and no longer than the service's
/// default `max_ttl` (30 s), which refuses longer asks.
const TTL_SECS: u64 = 30;

const KS: [usize; 3] = [1, 100, 1_000];

/// One lease under test: its key, fence and etcd lease id, and the raw peers' warm
/// keep-alive stream for it (taken by the raw renewer that runs, put back after).
#[derive(Clone)]
struct Grant {
    key: String,
    fence: Fence,
    lease: i64,
    value: Vec<u8>,
    stream: Rc<RefCell<Option<(LeaseKeeper, LeaseKeepAliveStream)>>>,
}

#[derive(Clone, Copy)]
enum Way {
    Ours,
    RawKeepAlive,
    RawKeepAliveTxn,
}

struct Settings {
    secs: f64,
    warmup: StdDuration,
    rounds: usize,
    smoke: bool,
}

fn settings() -> Settings {
    let env = |name: &str| std::env::var(name).ok();
    let smoke = env("LEASEHOLD_BENCH_SMOKE").is_some_and(|v| v != "0");
    let secs = env("LEASEHOLD_BENCH_SECS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 0.4 } else { 2.0 });
    let rounds = env("LEASEHOLD_BENCH_ROUNDS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 1 } else { 3 });
    Settings {
        secs,
        warmup: StdDuration::from_millis(if smoke { 100 } else { 300 }),
        rounds,
        smoke,
    }
}

fn main() {
    // `cargo bench` passes `--bench`, `cargo test` nothing useful: no arguments read.
    let settings = settings();
    let cluster = EtcdCluster::single();
    let token = token();
    let mut rows = Vec::new();
    run_local(async {
        let service = service(&cluster).await;
        let client = service.client().clone();
        let mut grants = Vec::new();
        let ways = [Way::Ours, Way::RawKeepAlive, Way::RawKeepAliveTxn];
        for k in KS {
            grow(&service, token, &mut grants, k).await;
            let grants = &grants[..k];
            warm(&service, &client, token, grants).await;
            let mut rates: [Vec<f64>; 3] = Default::default();
            for round in 0..settings.rounds {
                for i in (0..ways.len()).map(|n| (round + n) % ways.len()) {
                    let rate = rate(&settings, &service, &client, token, grants, ways[i]).await;
                    rates[i].push(rate);
                }
            }
            rows.push((k, rates));
        }
    });

    println!();
    println!(
        "| leases K | leasehold-etcd renew/s | raw keep-alive/s | raw keep-alive + txn/s | \
         ours ÷ raw+txn (median; per round) | ours ÷ raw keep-alive (median; per round) |"
    );
    println!("|---:|---:|---:|---:|---|---|");
    for (k, [ours, raw, raw_txn]) in &rows {
        let ratios = |theirs: &[f64]| -> (f64, String) {
            let each: Vec<f64> = ours.iter().zip(theirs).map(|(a, b)| a / b).collect();
            let text: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
            (median(&each), text.join(" "))
        };
        let (vs_txn, vs_txn_each) = ratios(raw_txn);
        let (vs_raw, vs_raw_each) = ratios(raw);
        println!(
            "| {k} | {:.0} | {:.0} | {:.0} | {vs_txn:.2}; {vs_txn_each} | {vs_raw:.2}; {vs_raw_each} |",
            median(ours),
            median(raw),
            median(raw_txn),
        );
    }
    if settings.smoke {
        println!(
            "\n(smoke run: {} s per measurement, numbers not meaningful)",
            settings.secs
        );
    }
}

/// A current-thread runtime: one core for the client side, the other for etcd.
fn run_local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    tokio::task::LocalSet::new().block_on(&rt, f)
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Acquires leases until there are `k`, 100 at a time.
async fn grow(service: &EtcdLockService, token: OwnerToken, grants: &mut Vec<Grant>, k: usize) {
    while grants.len() < k {
        let batch: Vec<_> = (grants.len()..k.min(grants.len() + 100))
            .map(|i| {
                let service = service.clone();
                tokio::task::spawn_local(async move {
                    let key = format!("bench/renew/{i:05}");
                    let identity = identity("bench");
                    let granted = service
                        .try_acquire(&key, token, &identity, ms(TTL_SECS * 1_000))
                        .await
                        .unwrap_or_else(|e| panic!("acquire {key}: {e}"));
                    let Acquired::Granted { fence, lease, .. } = granted else {
                        panic!("acquire {key}: {granted:?}");
                    };
                    // The value as the service stores it (`value.rs`).
                    let value =
                        format!("{}\n{}\nbench", token.encode().as_str(), fence.0).into_bytes();
                    Grant {
                        key,
                        fence,
                        lease,
                        value,
                        stream: Rc::default(),
                    }
                })
            })
            .collect();
        for task in batch {
            grants.push(task.await.expect("acquire task"));
        }
    }
}

/// Warm streams for every peer: one renewal of each grant through leasehold-etcd
/// (its keep-alive stream stays open in the service), and a keep-alive stream for the
/// raw peers where a grant has none yet.
async fn warm(service: &EtcdLockService, client: &Client, token: OwnerToken, grants: &[Grant]) {
    let tasks: Vec<_> = grants
        .iter()
        .cloned()
        .map(|grant| {
            let service = service.clone();
            let mut client = client.clone();
            tokio::task::spawn_local(async move {
                let ttl = ms(TTL_SECS * 1_000);
                let outcome =
                    LockService::renew(&service, &grant.key, token, grant.fence, ttl).await;
                assert!(
                    matches!(outcome, RenewOutcome::Renewed { .. }),
                    "renew {}: {outcome:?}",
                    grant.key
                );
                if grant.stream.borrow().is_none() {
                    let stream = client
                        .lease_keep_alive(grant.lease)
                        .await
                        .unwrap_or_else(|e| panic!("keep-alive stream for {}: {e}", grant.key));
                    *grant.stream.borrow_mut() = Some(stream);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("warm-up task");
    }
}

/// `grants.len()` closed-loop renewers, the `way` given, for `secs` after a warm-up:
/// renewals per second. Any failure panics: the smoke run fails only on errors.
async fn rate(
    settings: &Settings,
    service: &EtcdLockService,
    client: &Client,
    token: OwnerToken,
    grants: &[Grant],
    way: Way,
) -> f64 {
    let count = Rc::new(Cell::new(0u64));
    let start = StdInstant::now();
    let measure_from = start + settings.warmup;
    let end = measure_from + StdDuration::from_secs_f64(settings.secs);
    let tasks: Vec<_> = grants
        .iter()
        .cloned()
        .map(|grant| {
            let count = count.clone();
            let service = service.clone();
            let client = client.clone();
            tokio::task::spawn_local(async move {
                let counted = || {
                    if StdInstant::now() >= measure_from {
                        count.set(count.get() + 1);
                    }
                };
                match way {
                    Way::Ours => {
                        while StdInstant::now() < end {
                            let ttl = ms(TTL_SECS * 1_000);
                            let outcome =
                                LockService::renew(&service, &grant.key, token, grant.fence, ttl)
                                    .await;
                            assert!(
                                matches!(outcome, RenewOutcome::Renewed { .. }),
                                "renew {}: {outcome:?}",
                                grant.key
                            );
                            counted();
                        }
                    }
                    Way::RawKeepAlive | Way::RawKeepAliveTxn => {
                        raw(
                            client,
                            &grant,
                            matches!(way, Way::RawKeepAliveTxn),
                            end,
                            counted,
                        )
                        .await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("renewer task");
    }
    count.get() as f64 / settings.secs
}

/// A raw renewer on the grant's warm keep-alive stream (put back for the next run);
/// with `txn`, each answer is followed by the ownership transaction.
async fn raw(mut client: Client, grant: &Grant, txn: bool, end: StdInstant, counted: impl Fn()) {
    let (mut keeper, mut stream) = grant
        .stream
        .take()
        .unwrap_or_else(|| panic!("no warm keep-alive stream for {}", grant.key));
    // Version 1: created once and never written since (what a create revision
    // compared with the grant's would say).
    let check = Txn::new().when([
        Compare::value(grant.key.as_str(), CompareOp::Equal, grant.value.clone()),
        Compare::version(grant.key.as_str(), CompareOp::Equal, 1),
        Compare::lease(grant.key.as_str(), CompareOp::Equal, grant.lease),
    ]);
    while StdInstant::now() < end {
        keeper.keep_alive().await.expect("send a keep-alive");
        let answer = stream
            .message()
            .await
            .expect("a keep-alive answer")
            .expect("the stream is open");
        assert!(answer.ttl() > 0, "lease {} gone", grant.lease);
        if txn {
            let answer = client.txn(check.clone()).await.expect("the ownership txn");
            assert!(answer.succeeded(), "{} is not ours any more", grant.key);
        }
        counted();
    }
    grant.stream.replace(Some((keeper, stream)));
}
