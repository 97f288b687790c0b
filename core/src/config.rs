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
    fail_closed: bool,
}

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
                fail_closed: false,
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
        self.fail_closed
    }

    /// The local safe deadline of a grant of `granted` for a request sent at `sent`:
    /// `sent + granted − drift(granted) − margin` (DESIGN rule 1).
    ///
    /// The service started its TTL no earlier than `sent`, so its expiry is at least
    /// `sent + granted` on its clock; taking the drift bound and the margin off makes it
    /// a moment this clock reaches no later than the service's expiry. `None` when the
    /// grant is too short to leave anything.
    pub const fn safe_deadline(&self, sent: Instant, granted: Duration) -> Option<Instant> {
        let cut = granted.ppm_ceil(self.drift_ppm).saturating_add(self.margin);
        match granted.checked_sub(cut) {
            Some(usable) if !usable.is_zero() => Some(sent.saturating_add(usable)),
            _ => None,
        }
    }
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
        self.config.fail_closed = value;
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
        let window = c
            .ttl
            .saturating_sub(c.ttl.ppm_ceil(c.drift_ppm))
            .saturating_sub(c.margin);
        if c.renew_interval.as_micros() >= window.as_micros() {
            return Err(ConfigError::RenewIntervalNotBelowSafeWindow);
        }
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
}
