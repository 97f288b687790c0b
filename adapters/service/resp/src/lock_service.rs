//! The driver's view: the `LocalLockService` impl, errors turned into final refusals
//! or unknown outcomes exactly as `leasehold-redis` does.

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Indeterminate, OwnerToken, Refusal,
    ReleaseOutcome, RenewOutcome,
};
use leasehold_driver::{Clock, LocalLockService};

use crate::connect::Connect;
use crate::error::Error;
use crate::service::RespLockService;

/// `refused` for a final refusal, `indeterminate` for everything else.
fn failure<T>(err: &Error, refused: fn(Refusal) -> T, indeterminate: fn(Indeterminate) -> T) -> T {
    match err.refusal() {
        Some(refusal) => refused(refusal),
        None => indeterminate(err.indeterminate().unwrap_or(Indeterminate::Protocol)),
    }
}

impl<F: Connect, K: Clock, const R: usize, const W: usize> LocalLockService
    for RespLockService<'_, F, K, R, W>
{
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        self.try_acquire(key, token, identity, ttl)
            .await
            .unwrap_or_else(|e| failure(&e, AcquireOutcome::Refused, AcquireOutcome::Indeterminate))
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        self.try_renew(key, token, fence, ttl)
            .await
            .unwrap_or_else(|e| failure(&e, RenewOutcome::Refused, RenewOutcome::Indeterminate))
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        self.try_release(key, token)
            .await
            .unwrap_or_else(|e| failure(&e, ReleaseOutcome::Refused, ReleaseOutcome::Indeterminate))
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        match self.try_holder(key).await {
            Ok(Some(holder)) => HolderOutcome::Held(holder),
            Ok(None) => HolderOutcome::Free,
            Err(e) => failure(&e, HolderOutcome::Refused, HolderOutcome::Indeterminate),
        }
    }
}
