//! A few connections, each shared by the requests it carries (`tokio-postgres`
//! pipelines them), reconnected on demand.
//!
//! A request takes the connection with the fewest requests in flight, so one held up
//! (an acquire waiting for a row lock that a lease-checked transaction holds, a
//! connection stalled in the network) does not hold up the others.
//!
//! A connection is **stuck** when a request was sent on it more than the request
//! timeout ago and nothing has been answered on it since (requests whose futures were
//! dropped count as unanswered). The next request that picks a stuck connection drops
//! it from its slot and connects afresh; the requests still on the old one finish or
//! time out on their own, and nothing sent on it can answer a later request (each
//! request waits for its own answer). A busy connection that answers slowly is not
//! stuck: replacing connections under load would only add the cost of new backends
//! to it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_postgres::types::{ToSql, Type};
#[cfg(not(feature = "tls"))]
use tokio_postgres::NoTls;
use tokio_postgres::{Client, Config, Row, Statement};

/// One connection, and the statements prepared on it (with
/// `Builder::prepared_statements`), each prepared on first use.
pub(crate) struct Conn {
    pub(crate) client: Client,
    prepared: [tokio::sync::OnceCell<Statement>; 2],
}

/// The statements that may be prepared: the hot ones.
#[derive(Clone, Copy)]
pub(crate) enum Hot {
    Acquire = 0,
    Renew = 1,
}

impl Conn {
    /// Runs `sql` with `params` (each with its type): prepared on this connection
    /// (once, then by name) when `prepared` names it, else as the unnamed statement.
    pub(crate) async fn query(
        &self,
        prepared: Option<Hot>,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let Some(hot) = prepared else {
            return self.client.query_typed(sql, params).await;
        };
        let statement = self.prepared[hot as usize]
            .get_or_try_init(|| {
                let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
                async move { self.client.prepare_typed(sql, &types).await }
            })
            .await?;
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        self.client.query(statement, &values).await
    }
}

/// The connections of one service.
pub(crate) struct Pool {
    config: Arc<Target>,
    slots: Vec<Arc<Slot>>,
    /// The permits to send: `max_in_flight` of them.
    wire: tokio::sync::Semaphore,
    /// The origin of the slots' instants.
    origin: Instant,
    /// The request timeout: how long a connection may leave requests unanswered.
    patience: Duration,
}

struct Slot {
    client: Mutex<Option<Arc<Conn>>>,
    /// Serializes connecting, so a burst of requests makes one connection.
    connecting: tokio::sync::Mutex<()>,
    in_flight: AtomicUsize,
    /// Since when (µs after the pool's origin, plus one) requests have been waiting
    /// on this slot's connection with nothing answered; 0 when none waits.
    unanswered_since: AtomicU64,
}

/// A request's hold on one slot: counts it in flight until dropped.
pub(crate) struct Lease<'a> {
    slot: &'a Arc<Slot>,
    pool: &'a Pool,
    client: Option<Arc<Conn>>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Pool {
    pub(crate) fn new(
        config: Target,
        size: usize,
        max_in_flight: usize,
        patience: Duration,
    ) -> Pool {
        Pool {
            config: Arc::new(config),
            wire: tokio::sync::Semaphore::new(max_in_flight.max(1)),
            slots: (0..size.max(1))
                .map(|_| {
                    Arc::new(Slot {
                        client: Mutex::new(None),
                        connecting: tokio::sync::Mutex::new(()),
                        in_flight: AtomicUsize::new(0),
                        unanswered_since: AtomicU64::new(0),
                    })
                })
                .collect(),
            origin: Instant::now(),
            patience,
        }
    }

    /// Now, as a slot instant (never 0).
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    /// Waits for a permit to send, then takes the slot with the fewest requests in
    /// flight (the first of those); its connection dropped first if it is stuck.
    pub(crate) async fn pick(&self) -> Lease<'_> {
        let permit = self
            .wire
            .acquire()
            .await
            .unwrap_or_else(|_| unreachable!("the semaphore is never closed"));
        let slot = self
            .slots
            .iter()
            .min_by_key(|s| s.in_flight.load(Ordering::Relaxed))
            .unwrap_or_else(|| unreachable!("a pool has at least one slot"));
        let now = self.now();
        let since = slot.unanswered_since.load(Ordering::Acquire);
        let patience = u64::try_from(self.patience.as_micros()).unwrap_or(u64::MAX);
        if since != 0 && now.saturating_sub(since) >= patience {
            tracing::debug!(
                "a PostgreSQL connection answered nothing for {:?}: replaced",
                self.patience
            );
            *slot.client.lock().unwrap_or_else(PoisonError::into_inner) = None;
            slot.unanswered_since.store(0, Ordering::Release);
        }
        slot.in_flight.fetch_add(1, Ordering::AcqRel);
        let _ = slot
            .unanswered_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire);
        Lease {
            slot,
            pool: self,
            client: None,
            _permit: permit,
        }
    }

    /// How many slots hold an open connection.
    pub(crate) fn open(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.current().is_some_and(|c| !c.client.is_closed()))
            .count()
    }

    /// A connection of our own, outside the slots (the caller bounds the wait).
    pub(crate) async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        connect(&self.config).await
    }
}

