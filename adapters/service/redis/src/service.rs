//! The service: connection, scripts by SHA, typed calls, and the `LockService` impl.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use leasehold::{AcquireOutcome, Duration, Fence, OwnerToken, ReleaseOutcome, RenewOutcome};
use leasehold_driver::LockService;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, ServerErrorKind, Value};

use crate::error::{Op, ProtocolError, RedisLockError};
use crate::keys::Keys;
use crate::scripts::{self, AcquireReply};

/// A Redis lock service: one connection shared by every lease that uses it.
///
/// Cloning is cheap (the connection and the script table are shared). `C` is any
/// async redis connection: the default [`ConnectionManager`] reconnects on its own
/// after a broken connection; a [`redis::aio::MultiplexedConnection`] works too, or
/// any other [`ConnectionLike`] (a cluster connection: untested here), through
/// [`RedisLockService::from_connection`].
///
/// Requests are `EVALSHA` of scripts loaded once when the service is built; if
/// Redis has forgotten a script (`SCRIPT FLUSH`, a restart, a failover to a replica
/// that never saw it), the request reloads it and is retried once, transparently.
#[derive(Clone)]
pub struct RedisLockService<C = ConnectionManager> {
    conn: C,
    request_timeout: Option<std::time::Duration>,
    shared: Arc<Shared>,
}

/// What every clone shares.
struct Shared {
    acquire: Script,
    renew: Script,
    release: Script,
    raise_fence: Script,
    reloads: AtomicU64,
}

struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    fn new(source: &'static str) -> Script {
        Script {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

impl<C> std::fmt::Debug for RedisLockService<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLockService")
            .field("request_timeout", &self.request_timeout)
            .field(
                "script_reloads",
                &self.shared.reloads.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// The answer to [`RedisLockService::try_acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The key is ours.
    Granted {
        /// Strictly greater than every fence granted before for this key (as long as
        /// the counter survives: see the crate docs on durability).
        fence: Fence,
        /// The TTL Redis applied (its `PTTL` right after the grant).
        ttl: Duration,
        /// The key already held this very token (an earlier attempt succeeded but
        /// its answer was lost): granted again with the same fence and a fresh TTL.
        regranted: bool,
    },
    /// Somebody else holds it.
    HeldByAnother {
        /// How long the holder's grant still runs, if it has an expiry.
        remaining: Option<Duration>,
    },
}

/// The answer to [`RedisLockService::try_renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewed {
    /// Extended: the TTL Redis applied.
    Renewed {
        /// Redis's `PTTL` right after the `PEXPIRE`.
        ttl: Duration,
    },
    /// The token does not hold the key (expired, deleted, taken): definitive.
    NotOwner,
}

/// The answer to [`RedisLockService::try_release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Deleted.
    Released,
    /// The token did not hold the key: nothing deleted.
    NotOwner,
}

impl From<Acquired> for AcquireOutcome {
    fn from(a: Acquired) -> Self {
        match a {
            Acquired::Granted { fence, ttl, .. } => AcquireOutcome::Granted { fence, ttl },
            Acquired::HeldByAnother { .. } => AcquireOutcome::HeldByAnother,
        }
    }
}

impl From<Renewed> for RenewOutcome {
    fn from(r: Renewed) -> Self {
        match r {
            Renewed::Renewed { ttl } => RenewOutcome::Renewed { ttl },
            Renewed::NotOwner => RenewOutcome::NotOwner,
        }
    }
}

impl From<Released> for ReleaseOutcome {
    fn from(r: Released) -> Self {
        match r {
            Released::Released => ReleaseOutcome::Released,
            Released::NotOwner => ReleaseOutcome::NotOwner,
        }
    }
}

/// Settings for [`RedisLockService::builder`].
#[derive(Clone, Debug)]
#[must_use]
pub struct Builder {
    url: String,
    request_timeout: Option<std::time::Duration>,
    connect_timeout: std::time::Duration,
    reconnect_min_delay: std::time::Duration,
    reconnect_max_delay: std::time::Duration,
    reconnect_retries: usize,
    #[cfg(feature = "tls")]
    tls_root_cert: Option<Vec<u8>>,
}

