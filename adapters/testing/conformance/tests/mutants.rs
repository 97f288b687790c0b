//! The suite catches broken services: each test wraps `MemoryService` with one
//! deliberate breach of the contract and checks that the clause guarding it — named
//! in the violation — fails. A clause that passes a broken service would be a test
//! that cannot fail.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_conformance::{check_all, Capabilities};
use leasehold_driver::LockService;
use leasehold_tokio::memory::MemoryService;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// Renews whatever fence is presented, as long as the token holds the key.
    RenewIgnoresFence,
    /// Answers `Renewed` with 1 ms less than it applied (a `PTTL` read-back).
    RenewReportsLess,
    /// A renewal of a missing key grants it (`SET` instead of `PEXPIRE`).
    RenewRecreates,
    /// A renewal never moves the expiry earlier, but reports the TTL asked.
    RenewNeverShortens,
    /// Re-acquire by the holder's own token makes a new grant with a new fence.
    ReacquireNewFence,
    /// Anyone's release deletes the key.
    ReleaseIgnoresToken,
    /// Invalid keys are stored under an escaped name instead of refused.
    AcceptsInvalidKeys,
    /// Identities are cut to 32 bytes.
    TruncatesIdentity,
    /// Grants last twice as long as reported.
    LongerTtl,
    /// Contenders are told the holder has more time left than it was granted.
    OverstatesRemaining,
    /// The holder query never answers.
    HolderHangs,
    /// `revoked` completes at once.
    SpuriousRevocation,
    /// Renewals answer `Renewed` and change nothing.
    RenewDoesNotExtend,
    /// The holder's re-acquire answers `Granted` and changes nothing.
    ReacquireDoesNotExtend,
    /// A TTL it cannot apply to the millisecond is rounded up or down, by turns.
    MoodyRounding,
    /// Answers travel through one queue, like replies on a pipelined connection,
    /// and a dropped query leaves its answer in it for the next query to take.
    DesyncOnDrop,
}

struct Broken {
    inner: MemoryService,
    bug: Bug,
    replies: Mutex<VecDeque<HolderOutcome>>,
    turns: AtomicU64,
}

impl Broken {
    fn is(&self, bug: Bug) -> bool {
        self.bug == bug
    }
}

impl LockService for Broken {
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        let mut identity = *identity;
        let mut key = key.to_owned();
        if self.is(Bug::AcceptsInvalidKeys) && leasehold::check_key(&key).is_err() {
            key = format!("escaped:{}", key.len());
        }
        if self.is(Bug::TruncatesIdentity) {
            let text = identity.as_str();
            identity = Identity::lossy(text.get(..32).unwrap_or(text));
        }
        if self.is(Bug::ReacquireDoesNotExtend) {
            if let Some(grant) = self.inner.grant(&key).filter(|g| g.token == token) {
                return AcquireOutcome::Granted {
                    fence: grant.fence,
                    ttl,
                };
            }
        }
        if self.is(Bug::ReacquireNewFence) {
            let _ = self.inner.release(&key, token).await;
        }
        let mut ttl = ttl;
        if self.is(Bug::MoodyRounding) && ttl.as_micros() % 1_000 != 0 {
            let down = ttl.as_micros() / 1_000 * 1_000;
            let up = self.turns.fetch_add(1, Ordering::Relaxed) % 2;
            ttl = Duration::from_micros(down + up * 1_000);
        }
        let asked = if self.is(Bug::LongerTtl) {
            ttl.saturating_mul(2)
        } else {
            ttl
        };
        match self.inner.acquire(&key, token, &identity, asked).await {
            AcquireOutcome::Granted { fence, .. } if self.is(Bug::LongerTtl) => {
                AcquireOutcome::Granted { fence, ttl }
            }
            AcquireOutcome::HeldByAnother(holder) if self.is(Bug::OverstatesRemaining) => {
                AcquireOutcome::HeldByAnother(Holder {
                    remaining: holder.remaining.saturating_add(Duration::from_secs(1)),
                    ..holder
                })
            }
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
        let grant = self.inner.grant(key);
        let mut fence = fence;
        let mut applied = ttl;
        if self.is(Bug::RenewIgnoresFence) {
            if let Some(grant) = grant.filter(|g| g.token == token) {
                fence = grant.fence;
            }
        }
        if self.is(Bug::RenewDoesNotExtend)
            && grant.is_some_and(|g| g.token == token && g.fence == fence)
        {
            return RenewOutcome::Renewed { ttl };
        }
        if self.is(Bug::RenewRecreates) && grant.is_none() {
            return match self.inner.acquire(key, token, &Identity::EMPTY, ttl).await {
                AcquireOutcome::Granted { ttl, .. } => RenewOutcome::Renewed { ttl },
                _ => RenewOutcome::NotOwner,
            };
        }
        if self.is(Bug::RenewNeverShortens) {
            if let Some(grant) = grant {
                let left = grant
                    .expires_at
                    .saturating_duration_since(tokio::time::Instant::now());
                applied = applied.max(Duration::from_micros(left.as_micros() as u64));
            }
        }
        match self.inner.renew(key, token, fence, applied).await {
            RenewOutcome::Renewed { ttl: r } if self.is(Bug::RenewReportsLess) => {
                RenewOutcome::Renewed {
                    ttl: r.saturating_sub(Duration::from_millis(1)),
                }
            }
            RenewOutcome::Renewed { .. } if self.is(Bug::RenewNeverShortens) => {
                RenewOutcome::Renewed { ttl }
            }
            other => other,
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        if self.is(Bug::ReleaseIgnoresToken) {
            return match self.inner.revoke(key) {
                Some(_) => ReleaseOutcome::Released,
                None => ReleaseOutcome::NotOwner,
            };
        }
        self.inner.release(key, token).await
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        if self.is(Bug::HolderHangs) {
            std::future::pending::<()>().await;
        }
        let answer = self.inner.holder(key).await;
        if !self.is(Bug::DesyncOnDrop) {
            return answer;
        }
        self.replies.lock().unwrap().push_back(answer);
        // The reply is on its way; a request dropped now never takes it.
        tokio::task::yield_now().await;
        self.replies.lock().unwrap().pop_front().unwrap_or(answer)
    }

    async fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) {
        if self.is(Bug::SpuriousRevocation) {
            return;
        }
        self.inner.revoked(key, token, fence).await
    }
}

