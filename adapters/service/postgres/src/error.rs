//! Typed errors: what failed, where, and what to do.
//!
//! [`PostgresLockError`]'s `Display` says the request, the key, the server (never the
//! password), what went wrong and what to do, once; [`source`](std::error::Error::source)
//! is the `tokio-postgres` error when there is one.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use leasehold::{Indeterminate, Refusal};
use tokio_postgres::error::SqlState;

/// Which request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Connecting, or the first check of the tables at connect.
    Connect,
    /// Creating the tables ([`PostgresLockService::create_tables`](crate::PostgresLockService::create_tables)).
    CreateTables,
    /// An acquire.
    Acquire,
    /// A renewal.
    Renew,
    /// A release.
    Release,
    /// The holder query.
    Holder,
    /// [`raise_fence`](crate::PostgresLockService::raise_fence).
    RaiseFence,
    /// [`mark_data_set_new`](crate::PostgresLockService::mark_data_set_new).
    MarkNew,
    /// A lease-checked transaction ([`LeaseTransaction`](crate::LeaseTransaction)):
    /// its start, a statement in it, or its commit.
    Guard,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Connect => "connect",
            Op::CreateTables => "create tables",
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::Holder => "holder query",
            Op::RaiseFence => "raise fence",
            Op::MarkNew => "mark data set new",
            Op::Guard => "lease-checked transaction",
        })
    }
}

/// What kind of failure a [`PostgresLockError`] is; it decides what the lease sees
/// ([`PostgresLockError::refusal`], [`PostgresLockError::indeterminate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The connection failed: refused, reset, closed.
    Transport,
    /// No answer within the request timeout (the connection is then dropped).
    Timeout(std::time::Duration),
    /// PostgreSQL answered with an error that may clear: shutting down, starting up,
    /// too many connections, a cancelled statement, a serialization failure, or
    /// **read-only** (a hot standby, which a promotion turns into the primary, or
    /// `default_transaction_read_only`: retried like Redis's `READONLY`).
    Service,
    /// An answer the statements never produce (a row of another shape, a negative
    /// fence).
    Protocol,
    /// Authentication failed, or the role lacks a privilege on the tables. Final:
    /// [`Refusal::Unauthorized`].
    Unauthorized,
    /// The lease table (or its epoch table) does not exist: run the migration or
    /// [`create_tables`](crate::PostgresLockService::create_tables). Final:
    /// [`Refusal::Unsupported`].
    MissingTable,
    /// A table of that name exists but is not a lease table (columns missing or of
    /// another type), or the database does not exist. Final: [`Refusal::Unsupported`].
    WrongTable,
    /// The key breaks the key rules ([`leasehold::check_key`]); nothing was sent.
    /// Final: [`Refusal::InvalidKey`].
    InvalidKey,
    /// A TTL above `max_ttl` ([`Builder::max_ttl`](crate::Builder::max_ttl)), or a
    /// fence past 2^63 − 1; nothing was granted. Final: [`Refusal::Unsupported`].
    Unsupported,
    /// The settings cannot be used (only from [`Builder`](crate::Builder)): an
    /// unusable URL, a TLS file that is not PEM, a client key that is not its
    /// certificate's, among others.
    Config,
    /// The TLS handshake, or the certificate authentication after it, failed for a
    /// reason retrying cannot clear (a certificate not trusted, not for this host,
    /// expired, missing, or refused by the server). Final: [`Refusal::Unauthorized`]
    /// (certificates are credentials).
    Tls(leasehold_driver::TlsProblem),
    /// A lease-checked transaction found the lease no longer the caller's (another
    /// owner or fence, released, expired), at its start or at its commit: nothing of
    /// it was committed.
    NotHeld,
}

/// A request to PostgreSQL that did not produce a definitive answer, or was refused
/// for good.
#[derive(Clone)]
pub struct PostgresLockError {
    op: Op,
    kind: ErrorKind,
    server: Arc<str>,
    key: Option<Box<str>>,
    detail: String,
    source: Option<Arc<tokio_postgres::Error>>,
}

impl PostgresLockError {
    pub(crate) fn new(op: Op, kind: ErrorKind, server: &Arc<str>) -> PostgresLockError {
        PostgresLockError {
            op,
            kind,
            server: Arc::clone(server),
            key: None,
            detail: String::new(),
            source: None,
        }
    }

    pub(crate) fn for_key(mut self, key: &str) -> Self {
        self.key = Some(key.into());
        self
    }

    pub(crate) fn because(mut self, detail: impl fmt::Display) -> Self {
        self.detail = detail.to_string();
        self
    }

    /// Sorts a `tokio-postgres` error by its SQLSTATE (or its lack of one).
    pub(crate) fn from_client(
        op: Op,
        server: &Arc<str>,
        tables: (&str, &str),
        err: tokio_postgres::Error,
    ) -> PostgresLockError {
        let (kind, detail) = classify(&err, tables);
        let mut e = PostgresLockError::new(op, kind, server).because(detail);
        e.source = Some(Arc::new(err));
        e
    }

