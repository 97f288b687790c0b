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
