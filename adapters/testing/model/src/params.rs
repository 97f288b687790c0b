//! The bounds of the checked space, and the lease configuration the clients run.

use leasehold::{Config, Duration};

/// Model time is discrete: one tick is this many microseconds of every clock.
///
/// The lease works in microseconds; whole ticks make every send, handling and expiry
/// instant a multiple of a tick, so checking the gates at each tick is exact (a gate
/// deadline `d` passes a write at tick `t` iff `t·TICK < d`).
pub const TICK_US: u64 = 1_000;

/// Ticks as a [`Duration`].
pub const fn ticks(n: u64) -> Duration {
    Duration::from_micros(n * TICK_US)
}

/// The TTL every client asks for, in ticks.
pub const TTL_TICKS: u64 = 9;

/// The lease configuration of every client: T = 9 ticks, renew every 3, request
/// timeout 2, retry 1 (jittered ×0.5–1.5), margin 1, drift bound 1000 ppm.
///
/// The model's clocks do not drift (every client reads the service's tick); the
/// configured bound (9 µs of a 9-tick lease) is below one tick, so it is subtracted
/// but never exercised. Property (d) is therefore checked with drift 0.
pub fn lease_config() -> Config {
    Config::builder(ticks(TTL_TICKS))
        .renew_interval(ticks(3))
        .request_timeout(ticks(2))
        .retry_interval(ticks(1))
        .margin(ticks(1))
        .drift_ppm(1_000)
        .build()
        .unwrap_or_else(|e| panic!("the model's lease configuration is invalid: {e}"))
}

/// How far the checker looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Clients contending for the one key.
    pub clients: u8,
    /// The last tick: every behaviour ends there.
    pub horizon: u8,
    /// Faults (drop, duplicate, late delivery, pause, an answer other than the plain
    /// one) happen only at ticks `<= fault_window`; liveness is asked after it.
    pub fault_window: u8,
    /// How many faults one behaviour may contain.
    pub faults: u8,
    /// A paused client takes no step for this many ticks.
    pub pause_ticks: u8,
    /// A message marked late may stay in the network this many ticks (an unmarked one
    /// is delivered in the tick it was sent).
    pub late_ticks: u8,
    /// Messages in flight at once; a send into a full network is lost.
    pub capacity: u8,
    /// User releases (a client ends its term and acquires again) in one behaviour.
    pub releases: u8,
    /// The service's largest grant, in ticks: acquires asking more get this (a
    /// reduced grant). Both 9 (as asked) and 6 (reduced) are initial states when 0.
    pub grant_max: u8,
}

impl Params {
    /// The CI run: 2 clients, exhaustive in well under 5 minutes in release.
    ///
    /// Faults in ticks 0–3 leave 10 ticks to recover before the horizon: enough for a
    /// grant whose holder went silent (9 ticks) to expire and be taken over.
    pub const CI: Params = Params {
        clients: 2,
        horizon: 14,
        fault_window: 3,
        faults: 2,
        pause_ticks: 3,
        late_ticks: 3,
        capacity: 3,
        releases: 0,
        grant_max: 0,
    };

    /// The deep run: 3 clients, the full 9-tick grant only.
    pub const DEEP: Params = Params {
        clients: 3,
        grant_max: 9,
        ..Params::CI
    };

    /// A small space for unit tests and the mutation tests (seconds in debug).
    pub const SMALL: Params = Params {
        clients: 2,
        horizon: 12,
        fault_window: 3,
        faults: 2,
        pause_ticks: 3,
        late_ticks: 3,
        capacity: 3,
        releases: 0,
        grant_max: 9,
    };

    /// The horizon these bounds need for liveness (g): `horizon`, raised for three
    /// faults or more to `fault_window + late_ticks + TTL + 2` (17 ticks with the CI
    /// bounds).
    ///
    /// Three faults can keep the key from every client for longer than two can: a
    /// holder's renewal is delayed (1) and duplicated (2), one copy is answered
    /// NOT_OWNER while the service keeps the key (3: what a client sees when a
    /// failover lost the key, without the model losing it), so the holder ends its
    /// term with nothing to release, and the other copy, delivered at the end of its
    /// delay (tick `fault_window + late_ticks`), renews the old token's grant for a
    /// full TTL. Nobody can take the key before it expires (tick 15 with the CI
    /// bounds), and a waiter's next attempt falls up to 1.5 retry intervals later: it
    /// holds at tick 16 at the latest, and the check asks at ticks before the
    /// horizon. With the CI horizon of 14 that is the path (g) reports; the key is
    /// not stuck, the horizon ended first. With two faults, (g) holds at 14 ticks
    /// (the CI run).
    pub const fn liveness_horizon(self) -> u8 {
        if self.faults < 3 {
            return self.horizon;
        }
        let needed = self
            .fault_window
            .saturating_add(self.late_ticks)
            .saturating_add(TTL_TICKS as u8)
            .saturating_add(2);
        if needed > self.horizon {
            needed
        } else {
            self.horizon
        }
    }

    /// `base`, with any of `LEASEHOLD_MODEL_{CLIENTS,HORIZON,FAULT_WINDOW,FAULTS,
    /// PAUSE,LATE,CAPACITY,RELEASES,GRANT_MAX}` set in the environment overriding it.
    /// Without `LEASEHOLD_MODEL_HORIZON`, the horizon is the one liveness needs for
    /// the fault count ([`liveness_horizon`](Self::liveness_horizon)).
    pub fn from_env(base: Params) -> Result<Params, String> {
        fn var(name: &str, default: u8) -> Result<u8, String> {
            match std::env::var(name) {
                Ok(text) => text
                    .parse()
                    .map_err(|e| format!("{name}={text:?} is not a number 0-255: {e}")),
                Err(_) => Ok(default),
            }
        }
        let mut p = Params {
            clients: var("LEASEHOLD_MODEL_CLIENTS", base.clients)?,
            horizon: var("LEASEHOLD_MODEL_HORIZON", base.horizon)?,
            fault_window: var("LEASEHOLD_MODEL_FAULT_WINDOW", base.fault_window)?,
            faults: var("LEASEHOLD_MODEL_FAULTS", base.faults)?,
            pause_ticks: var("LEASEHOLD_MODEL_PAUSE", base.pause_ticks)?,
            late_ticks: var("LEASEHOLD_MODEL_LATE", base.late_ticks)?,
            capacity: var("LEASEHOLD_MODEL_CAPACITY", base.capacity)?,
            releases: var("LEASEHOLD_MODEL_RELEASES", base.releases)?,
            grant_max: var("LEASEHOLD_MODEL_GRANT_MAX", base.grant_max)?,
        };
        if std::env::var_os("LEASEHOLD_MODEL_HORIZON").is_none() {
            p.horizon = p.liveness_horizon();
        }
        if !(1..=8).contains(&p.clients) {
            return Err(format!("clients must be 1 to 8, not {}", p.clients));
        }
        if p.fault_window >= p.horizon {
            return Err("the fault window must end before the horizon".into());
        }
        if p.grant_max != 0 && !(6..=20).contains(&p.grant_max) {
            return Err("grant_max must be 0 (both 9 and 6) or 6 to 20 ticks".into());
        }
        Ok(p)
    }
}
