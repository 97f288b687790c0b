//! Lease timing, validated once so the state machine never meets a nonsensical value.

use core::fmt;

use crate::{Duration, Instant};

/// Validated timing for a [`Lease`](crate::Lease).
///
/// Built with [`Config::builder`]; every setter and [`ConfigBuilder::build`] are
/// `const`, so firmware can check its configuration at compile time:
///
/// ```
/// use leasehold::{Config, Duration};
///
/// const CONFIG: Config = match Config::builder(Duration::from_secs(3))
///     .drift_ppm(20_000) // an RC oscillator, ±2 %
///     .build()
/// {
///     Ok(config) => config,
///     Err(_) => panic!("invalid lease config"),
/// };
/// assert_eq!(CONFIG.renew_interval(), Duration::from_secs(1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    ttl: Duration,
    renew_interval: Duration,
    request_timeout: Duration,
    retry_interval: Duration,
    margin: Duration,
    drift_ppm: u32,
    /// Bits 0–30: `renew_interval / ttl` in units of 2^-31, rounded up, for grants
    /// of another TTL than asked (see [`Config::renew_interval_for`]). Bit 31:
    /// `fail_closed`. One word for both keeps a `Lease` within 128 bytes.
    packed: u32,
}

/// The `fail_closed` bit of `Config::packed`.
const FAIL_CLOSED: u32 = 1 << 31;

/// Collects [`Config`] values; see [`Config::builder`] for the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConfigBuilder {
    config: Config,
}

/// A [`Config`] value that cannot work. Each rule has its own variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ConfigError {
    /// `ttl` is zero.
    ZeroTtl,
    /// `renew_interval` is zero: the driver would renew in a busy loop.
    ZeroRenewInterval,
    /// `renew_interval >= ttl`: the lease would expire before the first renewal.
    RenewIntervalNotBelowTtl,
    /// `request_timeout` is zero: every request would time out at once.
    ZeroRequestTimeout,
    /// `request_timeout >= ttl`: a single slow answer could outlast the lease.
    RequestTimeoutNotBelowTtl,
    /// `retry_interval` is zero: a failing service would be retried in a busy loop.
    ZeroRetryInterval,
    /// `retry_interval >= ttl`: no retry could ever land inside the lease.
    RetryIntervalNotBelowTtl,
    /// `margin >= ttl`: nothing would be left of the lease.
    MarginNotBelowTtl,
    /// `drift_ppm >= 1_000_000`: a clock-rate bound of 100 % or more bounds nothing.
    DriftNotBelowOneMillionPpm,
    /// `renew_interval >= ttl - drift(ttl) - margin`: the local safe deadline would
    /// pass before the first renewal is even sent.
    RenewIntervalNotBelowSafeWindow,
    /// `max(renew_interval, request_timeout) + request_timeout >= ttl - drift(ttl) -
    /// margin`: a renewal could still be waiting for its answer when the safe deadline
    /// passes, so answers that each arrive inside their own timeout could still lose
    /// the lease. A renewal goes out `renew_interval` after the send of the one that
    /// earned the deadline, but never before that one was answered, which can take a
    /// whole request timeout.
    RenewalNotAnsweredInsideSafeWindow,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigError::ZeroTtl => "ttl must be greater than zero",
            ConfigError::ZeroRenewInterval => "renew interval must be greater than zero",
            ConfigError::RenewIntervalNotBelowTtl => "renew interval must be shorter than ttl",
            ConfigError::ZeroRequestTimeout => "request timeout must be greater than zero",
            ConfigError::RequestTimeoutNotBelowTtl => "request timeout must be shorter than ttl",
            ConfigError::ZeroRetryInterval => "retry interval must be greater than zero",
            ConfigError::RetryIntervalNotBelowTtl => "retry interval must be shorter than ttl",
            ConfigError::MarginNotBelowTtl => "safety margin must be shorter than ttl",
            ConfigError::DriftNotBelowOneMillionPpm => {
                "clock drift bound must be below 1,000,000 ppm (100 %)"
            }
            ConfigError::RenewIntervalNotBelowSafeWindow => {
                "renew interval must be shorter than ttl minus drift minus margin"
            }
            ConfigError::RenewalNotAnsweredInsideSafeWindow => {
                "the longer of renew interval and request timeout, plus request timeout, must be shorter than ttl minus drift minus margin"
            }
        })
    }
}

impl core::error::Error for ConfigError {}

