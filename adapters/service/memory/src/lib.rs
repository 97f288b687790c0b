//! [`MemoryService`]: an in-process lock service with a hard TTL and fault injection.
//!
//! It is the embedded default: the examples and a newcomer's first run use it, with no
//! server to start. It keeps the contract every backend keeps (see
//! [`LocalLockService`](leasehold_driver::LocalLockService)): a hard TTL on tokio's clock
//! (so tokio's paused time drives it too), a fence counter per key that only grows,
//! owner-token-and-fence compare on renew, owner-token compare on release, idempotent
//! re-acquire by the same token, the holder's identity with every grant, and the key
//! rules of [`leasehold::check_key`] (any other key is refused). It grants exactly the
//! TTL asked for.
//!
//! Faults ([`Faults`]) make it behave like a service across a bad network: added
//! latency, lost requests, lost answers, stalls, partitions — for every client or for
//! one [`Owner`]. An operator's actions are there too: [`revoke`](MemoryService::revoke)
//! deletes a key from outside (holders are notified through
//! [`revoked`](leasehold_driver::LockService::revoked)), and
//! [`expire_now`](MemoryService::expire_now) ends a grant as if its TTL ran out.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod faults;
mod request;
mod shards;
mod table;

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Poll;

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Owner, OwnerToken, ReleaseOutcome,
    RenewOutcome, Term,
};
use leasehold_driver::LockService;
use tokio::sync::Notify;

pub use faults::{Faults, Scope};
pub use table::Grant;

use faults::FaultTable;
use request::{Op, Request};
use shards::Shards;

/// An in-memory lock service for many keys, with fault injection.
///
/// Share it as `Arc<MemoryService>` between contenders; tell clients apart for faults
/// by their [`Owner`] ([`LeaseHandle::owner`], or one you supply
/// with [`AcquireOptions::owner`]).
///
/// Expiry is lazy: a grant whose TTL ran out is dropped when its key is next touched,
/// so no timer runs per key. The keys are split over 64 shards by a hash of the name,
/// each with its own mutex, and a request without faults locks only its key's shard:
/// 100k leases on a multi-threaded runtime do not queue on one lock. An expiry is therefore not announced through `revoked`
/// (a holder learns it from its next renewal); [`revoke`](Self::revoke) is.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use leasehold::{AcquireOutcome, Duration, Identity, Owner, RenewOutcome, Term};
/// use leasehold_driver::LockService;
/// use leasehold_memory::MemoryService;
///
/// let service = MemoryService::new();
/// let owner = Owner([7; 16]);
/// let (token, me) = (owner.token(Term(1)), Identity::new("me").unwrap());
/// let ttl = Duration::from_millis(900);
/// let AcquireOutcome::Granted { fence, .. } = service.acquire("job", token, &me, ttl).await
/// else {
///     panic!("a free key is granted")
/// };
///
/// // Cut this client off: its renewals are lost, and the grant expires on time.
/// service.partition(owner);
/// let renewal = service.renew("job", token, fence, ttl);
/// assert!(tokio::time::timeout(std::time::Duration::from_secs(1), renewal).await.is_err());
/// assert!(service.grant("job").is_none(), "expired after its TTL");
/// # }
/// ```
///
/// [`LeaseHandle::owner`]: https://docs.rs/leasehold-tokio/latest/leasehold_tokio/struct.LeaseHandle.html#method.owner
/// [`AcquireOptions::owner`]: https://docs.rs/leasehold-tokio/latest/leasehold_tokio/struct.AcquireOptions.html#method.owner
#[derive(Debug, Default)]
pub struct MemoryService {
    shards: Shards,
    /// Lock order: `faults` before a shard, never the other way round.
    faults: Mutex<FaultState>,
    /// Whether any fault is set (written under the `faults` lock): while none is, a
    /// request skips the `faults` lock and goes straight to its key's shard.
    any_faults: AtomicBool,
    /// Wakes stalled requests after a fault changed.
    faults_changed: Notify,
}

