//! `rediss://` with a private CA (made by `openssl` for this test) and a password.

mod common;

use common::*;
use leasehold_test_support::{RedisOptions, RedisServer, TlsFiles};

#[test]
fn rediss_with_a_private_ca_runs_the_command_and_an_untrusted_one_fails_clearly() {
    let dir = scratch("cli-tls");
    let tls = TlsFiles::generate(dir.path());
    let server = RedisServer::start_with(RedisOptions {
        password: Some("tls-secret".into()),
        tls: Some(tls.clone()),
        ..RedisOptions::default()
    });
    let url = format!(
        "rediss://:tls-secret@127.0.0.1:{}",
        server.tls_port().unwrap()
    );

    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(&tls.ca)
        .args(["run", "k", "--", "sh", "-c", "echo $LEASEHOLD_FENCE"]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A fence: Redis's clock in µs for a new key.
    assert!(text(&out.stdout).trim().parse::<u64>().unwrap() > 1_700_000_000_000_000);

    let mut cmd = leasehold(&url, dir.path());
    cmd.args(["run", "k", "--", "true"]);
    let out = output(cmd);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("certificate"), "{err}");
    assert!(!err.contains("tls-secret"), "{err}");

    let mut cmd = leasehold(&url, dir.path());
    cmd.arg("--tls-ca")
        .arg(dir.path().join("missing.pem"))
        .args(["status", "k"]);
    let out = output(cmd);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("missing.pem: cannot read it"), "{err}");
}
