//! What the caller tells the suite about the service under test.

use leasehold::Duration;

/// The service's limits, which the clauses adapt to (TTLs it can represent, how late
/// it expires keys, whether it can watch).
///
/// Start from [`Capabilities::new`] and change the fields that differ:
///
/// ```
/// use leasehold::Duration;
/// use leasehold_conformance::Capabilities;
///
/// // etcd: whole-second leases, a minimum of 1 s, expiry checked every 500 ms.
/// let mut etcd = Capabilities::new(Duration::from_secs(1));
/// etcd.granularity = Duration::from_secs(1);
/// etcd.min_ttl = Duration::from_secs(1);
/// etcd.expiry_slack = Duration::from_millis(1_500);
/// etcd.tolerance = Duration::from_millis(300);
/// etcd.revocation_watch = true;
/// etcd.holder_watch = true;
/// assert!(etcd.check().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The TTL the clauses ask for. Clauses that wait out a TTL wait about this long
    /// (twice, for the renewal clause), so keep it short on real servers. It must be
    /// at least [`min_ttl`](Self::min_ttl) and a multiple of
    /// [`granularity`](Self::granularity): the service must then grant it exactly.
    pub ttl: Duration,
    /// The shortest TTL the service applies as asked (etcd: its minimum lease TTL).
    pub min_ttl: Duration,
    /// TTLs the service applies are multiples of this (Redis: 1 ms; etcd: 1 s).
    pub granularity: Duration,
    /// How long after a key's expiry the service may still report it held: its own
    /// expiry lag (etcd revokes expired leases on a 500 ms tick, through raft; Redis
    /// keeps a key through the millisecond its expiry falls in, see
    /// [`Capabilities::redis`]). Zero on a virtual clock.
    pub expiry_slack: Duration,
    /// How far the service's handling of a request may lie from its send on the test's
    /// clock (the network, scheduling, a loaded machine), and how much more than its
    /// granularity the remaining time it reports may be rounded down. The timing
    /// clauses hold a service to the TTL it reports, on its own time base: a grant or
    /// renewal of TTL t sent at s turns every contender away whose request is sent
    /// before s + t − `tolerance`, and reports a remaining time no shorter than what is
    /// left of s + t, less `tolerance` and the granularity. At most two fifths of
    /// [`ttl`](Self::ttl) (so a service that applies 60 % of the TTL it reports is
    /// always caught) and more than zero (a contender sent exactly at s + t may meet
    /// a service that expired the key at s + t). 1 ms on a virtual clock.
    pub tolerance: Duration,
    /// Every call must answer within this; a call that does not breaks the clause
    /// ("no call may wait forever"). On tokio's paused clock this costs no real time.
    pub request_timeout: Duration,
    /// The service's [`revoked`](leasehold_driver::LocalLockService::revoked)
    /// completes when a grant is gone (an etcd watch). Without it the suite only
    /// checks that `revoked` never completes while the grant stands.
    pub revocation_watch: bool,
    /// The service's [`holder_changed`](leasehold_driver::LocalLockService::holder_changed)
    /// completes on every change of a key's holder (an etcd watch). Without it the
    /// suite only checks that it never completes while the holder stays the same.
    pub holder_watch: bool,
}

impl Capabilities {
    /// A service that applies any TTL to the millisecond, expires on time, cannot
    /// watch, and answers within 5 s, timed on a virtual clock (1 ms of
    /// [`tolerance`](Self::tolerance)); the clauses ask for `ttl`.
    pub const fn new(ttl: Duration) -> Capabilities {
        Capabilities {
            ttl,
            min_ttl: Duration::from_millis(1),
            granularity: Duration::from_millis(1),
            expiry_slack: Duration::ZERO,
            tolerance: Duration::from_millis(1),
            request_timeout: Duration::from_secs(5),
            revocation_watch: false,
            holder_watch: false,
        }
    }

