//! [`EtcdLockService`]: the typed calls, and the `LockService` impl over them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use etcd_client::proto::{PbKeyValue, PbTxnOpResponse, PbTxnResponse};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp,
};
use leasehold::{AcquireOutcome, Duration, Fence, OwnerToken, ReleaseOutcome, RenewOutcome};
use leasehold_driver::LockService;

use crate::error::{EtcdLockError, Op};

/// etcd's largest lease TTL (`MaxLeaseTTL`), in seconds.
pub const MAX_TTL_SECS: i64 = 9_000_000_000;

/// A lock service on etcd v3: one lease per grant, the key attached to it.
///
/// `Clone` is cheap: clones share the gRPC channel and the table of grants (the etcd
/// lease id of each grant made). See the [crate docs](crate) for what each request
/// does.
#[derive(Clone)]
pub struct EtcdLockService {
    shared: Arc<Shared>,
    request_timeout: Option<std::time::Duration>,
    watch_retry: std::time::Duration,
}

struct Shared {
    client: Client,
    /// The etcd lease behind each grant this service made, by key and token: the
    /// trait passes only key and token, etcd needs the lease id.
    held: Mutex<HashMap<(Box<str>, OwnerToken), Held>>,
}

/// One grant as etcd holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    /// The etcd lease the key is attached to.
    lease: i64,
    /// The key's `create_revision`: the fence.
    revision: i64,
}

impl std::fmt::Debug for EtcdLockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLockService")
            .field("request_timeout", &self.request_timeout)
            .field("grants", &self.grants())
            .finish_non_exhaustive()
    }
}

/// The answer to [`EtcdLockService::try_acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquired {
    /// The key is ours.
    Granted {
        /// The key's `create_revision`: greater than every fence granted before for
        /// this key (etcd revisions only grow, cluster-wide).
        fence: Fence,
        /// The TTL etcd applied: the requested one rounded up to whole seconds, or
        /// etcd's minimum lease TTL if that is longer.
        ttl: Duration,
        /// The etcd lease the key is attached to.
        lease: i64,
        /// `true` if the key already held this token (an earlier attempt whose answer
        /// was lost): its lease was kept alive and its fence answered again.
        regranted: bool,
    },
    /// The key exists and holds another value (another owner, another term of the
    /// same owner, or anything written from outside).
    HeldByAnother,
}

/// Why etcd says a token does not hold a key (any more).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotHeld {
    /// The lease is gone (expired or revoked), and with it the key.
    LeaseGone,
    /// The key does not exist (deleted from outside while the lease lived).
    KeyGone,
    /// The key exists but holds another value, or was deleted and created again, or is
    /// attached to another lease.
    KeyTaken,
}

/// The answer to [`EtcdLockService::try_renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewed {
    /// The lease was kept alive for `ttl` (etcd's TTL for it), and afterwards the key
    /// still held this token, on the same lease, since the grant.
    Extended {
        /// The TTL etcd renewed the lease to.
        ttl: Duration,
    },
    /// Not ours (any more).
    NotOwner(NotHeld),
}

/// The answer to [`EtcdLockService::try_release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The key held this token and was deleted; its lease was revoked (best effort).
    Deleted,
    /// The key did not hold this token: nothing was deleted.
    NotOwner,
}

/// What [`EtcdLockService::watch_revocation`] saw end the grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Revoked {
    /// How it ended.
    pub why: NotHeld,
    /// The etcd revision at which it was seen gone.
    pub revision: i64,
}

/// Settings for [`EtcdLockService`]; start with [`EtcdLockService::builder`].
#[derive(Clone, Debug)]
pub struct Builder {
    endpoints: Vec<String>,
    request_timeout: Option<std::time::Duration>,
    connect_timeout: std::time::Duration,
    keep_alive: Option<(std::time::Duration, std::time::Duration)>,
    require_leader: bool,
    user: Option<(String, String)>,
    watch_retry: std::time::Duration,
    options: Option<ConnectOptions>,
}

