//! `rediss://` against a real `redis-server` listening for TLS with a private CA made
//! by `openssl` for this test. Needs the `tls` feature:
//! `cargo test -p leasehold-redis --features tls --test tls`.

mod common;

use leasehold::{Owner, Term};
use leasehold_redis::{RedisLockError, RedisLockService, Released};

use common::*;

#[test]
fn rediss_with_a_private_ca_and_a_password() {
    let dir = scratch_dir("redis-tls");
    let tls = TlsFiles::generate(dir.path());
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
        grant_renew_and_find_fence(&service, "tls", token, &leasehold::Identity::EMPTY).await;
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
