//! The `LockService` impl: the typed requests, their answers and errors mapped to the
//! contract's outcomes, and logged.

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use std::future::Future;

use leasehold_driver::{LockService, Severity};

use crate::error::EtcdLockError;
use crate::service::{Acquired, EtcdLockService, Released, Renewed, Revoked};

/// Logs a failed request at the level every service uses ([`Severity`]), its cause in
/// a field of its own.
fn log_error(key: &str, err: &EtcdLockError) {
    let cause = std::error::Error::source(err).map(ToString::to_string);
    match Severity::of_failure(err.refusal().is_some(), err.indeterminate()) {
        Severity::Error => {
            tracing::error!(key, op = %err.op(), error = %err, ?cause, "etcd lock request failed");
        }
        Severity::Warning => {
            tracing::warn!(key, op = %err.op(), error = %err, ?cause, "etcd lock request failed");
        }
    }
}

impl LockService for EtcdLockService {
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
                ttl: granted,
                lease,
                regranted,
            }) => {
                tracing::debug!(key, %token, %fence, requested_ms = ttl.as_millis(), granted_ms = granted.as_millis(), lease, regranted, "acquire: granted");
                AcquireOutcome::Granted {
                    fence,
                    ttl: granted,
                }
            }
            Ok(Acquired::HeldByAnother(holder)) => {
                tracing::debug!(key, %token, holder = %holder.identity, fence = %holder.fence, "acquire: held by another");
                AcquireOutcome::HeldByAnother(holder)
            }
            Ok(Acquired::Quarantined { remaining }) => {
                tracing::info!(key, %token, remaining_ms = remaining.as_millis(), "acquire: etcd is in quarantine after a possible loss of grants");
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

    /// etcd renews a lease to the TTL it was granted with: `ttl` (the client asks for
    /// its grant's TTL, which is that one) is not sent, and the answer reports the TTL
    /// the keep-alive applied, never a remaining-time read-back.
    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        _ttl: Duration,
    ) -> RenewOutcome {
        match self.try_renew(key, token, fence).await {
            Ok(Renewed::Renewed { ttl }) => {
                tracing::trace!(key, %token, ttl_ms = ttl.as_millis(), "renewed");
                RenewOutcome::Renewed { ttl }
            }
            Ok(Renewed::NotOwner(why)) => {
                tracing::info!(key, %token, ?why, "renew: not the owner any more");
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

    /// Completes when etcd shows the grant gone (see
    /// [`watch_revocation`](EtcdLockService::watch_revocation)). A failed watch is
    /// retried after a pause that doubles from the configured `watch_retry` up to
    /// 16× it; it never completes for an error.
    async fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) {
        let Revoked { why, revision } = self
            .watching(key, || self.watch_revocation(key, token, fence))
            .await;
        tracing::info!(key, %token, %fence, ?why, revision, "watch: the grant is gone");
    }

    async fn holder_changed(&self, key: &str, seen: Option<Fence>) {
        let revision = self.watching(key, || self.watch_holder(key, seen)).await;
        tracing::debug!(key, ?seen, revision, "watch: the holder changed");
    }
}

impl EtcdLockService {
    /// Runs the watch `watch` until it answers; after a failure (the read or the stream
    /// failed, etcd cancelled the watch) watches again after `watch_retry`, doubling
    /// up to 16 times that.
    async fn watching<T, F: Future<Output = Result<T, EtcdLockError>>>(
        &self,
        key: &str,
        watch: impl Fn() -> F,
    ) -> T {
        let mut pause = self.watch_retry;
        loop {
            match watch().await {
                Ok(answer) => return answer,
                Err(err) => {
                    tracing::debug!(key, op = %err.op(), error = %err, retry_in = ?pause, "watch failed; watching again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(self.watch_retry * 16);
                }
            }
        }
    }
}