    /// Redis (`PX`/`PEXPIRE` in milliseconds, expired on access): as [`new`](Self::new)
    /// with 1 ms of expiry slack. Redis counts a key expired only once its millisecond
    /// clock is *past* the expiry, so a request handled in the expiry's own millisecond
    /// still finds the key (`PTTL` 0). That is the safe side for a lease (contenders
    /// wait a little longer, never less), but a clause that waits exactly the TTL can
    /// land in that millisecond.
    ///
    /// Timed on real time over loopback: a third of `ttl` of
    /// [`tolerance`](Self::tolerance) (100 ms of a 300 ms TTL), so a Redis that applied
    /// two thirds of what it reports would be caught, and a request handled up to a
    /// third of the TTL after its send, on a loaded machine, would not fail a healthy
    /// one.
    pub const fn redis(ttl: Duration) -> Capabilities {
        let mut caps = Capabilities::new(ttl);
        caps.expiry_slack = Duration::from_millis(1);
        caps.tolerance = Duration::from_micros(ttl.as_micros() / 3);
        caps
    }

    /// PostgreSQL (`leasehold-postgres`: a row is held while its expiry is after the
    /// server's `clock_timestamp()`, to the microsecond): as [`new`](Self::new), timed
    /// on real time over loopback, so with a third of `ttl` of
    /// [`tolerance`](Self::tolerance) as for [`redis`](Self::redis); no expiry slack.
    pub const fn postgres(ttl: Duration) -> Capabilities {
        let mut caps = Capabilities::new(ttl);
        caps.tolerance = Duration::from_micros(ttl.as_micros() / 3);
        caps
    }

    /// Whether the fields fit together; the reason if not.
    pub fn check(&self) -> Result<(), String> {
        if self.granularity.is_zero() {
            return Err("granularity is zero".into());
        }
        if self.ttl < self.min_ttl {
            return Err(format!(
                "ttl {:?} is below min_ttl {:?}",
                std_of(self.ttl),
                std_of(self.min_ttl)
            ));
        }
        if self.ttl.is_zero() || self.ttl.as_micros() % self.granularity.as_micros() != 0 {
            return Err(format!(
                "ttl {:?} is not a positive multiple of the granularity {:?}",
                std_of(self.ttl),
                std_of(self.granularity)
            ));
        }
        if self.tolerance.is_zero() || self.tolerance.saturating_mul(5) > self.ttl.saturating_mul(2)
        {
            return Err(format!(
                "tolerance {:?} is not more than zero and at most two fifths of the ttl {:?}",
                std_of(self.tolerance),
                std_of(self.ttl)
            ));
        }
        if self.request_timeout.is_zero() {
            return Err("request_timeout is zero".into());
        }
        Ok(())
    }
}

/// The std form, for tokio's timers and for messages (`Debug` prints `1.5s`).
pub(crate) fn std_of(d: Duration) -> std::time::Duration {
    std::time::Duration::from_micros(d.as_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_rejects_ttls_the_service_cannot_apply() {
        let ms = Duration::from_millis;
        assert!(Capabilities::new(ms(300)).check().is_ok());
        let mut whole_seconds = Capabilities::new(ms(1_500));
        whole_seconds.granularity = Duration::from_secs(1);
        assert!(whole_seconds.check().unwrap_err().contains("multiple"));
        let mut too_short = Capabilities::new(ms(500));
        too_short.min_ttl = Duration::from_secs(1);
        assert!(too_short.check().unwrap_err().contains("below min_ttl"));
        assert!(Capabilities::new(Duration::ZERO).check().is_err());
        let mut loose = Capabilities::new(ms(300));
        loose.tolerance = ms(121);
        assert!(loose.check().unwrap_err().contains("two fifths"));
        loose.tolerance = Duration::ZERO;
        assert!(loose.check().is_err());
        assert!(Capabilities::redis(ms(300)).check().is_ok());
        assert_eq!(Capabilities::redis(ms(300)).tolerance, ms(100));
    }
}