    /// Which request failed.
    pub fn op(&self) -> Op {
        self.op
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The server, as `host:port/dbname` (never the password).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The key of the request, if it had one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The SQLSTATE PostgreSQL answered, if it answered with an error.
    pub fn code(&self) -> Option<&str> {
        self.source
            .as_ref()
            .and_then(|e| e.code())
            .map(SqlState::code)
    }

    /// The final refusal this error is to a lease, if it is one.
    pub fn refusal(&self) -> Option<Refusal> {
        match self.kind {
            ErrorKind::Unauthorized | ErrorKind::Tls(_) => Some(Refusal::Unauthorized),
            ErrorKind::InvalidKey => Some(Refusal::InvalidKey),
            ErrorKind::MissingTable
            | ErrorKind::WrongTable
            | ErrorKind::Unsupported
            | ErrorKind::Config => Some(Refusal::Unsupported),
            ErrorKind::Transport
            | ErrorKind::Timeout(_)
            | ErrorKind::Service
            | ErrorKind::Protocol
            | ErrorKind::NotHeld => None,
        }
    }

    /// The unknown outcome this error is to a lease (when it is not a refusal).
    pub fn indeterminate(&self) -> Indeterminate {
        match self.kind {
            ErrorKind::Transport => Indeterminate::Transport,
            ErrorKind::Timeout(_) => Indeterminate::Timeout,
            ErrorKind::Protocol => Indeterminate::Protocol,
            _ => Indeterminate::Service,
        }
    }
}

impl fmt::Display for PostgresLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.op, self.server)?;
        if let Some(key) = &self.key {
            write!(f, " (key {key:?})")?;
        }
        let what = match self.kind {
            ErrorKind::Transport => "connection failed",
            ErrorKind::Timeout(_) => "no answer in time",
            ErrorKind::Service => "PostgreSQL refused for now",
            ErrorKind::Protocol => "unexpected answer",
            ErrorKind::Unauthorized => "not authorized",
            ErrorKind::MissingTable => "missing table",
            ErrorKind::WrongTable => "not a lease table",
            ErrorKind::InvalidKey => "invalid key",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Config => "unusable settings",
            ErrorKind::Tls(_) => "TLS failed",
            ErrorKind::NotHeld => "the lease is not held",
        };
        write!(f, ": {what}")?;
        if let ErrorKind::Timeout(after) = self.kind {
            write!(f, " ({after:?})")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl fmt::Debug for PostgresLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockError")
            .field("op", &self.op)
            .field("kind", &self.kind)
            .field("server", &self.server)
            .field("key", &self.key)
            .field("detail", &self.detail)
            .field("code", &self.code())
            .finish()
    }
}

impl StdError for PostgresLockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// The kind of `err`, and a sentence saying what it means and what to do.
fn classify(err: &tokio_postgres::Error, (table, epoch): (&str, &str)) -> (ErrorKind, String) {
    let Some(db) = err.as_db_error() else {
        let text = chain(err);
        if let Some(problem) = leasehold_driver::TlsProblem::from_error_text(&text) {
            return (ErrorKind::Tls(problem), format!("{problem}; {text}"));
        }
        if err.is_closed() || StdError::source(err).is_some() || text.contains("connection") {
            return (
                ErrorKind::Transport,
                format!("{text} (is PostgreSQL running and reachable at that address?)"),
            );
        }
        return (ErrorKind::Protocol, text);
    };
    let said = format!("PostgreSQL said: {} ({})", db.message(), db.code().code());
    let code = db.code();
    let class = &code.code()[..2];
    // A `cert` line in pg_hba.conf: "connection requires a valid client
    // certificate", "certificate authentication failed for user …".
    if class == "28" && db.message().contains("certificate") {
        let problem = if db.message().contains("requires") {
            leasehold_driver::TlsProblem::ClientCertRequired
        } else {
            leasehold_driver::TlsProblem::ClientCertRefused
        };
        return (ErrorKind::Tls(problem), format!("{problem}; {said}"));
    }
    if *code == SqlState::INVALID_PASSWORD || class == "28" {
        (
            ErrorKind::Unauthorized,
            format!("authentication failed: check the user and password; {said}"),
        )
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        (
            ErrorKind::Unauthorized,
            format!(
                "the role lacks a privilege: it needs SELECT, INSERT and UPDATE on {table} \
                 and {epoch}; {said}"
            ),
        )
    } else if *code == SqlState::UNDEFINED_TABLE {
        (
            ErrorKind::MissingTable,
            format!(
                "the lease tables {table} and {epoch} must exist: run the migration in the \
                 leasehold-postgres docs, or create_tables(); {said}"
            ),
        )
    } else if *code == SqlState::UNDEFINED_COLUMN
        || *code == SqlState::DATATYPE_MISMATCH
        || *code == SqlState::WRONG_OBJECT_TYPE
        || *code == SqlState::UNDEFINED_FUNCTION
    {
        (
            ErrorKind::WrongTable,
            format!(
                "{table} (or {epoch}) is not a leasehold lease table (another program's \
                 table of that name?): pick another table name; {said}"
            ),
        )
    } else if *code == SqlState::INVALID_CATALOG_NAME {
        (
            ErrorKind::WrongTable,
            format!("the database does not exist: check the dbname; {said}"),
        )
    } else if *code == SqlState::NUMERIC_VALUE_OUT_OF_RANGE {
        (
            ErrorKind::Unsupported,
            format!("the key's fence counter is at 2^63 - 1, the largest BIGINT; {said}"),
        )
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || (*code == SqlState::FEATURE_NOT_SUPPORTED && db.message().contains("during recovery"))
    {
        // A hot standby refuses the lock (`FOR UPDATE`) or, first, the unlogged epoch
        // table ("cannot access temporary or unlogged relations during recovery").
        (
            ErrorKind::Service,
            format!(
                "the server is read-only (a hot standby, or default_transaction_read_only): \
                 point the URL at the primary (several hosts with \
                 target_session_attrs=read-write pick it); retried, as a standby may be \
                 promoted; {said}"
            ),
        )
    } else {
        (ErrorKind::Service, said)
    }
}

/// `err` and its causes, each once.
fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    text
}
