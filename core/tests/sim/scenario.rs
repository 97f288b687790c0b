//! What a run is made of: the configuration, the network, the service's policies,
//! the workers and the faults, scripted or drawn from a seed.

use leasehold::{Config, Duration, Instant};

use super::*;

/// How messages travel.
#[derive(Clone, Copy, Debug)]
pub struct Net {
    /// One-way delay, uniform in this range. Independent per message, so they reorder.
    pub delay: (Duration, Duration),
    /// Chance (ppm) that a message arrives in the same microsecond (loopback): where a
    /// rounding error in the deadline arithmetic would show.
    pub instant_ppm: u32,
    /// Chance (ppm) that a message is instead delayed by anything up to `long`.
    pub long_ppm: u32,
    pub long: Duration,
    pub drop_ppm: u32,
    pub dup_ppm: u32,
}

impl Net {
    pub const fn calm(delay: (Duration, Duration)) -> Net {
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

/// The TTL the service grants at acquire, given the one asked for (the contract lets a
/// service grant another TTL there, and only there; it reports the one it applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlPolicy {
    AsAsked,
    /// Always `asked * num / den` (a service's own minimum or maximum).
    Scaled {
        num: u64,
        den: u64,
    },
    /// While faults are on, anything from zero to twice the ask, grant by grant:
    /// shorter (sometimes too short to hold: the client must refuse it) or longer.
    Erratic,
}

impl TtlPolicy {
    /// The TTL granted once the world is calm.
    pub fn steady(self, asked: Duration) -> Duration {
        match self {
            TtlPolicy::Scaled { num, den } => us(asked.as_micros() * num / den),
            TtlPolicy::AsAsked | TtlPolicy::Erratic => asked,
        }
    }
}

/// What a renewal must match at the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The owner token only (owner + term). The `LockService` contract forbids this
    /// now; it stays as a model to show why (`owner_compare_alone_…`).
    Owner,
    /// The owner token and the fence of the grant (`Action::Renew { fence, .. }`): what
    /// every service does.
    OwnerAndFence,
}

/// What each client's worker does.
#[derive(Clone, Copy, Debug)]
pub struct Workers {
    /// Time between writes.
    pub wake: (Duration, Duration),
    /// Time from a passed `check` to the write reaching storage.
    pub write_delay: (Duration, Duration),
    /// Chance (ppm) that the worker stalls between `check` and the write instead…
    pub stall_ppm: u32,
    /// …for this long (GC, SIGSTOP of the thread, a preempting interrupt storm).
    pub stall: (Duration, Duration),
}

/// The randomised faults of a seeded run, and what must hold once they stop.
#[derive(Clone, Debug)]
pub struct Faults {
    /// Faults stop at this moment; from then on somebody must end up holding the lock.
    pub until: Instant,
    /// `(client, start, length)` of stop-the-world pauses.
    pub pauses: Vec<(Who, Instant, Duration)>,
    /// Moments the key is deleted behind the holder's back.
    pub revocations: Vec<Instant>,
    /// Chance (ppm), per revocation, of also pushing a notice about an old fence.
    pub bogus_notice_ppm: u32,
    /// Chance (ppm) that the service answers an error (having done the work, or not).
    pub service_error_ppm: u32,
    /// Chance (ppm) that a fresh holder releases the lease some time later.
    pub release_ppm: u32,
    /// Chance (ppm) that the service refuses a request for good (`Refused`: revoked
    /// credentials), changing nothing.
    pub refuse_ppm: u32,
    /// Chance (ppm) that a renewal is applied and answered with a TTL *longer* than
    /// asked (the contract allows `r ≥ ttl`).
    pub longer_renewal_ppm: u32,
    /// Chance (ppm) that a renewal is answered with a TTL *shorter* than asked: a breach
    /// of the contract, which the client must answer by ending the term (`Shortened`),
    /// whether the answer comes in time or late. Always delivered (a breach nobody
    /// hears of is outside what a client can detect), and never cutting the hard
    /// expiry below what the service kept before (a breach that does cannot be made
    /// safe by any client; this one checks the client's reaction).
    pub shortened_ppm: u32,
    /// Chance (ppm) that a shortened answer is held back past the request timeout.
    pub late_shortened_ppm: u32,
    /// Chance (ppm) that an acquire waits only so long (`acquire_until`).
    pub bounded_acquire_ppm: u32,
    /// Chance (ppm) that a client releases while its acquire's outcome is unknown.
    pub release_while_acquiring_ppm: u32,
    /// After `until`, somebody must hold the lock steadily within this long.
    pub liveness_within: Duration,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub config: Config,
    pub clients: usize,
    /// The service clock runs at `1 + d` times real time, `d` in ppm.
    pub service_drift_ppm: i64,
    pub service_origin: u64,
    /// Each client's monotonic clock reads `real + origin`.
    pub client_origins: Vec<Duration>,
    pub first_fence: u64,
    /// Fences grow by 1 up to this much per grant (etcd revisions jump).
    pub fence_step: u64,
    pub ttl_policy: TtlPolicy,
    pub renew_compare: Compare,
    /// The network while faults are on.
    pub net: Net,
    /// The network once they stop (and of scripted runs).
    pub calm_net: Net,
    pub workers: Option<Workers>,
    /// A client whose term ended acquires again within this long (faults on), or a
    /// tenth of it (faults off); `None`: only when the script says so.
    pub reacquire_within: Option<Duration>,
    pub faults: Option<Faults>,
}

