//! [`EtcdLockService`]: its settings, its table of grants, and the bounded etcd calls
//! the requests (`requests.rs`) are made of.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use etcd_client::{Client, ConnectOptions, GetOptions, Txn};
use leasehold::{Duration, Fence, Holder, OwnerToken};

use crate::checks::Checks;
use crate::epoch::Memory;
use crate::error::{ErrorKind, EtcdLockError, Op};
use crate::keep_alive::KeepAlives;

/// etcd's largest lease TTL (`MaxLeaseTTL`), in seconds.
pub const MAX_TTL_SECS: i64 = 9_000_000_000;

/// The default bound on each etcd call.
const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest TTL an acquire may ask for by default, and so the quarantine after etcd
/// lost grants ([`Builder::max_ttl`]); the same as the Redis services'.
pub const DEFAULT_MAX_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// A lock service on etcd v3: one lease per grant, the key attached to it.
///
/// `Clone` is cheap: clones share the gRPC channel and the table of grants (the etcd
/// lease id of each grant made). See the [crate docs](crate) for what each request
/// does.
#[derive(Clone)]
pub struct EtcdLockService {
    pub(crate) shared: Arc<Shared>,
    pub(crate) request_timeout: std::time::Duration,
    pub(crate) watch_retry: std::time::Duration,
    pub(crate) max_ttl: Duration,
    /// Whether acquires wait in arrival order (see [`with_fair`](Self::with_fair)).
    pub(crate) fair: bool,
}

/// Entries by key and owner token: the trait passes only key and token, etcd needs
/// the lease id. Entries are inserted and removed whole.
pub(crate) struct Table<V>(Mutex<HashMap<(Box<str>, OwnerToken), V>>);

impl<V: Copy> Table<V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Box<str>, OwnerToken), V>> {
        // The map is only ever replaced whole-entry; a panic elsewhere cannot leave a
        // half-written entry behind, so a poisoned lock is still usable.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, key: &str, token: OwnerToken) -> Option<V> {
        self.lock().get(&(Box::from(key), token)).copied()
    }

    fn insert(&self, key: &str, token: OwnerToken, value: V) -> Option<V> {
        self.lock().insert((Box::from(key), token), value)
    }

    fn remove(&self, key: &str, token: OwnerToken) -> Option<V> {
        self.lock().remove(&(Box::from(key), token))
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Removes every entry `stale` says so of, and returns them.
    pub(crate) fn remove_where(&self, stale: impl Fn(&V) -> bool) -> Vec<V> {
        let mut removed = Vec::new();
        self.lock().retain(|_, value| {
            let keep = !stale(value);
            if !keep {
                removed.push(*value);
            }
            keep
        });
        removed
    }
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table(Mutex::new(HashMap::new()))
    }
}

/// What a [`Table`] holds: something attached to an etcd lease.
pub(crate) trait OnLease: Copy {
    fn lease(&self) -> i64;
}

pub(crate) struct Shared {
    pub(crate) client: Client,
    /// The endpoints, as configured: named in every error.
    pub(crate) endpoints: Arc<str>,
    /// The etcd lease behind each grant this service made, by key and token.
    pub(crate) held: Table<Held>,
    /// The etcd lease behind each place in a queue this service took (fair
    /// acquires), by key and token.
    pub(crate) waiters: Table<Kept>,
    /// A persistent keep-alive stream per lease renewed, closed when its grant is
    /// forgotten.
    pub(crate) keep_alives: KeepAlives,
    /// Renewals waiting for their ownership read, batched.
    pub(crate) checks: Checks,
    /// What this service saw of etcd's history (see `epoch.rs`).
    pub(crate) memory: Memory,
    /// The epoch marker's and the quarantine's names (see `epoch.rs`).
    pub(crate) marker_key: Box<str>,
    pub(crate) quarantine_key: Box<str>,
    /// Which members are out of the channel's rotation (see `members.rs`).
    pub(crate) rotation: crate::members::Rotation,
}

/// A fair contender's place in a key's queue, as etcd holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Waiter {
    /// The etcd lease the queue key is attached to (the TTL the contender asked).
    pub(crate) lease: i64,
    /// The queue key's `create_revision`: the contender's arrival.
    pub(crate) revision: i64,
}