impl Builder {
    /// Bound on each etcd call (`None`: unbounded). Default 5 s. A lease driven by
    /// `leasehold-driver` also drops a request after its own request timeout.
    pub fn request_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Bound on establishing a connection to an endpoint. Default 2 s.
    pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// HTTP/2 keep-alive pings (`interval`, `timeout`) so a silently dead connection
    /// (and the revocation watch on it) is noticed. Default `(10 s, 5 s)`; etcd sends
    /// `GOAWAY too_many_pings` to clients that ping more often than its
    /// `--grpc-keepalive-min-time` (5 s by default). `None` disables them.
    pub fn keep_alive(mut self, ping: Option<(std::time::Duration, std::time::Duration)>) -> Self {
        self.keep_alive = ping;
        self
    }

    /// Ask etcd to refuse requests when the member has no leader, instead of letting
    /// them wait (default `true`): a partitioned member answers "no leader" at once,
    /// and its watches are cancelled (then re-established elsewhere).
    pub fn require_leader(mut self, require: bool) -> Self {
        self.require_leader = require;
        self
    }

    /// Authenticate as `name` with `password`.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// Wait after a failed revocation watch before watching again (it doubles up to
    /// 16×). Default 100 ms.
    pub fn watch_retry(mut self, wait: std::time::Duration) -> Self {
        self.watch_retry = wait;
        self
    }

    /// Use these connect options instead of the ones the setters above build (TLS, for
    /// instance); `request_timeout` and `watch_retry` still apply. Do not set a
    /// per-request gRPC timeout in them: it would also cut the revocation watch.
    pub fn connect_options(mut self, options: ConnectOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// Builds the client. The channel connects lazily: an unreachable etcd is not an
    /// error here; requests then fail (as `Transport` or `Timeout`) until it answers.
    pub async fn connect(self) -> Result<EtcdLockService, EtcdLockError> {
        if self.endpoints.is_empty() {
            return Err(EtcdLockError::Config("no endpoints".into()));
        }
        let options = match self.options {
            Some(options) => options,
            None => {
                let mut options = ConnectOptions::new()
                    .with_connect_timeout(self.connect_timeout)
                    .with_require_leader(self.require_leader);
                if let Some((interval, timeout)) = self.keep_alive {
                    options = options.with_keep_alive(interval, timeout);
                }
                if let Some((name, password)) = self.user {
                    options = options.with_user(name, password);
                }
                options
            }
        };
        let client = Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| EtcdLockError::from_client(Op::Connect, e))?;
        Ok(EtcdLockService::from_client(client)
            .with_request_timeout(self.request_timeout)
            .with_watch_retry(self.watch_retry))
    }
}

/// The etcd key as bytes, refused if empty (etcd answers "key is not provided").
fn key_bytes(op: Op, key: &str) -> Result<Vec<u8>, EtcdLockError> {
    if key.is_empty() {
        return Err(EtcdLockError::InvalidRequest {
            op,
            reason: "the key is empty",
        });
    }
    Ok(key.as_bytes().to_vec())
}

/// The TTL to ask etcd for: whole seconds, rounded up, at least 1.
pub fn ttl_secs(ttl: Duration) -> Result<i64, EtcdLockError> {
    let secs = ttl.as_micros().div_ceil(1_000_000).max(1);
    match i64::try_from(secs) {
        Ok(secs) if secs <= MAX_TTL_SECS => Ok(secs),
        _ => Err(EtcdLockError::InvalidRequest {
            op: Op::Grant,
            reason: "the TTL is above etcd's maximum lease TTL (9,000,000,000 s)",
        }),
    }
}

