//! A PostgreSQL that may have lost grants grants nothing until every grant it may
//! have forgotten has expired: the quarantine, against real PostgreSQL processes.
//!
//! The signs (see the crate docs): the epoch row lives in an UNLOGGED table, which
//! PostgreSQL empties after a crash, on a standby and in a base backup; and it names
//! the postmaster's start time, which every start (a clean restart, a restore) changes.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use common::*;
use leasehold::{AcquireOutcome, Duration, Identity, Refusal};
use leasehold_conformance::{a_lost_state_grants_nothing_until_the_quarantine_ends, Capabilities};
use leasehold_driver::LockService;
use leasehold_postgres::{Acquired, ErrorKind, PostgresLockService};
use leasehold_test_support::Contest;

/// The quarantine (the services' `max_ttl`) these tests configure.
const QUARANTINE: StdDuration = StdDuration::from_millis(1_500);

fn caps() -> Capabilities {
    Capabilities::postgres(Duration::from_millis(300))
}

/// A service on `server` with the test quarantine, its data set marked new, and the
/// tables on disk (the test servers commit asynchronously: without the checkpoint a
/// crash could lose the tables themselves, and every request would then be refused
/// as a missing table).
async fn quarantined_service(port: u16) -> PostgresLockService {
    let service = service_with(&url_on(port), QUARANTINE).await;
    service.mark_data_set_new().await.unwrap();
    raw(port).await.batch_execute("CHECKPOINT").await.unwrap();
    service
}

/// The conformance clause with `lose` as the loss of state; panics on a violation.
async fn clause<F: std::future::Future<Output = ()>>(
    service: &PostgresLockService,
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

/// `kill -9` of the postmaster and its processes, then a start: with
/// `synchronous_commit = off` (the test servers') the last commits are lost.
#[test]
fn a_crash_and_restart_starts_a_quarantine() {
    let server = Mutex::new(PostgresServer::start());
    runtime().block_on(async {
        let port = server.lock().unwrap().port();
        let service = quarantined_service(port).await;
        clause(&service, || async {
            tokio::task::block_in_place(|| {
                let mut server = server.lock().unwrap();
                server.kill();
                server.restart();
            });
            // What a lost commit looks like: the grant's row rolled back.
            let raw = raw(port).await;
            raw.batch_execute("UPDATE leasehold_leases SET owner = NULL, expires_at = NULL")
                .await
                .unwrap();
        })
        .await;
    });
}

/// A backend killed: PostgreSQL resets every session and runs crash recovery without
/// restarting the postmaster (its start time stays); only the unlogged epoch row,
/// emptied by the recovery, tells.
#[test]
fn crash_recovery_without_a_restart_starts_a_quarantine() {
    let server = Mutex::new(PostgresServer::start());
    runtime().block_on(async {
        let port = server.lock().unwrap().port();
        let service = quarantined_service(port).await;
        let raw = raw(port).await;
        let before: std::time::SystemTime = raw
            .query_one("SELECT pg_postmaster_start_time()", &[])
            .await
            .unwrap()
            .get(0);
        clause(&service, || async {
            tokio::task::block_in_place(|| server.lock().unwrap().crash_backends());
            let raw = raw_after_restart(port).await;
            let after: std::time::SystemTime = raw
                .query_one("SELECT pg_postmaster_start_time()", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(before, after, "the postmaster was not restarted");
            raw.batch_execute("UPDATE leasehold_leases SET owner = NULL, expires_at = NULL")
                .await
                .unwrap();
        })
        .await;
    });
}

/// A clean restart keeps the unlogged epoch row, but the postmaster's start time
/// changed: the same quarantine (a restore of a cold copy of the data directory
/// looks exactly like this).
#[test]
fn a_clean_restart_starts_a_quarantine() {
    let server = Mutex::new(PostgresServer::start());
    runtime().block_on(async {
        let port = server.lock().unwrap().port();
        let service = quarantined_service(port).await;
        clause(&service, || async {
            tokio::task::block_in_place(|| server.lock().unwrap().restart());
            let raw = raw_after_restart(port).await;
            let kept: i64 = raw
                .query_one("SELECT count(*) FROM leasehold_leases_epoch", &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(kept, 1, "a clean shutdown keeps unlogged tables");
            raw.batch_execute("UPDATE leasehold_leases SET owner = NULL, expires_at = NULL")
                .await
                .unwrap();
        })
        .await;
    });
}

/// The clause can fail: a loss the service cannot notice (the lease rows rolled back
/// by hand, as a lost commit would leave them, but without the crash that loses
/// commits) lets a contender in at once, and the clause says so.
#[test]
fn the_clause_catches_a_loss_that_starts_no_quarantine() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = quarantined_service(server.port()).await;
        let raw = raw(server.port()).await;
        let verdict = a_lost_state_grants_nothing_until_the_quarantine_ends(
            &service,
            &caps(),
            QUARANTINE.into(),
            || async {
                raw.batch_execute("UPDATE leasehold_leases SET owner = NULL, expires_at = NULL")
                    .await
                    .unwrap();
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
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = quarantined_service(server.port()).await;
        let too_long = Duration::from(QUARANTINE).saturating_add(Duration::from_micros(1));
        match service
            .try_acquire("k", token(1), &Identity::EMPTY, too_long)
            .await
        {
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported);
                assert!(e.to_string().contains("max_ttl"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            LockService::acquire(&service, "k", token(1), &Identity::EMPTY, too_long).await,
            AcquireOutcome::Refused(Refusal::Unsupported)
        );
        assert!(matches!(
            service
                .try_acquire("k", token(1), &Identity::EMPTY, QUARANTINE)
                .await,
            Ok(Acquired::Granted { .. })
        ));
    });
}

/// New tables quarantine their first acquire of a free key (they cannot tell a new
/// deployment from a lost one); `mark_data_set_new` skips it; renewals and holders
/// never wait.
#[test]
fn new_tables_quarantine_until_marked_new() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = service_with(&url_on(server.port()), QUARANTINE).await;
        let acquire =
            |key: &'static str, t| service.try_acquire(key, t, &Identity::EMPTY, ms(1_000));
        match acquire("a", token(1)).await.unwrap() {
            Acquired::Quarantined { remaining } => {
                assert!(remaining <= QUARANTINE.into() && !remaining.is_zero())
            }
            other => panic!("{other:?}"),
        }
        service.mark_data_set_new().await.unwrap();
        assert!(matches!(
            acquire("a", token(1)).await,
            Ok(Acquired::Granted { .. })
        ));
    });
}