/// A place in a queue this service keeps alive for a contender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kept {
    /// The place's etcd lease.
    pub(crate) lease: i64,
    /// When the place has expired unless its contender asks again (its last
    /// keep-alive or grant, plus its TTL): then the entry goes.
    pub(crate) until: std::time::Instant,
}

impl OnLease for Kept {
    fn lease(&self) -> i64 {
        self.lease
    }
}

impl OnLease for Held {
    fn lease(&self) -> i64 {
        self.lease
    }
}

/// One grant as etcd holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    /// The etcd lease the key is attached to.
    pub(crate) lease: i64,
    /// The key's `create_revision`: which creation of the key the grant is (a key
    /// deleted and put again, even with the same bytes, has another).
    pub(crate) revision: i64,
    /// The grant's fence, stored in the key's value (see `value.rs`).
    pub(crate) fence: u64,
}

impl std::fmt::Debug for EtcdLockService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLockService")
            .field("endpoints", &self.shared.endpoints)
            .field("request_timeout", &self.request_timeout)
            .field("max_ttl", &self.max_ttl)
            .field("fair", &self.fair)
            .field("grants", &self.grants())
            .field("keep_alive_streams", &self.keep_alive_streams())
            .finish_non_exhaustive()
    }
}

/// The answer to [`EtcdLockService::try_acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquired {
    /// The key is ours.
    Granted {
        /// Greater than every fence granted before for this key: the larger of the
        /// key's fence counter + 1 and the client's wall clock in µs since the Unix
        /// epoch (see the crate's README).
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
    /// The key holds another grant: another owner, or another term of the same owner.
    HeldByAnother(Holder),
    /// Nobody holds it, but etcd may have lost grants that are still alive (it was
    /// restored from a backup, or the data set is new or was emptied): nothing is
    /// granted for `remaining` (see [`Builder::max_ttl`]).
    Quarantined {
        /// Until the quarantine ends, as etcd's lease of it says (whole seconds).
        remaining: Duration,
    },
}

/// Why etcd says a token does not hold a key (any more).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotHeld {
    /// The lease is gone (expired or revoked), and with it the key.
    LeaseGone,
    /// The key does not exist (deleted from outside while the lease lived).
    KeyGone,
    /// The key holds another value (another token, or anything written from outside),
    /// or is attached to another lease.
    KeyTaken,
    /// The key holds a newer grant to the same token (deleted and acquired again by a
    /// late duplicate acquire): not the grant with the fence presented.
    NewerGrant,
}

/// The answer to [`EtcdLockService::try_renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewed {
    /// The lease was kept alive; afterwards the key still held this token, on the same
    /// lease, since the grant.
    Renewed {
        /// The TTL the keep-alive applied: the lease's granted TTL (etcd renews a
        /// lease to the TTL it was granted with).
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
    Released,
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
    request_timeout: std::time::Duration,
    connect_timeout: std::time::Duration,
    keep_alive: Option<(std::time::Duration, std::time::Duration)>,
    member_checks: Option<(std::time::Duration, std::time::Duration)>,
    require_leader: bool,
    user: Option<(String, String)>,
    watch_retry: std::time::Duration,
    options: Option<ConnectOptions>,
    max_ttl: std::time::Duration,
    epoch_prefix: String,
    fair: bool,
    #[cfg(feature = "tls")]
    tls: crate::tls::TlsFiles,
}

impl Builder {
    /// Trusts this PEM CA certificate for `https://` endpoints instead of the
    /// system's roots (a private CA, as etcd's `--trusted-ca-file` usually is).
    /// Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate (PEM, with any intermediates after it) and
    /// its PEM private key to `https://` endpoints: mutual TLS, for an etcd started
    /// with `--client-cert-auth`. Both are checked by [`connect`](Self::connect): a
    /// file that is not PEM, or a key that is not the certificate's, fails with
    /// [`ErrorKind::Config`] before anything is sent. Needs the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Bound on each etcd call. Default 5 s; `Duration::MAX` for no bound (the same
    /// type and meaning as Redis's and PostgreSQL's `request_timeout`). A lease
    /// driven by `leasehold-driver` also drops a request after its own request
    /// timeout; this bound is for the typed calls and anything else that awaits the
    /// service directly.
    pub fn request_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Bound on establishing a TCP connection to an endpoint. Default 2 s.
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

