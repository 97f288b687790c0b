//! What went wrong in a TLS handshake, named once for every service crate.
//!
//! The service crates (`leasehold-redis`, `leasehold-etcd`, `leasehold-postgres`) each
//! reach their server through rustls, whose failures arrive as text inside the
//! client's error (a transport error of redis-rs, tonic or tokio-postgres). Each crate
//! reads that text with [`TlsProblem::from_error_text`] and reports the problem as a
//! final error of its own type: none of these clears by retrying, so none is retried
//! as a transport failure, and each message says what to change.

use core::fmt;

/// Why a TLS connection could not be made. Every one is final: retrying the same
/// connection with the same files gets the same answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsProblem {
    /// The server's certificate is not signed by a CA this client trusts.
    UntrustedServer,
    /// The server's certificate names neither the host name nor the IP address
    /// connected to.
    WrongServerName,
    /// The server's certificate has expired, or is not valid yet.
    ServerCertExpired,
    /// The server requires a client certificate and none was presented.
    ClientCertRequired,
    /// The server refused the client certificate: not signed by a CA it trusts, or
    /// not usable as a client certificate.
    ClientCertRefused,
    /// The server refused the client certificate because it has expired.
    ClientCertExpired,
    /// Some other handshake failure: no protocol version or cipher in common, or
    /// something that does not speak TLS on this port.
    Handshake,
}

impl TlsProblem {
    /// The problem that a TLS failure's text (the error and its causes, as rustls
    /// words them) names, or `None` when the text is not about TLS.
    pub fn from_error_text(text: &str) -> Option<TlsProblem> {
        let has = |sign: &str| text.contains(sign);
        if has("invalid peer certificate") {
            return Some(if has("not valid for name") || has("NotValidForName") {
                TlsProblem::WrongServerName
            } else if has("expired") || has("Expired") || has("not valid yet") {
                TlsProblem::ServerCertExpired
            } else {
                TlsProblem::UntrustedServer
            });
        }
        if has("received fatal alert") {
            return Some(if has("CertificateRequired") {
                TlsProblem::ClientCertRequired
            } else if has("CertificateExpired") {
                TlsProblem::ClientCertExpired
            } else if has("UnknownCA")
                || has("BadCertificate")
                || has("CertificateUnknown")
                || has("UnsupportedCertificate")
                || has("DecryptError")
                || has("AccessDenied")
            {
                TlsProblem::ClientCertRefused
            } else {
                TlsProblem::Handshake
            });
        }
        if has("peer is incompatible")
            || has("InvalidContentType")
            || has("peer misbehaved")
            || has("corrupt message")
        {
            return Some(TlsProblem::Handshake);
        }
        None
    }
}

impl fmt::Display for TlsProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsProblem::UntrustedServer => {
                "the server's certificate is not signed by a trusted CA (give the CA that \
                 signed it: `--tls-ca`, or the builder's `tls_root_cert`)"
            }
            TlsProblem::WrongServerName => {
                "the server's certificate is not for the host in the URL (connect with a \
                 name or IP address its subjectAltName lists)"
            }
            TlsProblem::ServerCertExpired => {
                "the server's certificate has expired or is not valid yet (renew it, or \
                 check this machine's clock)"
            }
            TlsProblem::ClientCertRequired => {
                "the server requires a client certificate (give one: `--tls-cert` and \
                 `--tls-key`, or the builder's `tls_client_cert`)"
            }
            TlsProblem::ClientCertRefused => {
                "the server refused the client certificate (is it signed by a CA the \
                 server trusts, and made for client authentication?)"
            }
            TlsProblem::ClientCertExpired => {
                "the server refused the client certificate as expired (renew it)"
            }
            TlsProblem::Handshake => {
                "the TLS handshake failed (does the server speak TLS on this port, with a \
                 TLS version and cipher in common?)"
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::TlsProblem;

    #[test]
    fn rustls_messages_name_their_problem() {
        let cases = [
            (
                "invalid peer certificate: UnknownIssuer",
                TlsProblem::UntrustedServer,
            ),
            (
                "io error: invalid peer certificate: certificate not valid for name \
                 \"127.0.0.1\"; certificate is only valid for elsewhere.invalid",
                TlsProblem::WrongServerName,
            ),
            (
                "invalid peer certificate: certificate expired: verification time 2",
                TlsProblem::ServerCertExpired,
            ),
            (
                "received fatal alert: CertificateRequired",
                TlsProblem::ClientCertRequired,
            ),
            (
                "received fatal alert: UnknownCA",
                TlsProblem::ClientCertRefused,
            ),
            (
                "received fatal alert: BadCertificate",
                TlsProblem::ClientCertRefused,
            ),
            (
                "received fatal alert: CertificateExpired",
                TlsProblem::ClientCertExpired,
            ),
            (
                "received corrupt message of type InvalidContentType",
                TlsProblem::Handshake,
            ),
        ];
        for (text, problem) in cases {
            assert_eq!(TlsProblem::from_error_text(text), Some(problem), "{text}");
        }
        assert_eq!(
            TlsProblem::from_error_text("Connection refused (os error 111)"),
            None
        );
    }
}