/// Runs the suite against `bug` and checks that `clause` is among the violations.
async fn caught(bug: Bug, clause: &str) {
    let mut caps = Capabilities::new(Duration::from_secs(1));
    caps.granularity = Duration::from_micros(1);
    caps.min_ttl = Duration::from_micros(1);
    let service = Broken {
        inner: MemoryService::new(),
        bug,
        replies: Mutex::new(VecDeque::new()),
        turns: AtomicU64::new(0),
    };
    let violations = check_all(&service, &caps).await;
    assert!(
        violations.iter().any(|v| v.clause == clause),
        "{bug:?} was not caught by `{clause}`; violations: {violations:#?}"
    );
    for violation in &violations {
        eprintln!("{bug:?}: {violation}");
        assert!(violation
            .to_string()
            .starts_with(&format!("clause `{}`:", violation.clause)));
    }
}

macro_rules! mutant {
    ($($test:ident: $bug:ident => $clause:ident;)*) => {
        $(
            #[tokio::test(start_paused = true)]
            async fn $test() {
                caught(Bug::$bug, stringify!($clause)).await;
            }
        )*
    };
}

mutant! {
    renew_ignoring_the_fence: RenewIgnoresFence => renew_with_another_fence_is_not_owner;
    renew_reporting_less: RenewReportsLess => renew_by_the_holder_applies_at_least_the_ttl_asked;
    renew_recreating: RenewRecreates => renew_never_recreates_a_released_key;
    renew_recreating_expired: RenewRecreates => renew_never_recreates_an_expired_key;
    renew_never_shortening: RenewNeverShortens => a_renewal_replaces_the_expiry;
    reacquire_with_a_new_fence: ReacquireNewFence => same_token_reacquire_keeps_the_fence;
    release_ignoring_the_token: ReleaseIgnoresToken => release_by_another_token_is_not_owner;
    accepting_invalid_keys: AcceptsInvalidKeys => invalid_keys_are_refused;
    truncating_identities: TruncatesIdentity => identities_round_trip;
    longer_ttl_than_reported: LongerTtl => the_ttl_is_hard;
    overstated_remaining: OverstatesRemaining => another_token_is_told_who_holds_the_key;
    hanging_holder_query: HolderHangs => grant_on_a_free_key_reports_ttl_and_fence;
    spurious_revocation: SpuriousRevocation => revoked_fires_only_when_the_grant_is_gone;
    renew_not_extending: RenewDoesNotExtend => renewals_and_reacquires_extend_the_expiry;
    reacquire_not_extending: ReacquireDoesNotExtend => renewals_and_reacquires_extend_the_expiry;
    moody_rounding: MoodyRounding => grants_are_a_function_of_the_ttl_asked;
    late_replies_taken_for_the_next: DesyncOnDrop => abandoned_requests_leave_nothing_behind;
}
