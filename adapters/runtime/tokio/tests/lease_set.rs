//! `LeaseSet`, the second driver shape: first the lease rules and the handle's promises
//! of `task_per_lease.rs`, each lease in a set of its own; then what only a set has —
//! many leases on one driver task and one timer, none disturbing another.

mod common;
mod handles;
mod rules;

use std::sync::Arc;

use common::{config, ms, within, Kind, Recording, Timeline};
use leasehold::{Fence, LossReason};
use leasehold_tokio::memory::{MemoryService, Scope};
use leasehold_tokio::{AcquireError, CheckError, LeaseEnd, LeaseHandle, LeaseSet};

mod shape {
    use std::future::Future;
    use std::sync::Arc;

    use leasehold::Config;
    use leasehold_driver::LockService;
    use leasehold_tokio::{AcquireError, AcquireOptions, LeaseHandle, LeaseSet};

    /// `acquire` through a set of its own, created when the future first runs (inside
    /// the runtime) and dropped once the acquire is over; its driver runs on until the
    /// lease ends.
    pub fn acquire_with<S: LockService + 'static>(
        service: Arc<S>,
        key: &str,
        config: Config,
        options: AcquireOptions,
    ) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static {
        let key = key.to_owned();
        async move {
            let set = LeaseSet::with_drivers(service, config, 1);
            set.acquire_with(&key, options).await
        }
    }

    pub fn acquire<S: LockService + 'static>(
        service: Arc<S>,
        key: &str,
        config: Config,
    ) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static {
        acquire_with(service, key, config, AcquireOptions::new())
    }

    pub fn try_acquire<S: LockService + 'static>(
        service: Arc<S>,
        key: &str,
        config: Config,
    ) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static {
        acquire_with(
            service,
            key,
            config,
            AcquireOptions::new().max_wait(std::time::Duration::ZERO),
        )
    }
}

const LEASES: usize = 1_000;

/// `n` leases `lease-0`… in one set with one driver, all acquired at the same instant.
async fn hold_many(service: &Arc<Recording>, n: usize) -> (LeaseSet<Recording>, Vec<LeaseHandle>) {
    let set = LeaseSet::with_drivers(service.clone(), config(900), 1);
    let acquires: Vec<_> = (0..n)
        .map(|i| tokio::spawn(set.acquire(&format!("lease-{i}"))))
        .collect();
    let mut leases = Vec::with_capacity(n);
    for acquire in acquires {
        leases.push(acquire.await.unwrap().unwrap());
    }
    (set, leases)
}

