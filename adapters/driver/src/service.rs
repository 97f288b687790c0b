//! The lock-service contract every backend implements.

use core::future::Future;

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};

/// A lock service: grants, extends and frees leases on named keys.
///
/// Implement this for single-threaded executors (embassy, a firmware link); implement
/// its `Send` twin [`LockService`] for tokio and other work-stealing runtimes — every
/// `LockService` is a `LocalLockService` too. The crate `leasehold-conformance` has
/// one test per clause below; a backend that passes it keeps the contract.
///
/// # Keys and identities
///
/// * Every key that passes [`leasehold::check_key`] is accepted and stored as given;
///   any other key is refused with [`Refusal::InvalidKey`](leasehold::Refusal) (never
///   retried, never `Indeterminate`).
/// * **acquire** stores the holder's [`Identity`] with the grant; a contender learns it
///   from [`AcquireOutcome::HeldByAnother`], anyone from [`holder`](Self::holder).
///
/// # Time: what a TTL means
///
/// The service keeps one expiry per key on its own monotonic clock, and the key is
/// gone at that instant (its hard TTL is the only authority). A request is *handled*
/// at one instant between its send time and the receipt of its answer.
///
/// * **acquire** with `ttl` — if nobody holds `key`, sets its expiry to
///   *handling time + g* and answers `Granted { fence, ttl: g }`. A service may grant
///   a `g` other than
///   the `ttl` asked for (its own minimum or maximum), but only here, and it reports
///   the `g` it applied. The same `ttl` asked always gets the same `g` (a clamp to the
///   service's bounds, never a mood), so a late duplicate of an acquire of the same
///   term re-grants with the same `g`. The client derives everything from `g`: its safe deadline,
///   its renewal cadence (every g/3 by default), and the `ttl` of its renewals.
/// * **renew** with `ttl` (the client always asks for the `g` of its grant) — if the
///   key is still held by `token` *with `fence`*, **replaces** its expiry with
///   *handling time + r* and answers `Renewed { ttl: r }`, where **`r ≥ ttl`**: a
///   renewal never applies less than it was asked for. Replacing means a renewal may
///   set an *earlier* expiry than the one before (`PEXPIRE` semantics); the client
///   allows for that because its renewals never ask for less than the grant's `g`,
///   and it never counts on more than it asked for: if a renewal applies `r > ttl`,
///   another renewal of the same term that was delayed in the network and is handled
///   later may still set the expiry to *its* handling time + `ttl`.
///   An answer with `r < ttl` breaks this clause; the client then ends the term
///   ([`LossReason::Shortened`](leasehold::LossReason)) whenever the answer arrives,
///   in time or late, as it can no longer bound the expiry of any renewal it sent.
/// * Otherwise the answer is `NotOwner`: renew never extends someone else's lease, nor
///   a newer grant to the same token (a late duplicate acquire after the key was
///   deleted re-creates it with a new fence), and it never re-creates a deleted key.
///
/// # Grants and fences
///
/// * The fence of a grant is strictly greater than every fence granted before for the
///   same key, across expiries, releases and restarts of the service (a service that
///   cannot promise this across restarts says so in its docs, with the recovery).
/// * An acquire by the `token` that already holds `key` (an earlier attempt succeeded
///   but its answer was lost) is granted again with the *same* fence, and sets the
///   expiry as a renewal would.
/// * If another token holds `key`, the answer is `HeldByAnother` with that holder's
///   identity, fence and remaining TTL, and nothing changes.
///
/// # After a loss of state
///
/// * A service that can lose grants while their holders live on (a restart without
///   its data, a restore from an older backup, a replica promoted before the latest
///   grants reached it) grants **no free key** until every grant it may have forgotten
///   has expired: meanwhile an acquire of a free key answers
///   `HeldByAnother(Holder::quarantine(remaining))` (fence 0, which no grant has), and
///   the client waits as for a held key. Keys still held need no quarantine.
///
/// # Release and query
///
/// * **release** deletes `key` only if `token` still holds it (compare-and-delete),
///   whatever the fence; otherwise `NotOwner`.
/// * **holder** reports who holds `key` now (identity, fence, remaining TTL), or
///   `Free`. It changes nothing.
///
/// # Failures
///
/// * **Final refusals** — the request can never succeed as asked: an invalid key, a
///   key that holds something that is not a lease (Redis `WRONGTYPE`, a foreign value),
///   credentials refused — are `Refused(reason)`. The client never retries them.
/// * Anything that leaves the outcome unknown — timeout, broken connection, a server
///   that is down or loading, an answer that does not parse — is `Indeterminate`,
///   never a guess. Never answer `Granted` or `Renewed` unless the service confirmed
///   it.
/// * Futures may be dropped at any time (the driver gives up on a request after the
///   lease's request timeout); a dropped request must leave nothing behind that
///   another request depends on. No call may wait forever: bound connects and
///   reconnects by the request timeout or a timeout of the service's own.
///
/// [`revoked`](LocalLockService::revoked) lets a service that can see the key (an etcd
/// watch, a gateway push) end the lease before the next renewal would;
/// [`holder_changed`](LocalLockService::holder_changed) lets an observer follow who
/// holds a key without waiting for its next poll.
pub trait LocalLockService {
    /// Acquire `key` for `token` (presenting `identity`), for `ttl`.
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome>;

    /// Replace the expiry of `key` with now + `ttl` if `token` still holds it with
    /// `fence`.
    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome>;

    /// Delete `key` if `token` still holds it.
    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome>;

    /// Who holds `key` now.
    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome>;

    /// Completes when the service learns, unprompted, that the grant of `key` to
    /// `token` with `fence` is gone (deleted, revoked, taken). Services that cannot
    /// watch never complete, which is the default.
    fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) -> impl Future<Output = ()> {
        let _ = (key, token, fence);
        core::future::pending()
    }

    /// Completes when the holder of `key` may no longer be the one the caller last
    /// saw: the grant with fence `seen`, or nobody for `None`. It completes at once if
    /// the holder already differs when it starts, so nothing that changes between the
    /// caller's [`holder`](Self::holder) query and this call is missed. An observer
    /// follows who holds a key with it (a leader election's observers) and queries
    /// [`holder`](Self::holder) when it completes. Services that cannot watch never
    /// complete, which is the default: their observers poll. A completion without a
    /// change is allowed (the observer queries once more); a missed change is not.
    fn holder_changed(&self, key: &str, seen: Option<Fence>) -> impl Future<Output = ()> {
        let _ = (key, seen);
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
        identity: &Identity,
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

    /// See [`LocalLockService::holder`].
    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> + Send;

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

    /// See [`LocalLockService::holder_changed`].
    fn holder_changed(&self, key: &str, seen: Option<Fence>) -> impl Future<Output = ()> + Send {
        let _ = (key, seen);
        core::future::pending()
    }
}

impl<T: LockService> LocalLockService for T {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> {
        LockService::acquire(self, key, token, identity, ttl)
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
    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> {
        LockService::holder(self, key)
    }
    fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) -> impl Future<Output = ()> {
        LockService::revoked(self, key, token, fence)
    }
    fn holder_changed(&self, key: &str, seen: Option<Fence>) -> impl Future<Output = ()> {
        LockService::holder_changed(self, key, seen)
    }
}
