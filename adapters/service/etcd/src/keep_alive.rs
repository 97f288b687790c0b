//! One persistent `LeaseKeepAlive` stream per etcd lease, so a renewal costs one
//! message each way instead of a new gRPC stream (and two keep-alives) each time.
//!
//! The rule that keeps it correct: **an answer read from a stream is the answer to
//! the one request that is outstanding on it.** etcd answers the keep-alives of one
//! stream one by one, in order. A stream is kept in the table only *between*
//! exchanges, after its request's answer was read: an exchange takes the stream out
//! of its slot, and puts it back only when it read that answer. An exchange that does
//! not finish (the request timeout fired, the caller dropped the renewal, the stream
//! broke) drops the stream with it, so a late answer to an abandoned request can never
//! be read as the answer to a later one, whose deadline counts from a later send time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use etcd_client::{Client, LeaseKeepAliveResponse, LeaseKeepAliveStream, LeaseKeeper};

/// A lease's stream, between two exchanges (no request outstanding on it).
struct Idle {
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
}

impl Idle {
    /// Sends one keep-alive and reads its answer (`None`: the stream closed).
    async fn exchange(&mut self) -> Result<Option<LeaseKeepAliveResponse>, etcd_client::Error> {
        self.keeper.keep_alive().await?;
        self.answers.message().await
    }
}

/// The slot of one lease: its idle stream, if it has one. The async mutex orders the
/// renewals of one lease (the driver sends one at a time anyway).
type Slot = Arc<tokio::sync::Mutex<Option<Idle>>>;

/// The keep-alive streams of the leases a service renews, by etcd lease id.
#[derive(Default)]
pub(crate) struct KeepAlives {
    slots: Mutex<HashMap<i64, Slot>>,
}

impl KeepAlives {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Slot>> {
        // Entries are inserted and removed whole: a poisoned lock is still usable.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, lease: i64) -> Slot {
        self.slots().entry(lease).or_default().clone()
    }

    /// Closes `lease`'s stream (the grant was released or lost): its slot goes, and
    /// the stream with it once no exchange holds it.
    pub(crate) fn close(&self, lease: i64) {
        self.slots().remove(&lease);
    }

    /// How many leases have a slot (for tests and `Debug`).
    pub(crate) fn len(&self) -> usize {
        self.slots().len()
    }

    /// One keep-alive of `lease` and its answer: on the lease's idle stream if it has
    /// one, else (or if that stream turns out broken) on a new stream. `None`: a stream
    /// closed without an answer. A `ttl` ≤ 0 in the answer means etcd has no such
    /// lease; that stream is not kept.
    ///
    /// Every answer returned comes from a keep-alive sent after this call began. Not
    /// bounded here: the caller bounds it, and dropping it mid-exchange is safe (see the
    /// module doc).
    pub(crate) async fn keep_alive(
        &self,
        mut client: Client,
        lease: i64,
    ) -> Result<Option<LeaseKeepAliveResponse>, etcd_client::Error> {
        let slot = self.slot(lease);
        let mut slot = slot.lock().await;
        if let Some(mut stream) = slot.take() {
            match stream.exchange().await {
                Ok(Some(answer)) => {
                    if answer.ttl() > 0 {
                        *slot = Some(stream);
                    }
                    return Ok(Some(answer));
                }
                // Closed or broken (etcd restarted, the connection was cut): a new
                // stream, once. Its answer is to a keep-alive sent after this call
                // began, like the one lost.
                Ok(None) | Err(_) => {
                    tracing::trace!(lease, "keep-alive stream broken; opening another");
                }
            }
        }
        // etcd-client's `lease_keep_alive` sends a first keep-alive and checks its
        // answer (TTL 0 → "lease not found") but does not hand its TTL over: the second
        // keep-alive's answer is the one reported, a renewal too, sent after the first.
        // Right after a cut, the channel may hand the new stream to the connection
        // that is closing, before it has noticed ("connection closed"): that failure
        // happens before anything reaches etcd, and a second try goes out on a new
        // connection.
        let opened = match client.lease_keep_alive(lease).await {
            Err(etcd_client::Error::GRpcStatus(status))
                if crate::error::is_transport_status(&status) =>
            {
                tracing::trace!(lease, %status, "keep-alive stream not opened; trying again");
                client.lease_keep_alive(lease).await
            }
            opened => opened,
        };
        let (keeper, answers) = opened?;
        let mut stream = Idle { keeper, answers };
        let answer = stream.exchange().await?;
        if answer.as_ref().is_some_and(|a| a.ttl() > 0) {
            *slot = Some(stream);
        }
        Ok(answer)
    }
}
