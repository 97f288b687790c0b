//! Settings and connecting: URL checks that say what is wrong, the connection
//! manager, and loading the scripts.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::{Op, RedisLockError};
use crate::keys::EpochScope;
use crate::service::RedisLockService;

/// Settings for [`RedisLockService::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct Builder {
    url: String,
    request_timeout: std::time::Duration,
    max_ttl: std::time::Duration,
    min_replicas: u32,
    max_in_flight: usize,
    connect_timeout: std::time::Duration,
    reconnect_min_delay: std::time::Duration,
    reconnect_max_delay: std::time::Duration,
    reconnect_retries: usize,
    #[cfg(feature = "tls")]
    tls: crate::tls::TlsFiles,
}

impl RedisLockService {
    /// Settings for a service at `url`:
    /// `redis://[[user]:password@]host[:port][/db]`, or `rediss://…` for TLS (needs
    /// the `tls` feature). A password is sent with `AUTH` on every (re)connection:
    /// `AUTH user password` for an ACL user (`rediss://app:secret@…`), `AUTH password`
    /// for the legacy `requirepass` (`rediss://:secret@…`). Over TLS the server's
    /// certificate must name the URL's host (a DNS name or an IP address in its
    /// subjectAltName).
    pub fn builder(url: impl Into<String>) -> Builder {
        Builder {
            url: url.into(),
            request_timeout: std::time::Duration::from_secs(1),
            max_ttl: crate::DEFAULT_MAX_TTL,
            min_replicas: 0,
            max_in_flight: crate::MAX_IN_FLIGHT,
            connect_timeout: std::time::Duration::from_millis(500),
            reconnect_min_delay: std::time::Duration::from_millis(10),
            reconnect_max_delay: std::time::Duration::from_millis(100),
            reconnect_retries: 6,
            #[cfg(feature = "tls")]
            tls: crate::tls::TlsFiles::default(),
        }
    }

    /// Connects to `url` with the default settings (see [`builder`](Self::builder)).
    ///
    /// Fails while Redis is down; for a client that may start during an outage, use
    /// [`connect_lazily`](Self::connect_lazily).
    pub async fn connect(url: &str) -> Result<RedisLockService, RedisLockError> {
        RedisLockService::builder(url).connect().await
    }

    /// A service for `url` with the default settings that connects on its first
    /// request (see [`Builder::connect_lazily`]).
    pub async fn connect_lazily(url: &str) -> Result<RedisLockService, RedisLockError> {
        RedisLockService::builder(url).connect_lazily().await
    }
}

