//! Renewals per second at K concurrent leases, through `leasehold-redis` and its two
//! real alternatives, against the same `redis-server` (which this binary starts), in
//! alternating rounds; then failover time (holder crashes → a waiting contender is
//! granted) against its bound, remaining TTL + the longest retry wait (retries are
//! jittered between 0.5 and 1.5 retry intervals).
//!
//! ```text
//! cargo bench -p leasehold-redis --bench renew                       # 5 s x 3 rounds
//! LEASEHOLD_BENCH_SECS=3 LEASEHOLD_BENCH_ROUNDS=9 cargo bench -p leasehold-redis --bench renew
//! LEASEHOLD_BENCH_SMOKE=1 cargo test -p leasehold-redis --bench renew   # ~10 s, errors only
//! ```
//!
//! The peers, each K closed-loop tasks (one renewal outstanding per lease) on ONE
//! shared connection, on one tokio thread (the machine's other core is Redis's):
//! Every peer bounds each request by the same 500 ms ([`TIMEOUT`]): rslock cannot be
//! given another bound than redis-rs's default response timeout, so the others get
//! that one too.
//! - **leasehold**: `LockService::renew` (what the driver calls) on a
//!   `RedisLockService::connect` service: its defaults (a reconnecting connection) but
//!   for the request timeout.
//! - **redis-rs EVALSHA**: the honest floor: a multiplexed redis-rs connection
//!   sending `EVALSHA` of a plain compare-and-`PEXPIRE` script, its command built once
//!   per lease, no typed answer.
//! - **leasehold-mux**: the same on a plain multiplexed connection, without the
//!   reconnecting wrapper `connect` puts around it: what that wrapper costs.
//! - **rslock**: `LockManager::extend` of rslock (Redlock, one server), which
//!   compare-and-`SET`s the value with a new `PX`.
//!
//! Smoke mode (`LEASEHOLD_BENCH_SMOKE=1`): every peer at every K for a fraction of a
//! second and two failover trials; it fails on any error or unexpected answer, never
//! on a ratio (`scripts/bench-smoke.sh`, a stage of `scripts/test.sh`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use common::*;
use leasehold::{Indeterminate, Owner, OwnerToken, RenewOutcome, Term};
use leasehold_driver::LockService;
use leasehold_redis::RedisLockService;
use redis::aio::MultiplexedConnection;

/// Long enough that no lease expires between its turns, however long the rounds.
const TTL_MS: u64 = 86_400_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Leasehold,
    /// leasehold on a plain multiplexed connection (no reconnecting wrapper).
    LeaseholdMux,
    RawEvalsha,
    Rslock,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Leasehold => "leasehold",
            Peer::LeaseholdMux => "leasehold-mux",
            Peer::RawEvalsha => "redis-rs",
            Peer::Rslock => "rslock",
        }
    }
}

const PEERS: [Peer; 4] = [
    Peer::Leasehold,
    Peer::RawEvalsha,
    Peer::Rslock,
    Peer::LeaseholdMux,
];
const LEASES: [usize; 3] = [1, 100, 1_000];

struct Settings {
    secs: f64,
    warmup: StdDuration,
    rounds: usize,
    failover_trials: u64,
    smoke: bool,
    /// `LEASEHOLD_BENCH_PEERS=leasehold,redis-rs,rslock,leasehold-mux` (the default:
    /// all), to profile one.
    peers: Vec<Peer>,
}

impl Settings {
    fn from_env() -> Settings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let smoke = var("LEASEHOLD_BENCH_SMOKE").is_some_and(|v| v != "0");
        let secs = var("LEASEHOLD_BENCH_SECS").map(|v| {
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .unwrap_or_else(|| panic!("LEASEHOLD_BENCH_SECS={v:?}: expected seconds > 0"))
        });
        let rounds = var("LEASEHOLD_BENCH_ROUNDS").map(|v| {
            v.parse::<usize>()
                .ok()
                .filter(|r| *r > 0)
                .unwrap_or_else(|| panic!("LEASEHOLD_BENCH_ROUNDS={v:?}: expected a count > 0"))
        });
        let peers = match var("LEASEHOLD_BENCH_PEERS") {
            None => PEERS.to_vec(),
            Some(list) => list
                .split(',')
                .map(|name| {
                    PEERS
                        .into_iter()
                        .find(|p| p.name() == name.trim())
                        .unwrap_or_else(|| {
                            panic!("LEASEHOLD_BENCH_PEERS: {name:?} is none of leasehold, redis-rs, rslock, leasehold-mux")
                        })
                })
                .collect(),
        };
        if smoke {
            Settings {
                secs: secs.unwrap_or(0.3),
                warmup: StdDuration::from_millis(50),
                rounds: rounds.unwrap_or(1),
                failover_trials: 2,
                smoke,
                peers,
            }
        } else {
            Settings {
                secs: secs.unwrap_or(5.0),
                warmup: StdDuration::from_millis(500),
                rounds: rounds.unwrap_or(3),
                failover_trials: 12,
                smoke,
                peers,
            }
        }
    }
}

