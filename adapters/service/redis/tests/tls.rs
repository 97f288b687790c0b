//! `rediss://` against a real `redis-server` listening for TLS with `tls-auth-clients
//! yes` (mutual TLS), with a private CA and certificates made by `openssl` for each
//! test. Needs the `tls` feature (and `cluster` for the cluster test):
//! `cargo test -p leasehold-redis --features tls,cluster --test tls`.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use leasehold::{Event, Owner, Refusal, Term};
use leasehold_driver::TlsProblem;
use leasehold_redis::{Builder, RedisLockError, RedisLockService, Released};

use common::*;

/// A server with TLS on, client certificates required, a `requirepass` for the
/// default user and an ACL user `app` (password `app-secret`) allowed everything.
fn mutual_tls_server(tls: &TlsFiles) -> RedisServer {
    let server = RedisServer::start_with(RedisOptions {
        password: Some("tls-secret".into()),
        tls: Some(tls.clone()),
        tls_auth_clients: true,
        ..RedisOptions::default()
    });
    assert_eq!(
        server
            .inline("ACL SETUSER app on >app-secret ~* &* +@all")
            .as_deref(),
        Some("+OK\r\n")
    );
    server
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// A builder with the test's CA and its client certificate.
fn mutual(url: &str, tls: &TlsFiles) -> Builder {
    RedisLockService::builder(url)
        .tls_root_cert(read(&tls.ca))
        .tls_client_cert(read(&tls.client_cert), read(&tls.client_key))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The lease API (`leasehold-tokio`) holds a key over mutual TLS as an ACL user and
/// renews it three times; the legacy `requirepass` works as well.
#[test]
fn a_lease_is_held_and_renewed_over_mutual_tls_as_an_acl_user() {
    let dir = scratch_dir("redis-mtls");
    let tls = TlsFiles::generate(dir.path());
    let server = mutual_tls_server(&tls);
    let port = server.tls_port().unwrap();
    runtime().block_on(async {
        let url = format!("rediss://app:app-secret@127.0.0.1:{port}");
        let service = Arc::new(mutual(&url, &tls).connect().await.expect("mutual TLS"));
        let lease = leasehold_tokio::acquire(service.clone(), "mtls", config(300))
            .await
            .unwrap();
        let mut events = lease.events();
        let mut renewals = 0;
        while renewals < 3 {
            let timed = tokio::time::timeout(std_ms(1_000), events.recv())
                .await
                .expect("renewals every T/3")
                .unwrap();
            if matches!(timed.event, Event::Renewed { .. }) {
                renewals += 1;
            }
        }
        assert!(lease.check().is_ok());
        assert_eq!(lease.release().await, leasehold_tokio::LeaseEnd::Released);

        let legacy = format!("rediss://:tls-secret@127.0.0.1:{port}");
        let service = mutual(&legacy, &tls).connect().await.expect("requirepass");
        let token = Owner([7; 16]).token(Term(1));
        grant_renew_and_find_fence(&service, "legacy", token, &leasehold::Identity::EMPTY).await;
        assert_eq!(
            service.try_release("legacy", token).await.unwrap(),
            Released::Released
        );
    });
}

/// Connects with `builder`, expecting a failure; returns it and how long it took.
async fn refused(what: &str, builder: Builder) -> (RedisLockError, StdDuration) {
    let started = Instant::now();
    let err = tokio::time::timeout(StdDuration::from_secs(5), builder.connect())
        .await
        .unwrap_or_else(|_| panic!("{what}: connect hung"))
        .expect_err(what);
    let took = started.elapsed();
    eprintln!("[tls] {what}: {took:?}: {err}");
    // The connection manager's bound: 7 attempts (the first and 6 retries) of at
    // most the connect timeout (500 ms) each, and about 350 ms of backoff between
    // them; measured about 1 s.
    assert!(took < StdDuration::from_millis(3_900), "{what}: {took:?}");
    (err, took)
}

fn assert_tls(what: &str, err: &RedisLockError, expected: TlsProblem) {
    match err {
        RedisLockError::Tls { problem, .. } => assert_eq!(*problem, expected, "{what}: {err}"),
        other => panic!("{what}: {other:?}"),
    }
    assert_eq!(err.refusal(), Some(Refusal::Unauthorized), "{what}: final");
    assert!(!err.to_string().contains("secret"), "{what}: {err}");
}

fn assert_config(what: &str, err: &RedisLockError, says: &str) {
    assert!(
        matches!(err, RedisLockError::Config { .. }) && err.to_string().contains(says),
        "{what}: {err:?}"
    );
    assert!(!err.to_string().contains("secret"), "{what}: {err}");
}

/// Every way mutual TLS goes wrong fails `connect` promptly with a typed, final
/// error naming the cause, the password never shown.
#[test]
fn each_tls_failure_is_named_final_and_prompt() {
    let dir = scratch_dir("redis-mtls-fail");
    let tls = TlsFiles::generate(dir.path());
    let other = TlsFiles::generate(&dir.path().join("other"));
    let server = mutual_tls_server(&tls);
    // The same CA's certificates, but for another name, and expired.
    let (elsewhere_cert, elsewhere_key) =
        tls.issue("elsewhere", "elsewhere", Some("DNS:elsewhere.invalid"), 1);
    let elsewhere = RedisServer::start_with(RedisOptions {
        tls: Some(TlsFiles {
            cert: elsewhere_cert,
            key: elsewhere_key,
            ..tls.clone()
        }),
        tls_auth_clients: true,
        ..RedisOptions::default()
    });
    let (old_cert, old_key) = tls.issue("old-server", "127.0.0.1", Some("IP:127.0.0.1"), -1);
    let expired = RedisServer::start_with(RedisOptions {
        tls: Some(TlsFiles {
            cert: old_cert,
            key: old_key,
            ..tls.clone()
        }),
        tls_auth_clients: true,
        ..RedisOptions::default()
    });
    let (old_client_cert, old_client_key) = tls.issue("old-client", "postgres", None, -1);
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let url = |server: &RedisServer| {
        format!(
            "rediss://app:app-secret@127.0.0.1:{}",
            server.tls_port().unwrap()
        )
    };
    runtime().block_on(async {
        let good = url(&server);
        let (err, _) = refused(
            "no client certificate",
            RedisLockService::builder(good.as_str()).tls_root_cert(read(&tls.ca)),
        )
        .await;
        assert_tls(
            "no client certificate",
            &err,
            TlsProblem::ClientCertRequired,
        );

        let (err, _) = refused(
            "a client certificate from another CA",
            RedisLockService::builder(good.as_str())
                .tls_root_cert(read(&tls.ca))
                .tls_client_cert(read(&other.client_cert), read(&other.client_key)),
        )
        .await;
        assert_tls("another CA", &err, TlsProblem::ClientCertRefused);

        let (err, _) = refused(
            "an expired client certificate",
            RedisLockService::builder(good.as_str())
                .tls_root_cert(read(&tls.ca))
                .tls_client_cert(read(&old_client_cert), read(&old_client_key)),
        )
        .await;
        assert_tls("expired client", &err, TlsProblem::ClientCertExpired);

        let (err, _) = refused(
            "a server certificate from a CA not trusted",
            mutual(&good, &other).tls_client_cert(read(&tls.client_cert), read(&tls.client_key)),
        )
        .await;
        assert_tls("untrusted server", &err, TlsProblem::UntrustedServer);

        let (err, _) = refused(
            "a server certificate for another name",
            mutual(&url(&elsewhere), &tls),
        )
        .await;
        assert_tls("another name", &err, TlsProblem::WrongServerName);

        let (err, _) = refused(
            "an expired server certificate",
            mutual(&url(&expired), &tls),
        )
        .await;
        assert_tls("expired server", &err, TlsProblem::ServerCertExpired);

        let (err, took) = refused(
            "a key that is not the certificate's",
            RedisLockService::builder(good.as_str())
                .tls_root_cert(read(&tls.ca))
                .tls_client_cert(read(&tls.client_cert), read(&other.client_key)),
        )
        .await;
        assert_config(
            "key mismatch",
            &err,
            "does not belong to the client certificate",
        );
        assert!(
            took < StdDuration::from_millis(100),
            "nothing sent: {took:?}"
        );

        let (err, _) = refused(
            "a CA file that is not PEM",
            RedisLockService::builder(good.as_str()).tls_root_cert(read(&not_pem)),
        )
        .await;
        assert_config(
            "not PEM",
            &err,
            "the CA certificate (--tls-ca, tls_root_cert) is not PEM",
        );
        let (err, _) = refused(
            "a client key that is not PEM",
            RedisLockService::builder(good.as_str())
                .tls_root_cert(read(&tls.ca))
                .tls_client_cert(read(&tls.client_cert), read(&not_pem)),
        )
        .await;
        assert_config(
            "key not PEM",
            &err,
            "the client key (--tls-key, tls_client_cert) is not PEM",
        );

        let wrong = format!(
            "rediss://app:wrong-secret@127.0.0.1:{}",
            server.tls_port().unwrap()
        );
        let (err, _) = refused("a wrong ACL password", mutual(&wrong, &tls)).await;
        assert!(
            matches!(
                err,
                RedisLockError::Refused {
                    refusal: Refusal::Unauthorized,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!err.to_string().contains("wrong-secret"), "{err}");
    });
}

/// The service contract (`leasehold-conformance`), once over mutual TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_the_contract_over_mutual_tls() {
    let dir = scratch_dir("redis-mtls-conformance");
    let tls = TlsFiles::generate(dir.path());
    let server = mutual_tls_server(&tls);
    let url = format!(
        "rediss://app:app-secret@127.0.0.1:{}",
        server.tls_port().unwrap()
    );
    let service = mutual(&url, &tls)
        .request_timeout(StdDuration::from_secs(2))
        .connect()
        .await
        .expect("mutual TLS");
    leasehold_conformance::run_all(
        &service,
        &leasehold_conformance::Capabilities::redis(leasehold::Duration::from_millis(300)),
    )
    .await;
}

/// A Redis Cluster node over mutual TLS (`tls-cluster yes`): the slot map names its
/// TLS port, and every node connection presents the client certificate.
#[cfg(feature = "cluster")]
#[test]
fn a_cluster_is_reached_over_mutual_tls() {
    let dir = scratch_dir("redis-mtls-cluster");
    let tls = TlsFiles::generate(dir.path());
    let node = RedisServer::start_with(RedisOptions {
        tls: Some(tls.clone()),
        tls_auth_clients: true,
        cluster: true,
        ..RedisOptions::default()
    });
    assert_eq!(
        node.inline("CLUSTER ADDSLOTSRANGE 0 16383").as_deref(),
        Some("+OK\r\n")
    );
    let seed = format!("rediss://127.0.0.1:{}", node.tls_port().unwrap());
    runtime().block_on(async {
        wait_for(
            "the one-node cluster is up",
            StdDuration::from_secs(10),
            || {
                let up = node
                    .inline("CLUSTER INFO")
                    .is_some_and(|info| info.contains("cluster_state:ok"));
                async move { up }
            },
        )
        .await;
        let (ca, cert, key) = (read(&tls.ca), read(&tls.client_cert), read(&tls.client_key));
        let service = RedisLockService::connect_cluster_with_tls(
            [seed.as_str()],
            Some(&ca),
            Some((&cert, &key)),
        )
        .await
        .expect("cluster over mutual TLS");
        let token = Owner([9; 16]).token(Term(1));
        let granted = service
            .try_acquire("c", token, &leasehold::Identity::EMPTY, ms(1_000))
            .await
            .unwrap();
        // An unmarked node: its first grant waits the quarantine, and says so (an
        // answer from the script is what shows the node was reached over TLS).
        assert!(
            matches!(
                granted,
                leasehold_redis::Acquired::Granted { .. }
                    | leasehold_redis::Acquired::Quarantined { .. }
            ),
            "{granted:?}"
        );
        let err = RedisLockService::connect_cluster_with_tls([seed.as_str()], Some(&ca), None)
            .await
            .expect_err("no client certificate");
        assert!(
            matches!(
                err,
                RedisLockError::Tls {
                    problem: TlsProblem::ClientCertRequired,
                    ..
                }
            ),
            "{err:?}"
        );
    });
}
