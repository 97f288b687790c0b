//! Faults against real PostgreSQL processes: a server paused past the TTL, a
//! connection stalled in the fault proxy, the lease row deleted by hand, and the final
//! refusals (a missing table, a table of another shape, a wrong password, a missing
//! privilege) next to the read-only standby, which is retried. A crash and restart is
//! in `state_loss.rs`, a promoted standby in `failover.rs`.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::*;
use leasehold::{
    AcquireOutcome, HolderOutcome, Identity, Indeterminate, LossReason, Refusal, RenewOutcome,
};
use leasehold_driver::LockService;
use leasehold_postgres::{Acquired, ErrorKind, PostgresLockService, Renewed};
use leasehold_test_support::{Contest, PostgresOptions};

/// The server paused (`SIGSTOP`, postmaster and backends) for twice the TTL while
/// three clients contend for each of two keys: every request in the pause is
/// `Indeterminate` within the request timeout, holders' gates close before their
/// grants can expire, nothing is quarantined (PostgreSQL lost nothing), and after the
/// resume the key is granted again. `check()` sampled every millisecond: never two
/// holders.
#[test]
fn a_server_paused_past_the_ttl_never_lets_two_holders_pass_check() {
    const TTL_MS: u64 = 600;
    let server = PostgresServer::start();
    runtime().block_on(async {
        fresh_service(&server).await;
        let service = PostgresLockService::builder(url_on(server.port()))
            .request_timeout(std_ms(100))
            .connect_lazily()
            .unwrap();
        let probe = service.clone();
        let contest = Contest::start(
            Arc::new(service),
            &["orders", "payments"],
            3,
            config(TTL_MS),
            std_ms(200),
        );
        wait_for("grants on both keys", std_ms(5_000), || async {
            contest.grants().len() >= 4
        })
        .await;
        server.pause();
        let asked = Instant::now();
        let answer = LockService::holder(&probe, "orders").await;
        let took = asked.elapsed();
        assert_eq!(answer, HolderOutcome::Indeterminate(Indeterminate::Timeout));
        assert!(
            took < std_ms(300),
            "bounded by the request timeout: {took:?}"
        );
        tokio::time::sleep(std_ms(2 * TTL_MS)).await;
        server.resume();
        let resumed = tokio::time::Instant::now();
        wait_for("a grant after the resume", std_ms(5_000), || async {
            contest.grants().iter().any(|g| g.at > resumed)
        })
        .await;
        let outcome = contest.stop().await;
        let first = outcome.first_grant_since(resumed).unwrap();
        eprintln!(
            "paused {} ms; first grant {:?} after the resume; {} samples, longest gap {:?}, \
             {} grants, {} overlaps",
            2 * TTL_MS,
            first.at - resumed,
            outcome.samples,
            outcome.longest_gap,
            outcome.grants.len(),
            outcome.overlaps.len()
        );
        assert!(outcome.overlaps.is_empty(), "{:?}", outcome.overlaps);
        assert!(
            first.at - resumed < std_ms(2_000),
            "no quarantine after a pause"
        );
    });
}

/// A connection stalled in the proxy (kept open, nothing forwarded): each request is
/// `Indeterminate(Timeout)` within the request timeout, never a hang, and the stuck
/// connection is dropped; once the proxy forwards again, requests answer again.
#[test]
fn a_stalled_connection_is_indeterminate_within_the_request_timeout() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let direct = fresh_service(&server).await;
        let granted = direct
            .try_acquire("k", token(1), &id("a"), ms(5_000))
            .await
            .unwrap();
        let Acquired::Granted { fence, .. } = granted else {
            panic!("{granted:?}")
        };
        let proxy = Proxy::start(server.port()).await;
        let service = PostgresLockService::builder(url_on(proxy.port()))
            .request_timeout(std_ms(200))
            .connections(2)
            .connect_lazily()
            .unwrap();
        // Renewed through the proxy: (retried while a loaded machine is slow to connect).
        renewed_within(&service, fence, std_ms(3_000)).await;
        assert!(service.open_connections() > 0);
        proxy.stall();
        for _ in 0..3 {
            let asked = Instant::now();
            let answer = LockService::renew(&service, "k", token(1), fence, ms(5_000)).await;
            let took = asked.elapsed();
            assert_eq!(answer, RenewOutcome::Indeterminate(Indeterminate::Timeout));
            assert!(
                took >= std_ms(200) && took < std_ms(400),
                "bounded by the request timeout: {took:?}"
            );
        }
        assert_eq!(
            service.open_connections(),
            0,
            "the stuck connections were dropped"
        );
        proxy.resume();
        renewed_within(&service, fence, std_ms(3_000)).await;
    });
}

/// Renews `k` for token 1 with `fence` until it is `Renewed`, for at most `limit`
/// (each attempt bounded by the service's request timeout); the attempts it took.
async fn renewed_within(
    service: &PostgresLockService,
    fence: leasehold::Fence,
    limit: std::time::Duration,
) -> u32 {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match service.try_renew("k", token(1), fence, ms(5_000)).await {
            Ok(Renewed::Renewed { .. }) => return attempts,
            other => assert!(
                started.elapsed() < limit,
                "not renewed within {limit:?}: {other:?}"
            ),
        }
    }
}

