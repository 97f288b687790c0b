//! The service contract of `leasehold-driver`, clause by clause
//! (`leasehold-conformance`), against a real PostgreSQL.

mod common;

use common::*;
use leasehold::Duration;
use leasehold_conformance::breach::the_timing_clauses_catch_early_expiry;
use leasehold_conformance::{run_all, Capabilities};
use leasehold_postgres::PostgresLockService;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract() {
    let server = PostgresServer::start();
    let service: PostgresLockService = fresh_service(&server).await;
    // 300 ms, as for Redis: room for the "still held halfway" checks on a loaded
    // machine. TTLs are applied to the microsecond and expire on the server's clock
    // exactly (a row is held while `expires_at > clock_timestamp()`): no slack.
    run_all(
        &service,
        &Capabilities::postgres(Duration::from_millis(300)),
    )
    .await;
}

/// The timing clauses see a PostgreSQL service whose grants apply less than they
/// report, and whose renewals report more than they apply, on the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timing_clauses_catch_a_postgres_that_expires_early() {
    let server = PostgresServer::start();
    let service: PostgresLockService = fresh_service(&server).await;
    let caps = Capabilities::postgres(Duration::from_millis(300));
    the_timing_clauses_catch_early_expiry(&service, &caps, &caps).await;
}

/// The same with acquires and renewals as statements prepared per connection
/// (`Builder::prepared_statements`, for direct connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_the_contract_with_prepared_statements() {
    let server = PostgresServer::start();
    fresh_service(&server).await;
    let service = PostgresLockService::builder(url_on(server.port()))
        .prepared_statements(true)
        .connect()
        .await
        .unwrap();
    run_all(
        &service,
        &Capabilities::postgres(Duration::from_millis(300)),
    )
    .await;
}