impl Builder {
    /// Trusts this PEM root certificate for `rediss://` instead of the system's
    /// roots (a private CA). Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate (PEM, with any intermediates after it) and
    /// its PEM private key on `rediss://` connections: mutual TLS, for a server with
    /// `tls-auth-clients yes` (Redis's default once TLS is on). Both are checked when
    /// connecting: a file that is not PEM, or a key that is not the certificate's,
    /// fails with [`RedisLockError::Config`] before anything is sent. Needs the `tls`
    /// feature.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Bound on each typed call, including the wait for a reconnection (default 1 s);
    /// `Duration::MAX` for no bound (the same type and meaning as etcd's and
    /// PostgreSQL's `request_timeout`). The lease's driver bounds requests with its
    /// own `request_timeout` anyway.
    pub fn request_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The longest TTL an acquire may ask for, and the quarantine after Redis lost its
    /// data (default [`DEFAULT_MAX_TTL`](crate::DEFAULT_MAX_TTL), 30 s); see
    /// [`RedisLockService::with_max_ttl`].
    pub fn max_ttl(mut self, max_ttl: std::time::Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// Replicas that must confirm a grant or a renewal before it counts (default 0);
    /// see [`RedisLockService::with_min_replicas`]. [`connect`](Self::connect) checks
    /// that the primary has that many replicas connected.
    pub fn min_replicas(mut self, replicas: u32) -> Self {
        self.min_replicas = replicas;
        self
    }

    /// At most `calls` script calls on the wire at once (default
    /// [`MAX_IN_FLIGHT`](crate::MAX_IN_FLIGHT)); see
    /// [`RedisLockService::with_max_in_flight`].
    pub fn max_in_flight(mut self, calls: usize) -> Self {
        self.max_in_flight = calls;
        self
    }

    /// Bound on each TCP (and TLS) connection attempt (default 500 ms).
    pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Reconnection backoff after a broken connection: from `min` doubling up to
    /// `max`, `retries` attempts per broken connection (defaults 10 ms, 100 ms, 6:
    /// about 350 ms of backoff, which rides out a restart and still fails a request
    /// well within the default 1 s request timeout when Redis stays down).
    /// Requests made while it reconnects wait for it (bounded by their timeout); when
    /// every attempt failed they fail with a `Transport` error.
    pub fn reconnect_backoff(
        mut self,
        min: std::time::Duration,
        max: std::time::Duration,
        retries: usize,
    ) -> Self {
        self.reconnect_min_delay = min;
        self.reconnect_max_delay = max;
        self.reconnect_retries = retries;
        self
    }

    /// Connects, then loads the scripts.
    ///
    /// Fails with [`RedisLockError::Config`] for a URL that cannot be used (saying
    /// what is wrong with it), with [`RedisLockError::Refused`] when Redis refuses the
    /// credentials (`authentication failed: check the password`), with a transport
    /// error naming `host:port` when Redis cannot be reached, and with
    /// [`RedisLockError::Timeout`] when it connects but loading the scripts takes
    /// longer than the request timeout (the
    /// connect timeout if there is none).
    pub async fn connect(self) -> Result<RedisLockService, RedisLockError> {
        let (client, config, endpoint) = self.client()?;
        self.check_max_ttl()?;
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| RedisLockError::from_redis(Op::Connect, &endpoint, e))?;
        // Loading the scripts is bounded too: a server that accepted the connection
        // and then stopped answering (SIGSTOP, a hung host) must not hang `connect`.
        // Without a request timeout, the connect timeout bounds it.
        let bound = crate::service::bound(self.request_timeout).unwrap_or(self.connect_timeout);
        let loaded =
            tokio::time::timeout(bound, RedisLockService::from_connection_at(conn, &endpoint))
                .await
                .map_err(|_| RedisLockError::Timeout {
                    op: Op::Connect,
                    endpoint: endpoint.clone(),
                    after: bound,
                })?;
        let service = loaded?
            .with_notifications(client)
            .with_request_timeout(self.request_timeout)
            .with_max_ttl(self.max_ttl)
            .with_min_replicas(self.min_replicas)
            .with_max_in_flight(self.max_in_flight);
        if self.min_replicas > 0 {
            let connected = service.connected_replicas().await?;
            if connected < self.min_replicas {
                return Err(RedisLockError::TooFewReplicas {
                    op: Op::Connect,
                    endpoint,
                    wanted: self.min_replicas,
                    confirmed: connected,
                });
            }
        }
        Ok(service)
    }

    /// The service, without connecting: the first request connects (and every
    /// request after a failed attempt tries again), so a client started while Redis
    /// is down keeps working once it is up. Under `leasehold-tokio`, connecting is
    /// then part of the bounded acquire: attempts made while Redis is down are
    /// answered `Indeterminate(Transport)` and retried until the grant or the
    /// acquire's wait bound, like any other outage.
    ///
    /// Fails only with [`RedisLockError::Config`], for a URL that cannot be used; a
    /// wrong password is refused on the first request, for good
    /// (`Refused(Unauthorized)`). The scripts are loaded on first use (Redis answers
    /// `NOSCRIPT` once per script, which [`script_reloads`](RedisLockService::script_reloads)
    /// counts). Async only because the connection manager needs the tokio runtime
    /// it runs in; it sends nothing.
    pub async fn connect_lazily(self) -> Result<RedisLockService, RedisLockError> {
        let (client, config, endpoint) = self.client()?;
        self.check_max_ttl()?;
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config)
            .map_err(|e| RedisLockError::from_redis(Op::Connect, &endpoint, e))?;
        Ok(
            RedisLockService::unloaded(manager, &endpoint, EpochScope::DataSet)
                .with_notifications(client)
                .with_request_timeout(self.request_timeout)
                .with_max_ttl(self.max_ttl)
                .with_min_replicas(self.min_replicas)
                .with_max_in_flight(self.max_in_flight),
        )
    }

    /// A `max_ttl` the quarantine can time: at most 2^43 ms.
    fn check_max_ttl(&self) -> Result<(), RedisLockError> {
        if self.max_ttl > crate::service::MAX_QUARANTINE {
            return Err(RedisLockError::Config {
                url: check_url(&self.url)?,
                reason: format!(
                    "max_ttl {:?} is above 2^43 ms (278 years), the longest quarantine the \
                     scripts can time exactly",
                    self.max_ttl
                ),
            });
        }
        Ok(())
    }

    /// The client for the URL (checked, with TLS roots when set), the connection
    /// manager's settings and the endpoint (`host:port`, for messages).
    fn client(&self) -> Result<(redis::Client, ConnectionManagerConfig, String), RedisLockError> {
        let redacted = check_url(&self.url)?;
        let config_error = |e: redis::RedisError| RedisLockError::Config {
            url: redacted.clone(),
            reason: e.detail().map_or_else(|| e.to_string(), str::to_owned),
        };
        #[cfg(feature = "tls")]
        let client = match self
            .tls
            .certificates()
            .map_err(|e| RedisLockError::Config {
                url: redacted.clone(),
                reason: e.to_string(),
            })? {
            Some(certificates) => redis::Client::build_with_tls(self.url.as_str(), certificates),
            None => redis::Client::open(self.url.as_str()),
        }
        .map_err(config_error)?;
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(self.url.as_str()).map_err(config_error)?;
        let endpoint = client.get_connection_info().addr().to_string();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_min_delay(self.reconnect_min_delay)
            .set_max_delay(self.reconnect_max_delay)
            .set_number_of_retries(self.reconnect_retries);
        Ok((client, config, endpoint))
    }
}

