//! Fair acquires (`EtcdLockService::with_fair`) on a real single-member etcd:
//! contenders are granted in arrival order, one that stops asking is skipped within
//! its TTL, a service that is not fair behaves as before, and keys under the queue's
//! prefix that are not places are ignored (or, at the contender's own place, refused
//! with a typed error). The conformance suite against a fair service is in
//! `conformance.rs`.

mod common;

use std::sync::{Arc, Mutex};

use common::{
    client, config, hold, identity, ms, service, std_ms, token, wait_for, within, EtcdCluster,
};
use etcd_client::PutOptions;
use leasehold::{Fence, Identity, OwnerToken};
use leasehold_etcd::{Acquired, ErrorKind, EtcdLockService, Released};
use leasehold_tokio::{acquire_with, AcquireOptions, LeaseEnd};
use tokio::time::Instant;

const KEY: &str = "fair";
/// The TTL each contender asks: its place in the queue lasts as long.
const TTL_MS: u64 = 2_000;

async fn fair(cluster: &EtcdCluster) -> EtcdLockService {
    service(cluster).await.with_fair(true)
}

/// Waits until the queue of `key` is exactly `expected`, oldest first.
async fn queue_is(service: &EtcdLockService, key: &str, expected: &[Identity]) {
    let what = format!("the queue of {key} to be {expected:?}");
    wait_for(&what, std_ms(5_000), || async {
        service.waiting(key).await.expect("waiting") == expected
    })
    .await;
}

async fn try_acquire(service: &EtcdLockService, token: OwnerToken, who: &str) -> Acquired {
    service
        .try_acquire(KEY, token, &identity(who), ms(TTL_MS))
        .await
        .unwrap_or_else(|e| panic!("acquire by {who}: {e}"))
}

#[track_caller]
fn assert_granted(answer: Acquired) {
    assert!(
        matches!(answer, Acquired::Granted { .. }),
        "expected a grant, got {answer:?}"
    );
}

#[track_caller]
fn assert_held_by(answer: Acquired, who: &str) {
    match answer {
        Acquired::HeldByAnother(holder) if holder.identity == identity(who) => {}
        other => panic!("expected the key held by {who}, got {other:?}"),
    }
}

/// Eight contenders, each through the tokio adapter on a fair service of its own (as
/// eight processes would be), join the queue behind a holder one after the other
/// (each seen queued before the next starts); after the holder releases, each is
/// granted in exactly that order, and the queue is empty at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_are_granted_in_arrival_order() {
    let cluster = EtcdCluster::single();
    let observer = fair(&cluster).await;
    let holder = hold(&observer, KEY, TTL_MS).await;
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut queued = Vec::new();
    let mut contenders = Vec::new();
    for i in 0..8 {
        let name = identity(&format!("contender-{i}"));
        let service = Arc::new(fair(&cluster).await);
        let granted = granted.clone();
        contenders.push(tokio::spawn(async move {
            let options = AcquireOptions::new().identity(name);
            let lease = acquire_with(service, KEY, config(TTL_MS), options)
                .await
                .unwrap_or_else(|e| panic!("contender {i}: {e}"));
            granted.lock().unwrap().push(i);
            assert_eq!(lease.release().await, LeaseEnd::Released);
        }));
        queued.push(name);
        queue_is(&observer, KEY, &queued).await;
    }
    assert_eq!(holder.release().await, LeaseEnd::Released);
    for contender in contenders {
        within(20_000, contender).await.expect("a contender");
    }
    assert_eq!(*granted.lock().unwrap(), (0..8).collect::<Vec<_>>());
    queue_is(&observer, KEY, &[]).await;
}