    /// With several endpoints, each member is asked for its status every `interval`
    /// on a connection of its own; one that does not answer within `timeout` (killed,
    /// stopped, unreachable) is taken out of the channel's rotation until it answers
    /// again, so that requests stop going to it. Default `(500 ms, 500 ms)`: a dead
    /// or stopped member is avoided within a second. Why: the channel picks a member
    /// at random among those whose connection looks ready, and a stopped member's
    /// does (its kernel still accepts connections), so without these checks it gets a
    /// share of the requests, each waiting for its whole timeout. Any answer counts
    /// (a "no leader" during an election too), and the last member in rotation is
    /// never taken out. `None` disables them; they are off with
    /// [`connect_options`](Self::connect_options) (the probes need options without
    /// a user) and with one endpoint.
    pub fn member_checks(
        mut self,
        checks: Option<(std::time::Duration, std::time::Duration)>,
    ) -> Self {
        self.member_checks = checks;
        self
    }

    /// Ask etcd to refuse requests when the member has no leader, instead of letting
    /// them wait (default `true`): a partitioned member answers "no leader" at once,
    /// and its watches are cancelled (then re-established elsewhere).
    pub fn require_leader(mut self, require: bool) -> Self {
        self.require_leader = require;
        self
    }

    /// Authenticate as `name` with `password` (when etcd has auth enabled).
    /// [`connect`](Self::connect) then authenticates once, and fails with
    /// [`ErrorKind::Unauthorized`] if etcd refuses the credentials.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// The longest TTL an acquire may ask for (default [`DEFAULT_MAX_TTL`], 30 s); a
    /// longer one is refused before anything is sent (`Unsupported`, final).
    ///
    /// It is also the **quarantine**: when etcd may have lost grants that are still
    /// alive (restored from a backup, a new or emptied data set; see the crate docs),
    /// no free key is granted for this long (rounded up to whole seconds), so that
    /// every grant it may have forgotten has expired first
    /// ([`Acquired::Quarantined`]). Give every client of one etcd the same value, at
    /// least the longest TTL any of them asks for.
    pub fn max_ttl(mut self, max_ttl: std::time::Duration) -> Self {
        self.max_ttl = max_ttl;
        self
    }

