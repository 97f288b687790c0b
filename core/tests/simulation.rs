//! Deterministic simulation: several clients contend for one key through a faulty world.
//!
//! A run is a pure function of its seed. Virtual time jumps straight to the next thing
//! that happens (a client's `poll_timeout`, a message arriving, a pause ending, a worker
//! waking), and one seeded PRNG (splitmix64, defined below so it never changes) decides
//! every fault:
//!
//! * **clients**: a [`Lease`] and its own [`WriteGate`] each, same key, distinct owners,
//!   driven exactly as the driving contract says (drain every output after every call),
//!   each on its own monotonic clock (same rate as real time, arbitrary origin);
//! * **stop-the-world pauses** of a client, some longer than the TTL (and the lesson's
//!   400 ms pause of a 600 ms lease), during which neither its driver nor its workers run;
//! * a **lock service** with a *hard* TTL kept on its *own* clock, running fast or slow
//!   against real time within the configured drift bound; a strictly increasing fence;
//!   renew and release compare the owner token (owner + term) — in half the seeds the
//!   renewal compares the fence the client holds as well; external deletions
//!   ("revoked") pushed to the holder; answers that are errors or that shrink the TTL;
//! * a **network** that delays, drops, duplicates and reorders requests and responses;
//! * **workers** that `check` the gate and send a write with its fence to **storage**
//!   behind a [`FenceGate`], sometimes stalling between the check and the write.
//!
//! Invariants are checked after every step; see [`Sim::check_invariants`], and
//! [`Sim::check_pass`] for (a) exactly. Owner-compare alone cannot tell two grants of
//! one term apart; the timelines `owner_compare_alone_…` and `comparing_the_fence_…`
//! show what that allows and how comparing the fence cures it. A failing
//! seed is replayed with a trace and printed. Replay one seed:
//!
//! ```text
//! LEASEHOLD_SIM_SEED=<n> cargo test -p leasehold --test simulation random_seeds -- --nocapture
//! ```
//!
//! Run more seeds (the default is 10,000): `LEASEHOLD_SIM_SEEDS=1000000`.
//! Longer traces: `LEASEHOLD_SIM_TRACE=<lines>`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use leasehold::{
    AcquireOutcome, Action, Config, Duration, Event, Fence, FenceGate, GateError, GateStatus,
    Indeterminate, Instant, Lease, LossReason, Owner, OwnerToken, ReleaseOutcome, RenewOutcome,
    RequestId, StaleFence, State, Term, WriteGate,
};

// =====================================================================================
// Timelines
// =====================================================================================