/// A contender that joined the queue and then stops asking (killed: no release, no
/// more attempts, so no keep-alive of its place) holds up the one behind it for at
/// most its TTL (plus etcd's expiry lag): while its place lives, the free key is its
/// turn (fence 0, its identity); then the next contender is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_that_stops_asking_is_skipped_within_its_ttl() {
    let cluster = EtcdCluster::single();
    let service = fair(&cluster).await;
    let (holder, ghost, next) = (token(), token(), token());
    let held = service
        .try_acquire(KEY, holder, &identity("holder"), ms(10_000))
        .await
        .expect("the holder's acquire");
    assert_granted(held);
    let asked = Instant::now();
    assert_held_by(try_acquire(&service, ghost, "ghost").await, "holder");
    // From here on the ghost asks nothing: its place expires TTL after this.
    assert_held_by(try_acquire(&service, next, "next").await, "holder");
    queue_is(&service, KEY, &[identity("ghost"), identity("next")]).await;
    assert_eq!(
        service.try_release(KEY, holder).await.expect("release"),
        Released::Released
    );

    // `next` asks every 50 ms, as a lease retries: the ghost's turn, then its grant.
    let limit = std_ms(TTL_MS + 1_500 + 1_000);
    let mut turns = 0;
    let skipped_after = loop {
        match try_acquire(&service, next, "next").await {
            Acquired::Granted { .. } => break asked.elapsed(),
            Acquired::HeldByAnother(turn) => {
                assert_eq!(turn.identity, identity("ghost"), "{turn:?}");
                assert_eq!(turn.fence, Fence(0), "a turn, not a grant: {turn:?}");
                assert!(turn.remaining <= ms(TTL_MS), "{turn:?}");
                turns += 1;
            }
            other => panic!("expected the ghost's turn or a grant, got {other:?}"),
        }
        assert!(asked.elapsed() < limit, "next not granted within {limit:?}");
        tokio::time::sleep(std_ms(50)).await;
    };
    eprintln!("the ghost was skipped {skipped_after:?} after its last attempt (TTL {TTL_MS} ms), {turns} answers `its turn`");
    assert!(turns > 0, "the ghost's place was never seen");
    // etcd never expires a lease early; its lessor checks every 500 ms and revokes
    // through raft.
    assert!(skipped_after >= std_ms(TTL_MS - 100), "{skipped_after:?}");
    assert!(skipped_after <= std_ms(TTL_MS + 1_500), "{skipped_after:?}");
    queue_is(&service, KEY, &[]).await;
}

/// Not fair (the default): nothing is queued (no key under the queue's prefix), and a
/// freed key goes to whoever asks first, also ahead of a fair contender's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fair_nothing_is_queued_and_anyone_takes_a_freed_key() {
    let cluster = EtcdCluster::single();
    let plain = service(&cluster).await;
    assert!(!plain.fair());
    let mut outside = client(&cluster).await;
    let (holder, first, second, late) = (token(), token(), token(), token());
    assert_granted(try_acquire(&plain, holder, "holder").await);
    assert_held_by(try_acquire(&plain, first, "first").await, "holder");
    assert_held_by(try_acquire(&plain, second, "second").await, "holder");
    let prefix = format!("{KEY}{{queue}}/");
    let under = outside
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert!(under.kvs().is_empty(), "{:?}", under.kvs());
    assert!(plain.waiting(KEY).await.expect("waiting").is_empty());

    // A fair contender queues; the plain `late`, who asked after it, takes the key.
    let fair = fair(&cluster).await;
    assert_held_by(try_acquire(&fair, first, "first").await, "holder");
    queue_is(&plain, KEY, &[identity("first")]).await;
    plain.try_release(KEY, holder).await.expect("release");
    assert_granted(try_acquire(&plain, late, "late").await);
}

