//! The service: scripts by SHA and the typed calls.

use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::future::{Either, FutureExt};
use leasehold::{Duration, Fence, Holder, Identity, OwnerToken};
use leasehold_storage::{Fenced, FencedWrite};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{ErrorKind, ServerErrorKind, ToRedisArgs, Value};

use crate::bounded::Bounded;
use crate::error::{Op, ProtocolError, RedisLockError};
use crate::fair;
use crate::keys::{queue_keys, EpochScope, FenceKey, FencedKeys, LockKey};
use crate::place::Place;
use crate::scripts::{self, AcquireReply, ValuePrefix};

/// How many script calls one service (all its clones) keeps on the wire at once by
/// default ([`Builder::max_in_flight`](crate::Builder::max_in_flight)); the rest wait
/// in the client, in order.
///
/// Why: a Redis connection is one queue. Past the server's (or this client's)
/// capacity, an unbounded queue grows until every request in it waits longer than
/// the request timeout; each then times out and is retried while Redis still works
/// through the stale copy, so the work done becomes useless and every lease is lost
/// together. With the bound, the queue on the wire stays short (1,024 scripts are a
/// few milliseconds of Redis's time), a call that runs out of time while waiting here
/// is never sent, and the capacity goes to calls that can still be answered in time.
/// A call whose caller gives up after sending it keeps its place until Redis has run
/// it (a `PING` behind it is answered), so a stalled Redis never queues more than
/// this many calls, whatever the retries.
pub const MAX_IN_FLIGHT: usize = 1024;

/// The longest TTL an acquire may ask for by default, and so the quarantine after
/// Redis lost its data ([`with_max_ttl`](RedisLockService::with_max_ttl)); the same as
/// `leasehold-resp`'s, so that both kinds of client of one Redis agree.
pub const DEFAULT_MAX_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The longest `max_ttl`: Redis's clock in ms plus it must stay an exact Lua number
/// that prints as an integer (under 10^14).
pub(crate) const MAX_QUARANTINE: std::time::Duration = std::time::Duration::from_millis(1 << 43);

/// How long a `WAIT` may take when the service has no request timeout.
const DEFAULT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The script arguments of a call that has none.
const NO_ARGS: &[&str; 0] = &[];