/// Where and how to connect: the config, and over TLS the connector.
pub(crate) struct Target {
    pub(crate) config: Config,
    #[cfg(feature = "tls")]
    pub(crate) tls: leasehold_storage::postgres::tls::Connector,
}

/// A connection to `target`, its task spawned (the caller bounds the wait).
async fn connect(target: &Target) -> Result<Client, tokio_postgres::Error> {
    #[cfg(feature = "tls")]
    let client = target.tls.connect(&target.config).await?;
    #[cfg(not(feature = "tls"))]
    let client = {
        let (client, connection) = target.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "PostgreSQL connection ended");
            }
        });
        client
    };
    Ok(client)
}

/// Why a slot has no connection to give.
pub(crate) enum NoConnection {
    /// Connecting failed.
    Failed(tokio_postgres::Error),
    /// Connecting took longer than the request timeout (or its task was cancelled,
    /// as the runtime shut down).
    TimedOut,
}

impl Slot {
    fn current(&self) -> Option<Arc<Conn>> {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Lease<'_> {
    /// The slot's connection, connected first if it has none (or a closed one).
    ///
    /// Connecting runs in a task of its own, bounded by the request timeout: a
    /// request given up while it waits (a lease's own timeout is often shorter than a
    /// new connection takes on a loaded machine, or across a failover) leaves the
    /// connection being made to the next request, instead of abandoning it and
    /// starting over each time.
    pub(crate) async fn client(&mut self, pool: &Pool) -> Result<Arc<Conn>, NoConnection> {
        if let Some(conn) = self.slot.current().filter(|c| !c.client.is_closed()) {
            self.client = Some(Arc::clone(&conn));
            return Ok(conn);
        }
        let slot = Arc::clone(self.slot);
        let config = Arc::clone(&pool.config);
        let bound = pool.patience;
        let connecting = tokio::spawn(async move {
            let _one = slot.connecting.lock().await;
            if let Some(conn) = slot.current().filter(|c| !c.client.is_closed()) {
                return Ok(conn);
            }
            let client = match tokio::time::timeout(bound, connect(&config)).await {
                Err(_) => return Err(NoConnection::TimedOut),
                Ok(Err(err)) => return Err(NoConnection::Failed(err)),
                Ok(Ok(client)) => client,
            };
            let conn = Arc::new(Conn {
                client,
                prepared: Default::default(),
            });
            *slot.client.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&conn));
            Ok(conn)
        });
        let conn = connecting.await.map_err(|_| NoConnection::TimedOut)??;
        self.client = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// The request was answered (or failed on its own, connecting included): the
    /// slot made progress. A connection that closed is dropped from the slot.
    pub(crate) fn answered(self) {
        let left = self
            .slot
            .in_flight
            .load(Ordering::Acquire)
            .saturating_sub(1);
        let next = if left == 0 { 0 } else { self.pool.now() };
        self.slot.unanswered_since.store(next, Ordering::Release);
        if let Some(mine) = self.client.as_ref().filter(|c| c.client.is_closed()) {
            let mut held = self
                .slot
                .client
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if held.as_ref().is_some_and(|c| Arc::ptr_eq(c, mine)) {
                *held = None;
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
