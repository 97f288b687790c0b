//! A script call's place in the bound on calls on the wire
//! ([`MAX_IN_FLIGHT`](crate::MAX_IN_FLIGHT)), kept until Redis has run the call, even
//! when its caller gives up first.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The longest a place stays taken after its caller gave up on the call: on a live
/// connection Redis answers every call, so this only bounds a reply that never comes.
/// Meanwhile a stalled Redis gets no more calls than the bound.
const HELD_AFTER_GIVING_UP: Duration = Duration::from_secs(30);

/// A place on the wire, taken for one call. [`answered`](Self::answered) frees it.
/// Dropped unanswered (the request timeout ran out, or the caller dropped the
/// future), it stays taken by a task of its own until Redis answers a `PING` sent
/// behind the call on the same connection: replies come in order, so Redis has run
/// the call by then. A place freed at once would let every round of timeouts add the
/// bound's worth of stale calls to Redis's queue, which the retries of those calls
/// then wait behind.
///
/// On a Redis Cluster connection the `PING` may go to another node than the call, so
/// the place can come back before the call ran. Outside a tokio runtime it comes back
/// at once.
pub(crate) struct Place<'a, C: ConnectionLike + Clone + Send + 'static> {
    permit: Option<SemaphorePermit<'a>>,
    /// Where `permit` came from: a place held past the drop is given back to it.
    places: &'a Arc<Semaphore>,
    conn: &'a C,
}

impl<'a, C: ConnectionLike + Clone + Send + 'static> Place<'a, C> {
    /// The place `permit` gives (taken from `places`), for a call on `conn`.
    pub(crate) fn new(
        permit: Option<SemaphorePermit<'a>>,
        places: &'a Arc<Semaphore>,
        conn: &'a C,
    ) -> Self {
        Place {
            permit,
            places,
            conn,
        }
    }

    /// Redis answered the call (or the connection failed it): the place is free.
    pub(crate) fn answered(mut self) {
        self.permit = None;
    }
}

impl<C: ConnectionLike + Clone + Send + 'static> Drop for Place<'_, C> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Given back by the task, not by the permit, which borrows the semaphore:
        // a call answered in time (nearly all) pays no reference count.
        permit.forget();
        let give_back = GiveBack(Arc::clone(self.places));
        let mut conn = self.conn.clone();
        runtime.spawn(async move {
            let _give_back = give_back;
            let ping = redis::cmd("PING");
            let _ =
                tokio::time::timeout(HELD_AFTER_GIVING_UP, ping.query_async::<Value>(&mut conn))
                    .await;
        });
    }
}

/// One place, given back to its semaphore when dropped: also when the task holding it
/// is dropped unpolled (its runtime shutting down), so no place is ever lost.
struct GiveBack(Arc<Semaphore>);

impl Drop for GiveBack {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}
