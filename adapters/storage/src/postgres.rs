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
use crate::{Fenced, FencedWrite, InvalidTableName, TableName};

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
}

impl FencedTable {
    /// The statements for table `name` (a plain identifier: see [`TableName`]).
    pub fn new(name: &str) -> Result<FencedTable, InvalidTableName> {
        let name = TableName::new(name)?;
        Ok(FencedTable {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {name} (\n    key   TEXT   PRIMARY KEY,\n    \
                 value BYTEA  NOT NULL,\n    fence BIGINT NOT NULL CHECK (fence >= 0)\n)"
            ),
            write: format!(
                "INSERT INTO {name} AS stored (key, value, fence) VALUES ($1, $2, $3)\n\
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence\n    \
                 WHERE stored.fence <= EXCLUDED.fence\nRETURNING fence"
            ),
            newest: format!("SELECT fence FROM {name} WHERE key = $1"),
            read: format!("SELECT value, fence FROM {name} WHERE key = $1"),
            name,
            timeout: DEFAULT_TIMEOUT,
        })
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

    /// The `CREATE TABLE IF NOT EXISTS` statement, for a migration of your own.
    pub fn create_sql(&self) -> &str {
        &self.create
    }

    /// The guarded upsert every [`write`](Self::write) runs (`$1` key, `$2` value,
    /// `$3` fence).
    pub fn write_sql(&self) -> &str {
        &self.write
    }

    /// Creates the table unless it exists.
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
}
