//! Many concurrent leases in one process, on the in-memory service, in real time.
//!
//! ```text
//! cargo bench -p leasehold-tokio --bench many_leases                 # 1k, 10k, 100k
//! cargo bench -p leasehold-tokio --bench many_leases -- 1000         # just 1k
//! LEASEHOLD_BENCH_LEASES=1000,10000 cargo bench -p leasehold-tokio --bench many_leases
//! LEASEHOLD_BENCH_SHAPE=set LEASEHOLD_BENCH_TTL_MS=30000 LEASEHOLD_BENCH_PERIODS=30 \
//!     cargo bench -p leasehold-tokio --bench many_leases -- 1000000  # 1M for 5 minutes
//! ```
//!
//! Each N runs in both driver shapes, one after the other: `task` (`acquire`, a task
//! and a runtime timer per lease) and `set` (one `LeaseSet`, a driver task per worker
//! with one timer each); `LEASEHOLD_BENCH_SHAPE=task` or `=set` runs one. For each it
//! reports:
//!
//! * **renew lateness** — how long after its T/3 schedule (previous send + renew
//!   interval) each renewal was actually sent, p50/p99/max, measured over 3 renew
//!   periods (`LEASEHOLD_BENCH_PERIODS`) on a 2-worker multi-thread runtime; TTL 3 s
//!   (`LEASEHOLD_BENCH_TTL_MS`);
//! * **CPU per renewal** — process user+system time (getrusage) over those periods,
//!   divided by the renewals sent; it includes everything: timers, the service, tokio;
//! * **memory per lease** — live heap bytes (a counting allocator) and RSS growth
//!   after N leases are acquired, divided by N: handle, shared state, driver task and
//!   its futures, the service's entry and both copies of the key;
//! * **loss-to-flip** — for up to 1,000 leases: from the service deciding `NotOwner`
//!   to `lost()` resolving (the gate flips before that), and from the safe deadline
//!   passing (a partitioned client) to `lost()` resolving. `check()` itself refuses at
//!   the deadline by construction: the gate holds the deadline.
//!
//! Leases start spread evenly over one renew interval, as leases in a real service
//! would be; all starting in the same millisecond would measure a thundering herd.
//! Run without `--bench` (as `cargo test --benches` does) it is a 100-lease smoke run.

use std::alloc::System;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use leasehold::{
    AcquireOutcome, Config, Duration, Fence, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_driver::LockService;
use leasehold_test_support::bench::{
    bench_setting, load_average, process_cpu_time, quantile, rss_bytes, Lateness,
};
use leasehold_tokio::memory::MemoryService;
use leasehold_tokio::{acquire, LeaseEnd, LeaseHandle, LeaseSet};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::time::Instant;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// How long the steady state is measured by default, in renew intervals.
const MEASURED_PERIODS: u32 = 3;

/// Which driver drives the leases.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// `acquire`: a task and a runtime timer per lease.
    Task,
    /// One `LeaseSet`: a driver task per worker, one timer each.
    Set,
}
/// How many leases the loss measurements use at most (each kind).
const LOSS_SAMPLE: usize = 1_000;