/// The faults in force and what they did.
#[derive(Debug, Default)]
struct FaultState {
    table: FaultTable,
    lost_requests: u64,
    lost_responses: u64,
}

/// Counters of what the service did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceStats {
    /// Acquire requests carried out.
    pub acquires: u64,
    /// Renew requests carried out.
    pub renewals: u64,
    /// Release requests carried out.
    pub releases: u64,
    /// Requests lost before reaching the service (drops, partitions).
    pub lost_requests: u64,
    /// Requests carried out whose answers were lost.
    pub lost_responses: u64,
}

impl MemoryService {
    /// An empty service with no faults.
    pub fn new() -> MemoryService {
        MemoryService::default()
    }

    fn lock_faults(&self) -> MutexGuard<'_, FaultState> {
        // Nothing panics under this lock; a poisoned one still holds plain values.
        self.faults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the faults, keeping [`any_faults`](Self::any_faults) true to them.
    fn change_faults(&self, change: impl FnOnce(&mut FaultTable)) {
        let mut faults = self.lock_faults();
        change(&mut faults.table);
        self.any_faults.store(faults.table.any(), Ordering::Release);
    }

    // ----- inspection -----

    /// The live grant of `key`, if any.
    pub fn grant(&self, key: &str) -> Option<Grant> {
        self.shards
            .of(key)
            .table
            .grant(key, tokio::time::Instant::now())
    }

    /// What the service did so far.
    pub fn stats(&self) -> ServiceStats {
        let faults = self.lock_faults();
        let mut stats = ServiceStats {
            lost_requests: faults.lost_requests,
            lost_responses: faults.lost_responses,
            ..ServiceStats::default()
        };
        for shard in self.shards.each() {
            stats.acquires += shard.acquires;
            stats.renewals += shard.renewals;
            stats.releases += shard.releases;
        }
        stats
    }

    /// How many keys the service has ever seen (keys are kept for their fence counter).
    pub fn key_count(&self) -> usize {
        self.shards.each().map(|shard| shard.table.len()).sum()
    }

    // ----- an operator's actions -----

    /// Deletes `key`'s grant from outside, as an operator would, and notifies its
    /// holder through `revoked`. Returns the grant that was deleted.
    pub fn revoke(&self, key: &str) -> Option<Grant> {
        let revoked = self
            .shards
            .of(key)
            .table
            .revoke(key, tokio::time::Instant::now());
        let (grant, watcher) = revoked?;
        if let Some(watcher) = watcher {
            watcher.wake();
        }
        Some(grant)
    }

    /// Ends `key`'s grant as if its TTL ran out now (a clock jump on the service, a
    /// failover that lost the key). Nobody is notified; the holder's next renewal is
    /// answered "not owner". Returns the grant that ended.
    pub fn expire_now(&self, key: &str) -> Option<Grant> {
        self.shards
            .of(key)
            .table
            .expire(key, tokio::time::Instant::now())
    }

    // ----- faults -----

    /// The faults set for `scope` (not combined with the global ones).
    pub fn faults(&self, scope: impl Into<Scope>) -> Faults {
        self.lock_faults().table.get(scope.into())
    }

    /// Replaces the faults of `scope`.
    pub fn set_faults(&self, scope: impl Into<Scope>, faults: Faults) {
        self.update_faults(scope, |f| *f = faults);
    }

    /// Changes the faults of `scope`. Requests already waiting in a stall re-check.
    pub fn update_faults(&self, scope: impl Into<Scope>, change: impl FnOnce(&mut Faults)) {
        self.change_faults(|faults| faults.update(scope.into(), change));
        self.faults_changed.notify_waiters();
    }

    /// Removes every fault, global and per client.
    pub fn clear_faults(&self) {
        self.change_faults(FaultTable::clear);
        self.faults_changed.notify_waiters();
    }

    /// Sets the added round-trip latency of `scope`.
    pub fn set_latency(&self, scope: impl Into<Scope>, latency: std::time::Duration) {
        self.update_faults(scope, |f| f.latency = latency);
    }

