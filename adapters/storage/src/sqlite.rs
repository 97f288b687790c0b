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
//! With [`FencedTable::with_audit`], each admitted write also records itself in
//! `<name>_audit`, in the same transaction as the upsert, for [`FencedTable::audit`]
//! and [`check_order`](crate::check_order).
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

use crate::audit::from_unix_millis;
use crate::error::stored_fence;
use crate::table::to_sql;
use crate::{Admitted, Fenced, FencedWrite, InvalidTableName, TableName};

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
    audit: Option<Audit>,
}

/// The audit table of an audited [`FencedTable`] and its statements.
#[derive(Clone, Debug)]
struct Audit {
    name: TableName,
    insert: String,
    read: String,
}

impl FencedTable {
    /// The statements for table `name` (a plain identifier: see [`TableName`]).
    pub fn new(name: &str) -> Result<FencedTable, InvalidTableName> {
        FencedTable::build(TableName::new(name)?, false)
    }

    fn build(name: TableName, audited: bool) -> Result<FencedTable, InvalidTableName> {
        let mut create = format!(
            "CREATE TABLE IF NOT EXISTS {name} (\n    key   TEXT    PRIMARY KEY,\n    \
             value BLOB    NOT NULL,\n    fence INTEGER NOT NULL CHECK (fence >= 0)\n) STRICT"
        );
        let audit = if audited {
            // The same 63-byte limit as PostgreSQL, so that one name works on both.
            let audit = TableName::new(&format!("{name}_audit"))?;
            create = format!(
                "{create};\nCREATE TABLE IF NOT EXISTS {audit} (\n    \
                 seq   INTEGER PRIMARY KEY AUTOINCREMENT,\n    \
                 key   TEXT    NOT NULL,\n    \
                 fence INTEGER NOT NULL CHECK (fence >= 0),\n    \
                 at    INTEGER NOT NULL\n) STRICT;\n\
                 CREATE INDEX IF NOT EXISTS {audit}_key ON {audit} (key, seq)"
            );
            Some(Audit {
                // `at`: milliseconds since the Unix epoch, by SQLite's clock.
                insert: format!(
                    "INSERT INTO {audit} (key, fence, at) \
                     VALUES (?1, ?2, CAST(round(unixepoch('subsec') * 1000) AS INTEGER))"
                ),
                read: format!(
                    "SELECT seq, fence, at FROM {audit} WHERE key = ?1 AND seq > ?2 ORDER BY seq"
                ),
                name: audit,
            })
        } else {
            None
        };
        Ok(FencedTable {
            create,
            write: format!(
                "INSERT INTO {name} (key, value, fence) VALUES (?1, ?2, ?3)\n\
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence\n    \
                 WHERE fence <= excluded.fence\nRETURNING fence"
            ),
            newest: format!("SELECT fence FROM {name} WHERE key = ?1"),
            read: format!("SELECT value, fence FROM {name} WHERE key = ?1"),
            name,
            audit,
        })
    }

