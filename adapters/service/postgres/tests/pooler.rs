//! Through a real PgBouncer in transaction mode: every statement may run on another
//! server connection, so anything that keeps session state breaks. The service keeps
//! none: the whole conformance suite passes through it, and so does a lease-checked
//! transaction. A session-level advisory lock, next to it, lets two clients hold it.

mod common;

use common::*;
use leasehold::Duration;
use leasehold_conformance::{run_all, Capabilities};
use leasehold_postgres::{Acquired, ErrorKind, PostgresLockService};
use leasehold_test_support::PgBouncer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_and_lease_checked_transactions_hold_through_a_transaction_pooler() {
    let server = PostgresServer::start();
    fresh_service(&server).await;
    // Two server connections for the service's four (and the data connections).
    let bouncer = PgBouncer::start(&server, 2);
    let service = PostgresLockService::builder(url_on(bouncer.port()))
        .request_timeout(std_ms(2_000))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e}; pgbouncer log:\n{}", bouncer.log()));
    run_all(
        &service,
        &Capabilities::postgres(Duration::from_millis(300)),
    )
    .await;

    let raw_data = raw(server.port()).await;
    raw_data
        .batch_execute("CREATE TABLE orders (id INT PRIMARY KEY, v TEXT NOT NULL)")
        .await
        .unwrap();
    let Acquired::Granted { fence, .. } = service
        .try_acquire("orders", token(1), &id("holder"), ms(300))
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
    tx.execute("INSERT INTO orders VALUES (1, 'under the lease')", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // Paused past the lease inside the next one: the commit is refused.
    let tx = service
        .begin_under_lease(&mut data, "orders", token(1), fence)
        .await
        .unwrap();
    tx.execute("UPDATE orders SET v = 'late' WHERE id = 1", &[])
        .await
        .unwrap();
    wait_for("the lease to expire", std_ms(2_000), || async {
        raw_data
            .query_one(
                "SELECT expires_at <= clock_timestamp() FROM leasehold_leases WHERE key = 'orders'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
    let refused = tx.commit().await.expect_err("expired before the commit");
    assert_eq!(refused.kind(), ErrorKind::NotHeld, "{refused}");
    let v: String = raw_data
        .query_one("SELECT v FROM orders WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v, "under the lease");
}

/// Why it matters: a session-level advisory lock taken through the same kind of
/// pooler belongs to the server connection, not to the client. With one server
/// connection, a second client's `pg_try_advisory_lock` runs in the first client's
/// session and is granted too.
/// `pg_try_advisory_lock(42)` on `c`, through the simple protocol.
async fn take(c: &tokio_postgres::Client) -> bool {
    c.simple_query("SELECT pg_try_advisory_lock(42)::text")
        .await
        .unwrap()
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "true"),
            _ => None,
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_advisory_lock_through_the_pooler_lets_two_clients_hold_it() {
    let server = PostgresServer::start();
    let bouncer = PgBouncer::start(&server, 1);
    let a = raw(bouncer.port()).await;
    let b = raw(bouncer.port()).await;
    assert!(take(&a).await, "the first client takes it");
    assert!(
        take(&b).await,
        "and so does the second, in the same server session"
    );
}
