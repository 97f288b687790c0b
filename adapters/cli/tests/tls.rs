//! `rediss://` with a private CA (made by `openssl` for this test) and a password.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use leasehold_test_support::{RedisOptions, RedisServer, TlsFiles};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new(leasehold_test_support::binary("openssl", "openssl").unwrap())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        text(&out.stderr)
    );
}

/// A CA and a certificate for 127.0.0.1 signed by it.
fn certs(dir: &Path) -> TlsFiles {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=leasehold cli test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            "server.crt",
            "-extfile",
            "san.ext",
        ],
    );
    TlsFiles {
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        ca: dir.join("ca.crt"),
    }
}

#[test]
fn rediss_with_a_private_ca_runs_the_command_and_an_untrusted_one_fails_clearly() {
    let dir = scratch("cli-tls");
    let tls = certs(dir.path());
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
    assert_eq!(text(&out.stdout).trim(), "1");

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