/// A TTL etcd reported, in seconds: positive, or the reply makes no sense.
fn reported_ttl(op: Op, secs: i64) -> Result<Duration, EtcdLockError> {
    match u64::try_from(secs) {
        Ok(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
        _ => Err(EtcdLockError::protocol(
            op,
            format_args!("a positive TTL, etcd answered {secs}"),
        )),
    }
}

impl EtcdLockService {
    /// Settings for a service on `endpoints` (`"127.0.0.1:2379"` or
    /// `"http://host:2379"`; several for a cluster).
    pub fn builder<E: AsRef<str>>(endpoints: impl IntoIterator<Item = E>) -> Builder {
        Builder {
            endpoints: endpoints
                .into_iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
            request_timeout: Some(std::time::Duration::from_secs(5)),
            connect_timeout: std::time::Duration::from_secs(2),
            keep_alive: Some((
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(5),
            )),
            require_leader: true,
            user: None,
            watch_retry: std::time::Duration::from_millis(100),
            options: None,
        }
    }

    /// A service on `endpoints` with the default settings.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
    ) -> Result<EtcdLockService, EtcdLockError> {
        EtcdLockService::builder(endpoints).connect().await
    }

    /// A service on a client you built (5 s request timeout; change it with
    /// [`with_request_timeout`](Self::with_request_timeout)).
    pub fn from_client(client: Client) -> EtcdLockService {
        EtcdLockService {
            shared: Arc::new(Shared {
                client,
                held: Mutex::new(HashMap::new()),
            }),
            request_timeout: Some(std::time::Duration::from_secs(5)),
            watch_retry: std::time::Duration::from_millis(100),
        }
    }

    /// The same service (same channel, same table of grants) with another bound on
    /// each etcd call (`None`: unbounded).
    pub fn with_request_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The same service with another first pause before a failed revocation watch is
    /// tried again (see [`Builder::watch_retry`]).
    pub fn with_watch_retry(mut self, wait: std::time::Duration) -> Self {
        self.watch_retry = wait;
        self
    }

    /// The etcd client (for anything this crate does not do).
    pub fn client(&self) -> &Client {
        &self.shared.client
    }

    /// The etcd lease behind `token`'s grant of `key`, if this service made it and it
    /// has not been released or found lost since.
    pub fn lease_id(&self, key: &str, token: OwnerToken) -> Option<i64> {
        self.lookup(key, token).map(|held| held.lease)
    }

    /// How many grants this service is tracking.
    pub fn grants(&self) -> usize {
        self.table().len()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<(Box<str>, OwnerToken), Held>> {
        // The map is only ever replaced whole-entry; a panic elsewhere cannot leave a
        // half-written entry behind, so a poisoned lock is still usable.
        self.shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lookup(&self, key: &str, token: OwnerToken) -> Option<Held> {
        self.table().get(&(Box::from(key), token)).copied()
    }

    /// Records a grant; an older lease for the same key and token is returned.
    fn remember(&self, key: &str, token: OwnerToken, held: Held) -> Option<Held> {
        self.table()
            .insert((Box::from(key), token), held)
            .filter(|old| old.lease != held.lease)
    }

    fn forget(&self, key: &str, token: OwnerToken) -> Option<Held> {
        self.table().remove(&(Box::from(key), token))
    }

    /// One etcd call, bounded by the request timeout, its error sorted.
    async fn call<T, F, Fut>(&self, op: Op, request: F) -> Result<T, EtcdLockError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.timed(op, request)
            .await?
            .map_err(|e| EtcdLockError::from_client(op, e))
    }

    async fn txn(&self, op: Op, txn: Txn) -> Result<etcd_client::TxnResponse, EtcdLockError> {
        self.call(op, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    async fn get(&self, op: Op, key: &[u8]) -> Result<etcd_client::GetResponse, EtcdLockError> {
        self.call(op, |mut c| {
            let key = key.to_vec();
            async move { c.get(key, None::<GetOptions>).await }
        })
        .await
    }

    async fn revoke(&self, lease: i64) -> Result<(), EtcdLockError> {
        self.call(
            Op::Revoke,
            |mut c| async move { c.lease_revoke(lease).await },
        )
        .await
        .map(drop)
    }

    /// Acquires `key` for `token` for `ttl` (rounded up to whole seconds).
    ///
    /// 1. Read the key. If it exists, no lease is granted: it holds `token` (an
    ///    earlier attempt succeeded but its answer was lost) → keep *its* lease alive,
    ///    check it, and answer its fence again; anything else →
    ///    [`Acquired::HeldByAnother`]. A contender waiting for a held key costs etcd
    ///    one read per attempt, no writes.
    /// 2. Otherwise `LeaseGrant` with the TTL; etcd answers the TTL it applied.
    /// 3. One transaction: if `create_revision(key) == 0`, put `key = token` attached
    ///    to the new lease → [`Acquired::Granted`] with the key's `create_revision` as
    ///    the fence; otherwise (created since the read) read it again and answer as
    ///    in 1, revoking the new lease in the background.
    ///
    /// The granted TTL counts from after the request was sent (the lease is granted, or
    /// kept alive, after it), so a deadline the caller computes from its send time is
    /// never later than etcd's expiry.
    pub async fn try_acquire(
        &self,
        key: &str,
        token: OwnerToken,
        ttl: Duration,
    ) -> Result<Acquired, EtcdLockError> {
        let key_b = key_bytes(Op::Acquire, key)?;
        let secs = ttl_secs(ttl)?;

        let current = self.get(Op::Read, &key_b).await?.0;
        if let Some(kv) = current.kvs.first() {
            return self.already_held(key, &key_b, token, kv).await;
        }

        let grant = self
            .call(
                Op::Grant,
                |mut c| async move { c.lease_grant(secs, None).await },
            )
            .await?;
        if !grant.error().is_empty() {
            return Err(EtcdLockError::Service {
                op: Op::Grant,
                code: "LeaseGrant".into(),
                message: grant.error().to_owned(),
            });
        }
        let lease = grant.id();
        let granted = reported_ttl(Op::Grant, grant.ttl())?;
        if lease == 0 {
            return Err(EtcdLockError::protocol(Op::Grant, "lease id 0"));
        }

        let value = token.encode();
        let txn = Txn::new()
            .when([Compare::create_revision(key_b.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key_b.clone(),
                    value.as_bytes(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(key_b.clone(), None),
            ])
            .or_else([TxnOp::get(key_b.clone(), None)]);
        // On an error the put may have happened: the lease is left alone, for a retry
        // to find (and re-grant) it. Unused, it expires by itself after its TTL.
        let answer = self.txn(Op::Acquire, txn).await?.0;
        if !answer.succeeded {
            // Created since the read.
            self.revoke_in_background(lease, "unused grant");
            let Some(kv) = range_kv(Op::Acquire, &answer, 0)? else {
                // Deleted between the compare and the read cannot happen inside one
                // transaction; the reply is inconsistent.
                return Err(EtcdLockError::protocol(
                    Op::Acquire,
                    "create_revision != 0 but no key in the same transaction",
                ));
            };
            return self.already_held(key, &key_b, token, kv).await;
        }

        let kv = range_kv(Op::Acquire, &answer, 1)?.ok_or_else(|| {
            EtcdLockError::protocol(Op::Acquire, "the key is missing right after its put")
        })?;
        if kv.value != value.as_bytes() || kv.lease != lease || kv.create_revision <= 0 {
            return Err(EtcdLockError::protocol(
                Op::Acquire,
                format_args!(
                    "the key as put (lease {lease}), etcd answered lease {} create_revision {}",
                    kv.lease, kv.create_revision
                ),
            ));
        }
        let held = Held {
            lease,
            revision: kv.create_revision,
        };
        if let Some(old) = self.remember(key, token, held) {
            self.revoke_in_background(old.lease, "superseded grant");
        }
        Ok(Acquired::Granted {
            fence: fence_of(held.revision),
            ttl: granted,
            lease,
            regranted: false,
        })
    }

    /// The acquire answer for a key that exists as `kv`: held by another, or ours from
    /// an earlier attempt (re-granted).
    async fn already_held(
        &self,
        key: &str,
        key_b: &[u8],
        token: OwnerToken,
        kv: &PbKeyValue,
    ) -> Result<Acquired, EtcdLockError> {
        // A key without a lease was not written by this service.
        if kv.value != token.encode().as_bytes() || kv.lease == 0 {
            return Ok(Acquired::HeldByAnother);
        }
        let held = Held {
            lease: kv.lease,
            revision: kv.create_revision,
        };
        if held.revision <= 0 {
            return Err(EtcdLockError::protocol(
                Op::Acquire,
                format_args!("create_revision {}", held.revision),
            ));
        }
        if let Some(old) = self.remember(key, token, held) {
            self.revoke_in_background(old.lease, "superseded grant");
        }
        // Its lease was last kept alive before this request was sent: keep it alive
        // now, so the TTL answered counts from after the send.
        match self.extend(key, key_b, token, held).await? {
            Renewed::Extended { ttl } => Ok(Acquired::Granted {
                fence: fence_of(held.revision),
                ttl,
                lease: held.lease,
                regranted: true,
            }),
            // It went away between the read and the keep-alive: the next attempt will
            // find the key free.
            Renewed::NotOwner(why) => Err(EtcdLockError::Service {
                op: Op::KeepAlive,
                code: "Regrant".into(),
                message: format!("the earlier grant ended while it was re-granted: {why:?}"),
            }),
        }
    }

    /// Renews `token`'s grant of `key`: keeps its lease alive, then checks that the key
    /// still holds `token`, on that lease, with the grant's create revision.
    ///
    /// The keep-alive alone is not enough: a key deleted from outside leaves its lease
    /// alive (and renewable) with nothing attached. The check runs *after* the
    /// keep-alive, so "still ours at the check" means "ours when the lease was
    /// extended" (a key deleted and re-created in between has another create revision).
    ///
    /// A grant this service did not make (another process, or a restarted one) is
    /// looked up by reading the key: if it holds `token`, its lease is adopted.
    pub async fn try_renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> Result<Renewed, EtcdLockError> {
        let key_b = key_bytes(Op::KeepAlive, key)?;
        let held = match self.lookup(key, token) {
            Some(held) => held,
            None => match self.discover(key, &key_b, token).await? {
                Ok(held) => held,
                Err(why) => return Ok(Renewed::NotOwner(why)),
            },
        };
        // The key was deleted and created again for this same token (a late duplicate
        // acquire): a newer grant, which the client holding `fence` cannot write with.
        // Never keep it alive on that client's behalf.
        if i64::try_from(fence.0).ok() != Some(held.revision) {
            return Ok(Renewed::NotOwner(NotHeld::KeyTaken));
        }
        let renewed = self.extend(key, &key_b, token, held).await?;
        Ok(renewed)
    }

    /// Reads the key: the grant it holds for `token`, or why there is none.
    async fn discover(
        &self,
        key: &str,
        key_b: &[u8],
        token: OwnerToken,
    ) -> Result<Result<Held, NotHeld>, EtcdLockError> {
        let answer = self.get(Op::Check, key_b).await?;
        let Some(kv) = answer.0.kvs.first() else {
            return Ok(Err(NotHeld::KeyGone));
        };
        if kv.value != token.encode().as_bytes() || kv.lease == 0 || kv.create_revision <= 0 {
            return Ok(Err(NotHeld::KeyTaken));
        }
        let held = Held {
            lease: kv.lease,
            revision: kv.create_revision,
        };
        tracing::debug!(key, %token, lease = held.lease, "adopted a grant this service did not make");
        self.remember(key, token, held);
        Ok(Ok(held))
    }

    /// Keep-alive of `held.lease`, then the ownership check.
    async fn extend(
        &self,
        key: &str,
        key_b: &[u8],
        token: OwnerToken,
        held: Held,
    ) -> Result<Renewed, EtcdLockError> {
        let ttl = match self.keep_alive(held.lease).await? {
            Some(ttl) => ttl,
            None => {
                self.forget(key, token);
                return Ok(Renewed::NotOwner(NotHeld::LeaseGone));
            }
        };
        let value = token.encode();
        let txn = Txn::new()
            .when([
                Compare::value(key_b, CompareOp::Equal, value.as_bytes()),
                Compare::create_revision(key_b, CompareOp::Equal, held.revision),
                Compare::lease(key_b, CompareOp::Equal, held.lease),
            ])
            .or_else([TxnOp::get(key_b, None)]);
        let answer = self.txn(Op::Check, txn).await?.0;
        if answer.succeeded {
            return Ok(Renewed::Extended { ttl });
        }
        let why = match range_kv(Op::Check, &answer, 0)? {
            None => NotHeld::KeyGone,
            Some(_) => NotHeld::KeyTaken,
        };
        // The lease is ours but holds nothing of ours any more.
        self.forget(key, token);
        self.revoke_in_background(held.lease, "orphaned lease");
        Ok(Renewed::NotOwner(why))
    }

    /// One keep-alive exchange on a fresh stream: `Some(ttl)` if etcd extended the
    /// lease, `None` if it has no such lease.
    ///
    /// A fresh stream per renewal gives one request one answer: on a long-lived stream
    /// the answer to a renewal abandoned by a timeout could be read as the answer to
    /// the next one, whose deadline counts from a later send time.
    ///
    /// etcd-client's `keep_alive` sends the first keep-alive and checks its answer
    /// (TTL 0 → "lease not found") but does not hand its TTL over, so a second
    /// keep-alive goes on the same stream and its answer is the one reported: a
    /// renewal, too, sent after the caller's send time.
    async fn keep_alive(&self, lease: i64) -> Result<Option<Duration>, EtcdLockError> {
        let exchange = |mut c: Client| async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            stream.message().await
        };
        match self.timed(Op::KeepAlive, exchange).await? {
            Ok(Some(answer)) if answer.ttl() > 0 => {
                if answer.id() != lease {
                    return Err(EtcdLockError::protocol(
                        Op::KeepAlive,
                        format_args!(
                            "an answer for lease {lease}, etcd answered for {}",
                            answer.id()
                        ),
                    ));
                }
                reported_ttl(Op::KeepAlive, answer.ttl()).map(Some)
            }
            // TTL 0 (or less) on the stream: etcd has no such lease.
            Ok(Some(_)) => Ok(None),
            Ok(None) => Err(EtcdLockError::Transport {
                op: Op::KeepAlive,
                detail: "the keep-alive stream closed without an answer".into(),
            }),
            // How etcd-client reports TTL 0 on the first answer; confirm it with
            // etcd rather than trust a message.
            Err(etcd_client::Error::LeaseKeepAliveError(message))
                if message == "lease not found" =>
            {
                if self.lease_gone(lease).await? {
                    Ok(None)
                } else {
                    Err(EtcdLockError::protocol(
                        Op::KeepAlive,
                        "the keep-alive stream refused a lease that etcd still lists",
                    ))
                }
            }
            Err(err) => Err(EtcdLockError::from_client(Op::KeepAlive, err)),
        }
    }

    /// Whether etcd has no lease `lease` (`LeaseTimeToLive` answers TTL -1).
    async fn lease_gone(&self, lease: i64) -> Result<bool, EtcdLockError> {
        let answer = self
            .call(Op::TimeToLive, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        Ok(answer.ttl() <= 0)
    }

    /// Releases `token`'s grant of `key`: one transaction deletes the key if it holds
    /// `token`; then the lease is revoked (it holds nothing any more; a failure to
    /// revoke only leaves it to expire by itself). If the transaction fails, the lease
    /// this service knows for the grant is revoked in the background, which deletes the
    /// key too if it is still attached.
    pub async fn try_release(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<Released, EtcdLockError> {
        let key_b = key_bytes(Op::Release, key)?;
        let value = token.encode();
        let txn = Txn::new()
            .when([Compare::value(
                key_b.clone(),
                CompareOp::Equal,
                value.as_bytes(),
            )])
            .and_then([TxnOp::delete(
                key_b.clone(),
                Some(DeleteOptions::new().with_prev_key()),
            )]);
        // Release is the last request of a term: the grant is forgotten whatever the
        // answer, so a failed release leaves nothing behind in this service.
        let known = self.forget(key, token);
        let answer = match self.txn(Op::Release, txn).await {
            Ok(answer) => answer.0,
            Err(err) => {
                // Revoking our own lease deletes the key if it is still attached.
                if let Some(held) = known {
                    self.revoke_in_background(held.lease, "release failed");
                }
                return Err(err);
            }
        };
        if !answer.succeeded {
            if let Some(held) = known {
                self.revoke_in_background(held.lease, "released after loss");
            }
            return Ok(Released::NotOwner);
        }
        let deleted_lease = match answer.responses.first().and_then(|r| r.response.as_ref()) {
            Some(PbTxnOpResponse::ResponseDeleteRange(delete)) => delete
                .prev_kvs
                .first()
                .map(|kv| kv.lease)
                .filter(|&l| l != 0),
            other => {
                return Err(EtcdLockError::protocol(
                    Op::Release,
                    format_args!("a delete response, etcd answered {other:?}"),
                ))
            }
        };
        for lease in deleted_lease
            .into_iter()
            .chain(known.map(|h| h.lease).filter(|&l| Some(l) != deleted_lease))
        {
            if let Err(err) = self.revoke(lease).await {
                tracing::debug!(key, lease, error = %err, "release: revoking the lease failed; it expires by itself");
            }
        }
        Ok(Released::Deleted)
    }

    /// Revokes `lease` in a background task (best effort, bounded by the request
    /// timeout). Outside a tokio runtime nothing is sent: the lease expires by itself.
    fn revoke_in_background(&self, lease: i64, why: &'static str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let service = self.clone();
        runtime.spawn(async move {
            match service.revoke(lease).await {
                Ok(_) => tracing::trace!(lease, why, "revoked"),
                Err(err) => tracing::debug!(lease, why, error = %err, "revoke failed; the lease expires by itself"),
            }
        });
    }

    /// Watches `token`'s grant of `key` (with `fence`, the key's create revision) until
    /// etcd shows it gone: the key deleted (released, expired with its lease, revoked,
    /// deleted from outside), or written by anyone else.
    ///
    /// First reads the key (gone already → answers at once), then watches it from the
    /// revision after that read, so nothing in between is missed. Returns an error if
    /// the read or the watch stream fails, or etcd cancels the watch (compaction, no
    /// leader); the `LockService` impl then watches again after a pause.
    pub async fn watch_revocation(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> Result<Revoked, EtcdLockError> {
        let key_b = key_bytes(Op::Watch, key)?;
        let value = token.encode();
        let revision = i64::try_from(fence.0).unwrap_or(i64::MAX);
        let ours = |kv: &PbKeyValue| kv.value == value.as_bytes() && kv.create_revision == revision;

        let read = self.get(Op::Watch, &key_b).await?.0;
        let read_at = read.header.as_ref().map_or(0, |h| h.revision);
        if read_at <= 0 {
            return Err(EtcdLockError::protocol(
                Op::Watch,
                "a read without a revision",
            ));
        }
        match read.kvs.first() {
            None => {
                return Ok(Revoked {
                    why: NotHeld::KeyGone,
                    revision: read_at,
                })
            }
            Some(kv) if !ours(kv) => {
                return Ok(Revoked {
                    why: NotHeld::KeyTaken,
                    revision: read_at,
                })
            }
            Some(_) => {}
        }

        let options = etcd_client::WatchOptions::new().with_start_revision(read_at + 1);
        // Creating the stream is bounded; the stream itself lives as long as the grant.
        let mut stream = self
            .call(Op::Watch, |mut c| {
                let (key_b, options) = (key_b.clone(), options.clone());
                async move { c.watch(key_b, Some(options)).await }
            })
            .await?;
        loop {
            let answer = match stream.message().await {
                Ok(Some(answer)) => answer.0,
                Ok(None) => {
                    return Err(EtcdLockError::Transport {
                        op: Op::Watch,
                        detail: "the watch stream ended".into(),
                    })
                }
                Err(err) => return Err(EtcdLockError::from_client(Op::Watch, err)),
            };
            for event in &answer.events {
                let Some(kv) = event.kv.as_ref() else {
                    return Err(EtcdLockError::protocol(
                        Op::Watch,
                        "an event without its key",
                    ));
                };
                let why = match event.r#type {
                    // PUT: still ours only if it is our value on our creation.
                    0 if ours(kv) => continue,
                    0 => NotHeld::KeyTaken,
                    // DELETE.
                    1 => NotHeld::KeyGone,
                    other => {
                        return Err(EtcdLockError::protocol(
                            Op::Watch,
                            format_args!("an event of unknown type {other}"),
                        ))
                    }
                };
                return Ok(Revoked {
                    why,
                    revision: kv.mod_revision,
                });
            }
            if answer.canceled {
                return Err(EtcdLockError::Service {
                    op: Op::Watch,
                    code: "WatchCanceled".into(),
                    message: format!(
                        "{} (compact revision {})",
                        answer.cancel_reason, answer.compact_revision
                    ),
                });
            }
        }
    }

    /// One etcd call, bounded by the request timeout; the client's error untouched.
    ///
    /// `request` is called with a handle on the (shared) client, again if the attempt
    /// failed without sending anything: the TCP connection to the member the channel
    /// picked could not be made (a dead member of a cluster; the balancer keeps it
    /// in rotation while it reconnects). Any other failure is final.
    async fn timed<T, F, Fut>(
        &self,
        op: Op,
        mut request: F,
    ) -> Result<Result<T, etcd_client::Error>, EtcdLockError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let attempts = async {
            let mut left = UNSENT_ATTEMPTS;
            loop {
                let answer = request(self.shared.client.clone()).await;
                match &answer {
                    Err(err) if left > 1 && never_sent(err) => {
                        left -= 1;
                        tracing::trace!(%op, error = %err, "not sent (connect failed); trying again");
                    }
                    _ => return answer,
                }
            }
        };
        match self.request_timeout {
            Some(after) => tokio::time::timeout(after, attempts)
                .await
                .map_err(|_| EtcdLockError::Timeout { op, after }),
            None => Ok(attempts.await),
        }
    }
}

/// How many times a request whose connection could not even be made is tried (each
/// attempt may be routed to another member).
const UNSENT_ATTEMPTS: u32 = 4;

/// Whether the request never left this process: the TCP connect failed.
fn never_sent(err: &etcd_client::Error) -> bool {
    let text = match err {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable => {
            crate::error::status_text(status)
        }
        etcd_client::Error::TransportError(e) => crate::error::error_chain(e),
        _ => return false,
    };
    text.contains("tcp connect error")
}

fn log_error(key: &str, token: OwnerToken, err: &EtcdLockError) {
    match err {
        EtcdLockError::Protocol { .. }
        | EtcdLockError::InvalidRequest { .. }
        | EtcdLockError::Config(_) => {
            tracing::error!(key, %token, op = %err.op(), error = %err, "etcd lock request failed");
        }
        _ => tracing::warn!(key, %token, op = %err.op(), error = %err, "etcd lock request failed"),
    }
}

impl LockService for EtcdLockService {
    async fn acquire(&self, key: &str, token: OwnerToken, ttl: Duration) -> AcquireOutcome {
        match self.try_acquire(key, token, ttl).await {
            Ok(Acquired::Granted {
                fence,
                ttl: granted,
                lease,
                regranted,
            }) => {
                tracing::debug!(key, %token, %fence, requested_ms = ttl.as_millis(), granted_ms = granted.as_millis(), lease, regranted, "acquire: granted");
                AcquireOutcome::Granted {
                    fence,
                    ttl: granted,
                }
            }
            Ok(Acquired::HeldByAnother) => {
                tracing::debug!(key, %token, "acquire: held by another");
                AcquireOutcome::HeldByAnother
            }
            Err(err) => {
                log_error(key, token, &err);
                AcquireOutcome::Indeterminate(err.indeterminate())
            }
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        _ttl: Duration,
    ) -> RenewOutcome {
        // etcd renews a lease to the TTL it was granted with; the answer says which.
        match self.try_renew(key, token, fence).await {
            Ok(Renewed::Extended { ttl }) => {
                tracing::trace!(key, %token, ttl_ms = ttl.as_millis(), "renewed");
                RenewOutcome::Renewed { ttl }
            }
            Ok(Renewed::NotOwner(why)) => {
                tracing::info!(key, %token, ?why, "renew: not the owner any more");
                RenewOutcome::NotOwner
            }
            Err(err) => {
                log_error(key, token, &err);
                RenewOutcome::Indeterminate(err.indeterminate())
            }
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        match self.try_release(key, token).await {
            Ok(Released::Deleted) => {
                tracing::debug!(key, %token, "released");
                ReleaseOutcome::Released
            }
            Ok(Released::NotOwner) => {
                tracing::debug!(key, %token, "release: not the owner");
                ReleaseOutcome::NotOwner
            }
            Err(err) => {
                log_error(key, token, &err);
                ReleaseOutcome::Indeterminate(err.indeterminate())
            }
        }
    }

    /// Completes when etcd shows the grant gone (see
    /// [`watch_revocation`](EtcdLockService::watch_revocation)). A failed watch is
    /// retried after a pause that doubles from the configured `watch_retry` up to
    /// 16× it; it never completes for an error.
    async fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) {
        let mut pause = self.watch_retry;
        loop {
            match self.watch_revocation(key, token, fence).await {
                Ok(Revoked { why, revision }) => {
                    tracing::info!(key, %token, %fence, ?why, revision, "watch: the grant is gone");
                    return;
                }
                Err(err) => {
                    tracing::debug!(key, %token, op = %err.op(), error = %err, retry_in = ?pause, "revocation watch failed; watching again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(self.watch_retry * 16);
                }
            }
        }
    }
}

/// The `n`th response of a transaction, as the key it read (`None`: no such key).
fn range_kv(
    op: Op,
    answer: &PbTxnResponse,
    n: usize,
) -> Result<Option<&PbKeyValue>, EtcdLockError> {
    match answer.responses.get(n).and_then(|r| r.response.as_ref()) {
        Some(PbTxnOpResponse::ResponseRange(range)) => Ok(range.kvs.first()),
        other => Err(EtcdLockError::protocol(
            op,
            format_args!("a range response at {n}, etcd answered {other:?}"),
        )),
    }
}

fn fence_of(revision: i64) -> Fence {
    Fence(u64::try_from(revision).unwrap_or(0))
}