    /// Turns the audit of admitted writes on (or off): each admitted write also
    /// inserts a row (`seq`, `key`, `fence`, `at`) into the table `<name>_audit`,
    /// which [`create`](Self::create) creates too and [`audit`](Self::audit) reads
    /// back, in admission order, for [`check_order`](crate::check_order).
    ///
    /// It costs one more row per admitted write and a transaction around each write:
    /// the upsert and the audit row's `INSERT` ([`audit_sql`](Self::audit_sql)) run in
    /// one `BEGIN IMMEDIATE` (a savepoint if the connection is already in a
    /// transaction of yours), so that they commit together or not at all; a refused
    /// write inserts nothing. Off (the default), a write is exactly the one upsert of
    /// an unaudited table. The audit only records writes made through tables with it
    /// on, and it grows until you prune it (`DELETE FROM <name>_audit WHERE seq <= …`).
    ///
    /// `<name>_audit` must fit 63 bytes, as on PostgreSQL: a name longer than 57
    /// bytes is an [`InvalidTableName`] naming the audit table.
    ///
    /// ```
    /// use leasehold_storage::sqlite::FencedTable;
    /// use leasehold_storage::{check_order, Fence, FencedWrite};
    ///
    /// let conn = rusqlite::Connection::open_in_memory()?;
    /// let table = FencedTable::new("fenced")?.with_audit(true)?;
    /// table.create(&conn)?;
    /// for fence in [5, 5, 7, 6] {
    ///     let _ = table.write(&conn, "orders", Fence(fence), b"v")?;
    /// }
    /// let audit = table.audit(&conn, "orders")?;
    /// let fences: Vec<_> = audit.iter().map(|row| row.fence.0).collect();
    /// assert_eq!(fences, [5, 5, 7], "the stale 6 left no row");
    /// check_order(&audit)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_audit(self, on: bool) -> Result<FencedTable, InvalidTableName> {
        FencedTable::build(self.name, on)
    }

    /// The audit table, if the audit is on ([`with_audit`](Self::with_audit)).
    pub fn audit_table(&self) -> Option<&TableName> {
        self.audit.as_ref().map(|audit| &audit.name)
    }

    /// With the audit on, the `INSERT` of the audit row that a write runs after an
    /// admitted upsert, in the same transaction (`?1` key, `?2` fence).
    pub fn audit_sql(&self) -> Option<&str> {
        self.audit.as_ref().map(|audit| audit.insert.as_str())
    }

    /// The table's name.
    pub fn name(&self) -> &TableName {
        &self.name
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement (with the audit on, followed by
    /// those of the audit table and its index, separated by `;`), for a migration of
    /// your own.
    pub fn create_sql(&self) -> &str {
        &self.create
    }

    /// The guarded upsert every [`write`](Self::write) runs (`?1` key, `?2` value,
    /// `?3` fence).
    pub fn write_sql(&self) -> &str {
        &self.write
    }

    /// Creates the table unless it exists (and its audit table, if the audit is on).
    pub fn create(&self, conn: &Connection) -> Result<(), Error> {
        conn.execute_batch(&self.create).map_err(Error::Sqlite)
    }

    /// Stores `value` under `key` if `fence` is at least the newest fence admitted
    /// for `key` (equal is admitted), in one statement; otherwise stores nothing and
    /// answers [`FencedWrite::Stale`] with the newest fence. With the audit on, an
    /// admitted write also inserts its audit row, in the same transaction.
    pub fn write(
        &self,
        conn: &Connection,
        key: &str,
        fence: Fence,
        value: &[u8],
    ) -> Result<FencedWrite, Error> {
        let presented = to_sql(fence).map_err(Error::FenceOutOfRange)?;
        let Some(audit) = &self.audit else {
            return self.write_guarded(conn, key, fence, presented, value, None);
        };
        let atomic = Atomic::begin(conn)?;
        let answer = self.write_guarded(conn, key, fence, presented, value, Some(audit))?;
        atomic.commit()?;
        Ok(answer)
    }

    /// The guarded upsert, and with `audit` the audit row of an admitted write.
    fn write_guarded(
        &self,
        conn: &Connection,
        key: &str,
        fence: Fence,
        presented: i64,
        value: &[u8],
        audit: Option<&Audit>,
    ) -> Result<FencedWrite, Error> {
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
                if let Some(audit) = audit {
                    conn.prepare_cached(&audit.insert)
                        .and_then(|mut statement| statement.execute((key, presented)))
                        .map_err(Error::Sqlite)?;
                }
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

    /// Every write to `key` this table's audit recorded, in admission order (by
    /// `seq`), for [`check_order`](crate::check_order). [`Error::NotAudited`] if the
    /// audit is off.
    pub fn audit(&self, conn: &Connection, key: &str) -> Result<Vec<Admitted>, Error> {
        self.audit_after(conn, key, 0)
    }

    /// The audit rows of `key` whose `seq` is above `after`, in admission order: the
    /// rows since the last one read.
    pub fn audit_after(
        &self,
        conn: &Connection,
        key: &str,
        after: i64,
    ) -> Result<Vec<Admitted>, Error> {
        let audit = self.audit.as_ref().ok_or_else(|| Error::NotAudited {
            table: self.name.to_string(),
        })?;
        let rows: Vec<(i64, i64, i64)> = conn
            .prepare_cached(&audit.read)
            .and_then(|mut statement| {
                statement
                    .query_map((key, after), |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                    })?
                    .collect()
            })
            .map_err(Error::Sqlite)?;
        rows.into_iter()
            .map(|(seq, fence, at)| {
                Ok(Admitted::new(
                    seq,
                    stored_fence(key, fence)?,
                    from_unix_millis(at),
                ))
            })
            .collect()
    }

    fn newest(&self, conn: &Connection, key: &str) -> Result<Option<i64>, Error> {
        conn.prepare_cached(&self.newest)
            .and_then(|mut statement| statement.query_row([key], |row| row.get(0)).optional())
            .map_err(Error::Sqlite)
    }
}

/// A write and its audit row as one unit: `BEGIN IMMEDIATE` (the write lock up
/// front, waiting out the busy timeout) or, inside a transaction of the caller's, a
/// savepoint. Dropped without [`commit`](Self::commit) (an error, a panic), it rolls
/// back, so neither the write nor its audit row stays.
struct Atomic<'c> {
    conn: &'c Connection,
    savepoint: bool,
    done: bool,
}

