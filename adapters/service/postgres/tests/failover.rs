//! A standby promoted after its primary was killed, with and without synchronous
//! replication, the clients on a two-host URL (`target_session_attrs=read-write`
//! finds the new primary by itself).
//!
//! * With `synchronous_commit = on` and the standby synchronous, a commit is answered
//!   only once the standby has it: the holder's grant survives the promotion, it goes
//!   on renewing on the new primary with the same fence, contenders are told it holds
//!   the key, and a free key is quarantined (the promoted standby's unlogged epoch
//!   table is empty).
//! * Asynchronous, with the standby's replication stalled (a proxy between them) so
//!   that the grants and renewals of that window are lost: what was lost is counted,
//!   and the quarantine keeps every contender out until the lost grants have expired
//!   (`check()` sampled every millisecond: never two holders).

mod common;

use std::sync::Arc;
use std::time::Duration as StdDuration;

use common::*;
use leasehold::Identity;
use leasehold_postgres::{Acquired, PostgresLockService};
use leasehold_test_support::{Contest, PostgresOptions};

/// The standby's settings: after its primary died, a standby's startup process retries
/// the WAL stream every `wal_retrieve_retry_interval` (5 s by default) and may notice
/// a promotion only then (seen here: a promotion that took 5 s, longer than the
/// lease); 100 ms makes a failover prompt.
fn quick_promotion() -> PostgresOptions {
    PostgresOptions::default().set("wal_retrieve_retry_interval", "100ms")
}

/// A service on whichever of the two servers is the primary.
async fn on_either(primary: u16, standby: u16, max_ttl: StdDuration) -> PostgresLockService {
    PostgresLockService::builder(format!(
        "postgres://postgres@127.0.0.1:{primary},127.0.0.1:{standby}/postgres?target_session_attrs=read-write"
    ))
    .request_timeout(std_ms(1_000))
    .max_ttl(max_ttl)
    .connect()
    .await
    .expect("the primary answers")
}

