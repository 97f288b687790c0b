//! [`LeaseSet`]: many leases on one service, driven by a few tasks with one timer each
//! instead of a task and a timer per lease.

mod admission;
mod driver;
mod timers;
mod wake;

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use leasehold::Config;
use leasehold_driver::LockService;

use crate::acquire::{self, default_identity, AcquireError, AcquireOptions};
use crate::shared::Common;
use crate::{LeaseClock, LeaseHandle};
use driver::Driver;
use wake::{Inbox, Registration};

/// A set's driver inboxes, by index. Behind a thin pointer: 8 B in the config block
/// of every lease, where a pointer to a slice would take 16 B in each task's block.
pub(crate) type Inboxes = Arc<Box<[Arc<Inbox>]>>;

/// Many leases on one service with one config, driven by a few tasks (one per
/// runtime worker by default), each with **one timer** for all of its leases.
///
/// [`acquire`](crate::acquire) spawns a task per lease, and each task keeps a runtime
/// timer: simple, and the right choice for a handful of leases. A process that holds
/// thousands (one lease per tenant, shard or device) pays for thousands of tasks and
/// timers; a `LeaseSet` runs the same [`Lease`](leasehold::Lease) core per lease,
/// step for step as the single-lease loop does, but keeps every lease's next deadline
/// in one queue of deadlines per driver task and polls a lease's request only when it wakes.
///
/// Every lease keeps its own write gate and its own [`LeaseHandle`], which works
/// exactly as one from [`acquire`](crate::acquire): `check()` before each write, the
/// loss at the first refusal, release by [`LeaseHandle::release`] or by dropping the
/// last handle. A slow or stuck request of one lease never delays another: requests
/// run concurrently, and the driver only steps leases that are due or woken.
///
/// A burst of acquires is paced: each driver keeps at most 256 acquire requests in
/// flight and starts the next lease as an answer comes back, so a hundred thousand
/// acquires at once reach the service at its own speed rather than all together
/// (where they would wait in its queue past the request timeout and be sent again).
/// Renewals go first: while the leases it holds are renewed late (the
/// latest renewal was answered more than half the request timeout after it was sent,
/// or failed), a driver keeps only one acquire in flight, until a renewal is answered
/// in time again.
///
/// Leases outlive the `LeaseSet` value: dropping it stops new acquires, and its
/// driver tasks end once their last lease has. Create it inside a tokio runtime; its
/// drivers run on that runtime. If a driver stops (the runtime shuts down, or a
/// service future panics inside it), every lease it drove ends as
/// [`LeaseEnd::DriverStopped`](crate::LeaseEnd::DriverStopped) with its gate closed,
/// and a new acquire that lands on it fails at once the same way: a panic costs the
/// leases of one driver, where with a task per lease it costs one lease.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use leasehold_tokio::{memory::MemoryService, LeaseSet};
///
/// let service = Arc::new(MemoryService::new());
/// let config = leasehold_tokio::config(Duration::from_secs(3)).build().unwrap();
/// let set = LeaseSet::new(service, config);
/// let mut leases = Vec::new();
/// for tenant in 0..1_000 {
///     leases.push(set.acquire(&format!("tenant-{tenant}")).await.unwrap());
/// }
/// tokio::time::sleep(std::time::Duration::from_secs(10)).await;
/// assert!(leases.iter().all(|lease| lease.check().is_ok()));
/// # }
/// ```
pub struct LeaseSet<S> {
    inner: Arc<Inner<S>>,
}

struct Inner<S> {
    service: Arc<S>,
    /// The config, the clock, the default identity and the drivers' inboxes, shared
    /// by every lease of the set that names no identity of its own. One clock: every
    /// lease's instants, and every driver's deadlines, count from the same origin.
    common: Arc<Common>,
    drivers: Inboxes,
    /// The driver the next lease goes to (round robin).
    next: AtomicUsize,
}

impl<S> Drop for Inner<S> {
    fn drop(&mut self) {
        for driver in self.drivers.iter() {
            driver.close();
        }
    }
}

impl<S> Clone for LeaseSet<S> {
    fn clone(&self) -> Self {
        LeaseSet {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> fmt::Debug for LeaseSet<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseSet")
            .field("config", &self.inner.common.config)
            .field("drivers", &self.inner.drivers.len())
            .finish_non_exhaustive()
    }
}

impl<S: LockService + 'static> LeaseSet<S> {
    /// A set whose leases use `config`, with one driver task per worker thread of the
    /// current runtime. Must be called from within a tokio runtime.
    pub fn new(service: Arc<S>, config: Config) -> LeaseSet<S> {
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        LeaseSet::with_drivers(service, config, workers)
    }