/// A Redis lock service: one connection shared by every lease that uses it.
///
/// Cloning is cheap (the connection and the script table are shared). `C` is any
/// async redis connection: the default [`ConnectionManager`] reconnects on its own
/// after a broken connection; a [`redis::aio::MultiplexedConnection`] works too, or
/// any other [`ConnectionLike`] (a cluster connection: untested here), through
/// [`RedisLockService::from_connection`].
///
/// Requests are `EVALSHA` of scripts loaded once when the service is built; if
/// Redis has forgotten a script (`SCRIPT FLUSH`, a restart, a failover to a replica
/// that never saw it), the request reloads it and is retried once, transparently.
///
/// At most [`MAX_IN_FLIGHT`] calls (or [`with_max_in_flight`](Self::with_max_in_flight))
/// are on the wire at once (all clones together);
/// the rest wait in the client, inside their request timeout, and a call whose time
/// runs out while it waits is never sent.
#[derive(Clone)]
pub struct RedisLockService<C = ConnectionManager> {
    conn: C,
    request_timeout: Option<std::time::Duration>,
    max_ttl: Duration,
    /// Replicas that must have a grant or a renewal before it counts (`WAIT`).
    min_replicas: u32,
    /// First-in, first-out waiting ([`with_fair`](RedisLockService::with_fair)).
    fair: bool,
    /// The client to subscribe to keyspace notifications with (`watch.rs`); set by
    /// [`Builder`](crate::Builder), none on a connection of the caller's.
    notifications: Option<redis::Client>,
    shared: Arc<Shared>,
    /// Permits to have a script call on the wire ([`MAX_IN_FLIGHT`] by default).
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// What every clone shares.
struct Shared {
    /// `host:port`, for error messages.
    endpoint: String,
    acquire: Script,
    renew: Script,
    release: Script,
    holder: Script,
    raise_fence: Script,
    fenced_write: Script,
    /// The fair scripts: loaded on their first use (`NOSCRIPT`), so a service that is
    /// not fair loads nothing more.
    fair_acquire: Script,
    waiting: Script,
    reloads: AtomicU64,
    /// Where each lock's epoch marker lives.
    epoch: EpochScope,
}

struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    fn new(source: &'static str) -> Script {
        Script {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

impl<C> std::fmt::Debug for RedisLockService<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLockService")
            .field("endpoint", &self.shared.endpoint)
            .field("request_timeout", &self.request_timeout)
            .field("max_ttl", &self.max_ttl)
            .field("min_replicas", &self.min_replicas)
            .field("fair", &self.fair)
            .field(
                "script_reloads",
                &self.shared.reloads.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// The answer to [`RedisLockService::try_acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquired {
    /// The key is ours.
    Granted {
        /// Strictly greater than every fence granted before for this key (as long as
        /// the counter survives: see the crate docs on durability).
        fence: Fence,
        /// The TTL applied: the `PX`/`PEXPIRE` argument, whole milliseconds.
        ttl: Duration,
        /// The key already held this very token (an earlier attempt succeeded but
        /// its answer was lost): granted again with the same fence and a fresh TTL.
        regranted: bool,
    },
    /// Somebody else holds it: who, with which fence, for how much longer.
    HeldByAnother(Holder),
    /// Nobody holds it, but Redis may have lost grants that are still alive (it
    /// restarted, was restored, or a replica took over): nothing is granted for
    /// `remaining` (see [`with_max_ttl`](RedisLockService::with_max_ttl)).
    Quarantined {
        /// Until the quarantine ends, on Redis's clock.
        remaining: Duration,
    },
}

/// The answer to [`RedisLockService::try_renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewed {
    /// The key's expiry is now the handling time + `ttl`.
    Renewed {
        /// The TTL applied: the `PEXPIRE` argument, whole milliseconds, never less
        /// than asked.
        ttl: Duration,
    },
    /// The token does not hold the key with that fence (expired, deleted, taken, or
    /// a newer grant): definitive.
    NotOwner,
}

/// The answer to [`RedisLockService::try_release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The key held this token and was deleted.
    Released,
    /// The token did not hold the key: nothing deleted.
    NotOwner,
}

impl<C> RedisLockService<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Wraps an existing connection (shared with the rest of the application if you
    /// like) and loads the scripts into Redis. No request timeout is set: see
    /// [`with_request_timeout`](Self::with_request_timeout). Error messages name the
    /// server as "the Redis connection"; see [`from_connection_at`](Self::from_connection_at).
    pub async fn from_connection(conn: C) -> Result<RedisLockService<C>, RedisLockError> {
        RedisLockService::from_connection_at(conn, "the Redis connection").await
    }

    /// [`from_connection`](Self::from_connection), naming the server `endpoint`
    /// (e.g. `host:port`) in error messages.
    pub async fn from_connection_at(
        conn: C,
        endpoint: &str,
    ) -> Result<RedisLockService<C>, RedisLockError> {
        RedisLockService::loaded(conn, endpoint, EpochScope::DataSet).await
    }

    /// The service on `conn`, its scripts loaded, keeping epoch markers by `epoch`.
    pub(crate) async fn loaded(
        conn: C,
        endpoint: &str,
        epoch: EpochScope,
    ) -> Result<RedisLockService<C>, RedisLockError> {
        let service = RedisLockService::unloaded(conn, endpoint, epoch);
        let shared = &service.shared;
        for script in [
            &shared.acquire,
            &shared.renew,
            &shared.release,
            &shared.holder,
            &shared.raise_fence,
            &shared.fenced_write,
        ] {
            service.load(Op::Connect, script).await?;
        }
        Ok(service)
    }

    /// The service on `conn`, the scripts not loaded: the first `EVALSHA` of each
    /// meets `NOSCRIPT` and loads it.
    pub(crate) fn unloaded(conn: C, endpoint: &str, epoch: EpochScope) -> RedisLockService<C> {
        RedisLockService {
            conn,
            request_timeout: None,
            max_ttl: Duration::from(DEFAULT_MAX_TTL),
            min_replicas: 0,
            fair: false,
            notifications: None,
            shared: Arc::new(Shared {
                endpoint: endpoint.to_owned(),
                acquire: Script::new(scripts::ACQUIRE),
                renew: Script::new(scripts::RENEW),
                release: Script::new(scripts::RELEASE),
                holder: Script::new(scripts::HOLDER),
                raise_fence: Script::new(scripts::RAISE_FENCE),
                fenced_write: Script::new(scripts::FENCED_WRITE),
                fair_acquire: Script::new(&fair::FAIR_ACQUIRE),
                waiting: Script::new(fair::WAITING),
                reloads: AtomicU64::new(0),
                epoch,
            }),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        }
    }

    /// Bounds every typed call by `timeout` (`Duration::MAX`: unbounded, which a
    /// service made from a connection is until this is called).
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.request_timeout = bound(timeout);
        self
    }

    /// The bound on every typed call (`Duration::MAX`: none).
    pub fn request_timeout(&self) -> std::time::Duration {
        self.request_timeout.unwrap_or(std::time::Duration::MAX)
    }

    /// The longest TTL an acquire may ask for (default [`DEFAULT_MAX_TTL`], 30 s); a
    /// longer one is refused before anything is sent
    /// ([`RedisLockError::TtlAboveMax`], a final refusal).
    ///
    /// It is also the **quarantine**: after Redis lost grants that may still be alive
    /// — a restart without persistence or from an older snapshot or a lossy AOF, a
    /// replica promoted before the latest grants reached it, a flushed data set — no
    /// free key is granted for this long, so that every grant Redis may have forgotten
    /// has expired first ([`Acquired::Quarantined`]; see
    /// [`lua::ACQUIRE`](crate::lua::ACQUIRE) for how a loss is recognised). Renewals
    /// of grants that survived go on meanwhile. Give every client of one Redis the
    /// same value, at least the longest TTL any of them asks for: a client with a
    /// shorter one would end a quarantine too early for the others' grants.
    #[must_use]
    pub fn with_max_ttl(mut self, max_ttl: std::time::Duration) -> Self {
        self.max_ttl = Duration::from(max_ttl);
        self
    }

