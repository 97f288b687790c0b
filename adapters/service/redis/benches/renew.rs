//! Renewals per second through `leasehold-redis` next to `redis-benchmark` running the
//! same renew script by `EVALSHA`, at the same concurrency, against the same
//! `redis-server` (which this binary starts); then failover time (holder crashes →
//! a waiting contender is granted) against its bound, remaining TTL + the longest retry
//! wait (retries are jittered between 0.5 and 1.5 retry intervals).
//!
//! ```text
//! cargo bench -p leasehold-redis --bench renew
//! LEASEHOLD_BENCH_SECS=3 LEASEHOLD_BENCH_ROUNDS=9 cargo bench -p leasehold-redis --bench renew
//! ```
//!
//! Our side: N leases, each a task in a closed loop (one renewal outstanding at a
//! time, like a `redis-benchmark` client), all on ONE shared multiplexed connection,
//! through the `LockService::renew` the driver calls. `redis-benchmark -c N`: N
//! connections, one request outstanding on each, one thread. Both run one thread;
//! the machine's other core is Redis's.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::rc::Rc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use leasehold::{Fence, Owner, RenewOutcome, Term};
use leasehold_driver::LockService;
use leasehold_redis::{Acquired, RedisLockService};

const TTL_MS: u64 = 60_000;