    /// A set with `drivers` driver tasks (at least one, at most 65,536); each lease is
    /// driven by one of them, in turn. Must be called from within a tokio runtime.
    pub fn with_drivers(service: Arc<S>, config: Config, drivers: usize) -> LeaseSet<S> {
        let clock = LeaseClock::start();
        let drivers: Box<[Arc<Inbox>]> = (0..drivers.clamp(1, usize::from(u16::MAX) + 1))
            .map(|_| {
                let inbox = Arc::new(Inbox::default());
                let driver = Driver::new(Arc::clone(&service), clock, Arc::clone(&inbox), &config);
                tokio::spawn(driver);
                inbox
            })
            .collect();
        let drivers = Arc::new(drivers);
        LeaseSet {
            inner: Arc::new(Inner {
                service,
                common: Arc::new(Common {
                    config,
                    clock,
                    identity: default_identity(),
                    drivers: Some(Arc::clone(&drivers)),
                }),
                drivers,
                next: AtomicUsize::new(0),
            }),
        }
    }

    /// The config every lease of the set uses.
    pub fn config(&self) -> Config {
        self.inner.common.config
    }

    /// [`acquire`](crate::acquire) in this set: waits while the key is held, then
    /// keeps it renewed until it is lost, released, or its last handle is dropped.
    /// Cancel-safe in the same way.
    pub fn acquire(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static {
        self.acquire_with(key, AcquireOptions::new())
    }

    /// [`try_acquire`](crate::try_acquire) in this set: one attempt.
    pub fn try_acquire(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static {
        self.acquire_with(
            key,
            AcquireOptions::new().max_wait(std::time::Duration::ZERO),
        )
    }

    /// [`acquire_with`](crate::acquire_with) in this set.
    pub fn acquire_with(
        &self,
        key: &str,
        options: AcquireOptions,
    ) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static {
        let inner = Arc::clone(&self.inner);
        let key = acquire::CalledKey::new(key);
        async move {
            let service = &inner.service;
            acquire::start(
                service,
                key,
                Arc::clone(&inner.common),
                options,
                |shared, give_up_at| {
                    let n = inner.next.fetch_add(1, Ordering::Relaxed) % inner.drivers.len();
                    if let Some(driver) = inner.drivers.get(n) {
                        // Below 65,536 (`with_drivers`).
                        shared.driver.store(n as u16, Ordering::Relaxed);
                        driver.register(Registration { shared, give_up_at });
                    }
                },
            )
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::memory::MemoryService;
    use crate::LeaseSet;

    /// A lease of a set is the waker of its own futures, so a waker kept past the term
    /// keeps the lease: the release signal keeps it inside the lease itself (the
    /// driver lets it go when the term ends), and the in-memory service keeps it with
    /// the grant, which a lease that stopped renewing leaves to expire (its watch lets
    /// go of it when dropped).
    #[tokio::test(start_paused = true)]
    async fn a_lease_is_freed_once_its_term_and_its_handles_are_gone() {
        let service = Arc::new(MemoryService::new());
        let config = crate::config(Duration::from_secs(3)).build().unwrap();
        let set = LeaseSet::with_drivers(Arc::clone(&service), config, 1);
        let lost = set.acquire("lost").await.unwrap();
        let released = set.acquire("released").await.unwrap();
        let expired = set.acquire("expired").await.unwrap();
        let leases = [
            Arc::downgrade(lost.shared()),
            Arc::downgrade(released.shared()),
            Arc::downgrade(expired.shared()),
        ];
        service.revoke("lost");
        released.release().await;
        service.partition(expired.owner());
        for lease in [lost, released, expired] {
            lease.settled().await;
        }
        let kept: Vec<usize> = leases.iter().map(|lease| lease.strong_count()).collect();
        assert_eq!(
            kept,
            [0, 0, 0],
            "references left to the lost, released, expired lease"
        );

        // Released by dropping its handle, the term's end still to come.
        let dropped = set.acquire("dropped").await.unwrap();
        let lease = Arc::downgrade(dropped.shared());
        drop(dropped);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(service.grant("dropped").is_none(), "released");
        assert!(lease.upgrade().is_none());
    }
}