    /// Counts a grant or a renewal only once `replicas` replicas have it
    /// (replication-synchronous grants; default 0: as soon as the primary has it).
    ///
    /// Each acquire and renewal is followed, on the same connection, by
    /// `WAIT replicas <the rest of its request timeout>`: if fewer replicas confirm
    /// the script's writes in time, the outcome is unknown
    /// ([`RedisLockError::TooFewReplicas`], `Indeterminate`) and the lease retries
    /// within its budget. A failover to a replica that confirmed then keeps every
    /// grant: the holder goes on renewing instead of losing its lease (and, without
    /// it, the quarantine still keeps out a second holder). Redis's replication stays
    /// asynchronous for everything else, and `WAIT` counts replicas that received the
    /// writes, not ones that persisted them.
    ///
    /// A `WAIT` holds its connection until the replicas answer (about one round trip
    /// to them), so the connection is busy for that long after every grant and
    /// renewal: measure the rate you need (`benches/replicated.rs`). A `WAIT` that
    /// falls short waits half of what is left of the request timeout, and Redis
    /// notices that on its next event-loop pass (up to 1/`hz`, 100 ms by default,
    /// later): give the service a request timeout of at least 300 ms, and the lease's
    /// config the same (`Config::request_timeout`).
    #[must_use]
    pub fn with_min_replicas(mut self, replicas: u32) -> Self {
        self.min_replicas = replicas;
        self
    }

    /// How many replicas must confirm a grant or a renewal
    /// ([`with_min_replicas`](Self::with_min_replicas)).
    pub fn min_replicas(&self) -> u32 {
        self.min_replicas
    }

    /// Makes every acquire through this service (and its clones made after this) wait
    /// its turn, first in, first out (default `false`: whoever asks first after the
    /// key is freed takes it, as before).
    ///
    /// * **Order.** An acquire that is not granted at once (the key is held, or it is
    ///   free and another contender's turn) takes a place at the back of the key's
    ///   queue, once: a later attempt by the same owner token keeps its place. A free
    ///   key is granted only to the contender in the first live place (or to anyone
    ///   while no place is live), and the grant removes its place. While the key is
    ///   free and it is another contender's turn, the answer is
    ///   [`Acquired::HeldByAnother`] with [`Holder::turn_of`] (fence 0, that
    ///   contender's identity, how long its place lasts).
    /// * **Leaving within the TTL.** Each attempt keeps its place for the TTL it
    ///   asked, on Redis's clock. A lease retries every `retry_interval`, far below
    ///   its TTL, so a live contender keeps its place; one that stops asking (killed,
    ///   gave up, its `max_wait` passed) loses it at most that TTL after its last
    ///   attempt. Asking again after that puts it at the back.
    /// * **What a contender that gives up costs the ones behind it.** Its place stays
    ///   until its deadline: when it reaches the front of the queue before that, a
    ///   free key waits for it, at most the TTL it asked after its last attempt. (A
    ///   release never removes a place.)
    /// * **Everything else is unchanged:** fences, renewals, releases, `holder`, the
    ///   quarantine after a loss of state (checked first, as without it: a free key in
    ///   quarantine answers [`Acquired::Quarantined`] whoever's turn it is), and
    ///   exclusivity, which never depends on the queue: the queue only decides *who*
    ///   may take a free key. The order is the order in which
    ///   Redis ran the contenders' first attempts.
    /// * **Cost.** One script per attempt as without it, which also reads and writes
    ///   the queue: three more keys per lock in its slot ([`QueueKeys`](crate::QueueKeys)),
    ///   each expiring with the longest live place. `false` sends the same script as
    ///   before.
    /// * **Redis Cluster.** The queue keys carry the lock's hash tag, so they live on
    ///   the node that serves the lock, and a `RedisClusterLockService` (feature
    ///   `cluster`: this same type over a cluster connection) queues alike. A failover that loses recent
    ///   writes may lose places (their contenders take new ones at the back) but
    ///   never a grant's exclusivity (the quarantine keeps that).
    ///
    /// All clients of one lock should agree: a client that is not fair ignores the
    /// queue and may take a free key ahead of it.
    #[must_use]
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Whether acquires wait their turn ([`with_fair`](Self::with_fair)).
    pub fn fair(&self) -> bool {
        self.fair
    }

    /// Who waits for lock `name` on a fair service, in arrival order: the identity of
    /// each live place (its deadline not passed on Redis's clock; places whose
    /// deadline passed are left out, as the next grant skips them). Empty when
    /// nobody waits or the service has never been fair for this lock. Changes
    /// nothing.
    ///
    /// Fails with `Refused` (`LEASEHOLD` or `WRONGTYPE`) when the queue keys hold what
    /// the fair acquire never writes.
    pub async fn waiting(&self, name: &str) -> Result<Vec<Identity>, RedisLockError> {
        let op = Op::Waiting;
        let name = checked(op, name)?;
        // All three queue keys (the script reads the first two).
        let value = self
            .eval(op, &self.shared.waiting, queue_keys(name), NO_ARGS)
            .await?;
        fair::parse_waiting(&value).map_err(|e| self.protocol(e))
    }

