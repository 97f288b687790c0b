//! The lock-service contract every backend implements.

use core::future::Future;

use leasehold::{AcquireOutcome, Duration, Fence, OwnerToken, ReleaseOutcome, RenewOutcome};

/// A lock service: grants, extends and frees leases on named keys.
///
/// Implement this for single-threaded executors (embassy, a firmware link); implement
/// its `Send` twin [`LockService`] for tokio and other work-stealing runtimes — every
/// `LockService` is a `LocalLockService` too.
///
/// Contract for implementations:
///
/// * **acquire** grants `key` to `token` for `ttl` only if nobody holds it, and returns
///   a fence strictly greater than every fence granted before for `key`, and the TTL it
///   *applied* (which may differ from the one asked for). If `token` itself already
///   holds `key` (an earlier attempt succeeded but its answer was lost), grant it again
///   with its existing fence.
/// * **renew** extends `key` by `ttl` *only if `token` still holds it with `fence`*
///   (compare-and-expire) — otherwise `NotOwner`. It never extends someone else's
///   lease, nor a newer grant to the same token (a late duplicate acquire after the
///   key was deleted), which this client cannot write with.
/// * **release** deletes `key` only if `token` still holds it (compare-and-delete).
/// * Anything that leaves the outcome unknown — timeout, broken connection, an answer
///   that does not parse — is `Indeterminate`, never a guess. Never answer `Granted` or
///   `Renewed` unless the service confirmed it.
/// * Futures may be dropped at any time (the driver gives up on a request after the
///   lease's request timeout); a dropped request must leave nothing behind that
///   another request depends on.
///
/// [`revoked`](LocalLockService::revoked) lets a service that can see the key (an etcd
/// watch, a gateway push) end the lease before the next renewal would.
pub trait LocalLockService {
    /// Acquire `key` for `token`, for `ttl`.
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome>;

    /// Extend `key` by `ttl` if `token` still holds it with `fence`.
    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome>;

    /// Delete `key` if `token` still holds it.
    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome>;

    /// Completes when the service learns, unprompted, that the grant of `key` to
    /// `token` with `fence` is gone (deleted, revoked, taken). Services that cannot
    /// watch never complete, which is the default.
    fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) -> impl Future<Output = ()> {
        let _ = (key, token, fence);
        core::future::pending()
    }
}

/// [`LocalLockService`] whose futures are `Send`, for multi-threaded runtimes (tokio).
///
/// Same contract; implement it with `async fn`s whose bodies are `Send`. Every
/// `LockService` is a `LocalLockService` through a blanket impl.
pub trait LockService: Send + Sync {
    /// See [`LocalLockService::acquire`].
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send;

    /// See [`LocalLockService::renew`].
    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send;

    /// See [`LocalLockService::release`].
    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> + Send;

    /// See [`LocalLockService::revoked`].
    fn revoked(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> impl Future<Output = ()> + Send {
        let _ = (key, token, fence);
        core::future::pending()
    }
}

impl<T: LockService> LocalLockService for T {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> {
        LockService::acquire(self, key, token, ttl)
    }
    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> {
        LockService::renew(self, key, token, fence, ttl)
    }
    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> {
        LockService::release(self, key, token)
    }
    fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) -> impl Future<Output = ()> {
        LockService::revoked(self, key, token, fence)
    }
}