/// The end-to-end check: two keys, three clients each (holders and
/// contenders), PostgreSQL killed with `SIGKILL` (postmaster and backends) and
/// restarted while they run. Every client's `check()` is sampled every millisecond:
/// never two per key. The first grant after the restart comes one quarantine after
/// PostgreSQL answers again.
#[test]
fn kill_9_restart_never_lets_two_holders_pass_check() {
    const TTL_MS: u64 = 800;
    let server = Arc::new(Mutex::new(PostgresServer::start()));
    runtime().block_on(async {
        let port = server.lock().unwrap().port();
        let service = service_with(&url_on(port), std_ms(TTL_MS)).await;
        service.mark_data_set_new().await.unwrap();
        raw(port).await.batch_execute("CHECKPOINT").await.unwrap();
        let contest = Contest::start(
            Arc::new(service),
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
                let mut server = server.lock().unwrap();
                server.kill();
                server.restart();
                tokio::time::Instant::now()
            }
        })
        .await
        .unwrap();
        wait_for("a grant after the restart", std_ms(5_000), || async {
            contest.grants().iter().any(|g| g.at > restarted)
        })
        .await;
        let outcome = contest.stop().await;
        let first = outcome.first_grant_since(restarted).unwrap();
        let waited = first.at - restarted;
        eprintln!(
            "kill -9 + restart took {:?}; first grant {:?} after PostgreSQL answered again \
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
            waited >= std_ms(TTL_MS) && waited <= std_ms(TTL_MS + 1_000),
            "the quarantine lasted {waited:?}, configured {TTL_MS} ms"
        );
    });
}

/// A raw connection right after a restart or crash recovery (retried briefly while
/// PostgreSQL finishes starting).
async fn raw_after_restart(port: u16) -> tokio_postgres::Client {
    for _ in 0..100 {
        let conninfo = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres");
        if let Ok((client, connection)) =
            tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await
        {
            tokio::spawn(connection);
            return client;
        }
        tokio::time::sleep(std_ms(20)).await;
    }
    panic!("PostgreSQL does not take connections after the restart");
}