#[tokio::test(start_paused = true)]
async fn one_driver_renews_a_thousand_leases_each_on_its_own_schedule() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let (_set, leases) = hold_many(&service, LEASES).await;
    assert_eq!(timeline.now_ms(), 0, "all granted at once");

    timeline.until(2_000).await;
    for lease in &leases {
        assert_eq!(
            service.sent_ms(&timeline, lease.token(), Kind::Renew),
            [300, 600, 900, 1_200, 1_500, 1_800],
            "{}",
            lease.key()
        );
        assert!(lease.check().is_ok(), "{}", lease.key());
    }
    // Each key granted once, to its own lease, and held by it at the service.
    for lease in &leases {
        let grant = service.grant(lease.key()).unwrap();
        assert_eq!(grant.fence, lease.granted_fence());
        assert_eq!(grant.fence, Fence(1));
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_lease_expires_alone_while_its_neighbours_renew_on_time() {
    let timeline = Timeline::start();
    let service = Recording::new();
    let (_set, leases) = hold_many(&service, 100).await;
    let (stalled, revoked) = (&leases[3], &leases[4]);
    let stalled_expiry = service.grant(stalled.key()).unwrap().expires_at;
    service.stall(stalled.owner());
    service.revoke(revoked.key());

    // The revocation ends its lease at once; the stall ends its lease before the
    // service would have let the key go (rules 4 and 5), and not one neighbour moves.
    assert_eq!(
        within(10, revoked.lost()).await,
        LeaseEnd::Lost(LossReason::Revoked)
    );
    assert_eq!(
        within(2_000, stalled.lost()).await,
        LeaseEnd::Lost(LossReason::Expired)
    );
    assert!(tokio::time::Instant::now() < stalled_expiry);
    assert!(matches!(stalled.check(), Err(CheckError::Gate(_))));

    timeline.until(2_000).await;
    for lease in leases
        .iter()
        .filter(|l| l.key() != stalled.key() && l.key() != revoked.key())
    {
        assert_eq!(
            service.sent_ms(&timeline, lease.token(), Kind::Renew),
            [300, 600, 900, 1_200, 1_500, 1_800],
            "{}",
            lease.key()
        );
        assert!(lease.check().is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn leases_outlive_the_set_and_the_drivers_end_with_the_last_of_them() {
    let service = Recording::new();
    let (set, mut leases) = hold_many(&service, 10).await;
    drop(set);
    tokio::time::sleep(ms(3_000)).await;
    assert!(
        leases.iter().all(|lease| lease.check().is_ok()),
        "still renewed"
    );

    // Dropping a lease's last handle releases its key; once all are gone, nothing
    // holds the service but this test.
    let held = |n: usize| {
        (0..10)
            .filter(|i| service.grant(&format!("lease-{i}")).is_some())
            .count()
            == n
    };
    leases.truncate(5);
    tokio::time::sleep(ms(10)).await;
    assert!(held(5));
    drop(leases);
    tokio::time::sleep(ms(10)).await;
    assert!(held(0));
    assert_eq!(Arc::strong_count(&service), 1, "the driver task ended");
}

#[tokio::test(start_paused = true)]
async fn a_set_spreads_its_leases_over_its_drivers_and_each_keeps_its_own_gate() {
    let service = Arc::new(MemoryService::new());
    let set = LeaseSet::with_drivers(service.clone(), config(900), 4);
    let a = set.acquire("a").await.unwrap();
    let b = set.acquire("b").await.unwrap();
    service.partition(a.owner());
    assert_eq!(
        within(2_000, a.lost()).await,
        LeaseEnd::Lost(LossReason::Expired)
    );
    assert!(a.check().is_err());
    assert_eq!(b.check(), Ok(b.granted_fence()));
    assert!(set.try_acquire("b").await.is_err(), "b is still held");
    service.heal(Scope::All);
}

/// The in-memory service, counting the acquire requests in flight at once.
#[derive(Default)]
struct CountingAcquires {
    service: MemoryService,
    in_flight: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    /// Added to every acquire's and every renewal's round trip, in ms.
    acquire_ms: std::sync::atomic::AtomicU64,
    renew_ms: std::sync::atomic::AtomicU64,
}

/// Waits `delay` ms, then `future`.
async fn after<F: std::future::Future>(
    delay: &std::sync::atomic::AtomicU64,
    future: F,
) -> F::Output {
    let delay = delay.load(std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(ms(delay)).await;
    future.await
}

/// Takes one acquire off the count when its future ends, answered or dropped.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl leasehold_driver::LockService for CountingAcquires {
    fn acquire(
        &self,
        key: &str,
        token: leasehold::OwnerToken,
        identity: &leasehold::Identity,
        ttl: leasehold::Duration,
    ) -> impl std::future::Future<Output = leasehold::AcquireOutcome> + Send {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        let counted = InFlight(&self.in_flight);
        async move {
            let _counted = counted;
            let acquire =
                leasehold_driver::LockService::acquire(&self.service, key, token, identity, ttl);
            after(&self.acquire_ms, acquire).await
        }
    }

    fn renew(
        &self,
        key: &str,
        token: leasehold::OwnerToken,
        fence: Fence,
        ttl: leasehold::Duration,
    ) -> impl std::future::Future<Output = leasehold::RenewOutcome> + Send {
        let renew = leasehold_driver::LockService::renew(&self.service, key, token, fence, ttl);
        after(&self.renew_ms, renew)
    }

    fn release(
        &self,
        key: &str,
        token: leasehold::OwnerToken,
    ) -> impl std::future::Future<Output = leasehold::ReleaseOutcome> + Send {
        leasehold_driver::LockService::release(&self.service, key, token)
    }

    fn holder(
        &self,
        key: &str,
    ) -> impl std::future::Future<Output = leasehold::HolderOutcome> + Send {
        leasehold_driver::LockService::holder(&self.service, key)
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_acquires_goes_out_a_bounded_number_at_a_time() {
    let service = Arc::new(CountingAcquires::default());
    // 40 ms a round trip: 5,000 acquires all in flight at once would be the burst.
    service.service.set_latency(Scope::All, ms(40));
    let set = LeaseSet::with_drivers(service.clone(), config(900), 1);
    let timeline = Timeline::start();
    let acquires: Vec<_> = (0..5_000)
        .map(|i| tokio::spawn(set.acquire(&format!("lease-{i}"))))
        .collect();
    let mut leases = Vec::with_capacity(acquires.len());
    for acquire in acquires {
        leases.push(acquire.await.unwrap().unwrap());
    }
    let most = service.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most <= 256, "{most} acquires were in flight at once");
    assert!(most >= 200, "the driver kept only {most} in flight");
    // 5,000 / 256 rounds of 40 ms, not one round per lease.
    assert!(timeline.now_ms() <= 1_000, "{} ms", timeline.now_ms());
    assert!(leases.iter().all(|lease| lease.check().is_ok()));
}

/// Renewals before acquires: while the leases held are renewed late (here 60 ms after
/// they are sent, past half the 90 ms request timeout), a burst of acquires goes out
/// one at a time, and every one of them is still granted; once renewals come back in
/// time, the burst goes out in full again.
#[tokio::test(start_paused = true)]
async fn while_renewals_come_back_late_acquires_go_out_one_at_a_time() {
    use std::sync::atomic::Ordering::SeqCst;

    let service = Arc::new(CountingAcquires::default());
    service.acquire_ms.store(20, SeqCst);
    let set = LeaseSet::with_drivers(service.clone(), config(900), 1);
    let held = set.acquire("held").await.unwrap();
    service.renew_ms.store(60, SeqCst);
    // The first renewal goes out 300 ms after the grant and comes back 60 ms later.
    tokio::time::sleep(ms(400)).await;

    let burst = |from: usize| {
        let acquires: Vec<_> = (from..from + 50)
            .map(|i| tokio::spawn(set.acquire(&format!("lease-{i}"))))
            .collect();
        async move {
            let mut leases = Vec::with_capacity(acquires.len());
            for acquire in acquires {
                leases.push(acquire.await.unwrap().unwrap());
            }
            leases
        }
    };
    service.most.store(0, SeqCst);
    let late = burst(0).await;
    assert_eq!(
        service.most.load(SeqCst),
        1,
        "acquires in flight while renewals were late"
    );
    assert!(held.check().is_ok());
    assert!(late.iter().all(|lease| lease.check().is_ok()));

    service.renew_ms.store(0, SeqCst);
    // Every lease renews (in time now) within one renew interval.
    tokio::time::sleep(ms(400)).await;
    service.most.store(0, SeqCst);
    let _in_time = burst(50).await;
    assert_eq!(
        service.most.load(SeqCst),
        50,
        "acquires in flight once renewals were in time"
    );
}

#[test]
fn an_acquire_on_a_set_whose_runtime_is_gone_ends_at_once_as_driver_stopped() {
    let first = common::paused_runtime();
    let set = first.block_on(async {
        let set = LeaseSet::with_drivers(Arc::new(MemoryService::new()), config(900), 1);
        // The driver runs (and holds nothing yet).
        tokio::task::yield_now().await;
        set
    });
    drop(first); // the driver task goes with its runtime; the set does not
    let second = common::paused_runtime();
    // On a paused clock a hang would run into the bound at once, not after 60 s.
    let outcome =
        second.block_on(async { tokio::time::timeout(ms(60_000), set.acquire("k")).await });
    assert!(
        matches!(outcome, Ok(Err(AcquireError::DriverStopped))),
        "{outcome:?}"
    );
}

/// One set's leases share its default identity, and a lease that names its own is
/// granted under it without changing what the set's next leases are granted under.
#[tokio::test(start_paused = true)]
async fn a_sets_leases_are_granted_under_their_own_identity_or_the_sets() {
    let service = Arc::new(MemoryService::new());
    let set = LeaseSet::with_drivers(Arc::clone(&service), config(3_000), 1);
    let worker = leasehold::Identity::new("worker-7").unwrap();
    let first = set.acquire("first").await.unwrap();
    let named = set
        .acquire_with(
            "named",
            leasehold_tokio::AcquireOptions::new().identity(worker),
        )
        .await
        .unwrap();
    let after = set.acquire("after").await.unwrap();

    let default = service.grant("first").unwrap().identity;
    assert!(
        default
            .as_str()
            .ends_with(&format!(":{}", std::process::id())),
        "{default}"
    );
    assert_eq!(service.grant("named").unwrap().identity, worker);
    assert_eq!(service.grant("after").unwrap().identity, default);
    drop((first, named, after));
}