fn main() {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let from_args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.replace('_', "").parse().ok())
        .collect();
    let from_env: Vec<usize> = std::env::var("LEASEHOLD_BENCH_LEASES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|n| n.trim().replace('_', "").parse().ok())
        .collect();
    let ttl = StdDuration::from_millis(bench_setting("LEASEHOLD_BENCH_TTL_MS", 3_000));
    let (sizes, ttl) = match (bench, from_args.is_empty(), from_env.is_empty()) {
        (false, true, true) => (vec![100], StdDuration::from_millis(300)), // smoke run
        (_, false, _) => (from_args, ttl),
        (_, true, false) => (from_env, ttl),
        (true, true, true) => (vec![1_000, 10_000, 100_000], ttl),
    };
    let periods = bench_setting("LEASEHOLD_BENCH_PERIODS", MEASURED_PERIODS.into()) as u32;
    let shapes = match std::env::var("LEASEHOLD_BENCH_SHAPE").as_deref() {
        Ok("task") => vec![Shape::Task],
        Ok("set") => vec![Shape::Set],
        Ok("") | Err(_) => vec![Shape::Task, Shape::Set],
        Ok(other) => panic!("LEASEHOLD_BENCH_SHAPE={other}: expected task or set"),
    };
    println!(
        "many_leases: ttl {} ms, renew every {} ms, 2 worker threads, {} cores, load average {}",
        ttl.as_millis(),
        ttl.as_millis() / 3,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!("| leases | shape | renew lateness p50 / p99 / max | CPU per renewal | heap per lease | RSS per lease | NotOwner → lost() p50 / p99 | deadline → lost() p50 / p99 |");
    println!("|---:|---|---|---:|---:|---:|---|---|");
    for n in sizes {
        for &shape in &shapes {
            let report = run(n, ttl, periods, shape);
            println!("{report}");
            assert_eq!(report.refused_after_loss, 0, "a check passed after a loss");
        }
    }
}

/// The in-memory service, timestamping what the bench needs.
struct Probe {
    service: MemoryService,
    lateness: Lateness,
    /// Per lease: the bench expired it at the service; its next renewal is refused.
    doomed: Vec<AtomicBool>,
    /// Per lease: when the service refused it (µs on `lateness`'s clock).
    refused_at: Vec<AtomicU64>,
    /// With `LEASEHOLD_BENCH_TIMELINE`: (send time, lateness) of every measured renewal.
    timeline: Option<Mutex<Vec<(u32, u32)>>>,
}

impl LockService for Probe {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send {
        let now = self.lateness.acquire_sent(key);
        if let Some(timeline) = &self.timeline {
            timeline.lock().unwrap().push((now as u32, 0));
        }
        self.service.acquire(key, token, identity, ttl)
    }

    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> + Send {
        self.service.holder(key)
    }

    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send {
        let i = Lateness::index(key);
        let (now, late) = self.lateness.renewal_sent(key);
        if let Some(timeline) = &self.timeline {
            timeline.lock().unwrap().push((now as u32, late));
        }
        if self.doomed[i].load(Ordering::Relaxed) {
            // The service decides when it handles the request: on the first poll,
            // right after this call, in the same driver step.
            self.refused_at[i].store(now, Ordering::Relaxed);
        }
        self.service.renew(key, token, fence, ttl)
    }

    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> + Send {
        self.service.release(key, token)
    }

    fn revoked(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> impl Future<Output = ()> + Send {
        self.service.revoked(key, token, fence)
    }
}

struct Report {
    n: usize,
    shape: Shape,
    lateness: Percentiles,
    cpu_per_renewal_us: f64,
    heap_per_lease: f64,
    rss_per_lease: f64,
    not_owner: Percentiles,
    deadline: Percentiles,
    refused_after_loss: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "| {} | {:?} | {} | {:.1} µs | {:.0} B | {:.0} B | {} | {} |",
            self.n,
            self.shape,
            self.lateness.full(),
            self.cpu_per_renewal_us,
            self.heap_per_lease,
            self.rss_per_lease,
            self.not_owner.short(),
            self.deadline.short(),
        )?;
        if self.refused_after_loss > 0 {
            write!(
                f,
                " ({} checks passed after a loss!)",
                self.refused_after_loss
            )?;
        }
        Ok(())
    }
}

