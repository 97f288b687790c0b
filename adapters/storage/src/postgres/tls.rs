//! Connecting to PostgreSQL over TLS (feature `postgres-tls`): libpq's `sslmode`s on
//! `tokio-postgres` with a rustls connector (`tokio-postgres-rustls`, aws-lc-rs provider),
//! a private CA and an optional client certificate.
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | if the server offers it | checked against the CA when one is given, else not checked |
//! | `require` | always | as `prefer` |
//! | `verify-ca` | always | signed by the CA (or the system's roots) |
//! | `verify-full` | always | signed by the CA (or the system's roots) **and** for the host connected to (its DNS name or IP address in the subjectAltName) |
//!
//! As in libpq, `prefer` and `require` check the chain once a CA is given ("if a root
//! CA file exists, `require` behaves as `verify-ca`"); unlike libpq, without a CA
//! `verify-ca` and `verify-full` trust the system's roots rather than failing.
//! `tokio-postgres` itself knows only `disable`, `prefer` and `require`:
//! [`parse_config`] reads the other two out of the connection string.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold_storage::postgres::tls::{parse_config, Tls};
//!
//! let (config, mode) = parse_config(
//!     "postgres://app@db.internal/app?sslmode=verify-full",
//! )?;
//! let tls = Tls::new(mode.unwrap_or_default())
//!     .root_cert(std::fs::read("ca.crt")?)
//!     .client_cert(std::fs::read("app.crt")?, std::fs::read("app.key")?);
//! let client = tls.connector()?.connect(&config).await?;
//! # let _ = client; Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use leasehold_driver::tls::{TlsFile, TlsFileError};
pub use leasehold_driver::TlsProblem;

/// libpq's `sslmode`: whether to use TLS and what to check of the server's
/// certificate (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it (the default, as in libpq).
    #[default]
    Prefer,
    /// TLS or nothing.
    Require,
    /// TLS, with the server's certificate signed by the CA.
    VerifyCa,
    /// TLS, with the server's certificate signed by the CA and for the host.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = String;

    fn from_str(s: &str) -> Result<SslMode, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode `{other}` is not one of disable, prefer, require, verify-ca, \
                     verify-full"
                ))
            }
        })
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// The connection string as `tokio-postgres` reads it, and the `sslmode` it named
/// (if any): `verify-ca` and `verify-full`, which `tokio-postgres` does not know, are
/// taken out (the config then says `require`). Both forms work:
/// `postgres://…?sslmode=verify-full` and `host=… sslmode=verify-full`.
///
/// # Errors
///
/// An `sslmode` that is none of the five, or what `tokio-postgres` says of the rest
/// (the message never shows the password: `tokio-postgres` does not echo values).
pub fn parse_config(conninfo: &str) -> Result<(Config, Option<SslMode>), String> {
    let (rewritten, mode) = split_sslmode(conninfo)?;
    let config = Config::from_str(&rewritten).map_err(|e| e.to_string())?;
    Ok((config, mode))
}

/// `conninfo` with a libpq-only `sslmode` value replaced by `require`, and the mode.
fn split_sslmode(conninfo: &str) -> Result<(String, Option<SslMode>), String> {
    const KEY: &str = "sslmode=";
    let mut from = 0;
    while let Some(found) = conninfo[from..].find(KEY) {
        let at = from + found;
        let boundary = conninfo[..at]
            .chars()
            .next_back()
            .is_none_or(|c| c == '?' || c == '&' || c.is_whitespace());
        let start = at + KEY.len();
        if !boundary {
            from = start;
            continue;
        }
        let rest = &conninfo[start..];
        let len = rest
            .find(|c: char| c == '&' || c.is_whitespace())
            .unwrap_or(rest.len());
        let raw = &rest[..len];
        let mode: SslMode = raw.trim_matches('\'').parse()?;
        let plain = match mode {
            SslMode::VerifyCa | SslMode::VerifyFull => "require",
            _ => raw,
        };
        let rewritten = format!("{}{plain}{}", &conninfo[..start], &rest[len..]);
        return Ok((rewritten, Some(mode)));
    }
    Ok((conninfo.to_owned(), None))
}

/// How to connect: the `sslmode`, a CA, a client certificate.
#[derive(Clone, Default)]
pub struct Tls {
    mode: SslMode,
    root_cert: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    /// Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("mode", &self.mode)
            .field("root_cert", &self.root_cert.is_some())
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    /// `mode`, the system's roots, no client certificate.
    pub fn new(mode: SslMode) -> Tls {
        Tls {
            mode,
            ..Tls::default()
        }
    }

    /// The `sslmode`.
    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// The same settings with another `sslmode`.
    #[must_use]
    pub fn with_mode(mut self, mode: SslMode) -> Tls {
        self.mode = mode;
        self
    }

    /// Trusts this PEM CA certificate (libpq's `sslrootcert`) instead of the
    /// system's roots.
    #[must_use]
    pub fn root_cert(mut self, pem: impl Into<Vec<u8>>) -> Tls {
        self.root_cert = Some(pem.into());
        self
    }

