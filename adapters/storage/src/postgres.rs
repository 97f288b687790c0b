//! Fenced writes in PostgreSQL, through `tokio-postgres`.
//!
//! The table has a fence column beside the value, and every write is one guarded
//! upsert: the row is inserted, or updated only when the stored fence is not newer
//! than the one presented. PostgreSQL locks the row for the update, so concurrent
//! writers are decided one at a time against the committed newest fence, in any
//! isolation level that lets the statement run (`READ COMMITTED`, the default; under
//! `REPEATABLE READ` and `SERIALIZABLE` a concurrent write is a serialization error
//! to retry, as for any update).
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS fenced (
//!     key   TEXT   PRIMARY KEY,
//!     value BYTEA  NOT NULL,
//!     fence BIGINT NOT NULL CHECK (fence >= 0)
//! );
//! INSERT INTO fenced AS stored (key, value, fence) VALUES ($1, $2, $3)
//! ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence
//!     WHERE stored.fence <= EXCLUDED.fence
//! RETURNING fence;
//! ```
//!
//! No row back means refused; a second statement then reads the newest fence for
//! the answer (it is at least the one that refused the write: fences in the table
//! only rise). In a table of your own, the same guard on an `UPDATE` does it:
//! `UPDATE t SET …, fence = $2 WHERE key = $1 AND fence <= $2` — one row updated is
//! admitted, none is stale. The guard is `<=`, not `<`: the holder of the newest
//! fence writes again and again.
//!
//! Fences are `BIGINT`: exact up to [`MAX_SQL_FENCE`](crate::MAX_SQL_FENCE) (2^63 − 1);
//! a larger fence is refused before anything is sent.
//!
//! With [`FencedTable::with_audit`], each admitted write also records itself in
//! `<name>_audit`, in the same statement (the upsert inside a `WITH`, its `RETURNING`
//! feeding the audit table's `INSERT`), for [`FencedTable::audit`] and
//! [`check_order`](crate::check_order).
//!
//! Every call is bounded ([`DEFAULT_TIMEOUT`], or
//! [`FencedTable::with_timeout`]): a server that stopped answering (paused, cut off
//! without a reset) costs one [`Error::Timeout`], never a writer stuck for the
//! hours TCP takes to notice.

#[cfg(feature = "postgres-tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres-tls")))]
pub mod tls;

use std::future::Future;
use std::time::Duration;

use leasehold::Fence;
use tokio_postgres::GenericClient;

use crate::error::stored_fence;
use crate::table::to_sql;
use crate::{Admitted, Fenced, FencedWrite, InvalidTableName, TableName};

pub use crate::Error;

/// The bound on each call unless [`FencedTable::with_timeout`] sets another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a write is tried again when the row changed under it in a way no fenced
/// write makes (deleted, or its fence lowered by hand) between the refused upsert and
/// the read of the newest fence.
const ATTEMPTS: usize = 3;

/// A table of fenced values: the statements for one table name, built once.
///
/// ```no_run
/// # async fn demo(client: &tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use leasehold_storage::{postgres::FencedTable, Fence, FencedWrite};
///
/// let table = FencedTable::new("fenced")?;
/// table.create(client).await?;
/// let fence = Fence(7); // from lease.check()
/// match table.write(client, "orders", fence, b"v2").await? {
///     FencedWrite::Written => {}
///     FencedWrite::Stale { newest, .. } => return Err(format!("lost to {newest}").into()),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FencedTable {
    name: TableName,
    timeout: Duration,
    create: String,
    write: String,
    newest: String,
    read: String,
    audit: Option<Audit>,
}

/// The audit table of an audited [`FencedTable`] and the statement that reads it.
#[derive(Clone, Debug)]
struct Audit {
    name: TableName,
    read: String,
}

impl FencedTable {
    /// The statements for table `name` (a plain identifier: see [`TableName`]).
    pub fn new(name: &str) -> Result<FencedTable, InvalidTableName> {
        FencedTable::build(TableName::new(name)?, false)
    }

