//! Fenced writes over TLS (`postgres::tls`) against a real PostgreSQL with `ssl = on`
//! and `hostssl … cert` in `pg_hba.conf`, certificates made by `openssl` for the
//! test: each `sslmode` checks what libpq's does.

use std::path::Path;

use leasehold_storage::postgres::tls::{parse_config, SslMode, Tls, TlsProblem};
use leasehold_storage::postgres::FencedTable;
use leasehold_storage::{Fence, FencedWrite};
use leasehold_test_support::{scratch_dir, PostgresOptions, PostgresServer, TlsFiles};

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// `conninfo` connected with `tls` (its `sslmode` from the string): the error's
/// text when it fails.
async fn connect(conninfo: &str, tls: Tls) -> Result<tokio_postgres::Client, String> {
    let (config, mode) = parse_config(conninfo).unwrap();
    let tls = tls.with_mode(mode.unwrap_or_default());
    let connector = tls.connector().map_err(|e| e.to_string())?;
    connector.connect(&config).await.map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sslmode_checks_what_libpq_checks_and_fenced_writes_go_over_tls() {
    let dir = scratch_dir("storage-tls");
    let tls = TlsFiles::generate(dir.path());
    let other = TlsFiles::generate(&dir.path().join("other"));
    let server = PostgresServer::start_with(PostgresOptions {
        tls: Some(tls.clone()),
        ..PostgresOptions::default()
    });
    let port = server.port();
    let at = |host: &str, mode: &str| {
        format!(
            "host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres \
             sslmode={mode}"
        )
    };
    let mutual = Tls::default()
        .root_cert(read(&tls.ca))
        .client_cert(read(&tls.client_cert), read(&tls.client_key));

    // verify-full: the chain and the name; the writes go over it.
    let client = connect(&at("127.0.0.1", "verify-full"), mutual.clone())
        .await
        .expect("verify-full with the CA and a client certificate");
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl, "the connection is encrypted");
    let table = FencedTable::new("fenced").unwrap();
    table.create(&client).await.unwrap();
    assert_eq!(
        table.write(&client, "k", Fence(3), b"v").await.unwrap(),
        FencedWrite::Written
    );

    // Another name: verify-full refuses it, verify-ca does not check it.
    let err = connect(&at("elsewhere.invalid", "verify-full"), mutual.clone())
        .await
        .unwrap_err();
    assert_eq!(
        TlsProblem::from_error_text(&err),
        Some(TlsProblem::WrongServerName),
        "{err}"
    );
    connect(&at("elsewhere.invalid", "verify-ca"), mutual.clone())
        .await
        .expect("verify-ca does not check the name");

    // Another CA: verify-ca refuses it; so does require once a CA is given (libpq's
    // rule); require without a CA encrypts without checking.
    let wrong_ca = Tls::default()
        .root_cert(read(&other.ca))
        .client_cert(read(&tls.client_cert), read(&tls.client_key));
    for mode in ["verify-ca", "require", "prefer"] {
        let err = connect(&at("127.0.0.1", mode), wrong_ca.clone())
            .await
            .unwrap_err();
        assert_eq!(
            TlsProblem::from_error_text(&err),
            Some(TlsProblem::UntrustedServer),
            "{mode}: {err}"
        );
    }
    let unchecked = Tls::default().client_cert(read(&tls.client_cert), read(&tls.client_key));
    connect(&at("elsewhere.invalid", "require"), unchecked)
        .await
        .expect("require without a CA checks no certificate");

    // disable: no TLS, so the `hostnossl … trust` line lets the test in.
    let plain = connect(&at("127.0.0.1", "disable"), Tls::default())
        .await
        .expect("disable");
    let ssl: bool = plain
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!ssl, "sslmode=disable sends nothing over TLS");
    assert_eq!(Tls::default().mode(), SslMode::Prefer, "libpq's default");
}
