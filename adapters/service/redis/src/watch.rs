//! Following a key's holder without polling: Redis keyspace notifications.
//!
//! Redis publishes an event on `__keyspace@<db>__:<key>` for every change of a key,
//! scripts' changes included, when `notify-keyspace-events` asks for them (off by
//! default). A holder changes by `set` (a grant), `del` (a release), `expired` or
//! `evicted`; a renewal's `expire` never changes it. A service without notifications
//! (or built on a connection of its own, [`RedisLockService::from_connection`], which
//! leaves no client to subscribe with) does not watch: its observers poll.

use futures_util::StreamExt;
use leasehold::Fence;
use redis::aio::ConnectionLike;

use crate::error::{Op, RedisLockError};
use crate::service::RedisLockService;

/// The events `notify-keyspace-events` must include: keyspace events (`K`) of string
/// commands (`$`: `SET`), generic ones (`g`: `DEL`), expiries (`x`) and evictions
/// (`e`); `A` is all classes but key-miss and new-key.
fn notifies(flags: &str) -> bool {
    flags.contains('K')
        && (flags.contains('A') || ['$', 'g', 'x', 'e'].iter().all(|c| flags.contains(*c)))
}

/// Whether a keyspace event may have changed the key's holder.
fn may_change_the_holder(event: &str) -> bool {
    matches!(event, "set" | "del" | "expired" | "evicted")
}

impl<C> RedisLockService<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Waits until the holder of lock `name` may no longer be the grant with fence
    /// `seen` (`None`: nobody), through keyspace notifications. `Ok(false)` at once
    /// when this service cannot watch: Redis sends no keyspace notifications of the
    /// events above (`CONFIG SET notify-keyspace-events K$gxe` turns them on), or
    /// refuses `CONFIG GET`, or the service has no client to subscribe with.
    ///
    /// Subscribes first, then reads the holder (a change before the read is seen by
    /// the read, one after it by the subscription). Connecting, subscribing and the
    /// read are each bounded by the request timeout; the wait itself is not.
    pub async fn watch_holder(
        &self,
        name: &str,
        seen: Option<Fence>,
    ) -> Result<bool, RedisLockError> {
        let op = Op::HolderWatch;
        let Some(client) = self.notification_client() else {
            return Ok(false);
        };
        let endpoint = self.endpoint().to_owned();
        let redis_error = |e| RedisLockError::from_redis(op, &endpoint, e);
        let mut conn = self.connection().clone();
        let flags: Result<Vec<String>, _> = self
            .bounded(op, async {
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("notify-keyspace-events")
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error)
            })
            .await
            .map(Ok)
            .or_else(|e| match e.refusal() {
                // NOPERM, a renamed command: no notifications for us to count on.
                Some(_) => Ok(Err(())),
                None => Err(e),
            })?;
        if !flags.is_ok_and(|flags| flags.get(1).is_some_and(|f| notifies(f))) {
            return Ok(false);
        }
        let mut pubsub = self
            .bounded(op, async {
                client.get_async_pubsub().await.map_err(redis_error)
            })
            .await?;
        let db = client.get_connection_info().redis_settings().db();
        let channel = format!("__keyspace@{db}__:{{{name}}}");
        self.bounded(op, async {
            pubsub.subscribe(&channel).await.map_err(redis_error)
        })
        .await?;
        if self.try_holder(name).await?.map(|holder| holder.fence) != seen {
            return Ok(true);
        }
        let mut events = pubsub.on_message();
        while let Some(message) = events.next().await {
            let event: String = message.get_payload().unwrap_or_default();
            if may_change_the_holder(&event) {
                return Ok(true);
            }
        }
        Err(RedisLockError::from_redis(
            op,
            &endpoint,
            redis::RedisError::from((redis::ErrorKind::Io, "the notification connection closed")),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_must_name_every_event_that_changes_a_holder() {
        for on in ["K$gxe", "AK", "KA", "Kgx$e", "KEA"] {
            assert!(notifies(on), "{on}");
        }
        for off in ["", "E$gxe", "K$gx", "Kg", "EA"] {
            assert!(!notifies(off), "{off}");
        }
    }

    #[test]
    fn a_renewal_is_not_a_change_of_holder() {
        assert!(!may_change_the_holder("expire"));
        for event in ["set", "del", "expired", "evicted"] {
            assert!(may_change_the_holder(event));
        }
    }
}