    /// Presents this PEM client certificate and key (libpq's `sslcert` and
    /// `sslkey`): for a `hostssl … cert` line in `pg_hba.conf`, whose user is the
    /// certificate's common name.
    #[must_use]
    pub fn client_cert(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Tls {
        self.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The connector, once each file is checked.
    ///
    /// # Errors
    ///
    /// A file that is not PEM, or a client key that is not its certificate's.
    pub fn connector(&self) -> Result<Connector, TlsFileError> {
        if self.mode == SslMode::Disable {
            return Ok(Connector {
                mode: self.mode,
                rustls: None,
            });
        }
        if CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }
        let provider = CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let roots = match &self.root_cert {
            Some(pem) => Some(leasehold_driver::tls::root_certs(pem)?),
            None => None,
        };
        let identity = match &self.client {
            Some((cert, key)) => Some(leasehold_driver::tls::client_identity(cert, key)?),
            None => None,
        };
        let check = match (self.mode, &roots) {
            (SslMode::VerifyFull, _) => Check::Full,
            (SslMode::VerifyCa, _) | (_, Some(_)) => Check::Chain,
            _ => Check::Nothing,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match check {
            Check::Nothing => Arc::new(Unchecked(Arc::clone(&provider))),
            Check::Chain | Check::Full => {
                let mut store = RootCertStore::empty();
                match roots {
                    Some(certs) => {
                        let (_, unusable) = store.add_parsable_certificates(certs);
                        if unusable > 0 || store.is_empty() {
                            return Err(TlsFileError::Unusable(
                                "the CA certificate is not a usable trust anchor".into(),
                            ));
                        }
                    }
                    None => {
                        store.add_parsable_certificates(
                            rustls_native_certs::load_native_certs().certs,
                        );
                    }
                }
                let webpki = WebPkiServerVerifier::builder_with_provider(
                    Arc::new(store),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| TlsFileError::Unusable(e.to_string()))?;
                match check {
                    Check::Full => webpki as Arc<dyn ServerCertVerifier>,
                    _ => Arc::new(AnyName(webpki)),
                }
            }
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsFileError::Unusable(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsFileError::Unusable(e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        Ok(Connector {
            mode: self.mode,
            rustls: Some(MakeRustlsConnect::new(config)),
        })
    }
}

/// What the connector checks of the server's certificate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    Full,
}

/// Makes connections as its [`Tls`] says. Cheap to clone.
#[derive(Clone)]
pub struct Connector {
    mode: SslMode,
    rustls: Option<MakeRustlsConnect>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("mode", &self.mode)
            .finish()
    }
}

impl Connector {
    /// Connects with `config` (its `sslmode` set from this connector's: `disable`,
    /// `prefer`, or `require` for the three that demand TLS), and spawns the
    /// connection's task on the current tokio runtime. Bound it with the config's
    /// `connect_timeout` or a timeout of your own.
    ///
    /// # Errors
    ///
    /// As `tokio-postgres`'s `connect`; a failed handshake names its cause
    /// ([`TlsProblem::from_error_text`] on the error's text).
    pub async fn connect(&self, config: &Config) -> Result<Client, tokio_postgres::Error> {
        let mut config = config.clone();
        config.ssl_mode(match self.mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let client = match &self.rustls {
            Some(tls) => {
                let (client, connection) = config.connect(tls.clone()).await?;
                tokio::spawn(connection);
                client
            }
            None => {
                let (client, connection) = config.connect(NoTls).await?;
                tokio::spawn(connection);
                client
            }
        };
        Ok(client)
    }
}

/// `require` and `prefer` without a CA, as libpq: encrypted, the certificate not
/// checked (the handshake's signatures still are).
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain checked, the name not (webpki checks the chain first, so
/// a name mismatch is all that is forgiven).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_read_out_of_both_forms() {
        let (s, m) = split_sslmode("postgres://u@h/db?sslmode=verify-full&x=1").unwrap();
        assert_eq!(
            (s.as_str(), m),
            (
                "postgres://u@h/db?sslmode=require&x=1",
                Some(SslMode::VerifyFull)
            )
        );
        let (s, m) = split_sslmode("host=h sslmode=verify-ca user=u").unwrap();
        assert_eq!(
            (s.as_str(), m),
            ("host=h sslmode=require user=u", Some(SslMode::VerifyCa))
        );
        let (s, m) = split_sslmode("host=h sslmode=disable").unwrap();
        assert_eq!(
            (s.as_str(), m),
            ("host=h sslmode=disable", Some(SslMode::Disable))
        );
        assert_eq!(split_sslmode("host=h").unwrap().1, None);
        assert!(split_sslmode("host=h sslmode=maybe")
            .unwrap_err()
            .contains("maybe"));
        assert_eq!(
            split_sslmode("host=h xsslmode=verify-full").unwrap().1,
            None,
            "only a whole key"
        );
        let (config, mode) = parse_config("postgresql://u:pw@h:5/db?sslmode=verify-full").unwrap();
        assert_eq!(mode, Some(SslMode::VerifyFull));
        assert_eq!(
            config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
    }
}
