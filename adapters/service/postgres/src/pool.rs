//! A few connections, each shared by the requests it carries (`tokio-postgres`
//! pipelines them), reconnected on demand.
//!
//! A request takes the connection with the fewest requests in flight, so one held up
//! (an acquire waiting for a row lock that a lease-checked transaction holds, a
//! connection stalled in the network) does not hold up the others. A connection whose
//! request did not finish (it timed out, or its future was dropped) is dropped from
//! its slot: the next request there connects afresh, and nothing that was sent on the
//! old one can answer a later request. The requests still on it finish or time out
//! on their own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_postgres::{Client, Config, NoTls};

/// The connections of one service.
pub(crate) struct Pool {
    config: Config,
    slots: Vec<Slot>,
}

struct Slot {
    client: Mutex<Option<Arc<Client>>>,
    /// Serializes connecting, so a burst of requests makes one connection.
    connecting: tokio::sync::Mutex<()>,
    in_flight: AtomicUsize,
}

/// A request's hold on one slot: counts it in flight, and drops the slot's
/// connection unless [`finish`](Self::finish) says the request ended cleanly.
pub(crate) struct Lease<'a> {
    slot: &'a Slot,
    client: Option<Arc<Client>>,
    clean: bool,
}

impl Pool {
    pub(crate) fn new(config: Config, size: usize) -> Pool {
        Pool {
            config,
            slots: (0..size.max(1))
                .map(|_| Slot {
                    client: Mutex::new(None),
                    connecting: tokio::sync::Mutex::new(()),
                    in_flight: AtomicUsize::new(0),
                })
                .collect(),
        }
    }

    /// The slot with the fewest requests in flight (the first of those).
    pub(crate) fn pick(&self) -> Lease<'_> {
        let slot = self
            .slots
            .iter()
            .min_by_key(|s| s.in_flight.load(Ordering::Relaxed))
            .unwrap_or_else(|| unreachable!("a pool has at least one slot"));
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        Lease {
            slot,
            client: None,
            clean: false,
        }
    }

    /// How many slots hold an open connection.
    pub(crate) fn open(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.current().is_some_and(|c| !c.is_closed()))
            .count()
    }

    /// A connection of our own, outside the slots (the caller bounds the wait).
    pub(crate) async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "PostgreSQL connection ended");
            }
        });
        Ok(client)
    }
}

impl Slot {
    fn current(&self) -> Option<Arc<Client>> {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Lease<'_> {
    /// The slot's connection, connected first if it has none (or a closed one).
    pub(crate) async fn client(
        &mut self,
        pool: &Pool,
    ) -> Result<Arc<Client>, tokio_postgres::Error> {
        if let Some(client) = self.slot.current().filter(|c| !c.is_closed()) {
            self.client = Some(Arc::clone(&client));
            return Ok(client);
        }
        let _one = self.slot.connecting.lock().await;
        if let Some(client) = self.slot.current().filter(|c| !c.is_closed()) {
            self.client = Some(Arc::clone(&client));
            return Ok(client);
        }
        let client = Arc::new(pool.connect().await?);
        *self
            .slot
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&client));
        self.client = Some(Arc::clone(&client));
        Ok(client)
    }

    /// The request ended with an answer (or an error that left the connection as it
    /// was): keep the connection unless it closed.
    pub(crate) fn finish(mut self) {
        self.clean = self.client.as_ref().is_none_or(|c| !c.is_closed());
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.clean {
            return;
        }
        if let Some(mine) = &self.client {
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
