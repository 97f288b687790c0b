//! Services that break the timing contract on purpose, so that each backend's tests can
//! show that the timing clauses catch the breach on that very backend (its clock, its
//! granularity, its expiry lag), not only on the in-memory service.

use std::collections::HashMap;
use std::sync::Mutex;

use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_driver::LocalLockService;

use crate::caps::std_of;
use crate::clauses::expiry::the_ttl_is_hard;
use crate::clauses::renew::a_renewal_holds_for_the_ttl_it_reports;
use crate::{Capabilities, Verdict};

/// Which part of the timing contract an [`EarlyExpiry`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breach {
    /// A grant applies less than the TTL it reports (55 % of it or less, as little as
    /// the clause can tell apart from the service's expiry slack); contenders are
    /// told the remaining time of the TTL reported.
    ShortGrants,
    /// A renewal applies the TTL asked but reports more (twice as much, or more where
    /// the service's expiry slack would hide that); contenders are told the remaining
    /// time of the TTL reported.
    OverstatedRenewals,
}

/// A real service wrapped so that it breaks the timing contract ([`Breach`]) and hides
/// it from every other check: the remaining time it reports is the one of the TTL it
/// reported, so only the wait for the TTL itself can tell.
pub struct EarlyExpiry<'a, S> {
    inner: &'a S,
    breach: Breach,
    caps: Capabilities,
    /// Per key: the grant's fence, and how much longer than the TTL applied it claims.
    claimed: Mutex<HashMap<String, (Fence, Duration)>>,
}

impl<'a, S: LocalLockService> EarlyExpiry<'a, S> {
    /// `inner`, breaking `breach`, for the clauses run with `caps`.
    pub fn new(inner: &'a S, breach: Breach, caps: &Capabilities) -> Self {
        EarlyExpiry {
            inner,
            breach,
            caps: *caps,
            claimed: Mutex::new(HashMap::new()),
        }
    }

    /// The TTL a short grant applies instead of `ttl`: 55 % of it at most, and short
    /// enough that the key is gone, on a service with `caps`, before the clause's
    /// contender asks a tolerance before `ttl` ends.
    ///
    /// # Panics
    ///
    /// When no TTL the service can apply is that short: ask for a longer `ttl`.
    pub fn short_ttl(caps: &Capabilities, ttl: Duration) -> Duration {
        let hidden = ttl
            .saturating_sub(caps.tolerance.saturating_mul(2))
            .saturating_sub(caps.expiry_slack);
        let most = Duration::from_micros(ttl.as_micros() / 20 * 11).min(hidden);
        let g = caps.granularity.as_micros().max(1);
        let applied = Duration::from_micros(most.as_micros() / g * g);
        assert!(
            !applied.is_zero() && applied >= caps.min_ttl,
            "a TTL of {:?} leaves no shorter TTL the service applies that the clause could \
             tell apart from its slack {:?} and tolerance {:?}: use a longer ttl",
            std_of(ttl),
            std_of(caps.expiry_slack),
            std_of(caps.tolerance)
        );
        applied
    }

    /// How much more than the `r` it applied an overstated renewal reports.
    fn overstated_by(&self, r: Duration) -> Duration {
        let hidden = self
            .caps
            .expiry_slack
            .saturating_add(self.caps.tolerance.saturating_mul(2))
            .saturating_add(self.caps.granularity);
        r.max(hidden)
    }

    fn claim(&self, key: &str, claim: Option<(Fence, Duration)>) {
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        match claim {
            Some(claim) => claimed.insert(key.to_owned(), claim),
            None => claimed.remove(key),
        };
    }

    /// `holder` as the breach tells it: the remaining time of the TTL it reported.
    fn told(&self, key: &str, holder: Holder) -> Holder {
        let claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        match claimed.get(key) {
            Some(&(fence, more)) if fence == holder.fence => Holder {
                remaining: holder.remaining.saturating_add(more),
                ..holder
            },
            _ => holder,
        }
    }
}