impl Config {
    /// Starts a configuration for leases of `ttl`, with these defaults:
    ///
    /// | setting | default | why |
    /// |---|---|---|
    /// | `renew_interval` | `ttl / 3` | three chances to renew before expiry |
    /// | `request_timeout` | `ttl / 10` | a slow answer is given up in time to retry twice |
    /// | `retry_interval` | `ttl / 20` | retry a blip quickly, without hammering |
    /// | `margin` | `ttl / 20` | slack for scheduling and the service's expiry granularity |
    /// | `drift_ppm` | `1_000` (0.1 %) | crystal oscillators; set ~20,000 for RC clocks |
    /// | `fail_closed` | `false` | writes continue while a renewal is retried |
    pub const fn builder(ttl: Duration) -> ConfigBuilder {
        const fn div(ttl: Duration, n: u64) -> Duration {
            match ttl.checked_div(n) {
                Some(d) => d,
                None => Duration::ZERO,
            }
        }
        ConfigBuilder {
            config: Config {
                ttl,
                renew_interval: div(ttl, 3),
                request_timeout: div(ttl, 10),
                retry_interval: div(ttl, 20),
                margin: div(ttl, 20),
                drift_ppm: 1_000,
                packed: 0,
            },
        }
    }

    /// The TTL requested from the lock service.
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }
    /// Time from a grant's send time to the next renewal.
    pub const fn renew_interval(&self) -> Duration {
        self.renew_interval
    }
    /// How long a request may stay unanswered before it counts as indeterminate.
    pub const fn request_timeout(&self) -> Duration {
        self.request_timeout
    }
    /// Wait before retrying a failed acquire or an indeterminate renewal.
    pub const fn retry_interval(&self) -> Duration {
        self.retry_interval
    }
    /// How long a client that released a key lets pass before it contends for that
    /// key again: two retry intervals. A waiter retries at most one and a half retry
    /// intervals apart, so every waiter's next attempt comes before the releaser's,
    /// with half an interval to spare for round trips and timer rounding. Without
    /// it, a holder that releases and acquires again at once finds the key free
    /// while the waiters sleep, and wins every time (see `leasehold::rules`,
    /// "Acquiring").
    pub const fn release_backoff(&self) -> Duration {
        self.retry_interval.saturating_mul(2)
    }
    /// Subtracted from every safe deadline.
    pub const fn margin(&self) -> Duration {
        self.margin
    }
    /// Bound on how much faster or slower this clock runs than the service's.
    pub const fn drift_ppm(&self) -> u32 {
        self.drift_ppm
    }
    /// Whether writes pause while a renewal's outcome is unknown.
    pub const fn fail_closed(&self) -> bool {
        self.packed & FAIL_CLOSED != 0
    }

    /// The local safe deadline of a grant of `granted` for a request sent at `sent`:
    /// `sent + granted − drift(granted) − margin` ([rule 1](crate::rules)).
    ///
    /// The service started its TTL no earlier than `sent`, so its expiry is at least
    /// `sent + granted` on its clock; taking the drift bound and the margin off makes it
    /// a moment this clock reaches no later than the service's expiry. `None` when the
    /// grant is too short to leave anything.
    pub const fn safe_deadline(&self, sent: Instant, granted: Duration) -> Option<Instant> {
        let usable = self.safe_window(granted);
        if usable.is_zero() {
            None
        } else {
            Some(sent.saturating_add(usable))
        }
    }

    /// `granted − drift(granted) − margin`, zero when nothing is left: how long after
    /// its send time a grant of `granted` may be used. The one place for the safe
    /// deadlines, the grants accepted and the configuration's own check.
    const fn safe_window(&self, granted: Duration) -> Duration {
        granted.saturating_sub(granted.ppm_ceil(self.drift_ppm).saturating_add(self.margin))
    }

    /// How long after a grant's send time its renewal is due, for a grant of
    /// `granted` (which the service may have made shorter or longer than
    /// [`ttl`](Self::ttl)): [`renew_interval`](Self::renew_interval) scaled by
    /// `granted / ttl`, so the cadence follows the granted TTL (every granted/3 by
    /// default). The share is kept to 31 bits, rounded up, and the product rounded
    /// down: for a grant under 2^31 µs (about 36 minutes), exact when the exact value
    /// is whole microseconds; always at most `1 + granted / 2^31` µs late (13 µs for a
    /// day-long TTL).
    pub const fn renew_interval_for(&self, granted: Duration) -> Duration {
        if granted.as_micros() == self.ttl.as_micros() {
            return self.renew_interval;
        }
        let g = granted.as_micros();
        let q = (self.packed & !FAIL_CLOSED) as u64;
        // g * q / 2^31 in two parts, so that no product overflows: q < 2^31.
        let high = (g >> FRACTION_BITS).saturating_mul(q);
        let low = ((g & FRACTION_MASK).wrapping_mul(q)) >> FRACTION_BITS;
        Duration::from_micros(high.saturating_add(low))
    }

    /// Whether a grant of `granted` can be held safely: its safe window
    /// (`granted − drift − margin`) must outlast a renewal cycle, the same inequality
    /// [`ConfigBuilder::build`] checks for the configured TTL. A grant that does not
    /// fit is refused
    /// ([`AcquireFailure::GrantTooShort`](crate::AcquireFailure::GrantTooShort)): the
    /// gate never opens for it.
    pub const fn accepts_grant(&self, granted: Duration) -> bool {
        let renew = self.renew_interval_for(granted);
        !renew.is_zero()
            && self.renewal_cycle(renew).as_micros() < self.safe_window(granted).as_micros()
    }

    /// The longest time from the send of a confirmed request to the answer of the
    /// renewal after it, when every answer comes inside its request timeout: the next
    /// renewal goes out `renew` after that send, or when that request is answered if
    /// that is later (one request in flight), and takes up to a request timeout
    /// itself.
    const fn renewal_cycle(&self, renew: Duration) -> Duration {
        let timeout = self.request_timeout;
        let next_send = if renew.as_micros() > timeout.as_micros() {
            renew
        } else {
            timeout
        };
        next_send.saturating_add(timeout)
    }
}