/// Keys under the queue's prefix that are not places (a name that is not a token, no
/// lease, a value that is not an identity) never have the turn: the first contender
/// is granted at once, `waiting` leaves them out, and the order of real places holds.
/// Something else at a contender's own place is a `WrongType` error, granting
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_under_the_queue_that_are_not_places_are_ignored_or_refused() {
    let cluster = EtcdCluster::single();
    let service = fair(&cluster).await;
    let mut outside = client(&cluster).await;
    let lease = outside.lease_grant(30, None).await.expect("grant").id();
    let on_lease = Some(PutOptions::new().with_lease(lease));
    let place = |token: OwnerToken| format!("{KEY}{{queue}}/{}", token.encode().as_str());
    for (name, value, options) in [
        (
            format!("{KEY}{{queue}}/not-a-token"),
            "x".to_owned(),
            on_lease.clone(),
        ),
        (
            format!("{KEY}{{queue}}/"),
            "empty name".to_owned(),
            on_lease.clone(),
        ),
        (place(token()), "no lease".to_owned(), None),
        (place(token()), "bell\u{7}".to_owned(), on_lease.clone()),
        (place(token()), "x".repeat(200), on_lease.clone()),
    ] {
        outside.put(name, value, options).await.expect("put");
    }
    assert!(service.waiting(KEY).await.expect("waiting").is_empty());

    let (first, second, spoiled) = (token(), token(), token());
    assert_granted(try_acquire(&service, first, "first").await);
    assert_held_by(try_acquire(&service, second, "second").await, "first");
    queue_is(&service, KEY, &[identity("second")]).await;

    outside
        .put(place(spoiled), "junk", None)
        .await
        .expect("put");
    let refused = service
        .try_acquire(KEY, spoiled, &identity("spoiled"), ms(TTL_MS))
        .await
        .expect_err("a place that holds something else");
    assert_eq!(refused.kind(), ErrorKind::WrongType, "{refused}");
    let holder = service
        .try_holder(KEY)
        .await
        .expect("holder")
        .expect("held");
    assert_eq!(holder.identity, identity("first"));

    service.try_release(KEY, first).await.expect("release");
    assert_granted(try_acquire(&service, second, "second").await);
    assert!(service.waiting(KEY).await.expect("waiting").is_empty());
}

/// A contender through the tokio adapter that gives up (`max_wait`) sends no release
/// (unless an attempt was in flight, which may have been granted): its place leaves
/// within its TTL, as a killed one's. Its service then forgets the place and closes its keep-alive
/// stream at its next fair acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_that_gives_up_leaves_the_queue_within_its_ttl() {
    let cluster = EtcdCluster::single();
    let service = fair(&cluster).await;
    let holder = hold(&service, KEY, TTL_MS).await;
    let quitter = Arc::new(fair(&cluster).await);
    let options = AcquireOptions::new()
        .identity(identity("quitter"))
        .max_wait(std_ms(500));
    let gave_up = within(
        5_000,
        acquire_with(quitter.clone(), KEY, config(TTL_MS), options),
    )
    .await;
    assert!(gave_up.is_err(), "the key is held: {gave_up:?}");
    let left = Instant::now();
    // Had an attempt been in flight at `max_wait`, the lease would have released (it
    // might have been granted), which takes the place out at once.
    let released = quitter.places() == 0;
    if !released {
        assert_eq!(quitter.keep_alive_streams(), 1, "the place's");
    }
    wait_for(
        "the quitter's place to go",
        std_ms(TTL_MS + 1_500),
        || async { service.waiting(KEY).await.expect("waiting").is_empty() },
    )
    .await;
    eprintln!(
        "the quitter's place went {:?} after it gave up (TTL {TTL_MS} ms; released: {released})",
        left.elapsed()
    );
    let (other, who) = (token(), identity("quitter"));
    wait_for(
        "the quitter's service to forget its place",
        std_ms(1_000),
        || async {
            let answer = quitter.try_acquire("other", other, &who, ms(TTL_MS)).await;
            assert!(matches!(answer, Ok(Acquired::Granted { .. })), "{answer:?}");
            quitter.try_release("other", other).await.expect("release");
            quitter.places() == 0
        },
    )
    .await;
    assert_eq!(quitter.keep_alive_streams(), 0);
    assert_eq!(holder.release().await, LeaseEnd::Released);
}
