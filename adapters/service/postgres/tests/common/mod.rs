//! What the PostgreSQL tests share: a server with the lease tables, services on it,
//! and raw statements for the faults made by hand.
#![allow(dead_code)]

use std::time::Duration as StdDuration;

use leasehold::{Config, Duration, Identity, Owner, OwnerToken, Term};
use leasehold_postgres::PostgresLockService;

#[allow(unused_imports)]
pub use leasehold_test_support::{wait_for, PostgresServer, Proxy, ProxyMode};

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn std_ms(n: u64) -> StdDuration {
    StdDuration::from_millis(n)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `postgres://` URL of a server (or of a proxy in front of it, on `port`).
pub fn url_on(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// A service on `url` with `max_ttl`, the tables created; no data set marked new.
pub async fn service_with(url: &str, max_ttl: StdDuration) -> PostgresLockService {
    PostgresLockService::builder(url)
        .request_timeout(std_ms(1_000))
        .max_ttl(max_ttl)
        .create_tables(true)
        .connect()
        .await
        .expect("connect to the test PostgreSQL")
}

/// A service on a fresh server's tables, marked new (grants at once).
pub async fn fresh_service(server: &PostgresServer) -> PostgresLockService {
    let service = service_with(&url_on(server.port()), StdDuration::from_secs(30)).await;
    service.mark_data_set_new().await.unwrap();
    service
}

/// A plain `tokio-postgres` connection to the server, its task spawned.
pub async fn raw(port: u16) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("a raw connection");
    tokio::spawn(connection);
    client
}

pub fn token(n: u8) -> OwnerToken {
    Owner([n; 16]).token(Term(1))
}

pub fn id(name: &str) -> Identity {
    Identity::new(name).unwrap()
}

/// The default lease config for `ttl_ms`.
pub fn config(ttl_ms: u64) -> Config {
    Config::builder(ms(ttl_ms)).build().expect("valid config")
}
