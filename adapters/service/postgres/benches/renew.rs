//! Renewals per second through `leasehold-postgres` next to a raw `tokio-postgres`
//! loop of the same `UPDATE`, and a lease-checked transaction next to a plain one, in
//! the same run, against the same PostgreSQL (which this binary starts):
//!
//! * **leasehold-postgres**: `LockService::renew`, the call the driver makes (its
//!   pool: 4 connections, at most 32 requests on the wire, one unnamed statement per
//!   renewal);
//! * **leasehold-postgres, prepared**: the same with
//!   `Builder::prepared_statements(true)` (direct connections only);
//! * **raw, prepared**: 4 `tokio-postgres` connections, the same `UPDATE` prepared
//!   once per connection, renewals pipelined with no bound (what a hand-written loop
//!   on a direct connection does; a transaction-mode pooler cannot keep the prepared
//!   statement);
//! * **raw, unnamed**: the same, each `UPDATE` sent unnamed with `query_typed`, as the
//!   service does (the price of working through a pooler).
//!
//! Then W writers, each on its own connection with its own key, in closed loops of
//! one transaction that updates one row of a data table (no fence column):
//! **plain** (`BEGIN`, `UPDATE`, `COMMIT`) and **lease-checked**
//! (`begin_under_lease`: `BEGIN` and the locking check, the `UPDATE`, the commit's
//! check and `COMMIT`).
//!
//! ```text
//! cargo bench -p leasehold-postgres --bench renew
//! LEASEHOLD_BENCH_SECS=3 LEASEHOLD_BENCH_ROUNDS=5 cargo bench -p leasehold-postgres --bench renew
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-postgres --bench renew   # a few s, fails only on errors
//! ```
//!
//! K leases, each a task in a closed loop (one renewal outstanding at a time), on one
//! thread: the machine's other core is PostgreSQL's. The server is the test
//! support's throwaway cluster (`fsync = off`, `synchronous_commit = off`): the figures
//! are the CPU cost of the statements, not of a disk. Rounds alternate the ways, so a
//! noisy neighbour hits all alike; the tables show medians and the median of the
//! per-round ratios.

#[path = "../tests/common/mod.rs"]
mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use leasehold::{Fence, Identity, OwnerToken, RenewOutcome};
use leasehold_driver::LockService;
use leasehold_postgres::{Acquired, PostgresLockService};
use leasehold_test_support::bench::load_average;
use tokio_postgres::types::Type;

/// Long enough that no lease expires during a run, even between rounds.
const TTL_MS: u64 = 60_000;

const KS: [usize; 3] = [1, 100, 1_000];

/// Connections of the raw peers: as many as the service's pool.
const RAW_CONNECTIONS: usize = 4;

/// Writers in the transaction comparison.
const WRITERS: usize = 8;

