//! A Redis that lost its state grants nothing until every grant it may have forgotten
//! has expired: the quarantine, against real `redis-server` processes.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use common::*;
use leasehold::{AcquireOutcome, Duration, Identity, Owner, Term};
use leasehold_conformance::{a_lost_state_grants_nothing_until_the_quarantine_ends, Capabilities};
use leasehold_driver::LockService;
use leasehold_redis::{Acquired, RedisLockError, RedisLockService};
use leasehold_test_support::Contest;

/// The quarantine (the services' `max_ttl`) these tests configure.
const QUARANTINE: StdDuration = StdDuration::from_millis(1_500);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn quarantined_service(url: &str) -> RedisLockService {
    RedisLockService::builder(url)
        .request_timeout(std_ms(1_000))
        .max_ttl(QUARANTINE)
        .connect_lazily()
        .await
        .expect("a usable URL")
}

fn caps() -> Capabilities {
    Capabilities::redis(Duration::from_millis(300))
}

/// The conformance clause with `lose` as the loss of state; panics on a violation.
async fn clause<F: std::future::Future<Output = ()>>(
    service: &RedisLockService,
    lose: impl FnOnce() -> F,
) {
    let verdict = a_lost_state_grants_nothing_until_the_quarantine_ends(
        service,
        &caps(),
        QUARANTINE.into(),
        lose,
    )
    .await;
    if let Err(violation) = verdict {
        panic!("{violation}");
    }
}

#[test]
fn flushall_starts_a_quarantine() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = quarantined_service(&server.url()).await;
        clause(&service, || async {
            assert_eq!(server.inline("FLUSHALL").as_deref(), Some("+OK\r\n"));
        })
        .await;
    });
}

#[test]
fn a_restart_without_persistence_starts_a_quarantine() {
    let server = Mutex::new(RedisServer::start());
    runtime().block_on(async {
        let url = server.lock().unwrap().url();
        let service = quarantined_service(&url).await;
        clause(&service, || async {
            tokio::task::block_in_place(|| server.lock().unwrap().restart());
        })
        .await;
    });
}

/// A snapshot taken before the grant, loaded by a restart: the marker survives in it,
/// but it was written by the process before the restart (another `run_id`).
#[test]
fn a_restart_from_an_older_snapshot_starts_a_quarantine() {
    let server = Mutex::new(RedisServer::start());
    runtime().block_on(async {
        let url = server.lock().unwrap().url();
        assert_eq!(
            server.lock().unwrap().inline("SAVE").as_deref(),
            Some("+OK\r\n")
        );
        let service = quarantined_service(&url).await;
        clause(&service, || async {
            tokio::task::block_in_place(|| server.lock().unwrap().restart());
            let epoch = server.lock().unwrap().inline("GET {leasehold}:epoch");
            assert!(
                epoch.is_some_and(|e| e.starts_with('$')),
                "the snapshot kept the marker"
            );
        })
        .await;
    });
}

/// The clause can fail: a loss the service does not notice (the data set flushed and
/// marked new again, as a client that did not know the marker would leave it) lets a
/// contender in at once, and the clause says so.
#[test]
fn the_clause_catches_a_loss_that_starts_no_quarantine() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = quarantined_service(&server.url()).await;
        let verdict = a_lost_state_grants_nothing_until_the_quarantine_ends(
            &service,
            &caps(),
            QUARANTINE.into(),
            || async {
                server.inline("FLUSHALL");
                server.mark_data_set_new();
            },
        )
        .await;
        let violation = verdict.expect_err("an unnoticed loss must break the clause");
        assert!(
            violation
                .detail
                .contains("expected HeldByAnother(quarantine)"),
            "{violation}"
        );
    });
}

/// A TTL above `max_ttl` is refused before anything is sent: the quarantine would not
/// cover such a grant.
#[test]
fn a_ttl_above_max_ttl_is_a_final_refusal() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let service = quarantined_service(&server.url()).await;
        let token = Owner([1; 16]).token(Term(1));
        let too_long = Duration::from(QUARANTINE).saturating_add(Duration::from_millis(1));
        match service
            .try_acquire("k", token, &Identity::EMPTY, too_long)
            .await
        {
            Err(e @ RedisLockError::TtlAboveMax { .. }) => {
                assert!(e.to_string().contains("max_ttl"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            LockService::acquire(&service, "k", token, &Identity::EMPTY, too_long).await,
            AcquireOutcome::Refused(leasehold::Refusal::Unsupported)
        );
        assert!(matches!(
            service
                .try_acquire("k", token, &Identity::EMPTY, QUARANTINE)
                .await,
            Ok(Acquired::Granted { .. })
        ));
    });
}

