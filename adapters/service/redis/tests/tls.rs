//! `rediss://` against a real `redis-server` listening for TLS with a private CA made
//! by `openssl` for this test. Needs the `tls` feature:
//! `cargo test -p leasehold-redis --features tls --test tls`.

mod common;

use std::path::Path;
use std::process::Command;

use leasehold::{Fence, Owner, Term};
use leasehold_redis::{Acquired, RedisLockError, RedisLockService, Released, Renewed};

use common::*;

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new(binary("openssl", "openssl").unwrap_or_else(|e| panic!("{e}")))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        status.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1, signed by it.
fn make_certs(dir: &Path) -> TlsFiles {
    std::fs::create_dir_all(dir).unwrap();
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
            "/CN=leasehold test CA",
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
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
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
fn rediss_with_a_private_ca_and_a_password() {
    let dir = scratch_dir("redis-tls");
    let tls = make_certs(dir.path());
    let server = RedisServer::start_with(RedisOptions {
        password: Some("tls-secret".into()),
        tls: Some(tls.clone()),
        ..RedisOptions::default()
    });
    let tls_port = server.tls_port().expect("started with TLS");
    run_local(async {
        let url = format!("rediss://:tls-secret@127.0.0.1:{tls_port}");
        let ca = std::fs::read(&tls.ca).unwrap();
        let service = RedisLockService::builder(url.as_str())
            .tls_root_cert(ca)
            .connect()
            .await
            .expect("TLS connection with the private CA");
        let token = Owner([7; 16]).token(Term(1));
        assert!(matches!(
            service
                .try_acquire("tls", token, &leasehold::Identity::EMPTY, ms(1_000))
                .await
                .unwrap(),
            Acquired::Granted {
                fence: Fence(1),
                ..
            }
        ));
        assert!(matches!(
            service
                .try_renew("tls", token, Fence(1), ms(1_000))
                .await
                .unwrap(),
            Renewed::Renewed { .. }
        ));
        assert_eq!(
            service.try_holder("tls").await.unwrap().map(|h| h.fence),
            Some(Fence(1))
        );
        assert_eq!(
            service.try_release("tls", token).await.unwrap(),
            Released::Released
        );

        // Without the private CA the certificate is not trusted: no connection.
        let err = RedisLockService::builder(url.as_str())
            .reconnect_backoff(std_ms(1), std_ms(1), 0)
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(err, RedisLockError::Transport { .. })
                && err.to_string().contains("certificate")
                && err.to_string().contains("tls_root_cert")
                && err.to_string().contains(&format!("127.0.0.1:{tls_port}")),
            "{err:?}"
        );
        eprintln!("[tls] untrusted certificate: {err}");
    });
}