/// Every peer's connection and per-lease state, set up once.
struct Peers {
    leasehold: RedisLockService,
    leasehold_mux: RedisLockService<MultiplexedConnection>,
    token: OwnerToken,
    raw: MultiplexedConnection,
    raw_sha: String,
    rslock: rslock::LockManager,
    /// Each lease's rslock `Lock`, lent to its task while it runs.
    rslocks: RefCell<Vec<Option<rslock::Lock>>>,
}

fn leasehold_key(i: usize) -> String {
    format!("lh:{i}")
}

fn mux_key(i: usize) -> String {
    format!("mx:{i}")
}

fn raw_key(i: usize) -> String {
    format!("raw:{i}")
}

/// Every peer's bound on one request: redis-rs's default response timeout, the one
/// rslock's connections have (it offers no other).
const TIMEOUT: StdDuration = StdDuration::from_millis(500);

impl Peers {
    async fn start(server: &RedisServer) -> Peers {
        let url = server.url();
        // Its defaults, but for `max_ttl` (the bench's TTL, a day, is longer) and the
        // request timeout every peer has.
        let leasehold = RedisLockService::connect(&url)
            .await
            .expect("connect leasehold-redis")
            .with_max_ttl(StdDuration::from_millis(TTL_MS))
            .with_request_timeout(TIMEOUT);
        let token = Owner([0x42; 16]).token(Term(1));
        let mut raw = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new().set_response_timeout(Some(TIMEOUT)),
            )
            .await
            .expect("raw connection");
        let raw_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(COMPARE_PEXPIRE)
            .query_async(&mut raw)
            .await
            .expect("SCRIPT LOAD");
        // Its own connection, bounded by leasehold's request timeout alone (one timer
        // per request, as `connect` sets it up).
        let mux = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new().set_response_timeout(None),
            )
            .await
            .expect("leasehold-mux connection");
        let leasehold_mux = RedisLockService::from_connection(mux)
            .await
            .expect("leasehold on a multiplexed connection")
            .with_request_timeout(TIMEOUT)
            .with_max_ttl(StdDuration::from_millis(TTL_MS));
        let rslock = rslock::LockManager::new(vec![url]);
        let max = LEASES.iter().copied().max().unwrap_or(0);
        let mut rslocks = Vec::with_capacity(max);
        for i in 0..max {
            bench_acquire(&leasehold, &leasehold_key(i), token, ms(TTL_MS)).await;
            bench_acquire(&leasehold_mux, &mux_key(i), token, ms(TTL_MS)).await;
            // The raw peer's value: the same bytes as leasehold's (`<token>\n<fence>\n`,
            // empty identity), so both scripts compare equally long strings.
            let set: redis::Value = redis::cmd("SET")
                .arg(raw_key(i))
                .arg(raw_value(token))
                .arg("PX")
                .arg(TTL_MS)
                .query_async(&mut raw)
                .await
                .expect("raw SET");
            assert_eq!(set, redis::Value::Okay);
            let lock = rslock
                .lock(
                    format!("rslock:{i}").as_bytes(),
                    StdDuration::from_millis(TTL_MS),
                )
                .await
                .expect("rslock lock");
            rslocks.push(Some(lock));
        }
        Peers {
            leasehold,
            leasehold_mux,
            token,
            raw,
            raw_sha,
            rslock,
            rslocks: RefCell::new(rslocks),
        }
    }

    /// Renewals per second of `peer` with `n` closed-loop leases, the client's CPU
    /// time per renewal, and how many requests timed out (not counted as renewals).
    async fn rate(&self, peer: Peer, n: usize, settings: &Settings) -> Measured {
        let cpu_before = thread_cpu();
        let start = StdInstant::now();
        let window = Rc::new(Window {
            measure_from: start + settings.warmup,
            end: start + settings.warmup + StdDuration::from_secs_f64(settings.secs),
            count: Cell::new(0),
            all: Cell::new(0),
            timeouts: Cell::new(0),
        });
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let window = window.clone();
            tasks.push(match peer {
                Peer::Leasehold => {
                    spawn_leasehold(self.leasehold.clone(), leasehold_key(i), self.token, window)
                }
                Peer::LeaseholdMux => {
                    spawn_leasehold(self.leasehold_mux.clone(), mux_key(i), self.token, window)
                }
                Peer::RawEvalsha => {
                    let mut conn = self.raw.clone();
                    let mut cmd = redis::cmd("EVALSHA");
                    cmd.arg(&self.raw_sha)
                        .arg(1)
                        .arg(raw_key(i))
                        .arg(raw_value(self.token))
                        .arg(TTL_MS);
                    tokio::task::spawn_local(async move {
                        loop {
                            let more = match cmd.query_async::<i64>(&mut conn).await {
                                Ok(1) => window.counted(),
                                Err(e) if e.is_timeout() => window.timed_out(),
                                other => panic!("raw EVALSHA answered {other:?}"),
                            };
                            if !more {
                                break;
                            }
                        }
                        None
                    })
                }
                Peer::Rslock => {
                    let manager = self.rslock.clone();
                    let mut lock = self.rslocks.borrow_mut()[i].take().expect("lock lent once");
                    tokio::task::spawn_local(async move {
                        let ttl = StdDuration::from_millis(TTL_MS);
                        loop {
                            let more = match manager.extend(&lock, ttl).await {
                                Ok(extended) => {
                                    lock = extended;
                                    window.counted()
                                }
                                // rslock does not say why (a timeout is the one cause
                                // seen here), and it has deleted the key: take it again.
                                Err(rslock::LockError::Unavailable) => {
                                    if let Ok(again) = manager.lock(&lock.resource, ttl).await {
                                        lock = again;
                                    }
                                    window.timed_out()
                                }
                                Err(other) => panic!("rslock extend failed: {other}"),
                            };
                            if !more {
                                break;
                            }
                        }
                        Some(lock)
                    })
                }
            });
        }
        for (i, task) in tasks.into_iter().enumerate() {
            if let Some(lock) = task.await.expect("renewal task") {
                self.rslocks.borrow_mut()[i] = Some(lock);
            }
        }
        let cpu = thread_cpu() - cpu_before;
        Measured {
            rate: window.count.get() as f64 / settings.secs,
            cpu_us: cpu.as_secs_f64() * 1e6 / window.all.get().max(1) as f64,
            timeouts: window.timeouts.get(),
        }
    }
}

