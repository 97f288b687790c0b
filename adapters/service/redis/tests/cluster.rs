//! `leasehold-redis` on a real local Redis Cluster (feature `cluster`): three primaries
//! with a replica each, started by the test (`redis-cli --cluster create`).
//!
//! * The service contract, clause by clause, as on one server.
//! * 10,000 leases (2,000 in a debug build, see [`LEASES`]) in one `LeaseSet`, spread over every primary's slots, while a
//!   primary is killed (its replica takes over) and then while 300 slots migrate
//!   between the two other primaries: every lease on the healthy primaries survives
//!   both, the migrating ones included; every lease on the dead primary either
//!   survives on the promoted replica or ends with its gate closed, and a contender
//!   that takes its key next gets a newer fence (the replica had every grant: the
//!   test waits for replication before the kill) while the old holder's `check()`
//!   already refuses.
//! * A primary that hangs (SIGSTOP: its connections stay open, nothing ever fails on
//!   them): once its replica takes over, requests for its slots reach the replica.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use leasehold::{Config, Duration};
use leasehold_conformance::breach::the_timing_clauses_catch_early_expiry;
use leasehold_conformance::{run_all, Capabilities};
use leasehold_redis::{Keys, RedisClusterLockService, RedisLockService};
use leasehold_test_support::RedisCluster;
use leasehold_tokio::{AcquireOptions, LeaseHandle, LeaseSet};

/// Leases in the failover test: 10,000 in an optimised build (`cargo test --release`),
/// 2,000 in a debug build. The set's one driver task steps every lease; unoptimised,
/// on two cores, it cannot keep up with 10,000 renewals while the dead primary's
/// leases retry every retry interval, and leases on the healthy primaries then expire
/// in the client, not in Redis (measured: about 1 core busy, renewals timing out
/// before they reached a connection).
const LEASES: usize = if cfg!(debug_assertions) {
    2_000
} else {
    10_000
};

fn config() -> Config {
    Config::builder(Duration::from_secs(3)).build().unwrap()
}

async fn start_cluster() -> (RedisCluster, Arc<RedisClusterLockService>) {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .unwrap();
    // TTLs up to 3 s, so the quarantine after a failover (the promoted replica is
    // another process than the one that started its slots' epochs) lasts 3 s.
    let service = RedisLockService::connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster")
        .with_max_ttl(StdDuration::from_secs(3));
    // A new cluster: every slot's first grant is immediate.
    service
        .mark_data_set_new()
        .await
        .expect("mark every slot's epoch");
    (cluster, Arc::new(service))
}

