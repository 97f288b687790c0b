//! The lease configuration in std's [`Duration`]: [`config`] starts a
//! [`ConfigBuilder`] whose every setter takes `std::time::Duration`, and builds the
//! core's [`Config`]. The core (`no_std`) keeps its own microsecond duration
//! ([`leasehold::Duration`]) for firmware; a tokio user never has to name it.

use std::time::Duration;

use leasehold::{Config, ConfigError};

/// Starts a lease configuration for leases of `ttl`, with the core's defaults
/// (renew every `ttl / 3`, request timeout `ttl / 10`, retry interval and margin
/// `ttl / 20`, drift 0.1 %, fail open; see [`Config::builder`]).
///
/// Durations are kept in whole microseconds: a finer part is rounded down, and
/// anything beyond `u64::MAX` µs (about 584,000 years) is that.
///
/// ```
/// use std::time::Duration;
///
/// let config = leasehold_tokio::config(Duration::from_secs(3))
///     .request_timeout(Duration::from_millis(200))
///     .build()
///     .unwrap();
/// assert_eq!(config.renew_interval(), Duration::from_secs(1).into());
/// ```
pub const fn config(ttl: Duration) -> ConfigBuilder {
    ConfigBuilder(Config::builder(micros(ttl)))
}

/// Collects a [`Config`] from std durations; made by [`config`]. The same settings,
/// defaults and rules as the core's builder ([`leasehold::ConfigBuilder`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigBuilder(leasehold::ConfigBuilder);

impl ConfigBuilder {
    /// Time from a grant's send time to the next renewal (default `ttl / 3`).
    pub const fn renew_interval(self, value: Duration) -> Self {
        ConfigBuilder(self.0.renew_interval(micros(value)))
    }
    /// Bound on one request (default `ttl / 10`).
    pub const fn request_timeout(self, value: Duration) -> Self {
        ConfigBuilder(self.0.request_timeout(micros(value)))
    }
    /// Wait before a retry (default `ttl / 20`).
    pub const fn retry_interval(self, value: Duration) -> Self {
        ConfigBuilder(self.0.retry_interval(micros(value)))
    }
    /// Slack subtracted from every safe deadline (default `ttl / 20`).
    pub const fn margin(self, value: Duration) -> Self {
        ConfigBuilder(self.0.margin(micros(value)))
    }
    /// Clock-rate bound in parts per million (default 1,000).
    pub const fn drift_ppm(self, value: u32) -> Self {
        ConfigBuilder(self.0.drift_ppm(value))
    }
    /// Pause writes while a renewal's outcome is unknown (default `false`).
    pub const fn fail_closed(self, value: bool) -> Self {
        ConfigBuilder(self.0.fail_closed(value))
    }
    /// Checks every rule and returns the configuration, or the first rule broken.
    pub const fn build(self) -> Result<Config, ConfigError> {
        self.0.build()
    }
}

/// The core's builder, for code that already has one.
impl From<leasehold::ConfigBuilder> for ConfigBuilder {
    fn from(builder: leasehold::ConfigBuilder) -> ConfigBuilder {
        ConfigBuilder(builder)
    }
}

/// `d` in the core's microseconds, rounded down and saturating, like the core's
/// `From<std::time::Duration>` (which is not `const`).
const fn micros(d: Duration) -> leasehold::Duration {
    let micros = d.as_micros();
    leasehold::Duration::from_micros(if micros > u64::MAX as u128 {
        u64::MAX
    } else {
        micros as u64
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasehold::Config;

    /// The std entry point builds exactly what the core's builder builds.
    #[test]
    fn the_std_builder_builds_the_cores_config() {
        let ms = Duration::from_millis;
        let core = leasehold::Duration::from_millis;
        let ours = super::config(ms(3_000))
            .renew_interval(ms(900))
            .request_timeout(ms(200))
            .retry_interval(ms(100))
            .margin(ms(120))
            .drift_ppm(20_000)
            .fail_closed(true)
            .build();
        let theirs = Config::builder(core(3_000))
            .renew_interval(core(900))
            .request_timeout(core(200))
            .retry_interval(core(100))
            .margin(core(120))
            .drift_ppm(20_000)
            .fail_closed(true)
            .build();
        assert_eq!(ours, theirs);
        // Rounded down to whole microseconds and saturating, like the core's `From`.
        for d in [Duration::from_nanos(1_999), Duration::MAX, Duration::ZERO] {
            assert_eq!(super::micros(d), leasehold::Duration::from(d));
        }
    }

    /// `const`: usable in a `static`, like the core's.
    #[test]
    fn a_config_can_be_built_in_a_const() {
        const CONFIG: Result<Config, leasehold::ConfigError> =
            super::config(Duration::from_secs(3)).build();
        assert!(CONFIG.is_ok());
    }
}
