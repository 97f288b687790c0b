//! The `LockService` impl: the typed requests, their answers and errors mapped to the
//! contract's outcomes, and logged.

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_driver::{LockService, Severity};

use crate::error::PostgresLockError;
use crate::service::{Acquired, PostgresLockService, Released, Renewed};

/// Logs a failed request at the level every service uses ([`Severity`]): a read-only
/// server, like Redis's read-only replica, is a warning, as a promotion clears it.
fn log_error(key: &str, err: &PostgresLockError) {
    match Severity::of_failure(err.refusal().is_some(), err.indeterminate()) {
        Severity::Error => {
            tracing::error!(key, op = %err.op(), error = %err, "PostgreSQL lock request failed");
        }
        Severity::Warning => {
            tracing::warn!(key, op = %err.op(), error = %err, "PostgreSQL lock request failed");
        }
    }
}

impl LockService for PostgresLockService {
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        match self.try_acquire(key, token, identity, ttl).await {
            Ok(Acquired::Granted {
                fence,
                ttl,
                regranted,
            }) => {
                tracing::debug!(key, %token, %fence, ttl_ms = ttl.as_millis(), regranted, "acquire: granted");
                AcquireOutcome::Granted { fence, ttl }
            }
            Ok(Acquired::HeldByAnother(holder)) => {
                tracing::debug!(key, %token, holder = %holder.identity, fence = %holder.fence, "acquire: held by another");
                AcquireOutcome::HeldByAnother(holder)
            }
            Ok(Acquired::Quarantined { remaining }) => {
                tracing::info!(key, %token, remaining_ms = remaining.as_millis(), "acquire: PostgreSQL is in quarantine after a possible loss of grants");
                AcquireOutcome::HeldByAnother(leasehold::Holder::quarantine(remaining))
            }
            Err(err) => {
                log_error(key, &err);
                match err.refusal() {
                    Some(refusal) => AcquireOutcome::Refused(refusal),
                    None => AcquireOutcome::Indeterminate(err.indeterminate()),
                }
            }
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        match self.try_renew(key, token, fence, ttl).await {
            Ok(Renewed::Renewed { ttl }) => {
                tracing::trace!(key, %token, ttl_ms = ttl.as_millis(), "renewed");
                RenewOutcome::Renewed { ttl }
            }
            Ok(Renewed::NotOwner) => {
                tracing::info!(key, %token, %fence, "renew: not the owner any more");
                RenewOutcome::NotOwner
            }
            Err(err) => {
                log_error(key, &err);
                match err.refusal() {
                    Some(refusal) => RenewOutcome::Refused(refusal),
                    None => RenewOutcome::Indeterminate(err.indeterminate()),
                }
            }
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        match self.try_release(key, token).await {
            Ok(Released::Released) => {
                tracing::debug!(key, %token, "released");
                ReleaseOutcome::Released
            }
            Ok(Released::NotOwner) => {
                tracing::debug!(key, %token, "release: not the owner");
                ReleaseOutcome::NotOwner
            }
            Err(err) => {
                log_error(key, &err);
                match err.refusal() {
                    Some(refusal) => ReleaseOutcome::Refused(refusal),
                    None => ReleaseOutcome::Indeterminate(err.indeterminate()),
                }
            }
        }
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        match self.try_holder(key).await {
            Ok(Some(holder)) => HolderOutcome::Held(holder),
            Ok(None) => HolderOutcome::Free,
            Err(err) => {
                log_error(key, &err);
                match err.refusal() {
                    Some(refusal) => HolderOutcome::Refused(refusal),
                    None => HolderOutcome::Indeterminate(err.indeterminate()),
                }
            }
        }
    }

    // `revoked` keeps the default (never completes): see the crate docs.
}
