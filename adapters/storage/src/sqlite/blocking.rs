//! The SQLite table for async code.

use std::sync::{Arc, Mutex, PoisonError};

use leasehold::Fence;
use rusqlite::Connection;

use super::FencedTable;
use crate::{Admitted, Error, Fenced, FencedWrite};

/// A [`FencedTable`] and the one SQLite connection it writes through, for async code:
/// each call runs on tokio's blocking pool (`spawn_blocking`), so a write that waits
/// for SQLite's lock never holds up the runtime's workers. Calls on one value (and its
/// clones) take turns on the connection; for writers in parallel, give each its own
/// connection (SQLite still decides them one at a time against the committed newest
/// fence).
///
/// Dropping a call's future does not stop its statement: a write that started runs to
/// the end, and its fence guard decides it as if it had been awaited.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use leasehold_storage::sqlite::{AsyncFencedTable, FencedTable};
/// use leasehold_storage::{Fence, FencedWrite};
///
/// let conn = rusqlite::Connection::open_in_memory()?;
/// let table = AsyncFencedTable::new(FencedTable::new("fenced")?, conn);
/// table.create().await?;
/// assert_eq!(table.write("orders", Fence(9), b"v1".to_vec()).await?, FencedWrite::Written);
/// assert_eq!(
///     table.write("orders", Fence(7), b"late".to_vec()).await?,
///     FencedWrite::Stale { presented: Fence(7), newest: Fence(9) }
/// );
/// assert_eq!(table.read("orders").await?.unwrap().value, b"v1");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct AsyncFencedTable {
    table: Arc<FencedTable>,
    conn: Arc<Mutex<Connection>>,
}

impl AsyncFencedTable {
    /// `table` over `conn` (give it a busy timeout if other connections write too).
    pub fn new(table: FencedTable, conn: Connection) -> AsyncFencedTable {
        AsyncFencedTable {
            table: Arc::new(table),
            conn: Arc::new(Mutex::new(conn)),
        }
    }

    /// The statements.
    pub fn table(&self) -> &FencedTable {
        &self.table
    }

    /// [`FencedTable::create`], on the blocking pool.
    pub async fn create(&self) -> Result<(), Error> {
        let key = self.table.name().to_string();
        self.run(key, |table, conn| table.create(conn)).await
    }

    /// [`FencedTable::write`], on the blocking pool.
    pub async fn write(
        &self,
        key: &str,
        fence: Fence,
        value: Vec<u8>,
    ) -> Result<FencedWrite, Error> {
        let owned = key.to_owned();
        self.run(key.to_owned(), move |table, conn| {
            table.write(conn, &owned, fence, &value)
        })
        .await
    }

    /// [`FencedTable::read`], on the blocking pool.
    pub async fn read(&self, key: &str) -> Result<Option<Fenced>, Error> {
        let owned = key.to_owned();
        self.run(key.to_owned(), move |table, conn| table.read(conn, &owned))
            .await
    }

    /// [`FencedTable::audit`], on the blocking pool (build the table with
    /// [`FencedTable::with_audit`]).
    pub async fn audit(&self, key: &str) -> Result<Vec<Admitted>, Error> {
        self.audit_after(key, 0).await
    }

    /// [`FencedTable::audit_after`], on the blocking pool.
    pub async fn audit_after(&self, key: &str, after: i64) -> Result<Vec<Admitted>, Error> {
        let owned = key.to_owned();
        self.run(key.to_owned(), move |table, conn| {
            table.audit_after(conn, &owned, after)
        })
        .await
    }

    /// Runs `call` on the blocking pool with the connection.
    async fn run<T: Send + 'static>(
        &self,
        key: String,
        call: impl FnOnce(&FencedTable, &Connection) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let (table, conn) = (Arc::clone(&self.table), Arc::clone(&self.conn));
        let task = tokio::task::spawn_blocking(move || {
            // A call that panicked left the connection as SQLite left it (each
            // statement is atomic, and an audited write's transaction rolls back as
            // it unwinds): the next call may use it.
            let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            call(&table, &conn)
        });
        task.await.map_err(|_| Error::TaskFailed { key })?
    }
}
