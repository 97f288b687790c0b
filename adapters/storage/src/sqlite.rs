//! Fenced writes in SQLite, through `rusqlite` (its bundled SQLite: no system
//! library needed).
//!
//! The same pattern as [`postgres`](crate::postgres): a fence column beside the value
//! and one guarded upsert per write. SQLite runs one writer at a time per database,
//! so concurrent writers (threads or processes, each with its own connection) are
//! decided one by one against the committed newest fence; give each connection a
//! busy timeout so that a writer waits for the lock instead of failing with
//! `SQLITE_BUSY`.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS fenced (
//!     key   TEXT    PRIMARY KEY,
//!     value BLOB    NOT NULL,
//!     fence INTEGER NOT NULL CHECK (fence >= 0)
//! ) STRICT;
//! INSERT INTO fenced (key, value, fence) VALUES (?1, ?2, ?3)
//! ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence
//!     WHERE fence <= excluded.fence
//! RETURNING fence;
//! ```
//!
//! No row back means refused; a second statement reads the newest fence for the
//! answer. In a table of your own: `UPDATE t SET …, fence = ?2 WHERE key = ?1 AND
//! fence <= ?2`, and one changed row is admitted.
//!
//! `STRICT` keeps a fence an integer (a text fence would compare as text). Fences are
//! `INTEGER`, exact up to [`MAX_SQL_FENCE`](crate::MAX_SQL_FENCE) (2^63 − 1); a larger
//! fence is refused before anything runs.

use leasehold::Fence;
use rusqlite::{Connection, OptionalExtension};

#[cfg(feature = "sqlite-tokio")]
mod blocking;
#[cfg(feature = "sqlite-tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite-tokio")))]
pub use blocking::AsyncFencedTable;

use crate::error::stored_fence;
use crate::table::to_sql;
use crate::{Fenced, FencedWrite, InvalidTableName, TableName};

pub use crate::Error;

/// How often a write is tried again when the row changed under it in a way no fenced
/// write makes (see [`Error::Unsettled`]).
const ATTEMPTS: usize = 3;

/// A table of fenced values: the statements for one table name, built once.
///
/// ```
/// use leasehold_storage::{sqlite::FencedTable, Fence, FencedWrite};
///
/// let conn = rusqlite::Connection::open_in_memory()?;
/// let table = FencedTable::new("fenced")?;
/// table.create(&conn)?;
/// assert_eq!(table.write(&conn, "orders", Fence(7), b"v1")?, FencedWrite::Written);
/// assert_eq!(table.write(&conn, "orders", Fence(7), b"v2")?, FencedWrite::Written);
/// assert_eq!(table.write(&conn, "orders", Fence(9), b"v3")?, FencedWrite::Written);
/// // The holder of fence 7 wakes from a pause:
/// assert_eq!(
///     table.write(&conn, "orders", Fence(7), b"late")?,
///     FencedWrite::Stale { presented: Fence(7), newest: Fence(9) }
/// );
/// assert_eq!(table.read(&conn, "orders")?.unwrap().value, b"v3");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct FencedTable {
    name: TableName,
    create: String,
    write: String,
    newest: String,
    read: String,
}

impl FencedTable {
    /// The statements for table `name` (a plain identifier: see [`TableName`]).
    pub fn new(name: &str) -> Result<FencedTable, InvalidTableName> {
        let name = TableName::new(name)?;
        Ok(FencedTable {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {name} (\n    key   TEXT    PRIMARY KEY,\n    \
                 value BLOB    NOT NULL,\n    fence INTEGER NOT NULL CHECK (fence >= 0)\n) STRICT"
            ),
            write: format!(
                "INSERT INTO {name} (key, value, fence) VALUES (?1, ?2, ?3)\n\
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence\n    \
                 WHERE fence <= excluded.fence\nRETURNING fence"
            ),
            newest: format!("SELECT fence FROM {name} WHERE key = ?1"),
            read: format!("SELECT value, fence FROM {name} WHERE key = ?1"),
            name,
        })
    }

    /// The table's name.
    pub fn name(&self) -> &TableName {
        &self.name
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement, for a migration of your own.
    pub fn create_sql(&self) -> &str {
        &self.create
    }

    /// The guarded upsert every [`write`](Self::write) runs (`?1` key, `?2` value,
    /// `?3` fence).
    pub fn write_sql(&self) -> &str {
        &self.write
    }

    /// Creates the table unless it exists.
    pub fn create(&self, conn: &Connection) -> Result<(), Error> {
        conn.execute_batch(&self.create).map_err(Error::Sqlite)
    }

    /// Stores `value` under `key` if `fence` is at least the newest fence admitted
    /// for `key` (equal is admitted), in one statement; otherwise stores nothing and
    /// answers [`FencedWrite::Stale`] with the newest fence.
    pub fn write(
        &self,
        conn: &Connection,
        key: &str,
        fence: Fence,
        value: &[u8],
    ) -> Result<FencedWrite, Error> {
        let presented = to_sql(fence).map_err(Error::FenceOutOfRange)?;
        for _ in 0..ATTEMPTS {
            let admitted: Option<i64> = conn
                .prepare_cached(&self.write)
                .and_then(|mut statement| {
                    statement
                        .query_row((key, value, presented), |row| row.get(0))
                        .optional()
                })
                .map_err(Error::Sqlite)?;
            if admitted.is_some() {
                return Ok(FencedWrite::Written);
            }
            if let Some(stored) = self.newest(conn, key)? {
                let newest = stored_fence(key, stored)?;
                if newest > fence {
                    return Ok(FencedWrite::Stale {
                        presented: fence,
                        newest,
                    });
                }
            }
        }
        Err(Error::Unsettled {
            key: key.to_owned(),
        })
    }

    /// The value stored under `key` and its fence, or `None` if nothing was written.
    pub fn read(&self, conn: &Connection, key: &str) -> Result<Option<Fenced>, Error> {
        let row: Option<(Vec<u8>, i64)> = conn
            .prepare_cached(&self.read)
            .and_then(|mut statement| {
                statement
                    .query_row([key], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(Error::Sqlite)?;
        row.map(|(value, stored)| {
            Ok(Fenced {
                value,
                fence: stored_fence(key, stored)?,
            })
        })
        .transpose()
    }

    fn newest(&self, conn: &Connection, key: &str) -> Result<Option<i64>, Error> {
        conn.prepare_cached(&self.newest)
            .and_then(|mut statement| statement.query_row([key], |row| row.get(0)).optional())
            .map_err(Error::Sqlite)
    }
}
