//! `https://` endpoints against a real etcd started with `--client-cert-auth` (mutual
//! TLS), with a private CA and certificates made by `openssl` for each test. Needs
//! the `tls` feature: `cargo test -p leasehold-etcd --features tls --test tls`.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use leasehold::{Event, Refusal};
use leasehold_driver::TlsProblem;
use leasehold_etcd::{Builder, ErrorKind, EtcdLockError, EtcdLockService};
use leasehold_test_support::TlsFiles;

use common::*;

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// Connecting is bounded by the connect timeout plus the request timeout.
const CONNECT: StdDuration = StdDuration::from_millis(500);
const REQUEST: StdDuration = StdDuration::from_millis(1_000);

/// A builder on `endpoint` with the test's CA and its client certificate.
fn mutual(endpoint: &str, tls: &TlsFiles) -> Builder {
    EtcdLockService::builder([endpoint])
        .connect_timeout(CONNECT)
        .request_timeout(REQUEST)
        .tls_root_cert(read(&tls.ca))
        .tls_client_cert(read(&tls.client_cert), read(&tls.client_key))
}

/// The lease API (`leasehold-tokio`) holds a key over mutual TLS and renews it three
/// times; then with etcd's authentication on, a user and password work over the
/// same TLS, and a wrong password is refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_held_and_renewed_over_mutual_tls() {
    let dir = scratch_dir("etcd-mtls");
    let tls = TlsFiles::generate(dir.path());
    let cluster = EtcdCluster::single_tls(tls.clone());
    let endpoint = cluster.tls_endpoint(0).unwrap();
    let service = Arc::new(mutual(&endpoint, &tls).connect().await.expect("mutual TLS"));
    let lease = leasehold_tokio::acquire(service.clone(), "mtls", config(1_200))
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

    let mut admin = client(&cluster).await;
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let service = Arc::new(
        mutual(&endpoint, &tls)
            .user("root", "rootpw")
            .connect()
            .await
            .expect("user and password over mutual TLS"),
    );
    let lease = leasehold_tokio::acquire(service, "auth", config(1_200))
        .await
        .unwrap();
    assert_eq!(lease.release().await, leasehold_tokio::LeaseEnd::Released);
    let (err, _) = refused(
        "a wrong password",
        mutual(&endpoint, &tls).user("root", "wrong-secret"),
    )
    .await;
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err:?}");
    assert!(!format!("{err:?}").contains("wrong-secret"), "{err:?}");
}

/// Connects with `builder`, expecting a failure within the connect bound; returns
/// it and how long it took.
async fn refused(what: &str, builder: Builder) -> (EtcdLockError, StdDuration) {
    init_tracing();
    let started = Instant::now();
    let err = tokio::time::timeout(StdDuration::from_secs(5), builder.connect())
        .await
        .unwrap_or_else(|_| panic!("{what}: connect hung"))
        .expect_err(what);
    let took = started.elapsed();
    let cause = std::error::Error::source(&err).map(|cause| cause.to_string());
    eprintln!("[tls] {what}: {took:?}: {err}: {cause:?}");
    // The probe is bounded by the connect plus the request timeout.
    assert!(took < CONNECT + REQUEST + std_ms(500), "{what}: {took:?}");
    (err, took)
}

fn assert_tls(what: &str, err: &EtcdLockError, expected: &[TlsProblem]) {
    assert!(
        matches!(err.kind(), ErrorKind::Tls(problem) if expected.contains(&problem)),
        "{what}: {err:?}"
    );
    assert_eq!(err.refusal(), Some(Refusal::Unauthorized), "{what}: final");
}

fn assert_config(what: &str, err: &EtcdLockError, says: &str) {
    let cause = std::error::Error::source(err)
        .map(|cause| cause.to_string())
        .unwrap_or_default();
    assert!(
        err.kind() == ErrorKind::Config && cause.contains(says),
        "{what}: {err:?}"
    );
}

