//! Many leases held on one real `redis-server` (which this binary starts) through one
//! `LeaseSet` and one `RedisLockService` connection, for minutes: every renewal on its
//! T/3 schedule, and not one lease lost.
//!
//! ```text
//! cargo bench -p leasehold-redis --bench many_leases                  # 100k leases, 2 min
//! LEASEHOLD_BENCH_LEASES=10000 LEASEHOLD_BENCH_SECS=30 cargo bench -p leasehold-redis --bench many_leases
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-redis --bench many_leases   # 1k, 5 s
//! ```
//!
//! TTL 3 s (a renewal every second per lease, so N leases are N renewals/s), leases
//! started evenly over one renew interval, a 2-worker runtime on a machine whose other
//! work is the Redis server. It reports the **renew lateness** (how long after its
//! schedule, previous send + renew interval, each renewal was sent: p50/p99/max), the
//! renewals per second the server confirmed, client CPU per renewal (process
//! user + system time over the held period, divided by renewals), the client's heap
//! and RSS per lease (a counting allocator; the growth while the leases were
//! acquired, their handles and the renewals in flight at the end included), renewal
//! retries, and **losses**: leases whose term ended while held. Any loss fails the
//! run, in smoke mode too (`scripts/bench-smoke.sh`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use leasehold::{
    AcquireOutcome, Config, Duration, Fence, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_driver::LockService;
use leasehold_redis::RedisLockService;
use leasehold_test_support::bench::{
    bench_setting, load_average, process_cpu_time, quantile, rss_bytes, Lateness,
};
use leasehold_test_support::RedisServer;
use leasehold_tokio::{acquire, LeaseHandle, LeaseSet};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const TTL: StdDuration = StdDuration::from_secs(3);

/// `service`, noting how late each renewal of each lease (`lease-<i>`) was sent.
struct Schedule {
    service: RedisLockService,
    lateness: Lateness,
}

impl LockService for Schedule {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send {
        self.lateness.acquire_sent(key);
        LockService::acquire(&self.service, key, token, identity, ttl)
    }

    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send {
        self.lateness.renewal_sent(key);
        LockService::renew(&self.service, key, token, fence, ttl)
    }

    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> + Send {
        LockService::release(&self.service, key, token)
    }

    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> + Send {
        LockService::holder(&self.service, key)
    }
}

fn main() {
    let smoke = std::env::var("LEASEHOLD_BENCH_SMOKE").is_ok_and(|v| v != "0");
    let (n, secs) = if smoke {
        (1_000, 5)
    } else {
        (
            bench_setting("LEASEHOLD_BENCH_LEASES", 100_000),
            bench_setting("LEASEHOLD_BENCH_SECS", 120),
        )
    };
    let n = usize::try_from(n).expect("a lease count that fits in memory");
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ramp = StdDuration::from_millis(bench_setting("LEASEHOLD_BENCH_RAMP_MS", 1_000));
    let report = runtime.block_on(hold(&server.url(), n, StdDuration::from_secs(secs), ramp));
    println!(
        "many_leases on redis-server: {n} leases, TTL {} ms, held {secs} s, load average {}",
        TTL.as_millis(),
        load_average()
    );
    println!("| leases | renew lateness p50 / p99 / max | renewals/s | client CPU per renewal | heap / RSS per lease | renewal retries | losses |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    println!("{report}");
    assert_eq!(report.losses, 0, "leases were lost while held");
}

struct Report {
    n: usize,
    lateness: [u32; 3],
    renewals_per_sec: f64,
    cpu_per_renewal_us: f64,
    heap_per_lease: f64,
    rss_per_lease: f64,
    retries: u64,
    losses: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [p50, p99, max] = self.lateness.map(|us| f64::from(us) / 1_000.0);
        write!(
            f,
            "| {} | {p50:.2} / {p99:.2} / {max:.2} ms | {:.0} | {:.1} µs | {:.0} / {:.0} B | {} | {} |",
            self.n,
            self.renewals_per_sec,
            self.cpu_per_renewal_us,
            self.heap_per_lease,
            self.rss_per_lease,
            self.retries,
            self.losses
        )
    }
}

async fn hold(url: &str, n: usize, held: StdDuration, ramp: StdDuration) -> Report {
    let config = Config::builder(Duration::from(TTL)).build().unwrap();
    let interval = StdDuration::from(config.renew_interval());
    let service = RedisLockService::connect(url).await.unwrap();
    let schedule = Arc::new(Schedule {
        service,
        lateness: Lateness::new(n, interval, n * (held.as_secs() as usize + 2)),
    });
    let set = LeaseSet::new(schedule.clone(), config);
    let per_task = std::env::var("LEASEHOLD_BENCH_SHAPE").is_ok_and(|v| v == "task");

    // Start the leases spread evenly over `ramp` (one renew interval unless
    // `LEASEHOLD_BENCH_RAMP_MS` says), each acquire in a task of its own (awaiting them
    // in turn would pace the starts by round trips). What the bench itself keeps is
    // allocated before the heap is counted.
    let keys: Vec<String> = (0..n).map(|i| format!("lease-{i}")).collect();
    let mut starting = Vec::with_capacity(n);
    let mut leases: Vec<LeaseHandle> = Vec::with_capacity(n);
    let rss_before = rss_bytes();
    let heap = Region::new(GLOBAL);
    let start = tokio::time::Instant::now();
    for (i, key) in keys.iter().enumerate() {
        let at = start + ramp.mul_f64(i as f64 / n as f64);
        if at > tokio::time::Instant::now() + StdDuration::from_millis(1) {
            tokio::time::sleep_until(at).await;
        }
        starting.push(if per_task {
            tokio::spawn(acquire(schedule.clone(), key, config))
        } else {
            tokio::spawn(set.acquire(key))
        });
    }
    for acquire in starting.drain(..) {
        leases.push(acquire.await.unwrap().expect("acquire"));
    }
    let heap = heap.change();
    let live =
        heap.bytes_allocated as f64 - heap.bytes_deallocated as f64 + heap.bytes_reallocated as f64;
    let rss = rss_bytes().saturating_sub(rss_before) as f64;

    // One interval to settle, then the held period.
    tokio::time::sleep(interval).await;
    let cpu_before = process_cpu_time();
    schedule.lateness.record(true);
    tokio::time::sleep(held).await;
    schedule.lateness.record(false);
    let cpu = process_cpu_time() - cpu_before;

    let losses = leases.iter().filter(|lease| lease.end().is_some()).count();
    let retries = leases
        .iter()
        .map(|lease| u64::from(lease.stats().renewal_retries))
        .sum();
    let mut lateness = schedule.lateness.take();
    lateness.sort_unstable();
    let report = Report {
        n,
        lateness: [0.5, 0.99, 1.0].map(|q| quantile(&lateness, q)),
        renewals_per_sec: lateness.len() as f64 / held.as_secs_f64(),
        cpu_per_renewal_us: cpu.as_secs_f64() * 1e6 / lateness.len().max(1) as f64,
        heap_per_lease: live / n as f64,
        rss_per_lease: rss / n as f64,
        retries,
        losses,
    };
    drop(leases); // each releases its key in the background
    report
}
