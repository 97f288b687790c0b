//! Lease-checked transactions: the user's statements commit only while the lease is
//! the caller's, checked inside the same transaction.
//!
//! [`PostgresLockService::begin_under_lease`] opens a transaction on the caller's own
//! connection and, first thing, takes a `FOR KEY SHARE` lock on the lease row,
//! provided it holds the caller's owner token and fence and has not expired on the
//! server's clock. A contender's acquire starts with `SELECT … FOR UPDATE` of that row,
//! which conflicts with it: the acquire waits until the transaction ends. The holder's
//! own renewals (an `UPDATE` of a non-key column, `FOR NO KEY UPDATE`) do not conflict
//! and go on. [`LeaseTransaction::commit`] checks the row once more (still the
//! caller's, unexpired on the server's clock: nobody else can have taken it, only time
//! can have passed or the holder renewed or released it) and commits; otherwise it
//! rolls back. A write committed through it was therefore committed while nobody else
//! held the lease, with no fence column in the data.
//!
//! What is left of the lease bounds the transaction: `statement_timeout` is set
//! (`SET LOCAL`, through `set_config`) to it and `idle_in_transaction_session_timeout`
//! to a second more, so a holder that stalls inside the transaction (paused, cut off)
//! frees the row a second after its lease would have expired, when PostgreSQL ends its
//! session; one that comes back before that is refused cleanly at its commit.

use std::ops::Deref;

use leasehold::{Fence, OwnerToken};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use crate::error::{ErrorKind, Op, PostgresLockError};
use crate::service::PostgresLockService;

/// A transaction on the caller's connection that commits only under the lease (see
/// [`PostgresLockService::begin_under_lease`]). It derefs to the `tokio-postgres`
/// [`Transaction`] for the caller's statements; dropped without
/// [`commit`](Self::commit), it rolls back.
pub struct LeaseTransaction<'a> {
    tx: Transaction<'a>,
    service: PostgresLockService,
    key: String,
    owner: String,
    fence: i64,
}

impl std::fmt::Debug for LeaseTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTransaction")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl PostgresLockService {
    /// Begins a transaction on `client` (a connection of the caller's, to the same
    /// database as the lease table) in which the lease `key` is locked as `token`'s
    /// grant with `fence` (`LeaseHandle::token()` and the fence `check()` returned).
    ///
    /// Fails with [`ErrorKind::NotHeld`] when the row is not that grant, unexpired,
    /// on the server's clock; with `Timeout` after the request timeout (a contender's
    /// acquire in flight holds the row briefly).
    ///
    /// Contenders wait for the transaction; the holder's renewals do not. It is
    /// bounded by what was left of the lease at its start (a statement running past
    /// it is cancelled by PostgreSQL, an idle transaction ended a second later).
    pub async fn begin_under_lease<'a>(
        &self,
        client: &'a mut Client,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> Result<LeaseTransaction<'a>, PostgresLockError> {
        let not_held = || {
            self.error(Op::Guard, ErrorKind::NotHeld, Some(key))
                .because(format_args!(
                    "the lease row does not hold {token} with {fence}, unexpired: nothing \
                     was written"
                ))
        };
        let Ok(fence) = i64::try_from(fence.0) else {
            return Err(not_held());
        };
        let owner = token.encode().as_str().to_owned();
        let after = self.request_timeout();
        let begin = async {
            let tx = client.transaction().await?;
            let rows = tx
                .query_typed(
                    &self.shared.sql.guard_begin,
                    &[
                        (&key, Type::TEXT),
                        (&owner.as_str(), Type::TEXT),
                        (&fence, Type::INT8),
                    ],
                )
                .await?;
            Ok::<_, tokio_postgres::Error>((tx, rows.is_empty()))
        };
        match tokio::time::timeout(after, begin).await {
            Err(_) => Err(self.error(Op::Guard, ErrorKind::Timeout(after), Some(key))),
            Ok(Err(err)) => Err(self.client_error(Op::Guard, Some(key), err)),
            Ok(Ok((_, true))) => Err(not_held()),
            Ok(Ok((tx, false))) => Ok(LeaseTransaction {
                tx,
                service: self.clone(),
                key: key.to_owned(),
                owner,
                fence,
            }),
        }
    }
}

impl<'a> LeaseTransaction<'a> {
    /// The transaction, for the caller's statements.
    pub fn transaction(&self) -> &Transaction<'a> {
        &self.tx
    }

    /// Checks that the lease row still holds the grant, unexpired, and commits; if it
    /// does not, rolls back and fails with [`ErrorKind::NotHeld`]. Bounded by the
    /// service's request timeout; an error from the `COMMIT` itself (a connection
    /// that broke) leaves its outcome unknown, but a commit that happened happened
    /// under the lease.
    pub async fn commit(self) -> Result<(), PostgresLockError> {
        let LeaseTransaction {
            tx,
            service,
            key,
            owner,
            fence,
        } = self;
        let after = service.request_timeout();
        let finish = async {
            let rows = tx
                .query_typed(
                    &service.shared.sql.guard_check,
                    &[
                        (&key.as_str(), Type::TEXT),
                        (&owner.as_str(), Type::TEXT),
                        (&fence, Type::INT8),
                    ],
                )
                .await?;
            if rows.is_empty() {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.commit().await?;
            Ok::<_, tokio_postgres::Error>(true)
        };
        match tokio::time::timeout(after, finish).await {
            Err(_) => Err(service.error(Op::Guard, ErrorKind::Timeout(after), Some(&key))),
            Ok(Err(err)) => Err(service.client_error(Op::Guard, Some(&key), err)),
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(service
                .error(Op::Guard, ErrorKind::NotHeld, Some(&key))
                .because(
                    "the lease expired (or changed hands) before the commit: rolled back, \
                     nothing was written",
                )),
        }
    }

    /// Rolls the transaction back.
    pub async fn rollback(self) -> Result<(), PostgresLockError> {
        let key = self.key.clone();
        let service = self.service.clone();
        self.tx
            .rollback()
            .await
            .map_err(|e| service.client_error(Op::Guard, Some(&key), e))
    }
}

impl<'a> Deref for LeaseTransaction<'a> {
    type Target = Transaction<'a>;

    fn deref(&self) -> &Transaction<'a> {
        &self.tx
    }
}