    fn build(name: TableName, audited: bool) -> Result<FencedTable, InvalidTableName> {
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {name} (\n    key   TEXT   PRIMARY KEY,\n    \
             value BYTEA  NOT NULL,\n    fence BIGINT NOT NULL CHECK (fence >= 0)\n)"
        );
        let upsert = format!(
            "INSERT INTO {name} AS stored (key, value, fence) VALUES ($1, $2, $3)\n\
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence\n    \
             WHERE stored.fence <= EXCLUDED.fence\nRETURNING fence"
        );
        let (create, write, audit) = if audited {
            let audit = TableName::new(&format!("{name}_audit"))?;
            let create = format!(
                "{create};\nCREATE TABLE IF NOT EXISTS {audit} (\n    \
                 seq   BIGINT      GENERATED ALWAYS AS IDENTITY,\n    \
                 key   TEXT        NOT NULL,\n    \
                 fence BIGINT      NOT NULL CHECK (fence >= 0),\n    \
                 at    TIMESTAMPTZ NOT NULL,\n    \
                 PRIMARY KEY (key, seq)\n)"
            );
            // One statement: the audit row is inserted from the upsert's own
            // `RETURNING`, so it exists exactly when the write does, and its `seq` is
            // taken while the write holds the row lock (admission order per key).
            let write = format!(
                "WITH admitted AS (\n{upsert}, key\n)\n\
                 INSERT INTO {audit} (key, fence, at) \
                 SELECT key, fence, clock_timestamp() FROM admitted\nRETURNING seq"
            );
            let read = format!(
                "SELECT seq, fence, at FROM {audit} WHERE key = $1 AND seq > $2 ORDER BY seq"
            );
            (create, write, Some(Audit { name: audit, read }))
        } else {
            (create, upsert, None)
        };
        Ok(FencedTable {
            create,
            write,
            newest: format!("SELECT fence FROM {name} WHERE key = $1"),
            read: format!("SELECT value, fence FROM {name} WHERE key = $1"),
            name,
            timeout: DEFAULT_TIMEOUT,
            audit,
        })
    }

    /// Turns the audit of admitted writes on (or off): each admitted write also
    /// inserts a row (`seq`, `key`, `fence`, `at`) into the table `<name>_audit`,
    /// which [`create`](Self::create) creates too and [`audit`](Self::audit) reads
    /// back, in admission order, for [`check_order`](crate::check_order).
    ///
    /// It costs one more row per admitted write, inserted in the same statement as
    /// the write (a data-modifying `WITH`: see [`write_sql`](Self::write_sql)), so
    /// that the write and its audit row commit together or not at all, even inside a
    /// transaction of yours that rolls back; a refused write costs nothing more. Off
    /// (the default), the statements are exactly those of an unaudited table. The
    /// audit only records writes made through tables with it on, and it grows until
    /// you prune it (`DELETE FROM <name>_audit WHERE seq <= …`).
    ///
    /// `<name>_audit` must fit PostgreSQL's 63 bytes: a name longer than 57 bytes is
    /// an [`InvalidTableName`] naming the audit table.
    ///
    /// ```
    /// use leasehold_storage::postgres::FencedTable;
    /// let table = FencedTable::new("fenced")?.with_audit(true)?;
    /// assert_eq!(table.audit_table().unwrap().as_str(), "fenced_audit");
    /// assert!(FencedTable::new(&"t".repeat(58))?.with_audit(true).is_err());
    /// # Ok::<(), leasehold_storage::InvalidTableName>(())
    /// ```
    pub fn with_audit(self, on: bool) -> Result<FencedTable, InvalidTableName> {
        let timeout = self.timeout;
        Ok(FencedTable::build(self.name, on)?.with_timeout(timeout))
    }

    /// The audit table, if the audit is on ([`with_audit`](Self::with_audit)).
    pub fn audit_table(&self) -> Option<&TableName> {
        self.audit.as_ref().map(|audit| &audit.name)
    }

    /// Bounds each call ([`create`](Self::create), [`write`](Self::write),
    /// [`read`](Self::read), every statement of it together) by `timeout`; past it the
    /// call answers [`Error::Timeout`]. Needs a tokio runtime with its timer, as
    /// `tokio-postgres` does.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> FencedTable {
        self.timeout = timeout;
        self
    }

    /// `call` under the table's timeout.
    async fn bounded<T>(
        &self,
        key: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    key: key.to_owned(),
                    after: self.timeout,
                })
            })
    }

    /// The table's name.
    pub fn name(&self) -> &TableName {
        &self.name
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement (with the audit on, two of them,
    /// separated by `;`), for a migration of your own.
    pub fn create_sql(&self) -> &str {
        &self.create
    }

    /// The guarded upsert every [`write`](Self::write) runs (`$1` key, `$2` value,
    /// `$3` fence); with the audit on, inside a `WITH` whose `INSERT` adds the audit
    /// row.
    pub fn write_sql(&self) -> &str {
        &self.write
    }

    /// Creates the table unless it exists (and its audit table, if the audit is on).
    pub async fn create(&self, client: &impl GenericClient) -> Result<(), Error> {
        let create = async {
            client
                .batch_execute(&self.create)
                .await
                .map_err(Error::Postgres)
        };
        self.bounded(self.name.as_str(), create).await
    }

    /// Stores `value` under `key` if `fence` is at least the newest fence admitted
    /// for `key` (equal is admitted), in one statement; otherwise stores nothing and
    /// answers [`FencedWrite::Stale`] with the newest fence.
    pub async fn write(
        &self,
        client: &impl GenericClient,
        key: &str,
        fence: Fence,
        value: &[u8],
    ) -> Result<FencedWrite, Error> {
        let presented = to_sql(fence).map_err(Error::FenceOutOfRange)?;
        self.bounded(
            key,
            self.write_unbounded(client, key, fence, presented, value),
        )
        .await
    }

    async fn write_unbounded(
        &self,
        client: &impl GenericClient,
        key: &str,
        fence: Fence,
        presented: i64,
        value: &[u8],
    ) -> Result<FencedWrite, Error> {
        for _ in 0..ATTEMPTS {
            let admitted = client
                .query_opt(&self.write, &[&key, &value, &presented])
                .await
                .map_err(Error::Postgres)?;
            if admitted.is_some() {
                return Ok(FencedWrite::Written);
            }
            let newest = client
                .query_opt(&self.newest, &[&key])
                .await
                .map_err(Error::Postgres)?;
            if let Some(row) = newest {
                let newest = stored_fence(key, row.try_get(0).map_err(Error::Postgres)?)?;
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
    pub async fn read(
        &self,
        client: &impl GenericClient,
        key: &str,
    ) -> Result<Option<Fenced>, Error> {
        let read = async {
            client
                .query_opt(&self.read, &[&key])
                .await
                .map_err(Error::Postgres)
        };
        let Some(row) = self.bounded(key, read).await? else {
            return Ok(None);
        };
        let value: Vec<u8> = row.try_get(0).map_err(Error::Postgres)?;
        let fence = stored_fence(key, row.try_get(1).map_err(Error::Postgres)?)?;
        Ok(Some(Fenced { value, fence }))
    }

    /// Every write to `key` this table's audit recorded, in admission order (by
    /// `seq`), for [`check_order`](crate::check_order). [`Error::NotAudited`] if the
    /// audit is off.
    pub async fn audit(
        &self,
        client: &impl GenericClient,
        key: &str,
    ) -> Result<Vec<Admitted>, Error> {
        self.audit_after(client, key, 0).await
    }

    /// The audit rows of `key` whose `seq` is above `after`, in admission order: the
    /// rows since the last one read.
    pub async fn audit_after(
        &self,
        client: &impl GenericClient,
        key: &str,
        after: i64,
    ) -> Result<Vec<Admitted>, Error> {
        let audit = self.audit.as_ref().ok_or_else(|| Error::NotAudited {
            table: self.name.to_string(),
        })?;
        let read = async {
            client
                .query(&audit.read, &[&key, &after])
                .await
                .map_err(Error::Postgres)
        };
        self.bounded(key, read)
            .await?
            .iter()
            .map(|row| {
                let fence = stored_fence(key, row.try_get(1).map_err(Error::Postgres)?)?;
                Ok(Admitted::new(
                    row.try_get(0).map_err(Error::Postgres)?,
                    fence,
                    row.try_get(2).map_err(Error::Postgres)?,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_admits_an_equal_fence() {
        let table = FencedTable::new("t").unwrap();
        assert!(table
            .write_sql()
            .contains("WHERE stored.fence <= EXCLUDED.fence"));
        assert!(table
            .create_sql()
            .starts_with("CREATE TABLE IF NOT EXISTS t ("));
        assert!(FencedTable::new("t; --").is_err());
    }

    #[test]
    fn the_audit_is_off_by_default_and_on_wraps_the_same_upsert() {
        let plain = FencedTable::new("t").unwrap();
        assert_eq!(
            plain.write_sql(),
            "INSERT INTO t AS stored (key, value, fence) VALUES ($1, $2, $3)\n\
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence\n    \
             WHERE stored.fence <= EXCLUDED.fence\nRETURNING fence",
            "off, the statement is the unaudited one"
        );
        assert!(plain.audit_table().is_none());
        let audited = plain.clone().with_audit(true).unwrap();
        assert!(audited
            .write_sql()
            .starts_with("WITH admitted AS (\nINSERT INTO t AS stored"));
        assert!(audited
            .write_sql()
            .contains("WHERE stored.fence <= EXCLUDED.fence"));
        assert!(audited.write_sql().ends_with(
            "INSERT INTO t_audit (key, fence, at) SELECT key, fence, clock_timestamp() \
             FROM admitted\nRETURNING seq"
        ));
        assert!(audited
            .create_sql()
            .contains("CREATE TABLE IF NOT EXISTS t_audit ("));
        let off = audited.with_audit(false).unwrap();
        assert_eq!(
            (off.write_sql(), off.create_sql()),
            (plain.write_sql(), plain.create_sql())
        );

        let longest = "t".repeat(57);
        assert!(FencedTable::new(&longest).unwrap().with_audit(true).is_ok());
        let err = FencedTable::new(&format!("{longest}u"))
            .unwrap()
            .with_audit(true)
            .unwrap_err();
        assert_eq!(err.name, format!("{longest}u_audit"));
    }
}
