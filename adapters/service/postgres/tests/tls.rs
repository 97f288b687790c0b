//! TLS against a real PostgreSQL with `ssl = on` and `hostssl all all 127.0.0.1/32
//! cert` in `pg_hba.conf` (mutual TLS: the client certificate's common name is the
//! user), with a private CA and certificates made by `openssl` for each test. Needs
//! the `tls` feature: `cargo test -p leasehold-postgres --features tls --test tls`.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use common::*;
use leasehold::{Event, Refusal};
use leasehold_driver::TlsProblem;
use leasehold_postgres::{Builder, ErrorKind, PostgresLockError, PostgresLockService};
use leasehold_test_support::{scratch_dir, PostgresOptions, TlsFiles};

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// The request timeout, which bounds connecting too.
const REQUEST: StdDuration = StdDuration::from_millis(1_000);

fn tls_server(tls: &TlsFiles) -> PostgresServer {
    PostgresServer::start_with(PostgresOptions {
        tls: Some(tls.clone()),
        ..PostgresOptions::default()
    })
}

/// `sslmode=verify-full` to `server`, as the user the client certificate names.
fn url(server: &PostgresServer, mode: &str) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode={mode}",
        server.port()
    )
}

/// A builder on `url` with the test's CA and its client certificate.
fn mutual(url: &str, tls: &TlsFiles) -> Builder {
    PostgresLockService::builder(url)
        .request_timeout(REQUEST)
        .create_tables(true)
        .tls_root_cert(read(&tls.ca))
        .tls_client_cert(read(&tls.client_cert), read(&tls.client_key))
}

/// The lease API (`leasehold-tokio`) holds a key over mutual TLS (`verify-full`,
/// `cert` authentication) and renews it three times; `verify-ca` accepts a
/// certificate for another name where `verify-full` does not.
#[test]
fn a_lease_is_held_and_renewed_over_mutual_tls() {
    let dir = scratch_dir("postgres-mtls");
    let tls = TlsFiles::generate(dir.path());
    let server = tls_server(&tls);
    runtime().block_on(async {
        let service = mutual(&url(&server, "verify-full"), &tls)
            .connect()
            .await
            .expect("mutual TLS");
        service.mark_data_set_new().await.unwrap();
        let service = Arc::new(service);
        let lease = leasehold_tokio::acquire(service.clone(), "mtls", config(600))
            .await
            .unwrap();
        let mut events = lease.events();
        let mut renewals = 0;
        while renewals < 3 {
            let timed = tokio::time::timeout(std_ms(2_000), events.recv())
                .await
                .expect("renewals every T/3")
                .unwrap();
            if matches!(timed.event, Event::Renewed { .. }) {
                renewals += 1;
            }
        }
        assert!(lease.check().is_ok());
        assert_eq!(lease.release().await, leasehold_tokio::LeaseEnd::Released);

        // `hostaddr` connects to 127.0.0.1 while TLS checks the name `host` gives.
        let renamed = format!(
            "host=elsewhere.invalid hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
             sslmode=verify-ca",
            server.port()
        );
        mutual(&renamed, &tls)
            .connect()
            .await
            .expect("verify-ca does not check the name");
    });
}

/// Connects with `builder`, expecting a failure within the request timeout; returns
/// it and how long it took.
async fn refused(what: &str, builder: Builder) -> (PostgresLockError, StdDuration) {
    let started = Instant::now();
    let err = tokio::time::timeout(StdDuration::from_secs(5), builder.connect())
        .await
        .unwrap_or_else(|_| panic!("{what}: connect hung"))
        .expect_err(what);
    let took = started.elapsed();
    eprintln!("[tls] {what}: {took:?}: {err}");
    assert!(took < REQUEST + std_ms(500), "{what}: {took:?}");
    (err, took)
}