impl<S: LocalLockService> LocalLockService for EarlyExpiry<'_, S> {
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        if self.breach != Breach::ShortGrants {
            return match self.inner.acquire(key, token, identity, ttl).await {
                AcquireOutcome::HeldByAnother(h) => {
                    AcquireOutcome::HeldByAnother(self.told(key, h))
                }
                other => other,
            };
        }
        let applied = Self::short_ttl(&self.caps, ttl);
        match self.inner.acquire(key, token, identity, applied).await {
            AcquireOutcome::Granted { fence, ttl: g } if g == applied => {
                self.claim(key, Some((fence, ttl.saturating_sub(applied))));
                AcquireOutcome::Granted { fence, ttl }
            }
            AcquireOutcome::HeldByAnother(h) => AcquireOutcome::HeldByAnother(self.told(key, h)),
            other => other,
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        match self.inner.renew(key, token, fence, ttl).await {
            RenewOutcome::Renewed { ttl: r } if self.breach == Breach::OverstatedRenewals => {
                let more = self.overstated_by(r);
                self.claim(key, Some((fence, more)));
                RenewOutcome::Renewed {
                    ttl: r.saturating_add(more),
                }
            }
            RenewOutcome::Renewed { ttl: r } => {
                self.claim(key, None);
                RenewOutcome::Renewed { ttl: r }
            }
            other => other,
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        let outcome = self.inner.release(key, token).await;
        if outcome == ReleaseOutcome::Released {
            self.claim(key, None);
        }
        outcome
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        match self.inner.holder(key).await {
            HolderOutcome::Held(h) => HolderOutcome::Held(self.told(key, h)),
            other => other,
        }
    }

    async fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) {
        self.inner.revoked(key, token, fence).await;
    }
}

/// Runs [`the_ttl_is_hard`] against `s` made to grant less than it reports
/// ([`Breach::ShortGrants`]) and panics unless the clause fails at its wait for the
/// TTL (its contender a tolerance before the end is granted). A whole-second service
/// needs a longer TTL in `caps` to apply less of it ([`EarlyExpiry::short_ttl`]
/// panics otherwise).
///
/// # Panics
///
/// When the breach is not caught, or caught by another check than the wait.
pub async fn short_grants_are_caught<S: LocalLockService>(s: &S, caps: &Capabilities) {
    let short = EarlyExpiry::new(s, Breach::ShortGrants, caps);
    let verdict = the_ttl_is_hard(&short, caps).await;
    caught_at_the_wait(verdict, "the_ttl_is_hard", Breach::ShortGrants);
}

/// Runs [`a_renewal_holds_for_the_ttl_it_reports`] against `s` made to report more
/// than its renewals apply ([`Breach::OverstatedRenewals`]) and panics unless the
/// clause fails at its wait for the TTL.
///
/// # Panics
///
/// When the breach is not caught, or caught by another check than the wait.
pub async fn overstated_renewals_are_caught<S: LocalLockService>(s: &S, caps: &Capabilities) {
    let overstated = EarlyExpiry::new(s, Breach::OverstatedRenewals, caps);
    let verdict = a_renewal_holds_for_the_ttl_it_reports(&overstated, caps).await;
    caught_at_the_wait(
        verdict,
        "a_renewal_holds_for_the_ttl_it_reports",
        Breach::OverstatedRenewals,
    );
}

/// [`short_grants_are_caught`] with `grants`, then [`overstated_renewals_are_caught`]
/// with `renewals` (one after the other: a service may take one request at a time).
///
/// # Panics
///
/// When a breach is not caught, or caught by another check than the wait.
pub async fn the_timing_clauses_catch_early_expiry<S: LocalLockService>(
    s: &S,
    grants: &Capabilities,
    renewals: &Capabilities,
) {
    short_grants_are_caught(s, grants).await;
    overstated_renewals_are_caught(s, renewals).await;
}

fn caught_at_the_wait(verdict: Verdict, clause: &str, breach: Breach) {
    let violation = match verdict {
        Ok(()) => panic!("{breach:?} was not caught by `{clause}`: the clause passed"),
        Err(violation) => violation,
    };
    eprintln!("{breach:?}: {violation}");
    assert!(
        violation.clause == clause
            && violation.detail.contains("a tolerance before")
            && violation.detail.contains("got Granted"),
        "{breach:?} was not caught by `{clause}` at its wait for the TTL: {violation}"
    );
}