    /// Requests from `scope` hang before the service acts, until [`unstall`](Self::unstall).
    pub fn stall(&self, scope: impl Into<Scope>) {
        self.update_faults(scope, |f| f.stalled = true);
    }

    /// Lets stalled requests of `scope` through.
    pub fn unstall(&self, scope: impl Into<Scope>) {
        self.update_faults(scope, |f| f.stalled = false);
    }

    /// Cuts `scope` off: its requests and in-flight answers are lost.
    pub fn partition(&self, scope: impl Into<Scope>) {
        self.update_faults(scope, |f| f.partitioned = true);
    }

    /// Ends `scope`'s partition (requests lost meanwhile stay lost).
    pub fn heal(&self, scope: impl Into<Scope>) {
        self.update_faults(scope, |f| f.partitioned = false);
    }

    /// Loses the next `count` requests of `scope` before the service sees them.
    pub fn drop_requests(&self, scope: impl Into<Scope>, count: u32) {
        self.update_faults(scope, |f| f.drop_requests = count);
    }

    /// Carries out the next `count` requests of `scope` but loses their answers.
    pub fn drop_responses(&self, scope: impl Into<Scope>, count: u32) {
        self.update_faults(scope, |f| f.drop_responses = count);
    }
}

/// The service's TTL is tokio's duration; the core's is microseconds.
fn std_duration(ttl: Duration) -> std::time::Duration {
    std::time::Duration::from_micros(ttl.as_micros())
}

impl LockService for MemoryService {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send {
        Request::new(self, key, token, Op::Acquire(std_duration(ttl), *identity))
    }

    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send {
        Request::new(self, key, token, Op::Renew(fence, std_duration(ttl)))
    }

    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> + Send {
        Request::new(self, key, token, Op::Release)
    }

    /// Answered like any request: faults that apply to every client apply to it.
    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> + Send {
        // Nobody's token: only global faults touch a query.
        let nobody = Owner([0; 16]).token(Term(0));
        Request::new(self, key, nobody, Op::Holder)
    }

    /// Completes once `key`'s grant with `fence` was [revoked](MemoryService::revoke).
    /// A key this service has never seen is never revoked.
    fn revoked(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> impl Future<Output = ()> + Send {
        let _ = token;
        let shard = Shards::index(key);
        // Found now, not at every poll: the watch keeps where the key's record is
        // (it never moves) rather than the key, and every held lease keeps a watch.
        let place = self.shards.at(shard).table.place(key);
        Watch {
            service: self,
            place: place
                .and_then(|place| place.checked_add(1))
                .and_then(NonZeroU32::new),
            shard,
            fence,
        }
    }
}

/// The revocation watch of one grant. A future of a few words: every held lease
/// keeps one.
struct Watch<'s> {
    service: &'s MemoryService,
    /// One more than the place of the key's record in its shard's table; `None` for
    /// a key the service did not know.
    place: Option<NonZeroU32>,
    shard: u8,
    fence: Fence,
}

impl Watch<'_> {
    fn place(&self) -> Option<u32> {
        self.place.map(|place| place.get() - 1)
    }
}

impl Future for Watch<'_> {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let Some(place) = self.place() else {
            return Poll::Pending; // never granted here, so never revoked
        };
        // Looks and registers under the shard's lock, so a revocation cannot fall in
        // between.
        let now = tokio::time::Instant::now();
        let mut shard = self.service.shards.at(self.shard);
        if shard
            .table
            .watch_revocation(place, self.fence, cx.waker(), now)
        {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// A watch given up takes its waker back from the grant: the grant may outlive it
/// (a lease that stopped renewing leaves its grant to expire, and an expired grant
/// goes only when its key is next used), and the waker keeps its task, or the lease
/// it wakes, in memory.
impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if let Some(place) = self.place() {
            let mut shard = self.service.shards.at(self.shard);
            shard.table.unwatch(place, self.fence);
        }
    }
}

#[cfg(test)]
mod tests;