/// Waits until the standby has replayed everything the primary wrote so far.
async fn caught_up(primary: &tokio_postgres::Client, standby: &tokio_postgres::Client) {
    let lsn: String = primary
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    wait_for("the standby to catch up", std_ms(5_000), || async {
        standby
            .query_one(
                "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                &[&lsn],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
}

#[test]
fn with_a_synchronous_standby_a_grant_survives_the_promotion() {
    const TTL_MS: u64 = 3_000;
    let mut primary =
        PostgresServer::start_with(PostgresOptions::default().set("synchronous_commit", "on"));
    runtime().block_on(async {
        let setup = service_with(&url_on(primary.port()), StdDuration::from_secs(30)).await;
        setup.mark_data_set_new().await.unwrap();
        let p = raw(primary.port()).await;
        p.batch_execute("CHECKPOINT").await.unwrap();
        let standby =
            tokio::task::block_in_place(|| PostgresServer::standby_of(&primary, quick_promotion()));
        for statement in [
            "ALTER SYSTEM SET synchronous_standby_names = 'standby'",
            "SELECT pg_reload_conf()",
        ] {
            p.batch_execute(statement).await.unwrap();
        }
        wait_for("the standby to be synchronous", std_ms(5_000), || async {
            p.query_opt(
                "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'",
                &[],
            )
            .await
            .unwrap()
            .is_some()
        })
        .await;

        let service =
            Arc::new(on_either(primary.port(), standby.port(), StdDuration::from_secs(30)).await);
        let lease = leasehold_tokio::acquire(Arc::clone(&service), "orders", config(TTL_MS))
            .await
            .unwrap();
        let fence = lease.check().unwrap();
        // One renewal on the old primary, answered: the standby has it too.
        // (A confirmed renewal moves the lease's safe deadline.)
        let deadline = lease.deadline();
        wait_for("a renewal", std_ms(3_000), || async {
            lease.deadline() > deadline
        })
        .await;

        let killed = tokio::time::Instant::now();
        tokio::task::block_in_place(|| {
            primary.kill();
            standby.promote();
        });
        let promoted = killed.elapsed();
        let before = lease.deadline();
        let mut events = lease.events();
        let renewed = tokio::time::timeout(std_ms(TTL_MS), async {
            while lease.deadline() <= before {
                tokio::time::sleep(std_ms(5)).await;
            }
        })
        .await;
        if renewed.is_err() {
            let mut seen = Vec::new();
            while let Ok(event) = events.try_recv() {
                seen.push(format!("{event:?}"));
            }
            panic!(
                "no renewal on the promoted standby within {TTL_MS} ms: state {:?}, end {:?}, \
                 events {seen:#?}; standby log:\n{}",
                lease.state(),
                lease.end(),
                standby.log()
            );
        }
        let renewed = killed.elapsed();
        assert_eq!(
            lease.check().ok(),
            Some(fence),
            "the lease survived, same fence"
        );

        let contender = on_either(primary.port(), standby.port(), StdDuration::from_secs(30)).await;
        match contender
            .try_acquire("orders", token(9), &id("contender"), ms(1_000))
            .await
            .unwrap()
        {
            Acquired::HeldByAnother(holder) => assert_eq!(holder.fence, fence),
            other => panic!("{other:?}"),
        }
        match contender
            .try_acquire("unused", token(9), &Identity::EMPTY, ms(1_000))
            .await
            .unwrap()
        {
            Acquired::Quarantined { .. } => {}
            other => panic!("a free key right after a failover: {other:?}"),
        }
        eprintln!(
            "synchronous standby: promoted {promoted:?} after the kill, first renewal on it \
             {renewed:?} after the kill; the lease kept {fence}"
        );
        lease.release().await;
        drop(standby);
    });
}

#[test]
fn without_synchronous_replication_lost_grants_are_counted_and_nobody_overlaps() {
    const TTL_MS: u64 = 800;
    let mut primary = PostgresServer::start();
    runtime().block_on(async {
        let setup = service_with(&url_on(primary.port()), std_ms(TTL_MS)).await;
        setup.mark_data_set_new().await.unwrap();
        let p = raw(primary.port()).await;
        p.batch_execute("CHECKPOINT").await.unwrap();
        let replication = Proxy::start(primary.port()).await;
        let standby = tokio::task::block_in_place(|| {
            PostgresServer::standby_via(replication.port(), quick_promotion())
        });
        let s = raw(standby.port()).await;

        let service = Arc::new(on_either(primary.port(), standby.port(), std_ms(TTL_MS)).await);
        let contest = Contest::start(
            service,
            &["orders", "payments"],
            3,
            config(TTL_MS),
            std_ms(300),
        );
        wait_for("grants on both keys", std_ms(5_000), || async {
            contest.grants().len() >= 4
        })
        .await;
        caught_up(&p, &s).await;
        let lag: i64 = p
            .query_one(
                "SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0)::bigint \
                 FROM pg_stat_replication",
                &[],
            )
            .await
            .unwrap()
            .get(0);

        // The standby stops receiving; grants and renewals go on on the primary.
        replication.stall();
        let stalled = tokio::time::Instant::now();
        let granted_before = contest.grants().len();
        wait_for("grants the standby never gets", std_ms(5_000), || async {
            contest.grants().len() >= granted_before + 2
        })
        .await;
        let behind: i64 = p
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
                &[&s.query_one("SELECT pg_last_wal_replay_lsn()::text", &[]).await.unwrap().get::<_, String>(0)],
            )
            .await
            .unwrap()
            .get(0);
        let killed = tokio::time::Instant::now();
        tokio::task::block_in_place(|| {
            primary.kill();
            standby.promote();
        });
        let promoted = tokio::time::Instant::now();
        // A grant that repeats a fence granted before the kill is a re-grant to the
        // same token (its earlier answer was lost, its grant reached the standby): no
        // new holder. Every new fence waits for the quarantine.
        let before: std::collections::BTreeSet<_> = contest
            .grants()
            .iter()
            .filter(|g| g.at < killed)
            .map(|g| g.fence)
            .collect();
        wait_for("a new fence on the promoted standby", std_ms(5_000), || async {
            contest
                .grants()
                .iter()
                .any(|g| g.at > promoted && !before.contains(&g.fence))
        })
        .await;
        tokio::time::sleep(std_ms(TTL_MS)).await;
        let outcome = contest.stop().await;
        let lost = outcome
            .grants
            .iter()
            .filter(|g| g.at > stalled && g.at < killed)
            .count();
        let regrants = outcome
            .grants
            .iter()
            .filter(|g| g.at > promoted && before.contains(&g.fence))
            .count();
        let first = outcome
            .grants
            .iter()
            .find(|g| g.at > promoted && !before.contains(&g.fence))
            .unwrap();
        eprintln!(
            "asynchronous standby: lag {lag} B while replicating; stalled {:?} before the kill, \
             {behind} B of WAL and {lost} grants (with every renewal of the window) never \
             reached it; promoted {:?} after the kill; first new fence granted {:?} after the \
             kill, {:?} after `pg_ctl promote -w` returned (quarantine {TTL_MS} ms), {regrants} re-grants of surviving grants \
             after the promotion; {} samples, longest gap {:?}, {} overlaps",
            killed - stalled,
            promoted - killed,
            first.at - killed,
            first.at - promoted,
            outcome.samples,
            outcome.longest_gap,
            outcome.overlaps.len()
        );
        assert!(outcome.overlaps.is_empty(), "{:?}", outcome.overlaps);
        assert!(lost >= 2 && behind > 0);
        // Every lost grant was made or last renewed before the kill, so it has expired
        // by the kill + TTL; the quarantine starts at the first acquire of a free key on
        // the promoted standby (after the kill, possibly before `pg_ctl promote -w`
        // returns, which polls) and lasts the TTL.
        assert!(
            first.at - killed >= std_ms(TTL_MS),
            "the quarantine kept contenders out: a new fence {:?} after the kill",
            first.at - killed
        );
        drop(replication);
    });
}