fn assert_tls(what: &str, err: &PostgresLockError, expected: TlsProblem) {
    assert_eq!(err.kind(), ErrorKind::Tls(expected), "{what}: {err:?}");
    assert_eq!(err.refusal(), Some(Refusal::Unauthorized), "{what}: final");
}

fn assert_config(what: &str, err: &PostgresLockError, says: &str) {
    assert!(
        err.kind() == ErrorKind::Config && err.to_string().contains(says),
        "{what}: {err:?}"
    );
}

/// Every way mutual TLS goes wrong fails `connect` within the request timeout with
/// a typed, final error naming the cause.
#[test]
fn each_tls_failure_is_named_final_and_prompt() {
    let dir = scratch_dir("postgres-mtls-fail");
    let tls = TlsFiles::generate(dir.path());
    let other = TlsFiles::generate(&dir.path().join("other"));
    let server = tls_server(&tls);
    let (old_cert, old_key) = tls.issue("old-client", "postgres", None, -1);
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let full = url(&server, "verify-full");
    runtime().block_on(async {
        let (err, _) = refused(
            "no client certificate",
            PostgresLockService::builder(full.as_str())
                .request_timeout(REQUEST)
                .tls_root_cert(read(&tls.ca)),
        )
        .await;
        assert_tls(
            "no client certificate",
            &err,
            TlsProblem::ClientCertRequired,
        );

        let (err, _) = refused(
            "a client certificate from another CA",
            mutual(&full, &tls).tls_client_cert(read(&other.client_cert), read(&other.client_key)),
        )
        .await;
        assert_tls("another CA", &err, TlsProblem::ClientCertRefused);

        let (err, _) = refused(
            "an expired client certificate",
            mutual(&full, &tls).tls_client_cert(read(&old_cert), read(&old_key)),
        )
        .await;
        assert_tls("expired client", &err, TlsProblem::ClientCertExpired);

        let (err, _) = refused(
            "a server certificate from a CA not trusted",
            mutual(&full, &tls).tls_root_cert(read(&other.ca)),
        )
        .await;
        assert_tls("untrusted server", &err, TlsProblem::UntrustedServer);

        let renamed = format!(
            "host=elsewhere.invalid hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
             sslmode=verify-full",
            server.port()
        );
        let (err, _) = refused(
            "a server certificate for another name",
            mutual(&renamed, &tls),
        )
        .await;
        assert_tls("another name", &err, TlsProblem::WrongServerName);

        let (err, took) = refused(
            "a key that is not the certificate's",
            mutual(&full, &tls).tls_client_cert(read(&tls.client_cert), read(&other.client_key)),
        )
        .await;
        assert_config(
            "key mismatch",
            &err,
            "does not belong to the client certificate",
        );
        assert!(took < std_ms(100), "nothing sent: {took:?}");

        let (err, _) = refused(
            "a client certificate that is not PEM",
            mutual(&full, &tls).tls_client_cert(read(&not_pem), read(&tls.client_key)),
        )
        .await;
        assert_config(
            "not PEM",
            &err,
            "the client certificate (--tls-cert, tls_client_cert) is not PEM",
        );

        let (err, _) = refused(
            "an sslmode libpq does not know",
            mutual(&url(&server, "always"), &tls),
        )
        .await;
        assert_config("sslmode", &err, "sslmode `always`");
    });
}

/// The service contract (`leasehold-conformance`), once over mutual TLS.
#[test]
fn postgres_keeps_the_contract_over_mutual_tls() {
    let dir = scratch_dir("postgres-mtls-conformance");
    let tls = TlsFiles::generate(dir.path());
    let server = tls_server(&tls);
    runtime().block_on(async {
        let service = mutual(&url(&server, "verify-full"), &tls)
            .connect()
            .await
            .expect("mutual TLS");
        service.mark_data_set_new().await.unwrap();
        let caps = leasehold_conformance::Capabilities::postgres(ms(300));
        leasehold_conformance::run_all(&service, &caps).await;
    });
}
