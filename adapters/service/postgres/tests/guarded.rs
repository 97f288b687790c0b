//! Lease-checked transactions on a real PostgreSQL: a write commits only while the
//! lease row is the writer's, on a data table with no fence column.

mod common;

use std::sync::Arc;

use common::*;
use leasehold::Identity;
use leasehold_postgres::{Acquired, ErrorKind, PostgresLockService};

const DATA: &str = "CREATE TABLE orders (id INT PRIMARY KEY, v TEXT NOT NULL)";

/// What the data table holds for id 1.
async fn stored(client: &tokio_postgres::Client) -> Option<String> {
    client
        .query_opt("SELECT v FROM orders WHERE id = 1", &[])
        .await
        .unwrap()
        .map(|row| row.get(0))
}

/// Whether some session waits for a row lock now (the contender's acquire).
async fn someone_waits_for_a_lock(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
}

/// The scenario. The holder checks its lease inside its transaction, writes,
/// and is paused before its commit until its lease has expired on the server's clock;
/// meanwhile a contender's acquire waits for the row. The holder's commit is refused
/// (the lease expired under it): its write never commits, and the contender is
/// granted the key (a newer fence) as soon as the holder's transaction ends, then
/// writes under its own lease.
#[test]
fn a_holder_paused_before_its_commit_never_commits_after_a_contender_acquires() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let url = url_on(server.port());
        let service = fresh_service(&server).await;
        // The contender waits for the row longer than the holder's lease.
        let contender = Arc::new(
            PostgresLockService::builder(&url)
                .request_timeout(std_ms(5_000))
                .connect()
                .await
                .unwrap(),
        );
        let observer = raw(server.port()).await;
        observer.batch_execute(DATA).await.unwrap();

        let Acquired::Granted { fence: old, .. } = service
            .try_acquire("orders", token(1), &id("holder"), ms(400))
            .await
            .unwrap()
        else {
            panic!("the key is free")
        };
        let mut data = service.dedicated_connection().await.unwrap();
        let tx = service
            .begin_under_lease(&mut data, "orders", token(1), old)
            .await
            .expect("the lease is the holder's");
        tx.execute("INSERT INTO orders VALUES (1, 'old holder')", &[])
            .await
            .unwrap();

        // The holder is paused here. A contender acquires meanwhile: it waits.
        let acquiring = tokio::spawn({
            let contender = Arc::clone(&contender);
            async move {
                contender
                    .try_acquire("orders", token(2), &id("contender"), ms(400))
                    .await
            }
        });
        wait_for("the contender to wait for the row", std_ms(3_000), || {
            someone_waits_for_a_lock(&observer)
        })
        .await;
        wait_for("the lease to expire on the server's clock", std_ms(3_000), || async {
            observer
                .query_one(
                    "SELECT expires_at <= clock_timestamp() FROM leasehold_leases WHERE key = 'orders'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, bool>(0)
        })
        .await;
        assert!(!acquiring.is_finished(), "the contender waits for the holder's transaction");

        // The holder wakes up and commits.
        let refused = tx.commit().await.expect_err("the lease expired before the commit");
        assert_eq!(refused.kind(), ErrorKind::NotHeld, "{refused}");
        assert_eq!(stored(&observer).await, None, "the old write never committed");

        let new = match acquiring.await.unwrap().unwrap() {
            Acquired::Granted { fence, .. } => fence,
            other => panic!("the contender gets the key once the holder's transaction ends: {other:?}"),
        };
        assert!(new > old);
        let mut data2 = contender.dedicated_connection().await.unwrap();
        let tx = contender
            .begin_under_lease(&mut data2, "orders", token(2), new)
            .await
            .unwrap();
        tx.execute("INSERT INTO orders VALUES (1, 'new holder')", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(stored(&observer).await.as_deref(), Some("new holder"));

        // The old holder, awake again, cannot even start a transaction.
        let refused = service
            .begin_under_lease(&mut data, "orders", token(1), old)
            .await
            .expect_err("not the holder any more");
        assert_eq!(refused.kind(), ErrorKind::NotHeld);
    });
}