    /// How many replicas are connected to the primary now (`connected_slaves` of
    /// `INFO replication`; one still in its first sync counts).
    pub async fn connected_replicas(&self) -> Result<u32, RedisLockError> {
        let op = Op::Connect;
        let endpoint = self.shared.endpoint.as_str();
        let call = async {
            let mut conn = self.conn.clone();
            redis::cmd("INFO")
                .arg("replication")
                .query_async::<Value>(&mut conn)
                .await
                .map_err(|e| RedisLockError::from_redis(op, endpoint, e))
        };
        let info = self.bounded(op, call).await?;
        let text = match &info {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes),
            Value::VerbatimString { text, .. } => text.as_str().into(),
            _ => return Err(self.protocol(ProtocolError::new(op, "INFO's text", &info))),
        };
        text.lines()
            .find_map(|line| line.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| self.protocol(ProtocolError::new(op, "connected_slaves in INFO", &info)))
    }

    /// The longest TTL an acquire may ask for, and the quarantine after a loss of
    /// state ([`with_max_ttl`](Self::with_max_ttl)).
    pub fn max_ttl(&self) -> std::time::Duration {
        self.max_ttl.into()
    }

    /// Keeps at most `calls` script calls on the wire at once (all clones made after
    /// this together; default [`MAX_IN_FLIGHT`]); at least 1. Lower it when Redis is
    /// shared with other work, raise it for a remote Redis whose round trip is long
    /// against its service time.
    #[must_use]
    pub fn with_max_in_flight(mut self, calls: usize) -> Self {
        let calls = calls.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        self.in_flight = Arc::new(tokio::sync::Semaphore::new(calls));
        self
    }

    /// Keyspace notifications are subscribed to with `client` (see `watch.rs`).
    pub(crate) fn with_notifications(mut self, client: redis::Client) -> Self {
        self.notifications = Some(client);
        self
    }

    pub(crate) fn notification_client(&self) -> Option<&redis::Client> {
        self.notifications.as_ref()
    }

    /// The connection, for the application's own commands.
    pub fn connection(&self) -> &C {
        &self.conn
    }

    /// Where the service connects (`host:port`), as error messages name it.
    pub fn endpoint(&self) -> &str {
        &self.shared.endpoint
    }

    /// How often a script had to be reloaded after Redis answered `NOSCRIPT`.
    pub fn script_reloads(&self) -> u64 {
        self.shared.reloads.load(Ordering::Relaxed)
    }

    /// Acquires lock `name` for `token`, presenting `identity`, for `ttl` (in whole
    /// milliseconds, rounded up, at least 1 ms: the TTL applied is in the answer), in
    /// one script: the fence counter `{name}:fence` raised (`INCR`, or to Redis's
    /// clock in µs if that is larger) plus `SET {name} <token>\n<fence>\n<identity>
    /// PX ttl`; or, if `token` already holds it, `PEXPIRE` with the same fence.
    pub async fn try_acquire(
        &self,
        name: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: impl Into<Duration>,
    ) -> Result<Acquired, RedisLockError> {
        // std's `Duration` or the core's.
        let ttl: Duration = ttl.into();
        let op = Op::Acquire;
        let name = checked(op, name)?;
        self.within_max_ttl(op, ttl)?;
        let (ms, applied) = leasehold_resp::scripts::ttl_ms(ttl);
        let quarantine = leasehold_resp::scripts::ttl_ms(self.max_ttl).0;
        let encoded = token.encode();
        let epoch = self.epoch_key(name);
        let args = (encoded.as_str(), ms, identity.as_str(), quarantine);
        let (value, replicas) = if self.fair {
            self.eval_replicated(
                op,
                &self.shared.fair_acquire,
                {
                    let (queue, waiters, arrivals) = queue_keys(name);
                    (
                        LockKey(name),
                        FenceKey(name),
                        &*epoch,
                        queue,
                        waiters,
                        arrivals,
                    )
                },
                args,
            )
            .await?
        } else {
            self.eval_replicated(
                op,
                &self.shared.acquire,
                (LockKey(name), FenceKey(name), &*epoch),
                args,
            )
            .await?
        };
        let reply = if self.fair {
            fair::parse_fair_acquire(&value)
        } else {
            scripts::parse_acquire(&value)
        };
        Ok(match reply.map_err(|e| self.protocol(e))? {
            AcquireReply::Granted { fence, regranted } => {
                self.replicated(op, replicas)?;
                Acquired::Granted {
                    fence,
                    ttl: applied,
                    regranted,
                }
            }
            AcquireReply::HeldByAnother(holder) => Acquired::HeldByAnother(holder),
            AcquireReply::Quarantined(remaining) => Acquired::Quarantined { remaining },
        })
    }

    /// Refuses a TTL above `max_ttl`: a grant (or a renewal) longer than the quarantine
    /// could outlive it.
    fn within_max_ttl(&self, op: Op, ttl: Duration) -> Result<(), RedisLockError> {
        if self.max_ttl > Duration::from(MAX_QUARANTINE) {
            return Err(RedisLockError::InvalidRequest {
                op,
                reason: "max_ttl is above 2^43 ms (278 years), the longest quarantine the \
                         scripts can time exactly",
            });
        }
        if ttl > self.max_ttl {
            return Err(RedisLockError::TtlAboveMax {
                op,
                asked: ttl.into(),
                max: self.max_ttl.into(),
            });
        }
        Ok(())
    }

    /// Marks the data set as new: no quarantine before the next grant.
    ///
    /// For a Redis (or Redis Cluster) that has never held a grant of any client — a
    /// new deployment — so that its first grant does not wait
    /// [`max_ttl`](Self::with_max_ttl). Never call
    /// it after Redis lost data, restarted, or failed over: the quarantine is what
    /// keeps a second holder out then. On a cluster it marks every slot (16,384
    /// script calls).
    pub async fn mark_data_set_new(&self) -> Result<(), RedisLockError> {
        let markers: Vec<Cow<'static, str>> = match self.shared.epoch {
            EpochScope::DataSet => vec![Cow::Borrowed(scripts::EPOCH_KEY)],
            #[cfg(feature = "cluster")]
            EpochScope::Slot => (0..16_384u16)
                .map(|slot| Cow::Owned(crate::keys::slot_epoch_key(slot)))
                .collect(),
        };
        // A few hundred at a time: a cluster's 16,384 take about a second.
        for chunk in markers.chunks(256) {
            let mut calls = tokio::task::JoinSet::new();
            for marker in chunk {
                let (service, marker) = (self.clone(), marker.clone());
                calls.spawn(async move { service.mark_new(&marker).await });
            }
            while let Some(marked) = calls.join_next().await {
                marked.map_err(|_| RedisLockError::InvalidRequest {
                    op: Op::MarkNew,
                    reason: "the task marking a slot's epoch panicked",
                })??;
            }
        }
        Ok(())
    }

    /// Writes one epoch marker as [`NEW_EPOCH`](crate::lua::NEW_EPOCH) does.
    async fn mark_new(&self, marker: &str) -> Result<(), RedisLockError> {
        let op = Op::MarkNew;
        let endpoint = self.shared.endpoint.as_str();
        let call = async {
            let mut conn = self.conn.clone();
            redis::cmd("EVAL")
                .arg(scripts::NEW_EPOCH)
                .arg(1)
                .arg(marker)
                .query_async::<Value>(&mut conn)
                .await
                .map_err(|e| RedisLockError::from_redis(op, endpoint, e))
        };
        match self.bounded(op, call).await? {
            Value::Okay => Ok(()),
            other => Err(self.protocol(ProtocolError::new(op, "OK", &other))),
        }
    }

    /// The epoch marker that guards lock `name` (a checked name).
    fn epoch_key(&self, name: &str) -> Cow<'static, str> {
        #[cfg(not(feature = "cluster"))]
        let _ = name;
        match self.shared.epoch {
            EpochScope::DataSet => Cow::Borrowed(scripts::EPOCH_KEY),
            #[cfg(feature = "cluster")]
            EpochScope::Slot => Cow::Owned(crate::keys::slot_epoch_key(crate::keys::slot_of(
                format!("{{{name}}}").as_bytes(),
            ))),
        }
    }
    /// Replaces the expiry of lock `name` with now + `ttl` (whole milliseconds,
    /// rounded up) if `token` still holds it with `fence` (compare-and-`PEXPIRE`;
    /// reads only the lock key).
    pub async fn try_renew(
        &self,
        name: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: impl Into<Duration>,
    ) -> Result<Renewed, RedisLockError> {
        // std's `Duration` or the core's.
        self.renewal(name, token, fence, ttl.into()).await
    }

    /// [`try_renew`](Self::try_renew)'s future, which the lease's driver awaits
    /// directly: the name and TTL are checked when it is called. A plain function,
    /// not an `async fn`, so that the future is the request's alone (see `bounded`).
    pub(crate) fn renewal<'s, 'n>(
        &'s self,
        name: &'n str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renewed, RedisLockError>> + use<'s, 'n, C> {
        let op = Op::Renew;
        let checked = checked(op, name).and_then(|name| {
            self.within_max_ttl(op, ttl)?;
            Ok(name)
        });
        let name = match checked {
            Ok(name) => name,
            Err(e) => return Either::Left(std::future::ready(Err(e))),
        };
        let (ms, applied) = leasehold_resp::scripts::ttl_ms(ttl);
        let prefix = ValuePrefix {
            token,
            fence: Some(fence),
        };
        let request = self.eval_replicated(op, &self.shared.renew, LockKey(name), (prefix, ms));
        Either::Right(request.map(move |answer| {
            let (value, replicas) = answer?;
            Ok(
                if scripts::parse_flag(op, &value).map_err(|e| self.protocol(e))? {
                    self.replicated(op, replicas)?;
                    Renewed::Renewed { ttl: applied }
                } else {
                    Renewed::NotOwner
                },
            )
        }))
    }

    /// Deletes lock `name` if `token` still holds it, whatever the fence
    /// (compare-and-`DEL`).
    pub async fn try_release(
        &self,
        name: &str,
        token: OwnerToken,
    ) -> Result<Released, RedisLockError> {
        let op = Op::Release;
        let name = checked(op, name)?;
        let prefix = ValuePrefix { token, fence: None };
        let value = self
            .eval(op, &self.shared.release, LockKey(name), prefix)
            .await?;
        Ok(
            if scripts::parse_flag(op, &value).map_err(|e| self.protocol(e))? {
                Released::Released
            } else {
                Released::NotOwner
            },
        )
    }

    /// Who holds lock `name` now (identity, fence, remaining TTL from `PTTL`), or
    /// `None` when it is free. Changes nothing.
    pub async fn try_holder(&self, name: &str) -> Result<Option<Holder>, RedisLockError> {
        let op = Op::Holder;
        let name = checked(op, name)?;
        let value = self
            .eval(op, &self.shared.holder, LockKey(name), NO_ARGS)
            .await?;
        scripts::parse_holder(&value).map_err(|e| self.protocol(e))
    }

    /// Raises the fence counter of lock `name` to at least `at_least` and returns it.
    ///
    /// For recovery after Redis lost its data (a restart without persistence, a
    /// failover that lost writes): seed the counter from the newest fence your
    /// storage has admitted, so that the *next* grant's fence is newer than it. Never
    /// lowers the counter, and leaves the lock key alone: a grant that is held keeps
    /// its fence and stays renewable. At most 2^63 - 2, so that `INCR` can grant once
    /// more.
    pub async fn raise_fence(&self, name: &str, at_least: Fence) -> Result<Fence, RedisLockError> {
        let op = Op::RaiseFence;
        let name = checked(op, name)?;
        if at_least.0 > (i64::MAX - 1) as u64 {
            return Err(RedisLockError::InvalidRequest {
                op,
                reason: "the fence counter is a Redis integer: at most 2^63 - 2",
            });
        }
        let value = self
            .eval(op, &self.shared.raise_fence, FenceKey(name), at_least.0)
            .await?;
        scripts::parse_raise_fence(&value).map_err(|e| self.protocol(e))
    }

    /// A reply that does not parse, naming the server.
    fn protocol(&self, e: ProtocolError) -> RedisLockError {
        RedisLockError::Protocol(e.at(&self.shared.endpoint))
    }

    /// `SCRIPT LOAD`, checking that Redis computed the same SHA.
    async fn load(&self, op: Op, script: &Script) -> Result<(), RedisLockError> {
        let mut conn = self.conn.clone();
        let sha: Value = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.source)
            .query_async(&mut conn)
            .await
            .map_err(|e| RedisLockError::from_redis(op, &self.shared.endpoint, e))?;
        match &sha {
            Value::BulkString(b) if b.as_slice() == script.sha.as_bytes() => Ok(()),
            other => Err(self.protocol(ProtocolError::new(
                op,
                "SCRIPT LOAD to answer the script's SHA1",
                other,
            ))),
        }
    }

    /// Writes `value` to fenced resource `name` if `fence` is at least the newest
    /// fence admitted for it (equal is admitted: the same holder writes again), in one
    /// script, atomically with the write; otherwise writes nothing and answers
    /// [`FencedWrite::Stale`] with the newest fence.
    ///
    /// This is storage's side of fencing, for data kept in Redis: send the fence from
    /// the lease's `check()` with every write. The value goes to `{name}:data` and
    /// the newest fence to `{name}:data:fence` ([`FencedKeys`]), one slot; fences are
    /// compared as decimal strings, exact over all of `u64`. The Redis that stores
    /// the data need not be the lock service's: build a second service on it.
    ///
    /// Fails with `InvalidKey` (nothing sent) for a name that breaks the key rules,
    /// and with `Refused` when the fence key holds something that is not a fence.
    pub async fn fenced_write(
        &self,
        name: &str,
        fence: Fence,
        value: &[u8],
    ) -> Result<FencedWrite, RedisLockError> {
        let op = Op::FencedWrite;
        let keys = fenced_keys_of(op, name)?;
        let presented = fence.0.to_string();
        let reply = self
            .eval(
                op,
                &self.shared.fenced_write,
                &[&keys.data, &keys.fence],
                &[presented.as_bytes(), value],
            )
            .await?;
        scripts::parse_fenced_write(fence, &reply).map_err(|e| self.protocol(e))
    }

    /// The value of fenced resource `name` and the fence it was written with (one
    /// `MGET`, so both from the same instant), or `None` before the first write.
    pub async fn fenced_read(&self, name: &str) -> Result<Option<Fenced>, RedisLockError> {
        let op = Op::FencedRead;
        let keys = fenced_keys_of(op, name)?;
        let endpoint = self.shared.endpoint.as_str();
        let call = async {
            let mut conn = self.conn.clone();
            redis::cmd("MGET")
                .arg(&keys.data)
                .arg(&keys.fence)
                .query_async::<Value>(&mut conn)
                .await
                .map_err(|e| RedisLockError::from_redis(op, endpoint, e))
        };
        let reply = self.bounded(op, call).await?;
        let fenced = match &reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Nil, Value::Nil] => return Ok(None),
                [Value::BulkString(value), Value::BulkString(fence)] => std::str::from_utf8(fence)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .map(|fence| Fenced {
                        value: value.clone(),
                        fence: Fence(fence),
                    }),
                _ => None,
            },
            _ => None,
        };
        fenced.map(Some).ok_or_else(|| {
            self.protocol(ProtocolError::new(
                op,
                "both the data and its fence (a decimal u64), or neither",
                &reply,
            ))
        })
    }

    /// A grant or a renewal counts only if `min_replicas` replicas confirmed it:
    /// `replicas` is what `WAIT` answered (`None` when none was asked).
    fn replicated(&self, op: Op, replicas: Option<i64>) -> Result<(), RedisLockError> {
        match replicas {
            Some(confirmed) if confirmed < i64::from(self.min_replicas) => {
                Err(RedisLockError::TooFewReplicas {
                    op,
                    endpoint: self.shared.endpoint.clone(),
                    wanted: self.min_replicas,
                    confirmed: u32::try_from(confirmed).unwrap_or(0),
                })
            }
            _ => Ok(()),
        }
    }

    /// [`eval`](Self::eval), followed on the same connection by `WAIT min_replicas
    /// <time left>` when replicas must confirm: the script's answer and how many
    /// replicas have its writes (and everything before them on this connection).
    fn eval_replicated<'s, K: ToRedisArgs, A: ToRedisArgs>(
        &'s self,
        op: Op,
        script: &'s Script,
        keys: K,
        args: A,
    ) -> impl Future<Output = Result<(Value, Option<i64>), RedisLockError>> + use<'s, K, A, C> {
        let replicas = (self.min_replicas > 0).then_some(self.min_replicas);
        self.run_script(op, script, keys, args, replicas)
    }

    /// `EVALSHA`, reloading the script once on `NOSCRIPT`, bounded by the timeout.
    ///
    /// `keys` and `args` are written straight into the one command buffer (sized for
    /// the usual request up front): the renew path allocates no strings of its own.
    fn eval<'s, K: ToRedisArgs, A: ToRedisArgs>(
        &'s self,
        op: Op,
        script: &'s Script,
        keys: K,
        args: A,
    ) -> impl Future<Output = Result<Value, RedisLockError>> + use<'s, K, A, C> {
        self.run_script(op, script, keys, args, None)
            .map(|answer| answer.map(|(value, _)| value))
    }

    /// `EVALSHA` (and `WAIT replicas …` after it in one pipeline, when asked),
    /// reloading the script once on `NOSCRIPT`, bounded by the timeout.
    ///
    /// `keys` and `args` are written straight into the one command buffer (sized for
    /// the usual request up front): the renew path allocates no strings of its own.
    fn run_script<'s, K: ToRedisArgs, A: ToRedisArgs>(
        &'s self,
        op: Op,
        script: &'s Script,
        keys: K,
        args: A,
        replicas: Option<u32>,
    ) -> impl Future<Output = Result<(Value, Option<i64>), RedisLockError>> + use<'s, K, A, C> {
        // Written before the future: it then holds the command, not the arguments
        // beside it.
        let mut cmd = redis::Cmd::with_capacity(8, 192);
        cmd.arg("EVALSHA")
            .arg(script.sha.as_str())
            .arg(keys.num_of_args())
            .arg(keys)
            .arg(args);
        self.bounded(op, async move {
            // Only a `WAIT` needs the start (for the time left); a clock read costs a
            // renewal more than the rest of its bookkeeping.
            let started = replicas.map(|_| tokio::time::Instant::now());
            let permit = match self.in_flight.try_acquire() {
                Ok(permit) => Some(permit),
                // Every place is taken: wait for one, within the bound.
                // Boxed, as the other rare paths below: a call's future is moved
                // into place on every renewal, and these would triple its size.
                Err(_) => Box::pin(self.wait_for_place(op)).await?,
            };
            let mut conn = self.conn.clone();
            // Taken until Redis answers, even if this call is given up (`place.rs`).
            let place = Place::new(permit, &self.in_flight, &self.conn);
            let answer = match self.send(&mut conn, &cmd, replicas, started).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    Box::pin(self.reload_and_send(op, script, &mut conn, &cmd, replicas, started))
                        .await
                }
                other => {
                    other.map_err(|e| RedisLockError::from_redis(op, &self.shared.endpoint, e))
                }
            };
            place.answered();
            answer
        })
    }

    /// Redis answered `NOSCRIPT`: loads `script` and sends `cmd` once more.
    async fn reload_and_send(
        &self,
        op: Op,
        script: &Script,
        conn: &mut C,
        cmd: &redis::Cmd,
        replicas: Option<u32>,
        started: Option<tokio::time::Instant>,
    ) -> Result<(Value, Option<i64>), RedisLockError> {
        self.shared.reloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(%op, sha = %script.sha, "Redis forgot the script (NOSCRIPT): reloading it");
        self.load(op, script).await?;
        self.send(conn, cmd, replicas, started)
            .await
            .map_err(|e| RedisLockError::from_redis(op, &self.shared.endpoint, e))
    }

    /// A place on the wire once one is free, or a timeout if the bound ran out while
    /// waiting for it (then nothing was sent, and there is nothing for Redis to do).
    async fn wait_for_place(
        &self,
        op: Op,
    ) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, RedisLockError> {
        let started = tokio::time::Instant::now();
        // The semaphore is never closed, so this waits for a permit and never fails.
        let permit = self.in_flight.acquire().await.ok();
        match self.request_timeout {
            Some(after) if started.elapsed() >= after => Err(RedisLockError::Timeout {
                op,
                endpoint: self.shared.endpoint.clone(),
                after,
            }),
            _ => Ok(permit),
        }
    }

    /// `cmd` on `conn`, followed by `WAIT replicas <time left>` in one pipeline when
    /// asked: the answer, and the replicas that confirmed.
    fn send<'a>(
        &'a self,
        conn: &'a mut C,
        cmd: &'a redis::Cmd,
        replicas: Option<u32>,
        started: Option<tokio::time::Instant>,
    ) -> impl Future<Output = redis::RedisResult<(Value, Option<i64>)>> + 'a {
        match (replicas, started) {
            (Some(n), Some(started)) => {
                Either::Left(Box::pin(self.send_and_wait(conn, cmd, n, started)))
            }
            _ => Either::Right(
                cmd.query_async::<Value>(conn)
                    .map(|answer| answer.map(|value| (value, None))),
            ),
        }
    }

    /// `cmd` and `WAIT n <time left>` after it, in one pipeline on `conn`.
    async fn send_and_wait(
        &self,
        conn: &mut C,
        cmd: &redis::Cmd,
        n: u32,
        started: tokio::time::Instant,
    ) -> redis::RedisResult<(Value, Option<i64>)> {
        // Half of what is left of the request timeout: Redis notices a WAIT's timeout
        // on its next event-loop pass, up to 1/hz later (100 ms by default), and the
        // shortfall must still arrive in time. At least 1 ms (WAIT 0 waits forever).
        let left = (self
            .request_timeout
            .unwrap_or(DEFAULT_WAIT)
            .saturating_sub(started.elapsed())
            .as_millis()
            / 2)
        .max(1);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone())
            .cmd("WAIT")
            .arg(n)
            .arg(u64::try_from(left).unwrap_or(u64::MAX));
        let (value, confirmed): (Value, i64) = pipe.query_async(conn).await?;
        Ok((value, Some(confirmed)))
    }

    /// `call`, bounded by the request timeout (counted from its first poll).
    ///
    /// A plain function, not an `async fn`: an `async fn` would keep `call` as an
    /// argument beside the copy inside the timeout, doubling the size of every
    /// request's future, which is moved into place on every renewal.
    pub(crate) fn bounded<'s, T, F>(
        &'s self,
        op: Op,
        call: F,
    ) -> impl Future<Output = Result<T, RedisLockError>> + use<'s, T, F, C>
    where
        F: Future<Output = Result<T, RedisLockError>>,
    {
        match self.request_timeout {
            Some(after) => Either::Left(Bounded::new(call, after, op, &self.shared.endpoint)),
            None => Either::Right(call),
        }
    }
}

