//! The in-memory service keeps the lock-service contract, and its faults do what they
//! say. Paused clock: every instant is exact.

use std::future::Future;
use std::time::Duration as StdDuration;

use leasehold::{
    AcquireOutcome, Duration, Fence, Identity, Owner, OwnerToken, ReleaseOutcome, RenewOutcome,
    Term,
};
use leasehold_driver::LockService;
use tokio::time::Instant;

use super::{MemoryService, Scope};

const TTL: Duration = Duration::from_millis(900);

fn token(owner: u8) -> OwnerToken {
    Owner([owner; 16]).token(Term(1))
}

fn granted(fence: u64) -> AcquireOutcome {
    AcquireOutcome::Granted {
        fence: Fence(fence),
        ttl: TTL,
    }
}

/// Polls `future` once: `Some(output)` if it completed without waiting.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test(start_paused = true)]
async fn fences_strictly_increase_per_key_and_keys_are_independent() {
    let s = MemoryService::new();
    assert_eq!(
        s.acquire("a", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    assert_eq!(
        s.acquire("b", token(2), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    assert_eq!(s.release("a", token(1)).await, ReleaseOutcome::Released);
    assert_eq!(
        s.acquire("a", token(3), &Identity::EMPTY, TTL).await,
        granted(2)
    );
    assert!(s.revoke("a").is_some());
    assert_eq!(
        s.acquire("a", token(1), &Identity::EMPTY, TTL).await,
        granted(3)
    );
    assert_eq!(s.key_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn renew_and_release_compare_the_owner_token_including_the_term() {
    let s = MemoryService::new();
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    let same_owner_old_term = Owner([1; 16]).token(Term(0));
    for other in [token(2), same_owner_old_term] {
        assert!(matches!(
            s.acquire("k", other, &Identity::EMPTY, TTL).await,
            AcquireOutcome::HeldByAnother(_)
        ));
        assert_eq!(
            s.renew("k", other, Fence(1), TTL).await,
            RenewOutcome::NotOwner
        );
        assert_eq!(s.release("k", other).await, ReleaseOutcome::NotOwner);
    }
    assert_eq!(s.grant("k").unwrap().token, token(1));
    assert_eq!(
        s.renew("k", token(1), Fence(1), TTL).await,
        RenewOutcome::Renewed { ttl: TTL }
    );
    assert_eq!(
        s.renew("missing", token(1), Fence(1), TTL).await,
        RenewOutcome::NotOwner
    );
}

#[tokio::test(start_paused = true)]
async fn reacquire_by_the_same_token_is_granted_again_with_the_same_fence() {
    let s = MemoryService::new();
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    tokio::time::advance(StdDuration::from_millis(500)).await;
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    assert_eq!(
        s.grant("k").unwrap().expires_at,
        Instant::now() + StdDuration::from_millis(900),
        "and the TTL restarts"
    );
}

/// `s`'s grant expires exactly its TTL after the service acted, not a microsecond
/// sooner or later.
async fn the_ttl_is_hard(s: MemoryService) {
    let start = Instant::now();
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    assert_eq!(
        s.grant("k").unwrap().expires_at,
        start + StdDuration::from_millis(900)
    );
    tokio::time::advance(StdDuration::from_micros(899_999)).await;
    assert!(matches!(
        s.acquire("k", token(2), &Identity::EMPTY, TTL).await,
        AcquireOutcome::HeldByAnother(_)
    ));
    tokio::time::advance(StdDuration::from_micros(1)).await;
    assert_eq!(s.grant("k"), None);
    assert_eq!(
        s.renew("k", token(1), Fence(1), TTL).await,
        RenewOutcome::NotOwner
    );
    assert_eq!(
        s.acquire("k", token(2), &Identity::EMPTY, TTL).await,
        granted(2)
    );
}

#[tokio::test(start_paused = true)]
async fn the_ttl_is_hard_counted_from_when_the_service_acted() {
    the_ttl_is_hard(MemoryService::new()).await;
}

/// A service made outside the runtime (here on another thread, after the paused clock
/// stopped) is used on a clock that is behind the instant it was made: its grants
/// still expire exactly at their TTL.
#[tokio::test(start_paused = true)]
async fn the_ttl_stays_exact_on_a_clock_behind_the_service_s_creation() {
    the_ttl_is_hard(std::thread::spawn(MemoryService::new).join().unwrap()).await;
}

#[tokio::test(start_paused = true)]
async fn renew_compares_the_fence_so_a_recreated_grant_of_the_same_token_is_not_extended() {
    let s = MemoryService::new();
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    // Deleted from outside; a late duplicate of the same term's acquire re-creates it.
    assert!(s.revoke("k").is_some());
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(2)
    );
    // The client still holds fence 1: its renewal must not keep fence 2 alive.
    assert_eq!(
        s.renew("k", token(1), Fence(1), TTL).await,
        RenewOutcome::NotOwner
    );
    assert_eq!(
        s.renew("k", token(1), Fence(2), TTL).await,
        RenewOutcome::Renewed { ttl: TTL }
    );
}

#[tokio::test(start_paused = true)]
async fn latency_is_half_before_the_service_acts_and_half_after() {
    let s = MemoryService::new();
    s.set_latency(Scope::All, StdDuration::from_millis(60));
    let start = Instant::now();
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    assert_eq!(Instant::now(), start + StdDuration::from_millis(60));
    assert_eq!(
        s.grant("k").unwrap().expires_at,
        start + StdDuration::from_millis(30 + 900)
    );
}

#[tokio::test(start_paused = true)]
async fn dropped_requests_are_never_carried_out_dropped_responses_are() {
    let s = MemoryService::new();
    s.drop_requests(Owner([1; 16]), 1);
    let lost = tokio::time::timeout(
        StdDuration::from_millis(100),
        s.acquire("k", token(1), &Identity::EMPTY, TTL),
    );
    assert!(lost.await.is_err(), "never answered");
    assert_eq!(s.grant("k"), None, "never carried out");
    assert_eq!(s.stats().lost_requests, 1);

    s.drop_responses(Owner([1; 16]), 1);
    let lost = tokio::time::timeout(
        StdDuration::from_millis(100),
        s.acquire("k", token(1), &Identity::EMPTY, TTL),
    );
    assert!(lost.await.is_err(), "never answered");
    assert_eq!(s.grant("k").unwrap().fence, Fence(1), "but carried out");
    // The counters are used up: the next request goes through.
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    assert_eq!(s.stats().lost_responses, 1);
}

#[tokio::test(start_paused = true)]
async fn a_stall_holds_requests_until_unstalled_then_carries_them_out() {
    let s = std::sync::Arc::new(MemoryService::new());
    s.stall(Scope::All);
    let pending = {
        let s = s.clone();
        tokio::spawn(async move { s.acquire("k", token(1), &Identity::EMPTY, TTL).await })
    };
    tokio::time::sleep(StdDuration::from_secs(10)).await;
    assert_eq!(s.grant("k"), None);
    s.unstall(Scope::All);
    assert_eq!(pending.await.unwrap(), granted(1));
}

#[tokio::test(start_paused = true)]
async fn a_partition_loses_requests_even_after_it_heals_and_only_for_that_client() {
    let s = std::sync::Arc::new(MemoryService::new());
    s.partition(Owner([1; 16]));
    let cut_off = {
        let s = s.clone();
        tokio::spawn(async move { s.acquire("k", token(1), &Identity::EMPTY, TTL).await })
    };
    assert_eq!(
        s.acquire("other", token(2), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    tokio::time::sleep(StdDuration::from_secs(1)).await;
    s.heal(Owner([1; 16]));
    tokio::time::sleep(StdDuration::from_secs(1)).await;
    assert!(!cut_off.is_finished());
    assert_eq!(s.grant("k"), None);
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1),
        "healed"
    );
    cut_off.abort();
}

#[tokio::test(start_paused = true)]
async fn client_faults_add_to_global_ones() {
    let s = MemoryService::new();
    s.set_latency(Scope::All, StdDuration::from_millis(10));
    s.set_latency(Owner([1; 16]), StdDuration::from_millis(20));
    let start = Instant::now();
    s.acquire("a", token(1), &Identity::EMPTY, TTL).await;
    assert_eq!(Instant::now(), start + StdDuration::from_millis(30));
    s.acquire("b", token(2), &Identity::EMPTY, TTL).await;
    assert_eq!(Instant::now(), start + StdDuration::from_millis(40));
    s.clear_faults();
    assert_eq!(s.faults(Owner([1; 16])), super::Faults::NONE);
    assert!(
        now_or_never(s.acquire("c", token(1), &Identity::EMPTY, TTL)).is_some(),
        "answered at once"
    );
}

#[tokio::test(start_paused = true)]
async fn revoke_notifies_the_holder_and_expire_now_does_not() {
    let s = MemoryService::new();
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    let mut watching = std::pin::pin!(s.revoked("k", token(1), Fence(1)));
    assert!(now_or_never(watching.as_mut()).is_none());

    s.expire_now("k").unwrap();
    assert!(
        now_or_never(watching.as_mut()).is_none(),
        "an expiry is not announced"
    );

    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(2)
    );
    let mut second = std::pin::pin!(s.revoked("k", token(1), Fence(2)));
    assert!(now_or_never(second.as_mut()).is_none());
    assert_eq!(s.revoke("k").unwrap().fence, Fence(2));
    assert_eq!(now_or_never(second.as_mut()), Some(()));
    assert_eq!(s.grant("k"), None);
    assert!(s.revoke("k").is_none(), "nothing left to revoke");
}

/// Counts its wake-ups.
#[derive(Default)]
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Wakes {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A revocation wakes the watcher of the grant revoked, and nobody else: not the
/// holders of other keys (with a hundred thousand leases, each revocation would
/// otherwise poll every watch), not the watcher of an older grant of the same key,
/// which ended before the newer one was granted. A watcher re-registering keeps its
/// place, and the table keeps no waker past its grant.
#[tokio::test(start_paused = true)]
async fn a_revocation_wakes_only_the_watcher_of_the_grant_revoked() {
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    let s = MemoryService::new();
    let (old, held, other) = (
        Arc::new(Wakes::default()),
        Arc::new(Wakes::default()),
        Arc::new(Wakes::default()),
    );
    let poll = |future: std::pin::Pin<&mut dyn Future<Output = ()>>, wakes: &Arc<Wakes>| {
        let waker = Waker::from(Arc::clone(wakes));
        future.poll(&mut Context::from_waker(&waker))
    };
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    assert_eq!(
        s.acquire("o", token(3), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    let mut first = std::pin::pin!(s.revoked("k", token(1), Fence(1)));
    assert_eq!(poll(first.as_mut(), &old), Poll::Pending);
    s.expire_now("k").unwrap();
    assert_eq!(
        s.acquire("k", token(2), &Identity::EMPTY, TTL).await,
        granted(2)
    );
    let mut second = std::pin::pin!(s.revoked("k", token(2), Fence(2)));
    let mut elsewhere = std::pin::pin!(s.revoked("o", token(3), Fence(1)));
    assert_eq!(poll(second.as_mut(), &held), Poll::Pending);
    assert_eq!(poll(elsewhere.as_mut(), &other), Poll::Pending);
    // The older grant's watcher polls again after the newer one registered.
    assert_eq!(poll(first.as_mut(), &old), Poll::Pending);
    assert_eq!(poll(second.as_mut(), &held), Poll::Pending);

    assert_eq!(s.revoke("k").unwrap().fence, Fence(2));
    assert_eq!((held.count(), other.count(), old.count()), (1, 0, 0));
    assert_eq!(poll(second.as_mut(), &held), Poll::Ready(()));
    assert_eq!(poll(elsewhere.as_mut(), &other), Poll::Pending);
    // Polled, the older grant's watcher completes too: a later grant was revoked.
    assert_eq!(poll(first.as_mut(), &old), Poll::Ready(()));

    // A waker is kept only while its grant lives: a released grant lets go of it (a
    // task's waker holds the finished task's memory).
    assert_eq!(
        Arc::strong_count(&other),
        2,
        "kept while the grant on o lives"
    );
    assert_eq!(s.release("o", token(3)).await, ReleaseOutcome::Released);
    assert_eq!(Arc::strong_count(&other), 1, "dropped with the grant");
}

/// A watch given up lets go of its waker even while its grant is still there: a lease
/// that stopped renewing leaves the grant to expire, and an expired grant goes only
/// when its key is next used.
#[tokio::test(start_paused = true)]
async fn a_watch_given_up_lets_go_of_its_waker() {
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    let s = MemoryService::new();
    let wakes = Arc::new(Wakes::default());
    assert_eq!(
        s.acquire("k", token(1), &Identity::EMPTY, TTL).await,
        granted(1)
    );
    let mut watch = Box::pin(s.revoked("k", token(1), Fence(1)));
    let waker = Waker::from(Arc::clone(&wakes));
    assert_eq!(
        watch.as_mut().poll(&mut Context::from_waker(&waker)),
        Poll::Pending
    );
    drop(waker);
    tokio::time::advance(StdDuration::from_secs(1)).await;
    assert_eq!(Arc::strong_count(&wakes), 2, "kept while the watch waits");
    drop(watch);
    assert_eq!(Arc::strong_count(&wakes), 1, "let go with the watch");
}

/// Keys are spread over shards: leases on many keys from several worker threads each
/// get their own fence counter, and the service's counts add up over every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_keys_from_many_threads_keep_their_own_fences_and_counts_add_up() {
    let service = std::sync::Arc::new(MemoryService::new());
    let workers: Vec<_> = (0..4u8)
        .map(|worker| {
            let service = service.clone();
            tokio::spawn(async move {
                for i in 0..500 {
                    let key = format!("w{worker}-k{i}");
                    let a = token(worker + 1);
                    let grant = service.acquire(&key, a, &Identity::EMPTY, TTL).await;
                    assert_eq!(grant, granted(1), "{key}");
                    let renewed = service.renew(&key, a, Fence(1), TTL).await;
                    assert_eq!(renewed, RenewOutcome::Renewed { ttl: TTL }, "{key}");
                    assert_eq!(service.release(&key, a).await, ReleaseOutcome::Released);
                    // The counter survives the release: the next grant is newer.
                    let again = service.acquire(&key, a, &Identity::EMPTY, TTL).await;
                    assert_eq!(again, granted(2), "{key}");
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(service.key_count(), 2_000);
    let stats = service.stats();
    assert_eq!(
        (stats.acquires, stats.renewals, stats.releases),
        (4_000, 2_000, 2_000)
    );
}
