//! Mutual TLS from the command line (`--tls-ca`, `--tls-cert`, `--tls-key`) to a
//! real redis-server (`tls-auth-clients yes`), etcd (`--client-cert-auth`) and
//! PostgreSQL (`hostssl … cert`), certificates made by `openssl` for each test; the
//! password from `LEASEHOLD_PASSWORD` or `--password-file`, never printed; every
//! failure exits 125 with a message naming the cause.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use leasehold_test_support::{
    EtcdCluster, PostgresOptions, PostgresServer, RedisOptions, RedisServer, TlsFiles,
};

/// `leasehold` on `url` with the CA, the client certificate and key given by flags.
fn with_tls(url: &str, dir: &Path, tls: &TlsFiles) -> Command {
    let mut cmd = leasehold(url, dir);
    cmd.arg("--tls-ca")
        .arg(&tls.ca)
        .arg("--tls-cert")
        .arg(&tls.client_cert)
        .arg("--tls-key")
        .arg(&tls.client_key)
        .env_remove("LEASEHOLD_PASSWORD");
    cmd
}

/// Runs a command that outlives two renewals (`--ttl 2s`: renewals every ~667 ms)
/// and prints its fence and whether it saw `LEASEHOLD_PASSWORD`.
fn run_a_while(mut cmd: Command) -> Output {
    cmd.args([
        "run",
        "--ttl",
        "2s",
        "k",
        "--",
        "sh",
        "-c",
        "sleep 1.5; echo \"$LEASEHOLD_FENCE ${LEASEHOLD_PASSWORD:-none}\"",
    ]);
    output(cmd)
}

/// The command ran to its end under a renewed lease: exit 0, a fence, and no
/// password in its environment.
fn assert_held(what: &str, out: &Output) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{what}: {stderr}");
    let mut words = stdout.split_whitespace();
    assert!(
        words
            .next()
            .is_some_and(|fence| fence.parse::<u64>().is_ok()),
        "{what}: {stdout}"
    );
    assert_eq!(
        words.next(),
        Some("none"),
        "{what}: the password is not passed on"
    );
}

/// Exit 125 within `within`, a message containing each of `says`, and never `secret`.
fn assert_fails(what: &str, cmd: Command, says: &[&str], within: Duration) {
    let started = Instant::now();
    let out = output(cmd);
    let took = started.elapsed();
    let err = text(&out.stderr);
    eprintln!("[cli tls] {what}: {took:?}: {}", err.trim());
    assert_eq!(out.status.code(), Some(125), "{what}: {err}");
    for say in says {
        assert!(err.contains(say), "{what}: `{say}` in {err}");
    }
    assert!(!err.contains("secret"), "{what}: {err}");
    assert!(took < within, "{what}: {took:?}");
}

#[test]
fn redis_over_mutual_tls_with_the_password_out_of_the_url() {
    let dir = scratch("cli-redis-mtls");
    let tls = TlsFiles::generate(dir.path());
    let other = TlsFiles::generate(&dir.path().join("other"));
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
    let url = format!("rediss://app@127.0.0.1:{}", server.tls_port().unwrap());
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "app-secret\n").unwrap();

    let mut cmd = with_tls(&url, dir.path(), &tls);
    cmd.env("LEASEHOLD_PASSWORD", "app-secret");
    assert_held("LEASEHOLD_PASSWORD", &run_a_while(cmd));
    let mut cmd = with_tls(&url, dir.path(), &tls);
    cmd.arg("--password-file").arg(&password_file);
    assert_held("--password-file", &run_a_while(cmd));

    let bound = Duration::from_secs(5);
    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&tls.ca)
        .env("LEASEHOLD_PASSWORD", "app-secret")
        .args(["status", "k"]);
    assert_fails(
        "no client certificate",
        cmd,
        &["requires a client certificate", "--tls-cert"],
        bound,
    );

    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&tls.ca)
        .arg("--tls-cert")
        .arg(&other.client_cert)
        .arg("--tls-key")
        .arg(&other.client_key)
        .env("LEASEHOLD_PASSWORD", "app-secret")
        .args(["run", "k", "--", "true"]);
    assert_fails(
        "a client certificate from another CA",
        cmd,
        &["refused the client certificate"],
        bound,
    );

    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&tls.ca)
        .arg("--tls-cert")
        .arg(&tls.client_cert)
        .arg("--tls-key")
        .arg(&other.client_key)
        .env("LEASEHOLD_PASSWORD", "app-secret")
        .args(["run", "k", "--", "true"]);
    assert_fails(
        "a key that is not the certificate's",
        cmd,
        &["does not belong to the client certificate"],
        bound,
    );

    let (old_cert, old_key) = tls.issue("old-client", "postgres", None, -1);
    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&tls.ca)
        .arg("--tls-cert")
        .arg(&old_cert)
        .arg("--tls-key")
        .arg(&old_key)
        .env("LEASEHOLD_PASSWORD", "app-secret")
        .args(["run", "k", "--", "true"]);
    assert_fails(
        "an expired client certificate",
        cmd,
        &["refused the client certificate as expired"],
        bound,
    );

    let (cert, key) = tls.issue("elsewhere", "elsewhere", Some("DNS:elsewhere.invalid"), 1);
    let elsewhere = RedisServer::start_with(RedisOptions {
        tls: Some(TlsFiles {
            cert,
            key,
            ..tls.clone()
        }),
        tls_auth_clients: true,
        ..RedisOptions::default()
    });
    let mut cmd = with_tls(
        &format!("rediss://127.0.0.1:{}", elsewhere.tls_port().unwrap()),
        dir.path(),
        &tls,
    );
    cmd.args(["run", "k", "--", "true"]);
    assert_fails(
        "a server certificate for another name",
        cmd,
        &["not for the host in the URL"],
        bound,
    );

    let mut cmd = with_tls(&url, dir.path(), &tls);
    cmd.env("LEASEHOLD_PASSWORD", "wrong-secret")
        .args(["run", "k", "--", "true"]);
    assert_fails(
        "a wrong ACL password",
        cmd,
        &["authentication failed"],
        bound,
    );

    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&not_pem)
        .arg("--tls-cert")
        .arg(&tls.client_cert)
        .arg("--tls-key")
        .arg(&tls.client_key)
        .env("LEASEHOLD_PASSWORD", "app-secret")
        .args(["run", "k", "--", "true"]);
    assert_fails("a CA file that is not PEM", cmd, &["is not PEM"], bound);

    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-cert")
        .arg(&tls.client_cert)
        .args(["status", "k"]);
    assert_fails("--tls-cert without --tls-key", cmd, &["--tls-key"], bound);

    let plain = format!("redis://127.0.0.1:{}", server.port());
    let mut cmd = with_tls(&plain, dir.path(), &tls);
    cmd.args(["status", "k"]);
    assert_fails("TLS files for redis://", cmd, &["use rediss://"], bound);

    let mut cmd = with_tls(
        &format!(
            "rediss://app:url-secret@127.0.0.1:{}",
            server.tls_port().unwrap()
        ),
        dir.path(),
        &tls,
    );
    cmd.env("LEASEHOLD_PASSWORD", "app-secret")
        .args(["status", "k"]);
    assert_fails("a password twice", cmd, &["give it once"], bound);
}

