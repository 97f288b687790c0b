//! The one error type of every fenced store: what goes wrong is the same for each
//! database (a fence that does not fit, a row no fenced write made, a refusal that
//! never settles); only the database's own failure differs.

use std::fmt;

use crate::FenceOutOfRange;

/// Why a fenced write or read failed. A stale fence is not an error: it is
/// [`FencedWrite::Stale`](crate::FencedWrite::Stale).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The fence does not fit the database's 64-bit signed integer (`BIGINT`,
    /// `INTEGER`); nothing was sent.
    FenceOutOfRange(FenceOutOfRange),
    /// The table holds a negative fence for the key: not written by a fenced write
    /// (the column's `CHECK` forbids it), so the table cannot be trusted.
    CorruptFence {
        /// The key.
        key: String,
        /// The fence found.
        found: i64,
    },
    /// The write was refused, yet the fence read after it was not newer, three times
    /// in a row: something other than fenced writes deletes or lowers the row.
    Unsettled {
        /// The key.
        key: String,
    },
    /// The audit was read from a table built without it
    /// (`FencedTable::with_audit`): its writes leave no audit rows.
    NotAudited {
        /// The table's name.
        table: String,
    },
    /// PostgreSQL did not answer within the table's timeout
    /// ([`FencedTable::with_timeout`](crate::postgres::FencedTable::with_timeout)).
    /// The outcome is unknown: the statement may still run when the server answers,
    /// and its fence guard decides it then (an older fence than the newest admitted
    /// is refused whenever it runs). Writing again with the same fence is safe.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Timeout {
        /// The key (for `create`, the table's name).
        key: String,
        /// The bound that ran out.
        after: std::time::Duration,
    },
    /// PostgreSQL failed the statement (connection, permissions, no such table…).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(tokio_postgres::Error),
    /// SQLite failed the statement (busy past the busy timeout, no such table, a
    /// read-only database…).
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(rusqlite::Error),
    /// The blocking task that ran the statement did not finish: it panicked, or the
    /// runtime shut down before it started. A write may or may not have run; writing
    /// again with the same fence is safe.
    #[cfg(feature = "sqlite-tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite-tokio")))]
    TaskFailed {
        /// The key (for `create`, the table's name).
        key: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::FenceOutOfRange(e) => write!(f, "fenced write refused: {e}"),
            Error::CorruptFence { key, found } => write!(
                f,
                "the fenced row of `{key}` holds fence {found}, which no fenced write stores"
            ),
            Error::Unsettled { key } => write!(
                f,
                "the fenced write of `{key}` was refused, but no newer fence was found: \
                 something else deletes or rewrites the row"
            ),
            Error::NotAudited { table } => write!(
                f,
                "fenced table `{table}` was built without its audit (`with_audit(true)`)"
            ),
            #[cfg(feature = "postgres")]
            Error::Timeout { key, after } => write!(
                f,
                "fenced table, key `{key}`: PostgreSQL did not answer within {after:?} \
                 (the outcome is unknown; the fence guard still decides it if it runs)"
            ),
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => match e.as_db_error() {
                // `tokio_postgres::Error` alone says only "db error".
                Some(db) => write!(
                    f,
                    "fenced write: PostgreSQL answered {} {}: {}",
                    db.severity(),
                    db.code().code(),
                    db.message()
                ),
                None => write!(f, "fenced write: PostgreSQL failed: {e}"),
            },
            #[cfg(feature = "sqlite")]
            Error::Sqlite(e) => write!(f, "fenced write: SQLite failed: {e}"),
            #[cfg(feature = "sqlite-tokio")]
            Error::TaskFailed { key } => write!(
                f,
                "fenced table, key `{key}`: the blocking task ended before its statement \
                 finished (a panic, or the runtime shutting down)"
            ),
        }
    }
}

/// The message is complete on its own (the database's error is part of it), so
/// `source()` is `None` and a log line prints the cause once.
impl std::error::Error for Error {}

/// The fence a row holds, or [`Error::CorruptFence`] for a value no fenced write
/// stores.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn stored_fence(key: &str, stored: i64) -> Result<leasehold::Fence, Error> {
    crate::table::from_sql(stored).ok_or_else(|| Error::CorruptFence {
        key: key.to_owned(),
        found: stored,
    })
}