/// Checks what the client would only report as "invalid client config", and returns
/// the URL with its password replaced by `***` (for messages).
pub(crate) fn check_url(raw: &str) -> Result<String, RedisLockError> {
    let bad = |url: String, reason: String| RedisLockError::Config { url, reason };
    const FORM: &str = "expected redis://[[user]:password@]host[:port][/db] or rediss://… for TLS";
    let mut url = match url::Url::parse(raw) {
        Ok(url) => url,
        Err(e) => return Err(bad(redact_unparsed(raw), format!("{e}; {FORM}"))),
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    let redacted = url.to_string();
    match url.scheme() {
        "redis" => {}
        "rediss" if cfg!(feature = "tls") => {}
        "rediss" => {
            return Err(bad(
                redacted,
                "TLS URLs need the crate feature `tls` of leasehold-redis".into(),
            ))
        }
        "unix" | "redis+unix" => {}
        other => return Err(bad(redacted, format!("the scheme is `{other}`; {FORM}"))),
    }
    if !url.scheme().contains("unix") && url.host_str().is_none_or(str::is_empty) {
        return Err(bad(redacted, format!("no host; {FORM}")));
    }
    let db = url.path().trim_start_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() && !url.scheme().contains("unix") {
        return Err(bad(
            redacted,
            format!("the database `/{db}` is not a number; {FORM}"),
        ));
    }
    Ok(redacted)
}

/// A URL that does not parse, with whatever stands between `:` and `@` hidden.
fn redact_unparsed(raw: &str) -> String {
    match (raw.find("://"), raw.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &raw[scheme_end + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &raw[..scheme_end + 3],
                    &userinfo[..colon],
                    &raw[at..]
                ),
                None => raw.to_owned(),
            }
        }
        _ => raw.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(url: &str) -> String {
        match check_url(url) {
            Err(e @ RedisLockError::Config { .. }) => e.to_string(),
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn good_urls_pass_with_the_password_hidden() {
        assert_eq!(
            check_url("redis://:s3cret@127.0.0.1:6379/0").unwrap(),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert!(check_url("redis://localhost").is_ok());
        assert!(check_url("redis://user:pw@[::1]:7000/3").is_ok());
    }

    #[test]
    fn bad_urls_say_what_is_wrong_with_them() {
        let shown = reason("http://127.0.0.1:1");
        assert!(shown.contains("the scheme is `http`"), "{shown}");
        assert!(shown.contains("redis://"), "{shown}");
        let shown = reason("redis://127.0.0.1:notaport");
        assert!(shown.contains("invalid port number"), "{shown}");
        let shown = reason("127.0.0.1:6379");
        assert!(shown.contains("expected redis://"), "{shown}");
        let shown = reason("redis://127.0.0.1:6379/zero");
        assert!(
            shown.contains("database `/zero` is not a number"),
            "{shown}"
        );
        let shown = reason("redis://:hunter2@127.0.0.1:notaport");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.starts_with("unusable Redis URL `redis://:***@127.0.0.1:notaport`"),
            "{shown}"
        );
        #[cfg(not(feature = "tls"))]
        {
            let shown = reason("rediss://127.0.0.1:1");
            assert!(shown.contains("feature `tls`"), "{shown}");
        }
    }
}