/// One leasehold lease renewing `key` in a closed loop until the window closes.
fn spawn_leasehold<C>(
    service: RedisLockService<C>,
    key: String,
    token: OwnerToken,
    window: Rc<Window>,
) -> tokio::task::JoinHandle<Option<rslock::Lock>>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    tokio::task::spawn_local(async move {
        loop {
            let more =
                match LockService::renew(&service, &key, token, BENCH_FENCE, ms(TTL_MS)).await {
                    RenewOutcome::Renewed { .. } => window.counted(),
                    RenewOutcome::Indeterminate(Indeterminate::Timeout) => window.timed_out(),
                    other => panic!("leasehold renew answered {other:?}"),
                };
            if !more {
                break;
            }
        }
        None
    })
}

/// What one peer did in one run.
struct Measured {
    /// Renewals per second in the window.
    rate: f64,
    /// CPU time of the client thread (everything of the client runs on it, the
    /// connection's own tasks too) per renewal, warm-up included, in µs: what a
    /// renewal costs the client, much less disturbed by the machine's other load than
    /// the rate.
    cpu_us: f64,
    timeouts: u64,
}

/// This thread's CPU time so far.
fn thread_cpu() -> StdDuration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .expect("CLOCK_THREAD_CPUTIME_ID is always available on Linux");
    StdDuration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}

/// The measuring window: renewals completed after the warm-up and before the end.
struct Window {
    measure_from: StdInstant,
    end: StdInstant,
    count: Cell<u64>,
    /// Every renewal, warm-up included (for the CPU time per renewal).
    all: Cell<u64>,
    timeouts: Cell<u64>,
}

impl Window {
    /// Counts a renewal just completed; false once the window has closed.
    fn counted(&self) -> bool {
        self.all.set(self.all.get() + 1);
        let now = StdInstant::now();
        if now >= self.end {
            return false;
        }
        if now >= self.measure_from {
            self.count.set(self.count.get() + 1);
        }
        true
    }

    /// Counts a request that timed out (the machine is shared: a stalled process
    /// misses a deadline now and then); false once the window has closed.
    fn timed_out(&self) -> bool {
        self.timeouts.set(self.timeouts.get() + 1);
        StdInstant::now() < self.end
    }
}