/// The holder passed its in-process `check()`, then was paused (its renewals stalled
/// in the network) until a contender took the key: the transaction it starts after
/// waking up is refused at once, and nothing is written.
#[test]
fn a_holder_paused_between_check_and_its_transaction_writes_nothing() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = fresh_service(&server).await;
        let proxy = Proxy::start(server.port()).await;
        let through_proxy = Arc::new(
            PostgresLockService::builder(url_on(proxy.port()))
                .request_timeout(std_ms(200))
                .connect_lazily()
                .unwrap(),
        );
        let observer = raw(server.port()).await;
        observer.batch_execute(DATA).await.unwrap();

        let lease = leasehold_tokio::acquire(Arc::clone(&through_proxy), "orders", config(600))
            .await
            .unwrap();
        let fence = lease.check().expect("held");
        // Paused: its service is cut off, its lease runs out; a contender takes over.
        proxy.stall();
        let contender = leasehold_tokio::acquire(Arc::new(service.clone()), "orders", config(600))
            .await
            .unwrap();
        let newer = contender.check().unwrap();
        assert!(newer > fence);

        let mut data = service.dedicated_connection().await.unwrap();
        let refused = service
            .begin_under_lease(&mut data, "orders", lease.token(), fence)
            .await
            .expect_err("the lease changed hands");
        assert_eq!(refused.kind(), ErrorKind::NotHeld, "{refused}");
        assert_eq!(stored(&observer).await, None);

        let tx = service
            .begin_under_lease(&mut data, "orders", contender.token(), newer)
            .await
            .unwrap();
        tx.execute("INSERT INTO orders VALUES (1, 'contender')", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(stored(&observer).await.as_deref(), Some("contender"));
        proxy.resume();
        contender.release().await;
    });
}

/// A holder that stalls inside its transaction does not keep the key forever: the
/// transaction's idle timeout is what was left of the lease and a second, after which
/// PostgreSQL ends the session, frees the row, and a contender is granted the key.
#[test]
fn a_holder_stalled_inside_its_transaction_frees_the_row_a_second_after_its_lease_ends() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = fresh_service(&server).await;
        let Acquired::Granted { fence, .. } = service
            .try_acquire("orders", token(1), &id("holder"), ms(500))
            .await
            .unwrap()
        else {
            panic!("free")
        };
        let mut data = service.dedicated_connection().await.unwrap();
        data.batch_execute(DATA).await.unwrap();
        let tx = service
            .begin_under_lease(&mut data, "orders", token(1), fence)
            .await
            .unwrap();
        tx.execute("INSERT INTO orders VALUES (1, 'stalled')", &[])
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        // Stalled: the transaction stays open. A contender retries until granted.
        let granted = loop {
            match service
                .try_acquire("orders", token(2), &Identity::EMPTY, ms(500))
                .await
            {
                Ok(Acquired::Granted { fence, .. }) => break fence,
                Ok(Acquired::HeldByAnother(_)) | Err(_) => {}
                Ok(other) => panic!("{other:?}"),
            }
            assert!(started.elapsed() < std_ms(5_000), "the row is never freed");
        };
        assert!(granted > fence);
        eprintln!(
            "the contender was granted {:?} after the holder stalled",
            started.elapsed()
        );
        assert!(tx.commit().await.is_err(), "the stalled session was ended");
        let observer = raw(server.port()).await;
        assert_eq!(stored(&observer).await, None);
    });
}

/// The holder's own renewals go on while its lease-checked transaction is open (they
/// do not conflict with its `FOR KEY SHARE`), while a contender's acquire waits; a
/// release by the holder meanwhile makes the commit refuse.
#[test]
fn renewals_go_on_during_a_lease_checked_transaction_and_a_release_refuses_its_commit() {
    let server = PostgresServer::start();
    runtime().block_on(async {
        let service = fresh_service(&server).await;
        let observer = raw(server.port()).await;
        observer.batch_execute(DATA).await.unwrap();
        let Acquired::Granted { fence, .. } = service
            .try_acquire("orders", token(1), &id("holder"), ms(2_000))
            .await
            .unwrap()
        else {
            panic!("free")
        };
        let mut data = service.dedicated_connection().await.unwrap();
        let tx = service
            .begin_under_lease(&mut data, "orders", token(1), fence)
            .await
            .unwrap();
        let contender = tokio::spawn({
            let service = service.clone();
            async move {
                service
                    .try_acquire("orders", token(2), &id("contender"), ms(2_000))
                    .await
            }
        });
        wait_for("the contender to wait for the row", std_ms(3_000), || {
            someone_waits_for_a_lock(&observer)
        })
        .await;
        let asked = std::time::Instant::now();
        assert_eq!(
            service
                .try_renew("orders", token(1), fence, ms(2_000))
                .await
                .unwrap(),
            leasehold_postgres::Renewed::Renewed { ttl: ms(2_000) }
        );
        assert!(asked.elapsed() < std_ms(500), "the renewal did not wait");
        tx.execute("INSERT INTO orders VALUES (1, 'renewed')", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(stored(&observer).await.as_deref(), Some("renewed"));
        match contender.await.unwrap().unwrap() {
            Acquired::HeldByAnother(holder) => assert_eq!(holder.fence, fence),
            other => panic!("{other:?}"),
        }

        let tx = service
            .begin_under_lease(&mut data, "orders", token(1), fence)
            .await
            .unwrap();
        tx.execute("UPDATE orders SET v = 'after release' WHERE id = 1", &[])
            .await
            .unwrap();
        service.try_release("orders", token(1)).await.unwrap();
        let refused = tx.commit().await.expect_err("released before the commit");
        assert_eq!(refused.kind(), ErrorKind::NotHeld);
        assert_eq!(stored(&observer).await.as_deref(), Some("renewed"));
    });
}
