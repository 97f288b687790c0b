//! Sizing the TTL: `T > work_p99 + renew_rtt_p99 + pause_budget + margin`.

use core::fmt;

use crate::Duration;

/// What a lease of TTL `T` must outlast, from measured percentiles.
///
/// Every term eats into the lease: a work slice that started under a valid lease, the
/// renewal's round trip, a stop-the-world pause (GC, flash erase, a preempting
/// interrupt storm), and a safety margin. If they add up to `T` or more, a holder can
/// be mid-write when the service hands the lock to someone else.
///
/// A typical service — work p99 200 ms, renew RTT p99 20 ms, GC budget 150 ms —
/// with a 30 ms margin need `T > 400 ms`. Taking 1.5× that, `T = 600 ms`, gives a
/// heartbeat of `T/3 = 200 ms`:
///
/// ```
/// use leasehold::{Budget, BudgetPart, Config, Duration};
///
/// let ms = Duration::from_millis;
/// let budget = Budget {
///     work_p99: ms(200),
///     renew_rtt_p99: ms(20),
///     pause_budget: ms(150),
///     margin: ms(30),
/// };
/// assert_eq!(budget.total(), ms(400));
///
/// // 400 ms is not enough: T must be strictly greater. The margin is what tips it.
/// let err = budget.check(ms(400)).unwrap_err();
/// assert_eq!(err.failing_term, BudgetPart::Margin);
///
/// let ttl = ms(600);
/// budget.check(ttl).unwrap();
/// let config = Config::builder(ttl).margin(budget.margin).build().unwrap();
/// assert_eq!(config.renew_interval(), ms(200)); // the T/3 heartbeat
///
/// // A 400 ms stop-the-world pause is far outside the 150 ms pause budget: a 300 ms
/// // lease cannot cover even the work and the pause.
/// let err = budget.check(ms(300)).unwrap_err();
/// assert_eq!(err.failing_term, BudgetPart::PauseBudget);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Budget {
    /// p99 duration of one unit of work done under the lease.
    pub work_p99: Duration,
    /// p99 round trip of a renewal to the lock service.
    pub renew_rtt_p99: Duration,
    /// Longest stop-the-world pause the holder must survive (GC, flash erase…).
    pub pause_budget: Duration,
    /// Extra safety margin.
    pub margin: Duration,
}

/// One term of the [`Budget`] inequality.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BudgetPart {
    /// [`Budget::work_p99`].
    WorkP99,
    /// [`Budget::renew_rtt_p99`].
    RenewRttP99,
    /// [`Budget::pause_budget`].
    PauseBudget,
    /// [`Budget::margin`].
    Margin,
}

/// The TTL does not cover the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BudgetError {
    /// The TTL that was checked.
    pub ttl: Duration,
    /// The sum of all terms; `ttl` must be strictly greater.
    pub required: Duration,
    /// The term at which the running sum (in the order work, RTT, pause, margin) first
    /// reaches `ttl`: the one that does not fit.
    pub failing_term: BudgetPart,
}

impl Budget {
    /// `work_p99 + renew_rtt_p99 + pause_budget + margin`, saturating.
    pub const fn total(&self) -> Duration {
        self.work_p99
            .saturating_add(self.renew_rtt_p99)
            .saturating_add(self.pause_budget)
            .saturating_add(self.margin)
    }

    /// Checks `ttl > total()`; on failure names the term that does not fit.
    pub fn check(&self, ttl: Duration) -> Result<(), BudgetError> {
        // The running sum, in the order of the terms.
        let work = self.work_p99;
        let rtt = work.saturating_add(self.renew_rtt_p99);
        let pause = rtt.saturating_add(self.pause_budget);
        let required = pause.saturating_add(self.margin);
        let failing_term = if work >= ttl {
            BudgetPart::WorkP99
        } else if rtt >= ttl {
            BudgetPart::RenewRttP99
        } else if pause >= ttl {
            BudgetPart::PauseBudget
        } else if required >= ttl {
            BudgetPart::Margin
        } else {
            return Ok(());
        };
        Err(BudgetError {
            ttl,
            required,
            failing_term,
        })
    }
}

impl fmt::Display for BudgetPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BudgetPart::WorkP99 => "work p99",
            BudgetPart::RenewRttP99 => "renew RTT p99",
            BudgetPart::PauseBudget => "pause budget",
            BudgetPart::Margin => "safety margin",
        })
    }
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ttl {} does not cover the budget of {}: it runs out at the {}",
            self.ttl, self.required, self.failing_term
        )
    }
}

impl core::error::Error for BudgetError {}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn each_term_can_be_the_one_that_fails() {
        let b = Budget {
            work_p99: ms(100),
            renew_rtt_p99: ms(10),
            pause_budget: ms(50),
            margin: ms(5),
        };
        let failing = |ttl| b.check(ms(ttl)).unwrap_err().failing_term;
        assert_eq!(failing(100), BudgetPart::WorkP99);
        assert_eq!(failing(110), BudgetPart::RenewRttP99);
        assert_eq!(failing(160), BudgetPart::PauseBudget);
        assert_eq!(failing(165), BudgetPart::Margin);
        assert_eq!(b.check(ms(166)), Ok(()));
        assert_eq!(b.check(ms(165)).unwrap_err().required, ms(165));
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let b = Budget {
            work_p99: Duration::MAX,
            renew_rtt_p99: Duration::MAX,
            ..Budget::default()
        };
        assert_eq!(b.total(), Duration::MAX);
        assert!(b.check(Duration::MAX).is_err());
    }
}