impl<'c> Atomic<'c> {
    fn begin(conn: &'c Connection) -> Result<Atomic<'c>, Error> {
        let savepoint = !conn.is_autocommit();
        conn.execute_batch(if savepoint {
            "SAVEPOINT leasehold_audit"
        } else {
            "BEGIN IMMEDIATE"
        })
        .map_err(Error::Sqlite)?;
        Ok(Atomic {
            conn,
            savepoint,
            done: false,
        })
    }

    fn commit(mut self) -> Result<(), Error> {
        self.conn
            .execute_batch(if self.savepoint {
                "RELEASE leasehold_audit"
            } else {
                "COMMIT"
            })
            .map_err(Error::Sqlite)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Atomic<'_> {
    fn drop(&mut self) {
        if !self.done {
            // SQLite may have rolled back already (some errors end the transaction):
            // then this fails, and there is nothing left to undo.
            let _ = self.conn.execute_batch(if self.savepoint {
                "ROLLBACK TO leasehold_audit; RELEASE leasehold_audit"
            } else {
                "ROLLBACK"
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_is_off_by_default_and_on_keeps_the_same_upsert() {
        let plain = FencedTable::new("t").unwrap();
        assert_eq!(
            plain.write_sql(),
            "INSERT INTO t (key, value, fence) VALUES (?1, ?2, ?3)\n\
             ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence\n    \
             WHERE fence <= excluded.fence\nRETURNING fence",
            "off, the statement is the unaudited one"
        );
        assert_eq!((plain.audit_table(), plain.audit_sql()), (None, None));
        let audited = plain.clone().with_audit(true).unwrap();
        assert_eq!(audited.write_sql(), plain.write_sql());
        assert!(audited
            .audit_sql()
            .unwrap()
            .starts_with("INSERT INTO t_audit "));
        assert!(audited
            .create_sql()
            .contains("CREATE TABLE IF NOT EXISTS t_audit ("));
        let off = audited.with_audit(false).unwrap();
        assert_eq!(off.create_sql(), plain.create_sql());

        let longest = "t".repeat(57);
        assert!(FencedTable::new(&longest).unwrap().with_audit(true).is_ok());
        let err = FencedTable::new(&format!("{longest}u"))
            .unwrap()
            .with_audit(true)
            .unwrap_err();
        assert_eq!(err.name, format!("{longest}u_audit"));
    }
}
