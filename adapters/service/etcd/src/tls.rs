//! TLS settings for `https://` endpoints: a private CA and a client certificate
//! (mutual TLS, for etcd's `--client-cert-auth`), checked when the service is built
//! (by `leasehold_driver::tls`, as every service crate checks them) so that a file
//! that is not PEM, or a key that does not belong to its certificate, fails at once
//! with a message saying which.

use std::sync::Arc;

use etcd_client::{Certificate, Identity, TlsOptions};
use leasehold_driver::TlsProblem;
use tokio::io::AsyncReadExt;

/// The PEM files of a TLS connection, as given to the builder.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    /// The CA to trust instead of the system's roots.
    pub(crate) root_cert: Option<Vec<u8>>,
    /// The client certificate (chain) and its private key.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsFiles {
    /// Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("root_cert", &self.root_cert.is_some())
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// The client's TLS options once each file is checked; the handshake is bounded
    /// by `handshake`.
    pub(crate) fn options(
        &self,
        handshake: std::time::Duration,
    ) -> Result<TlsOptions, leasehold_driver::tls::TlsFileError> {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // The provider tonic falls back on, installed for the check below too.
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }
        let mut options = TlsOptions::new().timeout(handshake);
        options = match &self.root_cert {
            Some(pem) => {
                leasehold_driver::tls::root_certs(pem)?;
                options.ca_certificate(Certificate::from_pem(pem))
            }
            None => options.with_native_roots(),
        };
        if let Some((cert, key)) = &self.client {
            leasehold_driver::tls::client_identity(cert, key)?;
            options = options.identity(Identity::from_pem(cert, key));
        }
        Ok(options)
    }
}

impl TlsFiles {
    /// What one TLS connection of its own to `endpoint` (`https://host:port`), with
    /// the same files, finds wrong, if anything: a handshake refused either way.
    ///
    /// Why not a request on the client's channel: a server that refuses the client's
    /// certificate after a TLS 1.3 handshake sends its alert and closes, while the
    /// HTTP/2 client is already writing its preface, so the client often sees the
    /// connection reset and never reads the alert. This connection writes nothing:
    /// it completes the handshake and reads, so it reads either the server's first
    /// HTTP/2 frame (all is well) or its alert. `None` also when the endpoint cannot
    /// be reached; the caller bounds the wait.
    pub(crate) async fn handshake_problem(&self, endpoint: &str) -> Option<(TlsProblem, String)> {
        let authority = endpoint.strip_prefix("https://")?.split('/').next()?;
        let (host, _) = authority.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).ok()?;
        let config = self.client_config().ok()?;
        let tcp = tokio::net::TcpStream::connect(authority).await.ok()?;
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let problem = |e: std::io::Error| {
            let text = e.to_string();
            TlsProblem::from_error_text(&text).map(|problem| (problem, text))
        };
        let mut tls = match connector.connect(name, tcp).await {
            Ok(tls) => tls,
            Err(e) => return problem(e),
        };
        let mut first = [0u8; 1];
        match tls.read(&mut first).await {
            Ok(_) => None,
            Err(e) => problem(e),
        }
    }

    /// The rustls configuration tonic makes of these files: the CA (or the system's
    /// roots), the client certificate, ALPN `h2`.
    fn client_config(&self) -> Result<rustls::ClientConfig, leasehold_driver::tls::TlsFileError> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.root_cert {
            Some(pem) => {
                roots.add_parsable_certificates(leasehold_driver::tls::root_certs(pem)?);
            }
            None => {
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            }
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match &self.client {
            Some((cert, key)) => {
                let (chain, key) = leasehold_driver::tls::client_identity(cert, key)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| leasehold_driver::tls::TlsFileError::Unusable(e.to_string()))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}