#[cfg(feature = "rustls")]
pub use pem::{client_identity, root_certs, TlsFile, TlsFileError};

/// Reading the PEM files of a TLS connection, checked once for every service crate.
#[cfg(feature = "rustls")]
mod pem {
    extern crate alloc;

    use alloc::string::{String, ToString};
    use alloc::sync::Arc;
    use alloc::vec::Vec;
    use core::fmt;

    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    /// Which file of a TLS setup.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    #[non_exhaustive]
    pub enum TlsFile {
        /// The CA trusted instead of the system's roots (`--tls-ca`).
        RootCert,
        /// The client certificate (`--tls-cert`).
        ClientCert,
        /// The client certificate's private key (`--tls-key`).
        ClientKey,
    }

    impl fmt::Display for TlsFile {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(match self {
                TlsFile::RootCert => "the CA certificate (--tls-ca, tls_root_cert)",
                TlsFile::ClientCert => "the client certificate (--tls-cert, tls_client_cert)",
                TlsFile::ClientKey => "the client key (--tls-key, tls_client_cert)",
            })
        }
    }

    /// A TLS file that cannot be used; found before anything is sent.
    #[derive(Clone, Debug, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum TlsFileError {
        /// The file holds no PEM section of the kind it should (`BEGIN CERTIFICATE`,
        /// `BEGIN PRIVATE KEY`…), or a broken one.
        NotPem {
            /// Which file.
            file: TlsFile,
            /// What the PEM reader said.
            detail: String,
        },
        /// The private key is not the client certificate's.
        KeyMismatch,
        /// The certificate or key cannot be used otherwise (an unsupported key type).
        Unusable(String),
    }

    impl fmt::Display for TlsFileError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                TlsFileError::NotPem { file, detail } => {
                    write!(f, "{file} is not PEM ({detail})")
                }
                TlsFileError::KeyMismatch => f.write_str(
                    "the client key (--tls-key) does not belong to the client certificate \
                     (--tls-cert)",
                ),
                TlsFileError::Unusable(detail) => {
                    write!(f, "the client certificate and key cannot be used: {detail}")
                }
            }
        }
    }

    impl core::error::Error for TlsFileError {}

    /// The certificates of a CA file (PEM, one or more).
    pub fn root_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
        certs(pem, TlsFile::RootCert)
    }

    /// The client certificate chain and its key, checked to belong together (with
    /// the process's default crypto provider, aws-lc-rs's if there is none).
    pub fn client_identity(
        cert: &[u8],
        key: &[u8],
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsFileError> {
        let chain = certs(cert, TlsFile::ClientCert)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsFileError::NotPem {
            file: TlsFile::ClientKey,
            detail: e.to_string(),
        })?;
        let provider = CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        match rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider) {
            Ok(_) => Ok((chain, key)),
            Err(rustls::Error::InconsistentKeys(_)) => Err(TlsFileError::KeyMismatch),
            Err(other) => Err(TlsFileError::Unusable(other.to_string())),
        }
    }

    fn certs(pem: &[u8], file: TlsFile) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsFileError::NotPem {
                file,
                detail: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(TlsFileError::NotPem {
                file,
                detail: "no BEGIN CERTIFICATE section".into(),
            });
        }
        Ok(certs)
    }
}
