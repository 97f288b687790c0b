//! TLS settings for `rediss://`: a private CA and a client certificate (mutual TLS),
//! checked when the service is built (by `leasehold_driver::tls`, as every service
//! crate checks them) so that a file that is not PEM, or a key that does not belong
//! to its certificate, fails at once with a message saying which.

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
    /// The certificates for redis-rs, once each file is checked; `None` when nothing
    /// was set (the system's roots, no client certificate).
    pub(crate) fn certificates(
        &self,
    ) -> Result<Option<redis::TlsCertificates>, leasehold_driver::tls::TlsFileError> {
        install_provider();
        if let Some(pem) = &self.root_cert {
            leasehold_driver::tls::root_certs(pem)?;
        }
        if let Some((cert, key)) = &self.client {
            leasehold_driver::tls::client_identity(cert, key)?;
        }
        if self.root_cert.is_none() && self.client.is_none() {
            return Ok(None);
        }
        Ok(Some(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_cert.clone(),
        }))
    }
}

/// rustls needs a process-wide crypto provider; installs aws-lc-rs's unless the
/// application already chose one.
pub(crate) fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}