#[derive(Clone, Copy)]
enum Way {
    Ours,
    OursPrepared,
    RawPrepared,
    RawUnnamed,
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
        .unwrap_or(if smoke { 0.3 } else { 2.0 });
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
    let server = PostgresServer::start();
    let token = token(7);
    let mut renewals = Vec::new();
    let mut transactions: [Vec<f64>; 2] = Default::default();
    run_local(async {
        let service = PostgresLockService::builder(url_on(server.port()))
            .max_ttl(StdDuration::from_millis(TTL_MS))
            .request_timeout(StdDuration::from_secs(10))
            .create_tables(true)
            .connect()
            .await
            .expect("connect");
        service.mark_data_set_new().await.unwrap();
        let prepared_service = PostgresLockService::builder(url_on(server.port()))
            .max_ttl(StdDuration::from_millis(TTL_MS))
            .request_timeout(StdDuration::from_secs(10))
            .prepared_statements(true)
            .connect()
            .await
            .expect("connect");
        let mut raws = Vec::new();
        for _ in 0..RAW_CONNECTIONS {
            let client = raw(server.port()).await;
            let prepared = client
                .prepare_typed(
                    service.renew_sql(),
                    &[Type::TEXT, Type::TEXT, Type::INT8, Type::INT8],
                )
                .await
                .unwrap();
            raws.push((Rc::new(client), prepared));
        }
        let mut grants: Vec<(String, Fence)> = Vec::new();
        for k in KS {
            grow(&service, token, &mut grants, k).await;
            let grants = &grants[..k];
            let mut rates: [Vec<f64>; 4] = Default::default();
            for _ in 0..settings.rounds {
                for (i, way) in [
                    Way::Ours,
                    Way::OursPrepared,
                    Way::RawPrepared,
                    Way::RawUnnamed,
                ]
                .into_iter()
                .enumerate()
                {
                    let service = match way {
                        Way::OursPrepared => &prepared_service,
                        _ => &service,
                    };
                    let rate = rate(&settings, service, &raws, token, grants, way).await;
                    rates[i].push(rate);
                }
            }
            renewals.push((k, rates));
        }

        let data = raw(server.port()).await;
        data.batch_execute(
            "CREATE TABLE bench_data (id INT PRIMARY KEY, v BIGINT NOT NULL);\
             INSERT INTO bench_data SELECT g, 0 FROM generate_series(0, 63) g",
        )
        .await
        .unwrap();
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let key = format!("bench/tx/{w}");
            let Acquired::Granted { fence, .. } = service
                .try_acquire(&key, token, &Identity::EMPTY, ms(TTL_MS))
                .await
                .unwrap()
            else {
                panic!("acquire {key}")
            };
            let client = service.dedicated_connection().await.unwrap();
            writers.push((w, key, fence, client));
        }
        let service = Arc::new(service);
        for _ in 0..settings.rounds {
            for (i, guarded) in [false, true].into_iter().enumerate() {
                let (rate, back) = tx_rate(&settings, &service, token, writers, guarded).await;
                writers = back;
                transactions[i].push(rate);
            }
        }
    });

    println!();
    println!("load average {}", load_average());
    println!(
        "| leases K | leasehold-postgres renew/s | raw unnamed/s | ours ÷ raw unnamed \
         (median; per round) | leasehold-postgres prepared renew/s | raw prepared/s | ours \
         prepared ÷ raw prepared (median; per round) |"
    );
    println!("|---:|---:|---:|---|---:|---:|---|");
    for (k, [ours, ours_prepared, prepared, unnamed]) in &renewals {
        let (vs_unnamed, vs_unnamed_each) = ratios(ours, unnamed);
        let (vs_prepared, vs_prepared_each) = ratios(ours_prepared, prepared);
        println!(
            "| {k} | {:.0} | {:.0} | {vs_unnamed:.2}; {vs_unnamed_each} | {:.0} | {:.0} | \
             {vs_prepared:.2}; {vs_prepared_each} |",
            median(ours),
            median(unnamed),
            median(ours_prepared),
            median(prepared),
        );
    }
    let [plain, guarded] = &transactions;
    let (ratio, each) = ratios(guarded, plain);
    println!();
    println!(
        "| writers | plain transactions/s | lease-checked transactions/s | lease-checked ÷ \
         plain (median; per round) |"
    );
    println!("|---:|---:|---:|---|");
    println!(
        "| {WRITERS} | {:.0} | {:.0} | {ratio:.2}; {each} |",
        median(plain),
        median(guarded)
    );
    if settings.smoke {
        println!(
            "\n(smoke run: {} s per measurement, numbers not meaningful)",
            settings.secs
        );
    }
}

/// A current-thread runtime: one core for the client side, the other for PostgreSQL.
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

/// The median of `ours[i] / theirs[i]`, and each ratio.
fn ratios(ours: &[f64], theirs: &[f64]) -> (f64, String) {
    let each: Vec<f64> = ours.iter().zip(theirs).map(|(a, b)| a / b).collect();
    let text: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
    (median(&each), text.join(" "))
}

/// Acquires leases until there are `k`, 100 at a time.
async fn grow(
    service: &PostgresLockService,
    token: OwnerToken,
    grants: &mut Vec<(String, Fence)>,
    k: usize,
) {
    while grants.len() < k {
        let batch: Vec<_> = (grants.len()..k.min(grants.len() + 100))
            .map(|i| {
                let service = service.clone();
                tokio::task::spawn_local(async move {
                    let key = format!("bench/renew/{i:05}");
                    let granted = service
                        .try_acquire(&key, token, &id("bench"), ms(TTL_MS))
                        .await
                        .unwrap_or_else(|e| panic!("acquire {key}: {e}"));
                    let Acquired::Granted { fence, .. } = granted else {
                        panic!("acquire {key}: {granted:?}");
                    };
                    (key, fence)
                })
            })
            .collect();
        for task in batch {
            grants.push(task.await.expect("acquire task"));
        }
    }
}