impl Builder {
    /// Trusts this PEM root certificate for `rediss://` instead of the system's
    /// roots (a private CA). Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// Bound on each typed call (default 1 s); `None` for no bound. The lease's
    /// driver bounds requests with its own `request_timeout` anyway.
    pub fn request_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Bound on each TCP (and TLS) connection attempt (default 500 ms).
    pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Reconnection backoff after a broken connection: from `min` doubling up to
    /// `max`, `retries` attempts per broken connection (defaults 10 ms, 200 ms, 8).
    /// Requests made while it reconnects wait for it (bounded by their timeout).
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
    /// Fails with [`RedisLockError::Config`] for a URL the client cannot use (a
    /// `rediss://` URL without the `tls` feature, for instance) and with a transport
    /// or service error when Redis cannot be reached or refuses the password.
    pub async fn connect(self) -> Result<RedisLockService, RedisLockError> {
        #[cfg(feature = "tls")]
        {
            // rustls needs a process-wide crypto provider; install ring's unless the
            // application already chose one.
            if rustls::crypto::CryptoProvider::get_default().is_none() {
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
        }
        #[cfg(feature = "tls")]
        let client = match &self.tls_root_cert {
            Some(pem) => redis::Client::build_with_tls(
                self.url.as_str(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            None => redis::Client::open(self.url.as_str()),
        }
        .map_err(RedisLockError::Config)?;
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(self.url.as_str()).map_err(RedisLockError::Config)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            .set_min_delay(self.reconnect_min_delay)
            .set_max_delay(self.reconnect_max_delay)
            .set_number_of_retries(self.reconnect_retries);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| RedisLockError::from_redis(Op::Connect, e))?;
        RedisLockService::from_connection(conn)
            .await
            .map(|s| s.with_request_timeout(self.request_timeout))
    }
}

impl RedisLockService {
    /// Settings for a service at `url`:
    /// `redis://[[user]:password@]host[:port][/db]`, or `rediss://…` for TLS (needs
    /// the `tls` feature). A password is sent with `AUTH` on every (re)connection.
    pub fn builder(url: impl Into<String>) -> Builder {
        Builder {
            url: url.into(),
            request_timeout: Some(std::time::Duration::from_secs(1)),
            connect_timeout: std::time::Duration::from_millis(500),
            reconnect_min_delay: std::time::Duration::from_millis(10),
            reconnect_max_delay: std::time::Duration::from_millis(200),
            reconnect_retries: 8,
            #[cfg(feature = "tls")]
            tls_root_cert: None,
        }
    }

    /// Connects to `url` with the default settings (see [`builder`](Self::builder)).
    pub async fn connect(url: &str) -> Result<RedisLockService, RedisLockError> {
        RedisLockService::builder(url).connect().await
    }
}

impl<C> RedisLockService<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Wraps an existing connection (shared with the rest of the application if you
    /// like) and loads the scripts into Redis. No request timeout is set: see
    /// [`with_request_timeout`](Self::with_request_timeout).
    pub async fn from_connection(conn: C) -> Result<RedisLockService<C>, RedisLockError> {
        let service = RedisLockService {
            conn,
            request_timeout: None,
            shared: Arc::new(Shared {
                acquire: Script::new(scripts::ACQUIRE),
                renew: Script::new(scripts::RENEW),
                release: Script::new(scripts::RELEASE),
                raise_fence: Script::new(scripts::RAISE_FENCE),
                reloads: AtomicU64::new(0),
            }),
        };
        let shared = &service.shared;
        for script in [
            &shared.acquire,
            &shared.renew,
            &shared.release,
            &shared.raise_fence,
        ] {
            service.load(Op::Connect, script).await?;
        }
        Ok(service)
    }

    /// Bounds every typed call by `timeout` (`None`: unbounded).
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The connection, for the application's own commands.
    pub fn connection(&self) -> &C {
        &self.conn
    }

    /// How often a script had to be reloaded after Redis answered `NOSCRIPT`.
    pub fn script_reloads(&self) -> u64 {
        self.shared.reloads.load(Ordering::Relaxed)
    }

    /// Acquires lock `name` for `token`, for `ttl` (whole milliseconds; rounded down),
    /// in one script: `SET {name} token NX PX ttl` plus `INCR {name}:fence`.
    pub async fn try_acquire(
        &self,
        name: &str,
        token: OwnerToken,
        ttl: Duration,
    ) -> Result<Acquired, RedisLockError> {
        let op = Op::Acquire;
        let keys = keys_of(op, name)?;
        let ms = ttl_ms(op, ttl)?;
        let encoded = token.encode();
        let value = self
            .eval(
                op,
                &self.shared.acquire,
                &[&keys.lock, &keys.fence],
                &[encoded.as_str(), &ms],
            )
            .await?;
        Ok(match scripts::parse_acquire(&value)? {
            AcquireReply::Granted {
                fence,
                ttl,
                regranted,
            } => Acquired::Granted {
                fence,
                ttl,
                regranted,
            },
            AcquireReply::HeldByAnother { remaining } => Acquired::HeldByAnother { remaining },
        })
    }

    /// Extends lock `name` by `ttl` if `token` still holds it with `fence`
    /// (compare-and-`PEXPIRE`; the fence counter must still read `fence`).
    pub async fn try_renew(
        &self,
        name: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> Result<Renewed, RedisLockError> {
        let op = Op::Renew;
        let keys = keys_of(op, name)?;
        let ms = ttl_ms(op, ttl)?;
        let encoded = token.encode();
        let value = self
            .eval(
                op,
                &self.shared.renew,
                &[&keys.lock, &keys.fence],
                &[encoded.as_str(), &ms, &fence.0.to_string()],
            )
            .await?;
        Ok(match scripts::parse_renew(&value)? {
            Some(ttl) => Renewed::Renewed { ttl },
            None => Renewed::NotOwner,
        })
    }

    /// Deletes lock `name` if `token` still holds it (compare-and-`DEL`).
    pub async fn try_release(
        &self,
        name: &str,
        token: OwnerToken,
    ) -> Result<Released, RedisLockError> {
        let op = Op::Release;
        let keys = keys_of(op, name)?;
        let encoded = token.encode();
        let value = self
            .eval(op, &self.shared.release, &[&keys.lock], &[encoded.as_str()])
            .await?;
        Ok(if scripts::parse_release(&value)? {
            Released::Released
        } else {
            Released::NotOwner
        })
    }

    /// Raises the fence counter of lock `name` to at least `at_least` and returns it.
    ///
    /// For recovery after Redis lost its data (a restart without persistence, a
    /// failover that lost writes): seed the counter from the newest fence your
    /// storage has admitted, so the next grant's fence is newer than it. Never
    /// lowers the counter.
    pub async fn raise_fence(&self, name: &str, at_least: Fence) -> Result<Fence, RedisLockError> {
        let op = Op::RaiseFence;
        let keys = keys_of(op, name)?;
        let want = at_least.0.to_string();
        let value = self
            .eval(op, &self.shared.raise_fence, &[&keys.fence], &[&want])
            .await?;
        Ok(scripts::parse_raise_fence(&value)?)
    }

    /// `SCRIPT LOAD`, checking that Redis computed the same SHA.
    async fn load(&self, op: Op, script: &Script) -> Result<(), RedisLockError> {
        let mut conn = self.conn.clone();
        let sha: Value = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.source)
            .query_async(&mut conn)
            .await
            .map_err(|e| RedisLockError::from_redis(op, e))?;
        match &sha {
            Value::BulkString(b) if b.as_slice() == script.sha.as_bytes() => Ok(()),
            other => {
                Err(ProtocolError::new(op, "SCRIPT LOAD to answer the script's SHA1", other).into())
            }
        }
    }

    /// `EVALSHA`, reloading the script once on `NOSCRIPT`, bounded by the timeout.
    async fn eval(
        &self,
        op: Op,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Value, RedisLockError> {
        let call = async {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&script.sha).arg(keys.len()).arg(keys).arg(args);
            let mut conn = self.conn.clone();
            match cmd.query_async::<Value>(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.shared.reloads.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%op, sha = %script.sha, "Redis forgot the script (NOSCRIPT): reloading it");
                    self.load(op, script).await?;
                    cmd.query_async::<Value>(&mut conn)
                        .await
                        .map_err(|e| RedisLockError::from_redis(op, e))
                }
                other => other.map_err(|e| RedisLockError::from_redis(op, e)),
            }
        };
        match self.request_timeout {
            Some(after) => tokio::time::timeout(after, call)
                .await
                .unwrap_or(Err(RedisLockError::Timeout { op, after })),
            None => call.await,
        }
    }
}