impl Scenario {
    /// No faults, a fixed 5 ms each way, service clock at real rate, every clock at zero.
    pub fn calm(config: Config, clients: usize) -> Scenario {
        Scenario {
            config,
            clients,
            service_drift_ppm: 0,
            service_origin: 0,
            client_origins: vec![Duration::ZERO; clients],
            first_fence: 1,
            fence_step: 1,
            ttl_policy: TtlPolicy::AsAsked,
            renew_compare: Compare::OwnerAndFence,
            net: Net::calm((ms(5), ms(5))),
            calm_net: Net::calm((ms(5), ms(5))),
            workers: None,
            reacquire_within: None,
            faults: None,
        }
    }

    /// Everything drawn from the seed.
    pub fn random(rng: &mut Rng) -> Scenario {
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
        // Once calm, the grant must be one the client accepts, and a renewal's round
        // trip must fit between the renew time and the safe deadline, or a lone holder
        // could not keep the lease at all.
        let slack = |policy: TtlPolicy| {
            let g = policy.steady(t);
            config
                .safe_deadline(Instant::ZERO, g)
                .map_or(0, |d| d.as_micros())
                .saturating_sub(config.renew_interval_for(g).as_micros())
        };
        if slack(ttl_policy) < 4 || !config.accepts_grant(ttl_policy.steady(t)) {
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
                    1 => part(2, 3), // a 400 ms pause of a 600 ms lease
                    2 => t,
                    _ => rng.duration((t, part(3, 1))),
                };
                pauses.push((who, start, len));
            }
        }
        let revocations = if rng.chance(500_000) {
            (0..rng.between(1, 3))
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
            refuse_ppm: rng.pick(&[0, 0, 5_000, 30_000]),
            longer_renewal_ppm: rng.pick(&[0, 0, 100_000, 500_000]),
            shortened_ppm: rng.pick(&[0, 0, 10_000, 50_000]),
            late_shortened_ppm: 500_000,
            bounded_acquire_ppm: rng.pick(&[0, 300_000, 1_000_000]),
            release_while_acquiring_ppm: rng.pick(&[0, 0, 100_000]),
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

    pub fn one_way(mut self, lo: Duration, hi: Duration) -> Scenario {
        self.net.delay = (lo, hi);
        self.calm_net.delay = (lo, hi);
        self
    }

    pub fn renew_compare(mut self, compare: Compare) -> Scenario {
        self.renew_compare = compare;
        self
    }

    pub fn service_drift_ppm(mut self, ppm: i64) -> Scenario {
        self.service_drift_ppm = ppm;
        self
    }

    /// Every client has a worker writing every `every`, each write landing 1 ms later.
    pub fn workers_every(mut self, every: Duration) -> Scenario {
        self.workers = Some(Workers {
            wake: (every, every),
            write_delay: (ms(1), ms(1)),
            stall_ppm: 0,
            stall: (Duration::ZERO, Duration::ZERO),
        });
        self
    }
}

/// A 600 ms lease and its variants half the time; anything valid otherwise.
pub fn random_config(rng: &mut Rng) -> Config {
    let t600 = Config::builder(ms(600));
    let preset = match rng.below(8) {
        0 | 1 => Some(t600),
        2 => Some(t600.fail_closed(true)),
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