fn run(n: usize, ttl: StdDuration, periods: u32, shape: Shape) -> Report {
    let config = Config::builder(Duration::from_micros(ttl.as_micros() as u64))
        .build()
        .unwrap();
    let renew = StdDuration::from_micros(config.renew_interval().as_micros());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async move {
        // Everything the bench itself needs is allocated before the baseline.
        let probe = Arc::new(Probe {
            service: MemoryService::new(),
            lateness: Lateness::new(n, renew, n * (periods as usize + 2)),
            doomed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            refused_at: (0..n).map(|_| AtomicU64::new(0)).collect(),
            timeline: std::env::var_os("LEASEHOLD_BENCH_TIMELINE")
                .map(|_| Mutex::new(Vec::with_capacity(n * (periods as usize + 4)))),
        });
        let set = LeaseSet::new(probe.clone(), config);
        let mut handles: Vec<LeaseHandle> = Vec::with_capacity(n);
        // Acquires in flight, oldest first; collected as they finish, so that a
        // million finished acquire tasks do not wait to be joined at the end (their
        // memory, freed then, would stay in the RSS figure).
        let mut starting = std::collections::VecDeque::new();
        let keys: Vec<String> = (0..n).map(|i| format!("lease-{i}")).collect();
        let rss_before = rss_bytes();
        let heap = Region::new(GLOBAL);

        // Start N leases spread evenly over one renew interval. Each acquire runs in a
        // task of its own: awaiting them one by one from here would pace the starts by
        // a cross-thread round trip each (~50 µs: 100k leases would take 5 s to start,
        // not the one interval this claims).
        let start = Instant::now();
        for (i, key) in keys.iter().enumerate() {
            let at = start + renew.mul_f64(i as f64 / n as f64);
            if at > Instant::now() + StdDuration::from_millis(1) {
                tokio::time::sleep_until(at).await;
            }
            starting.push_back(match shape {
                Shape::Task => tokio::spawn(acquire(probe.clone(), key, config)),
                Shape::Set => tokio::spawn(set.acquire(key)),
            });
            while starting.front().is_some_and(|s| s.is_finished()) {
                if let Some(started) = starting.pop_front() {
                    handles.push(started.await.unwrap().unwrap());
                }
            }
        }
        for started in starting.drain(..) {
            handles.push(started.await.unwrap().unwrap());
        }
        let heap_change = heap.change();
        let live = heap_change.bytes_allocated as f64 - heap_change.bytes_deallocated as f64
            + heap_change.bytes_reallocated as f64;
        let heap_per_lease = live / n as f64;
        let rss_per_lease = rss_bytes().saturating_sub(rss_before) as f64 / n as f64;

        // Steady state: one period to settle, then measure.
        tokio::time::sleep(renew).await;
        let cpu_before = process_cpu_time();
        probe.lateness.record(true);
        tokio::time::sleep(renew * periods).await;
        probe.lateness.record(false);
        let cpu = process_cpu_time() - cpu_before;
        let lateness: Vec<u32> = probe.lateness.take();
        let cpu_per_renewal_us = cpu.as_secs_f64() * 1e6 / lateness.len().max(1) as f64;
        let lateness = Percentiles::of(lateness);
        if let Some(timeline) = &probe.timeline {
            print_timeline(std::mem::take(&mut *timeline.lock().unwrap()));
        }

        // NotOwner: expire a sample at the service; each is refused at its next renewal.
        let sample = LOSS_SAMPLE.min(n / 2).max(1);
        let refused_after_loss = Arc::new(AtomicU64::new(0));
        let mut waiters = Vec::new();
        for i in (0..sample).map(|k| k * n / sample) {
            probe.doomed[i].store(true, Ordering::Relaxed);
            let (lease, shared_probe, bad) = (
                handles[i].clone(),
                probe.clone(),
                refused_after_loss.clone(),
            );
            waiters.push(tokio::spawn(async move {
                let end = lease.lost().await;
                let flipped = shared_probe.lateness.now_us();
                if lease.check().is_ok() {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                assert_eq!(end, LeaseEnd::Lost(leasehold::LossReason::NotOwner));
                flipped.saturating_sub(shared_probe.refused_at[i].load(Ordering::Relaxed))
            }));
            probe.service.expire_now(&keys[i]);
        }
        let mut not_owner = Vec::new();
        for waiter in waiters {
            not_owner.push(waiter.await.unwrap() as u32);
        }

        // Expired: partition another sample; each loses at its safe deadline.
        let mut waiters = Vec::new();
        let partitioned: Vec<usize> = (0..sample)
            .map(|k| k * n / sample + 1)
            .filter(|i| *i < n)
            .collect();
        for &i in &partitioned {
            probe.service.partition(handles[i].owner());
        }
        // Let any renewal already in flight land before reading the deadlines.
        tokio::time::sleep(StdDuration::from_millis(10)).await;
        for &i in &partitioned {
            let lease = handles[i].clone();
            let deadline = lease.clock().to_tokio(lease.deadline().unwrap());
            let bad = refused_after_loss.clone();
            waiters.push(tokio::spawn(async move {
                let end = lease.lost().await;
                let flipped = Instant::now();
                if lease.check().is_ok() {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                assert_eq!(end, LeaseEnd::Lost(leasehold::LossReason::Expired));
                flipped.saturating_duration_since(deadline).as_micros() as u32
            }));
        }
        let mut deadline = Vec::new();
        for waiter in waiters {
            deadline.push(waiter.await.unwrap());
        }

        drop(handles);
        Report {
            n,
            shape,
            lateness,
            cpu_per_renewal_us,
            heap_per_lease,
            rss_per_lease,
            not_owner: Percentiles::of(not_owner),
            deadline: Percentiles::of(deadline),
            refused_after_loss: refused_after_loss.load(Ordering::Relaxed) as usize,
        }
    })
}

/// Percentiles of microsecond samples.
struct Percentiles {
    p50: u32,
    p99: u32,
    max: u32,
    count: usize,
}

impl Percentiles {
    fn of(mut samples: Vec<u32>) -> Percentiles {
        samples.sort_unstable();
        Percentiles {
            p50: quantile(&samples, 0.50),
            p99: quantile(&samples, 0.99),
            max: samples.last().copied().unwrap_or(0),
            count: samples.len(),
        }
    }

    fn full(&self) -> String {
        format!(
            "{} / {} / {} (n={})",
            ms(self.p50),
            ms(self.p99),
            ms(self.max),
            self.count
        )
    }

    fn short(&self) -> String {
        format!("{} / {}", ms(self.p50), ms(self.p99))
    }
}

fn ms(us: u32) -> String {
    format!("{:.2} ms", f64::from(us) / 1_000.0)
}

/// Lateness over time in 10 ms buckets of send time, to stderr: periodic spikes show.
fn print_timeline(mut samples: Vec<(u32, u32)>) {
    const BUCKET_US: u32 = 10_000;
    samples.sort_unstable();
    let mut start = 0;
    while start < samples.len() {
        let bucket = samples[start].0 / BUCKET_US;
        let end = start
            + samples[start..]
                .iter()
                .take_while(|(at, _)| at / BUCKET_US == bucket)
                .count();
        let late = Percentiles::of(samples[start..end].iter().map(|s| s.1).collect());
        eprintln!(
            "timeline {:>6} ms n={:>5} p50 {:>6} p99 {:>6} max {:>6}",
            bucket * BUCKET_US / 1_000,
            late.count,
            ms(late.p50),
            ms(late.p99),
            ms(late.max)
        );
        start = end;
    }
}