fn key(i: usize) -> String {
    // redis-benchmark's `-r N` turns __rand_int__ into 12 zero-padded digits.
    format!("bench:{i:012}")
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let secs: f64 = std::env::var("LEASEHOLD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rounds: usize = std::env::var("LEASEHOLD_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let server = RedisServer::start();
    let token = Owner([0x42; 16]).token(Term(1));
    let token_str = token.encode().as_str().to_owned();

    // Rounds alternate ours and redis-benchmark, so a noisy neighbour hits both alike;
    // the table shows medians and the median of the per-round ratios.
    let mut rows = Vec::new();
    run_local(async {
        let service = service(&server.url()).await;
        for n in [1usize, 100, 1_000] {
            for i in 0..n {
                let granted = service
                    .try_acquire(&key(i), token, &leasehold::Identity::EMPTY, ms(TTL_MS))
                    .await
                    .unwrap();
                assert!(matches!(granted, Acquired::Granted { .. }));
            }
            let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                let a = renew_rate(&service, n, token, secs).await;
                let b = redis_benchmark_rate(&server, n, &token_str, a, secs);
                ours.push(a);
                theirs.push(b);
                ratios.push(a / b);
            }
            rows.push((n, median(&ours), median(&theirs), median(&ratios), ratios));
        }
    });

    println!();
    println!(
        "| leases / clients | leasehold-redis renew/s | redis-benchmark EVALSHA renew/s | \
         ratio (median) | ratio per round |"
    );
    println!("|---:|---:|---:|---:|---|");
    for (n, ours, theirs, ratio, ratios) in &rows {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "| {n} | {ours:.0} | {theirs:.0} | {ratio:.2} | {} |",
            each.join(" ")
        );
    }

    println!();
    let failover = run_local(failover_times(&server));
    println!("| failover (TTL 300 ms, retry 15 ms), 12 trials | min | median | max |");
    println!("|---|---:|---:|---:|");
    let row = |name: &str, v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        println!(
            "| {name} | {:.0} ms | {:.0} ms | {:.0} ms |",
            v[0],
            v[v.len() / 2],
            v[v.len() - 1]
        );
    };
    row(
        "holder crash → contender granted",
        &failover.iter().map(|f| f.0).collect::<Vec<_>>(),
    );
    row(
        "bound: TTL left at the crash + 1.5 retry intervals",
        &failover.iter().map(|f| f.1).collect::<Vec<_>>(),
    );
    row("T + 1.5 retry intervals", &[322.5]);
    let within = failover.iter().filter(|(m, b)| m <= b).count();
    println!(
        "\n{within} of {} trials granted within their bound (TTL left + 1.5 retry intervals)",
        failover.len()
    );
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// N closed-loop renewers on one service (one connection) for `secs`.
async fn renew_rate(
    service: &RedisLockService,
    n: usize,
    token: leasehold::OwnerToken,
    secs: f64,
) -> f64 {
    let counts = Rc::new(std::cell::Cell::new(0u64));
    let warmup = StdDuration::from_millis(300);
    let start = StdInstant::now();
    let measure_from = start + warmup;
    let end = measure_from + StdDuration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for i in 0..n {
        let service = service.clone();
        let counts = counts.clone();
        let key = key(i);
        tasks.push(tokio::task::spawn_local(async move {
            loop {
                let now = StdInstant::now();
                if now >= end {
                    break;
                }
                let outcome = LockService::renew(&service, &key, token, Fence(1), ms(TTL_MS)).await;
                assert!(
                    matches!(outcome, RenewOutcome::Renewed { .. }),
                    "{outcome:?}"
                );
                if now >= measure_from {
                    counts.set(counts.get() + 1);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    counts.get() as f64 / secs
}

/// `redis-benchmark -c n` running the renew script by EVALSHA on the same keys.
fn redis_benchmark_rate(server: &RedisServer, n: usize, token: &str, ours: f64, secs: f64) -> f64 {
    let sha = redis::Script::new(leasehold_redis::lua::RENEW)
        .get_hash()
        .to_owned();
    // About `secs` seconds' worth of requests at our rate, at least 10 per client.
    let requests = ((ours * secs) as usize).max(10 * n);
    let output =
        Command::new(binary("redis-benchmark", "redis-tools").unwrap_or_else(|e| panic!("{e}")))
            .args(["-h", "127.0.0.1", "-p"])
            .arg(server.port().to_string())
            .arg("-c")
            .arg(n.to_string())
            .arg("-n")
            .arg(requests.to_string())
            .arg("-r")
            .arg(n.to_string())
            // Every bench key was granted once, so every fence is 1: the script's first
            // argument is `<token>\n1\n`, the start of every lock value.
            .args(["--csv", "EVALSHA", &sha, "1", "{bench:__rand_int__}"])
            .arg(format!("{token}\n1\n"))
            .arg(TTL_MS.to_string())
            .output()
            .expect("run redis-benchmark (Debian package redis-tools, pulled in by redis-server)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "redis-benchmark failed: {stdout}");
    // "test","rps",...  then  "EVALSHA ...","12345.67",... where the quoted command
    // spans lines (its argument holds newlines): take the field after it.
    let row = stdout
        .find("\"EVALSHA")
        .map(|at| &stdout[at..])
        .unwrap_or_else(|| panic!("no EVALSHA row in redis-benchmark's output: {stdout}"));
    row.split("\",\"")
        .nth(1)
        .and_then(|rps| rps.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("unparsable row: {row}"))
}

/// Holder crashes (its task is dropped: no release, as after a process kill) at a
/// random point of its renew cycle; a contender that is already retrying is granted
/// once Redis expires the key. Returns (measured, bound) in ms per trial, where the
/// bound is the TTL Redis still had at the crash plus the longest jittered retry wait,
/// 1.5 retry intervals.
async fn failover_times(server: &RedisServer) -> Vec<(f64, f64)> {
    let service = service(&server.url()).await;
    let mut raw = raw(&server.url()).await;
    let config = config(300);
    let mut out = Vec::new();
    for trial in 0..12u64 {
        let name = format!("failover{trial}");
        let mut holder = spawn_term(service.clone(), &name, config);
        holder.acquired(std_ms(2_000)).await;
        let mut contender = spawn_term(service.clone(), &name, config);
        // Crash at a different point of the 100 ms renew cycle each trial.
        tokio::time::sleep(std_ms(150 + trial * 9)).await;
        let pttl: i64 = redis::cmd("PTTL")
            .arg(format!("{{{name}}}"))
            .query_async(&mut raw)
            .await
            .unwrap();
        let crashed = mono_now();
        holder.crash();
        contender.acquired(std_ms(2_000)).await;
        let granted = contender.acquired_at().unwrap();
        let measured = granted.saturating_duration_since(crashed).as_micros() as f64 / 1_000.0;
        let bound = pttl as f64 + 1.5 * config.retry_interval().as_millis() as f64;
        out.push((measured, bound));
        contender.release().await;
    }
    out
}