/// The end-to-end check: two keys, three clients each (holders and
/// contenders), Redis killed with `SIGKILL` and restarted without persistence while
/// they run. Every client's `check()` is sampled every millisecond: never two per
/// key. The first grant after the restart comes one quarantine after Redis answers
/// again (the first acquire after the restart starts it), within a retry and the
/// restart's own latency.
#[test]
fn kill_9_restart_without_persistence_never_lets_two_holders_pass_check() {
    const TTL_MS: u64 = 800;
    let server = Arc::new(Mutex::new(RedisServer::start()));
    runtime().block_on(async {
        let url = server.lock().unwrap().url();
        let service = Arc::new(
            RedisLockService::builder(&url)
                .request_timeout(std_ms(500))
                .max_ttl(std_ms(TTL_MS))
                .connect_lazily()
                .await
                .unwrap(),
        );
        let contest = Contest::start(
            service,
            &["orders", "payments"],
            3,
            config(TTL_MS),
            std_ms(300),
        );
        wait_for("grants on both keys", std_ms(5_000), || async {
            let grants = contest.grants();
            grants.iter().filter(|g| g.key == "orders").count() >= 2
                && grants.iter().filter(|g| g.key == "payments").count() >= 2
        })
        .await;
        let killed = tokio::time::Instant::now();
        let restarted = tokio::task::spawn_blocking({
            let server = Arc::clone(&server);
            move || {
                server.lock().unwrap().restart();
                tokio::time::Instant::now()
            }
        })
        .await
        .unwrap();
        wait_for("a grant after the restart", std_ms(5_000), || async {
            contest.grants().iter().any(|g| g.at > restarted)
        })
        .await;
        tokio::time::sleep(std_ms(1_000)).await;
        let outcome = contest.stop().await;

        let first = outcome.first_grant_since(restarted).unwrap();
        let waited = first.at - restarted;
        eprintln!(
            "kill -9 + restart took {:?}; first grant {:?} after Redis answered again \
             (quarantine {TTL_MS} ms); {} samples, longest gap {:?}, {} grants, {} overlaps",
            restarted - killed,
            waited,
            outcome.samples,
            outcome.longest_gap,
            outcome.grants.len(),
            outcome.overlaps.len()
        );
        assert!(
            outcome.overlaps.is_empty(),
            "two holders passed check(): {:?}",
            &outcome.overlaps[..outcome.overlaps.len().min(5)]
        );
        assert!(outcome.samples > 1_000, "{} samples", outcome.samples);
        assert!(
            waited >= std_ms(TTL_MS) && waited <= std_ms(TTL_MS + 400),
            "the quarantine lasted {waited:?}, configured {TTL_MS} ms"
        );
    });
}

/// The marker `mark_data_set_new` writes is the one the acquire script reads, and the
/// one the test servers start with: a marked Redis grants at once, an unmarked one
/// quarantines.
#[test]
fn a_data_set_marked_new_grants_at_once() {
    let server = RedisServer::start_with(RedisOptions {
        unmarked: true,
        ..RedisOptions::default()
    });
    runtime().block_on(async {
        let service = quarantined_service(&server.url()).await;
        let token = Owner([2; 16]).token(Term(1));
        let acquire = || service.try_acquire("k", token, &Identity::EMPTY, ms(100));
        assert!(matches!(acquire().await, Ok(Acquired::Quarantined { .. })));
        service.mark_data_set_new().await.unwrap();
        assert!(matches!(acquire().await, Ok(Acquired::Granted { .. })));
        service.try_release("k", token).await.unwrap();
        assert_eq!(server.inline("FLUSHALL").as_deref(), Some("+OK\r\n"));
        server.mark_data_set_new();
        assert!(matches!(acquire().await, Ok(Acquired::Granted { .. })));
    });
}

/// A quarantine longer than the scripts can time is a configuration error, at once.
#[test]
fn a_max_ttl_too_long_to_time_is_refused_at_connect() {
    runtime().block_on(async {
        let too_long = StdDuration::from_millis(1 << 44);
        for lazily in [false, true] {
            let builder = RedisLockService::builder("redis://127.0.0.1:1").max_ttl(too_long);
            let result = if lazily {
                builder.connect_lazily().await
            } else {
                builder.connect().await
            };
            match result {
                Err(e @ RedisLockError::Config { .. }) => {
                    assert!(e.to_string().contains("max_ttl"), "{e}")
                }
                other => panic!("{other:?}"),
            }
        }
    });
}
