//! [`PostgresLockService`]: its settings, the typed requests, and the bounded calls
//! they are made of.

use std::future::Future;
use std::sync::Arc;

use leasehold::{Duration, Fence, Holder, Identity, OwnerToken};
use leasehold_storage::TableName;
use tokio_postgres::config::Host;
#[cfg(not(feature = "tls"))]
use tokio_postgres::config::SslMode;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};

use crate::error::{ErrorKind, Op, PostgresLockError};
use crate::pool::{Conn, Hot, NoConnection, Pool};
use crate::sql::{Statements, MAX_TABLE_NAME};

/// The default lease table (its epoch table is `leasehold_leases_epoch`).
pub const DEFAULT_TABLE: &str = "leasehold_leases";

/// The longest TTL an acquire may ask for by default, and so the quarantine after
/// PostgreSQL lost grants ([`Builder::max_ttl`]); the same as the Redis and etcd
/// services'.
pub const DEFAULT_MAX_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The longest `max_ttl`: 2^53 µs (about 285 years), below which an interval of
/// microseconds is exact.
pub const MAX_TTL_LIMIT: std::time::Duration = std::time::Duration::from_micros(1 << 53);

const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
const DEFAULT_CONNECTIONS: usize = 4;

/// The default bound on requests on the wire at once ([`Builder::max_in_flight`]).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// A lock service on PostgreSQL: one row per key in a lease table, every request one
/// statement timed on the server's clock. See the [crate docs](crate).
///
/// `Clone` is cheap: clones share the connections.
#[derive(Clone)]
pub struct PostgresLockService {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pool: Pool,
    pub(crate) sql: Statements,
    pub(crate) server: Arc<str>,
    pub(crate) request_timeout: std::time::Duration,
    pub(crate) max_ttl: Duration,
    /// Acquires and renewals as statements prepared on each connection.
    pub(crate) prepared: bool,
}

impl std::fmt::Debug for PostgresLockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLockService")
            .field("server", &self.shared.server)
            .field("table", &self.shared.sql.table)
            .field("request_timeout", &self.shared.request_timeout)
            .field("max_ttl", &self.shared.max_ttl)
            .finish_non_exhaustive()
    }
}

/// The answer to [`PostgresLockService::try_acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquired {
    /// The key is ours.
    Granted {
        /// Greater than every fence granted before for this key: the larger of the
        /// row's fence + 1 and the server's clock in µs since the Unix epoch.
        fence: Fence,
        /// The TTL applied: the one asked, to the microsecond.
        ttl: Duration,
        /// `true` if the key already held this token (an earlier attempt whose answer
        /// was lost): same fence, the expiry replaced as a renewal would.
        regranted: bool,
    },
    /// Another token holds the key.
    HeldByAnother(Holder),
    /// Nobody holds it, but PostgreSQL may have lost grants that are still alive (it
    /// crashed, was restarted, restored, or a standby was promoted): nothing is
    /// granted for `remaining` (see [`Builder::max_ttl`]).
    Quarantined {
        /// Until the quarantine ends, on the server's clock.
        remaining: Duration,
    },
}

/// The answer to [`PostgresLockService::try_renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewed {
    /// The expiry is now the handling time + `ttl`.
    Renewed {
        /// The TTL applied: the one asked.
        ttl: Duration,
    },
    /// The row does not hold this token with this fence, unexpired.
    NotOwner,
}

/// The answer to [`PostgresLockService::try_release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The key held this token and is free now (its row and fence stay).
    Released,
    /// The key did not hold this token (unexpired): nothing changed.
    NotOwner,
}

/// Settings for [`PostgresLockService`]; start with [`PostgresLockService::builder`].
#[derive(Clone, Debug)]
pub struct Builder {
    url: String,
    table: String,
    request_timeout: std::time::Duration,
    connections: usize,
    max_in_flight: usize,
    max_ttl: std::time::Duration,
    create_tables: bool,
    prepared_statements: bool,
    #[cfg(feature = "tls")]
    tls: leasehold_storage::postgres::tls::Tls,
}