/// Every way mutual TLS goes wrong fails `connect` within the connect bound with a
/// typed, final error naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tls_failure_is_named_final_and_prompt() {
    let dir = scratch_dir("etcd-mtls-fail");
    let tls = TlsFiles::generate(dir.path());
    let other = TlsFiles::generate(&dir.path().join("other"));
    let cluster = EtcdCluster::single_tls(tls.clone());
    let endpoint = cluster.tls_endpoint(0).unwrap();
    let (cert, key) = tls.issue("elsewhere", "elsewhere", Some("DNS:elsewhere.invalid"), 1);
    let elsewhere = EtcdCluster::single_tls(TlsFiles {
        cert,
        key,
        ..tls.clone()
    });
    let (old_cert, old_key) = tls.issue("old-client", "postgres", None, -1);
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();

    let (err, _) = refused(
        "no client certificate",
        EtcdLockService::builder([endpoint.as_str()])
            .connect_timeout(CONNECT)
            .request_timeout(REQUEST)
            .tls_root_cert(read(&tls.ca)),
    )
    .await;
    // Go's TLS 1.3 server answers `certificate_required` (`bad_certificate` before).
    assert_tls(
        "no client certificate",
        &err,
        &[
            TlsProblem::ClientCertRequired,
            TlsProblem::ClientCertRefused,
        ],
    );

    let (err, _) = refused(
        "a client certificate from another CA",
        mutual(&endpoint, &tls).tls_client_cert(read(&other.client_cert), read(&other.client_key)),
    )
    .await;
    assert_tls("another CA", &err, &[TlsProblem::ClientCertRefused]);

    let (err, _) = refused(
        "an expired client certificate",
        mutual(&endpoint, &tls).tls_client_cert(read(&old_cert), read(&old_key)),
    )
    .await;
    // Go names no reason: `bad_certificate` for every refused chain.
    assert_tls(
        "expired client",
        &err,
        &[TlsProblem::ClientCertExpired, TlsProblem::ClientCertRefused],
    );

    let (err, _) = refused(
        "a server certificate from a CA not trusted",
        mutual(&endpoint, &tls).tls_root_cert(read(&other.ca)),
    )
    .await;
    assert_tls("untrusted server", &err, &[TlsProblem::UntrustedServer]);

    let (err, _) = refused(
        "a server certificate for another name",
        mutual(&elsewhere.tls_endpoint(0).unwrap(), &tls),
    )
    .await;
    assert_tls("another name", &err, &[TlsProblem::WrongServerName]);

    let (err, took) = refused(
        "a key that is not the certificate's",
        mutual(&endpoint, &tls).tls_client_cert(read(&tls.client_cert), read(&other.client_key)),
    )
    .await;
    assert_config(
        "key mismatch",
        &err,
        "does not belong to the client certificate",
    );
    assert!(took < std_ms(100), "nothing sent: {took:?}");

    let (err, _) = refused(
        "a CA file that is not PEM",
        mutual(&endpoint, &tls).tls_root_cert(read(&not_pem)),
    )
    .await;
    assert_config(
        "not PEM",
        &err,
        "the CA certificate (--tls-ca, tls_root_cert) is not PEM",
    );
}

/// The service contract (`leasehold-conformance`), once over mutual TLS (the
/// capabilities of the plain-text run: whole-second leases, etcd's expiry lag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keeps_the_contract_over_mutual_tls() {
    let dir = scratch_dir("etcd-mtls-conformance");
    let tls = TlsFiles::generate(dir.path());
    let cluster = EtcdCluster::single_tls(tls.clone());
    let service = mutual(&cluster.tls_endpoint(0).unwrap(), &tls)
        .request_timeout(StdDuration::from_secs(2))
        .connect()
        .await
        .expect("mutual TLS");
    let mut caps = leasehold_conformance::Capabilities::new(ms(1_000));
    caps.granularity = ms(1_000);
    caps.min_ttl = ms(1_000);
    caps.expiry_slack = ms(1_500);
    caps.tolerance = ms(300);
    caps.revocation_watch = true;
    caps.holder_watch = true;
    leasehold_conformance::run_all(&service, &caps).await;
}