#[test]
fn etcd_over_mutual_tls_with_a_user_from_the_password_file() {
    let dir = scratch("cli-etcd-mtls");
    let tls = TlsFiles::generate(dir.path());
    let other = TlsFiles::generate(&dir.path().join("other"));
    let etcd = EtcdCluster::single_tls(tls.clone());
    let url = format!("etcd+{}", etcd.tls_endpoint(0).unwrap());
    assert_held("mutual TLS", &run_a_while(with_tls(&url, dir.path(), &tls)));

    let bound = Duration::from_secs(5);
    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca").arg(&tls.ca).args(["status", "k"]);
    assert_fails("no client certificate", cmd, &["client certificate"], bound);

    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&other.ca)
        .arg("--tls-cert")
        .arg(&tls.client_cert)
        .arg("--tls-key")
        .arg(&tls.client_key)
        .args(["run", "k", "--", "true"]);
    assert_fails(
        "a server certificate from a CA not trusted",
        cmd,
        &["not signed by a trusted CA"],
        bound,
    );

    let plain = format!("etcd+{}", etcd.endpoint(0));
    let mut cmd = with_tls(&plain, dir.path(), &tls);
    cmd.args(["status", "k"]);
    assert_fails(
        "TLS files for etcd+http://",
        cmd,
        &["use etcd+https://"],
        bound,
    );

    // etcd's authentication on: a user in the URL, its password from a file.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut admin = etcd_client::Client::connect([etcd.endpoint(0)], None)
            .await
            .unwrap();
        admin.user_add("root", "root-secret", None).await.unwrap();
        admin.user_grant_role("root", "root").await.unwrap();
        admin.auth_enable().await.unwrap();
    });
    let user_url = format!(
        "etcd+https://root@{}",
        etcd.tls_endpoint(0).unwrap().trim_start_matches("https://")
    );
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "root-secret\n").unwrap();
    let mut cmd = with_tls(&user_url, dir.path(), &tls);
    cmd.arg("--password-file").arg(&password_file);
    assert_held("user and --password-file", &run_a_while(cmd));
    std::fs::write(&password_file, "wrong-secret\n").unwrap();
    let mut cmd = with_tls(&user_url, dir.path(), &tls);
    cmd.arg("--password-file")
        .arg(&password_file)
        .args(["run", "k", "--", "true"]);
    assert_fails("a wrong password", cmd, &["refused our credentials"], bound);
}

#[test]
fn postgres_over_mutual_tls() {
    let dir = scratch("cli-postgres-mtls");
    let tls = TlsFiles::generate(dir.path());
    let other = TlsFiles::generate(&dir.path().join("other"));
    let server = PostgresServer::start_with(PostgresOptions {
        tls: Some(tls.clone()),
        ..PostgresOptions::default()
    });
    // The tables, marked new, over the plain-text `hostnossl … trust` line.
    let plain = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
        server.port()
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let service = leasehold_postgres::PostgresLockService::builder(&plain)
                .create_tables(true)
                .connect()
                .await
                .unwrap();
            service.mark_data_set_new().await.unwrap();
        });
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full",
        server.port()
    );
    assert_held("mutual TLS", &run_a_while(with_tls(&url, dir.path(), &tls)));

    let bound = Duration::from_secs(5);
    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca").arg(&tls.ca).args(["status", "k"]);
    assert_fails(
        "no client certificate",
        cmd,
        &["requires a client certificate"],
        bound,
    );

    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&tls.ca)
        .arg("--tls-cert")
        .arg(&other.client_cert)
        .arg("--tls-key")
        .arg(&other.client_key)
        .args(["run", "k", "--", "true"]);
    assert_fails(
        "a client certificate from another CA",
        cmd,
        &["refused the client certificate"],
        bound,
    );
}