impl Builder {
    /// Trusts this PEM CA certificate (libpq's `sslrootcert`) instead of the
    /// system's roots: with it, `sslmode` `prefer` and `require` check the server's
    /// certificate chain too, as libpq does. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls = self.tls.root_cert(pem);
        self
    }

    /// Presents this PEM client certificate and key (libpq's `sslcert` and `sslkey`):
    /// mutual TLS, for a `hostssl … cert` line in `pg_hba.conf` (whose user is the
    /// certificate's common name). Both are checked when the service is built: a
    /// file that is not PEM, or a key that is not the certificate's, fails with
    /// [`ErrorKind::Config`] before anything is sent. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls = self.tls.client_cert(cert_pem, key_pem);
        self
    }

    /// The lease table's name (default [`DEFAULT_TABLE`]): a plain identifier of at
    /// most 57 bytes, found on the role's `search_path`; the epoch table is
    /// `<table>_epoch`. Every client of one lock set uses the same name.
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Bound on each request, connecting included (default 2 s); `Duration::MAX` for
    /// no bound (the same type and meaning as Redis's and etcd's `request_timeout`).
    /// A connection that answered nothing for this long while requests wait on it is
    /// replaced.
    pub fn request_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How many connections the service opens at most (default 4). Requests share
    /// them (pipelined); each goes to the one with the fewest in flight.
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// At most this many requests on the wire at once, over all connections (default
    /// [`DEFAULT_MAX_IN_FLIGHT`], 32); the others wait in the client, and one given up
    /// while it waits (its future dropped) is never sent. PostgreSQL carries out every
    /// statement it receives, whether its answer is still awaited or not: the bound
    /// keeps an overload from filling the connections with work nobody waits for.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// The longest TTL an acquire or renewal may ask for (default
    /// [`DEFAULT_MAX_TTL`], 30 s); a longer one is refused before anything is sent
    /// (`Unsupported`, final).
    ///
    /// It is also the **quarantine**: after PostgreSQL may have lost grants that are
    /// still alive (see the crate docs), no free key is granted for this long, on the
    /// server's clock. Give every client of one lease table the same value, at least
    /// the longest TTL any of them asks for.
    pub fn max_ttl(mut self, max_ttl: std::time::Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// Send acquires and renewals as statements prepared once per connection
    /// (default off: every statement is sent unnamed and planned afresh). About 2.5×
    /// the renewals per second of the server's CPU (the bench), but named prepared
    /// statements are session state: **only on a direct connection** (or a pooler
    /// that carries them across server connections, such as PgBouncer 1.21 or later
    /// with `max_prepared_statements`), never through a transaction-mode pooler that
    /// does not.
    pub fn prepared_statements(mut self, prepare: bool) -> Self {
        self.prepared_statements = prepare;
        self
    }

    /// Create the tables (`CREATE … IF NOT EXISTS`) when connecting (default off:
    /// [`connect`](Self::connect) checks that they exist). The role then needs
    /// `CREATE` on the schema.
    pub fn create_tables(mut self, create: bool) -> Self {
        self.create_tables = create;
        self
    }

    fn build(self) -> Result<PostgresLockService, PostgresLockError> {
        #[cfg(feature = "tls")]
        let (config, mode) = match leasehold_storage::postgres::tls::parse_config(&self.url) {
            Ok((config, mode)) => (Ok(config), mode),
            Err(e) => (Err(e), None),
        };
        #[cfg(not(feature = "tls"))]
        let config = <tokio_postgres::Config as std::str::FromStr>::from_str(&self.url);
        let fallback: Arc<str> = Arc::from(hide_password(&self.url));
        let mut config = config.map_err(|e| {
            PostgresLockError::new(Op::Connect, ErrorKind::Config, &fallback).because(format_args!(
                "unusable connection string: {e}; expected postgres://[user[:password]@]host[:port]/dbname \
                 or key=value pairs (host=… port=… user=… dbname=…)"
            ))
        })?;
        let server: Arc<str> = Arc::from(describe(&config));
        let config_error = |detail: String| {
            PostgresLockError::new(Op::Connect, ErrorKind::Config, &server).because(detail)
        };
        #[cfg(not(feature = "tls"))]
        if config.get_ssl_mode() == SslMode::Require {
            return Err(config_error(
                "sslmode=require: this build of leasehold-postgres connects without TLS \
                 (build it with the feature `tls`, or use sslmode=disable or prefer)"
                    .into(),
            ));
        }
        #[cfg(feature = "tls")]
        let tls = {
            let tls = self.tls.clone().with_mode(mode.unwrap_or_default());
            tls.connector().map_err(|e| config_error(e.to_string()))?
        };
        let table = TableName::new(&self.table)
            .ok()
            .filter(|t| t.as_str().len() <= MAX_TABLE_NAME)
            .ok_or_else(|| {
                config_error(format!(
                    "the table name {:?} is not a plain identifier of at most \
                     {MAX_TABLE_NAME} bytes (letters, digits, underscores)",
                    self.table
                ))
            })?;
        if self.max_ttl > MAX_TTL_LIMIT || self.max_ttl.is_zero() {
            return Err(config_error(format!(
                "max_ttl {:?} must be above zero and at most {MAX_TTL_LIMIT:?}: the quarantine \
                 could not be timed",
                self.max_ttl
            )));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.request_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("leasehold");
        }
        Ok(PostgresLockService {
            shared: Arc::new(Shared {
                pool: Pool::new(
                    crate::pool::Target {
                        config,
                        #[cfg(feature = "tls")]
                        tls,
                    },
                    self.connections,
                    self.max_in_flight,
                    self.request_timeout,
                ),
                sql: Statements::new(&table),
                server,
                request_timeout: self.request_timeout,
                max_ttl: Duration::from(self.max_ttl),
                prepared: self.prepared_statements,
            }),
        })
    }

    /// Builds the service and checks, at once, that the server answers, the
    /// credentials work and the tables exist (or creates them, with
    /// [`create_tables`](Self::create_tables)).
    pub async fn connect(self) -> Result<PostgresLockService, PostgresLockError> {
        let create = self.create_tables;
        let service = self.build()?;
        if create {
            service.create_tables().await?;
        } else {
            service.probe().await?;
        }
        Ok(service)
    }

    /// Builds the service without sending anything: the first request connects (and
    /// fails, `Indeterminate`, while the server is down), and the tables are not
    /// checked (a missing one is a final refusal of the first request).
    pub fn connect_lazily(self) -> Result<PostgresLockService, PostgresLockError> {
        self.build()
    }
}