/// `renew_interval / ttl` is kept as a binary fraction of this many bits (bit 31 of
/// the word is `fail_closed`).
const FRACTION_BITS: u32 = 31;
const FRACTION_MASK: u64 = (1 << FRACTION_BITS) - 1;

/// `ceil(part / whole * 2^31)` for `part < whole` (at most `2^31 - 1`), by restoring
/// division: no 64-bit division routine (about 1 KiB of flash on a 32-bit MCU) and no
/// 128-bit product. Rounding up makes `g * q / 2^31`, rounded down, exact whenever the
/// exact share is a whole number of microseconds and `g` is below 2^31 µs (above it,
/// the share's rounding error times `g` can reach a microsecond or more).
const fn binary_fraction(part: u64, whole: u64) -> u32 {
    // Halve both until a doubled remainder cannot overflow; the ratio barely moves.
    let (mut part, mut whole) = (part, whole);
    while whole >= 1 << 62 {
        part >>= 1;
        whole >>= 1;
    }
    let mut rem = part;
    let mut q = 0u32;
    let mut bit = 0;
    while bit < FRACTION_BITS {
        rem <<= 1;
        q <<= 1;
        if rem >= whole {
            rem = rem.wrapping_sub(whole);
            q |= 1;
        }
        bit = bit.wrapping_add(1);
    }
    if rem != 0 && q < (1 << FRACTION_BITS) - 1 {
        q = q.wrapping_add(1);
    }
    q
}

impl ConfigBuilder {
    /// Time from a grant's send time to the next renewal (default `ttl / 3`).
    pub const fn renew_interval(mut self, value: Duration) -> Self {
        self.config.renew_interval = value;
        self
    }
    /// Bound on one request (default `ttl / 10`).
    pub const fn request_timeout(mut self, value: Duration) -> Self {
        self.config.request_timeout = value;
        self
    }
    /// Wait before a retry (default `ttl / 20`).
    pub const fn retry_interval(mut self, value: Duration) -> Self {
        self.config.retry_interval = value;
        self
    }
    /// Slack subtracted from every safe deadline (default `ttl / 20`).
    pub const fn margin(mut self, value: Duration) -> Self {
        self.config.margin = value;
        self
    }
    /// Clock-rate bound in parts per million (default 1,000).
    pub const fn drift_ppm(mut self, value: u32) -> Self {
        self.config.drift_ppm = value;
        self
    }
    /// Pause writes while a renewal's outcome is unknown (default `false`).
    pub const fn fail_closed(mut self, value: bool) -> Self {
        self.config.packed = if value {
            self.config.packed | FAIL_CLOSED
        } else {
            self.config.packed & !FAIL_CLOSED
        };
        self
    }