    /// Where the epoch marker and the quarantine key live: `<prefix>{leasehold}epoch`
    /// and `<prefix>{leasehold}quarantine` (default prefix: none). Set it when etcd's
    /// roles restrict this client to a prefix of keys: the client must be able to
    /// read and write both. Every client of one data set must use the same prefix.
    pub fn epoch_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.epoch_prefix = prefix.into();
        self
    }

    /// Whether acquires wait in arrival order, across processes (default `false`):
    /// see [`EtcdLockService::with_fair`].
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
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
    /// per-request gRPC timeout in them: it would also cut the revocation watch. With
    /// a user, turn on `with_auto_token_refresh(true)` (the setters above do): etcd
    /// forgets tokens on a restart, and JWTs expire.
    pub fn connect_options(mut self, options: ConnectOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// Builds the client.
    ///
    /// Without a user the channel connects lazily: an unreachable etcd is not an error
    /// here; each request then fails (`Transport` or `Timeout`) within the request
    /// timeout until etcd answers. With a user, the authentication is a request: it is
    /// bounded by the connect timeout plus the request timeout.
    ///
    /// Over TLS (`https://` endpoints; the `tls` feature) the files are checked first
    /// ([`ErrorKind::Config`]), and one TLS handshake is made with each endpoint,
    /// bounded like the authentication, so that a handshake that can never succeed (a
    /// certificate refused either way) fails here with [`ErrorKind::Tls`] naming the
    /// cause; an etcd that is merely unreachable is still not an error.
    pub async fn connect(self) -> Result<EtcdLockService, EtcdLockError> {
        let endpoints: Arc<str> = Arc::from(self.endpoints.join(", "));
        if self.endpoints.is_empty() {
            return Err(
                EtcdLockError::new(Op::Connect, ErrorKind::Config, &endpoints)
                    .because("no endpoints given"),
            );
        }
        let options = match self.options.clone() {
            Some(options) => options,
            None => self.built_options(true, &endpoints)?,
        };
        if ttl_secs(Duration::from(self.max_ttl)).is_none() {
            return Err(
                EtcdLockError::new(Op::Connect, ErrorKind::Config, &endpoints).because(
                    format_args!(
                        "max_ttl {:?} is above etcd's maximum lease TTL ({MAX_TTL_SECS} s): the \
                     quarantine could not be timed",
                        self.max_ttl
                    ),
                ),
            );
        }
        let bound = self.connect_timeout.saturating_add(self.request_timeout);
        #[cfg(feature = "tls")]
        if self.uses_tls() {
            self.probe_tls(&endpoints, bound).await?;
        }
        let client = match tokio::time::timeout(
            bound,
            Client::connect(&self.endpoints, Some(options)),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => return Err(EtcdLockError::from_client(Op::Connect, &endpoints, err)),
            Err(_) => {
                return Err(EtcdLockError::new(
                    Op::Connect,
                    ErrorKind::Timeout(Some(bound)),
                    &endpoints,
                ))
            }
        };

        let service =
            EtcdLockService::with_endpoints(client, endpoints.clone(), &self.epoch_prefix)
                .with_request_timeout(self.request_timeout)
                .with_watch_retry(self.watch_retry)
                .with_max_ttl(self.max_ttl)
                .with_fair(self.fair);
        if let (Some((interval, timeout)), None, true) =
            (self.member_checks, &self.options, self.endpoints.len() > 1)
        {
            self.start_member_checks(&service, &endpoints, interval, timeout)
                .await?;
        }
        Ok(service)
    }

    /// The connect options the setters describe; the user's credentials only if
    /// `with_user`.
    fn built_options(
        &self,
        with_user: bool,
        endpoints: &Arc<str>,
    ) -> Result<ConnectOptions, EtcdLockError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_require_leader(self.require_leader);
        if let Some((interval, timeout)) = self.keep_alive {
            options = options.with_keep_alive(interval, timeout);
        }
        if let (Some((name, password)), true) = (self.user.clone(), with_user) {
            // A token can expire (JWT) or be forgotten (a member restart), and
            // then every request would be refused until the process restarts.
            options = options
                .with_user(name, password)
                .with_auto_token_refresh(true);
        }
        #[cfg(feature = "tls")]
        if self.uses_tls() {
            let tls = self.tls.options(self.connect_timeout).map_err(|e| {
                EtcdLockError::new(Op::Connect, ErrorKind::Config, endpoints).because(e)
            })?;
            options = options.with_tls(tls);
        }
        #[cfg(not(feature = "tls"))]
        let _ = endpoints;
        Ok(options)
    }

    /// One client per member (without the user: `Status` needs no credentials, and
    /// the probe must not depend on authenticating), and the tasks that use them to
    /// keep a silent member out of rotation (see `members.rs`).
    async fn start_member_checks(
        &self,
        service: &EtcdLockService,
        endpoints: &Arc<str>,
        interval: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Result<(), EtcdLockError> {
        #[cfg(feature = "tls")]
        let tls = self.uses_tls();
        #[cfg(not(feature = "tls"))]
        let tls = false;
        let options = self
            .built_options(false, endpoints)?
            .with_connect_timeout(self.connect_timeout.min(timeout));
        let mut probes = Vec::with_capacity(self.endpoints.len());
        for endpoint in &self.endpoints {
            let probe = Client::connect([endpoint], Some(options.clone()))
                .await
                .map_err(|err| EtcdLockError::from_client(Op::Connect, endpoints, err))?;
            probes.push(probe);
        }
        let keys = self
            .endpoints
            .iter()
            .map(|e| crate::members::channel_key(e, tls))
            .collect();
        crate::members::start(
            &service.shared,
            self.endpoints.clone(),
            keys,
            probes,
            interval,
            timeout,
        );
        Ok(())
    }
}

#[cfg(feature = "tls")]
impl Builder {
    /// One TLS handshake of its own with each `https://` endpoint, bounded, so that a
    /// certificate refused either way fails `connect` with [`ErrorKind::Tls`] rather
    /// than every request after it (see `TlsFiles::handshake_problem`). An endpoint
    /// that cannot be reached is not an error here: requests wait for it.
    async fn probe_tls(
        &self,
        endpoints: &Arc<str>,
        bound: std::time::Duration,
    ) -> Result<(), EtcdLockError> {
        for endpoint in self.endpoints.iter().filter(|e| e.starts_with("https://")) {
            let probe = self.tls.handshake_problem(endpoint);
            if let Ok(Some((problem, detail))) = tokio::time::timeout(bound, probe).await {
                return Err(
                    EtcdLockError::new(Op::Connect, ErrorKind::Tls(problem), endpoints)
                        .because(detail),
                );
            }
        }
        Ok(())
    }