/// The keys of lock `name`, or why `name` cannot be one (refused before sending).
fn keys_of(op: Op, name: &str) -> Result<Keys, RedisLockError> {
    Keys::new(name).map_err(|reason| RedisLockError::InvalidRequest { op, reason })
}

/// A TTL in whole milliseconds (what `PX`/`PEXPIRE` take), at least 1.
fn ttl_ms(op: Op, ttl: Duration) -> Result<String, RedisLockError> {
    match ttl.as_millis() {
        0 => Err(RedisLockError::InvalidRequest {
            op,
            reason: "the TTL must be at least 1 ms",
        }),
        ms => Ok(ms.to_string()),
    }
}

/// Logs an error the lease will only see as "indeterminate".
fn log_indeterminate(key: &str, err: &RedisLockError) {
    match err {
        RedisLockError::Protocol(_) | RedisLockError::InvalidRequest { .. } => {
            tracing::error!(key, op = %err.op(), error = %err, "Redis lock request failed");
        }
        _ => tracing::warn!(key, op = %err.op(), error = %err, "Redis lock request failed"),
    }
}

/// The driver's view: every error is an indeterminate outcome, logged with `tracing`.
impl<C> LockService for RedisLockService<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> AcquireOutcome {
        match self.try_acquire(key, token, ttl).await {
            Ok(acquired) => {
                tracing::debug!(key, %token, ?acquired, "acquire");
                acquired.into()
            }
            Err(e) => {
                log_indeterminate(key, &e);
                AcquireOutcome::Indeterminate(e.indeterminate())
            }
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        match self.try_renew(key, token, fence, ttl).await {
            Ok(Renewed::NotOwner) => {
                tracing::info!(key, %token, "renew: not the owner any more");
                RenewOutcome::NotOwner
            }
            Ok(renewed) => renewed.into(),
            Err(e) => {
                log_indeterminate(key, &e);
                RenewOutcome::Indeterminate(e.indeterminate())
            }
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        match self.try_release(key, token).await {
            Ok(released) => {
                tracing::debug!(key, %token, ?released, "release");
                released.into()
            }
            Err(e) => {
                log_indeterminate(key, &e);
                ReleaseOutcome::Indeterminate(e.indeterminate())
            }
        }
    }
}