/// Per-round ratios `ours[i] / theirs[i]`.
fn ratios(ours: &[f64], theirs: &[f64]) -> Vec<f64> {
    ours.iter().zip(theirs).map(|(a, b)| a / b).collect()
}

/// The median; NaN when the peer was left out (`LEASEHOLD_BENCH_PEERS`).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A table cell: `—` for a peer left out.
fn shown(value: f64, decimals: usize) -> String {
    if value.is_nan() {
        "—".to_owned()
    } else {
        format!("{value:.decimals$}")
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let settings = Settings::from_env();
    let server = RedisServer::start();

    // rates[k][peer][round]. Every round measures every K and every peer, the peers in
    // a different order each round, so a noisy neighbour hits all alike; the table
    // shows medians and the median of the per-round ratios.
    let mut rates = vec![vec![Vec::new(); PEERS.len()]; LEASES.len()];
    let mut cpu = vec![vec![Vec::new(); PEERS.len()]; LEASES.len()];
    let mut timeouts = [0u64; PEERS.len()];
    let failover = run_local(async {
        let peers = Peers::start(&server).await;
        for round in 0..settings.rounds {
            for (k, &n) in LEASES.iter().enumerate() {
                for turn in 0..PEERS.len() {
                    let p = (turn + round) % PEERS.len();
                    if settings.peers.contains(&PEERS[p]) {
                        let measured = peers.rate(PEERS[p], n, &settings).await;
                        rates[k][p].push(measured.rate);
                        cpu[k][p].push(measured.cpu_us);
                        timeouts[p] += measured.timeouts;
                    }
                }
            }
        }
        failover_times(&server, settings.failover_trials).await
    });

    println!();
    if settings.smoke {
        println!("(smoke mode: runs too short to compare; checks only that every peer works)");
    }
    println!(
        "renewals/s, {} round(s) of {} s per peer and K, one shared connection per peer",
        settings.rounds, settings.secs
    );
    println!();
    println!(
        "| K leases | leasehold-redis `renew` | redis-rs EVALSHA compare-PEXPIRE | rslock `extend` \
         | leasehold ÷ redis-rs | leasehold ÷ rslock | ÷ redis-rs per round \
         | leasehold on a plain multiplexed connection ÷ redis-rs |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|---:|");
    for (k, &n) in LEASES.iter().enumerate() {
        let [ours, raw, rsl, mux] = [0, 1, 2, 3].map(|p| &rates[k][p]);
        let (vs_raw, vs_rslock) = (ratios(ours, raw), ratios(ours, rsl));
        let each: Vec<String> = vs_raw.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} |",
            shown(median(ours), 0),
            shown(median(raw), 0),
            shown(median(rsl), 0),
            shown(median(&vs_raw), 2),
            shown(median(&vs_rslock), 2),
            each.join(" "),
            shown(median(&ratios(mux, raw)), 2),
        );
    }

    println!();
    println!(
        "| K leases | client CPU µs / renewal: leasehold-redis | redis-rs EVALSHA | rslock \
         | leasehold ÷ redis-rs | leasehold ÷ rslock | leasehold on a plain multiplexed connection |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (k, &n) in LEASES.iter().enumerate() {
        let [ours, raw, rsl, mux] = [0, 1, 2, 3].map(|p| &cpu[k][p]);
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} |",
            shown(median(ours), 2),
            shown(median(raw), 2),
            shown(median(rsl), 2),
            shown(median(&ratios(ours, raw)), 2),
            shown(median(&ratios(ours, rsl)), 2),
            shown(median(mux), 2),
        );
    }
    println!(
        "\nrequests timed out (not counted): leasehold {}, redis-rs {}, rslock {} \
         (rslock: extends that failed; it then deletes the key, taken again), leasehold-mux {}",
        timeouts[0], timeouts[1], timeouts[2], timeouts[3]
    );
    println!();
    println!(
        "| failover (TTL 300 ms, retry 15 ms), {} trials | min | median | max |",
        failover.len()
    );
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

/// Holder crashes (its task is dropped: no release, as after a process kill) at a
/// random point of its renew cycle; a contender that is already retrying is granted
/// once Redis expires the key. Returns (measured, bound) in ms per trial, where the
/// bound is the TTL Redis still had at the crash plus the longest jittered retry wait,
/// 1.5 retry intervals.
async fn failover_times(server: &RedisServer, trials: u64) -> Vec<(f64, f64)> {
    let service = service(&server.url()).await;
    let mut raw = raw(&server.url()).await;
    let config = config(300);
    let mut out = Vec::new();
    for trial in 0..trials {
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