/// `name` if it can name a lock ([`leasehold::check_key`]), or why not (refused
/// before sending).
fn checked(op: Op, name: &str) -> Result<&str, RedisLockError> {
    leasehold::check_key(name).map(|()| name).map_err(|error| {
        let key = leasehold_driver::Clipped(name).to_string();
        RedisLockError::InvalidKey { op, key, error }
    })
}

/// The keys of fenced resource `name`, or why `name` cannot be one.
fn fenced_keys_of(op: Op, name: &str) -> Result<FencedKeys, RedisLockError> {
    // The same rules as a lock's name, with the same error.
    let name = checked(op, name)?;
    FencedKeys::new(name).map_err(|error| RedisLockError::InvalidKey {
        op,
        key: name.to_owned(),
        error,
    })
}

/// A request timeout as the service keeps it: `None` for `Duration::MAX`, no bound.
pub(crate) fn bound(timeout: std::time::Duration) -> Option<std::time::Duration> {
    (timeout != std::time::Duration::MAX).then_some(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `request_timeout(Duration::MAX)` is what `None` was: no bound.
    #[test]
    fn the_largest_request_timeout_is_no_bound() {
        let second = std::time::Duration::from_secs(1);
        assert_eq!(bound(std::time::Duration::MAX), None);
        assert_eq!(bound(second), Some(second));
        assert_eq!(
            bound(std::time::Duration::ZERO),
            Some(std::time::Duration::ZERO)
        );
    }

    /// A renewal's future is moved into place on every renewal, and its copies are a
    /// visible part of the client's CPU per renewal (`benches/renew.rs`): keep it from
    /// growing unnoticed. An `async fn` on the request path that takes the call as an
    /// argument (as the request bound once did) keeps two copies of it: 1,160 B.
    #[tokio::test]
    async fn a_renewal_s_future_stays_small() {
        let service = crate::RedisLockService::builder("redis://127.0.0.1:1")
            .connect_lazily()
            .await
            .unwrap();
        let token = leasehold::Owner([0; 16]).token(leasehold::Term(1));
        let ttl = Duration::from_millis(100);
        let renew = leasehold_driver::LockService::renew(&service, "k", token, Fence(1), ttl);
        let size = size_of_val(&renew);
        println!("renewal future: {size} B");
        assert!(size <= 512, "a renewal's future is {size} B");
    }

    /// A renewal's future may be made outside the runtime that runs it
    /// (`runtime.block_on(service.renew(…))`): its request timeout starts when it is
    /// first polled, inside the runtime, not when it is made. Redis is down here, so
    /// the answer is an unknown outcome, within the 300 ms bound.
    #[test]
    fn a_renewal_made_outside_the_runtime_runs_inside_it() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let service = runtime
            .block_on(
                crate::RedisLockService::builder("redis://127.0.0.1:1")
                    .request_timeout(std::time::Duration::from_millis(300))
                    .connect_lazily(),
            )
            .unwrap();
        let token = leasehold::Owner([0; 16]).token(leasehold::Term(1));
        let ttl = Duration::from_millis(100);
        let renew = leasehold_driver::LockService::renew(&service, "k", token, Fence(1), ttl);
        let answer = runtime.block_on(renew);
        assert!(
            matches!(answer, leasehold::RenewOutcome::Indeterminate(_)),
            "{answer:?}"
        );
    }
}
