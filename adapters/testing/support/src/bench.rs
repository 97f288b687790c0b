//! What the benchmarks share: settings from the environment, and the machine's state
//! and CPU time for their figures.

use std::time::Duration;

/// A bench setting from the environment (`LEASEHOLD_BENCH_TTL_MS`, …; `_` may
/// separate thousands), or `default`.
///
/// # Panics
///
/// When the variable is set but is not a whole number: a typo must not run the
/// bench with a silent default.
pub fn bench_setting(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?}: expected a whole number")),
        Err(_) => default,
    }
}

/// User + system CPU time of this whole process.
///
/// # Panics
///
/// If `getrusage` fails, which it cannot for the calling process.
pub fn process_cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let micros = |t: nix::sys::time::TimeVal| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec()).unwrap_or(0)
    };
    Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()))
}

/// The process's resident set size, from /proc (0 where there is none).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4_096)
}

/// The 1-minute load average: other work on the machine shows in latencies, so every
/// figure is printed with it.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|avg| avg.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The `q` quantile (0 to 1, nearest rank) of `sorted`, 0 when it is empty.
pub fn quantile(sorted: &[u32], q: f64) -> u32 {
    let last = sorted.len().saturating_sub(1);
    let index = (last as f64 * q).round() as usize;
    sorted.get(index.min(last)).copied().unwrap_or(0)
}

/// How late renewals go out, for the many-leases benches: when each lease (key
/// `lease-{i}`) last sent an acquire or a renewal, and, while recording, each
/// renewal's lateness against the renew interval. Wrap a service's `acquire` and
/// `renew` with [`acquire_sent`](Self::acquire_sent) and
/// [`renewal_sent`](Self::renewal_sent).
pub struct Lateness {
    origin: std::time::Instant,
    interval_us: u64,
    last_send: Vec<std::sync::atomic::AtomicU64>,
    recording: std::sync::atomic::AtomicBool,
    samples: std::sync::Mutex<Vec<u32>>,
}

impl Lateness {
    /// For `leases` leases renewing every `interval`; room for `samples` figures up
    /// front (a bench allocates before it measures the heap).
    pub fn new(leases: usize, interval: Duration, samples: usize) -> Lateness {
        Lateness {
            origin: std::time::Instant::now(),
            interval_us: interval.as_micros() as u64,
            last_send: (0..leases)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
            recording: std::sync::atomic::AtomicBool::new(false),
            samples: std::sync::Mutex::new(Vec::with_capacity(samples)),
        }
    }

    /// The lease number in key `lease-{i}` (0 for any other key).
    pub fn index(key: &str) -> usize {
        key.strip_prefix("lease-")
            .and_then(|i| i.parse().ok())
            .unwrap_or(0)
    }

    /// Microseconds since the recorder was made.
    pub fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// An acquire of `key` is being sent: returns now.
    pub fn acquire_sent(&self, key: &str) -> u64 {
        let now = self.now_us();
        self.swap(key, now);
        now
    }

    /// A renewal of `key` is being sent: returns now and how late it is (µs past one
    /// interval after the lease's previous send), recorded while recording is on.
    pub fn renewal_sent(&self, key: &str) -> (u64, u32) {
        let now = self.now_us();
        let previous = self.swap(key, now);
        let late =
            u32::try_from(now.saturating_sub(previous + self.interval_us)).unwrap_or(u32::MAX);
        if self.recording.load(std::sync::atomic::Ordering::Relaxed) {
            self.lock().push(late);
        }
        (now, late)
    }

    /// Starts or stops recording lateness.
    pub fn record(&self, on: bool) {
        self.recording
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The lateness recorded so far (µs, in send order), leaving none.
    pub fn take(&self) -> Vec<u32> {
        std::mem::take(&mut *self.lock())
    }

    fn swap(&self, key: &str, now: u64) -> u64 {
        self.last_send.get(Lateness::index(key)).map_or(0, |last| {
            last.swap(now, std::sync::atomic::Ordering::Relaxed)
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