/// The slot of lease key `name`: its lock key is `{name}`.
fn slot(name: &str) -> u16 {
    Keys::new(name).unwrap().slot()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_the_contract() {
    let (cluster, service) = start_cluster().await;
    // The slot the test computes is the cluster's.
    for name in ["orders", "lease-0", "lease-9999"] {
        assert_eq!(cluster.slot_of(&format!("{{{name}}}")), slot(name));
    }
    let caps = Capabilities::redis(Duration::from_millis(300));
    run_all(&*service, &caps).await;
    // And the timing clauses see a cluster that expires keys early.
    the_timing_clauses_catch_early_expiry(&*service, &caps, &caps).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_ride_out_a_failover_and_a_slot_migration() {
    let (mut cluster, service) = start_cluster().await;
    let set = LeaseSet::new(service.clone(), config());
    let names: Vec<String> = (0..LEASES).map(|i| format!("lease-{i}")).collect();

    // Acquire them all, spread over two seconds.
    let start = tokio::time::Instant::now();
    let mut acquiring = Vec::with_capacity(LEASES);
    for (i, name) in names.iter().enumerate() {
        let at = start + StdDuration::from_secs(2).mul_f64(i as f64 / LEASES as f64);
        tokio::time::sleep_until(at).await;
        acquiring.push(tokio::spawn(set.acquire(name)));
    }
    let mut leases: Vec<LeaseHandle> = Vec::with_capacity(LEASES);
    for acquire in acquiring {
        leases.push(acquire.await.unwrap().expect("acquire on the cluster"));
    }

    // Which primary serves each lease.
    let topology = cluster.topology();
    let primary_of = |name: &str| {
        let slot = slot(name);
        topology
            .iter()
            .find(|n| n.primary && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|n| n.port)
            .expect("every slot is served")
    };
    let primaries: Vec<u16> = names.iter().map(|n| primary_of(n)).collect();
    let per_primary: BTreeMap<u16, usize> = primaries.iter().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(*p).or_default() += 1;
        m
    });
    assert_eq!(
        per_primary.len(),
        3,
        "leases on every primary: {per_primary:?}"
    );

    // ----- a primary dies; its replica (which has every grant) takes over -----
    let victim = primaries[0];
    let affected: Vec<usize> = (0..LEASES).filter(|&i| primaries[i] == victim).collect();
    // Contenders wait on a sample of the victim's keys: whoever gets a key next must
    // find the old holder's gate closed, and a newer fence.
    let contenders = LeaseSet::new(service.clone(), config());
    let waiting: Vec<(usize, tokio::task::JoinHandle<_>)> = affected
        .iter()
        .take(100)
        .map(|&i| {
            let options = AcquireOptions::new().max_wait(StdDuration::from_secs(60));
            (i, tokio::spawn(contenders.acquire_with(&names[i], options)))
        })
        .collect();
    {
        let cluster = &cluster;
        tokio::task::block_in_place(|| cluster.wait_replicated(victim));
    }
    cluster.kill(victim);
    tokio::task::block_in_place(|| cluster.wait_taken_over(victim));
    // Two TTLs on the new topology: a lease still held has renewed on the promoted
    // replica several times.
    tokio::time::sleep(StdDuration::from_secs(6)).await;

    let mut ended = 0;
    for &i in &affected {
        let lease = &leases[i];
        match lease.end() {
            None => assert!(lease.check().is_ok(), "{} held, but refuses", names[i]),
            Some(end) => {
                ended += 1;
                assert!(
                    lease.check().is_err(),
                    "{} ended ({end:?}) but passes",
                    names[i]
                );
            }
        }
    }
    let healthy_ended: Vec<_> = (0..LEASES)
        .filter(|&i| primaries[i] != victim)
        .filter_map(|i| leases[i].end().map(|end| (&names[i], end)))
        .collect();
    assert!(
        healthy_ended.is_empty(),
        "{} leases on healthy primaries ended, e.g. {:?}",
        healthy_ended.len(),
        &healthy_ended[..healthy_ended.len().min(5)]
    );
    // Every sampled key changes hands: the leases that ended were given up by the
    // failover, the ones that survived are released now. Each contender must get its
    // key (within its 60 s bound), with a newer fence, while the old holder's gate
    // refuses.
    let mut released = 0;
    for &(i, _) in &waiting {
        if leases[i].end().is_none() {
            leases[i].release().await;
            released += 1;
        }
    }
    let sampled = waiting.len();
    assert_eq!(sampled, 100, "contenders on 100 of the dead primary's keys");
    let mut taken = 0;
    for (i, contender) in waiting {
        let next = contender
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("the contender for {} got no key: {e:?}", names[i]));
        taken += 1;
        assert!(leases[i].check().is_err(), "two holders of {}", names[i]);
        assert!(
            next.granted_fence() > leases[i].granted_fence(),
            "{}: fence {:?} after {:?}",
            names[i],
            next.granted_fence(),
            leases[i].granted_fence()
        );
        next.release().await;
    }
    assert_eq!(taken, sampled, "every contender took its key");
    println!(
        "failover: {} of the dead primary's {} leases ended safely, the rest survived; \
         contenders took all {taken} sampled keys ({released} released by their holders)",
        ended,
        affected.len()
    );

    // ----- slots migrate between the two other primaries, keys and all -----
    let others: Vec<u16> = per_primary
        .keys()
        .copied()
        .filter(|&p| p != victim)
        .collect();
    let (from, to) = (others[0], others[1]);
    let before = cluster.topology();
    tokio::task::block_in_place(|| cluster.reshard(from, to, 300));
    let after = cluster.topology();
    let served = |nodes: &[leasehold_test_support::ClusterNode], port: u16| -> BTreeSet<u16> {
        nodes
            .iter()
            .filter(|n| n.port == port && n.primary)
            .flat_map(|n| n.slots.iter().flat_map(|&(a, b)| a..=b))
            .collect()
    };
    let moved: BTreeSet<u16> = served(&before, from)
        .difference(&served(&after, from))
        .copied()
        .collect();
    assert_eq!(moved.len(), 300, "the reshard moved 300 slots");
    tokio::time::sleep(StdDuration::from_secs(4)).await;

    // Redirections are followed (`MOVED`, and `ASK` while a slot is half moved), so
    // a migration ends no lease at all.
    let moved_leases: Vec<usize> = (0..LEASES)
        .filter(|&i| primaries[i] != victim && moved.contains(&slot(&names[i])))
        .collect();
    assert!(!moved_leases.is_empty(), "leases on the moved slots");
    let ended: Vec<_> = (0..LEASES)
        .filter(|&i| primaries[i] != victim)
        .filter_map(|i| leases[i].end().map(|end| (&names[i], end)))
        .collect();
    assert!(
        ended.is_empty(),
        "{} leases ended across the migration, e.g. {:?}",
        ended.len(),
        &ended[..ended.len().min(5)]
    );
    assert!(moved_leases.iter().all(|&i| leases[i].check().is_ok()));
    println!(
        "migration: all {} leases on the 300 moved slots survived",
        moved_leases.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_stops_answering_is_routed_around_once_its_replica_takes_over() {
    use leasehold::{Identity, Owner, Term};
    use leasehold_redis::Acquired;

    let (mut cluster, service) = start_cluster().await;
    let who = Identity::new("test:1").unwrap();
    let ttl = Duration::from_secs(3);
    // Two keys on the same primary: one used before it hangs (so the client holds an
    // open connection to it), one asked for after its replica took over.
    let victim = tokio::task::block_in_place(|| cluster.primary_of(slot("orders"))).unwrap();
    let other = (0..)
        .map(|i| format!("k-{i}"))
        .find(|name| tokio::task::block_in_place(|| cluster.primary_of(slot(name))) == Some(victim))
        .unwrap();
    let first = service
        .try_acquire("orders", Owner([1; 16]).token(Term(1)), &who, ttl)
        .await;
    assert!(matches!(first, Ok(Acquired::Granted { .. })), "{first:?}");

    // SIGSTOP: its connections stay open and nothing ever answers or fails on them.
    cluster.pause(victim);
    tokio::task::block_in_place(|| cluster.wait_taken_over(victim));

    // The replica serves the slots now; the client must find that out by itself,
    // from its requests to the old primary going unanswered.
    let give_up = tokio::time::Instant::now() + StdDuration::from_secs(10);
    let token = Owner([2; 16]).token(Term(1));
    let granted = loop {
        match service.try_acquire(&other, token, &who, ttl).await {
            Ok(Acquired::Granted { .. }) => break true,
            _ if tokio::time::Instant::now() >= give_up => break false,
            // The promoted replica answers: its quarantine ends after one TTL.
            Ok(Acquired::Quarantined { remaining }) => tokio::time::sleep(remaining.into()).await,
            // A request to the hung node waits out its timeout; others fail at once.
            _ => {}
        }
    };
    cluster.resume(victim);
    assert!(
        granted,
        "requests for the hung primary's slots never reached its promoted replica"
    );
}

/// Seeds that cannot work fail `connect_cluster` at once with a typed error: none
/// given, a URL that is not one, and nodes where nobody listens (within the bound of
/// one connect attempt per seed, never a hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_seeds_fail_connect_cluster_with_a_typed_error_promptly() {
    use leasehold_redis::RedisLockError;

    let none = RedisLockService::connect_cluster(Vec::<String>::new()).await;
    assert!(
        matches!(none, Err(RedisLockError::Config { .. })),
        "{none:?}"
    );
    let garbage = RedisLockService::connect_cluster(["not a url"]).await;
    assert!(
        matches!(garbage, Err(RedisLockError::Config { .. })),
        "{garbage:?}"
    );
    // Two free loopback ports: connection refused on both.
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let seeds = [
        format!("redis://127.0.0.1:{}", free()),
        format!("redis://127.0.0.1:{}", free()),
    ];
    let down = tokio::time::timeout(
        StdDuration::from_secs(5),
        RedisLockService::connect_cluster(&seeds),
    )
    .await
    .expect("an answer within the connect bound");
    assert!(
        matches!(
            down,
            Err(RedisLockError::Transport { .. } | RedisLockError::Timeout { .. })
        ),
        "{down:?}"
    );
}