/// `grants.len()` closed-loop renewers, the `way` given, for `secs` after a warm-up:
/// renewals per second. Any failure panics: the smoke run fails only on errors.
async fn rate(
    settings: &Settings,
    service: &PostgresLockService,
    raws: &[(Rc<tokio_postgres::Client>, tokio_postgres::Statement)],
    token: OwnerToken,
    grants: &[(String, Fence)],
    way: Way,
) -> f64 {
    let count = Rc::new(Cell::new(0u64));
    let start = StdInstant::now();
    let measure_from = start + settings.warmup;
    let end = measure_from + StdDuration::from_secs_f64(settings.secs);
    let owner = token.encode().as_str().to_owned();
    let tasks: Vec<_> = grants
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, (key, fence))| {
            let count = count.clone();
            let service = service.clone();
            let (client, prepared) = raws[i % raws.len()].clone();
            let owner = owner.clone();
            let sql = service.renew_sql().to_owned();
            tokio::task::spawn_local(async move {
                let ttl = ms(TTL_MS);
                let (fence_sql, ttl_us) = (fence.0 as i64, (TTL_MS * 1_000) as i64);
                while StdInstant::now() < end {
                    match way {
                        Way::Ours | Way::OursPrepared => {
                            let outcome =
                                LockService::renew(&service, &key, token, fence, ttl).await;
                            assert!(
                                matches!(outcome, RenewOutcome::Renewed { .. }),
                                "renew {key}: {outcome:?}"
                            );
                        }
                        Way::RawPrepared => {
                            let rows = client
                                .query(&prepared, &[&key, &owner, &fence_sql, &ttl_us])
                                .await
                                .expect("raw renewal");
                            assert_eq!(rows.len(), 1, "{key} is not ours any more");
                        }
                        Way::RawUnnamed => {
                            let rows = client
                                .query_typed(
                                    &sql,
                                    &[
                                        (&key, Type::TEXT),
                                        (&owner, Type::TEXT),
                                        (&fence_sql, Type::INT8),
                                        (&ttl_us, Type::INT8),
                                    ],
                                )
                                .await
                                .expect("raw renewal");
                            assert_eq!(rows.len(), 1, "{key} is not ours any more");
                        }
                    }
                    if StdInstant::now() >= measure_from {
                        count.set(count.get() + 1);
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

type Writer = (usize, String, Fence, tokio_postgres::Client);

/// The writers in closed loops of one transaction each (lease-checked or plain) for
/// `secs` after a warm-up: transactions per second; the writers back.
async fn tx_rate(
    settings: &Settings,
    service: &Arc<PostgresLockService>,
    token: OwnerToken,
    writers: Vec<Writer>,
    guarded: bool,
) -> (f64, Vec<Writer>) {
    let count = Rc::new(Cell::new(0u64));
    let start = StdInstant::now();
    let measure_from = start + settings.warmup;
    let end = measure_from + StdDuration::from_secs_f64(settings.secs);
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|(w, key, fence, mut client)| {
            let count = count.clone();
            let service = Arc::clone(service);
            tokio::task::spawn_local(async move {
                let id = w as i32;
                while StdInstant::now() < end {
                    let update = "UPDATE bench_data SET v = v + 1 WHERE id = $1";
                    if guarded {
                        let tx = service
                            .begin_under_lease(&mut client, &key, token, fence)
                            .await
                            .expect("the lease is ours");
                        tx.execute(update, &[&id]).await.expect("update");
                        tx.commit().await.expect("commit under the lease");
                    } else {
                        let tx = client.transaction().await.expect("begin");
                        tx.execute(update, &[&id]).await.expect("update");
                        tx.commit().await.expect("commit");
                    }
                    if StdInstant::now() >= measure_from {
                        count.set(count.get() + 1);
                    }
                }
                (w, key, fence, client)
            })
        })
        .collect();
    let mut back = Vec::new();
    for task in tasks {
        back.push(task.await.expect("writer task"));
    }
    (count.get() as f64 / settings.secs, back)
}