/// The URL without its password, for messages.
fn hide_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url
            .split_whitespace()
            .filter(|kv| !kv.starts_with("password"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `host:port/dbname` of a config (the first host; `+n` more).
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let more = config.get_hosts().len().saturating_sub(1);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    if more > 0 {
        format!("{host}:{port}/{db} (+{more} hosts)")
    } else {
        format!("{host}:{port}/{db}")
    }
}

/// A TTL in whole microseconds as PostgreSQL's `BIGINT`.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A duration from a count of microseconds read back (negative counts as zero).
fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl PostgresLockService {
    /// Settings for a service on `url`: `postgres://user:password@host:port/dbname`
    /// (or `postgresql://…`), or libpq's `key=value` form. `host=a,b` with
    /// `target_session_attrs=read-write` connects to whichever is the primary.
    pub fn builder(url: impl Into<String>) -> Builder {
        Builder {
            url: url.into(),
            table: DEFAULT_TABLE.to_owned(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_ttl: DEFAULT_MAX_TTL,
            create_tables: false,
            prepared_statements: false,
            #[cfg(feature = "tls")]
            tls: leasehold_storage::postgres::tls::Tls::default(),
        }
    }

    /// The server, as `host:port/dbname` (named in every error).
    pub fn server(&self) -> &str {
        &self.shared.server
    }

    /// The lease table's name.
    pub fn table(&self) -> &str {
        &self.shared.sql.table
    }

    /// The epoch table's name (`<table>_epoch`).
    pub fn epoch_table(&self) -> &str {
        &self.shared.sql.epoch
    }

    /// The longest TTL an acquire may ask for, and the quarantine.
    pub fn max_ttl(&self) -> std::time::Duration {
        self.shared.max_ttl.into()
    }

    /// The bound on each request.
    pub fn request_timeout(&self) -> std::time::Duration {
        self.shared.request_timeout
    }

    /// How many of its connections are open now.
    pub fn open_connections(&self) -> usize {
        self.shared.pool.open()
    }

    /// The migration: `CREATE TABLE IF NOT EXISTS` of the lease table and
    /// `CREATE UNLOGGED TABLE IF NOT EXISTS` of its epoch table (see the crate docs).
    pub fn create_tables_sql(&self) -> &str {
        &self.shared.sql.create
    }

    /// The statement every acquire runs (`$1` key, `$2` owner token, `$3` identity,
    /// `$4` TTL in µs, `$5` max TTL in µs), for audits and `EXPLAIN`.
    pub fn acquire_sql(&self) -> &str {
        &self.shared.sql.acquire
    }

    /// The statement every renewal runs (`$1` key, `$2` owner token, `$3` fence, `$4`
    /// TTL in µs): the raw alternative the benchmark compares with.
    pub fn renew_sql(&self) -> &str {
        &self.shared.sql.renew
    }

    /// Runs the migration ([`create_tables_sql`](Self::create_tables_sql)).
    pub async fn create_tables(&self) -> Result<(), PostgresLockError> {
        let sql = self.shared.sql.create.clone();
        self.call(Op::CreateTables, None, move |c| async move {
            c.client.batch_execute(&sql).await
        })
        .await
    }

    /// Checks that both tables exist with the lease columns (reads no row).
    async fn probe(&self) -> Result<(), PostgresLockError> {
        let sql = self.shared.sql.probe.clone();
        self.call(Op::Connect, None, move |c| async move {
            c.client.query_typed(&sql, &[]).await.map(drop)
        })
        .await
    }

    /// Says that this lease table never held a grant that may still be alive (a new
    /// deployment): acquires grant at once instead of waiting out the first
    /// quarantine. **Never after a loss of state** — it would let a second holder in.
    pub async fn mark_data_set_new(&self) -> Result<(), PostgresLockError> {
        let sql = self.shared.sql.mark_new.clone();
        self.call(Op::MarkNew, None, move |c| async move {
            c.client.execute_typed(&sql, &[]).await.map(drop)
        })
        .await
    }

    /// Acquires `key` for `token`, storing `identity`, for `ttl` (see the crate docs
    /// for the statement).
    pub async fn try_acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: impl Into<Duration>,
    ) -> Result<Acquired, PostgresLockError> {
        // std's `Duration` or the core's.
        let ttl: Duration = ttl.into();
        self.check_key(Op::Acquire, key)?;
        self.check_ttl(Op::Acquire, key, ttl)?;
        let owner = token.encode();
        let owner = owner.as_str();
        let who = identity.as_str();
        let (ttl_us, max_us) = (micros(ttl), micros(self.shared.max_ttl));
        let prepared = self.shared.prepared;
        // A key never used has no row yet: the row is created free (fence 0), once.
        for _ in 0..2 {
            let sql = &self.shared.sql.acquire;
            let row = self
                .call(Op::Acquire, Some(key), |c| async move {
                    c.query(
                        prepared.then_some(Hot::Acquire),
                        sql,
                        &[
                            (&key, Type::TEXT),
                            (&owner, Type::TEXT),
                            (&who, Type::TEXT),
                            (&ttl_us, Type::INT8),
                            (&max_us, Type::INT8),
                        ],
                    )
                    .await
                })
                .await?;
            match row.first() {
                Some(row) => return self.acquired(key, row, ttl),
                None => {
                    let sql = &self.shared.sql.ensure_row;
                    self.call(Op::Acquire, Some(key), |c| async move {
                        c.client.execute_typed(sql, &[(&key, Type::TEXT)]).await
                    })
                    .await?;
                }
            }
        }
        Err(self.protocol(
            Op::Acquire,
            key,
            "the key's row was missing again right after it was created (deleted by hand?)",
        ))
    }

    fn acquired(&self, key: &str, row: &Row, ttl: Duration) -> Result<Acquired, PostgresLockError> {
        let read = |e: tokio_postgres::Error| self.protocol(Op::Acquire, key, e);
        let held: bool = row.try_get("held").map_err(read)?;
        let mine: Option<bool> = row.try_get("mine").map_err(read)?;
        let granted: Option<i64> = row.try_get("granted").map_err(read)?;
        if let Some(fence) = granted {
            let fence = self.fence(Op::Acquire, key, fence)?;
            return Ok(Acquired::Granted {
                fence,
                ttl,
                regranted: held,
            });
        }
        if held {
            if mine == Some(true) {
                return Err(self.protocol(
                    Op::Acquire,
                    key,
                    "held by this token, yet not re-granted",
                ));
            }
            let fence: i64 = row.try_get("fence").map_err(read)?;
            let identity: String = row.try_get("identity").map_err(read)?;
            let remaining: i64 = row.try_get("remaining").map_err(read)?;
            return Ok(Acquired::HeldByAnother(Holder {
                identity: Identity::lossy(&identity),
                fence: self.fence(Op::Acquire, key, fence)?,
                remaining: from_micros(remaining),
            }));
        }
        let remaining: Option<i64> = row.try_get("quarantine").map_err(read)?;
        let remaining = from_micros(remaining.unwrap_or(0)).max(Duration::from_micros(1));
        Ok(Acquired::Quarantined { remaining })
    }

    /// Replaces the expiry of `key` with the handling time + `ttl` if `token` holds it
    /// with `fence`, unexpired.
    pub async fn try_renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: impl Into<Duration>,
    ) -> Result<Renewed, PostgresLockError> {
        // std's `Duration` or the core's.
        let ttl: Duration = ttl.into();
        self.check_key(Op::Renew, key)?;
        self.check_ttl(Op::Renew, key, ttl)?;
        let Ok(fence) = i64::try_from(fence.0) else {
            return Ok(Renewed::NotOwner);
        };
        let owner = token.encode();
        let owner = owner.as_str();
        let ttl_us = micros(ttl);
        let sql = &self.shared.sql.renew;
        let prepared = self.shared.prepared;
        let rows = self
            .call(Op::Renew, Some(key), |c| async move {
                c.query(
                    prepared.then_some(Hot::Renew),
                    sql,
                    &[
                        (&key, Type::TEXT),
                        (&owner, Type::TEXT),
                        (&fence, Type::INT8),
                        (&ttl_us, Type::INT8),
                    ],
                )
                .await
            })
            .await?;
        Ok(if rows.is_empty() {
            Renewed::NotOwner
        } else {
            Renewed::Renewed { ttl }
        })
    }

    /// Frees `key` if `token` holds it (unexpired), whatever the fence.
    pub async fn try_release(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<Released, PostgresLockError> {
        self.check_key(Op::Release, key)?;
        let owner = token.encode();
        let owner = owner.as_str();
        let sql = &self.shared.sql.release;
        let rows = self
            .call(Op::Release, Some(key), |c| async move {
                c.client
                    .query_typed(sql, &[(&key, Type::TEXT), (&owner, Type::TEXT)])
                    .await
            })
            .await?;
        Ok(if rows.is_empty() {
            Released::NotOwner
        } else {
            Released::Released
        })
    }

    /// Who holds `key` now, if anyone.
    pub async fn try_holder(&self, key: &str) -> Result<Option<Holder>, PostgresLockError> {
        self.check_key(Op::Holder, key)?;
        let sql = &self.shared.sql.holder;
        let rows = self
            .call(Op::Holder, Some(key), |c| async move {
                c.client.query_typed(sql, &[(&key, Type::TEXT)]).await
            })
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let read = |e: tokio_postgres::Error| self.protocol(Op::Holder, key, e);
        let identity: String = row.try_get(0).map_err(read)?;
        let fence: i64 = row.try_get(1).map_err(read)?;
        let remaining: i64 = row.try_get(2).map_err(read)?;
        Ok(Some(Holder {
            identity: Identity::lossy(&identity),
            fence: self.fence(Op::Holder, key, fence)?,
            remaining: from_micros(remaining).max(Duration::from_micros(1)),
        }))
    }

    /// Raises the fence counter of `key` to at least `fence` (the newest fence
    /// storage admitted, after a restore that lost the counter); the counter now.
    /// The next grant's fence is above it.
    pub async fn raise_fence(&self, key: &str, fence: Fence) -> Result<Fence, PostgresLockError> {
        self.check_key(Op::RaiseFence, key)?;
        let Ok(wanted) = i64::try_from(fence.0) else {
            return Err(self
                .error(Op::RaiseFence, ErrorKind::Unsupported, Some(key))
                .because(format_args!(
                    "{fence} is above 2^63 - 1, the largest BIGINT"
                )));
        };
        let sql = &self.shared.sql.raise_fence;
        let rows = self
            .call(Op::RaiseFence, Some(key), |c| async move {
                c.client
                    .query_typed(sql, &[(&key, Type::TEXT), (&wanted, Type::INT8)])
                    .await
            })
            .await?;
        let now: i64 = rows
            .first()
            .ok_or_else(|| self.protocol(Op::RaiseFence, key, "no row back"))?
            .try_get(0)
            .map_err(|e| self.protocol(Op::RaiseFence, key, e))?;
        self.fence(Op::RaiseFence, key, now)
    }

    /// A fence read back; a negative one is a protocol error.
    fn fence(&self, op: Op, key: &str, stored: i64) -> Result<Fence, PostgresLockError> {
        u64::try_from(stored)
            .map(Fence)
            .map_err(|_| self.protocol(op, key, format_args!("a negative fence {stored}")))
    }

    pub(crate) fn error(&self, op: Op, kind: ErrorKind, key: Option<&str>) -> PostgresLockError {
        let e = PostgresLockError::new(op, kind, &self.shared.server);
        match key {
            Some(key) => e.for_key(key),
            None => e,
        }
    }

    fn protocol(&self, op: Op, key: &str, detail: impl std::fmt::Display) -> PostgresLockError {
        self.error(op, ErrorKind::Protocol, Some(key))
            .because(detail)
    }

    pub(crate) fn client_error(
        &self,
        op: Op,
        key: Option<&str>,
        err: tokio_postgres::Error,
    ) -> PostgresLockError {
        let e = PostgresLockError::from_client(
            op,
            &self.shared.server,
            (&self.shared.sql.table, &self.shared.sql.epoch),
            err,
        );
        match key {
            Some(key) => e.for_key(key),
            None => e,
        }
    }

    fn check_key(&self, op: Op, key: &str) -> Result<(), PostgresLockError> {
        leasehold::check_key(key).map_err(|why| {
            self.error(op, ErrorKind::InvalidKey, Some(key))
                .because(format_args!("{why}; nothing was sent"))
        })
    }

    fn check_ttl(&self, op: Op, key: &str, ttl: Duration) -> Result<(), PostgresLockError> {
        if ttl > self.shared.max_ttl {
            return Err(self
                .error(op, ErrorKind::Unsupported, Some(key))
                .because(format_args!(
                    "the TTL {:?} is above max_ttl {:?}, the quarantine after a loss of state \
                 (raise max_ttl on every client of this table, or ask for less); nothing was sent",
                    std::time::Duration::from(ttl),
                    std::time::Duration::from(self.shared.max_ttl)
                )));
        }
        if ttl.is_zero() {
            return Err(self
                .error(op, ErrorKind::Unsupported, Some(key))
                .because("a TTL of zero; nothing was sent"));
        }
        Ok(())
    }

    /// One request on a pooled connection, bounded by the request timeout (connecting
    /// included); its error sorted.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: Op,
        key: Option<&str>,
        request: F,
    ) -> Result<T, PostgresLockError>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let pool = &self.shared.pool;
        let after = self.shared.request_timeout;
        let mut taken = None;
        let attempt = async {
            let lease = taken.insert(pool.pick().await);
            let conn = lease.client(pool).await?;
            request(conn).await.map_err(NoConnection::Failed)
        };
        let timeout = || {
            self.error(op, ErrorKind::Timeout(after), key)
                .because("is PostgreSQL overloaded, paused, or cut off?")
        };
        match tokio::time::timeout(after, attempt).await {
            Err(_) | Ok(Err(NoConnection::TimedOut)) => Err(timeout()),
            Ok(Err(NoConnection::Failed(err))) => {
                if let Some(lease) = taken {
                    lease.answered();
                }
                Err(self.client_error(op, key, err))
            }
            Ok(Ok(answer)) => {
                if let Some(lease) = taken {
                    lease.answered();
                }
                Ok(answer)
            }
        }
    }

    /// A connection of its own (not one of the service's), connected within the
    /// request timeout: for lease-checked transactions in tests and tools. Its
    /// connection task runs on the current tokio runtime.
    pub async fn dedicated_connection(&self) -> Result<Client, PostgresLockError> {
        let after = self.shared.request_timeout;
        match tokio::time::timeout(after, self.shared.pool.connect()).await {
            Err(_) => Err(self.error(Op::Connect, ErrorKind::Timeout(after), None)),
            Ok(Err(err)) => Err(self.client_error(Op::Connect, None, err)),
            Ok(Ok(client)) => Ok(client),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            hide_password("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(
            hide_password("host=h password=secret user=u"),
            "host=h user=u"
        );
        let config: tokio_postgres::Config = "postgresql://u:secret@h:5/db".parse().unwrap();
        assert_eq!(describe(&config), "h:5/db");
    }

    #[test]
    fn bad_settings_are_config_errors() {
        let err = |b: Builder| b.connect_lazily().unwrap_err();
        let b = || PostgresLockService::builder("postgres://u@127.0.0.1:1/db");
        assert_eq!(err(b().table("a; drop")).kind(), ErrorKind::Config);
        assert_eq!(err(b().table("a".repeat(58))).kind(), ErrorKind::Config);
        assert!(b().table("a".repeat(57)).connect_lazily().is_ok());
        let e = err(b().max_ttl(MAX_TTL_LIMIT + std::time::Duration::from_micros(1)));
        assert!(e.to_string().contains("max_ttl"), "{e}");
        let require = || PostgresLockService::builder("postgres://u:pw@h/db?sslmode=require");
        #[cfg(not(feature = "tls"))]
        {
            let e = err(require());
            assert!(
                e.to_string().contains("TLS") && !e.to_string().contains("pw"),
                "{e}"
            );
        }
        #[cfg(feature = "tls")]
        {
            assert!(require().connect_lazily().is_ok());
            let e = err(PostgresLockService::builder(
                "postgres://u:pw@h/db?sslmode=verify-everything",
            ));
            assert!(
                e.to_string().contains("verify-everything") && !e.to_string().contains("pw"),
                "{e}"
            );
            let e = err(require().tls_root_cert("not a certificate"));
            assert!(e.to_string().contains("is not PEM"), "{e}");
        }
        let e = err(PostgresLockService::builder("nonsense://x"));
        assert_eq!(e.kind(), ErrorKind::Config);
    }
}