    /// Checks every rule and returns the configuration, or the first rule broken.
    pub const fn build(self) -> Result<Config, ConfigError> {
        let c = self.config;
        let ttl = c.ttl.as_micros();
        if ttl == 0 {
            return Err(ConfigError::ZeroTtl);
        }
        if c.renew_interval.is_zero() {
            return Err(ConfigError::ZeroRenewInterval);
        }
        if c.renew_interval.as_micros() >= ttl {
            return Err(ConfigError::RenewIntervalNotBelowTtl);
        }
        if c.request_timeout.is_zero() {
            return Err(ConfigError::ZeroRequestTimeout);
        }
        if c.request_timeout.as_micros() >= ttl {
            return Err(ConfigError::RequestTimeoutNotBelowTtl);
        }
        if c.retry_interval.is_zero() {
            return Err(ConfigError::ZeroRetryInterval);
        }
        if c.retry_interval.as_micros() >= ttl {
            return Err(ConfigError::RetryIntervalNotBelowTtl);
        }
        if c.margin.as_micros() >= ttl {
            return Err(ConfigError::MarginNotBelowTtl);
        }
        if c.drift_ppm >= 1_000_000 {
            return Err(ConfigError::DriftNotBelowOneMillionPpm);
        }
        let window = c.safe_window(c.ttl);
        if c.renew_interval.as_micros() >= window.as_micros() {
            return Err(ConfigError::RenewIntervalNotBelowSafeWindow);
        }
        if c.renewal_cycle(c.renew_interval).as_micros() >= window.as_micros() {
            return Err(ConfigError::RenewalNotAnsweredInsideSafeWindow);
        }
        let mut c = c;
        c.packed = (c.packed & FAIL_CLOSED) | binary_fraction(c.renew_interval.as_micros(), ttl);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn defaults_are_valid_and_renew_at_a_third() {
        let c = Config::builder(ms(600)).build().unwrap();
        assert_eq!(c.renew_interval(), ms(200));
        assert_eq!(c.request_timeout(), ms(60));
        assert_eq!(c.retry_interval(), ms(30));
        assert_eq!(c.margin(), ms(30));
        assert_eq!(c.drift_ppm(), 1_000);
        assert!(!c.fail_closed());
    }

    #[test]
    fn safe_deadline_subtracts_drift_and_margin_from_send_time() {
        let c = Config::builder(ms(10_000))
            .drift_ppm(10_000)
            .margin(ms(100))
            .build()
            .unwrap();
        // 10 s − 1 % (100 ms) − 100 ms, counted from the send time.
        assert_eq!(
            c.safe_deadline(Instant::from_millis(5), ms(10_000)),
            Some(Instant::from_millis(5 + 9_800))
        );
        assert_eq!(c.safe_deadline(Instant::ZERO, ms(100)), None);
        assert_eq!(c.safe_deadline(Instant::ZERO, Duration::ZERO), None);
    }

    #[test]
    fn the_renewal_cadence_follows_the_granted_ttl() {
        let c = Config::builder(ms(900)).build().unwrap();
        assert_eq!(c.renew_interval_for(ms(900)), ms(300));
        // A third of the grant: exact where that is whole microseconds, otherwise
        // late by at most 1 + g / 2^31 µs.
        assert_eq!(c.renew_interval_for(ms(300)), ms(100));
        assert_eq!(c.renew_interval_for(ms(3_000)), ms(1_000));
        for granted in [
            ms(450),
            Duration::from_micros(1_000_001),
            Duration::from_secs(86_400),
            Duration::MAX,
        ] {
            let third = granted.as_micros() / 3;
            let got = c.renew_interval_for(granted).as_micros();
            let slack = 1 + granted.as_micros() / (1 << 31);
            assert!(got >= third && got - third <= slack, "{granted:?}: {got}");
        }
    }

    #[test]
    fn a_grant_must_leave_room_for_one_renewal_and_its_timeout() {
        // T = 900 ms: margin 45, request timeout 90; a grant of g renews at g/3.
        let c = Config::builder(ms(900)).build().unwrap();
        assert!(c.accepts_grant(ms(900)));
        assert!(
            c.accepts_grant(ms(300)),
            "300/3 + 90 = 190 < 300 - 0.3 - 45"
        );
        assert!(
            !c.accepts_grant(ms(200)),
            "200/3 + 90 = 156.7 > 200 - 0.2 - 45"
        );
        assert!(!c.accepts_grant(Duration::ZERO));
        assert!(!c.accepts_grant(ms(40)));
    }

    #[test]
    fn the_configured_ttl_must_fit_its_own_renewal() {
        assert_eq!(
            Config::builder(ms(900)).request_timeout(ms(600)).build(),
            Err(ConfigError::RenewalNotAnsweredInsideSafeWindow)
        );
    }

    /// A request timeout longer than the renew interval paces the renewals: the next
    /// one waits for the answer to the one before. TTL 900 ms, renewals every 41 µs
    /// and a 652 ms timeout: a renewal answered after 651 ms earns a deadline 854 ms
    /// after its send, and the next one, sent then, may be answered 1,303 ms after it.
    #[test]
    fn a_timeout_longer_than_the_renew_interval_must_fit_twice() {
        let with = |renew: u64, timeout: u64| {
            Config::builder(ms(900))
                .renew_interval(Duration::from_micros(renew))
                .request_timeout(ms(timeout))
                .build()
        };
        assert_eq!(
            with(41, 652),
            Err(ConfigError::RenewalNotAnsweredInsideSafeWindow)
        );
        // The window is 900 − 0.9 (drift) − 45 (margin) = 854.1 ms.
        assert!(with(41, 427).is_ok());
        assert_eq!(
            with(41, 428),
            Err(ConfigError::RenewalNotAnsweredInsideSafeWindow)
        );
    }
}