/// `n` milliseconds.
const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` microseconds.
const fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// The moment `d` after the simulation starts, in real time. A client whose clock
/// origin is zero (every client of a scripted run) reads the same instant.
const fn at(d: Duration) -> Instant {
    Instant::ZERO.saturating_add(d)
}

/// Scaling a span: `t.times(3)`, `t.over(10)`.
trait Scale {
    fn times(self, n: u64) -> Duration;
    fn over(self, n: u64) -> Duration;
}

impl Scale for Duration {
    fn times(self, n: u64) -> Duration {
        self.saturating_mul(n)
    }
    fn over(self, n: u64) -> Duration {
        self.checked_div(n).unwrap()
    }
}

/// A client, by index.
type Who = usize;
const A: Who = 0;
const B: Who = 1;

fn name(who: Who) -> char {
    char::from(b'A'.wrapping_add(who as u8))
}

/// The lesson's lease: T = 600 ms, renewed every T/3 = 200 ms, default margins.
fn lesson() -> Config {
    Config::builder(ms(600)).build().unwrap()
}

// =====================================================================================
// A tiny seeded PRNG (splitmix64): deterministic forever, whatever crates do.
// =====================================================================================

#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6c65_6173_6568_6f6c) // "leasehol"
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `ppm` / 1,000,000.
    fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.below(1_000_000) < u64::from(ppm)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Uniform in `lo..=hi`.
    fn duration(&mut self, (lo, hi): (Duration, Duration)) -> Duration {
        us(self.between(lo.as_micros(), hi.as_micros()))
    }
}

// =====================================================================================
// Scenario: what a run is made of
// =====================================================================================

/// How messages travel.
#[derive(Clone, Copy, Debug)]
struct Net {
    /// One-way delay, uniform in this range. Independent per message, so they reorder.
    delay: (Duration, Duration),
    /// Chance (ppm) that a message arrives in the same microsecond (loopback): where a
    /// rounding error in the deadline arithmetic would show.
    instant_ppm: u32,
    /// Chance (ppm) that a message is instead delayed by anything up to `long`.
    long_ppm: u32,
    long: Duration,
    drop_ppm: u32,
    dup_ppm: u32,
}

impl Net {
    const fn calm(delay: (Duration, Duration)) -> Net {
        Net {
            delay,
            instant_ppm: 0,
            long_ppm: 0,
            long: Duration::ZERO,
            drop_ppm: 0,
            dup_ppm: 0,
        }
    }
}

/// The TTL the service applies, given the one asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TtlPolicy {
    AsAsked,
    /// Always `asked * num / den` (etcd grants its own TTL).
    Scaled {
        num: u64,
        den: u64,
    },
    /// While faults are on, anything from zero to twice the ask, answer by answer.
    Erratic,
}

impl TtlPolicy {
    /// The TTL granted once the world is calm.
    fn steady(self, asked: Duration) -> Duration {
        match self {
            TtlPolicy::Scaled { num, den } => us(asked.as_micros() * num / den),
            TtlPolicy::AsAsked | TtlPolicy::Erratic => asked,
        }
    }
}

/// What the service does with an acquire from the token that already holds the key
/// (a retried acquire whose first answer was lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reacquire {
    /// "Held by another" (Redis `SET NX`, an etcd create-revision txn).
    Refuse,
    /// Grants again: same fence, TTL extended.
    Regrant,
}

/// What a renewal must match at the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compare {
    /// The owner token only (owner + term). The `LockService` contract forbids this
    /// now; it stays as a model to show why (`owner_compare_alone_…`).
    Owner,
    /// The owner token and the fence of the grant (`Action::Renew { fence, .. }`): what
    /// every service does.
    OwnerAndFence,
}

/// What each client's worker does.
#[derive(Clone, Copy, Debug)]
struct Workers {
    /// Time between writes.
    wake: (Duration, Duration),
    /// Time from a passed `check` to the write reaching storage.
    write_delay: (Duration, Duration),
    /// Chance (ppm) that the worker stalls between `check` and the write instead…
    stall_ppm: u32,
    /// …for this long (GC, SIGSTOP of the thread, a preempting interrupt storm).
    stall: (Duration, Duration),
}

/// The randomised faults of a seeded run, and what must hold once they stop.
#[derive(Clone, Debug)]
struct Faults {
    /// Faults stop at this moment; from then on somebody must end up holding the lock.
    until: Instant,
    /// `(client, start, length)` of stop-the-world pauses.
    pauses: Vec<(Who, Instant, Duration)>,
    /// Moments the key is deleted behind the holder's back.
    revocations: Vec<Instant>,
    /// Chance (ppm), per revocation, of also pushing a notice about an old fence.
    bogus_notice_ppm: u32,
    /// Chance (ppm) that the service answers an error (having done the work, or not).
    service_error_ppm: u32,
    /// Chance (ppm) that a fresh holder releases the lease some time later.
    release_ppm: u32,
    /// After `until`, somebody must hold the lock steadily within this long.
    liveness_within: Duration,
}

#[derive(Clone, Debug)]
struct Scenario {
    config: Config,
    clients: usize,
    /// The service clock runs at `1 + d` times real time, `d` in ppm.
    service_drift_ppm: i64,
    service_origin: u64,
    /// Each client's monotonic clock reads `real + origin`.
    client_origins: Vec<Duration>,
    first_fence: u64,
    /// Fences grow by 1 up to this much per grant (etcd revisions jump).
    fence_step: u64,
    ttl_policy: TtlPolicy,
    reacquire: Reacquire,
    renew_compare: Compare,
    /// The network while faults are on.
    net: Net,
    /// The network once they stop (and of scripted runs).
    calm_net: Net,
    workers: Option<Workers>,
    /// A client whose term ended acquires again within this long (faults on), or a
    /// tenth of it (faults off); `None`: only when the script says so.
    reacquire_within: Option<Duration>,
    faults: Option<Faults>,
}

impl Scenario {
    /// No faults, a fixed 5 ms each way, service clock at real rate, every clock at zero.
    fn calm(config: Config, clients: usize) -> Scenario {
        Scenario {
            config,
            clients,
            service_drift_ppm: 0,
            service_origin: 0,
            client_origins: vec![Duration::ZERO; clients],
            first_fence: 1,
            fence_step: 1,
            ttl_policy: TtlPolicy::AsAsked,
            reacquire: Reacquire::Refuse,
            renew_compare: Compare::OwnerAndFence,
            net: Net::calm((ms(5), ms(5))),
            calm_net: Net::calm((ms(5), ms(5))),
            workers: None,
            reacquire_within: None,
            faults: None,
        }
    }

    /// Everything drawn from the seed.
    fn random(rng: &mut Rng) -> Scenario {
        let config = random_config(rng);
        let t = config.ttl();
        let part = |n: u64, d: u64| us(t.as_micros() * n / d);
        let timeout = config.request_timeout();
        let clients = rng.pick(&[2, 2, 3, 3, 4]);
        let drift = i64::from(config.drift_ppm());
        // The bound itself is where a rounding bug would show: pick it half the time.
        let service_drift_ppm = match rng.below(4) {
            0 => drift,
            1 => -drift,
            2 => 0,
            _ => rng.below(2 * drift as u64 + 1) as i64 - drift,
        };
        let mut ttl_policy = rng.pick(&[
            TtlPolicy::AsAsked,
            TtlPolicy::AsAsked,
            TtlPolicy::AsAsked,
            TtlPolicy::Erratic,
            TtlPolicy::Scaled { num: 3, den: 4 },
            TtlPolicy::Scaled { num: 2, den: 1 },
        ]);
        // Once calm, a renewal's round trip must fit between the renew time and the
        // safe deadline, or a lone holder could not keep the lease at all.
        let slack = |policy: TtlPolicy| {
            config
                .safe_deadline(Instant::ZERO, policy.steady(t))
                .map_or(0, |d| d.as_micros())
                .saturating_sub(config.renew_interval().as_micros())
        };
        if slack(ttl_policy) < 4 {
            ttl_policy = TtlPolicy::AsAsked;
        }
        let calm_max = us((timeout.as_micros() / 4).min(slack(ttl_policy) / 4));
        let instant_ppm = rng.pick(&[0, 0, 300_000]);
        let net = Net {
            delay: (
                Duration::ZERO,
                rng.pick(&[part(1, 100), timeout.over(2), timeout.times(2)]),
            ),
            instant_ppm,
            long_ppm: rng.pick(&[0, 5_000, 30_000]),
            long: part(2, 1),
            drop_ppm: rng.pick(&[0, 10_000, 50_000, 200_000]),
            dup_ppm: rng.pick(&[0, 20_000, 100_000]),
        };
        let until = at(part(rng.between(4, 10), 1));
        let mut pauses = Vec::new();
        for who in 0..clients {
            for _ in 0..rng.below(4) {
                let start = at(rng.duration((Duration::ZERO, until - Instant::ZERO)));
                let len = match rng.below(5) {
                    0 => rng.duration((us(1), part(1, 3))),
                    1 => part(2, 3), // the lesson's 400 ms pause of a 600 ms lease
                    2 => t,
                    _ => rng.duration((t, part(3, 1))),
                };
                pauses.push((who, start, len));
            }
        }
        let revocations = if rng.chance(333_333) {
            (0..rng.between(1, 2))
                .map(|_| at(rng.duration((Duration::ZERO, until - Instant::ZERO))))
                .collect()
        } else {
            Vec::new()
        };
        let workers = Workers {
            wake: (part(1, 50), part(1, 5)),
            write_delay: (Duration::ZERO, part(1, 20)),
            stall_ppm: rng.pick(&[0, 20_000, 100_000]),
            stall: (part(1, 2), part(3, 1)),
        };
        let faults = Faults {
            until,
            pauses,
            revocations,
            bogus_notice_ppm: 500_000,
            service_error_ppm: rng.pick(&[0, 0, 20_000, 100_000]),
            release_ppm: rng.pick(&[0, 0, 200_000]),
            // Pauses end (≤ 3T), late messages land (≤ 2T), zombie grants of up to 2T
            // on a clock up to 20 % slow expire, and then the lock must stay put for 3T.
            liveness_within: part(16, 1),
        };
        Scenario {
            config,
            clients,
            service_drift_ppm,
            service_origin: rng.below(1 << 50),
            client_origins: (0..clients)
                .map(|who| {
                    if who == 0 {
                        Duration::ZERO
                    } else {
                        us(rng.below(1 << 40))
                    }
                })
                .collect(),
            first_fence: rng.between(1, 1_000_000),
            fence_step: rng.pick(&[1, 1, 5]),
            ttl_policy,
            reacquire: rng.pick(&[Reacquire::Refuse, Reacquire::Regrant]),
            renew_compare: Compare::OwnerAndFence,
            net,
            calm_net: Net {
                instant_ppm,
                ..Net::calm((Duration::ZERO, calm_max))
            },
            workers: Some(workers),
            reacquire_within: Some(t),
            faults: Some(faults),
        }
    }

    fn one_way(mut self, lo: Duration, hi: Duration) -> Scenario {
        self.net.delay = (lo, hi);
        self.calm_net.delay = (lo, hi);
        self
    }

    fn renew_compare(mut self, compare: Compare) -> Scenario {
        self.renew_compare = compare;
        self
    }

    fn service_drift_ppm(mut self, ppm: i64) -> Scenario {
        self.service_drift_ppm = ppm;
        self
    }

    /// Every client has a worker writing every `every`, each write landing 1 ms later.
    fn workers_every(mut self, every: Duration) -> Scenario {
        self.workers = Some(Workers {
            wake: (every, every),
            write_delay: (ms(1), ms(1)),
            stall_ppm: 0,
            stall: (Duration::ZERO, Duration::ZERO),
        });
        self
    }
}

/// The lesson's configuration and its variants half the time; anything valid otherwise.
fn random_config(rng: &mut Rng) -> Config {
    let lesson = Config::builder(ms(600));
    let preset = match rng.below(8) {
        0 | 1 => Some(lesson),
        2 => Some(lesson.fail_closed(true)),
        // No margin at all: only the drift allowance (rounded up) and the send-time
        // rule keep it safe. An odd TTL makes the drift share a fraction of a µs.
        3 => Some(
            Config::builder(us(rng.between(100_000, 2_000_000)))
                .margin(Duration::ZERO)
                .drift_ppm(rng.pick(&[1, 7, 1_000, 20_000])),
        ),
        _ => None,
    };
    if let Some(Ok(config)) = preset.map(|b| b.build()) {
        return config;
    }
    loop {
        let t = rng.between(20_000, 10_000_000);
        let part = |rng: &mut Rng, lo: u64, hi: u64| us(t * rng.between(lo, hi) / 100);
        let margin = match rng.below(3) {
            0 => Duration::ZERO,
            1 => us(t / 20),
            _ => part(rng, 0, 10),
        };
        let builder = Config::builder(us(t))
            .renew_interval(part(rng, 15, 45))
            .request_timeout(part(rng, 3, 20))
            .retry_interval(part(rng, 2, 20))
            .margin(margin)
            .drift_ppm(match rng.below(4) {
                0 => 0,
                1 => 1_000,
                2 => 20_000,
                _ => rng.below(200_000) as u32,
            })
            .fail_closed(rng.chance(250_000));
        if let Ok(config) = builder.build() {
            return config;
        }
    }
}

// =====================================================================================
// The lock service: hard TTL on its own clock
// =====================================================================================

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Acquire,
    Renew,
    Release,
}

#[derive(Clone, Copy, Debug)]
struct Request {
    id: RequestId,
    term: Term,
    kind: Kind,
    ttl: Duration,
    /// The fence the client holds when it sends this (zero if none).
    fence: Fence,
}

#[derive(Clone, Copy, Debug)]
enum Response {
    Acquire(RequestId, AcquireOutcome),
    Renew(RequestId, RenewOutcome),
    Release(RequestId, ReleaseOutcome),
    /// Pushed by the service: the grant with this fence is gone.
    Revoked(Fence),
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} #{} term {}", self.kind, self.id.0, self.term.0)?;
        if self.kind != Kind::Release {
            write!(f, " ttl {}", self.ttl)?;
        }
        if self.kind == Kind::Renew {
            write!(f, " holding {}", self.fence)?;
        }
        Ok(())
    }
}

impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Response::Acquire(id, AcquireOutcome::Granted { fence, ttl }) => {
                write!(f, "Acquire #{}: Granted {fence} ttl {ttl}", id.0)
            }
            Response::Acquire(id, o) => write!(f, "Acquire #{}: {o:?}", id.0),
            Response::Renew(id, RenewOutcome::Renewed { ttl }) => {
                write!(f, "Renew #{}: Renewed ttl {ttl}", id.0)
            }
            Response::Renew(id, o) => write!(f, "Renew #{}: {o:?}", id.0),
            Response::Release(id, o) => write!(f, "Release #{}: {o:?}", id.0),
            Response::Revoked(fence) => write!(f, "Revoked {fence}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Released,
    Revoked,
}

/// One grant: from an acquire to its hard expiry (or deletion).
#[derive(Clone, Copy, Debug)]
struct Grant {
    fence: Fence,
    token: OwnerToken,
    who: Who,
    /// Hard expiry on the service's clock; renewals move it, never backwards.
    expiry: u64,
    ended: Option<Ended>,
}

struct Service {
    origin: u64,
    /// Service microseconds per million real microseconds.
    rate: u64,
    next_fence: u64,
    fence_step: u64,
    ttl_policy: TtlPolicy,
    reacquire: Reacquire,
    renew_compare: Compare,
    /// Every grant ever made, in fence order.
    grants: Vec<Grant>,
    /// Index of the grant holding the key, unless its hard TTL passed since.
    holder: Option<usize>,
}

impl Service {
    fn new(scn: &Scenario) -> Service {
        Service {
            origin: scn.service_origin,
            rate: (1_000_000 + scn.service_drift_ppm) as u64,
            next_fence: scn.first_fence,
            fence_step: scn.fence_step,
            ttl_policy: scn.ttl_policy,
            reacquire: scn.reacquire,
            renew_compare: scn.renew_compare,
            grants: Vec::new(),
            holder: None,
        }
    }

    /// The service's own clock at real time `real`.
    fn clock(&self, real: Instant) -> u64 {
        self.origin + (u128::from(real.as_micros()) * u128::from(self.rate) / 1_000_000) as u64
    }

    /// The first real instant at which the service's clock reads `service` or later:
    /// exactly, so `real < real_of(e)` if and only if `clock(real) < e`.
    fn real_of(&self, service: u64) -> Instant {
        let since = u128::from(service.saturating_sub(self.origin));
        Instant::from_micros((since * 1_000_000).div_ceil(u128::from(self.rate)) as u64)
    }

    fn grant(&self, fence: Fence) -> Option<&Grant> {
        let i = self.grants.binary_search_by_key(&fence, |g| g.fence).ok()?;
        Some(&self.grants[i])
    }

    /// Until when (real time) the service's hard TTL covers some grant to `token` that
    /// was not released: the latest expiry among them.
    fn token_cover(&self, token: OwnerToken) -> Option<Instant> {
        (self.grants.iter())
            .filter(|g| g.token == token && g.ended != Some(Ended::Released))
            .map(|g| self.real_of(g.expiry))
            .max()
    }

    /// The grant holding the key at `now`: the hard TTL is applied here.
    fn live_holder(&self, now: Instant) -> Option<usize> {
        let h = self.holder?;
        (self.clock(now) < self.grants[h].expiry).then_some(h)
    }

    fn granted_ttl(&self, asked: Duration, faulty: bool, rng: &mut Rng) -> Duration {
        let scale = |num: u64, den: u64| us(asked.as_micros() * num / den);
        match self.ttl_policy {
            TtlPolicy::Erratic if faulty => rng.pick(&[
                asked,
                asked,
                scale(3, 4),
                scale(1, 4),
                scale(2, 1),
                Duration::ZERO,
            ]),
            policy => policy.steady(asked),
        }
    }

    /// Applies `req` from `owner` at real time `now`; the answer to send back.
    fn handle(
        &mut self,
        now: Instant,
        who: Who,
        owner: Owner,
        req: Request,
        faulty: bool,
        rng: &mut Rng,
    ) -> (Response, bool) {
        let now_s = self.clock(now);
        self.holder = self.live_holder(now);
        let token = owner.token(req.term);
        let ttl = self.granted_ttl(req.ttl, faulty, rng);
        // The service never shortens a lease it granted: no client could be safe then.
        let extend = |g: &mut Grant| g.expiry = g.expiry.max(now_s + ttl.as_micros());
        let mut regranted = false;
        let answer = match req.kind {
            Kind::Acquire => match self.holder {
                None => {
                    let fence = Fence(self.next_fence);
                    if let Some(last) = self.grants.last() {
                        assert!(fence > last.fence, "service fences must strictly increase");
                    }
                    self.next_fence += rng.between(1, self.fence_step);
                    self.grants.push(Grant {
                        fence,
                        token,
                        who,
                        expiry: now_s + ttl.as_micros(),
                        ended: None,
                    });
                    self.holder = Some(self.grants.len() - 1);
                    Response::Acquire(req.id, AcquireOutcome::Granted { fence, ttl })
                }
                Some(h)
                    if self.grants[h].token == token && self.reacquire == Reacquire::Regrant =>
                {
                    extend(&mut self.grants[h]);
                    regranted = true;
                    let fence = self.grants[h].fence;
                    Response::Acquire(req.id, AcquireOutcome::Granted { fence, ttl })
                }
                Some(_) => Response::Acquire(req.id, AcquireOutcome::HeldByAnother),
            },
            Kind::Renew => match self.holder {
                Some(h)
                    if self.grants[h].token == token
                        && (self.renew_compare == Compare::Owner
                            || self.grants[h].fence == req.fence) =>
                {
                    extend(&mut self.grants[h]);
                    Response::Renew(req.id, RenewOutcome::Renewed { ttl })
                }
                _ => Response::Renew(req.id, RenewOutcome::NotOwner),
            },
            Kind::Release => match self.holder {
                Some(h) if self.grants[h].token == token => {
                    self.grants[h].ended = Some(Ended::Released);
                    self.holder = None;
                    Response::Release(req.id, ReleaseOutcome::Released)
                }
                _ => Response::Release(req.id, ReleaseOutcome::NotOwner),
            },
        };
        (answer, regranted)
    }

    /// Deletes the key behind its holder's back; who held it, with which fence.
    fn revoke(&mut self, now: Instant) -> Option<(Who, Fence)> {
        let h = self.live_holder(now)?;
        self.holder = None;
        self.grants[h].ended = Some(Ended::Revoked);
        Some((self.grants[h].who, self.grants[h].fence))
    }
}

// =====================================================================================
// The world
// =====================================================================================

#[derive(Clone, Copy, Debug)]
enum Happening {
    ToService {
        from: Who,
        req: Request,
    },
    ToClient {
        to: Who,
        resp: Response,
    },
    PauseStart {
        who: Who,
        len: Duration,
        scripted: bool,
    },
    PauseEnd {
        who: Who,
    },
    WorkerWake {
        who: Who,
    },
    /// A scripted worker: `check` now, and if it passes, the write lands `delay` later.
    Write {
        who: Who,
        delay: Duration,
    },
    WriteLands {
        who: Who,
        fence: Fence,
        term: Term,
        checked: Instant,
        /// The periodic worker goes on after this write.
        worker: bool,
    },
    Acquire {
        who: Who,
    },
    Release {
        who: Who,
        scripted: bool,
    },
    Revoke {
        scripted: bool,
    },
    FaultsStop,
    LivenessDeadline,
}

impl fmt::Display for Happening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Happening::ToService { from, req } => write!(f, "{} -> service: {req}", name(*from)),
            Happening::ToClient { to, resp } => write!(f, "service -> {}: {resp}", name(*to)),
            other => write!(f, "{other:?}"),
        }
    }
}

impl Happening {
    /// What a client does itself, and so cannot do while it is paused.
    fn runs_on_client(&self) -> Option<Who> {
        match *self {
            Happening::WorkerWake { who }
            | Happening::Write { who, .. }
            | Happening::Acquire { who }
            | Happening::Release { who, .. } => Some(who),
            _ => None,
        }
    }
}

struct Pending {
    at: Instant,
    seq: u64,
    what: Happening,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct Client {
    owner: Owner,
    /// This client's clock reads `real + origin`.
    origin: Duration,
    lease: Lease,
    gate: WriteGate,
    /// Stopped (stop-the-world) until then.
    paused_until: Option<Instant>,
    /// Responses that arrived while paused, in arrival order.
    inbox: Vec<Response>,
    /// Its own doings that fell into a pause.
    deferred: Vec<Happening>,
    // ----- what the invariants remember about the current term -----
    seen_term: Term,
    last_deadline: Option<Instant>,
    last_gate_deadline: Option<Instant>,
    /// The state that closed the term (Lost, Releasing, Released), if it is closed.
    closed: Option<State>,
}

/// Who checked the gate, for scripted assertions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum By {
    Worker,
    Script,
    /// A worker running the moment a pause ends, before the driver has run.
    Waking,
}

#[derive(Clone, Copy, Debug)]
struct Checked {
    who: Who,
    by: By,
    at: Instant,
    result: Result<Fence, GateError>,
}

#[derive(Clone, Copy, Debug)]
struct Landed {
    who: Who,
    at: Instant,
    fence: Fence,
    result: Result<(), StaleFence>,
}

/// What happened across a run (or many): to show the faults were really exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    seeds: u64,
    steps: u64,
    checks_passed: u64,
    checks_refused_deadline: u64,
    woke_refused_deadline: u64,
    writes_admitted: u64,
    writes_rejected_stale: u64,
    worker_stalls: u64,
    acquired: u64,
    renewed: u64,
    renew_failed: u64,
    late_success: u64,
    lost_expired: u64,
    lost_not_owner: u64,
    lost_revoked: u64,
    lost_shortened: u64,
    released: u64,
    stale_responses: u64,
    pauses: u64,
    pauses_over_ttl: u64,
    dropped: u64,
    duplicated: u64,
    service_errors: u64,
    regrants: u64,
    revocations: u64,
    liveness_ok: u64,
    /// Checks that passed after their own grant's hard TTL, covered only by a newer
    /// grant to the same owner token (owner-compare renewals; see the timelines).
    stale_fence_holds: u64,
    /// Runs whose steady holder, once faults stopped, held a fence older than one
    /// storage had admitted: a holder that can never write.
    stuck_holders: u64,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        let Tally {
            seeds,
            steps,
            checks_passed,
            checks_refused_deadline,
            woke_refused_deadline,
            writes_admitted,
            writes_rejected_stale,
            worker_stalls,
            acquired,
            renewed,
            renew_failed,
            late_success,
            lost_expired,
            lost_not_owner,
            lost_revoked,
            lost_shortened,
            released,
            stale_responses,
            pauses,
            pauses_over_ttl,
            dropped,
            duplicated,
            service_errors,
            regrants,
            revocations,
            liveness_ok,
            stale_fence_holds,
            stuck_holders,
        } = *o;
        self.seeds += seeds;
        self.steps += steps;
        self.checks_passed += checks_passed;
        self.checks_refused_deadline += checks_refused_deadline;
        self.woke_refused_deadline += woke_refused_deadline;
        self.writes_admitted += writes_admitted;
        self.writes_rejected_stale += writes_rejected_stale;
        self.worker_stalls += worker_stalls;
        self.acquired += acquired;
        self.renewed += renewed;
        self.renew_failed += renew_failed;
        self.late_success += late_success;
        self.lost_expired += lost_expired;
        self.lost_not_owner += lost_not_owner;
        self.lost_revoked += lost_revoked;
        self.lost_shortened += lost_shortened;
        self.released += released;
        self.stale_responses += stale_responses;
        self.pauses += pauses;
        self.pauses_over_ttl += pauses_over_ttl;
        self.dropped += dropped;
        self.duplicated += duplicated;
        self.service_errors += service_errors;
        self.regrants += regrants;
        self.revocations += revocations;
        self.liveness_ok += liveness_ok;
        self.stale_fence_holds += stale_fence_holds;
        self.stuck_holders += stuck_holders;
    }
}

/// After faults stop: who has held the lock, with which fence, since when.
struct Quiet {
    holder: Option<(Who, Fence, Instant)>,
}

struct Sim {
    scn: Scenario,
    seed: Option<u64>,
    rng: Rng,
    now: Instant,
    seq: u64,
    queue: BinaryHeap<Reverse<Pending>>,
    clients: Vec<Client>,
    service: Service,
    storage: FenceGate,
    /// The newest fence storage admitted, as the simulation saw it.
    newest_admitted: Option<Fence>,
    faults_on: bool,
    /// `(client, from, until)`: every message to or from it is lost.
    partitions: Vec<(Who, Instant, Instant)>,
    quiet: Option<Quiet>,
    done: bool,
    /// `(when, who, how often)`: timers fired at one instant, to catch a busy loop.
    timer_burst: (Instant, Who, u32),
    tally: Tally,
    /// Scripted runs keep everything for assertions.
    record: bool,
    events: Vec<(Who, Instant, Event)>,
    sent: Vec<(Who, Request)>,
    checks: Vec<Checked>,
    landed: Vec<Landed>,
    trace: Option<VecDeque<String>>,
    trace_lines: usize,
}

impl Sim {
    fn new(scn: Scenario, mut rng: Rng, seed: Option<u64>, trace: bool) -> Sim {
        let clients = (0..scn.clients)
            .map(|who| {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&rng.next().to_le_bytes());
                id[15] = who as u8; // distinct owners
                Client {
                    owner: Owner(id),
                    origin: scn.client_origins[who],
                    lease: Lease::new(scn.config),
                    gate: WriteGate::new(),
                    paused_until: None,
                    inbox: Vec::new(),
                    deferred: Vec::new(),
                    seen_term: Term(0),
                    last_deadline: None,
                    last_gate_deadline: None,
                    closed: None,
                }
            })
            .collect();
        let trace_lines = std::env::var("LEASEHOLD_SIM_TRACE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60);
        Sim {
            service: Service::new(&scn),
            faults_on: scn.faults.is_some(),
            record: scn.faults.is_none(),
            scn,
            seed,
            rng,
            now: Instant::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            clients,
            storage: FenceGate::new(),
            newest_admitted: None,
            partitions: Vec::new(),
            quiet: None,
            done: false,
            timer_burst: (Instant::ZERO, 0, 0),
            tally: Tally::default(),
            events: Vec::new(),
            sent: Vec::new(),
            checks: Vec::new(),
            landed: Vec::new(),
            trace: trace.then(VecDeque::new),
            trace_lines,
        }
    }

    /// A scripted world: calm unless the script says otherwise. Always traced.
    fn scripted(scn: Scenario) -> Sim {
        Sim::new(scn, Rng::new(0), None, true)
    }

    /// The seeded world: everyone acquires, workers write, faults are scheduled.
    fn seeded(seed: u64, trace: bool) -> Sim {
        let mut rng = Rng::new(seed);
        let scn = Scenario::random(&mut rng);
        let mut sim = Sim::new(scn, rng, Some(seed), trace);
        let t = sim.scn.config.ttl();
        let faults = sim.scn.faults.clone().unwrap();
        for who in 0..sim.clients.len() {
            let when = at(sim.rng.duration((Duration::ZERO, t.over(2))));
            sim.schedule(when, Happening::Acquire { who });
        }
        sim.start_workers(Instant::ZERO);
        for &(who, when, len) in &faults.pauses {
            sim.schedule(
                when,
                Happening::PauseStart {
                    who,
                    len,
                    scripted: false,
                },
            );
        }
        for &when in &faults.revocations {
            sim.schedule(when, Happening::Revoke { scripted: false });
        }
        sim.schedule(faults.until, Happening::FaultsStop);
        if sim.tracing() {
            let scenario = format!("scenario {:#?}", sim.scn);
            sim.note(|| scenario);
        }
        sim
    }

    // ----- scripting -----

    #[track_caller]
    fn at_or_after_now(&self, when: Instant) {
        assert!(
            when >= self.now,
            "cannot schedule at {when}: it is already {}",
            self.now
        );
    }

    #[track_caller]
    fn acquire(&mut self, who: Who, when: Instant) {
        self.at_or_after_now(when);
        self.schedule(when, Happening::Acquire { who });
    }

    #[track_caller]
    fn release(&mut self, who: Who, when: Instant) {
        self.at_or_after_now(when);
        self.schedule(
            when,
            Happening::Release {
                who,
                scripted: true,
            },
        );
    }

    /// Stops the whole client (driver and workers) for `len`.
    #[track_caller]
    fn pause(&mut self, who: Who, when: Instant, len: Duration) {
        self.at_or_after_now(when);
        self.schedule(
            when,
            Happening::PauseStart {
                who,
                len,
                scripted: true,
            },
        );
    }

    /// A worker of `who` checks the gate at `when`; if it passes, its write reaches
    /// storage `lands_after` later (a long one is a pause between check and write).
    #[track_caller]
    fn write(&mut self, who: Who, when: Instant, lands_after: Duration) {
        self.at_or_after_now(when);
        self.schedule(
            when,
            Happening::Write {
                who,
                delay: lands_after,
            },
        );
    }

    /// Every message to or from `who` sent in `[from, until)` is lost.
    #[track_caller]
    fn partition(&mut self, who: Who, from: Instant, until: Instant) {
        self.at_or_after_now(from);
        self.partitions.push((who, from, until));
    }

    /// A copy of request `id` that `who` sent earlier reaches the service at `when`
    /// (a duplicate the network held back).
    #[track_caller]
    fn deliver_again(&mut self, who: Who, id: u64, when: Instant) {
        self.at_or_after_now(when);
        let sent = self
            .sent
            .iter()
            .find(|(w, r)| *w == who && r.id == RequestId(id));
        let &(_, req) = sent.expect("no such request was sent");
        self.schedule(when, Happening::ToService { from: who, req });
    }

    /// The key is deleted behind its holder's back at `when`; the holder is told.
    #[track_caller]
    fn revoke(&mut self, when: Instant) {
        self.at_or_after_now(when);
        self.schedule(when, Happening::Revoke { scripted: true });
    }

    fn start_workers(&mut self, from: Instant) {
        let Some(w) = self.scn.workers else { return };
        for who in 0..self.clients.len() {
            let when = from + self.rng.duration(w.wake);
            self.schedule(when, Happening::WorkerWake { who });
        }
    }

    /// Runs everything due up to and including `until`, then sets the clock to it.
    #[track_caller]
    fn run_until(&mut self, until: Instant) {
        self.at_or_after_now(until);
        while self.step(until) {}
        self.now = until;
        self.check_invariants();
    }

    /// Runs a seeded world until the liveness check is satisfied.
    fn run_to_the_end(&mut self) {
        while !self.done {
            assert!(self.step(Instant::MAX), "nothing left to happen");
        }
        self.tally.seeds = 1;
        self.tally.liveness_ok = 1;
        for c in &self.clients {
            self.tally.stale_responses += u64::from(c.lease.stats().stale_responses);
        }
    }

    // ----- observations for scripted tests -----

    /// What a worker of `who` that runs right now (e.g. on another core, while the
    /// client is paused) sees. The invariants apply to it.
    fn check(&mut self, who: Who) -> Result<Fence, GateError> {
        let result = self.clients[who].gate.check(self.local(who));
        if let Ok(fence) = result {
            let stale = self.check_pass(who, fence, "a scripted check");
            self.tally.stale_fence_holds += u64::from(stale);
        }
        result
    }

    fn state(&self, who: Who) -> State {
        self.clients[who].lease.state()
    }

    fn events_of(&self, who: Who) -> Vec<Event> {
        self.events
            .iter()
            .filter(|e| e.0 == who)
            .map(|e| e.2)
            .collect()
    }

    /// The check a worker made the moment `who` last woke from a pause.
    fn wake_check(&self, who: Who) -> Option<Result<Fence, GateError>> {
        self.checks
            .iter()
            .rev()
            .find(|c| c.who == who && c.by == By::Waking)
            .map(|c| c.result)
    }

    fn scripted_checks(&self, who: Who) -> Vec<(Instant, Result<Fence, GateError>)> {
        self.checks
            .iter()
            .filter(|c| c.who == who && c.by == By::Script)
            .map(|c| (c.at, c.result))
            .collect()
    }

    fn landed_from(&self, who: Who) -> Vec<(Instant, Fence, Result<(), StaleFence>)> {
        self.landed
            .iter()
            .filter(|l| l.who == who)
            .map(|l| (l.at, l.fence, l.result))
            .collect()
    }

    // ----- the engine -----

    fn local(&self, who: Who) -> Instant {
        self.now + self.clients[who].origin
    }

    fn is_paused(&self, who: Who) -> bool {
        self.clients[who].paused_until.is_some()
    }

    fn schedule(&mut self, at: Instant, what: Happening) {
        self.seq += 1;
        self.queue.push(Reverse(Pending {
            at,
            seq: self.seq,
            what,
        }));
    }

    fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        let now = self.now;
        let cap = self.trace_lines;
        if let Some(trace) = &mut self.trace {
            if trace.len() == cap {
                trace.pop_front();
            }
            trace.push_back(format!("{:>16}  {}", now.to_string(), line()));
        }
    }

    /// The earliest client timer, in real time: `(when, who)`. Paused clients have none.
    fn next_timer(&self) -> Option<(Instant, Who)> {
        let mut next: Option<(Instant, Who)> = None;
        for (who, c) in self.clients.iter().enumerate() {
            if c.paused_until.is_some() {
                continue;
            }
            if let Some(local) = c.lease.poll_timeout() {
                let real = (local - c.origin).max(self.now);
                if next.map_or(true, |(t, _)| real < t) {
                    next = Some((real, who));
                }
            }
        }
        next
    }

    /// Does the next thing due no later than `limit`; false if there is none.
    fn step(&mut self, limit: Instant) -> bool {
        let queued = self.queue.peek().map(|p| p.0.at);
        let timer = self.next_timer();
        let take_timer = match (queued, timer) {
            (None, None) => return false,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(q), Some((t, _))) => t < q || (t == q && self.rng.chance(500_000)),
        };
        if take_timer {
            let (t, who) = timer.unwrap();
            if t > limit {
                return false;
            }
            self.now = t;
            self.fire_timer(who);
        } else {
            if queued.unwrap() > limit {
                return false;
            }
            let Reverse(p) = self.queue.pop().unwrap();
            self.now = self.now.max(p.at);
            self.happen(p.what);
        }
        self.tally.steps += 1;
        self.check_invariants();
        true
    }

    fn fire_timer(&mut self, who: Who) {
        let (when, last, count) = self.timer_burst;
        let count = if when == self.now && last == who {
            count + 1
        } else {
            1
        };
        self.timer_burst = (self.now, who, count);
        assert!(
            count <= 4,
            "{}'s poll_timeout keeps asking for {} but handle_timeout never clears it",
            name(who),
            self.now
        );
        let local = self.local(who);
        let c = &mut self.clients[who];
        c.lease.handle_timeout(local, &c.gate);
        self.note(|| format!("{} timer", name(who)));
        self.drain(who);
    }

    fn happen(&mut self, what: Happening) {
        if let Some(who) = what.runs_on_client() {
            if self.is_paused(who) {
                self.clients[who].deferred.push(what);
                return;
            }
        }
        match what {
            Happening::ToService { from, req } => self.serve(from, req),
            Happening::ToClient { to, resp } => {
                if self.is_paused(to) {
                    self.clients[to].inbox.push(resp);
                } else {
                    self.deliver(to, resp);
                }
            }
            Happening::PauseStart { who, len, scripted } => {
                if !scripted && !self.faults_on {
                    return;
                }
                let until = self.now + len;
                let c = &mut self.clients[who];
                let until = c.paused_until.map_or(until, |u| u.max(until));
                c.paused_until = Some(until);
                self.tally.pauses += 1;
                if len > self.scn.config.ttl() {
                    self.tally.pauses_over_ttl += 1;
                }
                self.note(|| format!("{} PAUSED for {len} (until {until})", name(who)));
                self.schedule(until, Happening::PauseEnd { who });
            }
            Happening::PauseEnd { who } => {
                if self.clients[who].paused_until == Some(self.now) {
                    self.resume(who);
                }
            }
            Happening::WorkerWake { who } => self.worker(who),
            Happening::Write { who, delay } => self.scripted_write(who, delay),
            Happening::WriteLands {
                who,
                fence,
                term,
                checked,
                worker,
            } => self.land(who, fence, term, checked, worker),
            Happening::Acquire { who } => {
                let local = self.local(who);
                let c = &mut self.clients[who];
                let result = c.lease.acquire(local, &c.gate);
                self.note(|| format!("{} acquire() -> {result:?}", name(who)));
                self.drain(who);
            }
            Happening::Release { who, scripted } => {
                if !scripted && !self.faults_on {
                    return;
                }
                let local = self.local(who);
                let c = &mut self.clients[who];
                let result = c.lease.release(local, &c.gate);
                self.note(|| format!("{} release() -> {result:?}", name(who)));
                self.drain(who);
            }
            Happening::Revoke { scripted } => {
                if !scripted && !self.faults_on {
                    return;
                }
                if let Some((victim, fence)) = self.service.revoke(self.now) {
                    self.tally.revocations += 1;
                    self.note(|| format!("service: key DELETED from outside ({fence})"));
                    let resp = Response::Revoked(fence);
                    self.transmit(victim, Happening::ToClient { to: victim, resp });
                }
                let bogus = self.scn.faults.as_ref().map_or(0, |f| f.bogus_notice_ppm);
                if !scripted && self.rng.chance(bogus) {
                    // A late notice about some grant that is already over.
                    let ended: Vec<Fence> = (self.service.grants.iter())
                        .filter(|g| g.ended.is_some())
                        .map(|g| g.fence)
                        .collect();
                    if !ended.is_empty() {
                        let fence = self.rng.pick(&ended);
                        let to = self.rng.below(self.clients.len() as u64) as usize;
                        let resp = Response::Revoked(fence);
                        self.transmit(to, Happening::ToClient { to, resp });
                    }
                }
            }
            Happening::FaultsStop => {
                self.faults_on = false;
                self.quiet = Some(Quiet { holder: None });
                let within = self.scn.faults.as_ref().unwrap().liveness_within;
                self.note(|| "FAULTS STOP".to_string());
                self.schedule(self.now + within, Happening::LivenessDeadline);
            }
            Happening::LivenessDeadline => {
                assert!(
                    self.done,
                    "liveness: {} after the faults stopped nobody holds the lock steadily \
                     (states: {:?})",
                    self.scn.faults.as_ref().unwrap().liveness_within,
                    self.clients
                        .iter()
                        .map(|c| c.lease.state())
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    /// Sends `what` (a message to or from `who`) through the network.
    fn transmit(&mut self, who: Who, what: Happening) {
        let net = if self.faults_on {
            self.scn.net
        } else {
            self.scn.calm_net
        };
        let now = self.now;
        let cut = (self.partitions.iter())
            .any(|&(p, from, until)| p == who && from <= now && now < until);
        if cut || self.rng.chance(net.drop_ppm) {
            self.tally.dropped += 1;
            self.note(|| format!("net DROPS {what}"));
            return;
        }
        let copies = if self.rng.chance(net.dup_ppm) {
            self.tally.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = if self.rng.chance(net.instant_ppm) {
                Duration::ZERO
            } else if self.rng.chance(net.long_ppm) {
                self.rng.duration((Duration::ZERO, net.long))
            } else {
                self.rng.duration(net.delay)
            };
            self.schedule(now + delay, what);
        }
    }

    fn serve(&mut self, from: Who, req: Request) {
        let faulty = self.faults_on;
        let owner = self.clients[from].owner;
        let error_ppm = match &self.scn.faults {
            Some(f) if faulty => f.service_error_ppm,
            _ => 0,
        };
        let failing = self.rng.chance(error_ppm);
        let perform = !failing || self.rng.chance(500_000);
        let mut resp = None;
        if perform {
            let (answer, regranted) =
                (self.service).handle(self.now, from, owner, req, faulty, &mut self.rng);
            self.tally.regrants += u64::from(regranted);
            resp = Some(answer);
        }
        if failing {
            self.tally.service_errors += 1;
            let why = self
                .rng
                .pick(&[Indeterminate::Service, Indeterminate::Protocol]);
            resp = Some(match req.kind {
                Kind::Acquire => Response::Acquire(req.id, AcquireOutcome::Indeterminate(why)),
                Kind::Renew => Response::Renew(req.id, RenewOutcome::Indeterminate(why)),
                Kind::Release => Response::Release(req.id, ReleaseOutcome::Indeterminate(why)),
            });
        }
        let resp = resp.unwrap();
        if self.tracing() {
            let holder = match self.service.live_holder(self.now) {
                Some(h) => {
                    let g = self.service.grants[h];
                    let until = self.service.real_of(g.expiry);
                    format!(
                        "{} of {} term {} until {until}",
                        g.fence,
                        name(g.who),
                        g.token.term.0
                    )
                }
                None => "nobody".to_string(),
            };
            let error = if failing { " (as an error)" } else { "" };
            self.note(|| {
                format!(
                    "service: {}'s {req} => {resp}{error}; holder {holder}",
                    name(from)
                )
            });
        }
        self.transmit(from, Happening::ToClient { to: from, resp });
    }

    fn deliver(&mut self, who: Who, resp: Response) {
        let local = self.local(who);
        let c = &mut self.clients[who];
        let (lease, gate) = (&mut c.lease, &c.gate);
        let result = match resp {
            Response::Acquire(id, o) => lease.handle_acquire_response(local, id, o, gate),
            Response::Renew(id, o) => lease.handle_renew_response(local, id, o, gate),
            Response::Release(id, o) => lease.handle_release_response(local, id, o, gate),
            Response::Revoked(fence) => lease.handle_revoked(local, fence, gate),
        };
        self.note(|| format!("{} <- {resp}: {result:?}", name(who)));
        // Rule 4: "not owner" is definitive, at once; so is a revocation of our grant.
        let state = self.clients[who].lease.state();
        match (resp, result) {
            (Response::Renew(_, RenewOutcome::NotOwner), Ok(())) => {
                assert_eq!(state, State::Lost(LossReason::NotOwner), "rule 4");
            }
            (Response::Revoked(_), Ok(())) => assert!(matches!(state, State::Lost(_))),
            _ => {}
        }
        self.drain(who);
    }

    /// The driving contract: after every call, drain actions, then events.
    fn drain(&mut self, who: Who) {
        while let Some(action) = self.clients[who].lease.poll_action() {
            let (id, term) = (action.id(), action.term());
            let (kind, ttl, fence) = match action {
                Action::Acquire { ttl, .. } => (Kind::Acquire, ttl, Fence(0)),
                Action::Renew { ttl, fence, .. } => (Kind::Renew, ttl, fence),
                Action::Release { .. } => (Kind::Release, Duration::ZERO, Fence(0)),
            };
            if kind == Kind::Release {
                // Rules 5 and 6: the gate closed before the release was emitted.
                let gate = self.clients[who].gate.check(self.local(who));
                assert!(
                    gate.is_err(),
                    "{} emitted {action:?} while its gate still passes ({gate:?})",
                    name(who)
                );
            }
            let req = Request {
                id,
                term,
                kind,
                ttl,
                fence,
            };
            if self.record {
                self.sent.push((who, req));
            }
            self.note(|| format!("{} sends {req}", name(who)));
            self.transmit(who, Happening::ToService { from: who, req });
        }
        while let Some(event) = self.clients[who].lease.poll_event() {
            self.on_event(who, event);
        }
    }

    fn on_event(&mut self, who: Who, event: Event) {
        self.note(|| format!("{} EVENT {event:?}", name(who)));
        if self.record {
            self.events.push((who, self.now, event));
        }
        let local = self.local(who);
        let t = self.scn.config.ttl();
        match event {
            Event::Acquired {
                term,
                fence,
                deadline,
            } => {
                assert_eq!(term, self.clients[who].lease.term());
                self.assert_deadline_is_safe(who, fence, deadline, "Acquired");
                assert!(local < deadline, "acquired with a deadline already past");
                self.tally.acquired += 1;
                let release_ppm = self.scn.faults.as_ref().map_or(0, |f| f.release_ppm);
                if self.faults_on && self.rng.chance(release_ppm) {
                    let when = self.now + self.rng.duration((Duration::ZERO, t.times(4)));
                    let what = Happening::Release {
                        who,
                        scripted: false,
                    };
                    self.schedule(when, what);
                }
            }
            Event::Renewed { deadline } => {
                let fence = self.clients[who]
                    .lease
                    .fence()
                    .expect("renewed but not held");
                self.assert_deadline_is_safe(who, fence, deadline, "Renewed");
                self.tally.renewed += 1;
            }
            Event::RenewFailed {
                reason,
                retry_at,
                deadline,
                writes_paused,
            } => {
                assert_eq!(writes_paused, self.scn.config.fail_closed());
                if let Some(retry) = retry_at {
                    assert!(
                        retry < deadline,
                        "rule 3: a retry scheduled past the deadline"
                    );
                }
                if writes_paused {
                    let gate = self.clients[who].gate.check(local);
                    assert!(gate.is_err(), "fail-closed, yet the gate passes");
                }
                self.tally.renew_failed += 1;
                self.tally.late_success += u64::from(reason == Indeterminate::LateSuccess);
            }
            Event::Lost { reason } => {
                // Rule 5: the gate closed before this was emitted.
                let gate = self.clients[who].gate.check(local);
                assert_eq!(
                    gate,
                    Err(GateError::Lost(reason)),
                    "rule 5: lost, gate open"
                );
                match reason {
                    LossReason::Expired => self.tally.lost_expired += 1,
                    LossReason::NotOwner => self.tally.lost_not_owner += 1,
                    LossReason::Revoked => self.tally.lost_revoked += 1,
                    LossReason::Shortened => self.tally.lost_shortened += 1,
                    _ => {}
                }
                self.acquire_again_later(who);
            }
            Event::Released => {
                let gate = self.clients[who].gate.check(local);
                assert_eq!(gate, Err(GateError::Released), "released, gate open");
                self.tally.released += 1;
                self.acquire_again_later(who);
            }
            _ => {}
        }
    }

    fn acquire_again_later(&mut self, who: Who) {
        if let Some(within) = self.scn.reacquire_within {
            let within = if self.faults_on {
                within
            } else {
                within.over(10)
            };
            let when = self.now + self.rng.duration((Duration::ZERO, within));
            self.schedule(when, Happening::Acquire { who });
        }
    }

    fn resume(&mut self, who: Who) {
        self.clients[who].paused_until = None;
        self.note(|| format!("{} RESUMES", name(who)));
        // A worker thread can run before the driver does: the gate alone must refuse a
        // lease whose deadline passed during the pause.
        let local = self.local(who);
        let result = self.clients[who].gate.check(local);
        self.checked(who, By::Waking, result);
        let deferred = std::mem::take(&mut self.clients[who].deferred);
        let inbox = std::mem::take(&mut self.clients[who].inbox);
        let workers_first = self.rng.chance(500_000);
        let is_worker =
            |h: &Happening| matches!(h, Happening::WorkerWake { .. } | Happening::Write { .. });
        if workers_first {
            for &what in deferred.iter().filter(|h| is_worker(h)) {
                self.happen(what);
            }
        }
        let c = &mut self.clients[who];
        c.lease.handle_timeout(local, &c.gate);
        self.drain(who);
        self.check_invariants();
        for resp in inbox {
            self.deliver(who, resp);
            self.check_invariants();
        }
        for &what in deferred.iter().filter(|h| !workers_first || !is_worker(h)) {
            self.happen(what);
        }
    }

    /// Invariant (a) on a check that passed, plus the bookkeeping of every check.
    fn checked(&mut self, who: Who, by: By, result: Result<Fence, GateError>) {
        match result {
            Ok(fence) => {
                let stale = self.check_pass(who, fence, "a worker");
                self.tally.stale_fence_holds += u64::from(stale);
                self.tally.checks_passed += 1;
            }
            Err(GateError::DeadlinePassed { .. }) => {
                self.tally.checks_refused_deadline += 1;
                self.tally.woke_refused_deadline += u64::from(by == By::Waking);
            }
            Err(_) => {}
        }
        if self.record {
            let at = self.now;
            self.checks.push(Checked {
                who,
                by,
                at,
                result,
            });
        }
        self.note(|| format!("{} check by {by:?}: {result:?}", name(who)));
    }

    fn worker(&mut self, who: Who) {
        let w = self.scn.workers.unwrap();
        let result = self.clients[who].gate.check(self.local(who));
        self.checked(who, By::Worker, result);
        match result {
            Ok(fence) => {
                let delay = if self.rng.chance(w.stall_ppm) {
                    self.tally.worker_stalls += 1;
                    self.rng.duration(w.stall)
                } else {
                    self.rng.duration(w.write_delay)
                };
                let term = self.clients[who].lease.term();
                let what = Happening::WriteLands {
                    who,
                    fence,
                    term,
                    checked: self.now,
                    worker: true,
                };
                self.schedule(self.now + delay, what);
            }
            Err(_) => {
                let when = self.now + self.rng.duration(w.wake);
                self.schedule(when, Happening::WorkerWake { who });
            }
        }
    }

    fn scripted_write(&mut self, who: Who, delay: Duration) {
        let result = self.clients[who].gate.check(self.local(who));
        self.checked(who, By::Script, result);
        if let Ok(fence) = result {
            let term = self.clients[who].lease.term();
            let what = Happening::WriteLands {
                who,
                fence,
                term,
                checked: self.now,
                worker: false,
            };
            self.schedule(self.now + delay, what);
        }
    }

    /// A write reaches storage. Invariant (b).
    fn land(&mut self, who: Who, fence: Fence, term: Term, checked: Instant, worker: bool) {
        let result = self.storage.admit(fence);
        self.note(|| format!("storage: {}'s write with {fence}: {result:?}", name(who)));
        match result {
            Ok(()) => {
                if let Some(newest) = self.newest_admitted {
                    assert!(
                        fence >= newest,
                        "(b) storage admitted {fence} after already admitting {newest}"
                    );
                }
                let grant = self.service.grant(fence).unwrap_or_else(|| {
                    panic!("(b) storage admitted {fence}, which the service never granted")
                });
                assert_eq!(
                    grant.token,
                    self.clients[who].owner.token(term),
                    "(b) {}'s write carries {fence}, granted to another owner or term",
                    name(who)
                );
                assert!(checked <= self.now);
                self.newest_admitted = Some(fence);
                self.tally.writes_admitted += 1;
            }
            Err(StaleFence { presented, newest }) => {
                assert_eq!(presented, fence);
                assert_eq!(Some(newest), self.newest_admitted);
                assert!(fence < newest, "storage refused a fence that is not stale");
                self.tally.writes_rejected_stale += 1;
            }
        }
        if self.record {
            let at = self.now;
            self.landed.push(Landed {
                who,
                at,
                fence,
                result,
            });
        }
        if worker {
            let w = self.scn.workers.unwrap();
            let when = self.now + self.rng.duration(w.wake);
            self.schedule(when, Happening::WorkerWake { who });
        }
    }

    // ----- invariants -----

    /// Invariant (a): a check that passes at real time `now` returns the fence of a
    /// grant the service made to this very client and term (never released), and the
    /// service's hard TTL (its expiry mapped back to real time exactly) has not run out:
    ///
    /// * that grant's own TTL, and then the key's holder is that grant unless it was
    ///   deleted from outside (whose notice may still be on its way: the fence gate's
    ///   case); and when renewals compare the fence too, nothing less will do;
    /// * or, when renewals compare only the owner token, the TTL of a newer grant to the
    ///   same owner token, which those renewals extend: the service cannot tell two
    ///   grants of one term apart (see the timelines). Returns true in that case.
    #[track_caller]
    fn check_pass(&self, who: Who, fence: Fence, by: &str) -> bool {
        let c = &self.clients[who];
        let n = name(who);
        let lease = &c.lease;
        assert!(
            matches!(lease.state(), State::Holding | State::RenewPending),
            "(a) {by} of {n} passed check with {fence} while its lease is {:?}",
            lease.state()
        );
        assert_eq!(lease.fence(), Some(fence), "(a) {by} of {n}: wrong fence");
        assert!(
            !lease.writes_paused(),
            "(a) {by} of {n}: passed while paused"
        );
        let grant = (self.service.grant(fence))
            .unwrap_or_else(|| panic!("(a) {by} of {n} passed with {fence}: never granted"));
        let token = c.owner.token(lease.term());
        assert_eq!(
            grant.token, token,
            "(a) {by} of {n} passed with {fence}, granted to another owner or term"
        );
        assert_ne!(
            grant.ended,
            Some(Ended::Released),
            "(a) {by} of {n} passed with {fence}, which was released"
        );
        let expiry = self.service.real_of(grant.expiry);
        if self.now < expiry {
            debug_assert!(self.service.clock(self.now) < grant.expiry);
            if grant.ended.is_none() {
                let holder = self.service.live_holder(self.now);
                assert_eq!(
                    holder.map(|h| self.service.grants[h].fence),
                    Some(fence),
                    "(a) {by} of {n} passed with {fence}, not the key's holder"
                );
            }
            return false;
        }
        let cover = self.service.token_cover(token);
        let covered =
            self.scn.renew_compare == Compare::Owner && cover.is_some_and(|until| self.now < until);
        assert!(
            covered,
            "(a) {by} of {n} passed check at {} (its clock: {}) with {fence}, but the \
             service's hard TTL ended that lease at {expiry} (service clock {} ≥ expiry {})",
            self.now,
            self.local(who),
            self.service.clock(self.now),
            grant.expiry,
        );
        true
    }

    /// Rule 1 against the service: a safe deadline is never later than the real moment
    /// the service's hard TTL ends the grant (or, with owner-compare renewals, the
    /// newest grant to the same owner token, as in [`Sim::check_pass`]).
    #[track_caller]
    fn assert_deadline_is_safe(&self, who: Who, fence: Fence, deadline: Instant, what: &str) {
        let c = &self.clients[who];
        let grant = (self.service.grant(fence))
            .unwrap_or_else(|| panic!("{what}: {} holds {fence}, never granted", name(who)));
        let token = c.owner.token(c.lease.term());
        assert_eq!(
            grant.token,
            token,
            "{what}: {} holds {fence}, granted to another owner or term",
            name(who)
        );
        let real_deadline = deadline - c.origin;
        let expiry = self.service.real_of(grant.expiry);
        let covered = real_deadline <= expiry
            || (self.scn.renew_compare == Compare::Owner
                && (self.service.token_cover(token)).is_some_and(|until| real_deadline <= until));
        assert!(
            covered,
            "{what}: {}'s safe deadline {real_deadline} (real) outlives the service's \
             expiry {expiry} of {fence}",
            name(who),
        );
    }

    /// Everything that must hold after every step, for every client (paused or not).
    fn check_invariants(&mut self) {
        for who in 0..self.clients.len() {
            self.check_client(who);
        }
        if self.quiet.is_some() {
            self.check_liveness();
        }
    }

    fn check_client(&mut self, who: Who) {
        let local = self.local(who);
        let n = name(who);
        let c = &self.clients[who];
        let lease = &c.lease;
        let (state, term) = (lease.state(), lease.term());
        assert_eq!(
            lease.stats().overwritten_events,
            0,
            "{n}: an event was lost although the driver drains after every call"
        );
        // (a) the gate, as a worker running right now would see it.
        let gate = c.gate.check(local);
        match gate {
            Ok(fence) => {
                self.check_pass(who, fence, "the gate");
            }
            Err(err) => {
                let open = matches!(state, State::Holding | State::RenewPending)
                    && !lease.writes_paused()
                    && lease.deadline().is_some_and(|d| local < d);
                assert!(
                    !open,
                    "{n}: lease {state:?} is held, yet the gate says {err:?}"
                );
            }
        }
        if let (Some(fence), Some(deadline)) = (lease.fence(), lease.deadline()) {
            self.assert_deadline_is_safe(who, fence, deadline, "held");
        }
        let snapshot = c.gate.snapshot().expect("no concurrent writer");
        assert_eq!(
            snapshot.term,
            term.0 & 0x0fff_ffff,
            "{n}: gate of another term"
        );
        let gate_deadline = matches!(snapshot.status, GateStatus::Held | GateStatus::Paused)
            .then_some(snapshot.deadline);
        let deadline = lease.deadline();

        let c = &mut self.clients[who];
        if c.seen_term != term {
            c.seen_term = term;
            c.last_deadline = None;
            c.last_gate_deadline = None;
            c.closed = None;
        }
        // Deadlines only move forward within a term, the lease's and the gate's.
        if let Some(d) = deadline {
            if let Some(prev) = c.last_deadline {
                assert!(d >= prev, "{n}: deadline moved back from {prev} to {d}");
            }
            c.last_deadline = Some(d);
        }
        if let Some(d) = gate_deadline {
            if let Some(prev) = c.last_gate_deadline {
                assert!(
                    d >= prev,
                    "{n}: gate deadline moved back from {prev} to {d}"
                );
            }
            c.last_gate_deadline = Some(d);
        }
        // A closed term stays closed: Lost is final, Releasing only becomes Released.
        if let Some(closed) = c.closed {
            let fine = match closed {
                State::Lost(_) | State::Released => state == closed,
                _ => matches!(state, State::Releasing | State::Released),
            };
            assert!(
                fine,
                "{n}: term {term:?} closed as {closed:?}, now {state:?}"
            );
            assert!(gate.is_err(), "{n}: closed term, open gate");
        }
        if matches!(state, State::Lost(_) | State::Releasing | State::Released) {
            c.closed = Some(state);
            assert!(gate.is_err(), "{n}: {state:?} yet the gate passes");
        }
    }

    /// After the faults stop, somebody must come to hold the lock and keep it for 3 T.
    fn check_liveness(&mut self) {
        let mut holders = (0..self.clients.len())
            .filter_map(|who| {
                let gate = self.clients[who].gate.check(self.local(who));
                gate.ok().map(|fence| (who, fence))
            })
            .take(2);
        let (first, second) = (holders.next(), holders.next());
        let now = self.now;
        let steady = self.scn.config.ttl().times(3);
        let quiet = self.quiet.as_mut().unwrap();
        match (first, second, quiet.holder) {
            (Some((who, fence)), None, Some((w, f, since))) if (who, fence) == (w, f) => {
                if now - since >= steady {
                    self.done = true;
                    // And its writes can land: no newer fence reached storage before.
                    let stuck = self.storage.newest().is_some_and(|newest| fence < newest);
                    assert!(
                        !stuck || self.scn.renew_compare == Compare::Owner,
                        "liveness: {} holds {fence}, older than storage's newest",
                        name(who)
                    );
                    self.tally.stuck_holders += u64::from(stuck);
                }
            }
            (Some((who, fence)), None, _) => quiet.holder = Some((who, fence, now)),
            _ => quiet.holder = None,
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(trace) = &self.trace {
                let mut out = String::new();
                if let Some(seed) = self.seed {
                    out += &format!("\n=== seed {seed} ===\n{:?}\n", self.scn);
                }
                out += &format!("=== the last {} steps (real time) ===\n", trace.len());
                for line in trace {
                    out += line;
                    out.push('\n');
                }
                out += &format!("=== failed at {} ===\n", self.now);
                eprint!("{out}");
            }
        }
    }
}

// =====================================================================================
// Timeline assertions
// =====================================================================================

/// `who` holds the lease, its gate passes right now; its fence.
#[track_caller]
fn assert_holds(sim: &mut Sim, who: Who) -> Fence {
    let state = sim.state(who);
    assert!(
        matches!(state, State::Holding | State::RenewPending),
        "{} should hold the lease at {}, but is {state:?}",
        name(who),
        sim.now
    );
    match sim.check(who) {
        Ok(fence) => fence,
        Err(err) => panic!("{} holds, but its gate says {err:?}", name(who)),
    }
}

#[track_caller]
fn assert_lost(sim: &Sim, who: Who, reason: LossReason) {
    assert_eq!(
        sim.state(who),
        State::Lost(reason),
        "{} at {}",
        name(who),
        sim.now
    );
}

fn losses(sim: &Sim, who: Who) -> usize {
    (sim.events_of(who).iter())
        .filter(|e| matches!(e, Event::Lost { .. }))
        .count()
}

fn count(events: &[Event], what: fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| what(e)).count()
}

// =====================================================================================
// Timelines
// =====================================================================================

#[test]
fn the_lessons_400ms_pause_is_survived_by_a_600ms_lease() {
    // T = 600 ms, renewed every T/3 = 200 ms; a 400 ms stop-the-world pause.
    let mut sim = Sim::scripted(Scenario::calm(lesson(), 2).workers_every(ms(10)));
    sim.start_workers(at(ms(0)));
    sim.acquire(A, at(ms(0)));
    sim.acquire(B, at(ms(100))); // contends for the same key all along
    sim.run_until(at(ms(1_040)));
    let fence = assert_holds(&mut sim, A);

    // The renewal sent at 1,000 ms ends the safe window at 1,000 + 600 − 0.6 − 30.
    sim.pause(A, at(ms(1_050)), ms(400)); // the renewal due at 1,200 ms is missed
    sim.run_until(at(ms(1_449)));
    assert_eq!(
        sim.check(A),
        Ok(fence),
        "the deadline (1,569.4 ms) is still ahead"
    );

    sim.run_until(at(ms(3_000)));
    assert_eq!(sim.wake_check(A), Some(Ok(fence)));
    assert_eq!(assert_holds(&mut sim, A), fence);
    assert_eq!(losses(&sim, A), 0);
    let b = sim.events_of(B);
    assert_eq!(count(&b, |e| matches!(e, Event::Acquired { .. })), 0);
    assert!(sim
        .landed_from(A)
        .iter()
        .all(|w| w.1 == fence && w.2.is_ok()));
}

#[test]
fn a_pause_longer_than_the_ttl_loses_the_lease_and_storage_refuses_the_stale_write() {
    let mut sim = Sim::scripted(Scenario::calm(lesson(), 2).workers_every(ms(10)));
    sim.start_workers(at(ms(0)));
    sim.acquire(A, at(ms(0)));
    sim.acquire(B, at(ms(100)));
    sim.run_until(at(ms(1_040)));
    let old = assert_holds(&mut sim, A);

    // A worker of A passes the check, then stalls before its write reaches storage...
    sim.write(A, at(ms(1_045)), ms(900)); // lands at 1,945 ms
                                          // ...and the whole client stops for 800 ms, longer than T.
    sim.pause(A, at(ms(1_050)), ms(800)); // until 1,850 ms
    sim.run_until(at(ms(1_849)));

    // The service's hard TTL ended A's lease at 1,005 + 600 ms; B took the key.
    let new = assert_holds(&mut sim, B);
    assert!(new > old);
    assert_eq!(sim.state(A), State::Holding, "A's driver has not run yet");
    sim.run_until(at(ms(2_000)));

    // On waking, a worker ran before A's driver: the gate alone refused.
    let deadline = Instant::from_micros(1_569_400);
    let refused = Err(GateError::DeadlinePassed { deadline });
    assert_eq!(sim.wake_check(A), Some(refused));
    assert_lost(&sim, A, LossReason::Expired);
    // The write A checked before its pause reached storage after B's: refused.
    let stale = sim
        .landed_from(A)
        .into_iter()
        .find(|w| w.0 == at(ms(1_945)));
    let stale = stale.expect("the stalled write landed");
    assert_eq!(
        stale.2,
        Err(StaleFence {
            presented: old,
            newest: new
        })
    );
    assert_eq!(sim.scripted_checks(A), [(at(ms(1_045)), Ok(old))]);
}

#[test]
fn a_lost_renewal_is_retried_inside_the_budget_and_is_not_a_loss() {
    let mut sim = Sim::scripted(Scenario::calm(lesson(), 1));
    sim.acquire(A, at(ms(0)));
    sim.run_until(at(ms(1_100)));
    let fence = assert_holds(&mut sim, A);
    // The renewal sent at 1,200 ms vanishes; it times out at 1,260, is retried at 1,290.
    sim.partition(A, at(ms(1_190)), at(ms(1_270)));
    sim.write(A, at(ms(1_280)), ms(1));
    sim.run_until(at(ms(2_000)));
    assert_eq!(assert_holds(&mut sim, A), fence);
    assert_eq!(losses(&sim, A), 0);
    assert_eq!(sim.scripted_checks(A), [(at(ms(1_280)), Ok(fence))]);
    let failed = Event::RenewFailed {
        reason: Indeterminate::Timeout,
        retry_at: Some(at(ms(1_290))),
        deadline: Instant::from_micros(1_569_400),
        writes_paused: false,
    };
    let events = sim.events_of(A);
    let at_failure = events.iter().position(|e| *e == failed);
    let at_failure = at_failure.expect("the lost renewal was reported");
    assert!(matches!(events[at_failure + 1], Event::Renewed { .. }));
}

#[test]
fn fail_closed_pauses_writes_until_the_retried_renewal_is_confirmed() {
    let config = Config::builder(ms(600)).fail_closed(true).build().unwrap();
    let mut sim = Sim::scripted(Scenario::calm(config, 1));
    sim.acquire(A, at(ms(0)));
    sim.partition(A, at(ms(1_190)), at(ms(1_270)));
    sim.write(A, at(ms(1_250)), ms(1)); // renewal outcome unknown, not yet timed out
    sim.write(A, at(ms(1_280)), ms(1)); // timed out: paused
    sim.write(A, at(ms(1_310)), ms(1)); // retried at 1,290, confirmed at 1,300
    sim.run_until(at(ms(1_400)));
    let fence = assert_holds(&mut sim, A);
    assert_eq!(
        sim.scripted_checks(A),
        [
            (at(ms(1_250)), Ok(fence)),
            (at(ms(1_280)), Err(GateError::Paused)),
            (at(ms(1_310)), Ok(fence)),
        ]
    );
}

#[test]
fn a_key_deleted_behind_the_holders_back_stops_it_and_fences_its_late_write() {
    let mut sim = Sim::scripted(Scenario::calm(lesson(), 2));
    sim.acquire(A, at(ms(0)));
    sim.run_until(at(ms(100)));
    let old = assert_holds(&mut sim, A);
    sim.write(A, at(ms(490)), ms(200)); // passes, then stalls
    sim.revoke(at(ms(500))); // the notice reaches A at 505 ms
    sim.acquire(B, at(ms(500))); // B's request reaches the service at 505 ms
    sim.run_until(at(ms(600)));
    assert_lost(&sim, A, LossReason::Revoked);
    let new = assert_holds(&mut sim, B);
    sim.write(B, at(ms(600)), ms(1));
    sim.run_until(at(ms(700)));
    let stale = Err(StaleFence {
        presented: old,
        newest: new,
    });
    assert_eq!(sim.landed_from(A), [(at(ms(690)), old, stale)]);
}

#[test]
fn a_release_closes_the_gate_at_once_and_frees_the_key_for_the_next_holder() {
    let mut sim = Sim::scripted(Scenario::calm(lesson(), 2));
    sim.acquire(A, at(ms(0)));
    sim.acquire(B, at(ms(20))); // retried every 30 ms after each "held by another"
    sim.run_until(at(ms(300)));
    let old = assert_holds(&mut sim, A);
    sim.release(A, at(ms(300)));
    sim.run_until(at(ms(300)));
    // Closed before the release request has even left.
    assert_eq!(sim.check(A), Err(GateError::Released));
    assert_eq!(sim.state(A), State::Releasing);
    sim.run_until(at(ms(400)));
    assert_eq!(sim.state(A), State::Released);
    let new = assert_holds(&mut sim, B);
    assert!(new > old);
}

/// A's key is deleted from outside and the notice is lost; B takes the key, writes and
/// lets go; then a duplicate of A's old acquire, held back by the network, reaches the
/// service, which grants the free key — with a new fence — to A's very owner token.
fn a_deleted_grant_revived_by_a_late_duplicate(compare: Compare) -> (Sim, Fence, Fence) {
    let mut sim = Sim::scripted(Scenario::calm(lesson(), 2).renew_compare(compare));
    sim.acquire(A, at(ms(0)));
    sim.run_until(at(ms(50)));
    let old = assert_holds(&mut sim, A);
    sim.partition(A, at(ms(100)), at(ms(101))); // the deletion notice is lost
    sim.revoke(at(ms(100)));
    sim.acquire(B, at(ms(110)));
    sim.write(B, at(ms(150)), ms(1));
    sim.release(B, at(ms(160)));
    sim.run_until(at(ms(165)));
    let newer = sim.landed_from(B)[0].1;
    sim.deliver_again(A, 1, at(ms(170))); // A's acquire #1 once more: granted again
    (sim, old, newer)
}

/// Owner-compare alone (owner + term, DESIGN §4) cannot tell two grants of one term
/// apart: A's renewals extend the revived grant, so A keeps its lease and its gate
/// passes with its *old* fence long after that grant's hard TTL ended (605 ms) — while
/// storage, having seen B's newer fence, refuses every write of A's: a holder that can
/// never write. Storage stays safe (the fence gate); the lock is wasted.
#[test]
fn owner_compare_alone_lets_a_late_duplicate_acquire_revive_a_deleted_grant() {
    let (mut sim, old, newer) = a_deleted_grant_revived_by_a_late_duplicate(Compare::Owner);
    sim.write(A, at(ms(1_000)), ms(1));
    sim.run_until(at(ms(1_100)));
    assert_eq!(assert_holds(&mut sim, A), old);
    assert!(sim.tally.stale_fence_holds > 0);
    let refused = Err(StaleFence {
        presented: old,
        newest: newer,
    });
    assert_eq!(sim.landed_from(A), [(at(ms(1_001)), old, refused)]);
}

/// The cure: the renewal presents the fence of the grant it extends
/// (`Action::Renew { fence, .. }`), the service compares it too, and the revived grant
/// is not the client's: "not owner", at A's next renewal.
#[test]
fn comparing_the_fence_on_renew_ends_a_revived_grant_at_the_next_renewal() {
    let compare = Compare::OwnerAndFence;
    let (mut sim, old, _) = a_deleted_grant_revived_by_a_late_duplicate(compare);
    sim.run_until(at(ms(209)));
    assert_eq!(assert_holds(&mut sim, A), old);
    sim.run_until(at(ms(210)));
    assert_lost(&sim, A, LossReason::NotOwner);
}

/// (c) Without faults, a lone client keeps its lease: not one loss, not one failed
/// renewal, not one refused write, for 1,000 renew periods, at both ends of the drift
/// bound and with jitter up to a quarter of the request timeout each way.
#[test]
fn a_lone_client_without_faults_keeps_its_lease_for_1000_renew_periods() {
    let lesson = Config::builder(ms(600));
    let cases = [
        (lesson, 1_000),
        (lesson, -1_000),
        (lesson.fail_closed(true), 1_000),
        (lesson.margin(Duration::ZERO), 1_000),
        (lesson.renew_interval(ms(500)), 1_000),
        (
            Config::builder(ms(3_000))
                .drift_ppm(20_000)
                .margin(Duration::ZERO),
            20_000,
        ),
        (Config::builder(ms(3_000)).drift_ppm(20_000), -20_000),
    ];
    for (seed, (builder, drift)) in cases.into_iter().enumerate() {
        let config = builder.build().unwrap();
        let jitter = config.request_timeout().over(4);
        let every = config.ttl().over(10);
        let scenario = Scenario::calm(config, 1)
            .one_way(Duration::ZERO, jitter)
            .service_drift_ppm(drift)
            .workers_every(every);
        let mut sim = Sim::new(scenario, Rng::new(seed as u64), None, true);
        sim.acquire(A, at(ms(0)));
        sim.run_until(at(config.request_timeout()));
        let fence = assert_holds(&mut sim, A);
        sim.start_workers(sim.now);
        let period = config.renew_interval();
        let end = at(period.times(1_000) + period.over(2));
        sim.run_until(end);

        assert_eq!(assert_holds(&mut sim, A), fence, "{config:?}");
        let events = sim.events_of(A);
        assert_eq!(count(&events, |e| matches!(e, Event::Acquired { .. })), 1);
        assert_eq!(
            count(&events, |e| matches!(e, Event::Renewed { .. })),
            1_000,
            "{config:?}"
        );
        assert_eq!(events.len(), 1_001, "only Acquired and Renewed: {config:?}");
        let checks = sim.checks.iter().filter(|c| c.by == By::Worker);
        assert!(checks.clone().count() >= 3_000);
        assert!(checks.into_iter().all(|c| c.result == Ok(fence)));
        assert_eq!(sim.tally.writes_admitted, sim.landed.len() as u64);
    }
}

// =====================================================================================
// Seeds
// =====================================================================================

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        (value.replace('_', "").parse())
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// One seeded run; panics on any violated invariant.
fn run_seed(seed: u64, trace: bool) -> Tally {
    let mut sim = Sim::seeded(seed, trace);
    sim.run_to_the_end();
    sim.tally
}

/// (d) A seed that panics — an invariant or the core itself — is a failure, caught
/// here so the seed can be reported and replayed.
fn try_seed(seed: u64) -> Result<Tally, String> {
    catch_unwind(AssertUnwindSafe(|| run_seed(seed, false))).map_err(|panic| {
        if let Some(s) = panic.downcast_ref::<String>() {
            s.clone()
        } else if let Some(s) = panic.downcast_ref::<&str>() {
            (*s).to_string()
        } else {
            "a panic without a message".to_string()
        }
    })
}

#[test]
fn random_seeds() {
    if let Some(seed) = env_u64("LEASEHOLD_SIM_SEED") {
        println!("replaying seed {seed}");
        let tally = run_seed(seed, true);
        println!("seed {seed} passed: {tally:#?}");
        return;
    }
    let seeds = env_u64("LEASEHOLD_SIM_SEEDS").unwrap_or(10_000);
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<(u64, String)>> = Mutex::new(None);
    let total = Mutex::new(Tally::default());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut mine = Tally::default();
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds {
                        break;
                    }
                    match try_seed(seed) {
                        Ok(tally) => mine.add(&tally),
                        Err(message) => {
                            stop.store(true, Ordering::Relaxed);
                            let mut failure = failure.lock().unwrap();
                            if failure.as_ref().map_or(true, |(s, _)| seed < *s) {
                                *failure = Some((seed, message));
                            }
                        }
                    }
                }
                total.lock().unwrap().add(&mine);
            });
        }
    });
    if let Some((seed, message)) = failure.into_inner().unwrap() {
        eprintln!("\nseed {seed} failed: {message}\nreplaying it with a trace:");
        let _ = catch_unwind(|| run_seed(seed, true));
        panic!(
            "simulation seed {seed} failed: {message}\n\
             replay: LEASEHOLD_SIM_SEED={seed} cargo test -p leasehold --test simulation \
             random_seeds -- --nocapture"
        );
    }
    let total = total.into_inner().unwrap();
    println!("{seeds} seeds: {total:#?}");
    assert_eq!(total.seeds, seeds);
    assert_eq!(
        total.liveness_ok, seeds,
        "every run recovered once faults stopped"
    );
    if seeds >= 1_000 {
        // The faults were really exercised: each of these happened somewhere.
        let exercised = [
            ("checks passed", total.checks_passed),
            (
                "checks refused: deadline passed",
                total.checks_refused_deadline,
            ),
            ("workers refused on waking", total.woke_refused_deadline),
            ("writes admitted", total.writes_admitted),
            ("stale writes refused by fence", total.writes_rejected_stale),
            ("workers stalled mid-write", total.worker_stalls),
            ("renewals", total.renewed),
            ("failed renewals", total.renew_failed),
            ("late successes", total.late_success),
            ("lost: expired", total.lost_expired),
            ("lost: not owner", total.lost_not_owner),
            ("lost: revoked", total.lost_revoked),
            ("lost: shortened", total.lost_shortened),
            ("released", total.released),
            ("stale responses", total.stale_responses),
            ("pauses longer than T", total.pauses_over_ttl),
            ("dropped messages", total.dropped),
            ("duplicated messages", total.duplicated),
            ("service errors", total.service_errors),
            ("re-grants", total.regrants),
            ("revocations", total.revocations),
        ];
        for (what, n) in exercised {
            assert!(n > 0, "no seed exercised: {what}");
        }
    }
}

#[test]
fn a_seed_replays_identically() {
    for seed in [0, 7, 12_345] {
        assert_eq!(run_seed(seed, false), run_seed(seed, true));
    }
}

#[test]
fn the_service_clock_maps_back_to_real_time_exactly() {
    let mut rng = Rng::new(99);
    for _ in 0..10_000 {
        let drift = rng.below(400_001) as i64 - 200_000;
        let scn = Scenario::calm(lesson(), 1).service_drift_ppm(drift);
        let service = Service {
            origin: rng.below(1 << 50),
            ..Service::new(&scn)
        };
        let expiry = service.origin + rng.below(1 << 40);
        let real = service.real_of(expiry);
        assert!(service.clock(real) >= expiry);
        if real > Instant::ZERO {
            assert!(service.clock(real - us(1)) < expiry);
        }
    }
}