/// `min_replicas` on a cluster: each grant and renewal waits for the replica of its
/// slot's primary (the `WAIT` goes to the same node as the script); asking for more
/// replicas than a primary has is an unknown outcome, never a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_on_a_cluster_waits_for_each_slots_replica() {
    use leasehold::{Identity, Owner, Term};
    use leasehold_redis::{Acquired, RedisLockError, Renewed};

    let (_cluster, service) = start_cluster().await;
    let one = (*service).clone().with_min_replicas(1);
    let ttl = Duration::from_secs(3);
    let token = Owner([3; 16]).token(Term(1));
    for name in ["orders", "lease-1", "lease-2", "lease-3"] {
        let Ok(Acquired::Granted { fence, .. }) =
            one.try_acquire(name, token, &Identity::EMPTY, ttl).await
        else {
            panic!("{name}: not granted with one replica confirming")
        };
        assert_eq!(
            one.try_renew(name, token, fence, ttl).await.unwrap(),
            Renewed::Renewed { ttl }
        );
    }
    let two = (*service).clone().with_min_replicas(2);
    let token = Owner([4; 16]).token(Term(1));
    match two.try_acquire("k-two", token, &Identity::EMPTY, ttl).await {
        Err(RedisLockError::TooFewReplicas {
            wanted: 2,
            confirmed: 1,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

/// A fair service on a cluster (`with_fair(true)` on the same type): for keys on
/// every primary, the queue keys share the lock's slot and contenders are granted in
/// the order they queued, a latecomer being told whose turn it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_cluster_grants_in_queue_order_on_every_primary() {
    use leasehold::{Fence, Identity, Term};
    use leasehold_redis::{Acquired, QueueKeys};
    let (cluster, service) = start_cluster().await;
    let fair = (*service).clone().with_fair(true);
    let ttl = StdDuration::from_secs(3);
    let token = || leasehold_redis::random_owner().unwrap().token(Term(1));
    let id = |s: &str| Identity::new(s).unwrap();
    let mut primaries = BTreeSet::new();
    for i in 0..6 {
        let key = format!("fair-{i}");
        let queue = QueueKeys::new(&key).unwrap();
        for k in [&queue.queue, &queue.waiters, &queue.arrivals] {
            assert_eq!(cluster.slot_of(k), slot(&key), "{k}");
        }
        primaries.insert(slot(&key) / 5_462);
        let (h, a, b, c) = (token(), token(), token(), token());
        let granted = fair.try_acquire(&key, h, &id("h"), ttl).await.unwrap();
        assert!(matches!(granted, Acquired::Granted { .. }), "{granted:?}");
        for (t, name) in [(a, "a"), (b, "b"), (c, "c")] {
            let answer = fair.try_acquire(&key, t, &id(name), ttl).await.unwrap();
            assert!(matches!(answer, Acquired::HeldByAnother(_)), "{answer:?}");
        }
        assert_eq!(
            fair.waiting(&key).await.unwrap(),
            [id("a"), id("b"), id("c")]
        );
        fair.try_release(&key, h).await.unwrap();
        let line = [(a, "a"), (b, "b"), (c, "c")];
        for (i, &(t, name)) in line.iter().enumerate() {
            // Everyone behind `name` is told it is `name`'s turn.
            for &(later, later_name) in &line[i + 1..] {
                let answer = fair
                    .try_acquire(&key, later, &id(later_name), ttl)
                    .await
                    .unwrap();
                let Acquired::HeldByAnother(turn) = answer else {
                    panic!("{answer:?}")
                };
                assert_eq!((turn.fence, turn.identity), (Fence(0), id(name)));
            }
            let granted = fair.try_acquire(&key, t, &id(name), ttl).await.unwrap();
            assert!(
                matches!(granted, Acquired::Granted { .. }),
                "{name}: {granted:?}"
            );
            fair.try_release(&key, t).await.unwrap();
        }
        assert!(fair.waiting(&key).await.unwrap().is_empty());
    }
    // `RedisCluster::start(3, _)` gives each primary a third of the slots.
    assert_eq!(primaries.len(), 3, "keys on every primary");
}
