//! The driver's view: the `LockService` impl, final refusals and unknown outcomes,
//! each logged with `tracing`.

use std::future::Future;

use futures_util::FutureExt;
use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, Indeterminate, OwnerToken,
    Refusal, ReleaseOutcome, RenewOutcome,
};
use leasehold_driver::{LockService, Severity};
use redis::aio::ConnectionLike;

use crate::error::RedisLockError;
use crate::service::{Acquired, RedisLockService, Released, Renewed};

/// Logs `err` at the level every service uses ([`Severity`]) and turns it into the
/// outcome the lease sees: `refused` for a final refusal, `indeterminate` otherwise.
fn failure<T>(
    key: &str,
    err: &RedisLockError,
    refused: fn(Refusal) -> T,
    indeterminate: fn(Indeterminate) -> T,
) -> T {
    let refusal = err.refusal();
    let why = err.indeterminate().unwrap_or(Indeterminate::Protocol);
    match Severity::of_failure(refusal.is_some(), why) {
        Severity::Error => {
            tracing::error!(key, op = %err.op(), error = %err, "Redis lock request failed");
        }
        Severity::Warning => {
            tracing::warn!(key, op = %err.op(), error = %err, "Redis lock request failed");
        }
    }
    match refusal {
        Some(refusal) => refused(refusal),
        None => indeterminate(why),
    }
}

impl<C> LockService for RedisLockService<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        match self.try_acquire(key, token, identity, ttl).await {
            Ok(Acquired::Granted { fence, ttl, .. }) => {
                tracing::debug!(key, %token, %fence, ?ttl, "acquire: granted");
                AcquireOutcome::Granted { fence, ttl }
            }
            Ok(Acquired::HeldByAnother(holder)) => {
                tracing::debug!(key, %token, ?holder, "acquire: held by another");
                AcquireOutcome::HeldByAnother(holder)
            }
            Ok(Acquired::Quarantined { remaining }) => {
                tracing::info!(key, %token, ?remaining, "acquire: Redis is in quarantine after a loss of state");
                AcquireOutcome::HeldByAnother(Holder::quarantine(remaining))
            }
            Err(e) => failure(
                key,
                &e,
                AcquireOutcome::Refused,
                AcquireOutcome::Indeterminate,
            ),
        }
    }

    /// A plain function, not an `async fn`: the renewal's future is the request's
    /// alone, without a second layer around it (a renewal runs every T/3).
    fn renew<'s, 'k>(
        &'s self,
        key: &'k str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send + use<'s, 'k, C> {
        self.renewal(key, token, fence, ttl)
            .map(move |answer| match answer {
                Ok(Renewed::Renewed { ttl }) => RenewOutcome::Renewed { ttl },
                Ok(Renewed::NotOwner) => {
                    tracing::info!(key, %token, %fence, "renew: not the owner any more");
                    RenewOutcome::NotOwner
                }
                Err(e) => failure(key, &e, RenewOutcome::Refused, RenewOutcome::Indeterminate),
            })
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        match self.try_release(key, token).await {
            Ok(Released::Released) => {
                tracing::debug!(key, %token, "release: deleted");
                ReleaseOutcome::Released
            }
            Ok(Released::NotOwner) => {
                tracing::debug!(key, %token, "release: not the owner");
                ReleaseOutcome::NotOwner
            }
            Err(e) => failure(
                key,
                &e,
                ReleaseOutcome::Refused,
                ReleaseOutcome::Indeterminate,
            ),
        }
    }

    /// Keyspace notifications ([`watch_holder`](RedisLockService::watch_holder)); never
    /// completes where Redis sends none, so observers poll. After a failure (Redis
    /// down, the subscription dropped) it watches again after a pause, from 100 ms
    /// doubling up to 1.6 s.
    async fn holder_changed(&self, key: &str, seen: Option<Fence>) {
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            match self.watch_holder(key, seen).await {
                Ok(true) => return,
                Ok(false) => return std::future::pending().await,
                Err(e) => {
                    tracing::debug!(key, op = %e.op(), error = %e, retry_in = ?pause, "holder watch failed; watching again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(1_600));
                }
            }
        }
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        match self.try_holder(key).await {
            Ok(Some(holder)) => HolderOutcome::Held(holder),
            Ok(None) => HolderOutcome::Free,
            Err(e) => failure(
                key,
                &e,
                HolderOutcome::Refused,
                HolderOutcome::Indeterminate,
            ),
        }
    }
}