/// The lease row deleted by hand is a forced release: the holder's next renewal is
/// `NotOwner` (its lease ends at once), and a contender is granted the key with a
/// fence above the old one (fences are floored by the server's clock, so the lost
/// counter does not matter). No quarantine: PostgreSQL lost nothing.
#[test]
fn a_lease_row_deleted_by_hand_ends_the_holder_at_its_next_renewal() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = Arc::new(fresh_service(&server).await);
        let raw = raw(server.port()).await;
        let lease = leasehold_tokio::acquire(Arc::clone(&service), "orders", config(900))
            .await
            .unwrap();
        let old = lease.check().unwrap();
        let deleted = raw
            .execute("DELETE FROM leasehold_leases WHERE key = 'orders'", &[])
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        let end = tokio::time::timeout(std_ms(2_000), lease.lost())
            .await
            .expect("the next renewal ends the lease");
        assert_eq!(end.loss_reason(), Some(LossReason::NotOwner), "{end:?}");
        assert!(lease.check().is_err());
        match service
            .try_acquire("orders", token(9), &id("contender"), ms(900))
            .await
            .unwrap()
        {
            Acquired::Granted { fence, .. } => assert!(fence > old, "{fence} after {old}"),
            other => panic!("{other:?}"),
        }
    });
}

/// What can never work is a final refusal with a clear text; a read-only standby is
/// retried (`Indeterminate(Service)`), as a promotion may make it the primary.
#[test]
fn refusals_are_final_and_say_what_to_do_and_a_standby_is_retried() {
    let server = PostgresServer::start_with(PostgresOptions::default());
    runtime().block_on(async {
        let url = url_on(server.port());
        let raw = raw(server.port()).await;

        // No tables: final at connect, and on a lazily built service's first request.
        let err = PostgresLockService::builder(&url)
            .connect()
            .await
            .expect_err("no tables");
        assert_eq!(err.kind(), ErrorKind::MissingTable, "{err}");
        assert!(err.to_string().contains("create_tables"), "{err}");
        let lazy = PostgresLockService::builder(&url).connect_lazily().unwrap();
        assert_eq!(
            LockService::acquire(&lazy, "k", token(1), &Identity::EMPTY, ms(1_000)).await,
            AcquireOutcome::Refused(Refusal::Unsupported)
        );

        // A table of that name that is not a lease table.
        raw.batch_execute("CREATE TABLE not_leases (key TEXT PRIMARY KEY, v INT); CREATE UNLOGGED TABLE not_leases_epoch (id INT)")
            .await
            .unwrap();
        let err = PostgresLockService::builder(&url)
            .table("not_leases")
            .connect()
            .await
            .expect_err("wrong shape");
        assert_eq!(err.kind(), ErrorKind::WrongTable, "{err}");
        assert!(err.to_string().contains("not a leasehold lease table"), "{err}");

        let service = fresh_service(&server).await;
        assert_eq!(
            LockService::acquire(&service, "a{b}", token(1), &Identity::EMPTY, ms(1_000)).await,
            AcquireOutcome::Refused(Refusal::InvalidKey)
        );

        // A role without privileges on the tables, and a wrong password.
        raw.batch_execute(
            "CREATE ROLE stranger LOGIN PASSWORD 'right';\
             CREATE ROLE holder LOGIN PASSWORD 'right';\
             GRANT SELECT, INSERT, UPDATE ON leasehold_leases, leasehold_leases_epoch TO holder",
        )
        .await
        .unwrap();
        let hba = server.dir().join("data/pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(
            &hba,
            format!("host all stranger,holder 127.0.0.1/32 scram-sha-256\n{rules}"),
        )
        .unwrap();
        raw.batch_execute("SELECT pg_reload_conf()").await.unwrap();
        let as_user = |user: &str, password: &str| {
            format!(
                "postgres://{user}:{password}@127.0.0.1:{}/postgres",
                server.port()
            )
        };
        let err = PostgresLockService::builder(as_user("holder", "wrong"))
            .connect()
            .await
            .expect_err("wrong password");
        assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
        assert!(
            err.to_string().contains("authentication failed") && !err.to_string().contains("wrong"),
            "{err}"
        );
        let stranger = PostgresLockService::builder(as_user("stranger", "right"))
            .connect_lazily()
            .unwrap();
        assert_eq!(
            LockService::renew(&stranger, "k", token(1), leasehold::Fence(1), ms(1_000)).await,
            RenewOutcome::Refused(Refusal::Unauthorized)
        );
        let err = stranger
            .try_holder("k")
            .await
            .expect_err("no SELECT privilege");
        assert!(err.to_string().contains("privilege"), "{err}");
        let holder = PostgresLockService::builder(as_user("holder", "right"))
            .connect()
            .await
            .expect("enough privileges");
        assert!(matches!(
            holder
                .try_acquire("k", token(1), &Identity::EMPTY, ms(1_000))
                .await,
            Ok(Acquired::Granted { .. })
        ));

        // A hot standby: read-only, retried.
        raw.batch_execute("CHECKPOINT").await.unwrap();
        let standby = PostgresServer::standby_of(&server, PostgresOptions::default());
        let err = PostgresLockService::builder(url_on(standby.port()))
            .connect()
            .await
            .expect_err("a standby cannot be used");
        assert_eq!(err.kind(), ErrorKind::Service, "{err}");
        let on_standby = PostgresLockService::builder(url_on(standby.port()))
            .connect_lazily()
            .unwrap();
        let err = on_standby
            .try_acquire("k2", token(2), &Identity::EMPTY, ms(1_000))
            .await
            .expect_err("read-only");
        assert_eq!(err.kind(), ErrorKind::Service, "{err}");
        assert!(err.to_string().contains("read-only"), "{err}");
        assert_eq!(
            LockService::acquire(&on_standby, "k2", token(2), &Identity::EMPTY, ms(1_000)).await,
            AcquireOutcome::Indeterminate(Indeterminate::Service)
        );
    });
}