    /// Whether the client connects over TLS: a CA or client certificate was given, or
    /// an endpoint is `https://`.
    fn uses_tls(&self) -> bool {
        self.tls.root_cert.is_some()
            || self.tls.client.is_some()
            || self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

/// The TTL to ask etcd for: whole seconds, rounded up, at least 1; `None` above
/// etcd's maximum lease TTL.
pub fn ttl_secs(ttl: Duration) -> Option<i64> {
    let secs = ttl.as_micros().div_ceil(1_000_000).max(1);
    i64::try_from(secs)
        .ok()
        .filter(|&secs| secs <= MAX_TTL_SECS)
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
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: std::time::Duration::from_secs(2),
            keep_alive: Some((
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(5),
            )),
            member_checks: Some((
                std::time::Duration::from_millis(500),
                std::time::Duration::from_millis(500),
            )),
            require_leader: true,
            user: None,
            watch_retry: std::time::Duration::from_millis(100),
            options: None,
            max_ttl: DEFAULT_MAX_TTL,
            epoch_prefix: String::new(),
            fair: false,
            #[cfg(feature = "tls")]
            tls: crate::tls::TlsFiles::default(),
        }
    }

    /// A service on `endpoints` with the default settings.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
    ) -> Result<EtcdLockService, EtcdLockError> {
        EtcdLockService::builder(endpoints).connect().await
    }

    /// A service on a client you built (5 s request timeout; change it with
    /// [`with_request_timeout`](Self::with_request_timeout)). `endpoints` is only
    /// named in errors: say where the client connects.
    /// The epoch marker and the quarantine key have no prefix
    /// ([`Builder::epoch_prefix`]); the max TTL is [`DEFAULT_MAX_TTL`].
    pub fn from_client(client: Client, endpoints: &str) -> EtcdLockService {
        EtcdLockService::with_endpoints(client, Arc::from(endpoints), "")
    }

    fn with_endpoints(client: Client, endpoints: Arc<str>, epoch_prefix: &str) -> EtcdLockService {
        EtcdLockService {
            shared: Arc::new(Shared {
                client,
                endpoints,
                held: Table::default(),
                waiters: Table::default(),
                keep_alives: KeepAlives::default(),
                checks: Checks::default(),
                memory: Memory::default(),
                marker_key: crate::epoch::marker_key(epoch_prefix).into(),
                quarantine_key: crate::epoch::quarantine_key(epoch_prefix).into(),
                rotation: crate::members::Rotation::default(),
            }),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            watch_retry: std::time::Duration::from_millis(100),
            max_ttl: Duration::from(DEFAULT_MAX_TTL),
            fair: false,
        }
    }

    /// The same service with another longest TTL and quarantine (see
    /// [`Builder::max_ttl`]).
    pub fn with_max_ttl(mut self, max_ttl: std::time::Duration) -> Self {
        self.max_ttl = Duration::from(max_ttl);
        self
    }

    /// The longest TTL an acquire may ask for, and the quarantine.
    pub fn max_ttl(&self) -> std::time::Duration {
        self.max_ttl.into()
    }

    /// The same service (same channel, same tables) with acquires that wait in
    /// arrival order (`true`), or not (`false`, the default).
    ///
    /// **Fair** (first in, first out, across every process whose service on this etcd
    /// is fair):
    ///
    /// * An acquire that is not granted at once (the key is held, quarantined, or free
    ///   while another contender is ahead) takes a **place in the key's queue**: a key
    ///   `<key>{queue}/<owner token>` (no lock key and no other key of this crate has
    ///   that name: keys have no braces) holding the contender's identity, attached to
    ///   an etcd lease of the TTL asked. Arrival order is the queue key's create
    ///   revision. Later attempts of the same owner token keep that place and keep its
    ///   lease alive.
    /// * A free key is granted only to the contender whose place is the oldest (or to
    ///   anyone while the queue is empty); the grant's transaction deletes that place
    ///   (it also compares it is still there), and its lease is revoked in the
    ///   background. A free key while another contender has the turn is answered
    ///   `HeldByAnother(Holder::turn_of(its identity, its place's remaining TTL))`
    ///   (fence 0). A re-grant to the token that already holds the key works as
    ///   without fairness; quarantine is checked first, as without it.
    /// * A contender that stops asking (killed, or its `max_wait` passed: the lease
    ///   then sends no release, none of its attempts was granted) **leaves the queue
    ///   within the TTL it asked**: its place's lease expires. Until then the ones
    ///   behind it wait: a contender that gave up costs each of them up to one TTL
    ///   (plus etcd's expiry lag, about a second). A release of its token
    ///   ([`try_release`](Self::try_release)) leaves at once: it revokes the place.
    ///   This service forgets a place (and closes its keep-alive stream) at its first
    ///   fair acquire after the place's TTL passed unasked.
    /// * Exclusivity never depends on the queue: the grant still compares that the key
    ///   does not exist. Fences, quarantine, renew, release, holder are unchanged. A
    ///   service that is not fair on the same etcd ignores the queue (it may take a
    ///   free key ahead of it).
    /// * **Cost** per attempt while waiting: the same read transaction (two more reads
    ///   in it: the contender's place and the queue, in arrival order) and one
    ///   keep-alive of its place (the first attempt: a lease grant and a put
    ///   transaction instead); a free key while another has the turn costs a
    ///   `LeaseTimeToLive` of that contender's place (as a held key costs its
    ///   holder's). A grant removes the place in its own transaction, then revokes its
    ///   lease. [`waiting`](Self::waiting) reads the queue.
    ///
    /// Off, nothing changes: not one request more. Give every client of a key the
    /// same setting.
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Whether acquires wait in arrival order ([`with_fair`](Self::with_fair)).
    pub fn fair(&self) -> bool {
        self.fair
    }

    /// The same service (same channel, same table of grants) with another bound on
    /// each etcd call (`Duration::MAX`: none).
    pub fn with_request_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The bound on each etcd call (`Duration::MAX`: none).
    pub fn request_timeout(&self) -> std::time::Duration {
        self.request_timeout
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

    /// The endpoints, as configured (named in every error).
    pub fn endpoints(&self) -> &str {
        &self.shared.endpoints
    }

    /// The endpoints (as configured) of the members taken out of rotation because
    /// they did not answer their last status check ([`Builder::member_checks`]).
    pub fn members_out(&self) -> Vec<String> {
        self.shared.rotation.endpoints_out()
    }

    /// The etcd lease behind `token`'s grant of `key`, if this service made it and it
    /// has not been released or found lost since.
    pub fn lease_id(&self, key: &str, token: OwnerToken) -> Option<i64> {
        self.lookup(key, token).map(|held| held.lease)
    }

    /// How many grants this service is tracking.
    pub fn grants(&self) -> usize {
        self.shared.held.len()
    }

    pub(crate) fn lookup(&self, key: &str, token: OwnerToken) -> Option<Held> {
        self.shared.held.get(key, token)
    }

    /// How many leases have a keep-alive stream open (or an exchange under way).
    pub fn keep_alive_streams(&self) -> usize {
        self.shared.keep_alives.len()
    }

    /// Records a grant; an older lease for the same key and token is returned (its
    /// keep-alive stream closed).
    pub(crate) fn remember(&self, key: &str, token: OwnerToken, held: Held) -> Option<Held> {
        self.remember_in(&self.shared.held, key, token, held)
    }

    /// Forgets a grant and closes its lease's keep-alive stream.
    pub(crate) fn forget(&self, key: &str, token: OwnerToken) -> Option<Held> {
        self.forget_in(&self.shared.held, key, token)
    }

    /// Records `value` in `table`; an older entry on another lease is returned (its
    /// keep-alive stream closed).
    pub(crate) fn remember_in<V: OnLease>(
        &self,
        table: &Table<V>,
        key: &str,
        token: OwnerToken,
        value: V,
    ) -> Option<V> {
        let old = table
            .insert(key, token, value)
            .filter(|old| old.lease() != value.lease());
        if let Some(old) = old {
            self.shared.keep_alives.close(old.lease());
        }
        old
    }

    /// Forgets an entry of `table` and closes its lease's keep-alive stream.
    pub(crate) fn forget_in<V: OnLease>(
        &self,
        table: &Table<V>,
        key: &str,
        token: OwnerToken,
    ) -> Option<V> {
        let old = table.remove(key, token);
        if let Some(old) = old {
            self.shared.keep_alives.close(old.lease());
        }
        old
    }

    /// An error of `kind` for `op` on `key`, at this service's endpoints.
    pub(crate) fn error(&self, op: Op, kind: ErrorKind, key: &str) -> EtcdLockError {
        EtcdLockError::new(op, kind, &self.shared.endpoints).for_key(key)
    }

    /// An answer etcd would not send, for `op` on `key`.
    pub(crate) fn protocol(
        &self,
        op: Op,
        key: &str,
        detail: impl std::fmt::Display,
    ) -> EtcdLockError {
        EtcdLockError::protocol(op, &self.shared.endpoints, detail).for_key(key)
    }

    /// Refuses `key` before anything is sent if it breaks the key rules.
    pub(crate) fn check_key(&self, op: Op, key: &str) -> Result<(), EtcdLockError> {
        leasehold::check_key(key)
            .map_err(|err| self.error(op, ErrorKind::InvalidKey, key).caused_by(err))
    }

    /// One etcd call about `key`, bounded by the request timeout, its error sorted.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: Op,
        key: &str,
        request: F,
    ) -> Result<T, EtcdLockError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.timed(op, key, request)
            .await?
            .map_err(|e| EtcdLockError::from_client(op, &self.shared.endpoints, e).for_key(key))
    }

    /// A transaction (linearizable: its answer's revision is checked against what
    /// this service saw before sending it, see `epoch.rs`).
    pub(crate) async fn txn(
        &self,
        op: Op,
        key: &str,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, EtcdLockError> {
        let before = self.shared.memory.before();
        let answer = self
            .call(op, key, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        self.observe(answer.0.header.as_ref(), before);
        Ok(answer)
    }

    /// A linearizable read of `key`, its revision checked as [`txn`](Self::txn)'s.
    pub(crate) async fn get(
        &self,
        op: Op,
        key: &str,
    ) -> Result<etcd_client::GetResponse, EtcdLockError> {
        let before = self.shared.memory.before();
        let answer = self
            .call(op, key, |mut c| async move {
                c.get(key.as_bytes(), None::<GetOptions>).await
            })
            .await?;
        self.observe(answer.0.header.as_ref(), before);
        Ok(answer)
    }

    /// Takes in an answer's header; a store that went back in time starts the
    /// quarantine for every client, in the background.
    pub(crate) fn observe(
        &self,
        header: Option<&etcd_client::proto::PbResponseHeader>,
        before: i64,
    ) {
        if self.shared.memory.observe(header, before) {
            tracing::warn!(
                endpoints = %self.shared.endpoints,
                "etcd's revision went back (restored from a backup?): no grants until the quarantine ends"
            );
            self.quarantine_in_background();
        }
    }

    pub(crate) async fn revoke(&self, key: &str, lease: i64) -> Result<(), EtcdLockError> {
        self.call(Op::Revoke, key, |mut c| async move {
            c.lease_revoke(lease).await
        })
        .await
        .map(drop)
    }

    /// The remaining TTL of `lease` (whole seconds, rounded down by etcd); zero if
    /// etcd has no such lease any more (it expired since the key was read).
    pub(crate) async fn time_to_live(
        &self,
        key: &str,
        lease: i64,
    ) -> Result<Duration, EtcdLockError> {
        let answer = self
            .call(Op::TimeToLive, key, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        Ok(Duration::from_secs(
            u64::try_from(answer.ttl()).unwrap_or(0),
        ))
    }

    /// Revokes `lease` in a background task (best effort, bounded by the request
    /// timeout). Outside a tokio runtime nothing is sent: the lease expires by itself.
    pub(crate) fn revoke_in_background(&self, key: &str, lease: i64, why: &'static str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let service = self.clone();
        let key = key.to_owned();
        runtime.spawn(async move {
            match service.revoke(&key, lease).await {
                Ok(()) => tracing::trace!(lease, why, "revoked"),
                Err(err) => tracing::debug!(lease, why, error = %err, "revoke failed; the lease expires by itself"),
            }
        });
    }

    /// One etcd call, bounded by the request timeout; the client's error untouched.
    ///
    /// `request` is called with a handle on the (shared) client, again if the attempt
    /// failed without sending anything: the TCP connection to the member the channel
    /// picked could not be made (a dead member of a cluster; the balancer keeps it
    /// in rotation while it reconnects). Any other failure is final.
    pub(crate) async fn timed<T, F, Fut>(
        &self,
        op: Op,
        key: &str,
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
        let after = self.request_timeout;
        tokio::time::timeout(after, attempts)
            .await
            .map_err(|_| self.error(op, ErrorKind::Timeout(Some(after)), key))
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
