//! Starting a lease: [`acquire`] (wait while the key is held), [`try_acquire`] (give
//! up on the first refusal), and [`acquire_with`] for options (a wait bound, the
//! owner, the holder identity).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use leasehold::{
    AcquireFailure, Config, Holder, Identity, Indeterminate, KeyError, LossReason, Owner, Refusal,
};
use leasehold_driver::LockService;

use crate::shared::{Common, Shared};
use crate::{task, trace, turns, LeaseHandle, LeaseState};

/// Options for [`acquire_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireOptions {
    owner: Option<Owner>,
    identity: Option<Identity>,
    max_wait: Option<std::time::Duration>,
    yield_after_release: bool,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions::new()
    }
}

impl AcquireOptions {
    /// A random owner, the identity `hostname:pid`, no wait bound (keep trying while
    /// the key is held or the service does not answer; final refusals still end the
    /// acquire at once), and fair turns after a release of this process.
    pub const fn new() -> AcquireOptions {
        AcquireOptions {
            owner: None,
            identity: None,
            max_wait: None,
            yield_after_release: true,
        }
    }

    /// Present `owner` instead of a fresh random 128-bit one.
    ///
    /// The service stores `owner` plus the term, and every acquire runs a new lease
    /// whose (only) term is 1, so **two acquires of the same key with the same owner
    /// are the same holder** to the service: both would be granted. Supply an owner
    /// only if it is unique per acquire, e.g. for reproducible logs in tests.
    pub const fn owner(mut self, owner: Owner) -> AcquireOptions {
        self.owner = Some(owner);
        self
    }

    /// Store `identity` with the grant, for contenders and `holder()` queries to see
    /// (default `hostname:pid`).
    pub const fn identity(mut self, identity: Identity) -> AcquireOptions {
        self.identity = Some(identity);
        self
    }

    /// Give up when no attempt succeeded within `wait`: the acquire then fails with
    /// [`AcquireError::Busy`] (the key was held) or [`AcquireError::Unavailable`] (the
    /// service did not answer). `Duration::ZERO` tries once, like `flock -n`.
    /// Retries are jittered around the config's `retry_interval`.
    ///
    /// A non-zero bound is **hard**: the acquire returns at `wait` even with an
    /// attempt in flight (it is then `Busy` if an earlier attempt found the key held,
    /// `Unavailable(Timeout)` otherwise). In the background, the driver awaits that
    /// attempt's answer (at most its request timeout) and then releases what it may
    /// have granted, so a late grant does not keep the key from the next contender
    /// for a TTL; the release never goes out beside the attempt, which it could
    /// overtake on a service that serves requests on several streams or connections. A zero bound tries once and awaits that one attempt, for
    /// at most the config's request timeout.
    pub const fn max_wait(mut self, wait: std::time::Duration) -> AcquireOptions {
        self.max_wait = Some(wait);
        self
    }

    /// Whether to let waiting contenders go first after this process released the
    /// key (on by default). When this process released `key` through the same
    /// service less than [`Config::release_backoff`] (two retry intervals) ago, the
    /// acquire sends nothing until that has passed (or the wait bound, if sooner):
    /// every waiter retries within one and a half retry intervals, so one of them
    /// gets the key first. Without it, a holder that releases and acquires again at
    /// once finds the key free while the waiters sleep and wins every time. `false`
    /// contends at once, for a process that knows it has no rivals.
    pub const fn yield_after_release(mut self, yield_turn: bool) -> AcquireOptions {
        self.yield_after_release = yield_turn;
        self
    }
}

/// Why no lease was acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The key breaks the key rules; nothing was sent.
    InvalidKey(KeyError),
    /// The service refused for good (invalid key, wrong type, credentials): retrying
    /// cannot help.
    Refused(Refusal),
    /// The wait bound ran out and the key was held by another, last time we asked:
    /// by this holder (if the service said); or the service was in quarantine after
    /// a loss of state ([`Holder::is_quarantine`]).
    Busy {
        /// Who holds the key, with its fence and remaining TTL.
        holder: Option<Holder>,
    },
    /// The wait bound ran out and the service's last answer left the outcome unknown
    /// (down, unreachable, too slow, garbage). Any grant that may have happened was
    /// released.
    Unavailable(Indeterminate),
    /// The service granted a TTL too short to renew safely with this config
    /// ([`Config::accepts_grant`]); the grant was released unused.
    GrantTooShort,
    /// The term ended before the lease could be used: a grant whose answer came
    /// after the safe deadline it allows is never opened to writes.
    Lost(LossReason),
    /// The driver task stopped before a grant (the runtime is shutting down).
    DriverStopped,
    /// No owner was supplied and the operating system's random generator failed.
    NoEntropy,
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::InvalidKey(why) => write!(f, "cannot acquire: {why}"),
            AcquireError::Refused(why) => {
                write!(f, "the lock service refused the acquire for good: {why}")
            }
            AcquireError::Busy { holder: Some(h) } if h.is_quarantine() && !h.identity.is_empty() => write!(
                f,
                "the key is free, but it is the turn of {:?}, queued before this contender \
                 (a fair service grants in arrival order)",
                h.identity.as_str()
            ),
            AcquireError::Busy { holder: Some(h) } if h.is_quarantine() => write!(
                f,
                "the lock service grants nothing for {} ms more: it is in quarantine, as it \
                 may have lost grants that are still alive (new, restarted, restored or \
                 failed-over data)",
                h.remaining.as_millis()
            ),
            AcquireError::Busy { holder: Some(h) } => write!(
                f,
                "the key is held by {} (fence {}, {} ms left)",
                h.identity,
                h.fence.0,
                h.remaining.as_millis()
            ),
            AcquireError::Busy { holder: None } => f.write_str("the key is held by another owner"),
            AcquireError::Unavailable(why) => write!(
                f,
                "gave up waiting: the lock service did not answer ({why}); check that it is up and reachable"
            ),
            AcquireError::GrantTooShort => f.write_str(
                "the lock service granted a TTL too short for this config; lower the request timeout or ask for a longer TTL",
            ),
            AcquireError::Lost(reason) => write!(f, "the lease ended before use: {reason}"),
            AcquireError::DriverStopped => {
                f.write_str("the lease driver stopped before the lease was granted")
            }
            AcquireError::NoEntropy => {
                f.write_str("no random owner token: the OS random generator failed")
            }
        }
    }
}

impl std::error::Error for AcquireError {}

impl AcquireError {
    /// Whether acquiring again, with the same key, service and config, would end the
    /// same way: an invalid key, a final refusal (credentials, a key holding something
    /// else), a grant too short for the config, no random source. The others —
    /// busy, the service unavailable, a loss before use, a stopped driver — may not
    /// recur, and a caller may wait and try again.
    pub const fn is_final(&self) -> bool {
        matches!(
            self,
            AcquireError::InvalidKey(_)
                | AcquireError::Refused(_)
                | AcquireError::GrantTooShort
                | AcquireError::NoEntropy
        )
    }
}

/// Acquires `key` on `service`, waiting (retrying about every `retry_interval`,
/// jittered) while another owner holds it or the service does not answer, and keeps
/// it renewed (every third of the granted TTL by default) until it is lost,
/// released, or the last [`LeaseHandle`] is dropped.
///
/// A final refusal (invalid key, wrong type, credentials) returns at once. The owner
/// token is a fresh random 128-bit value; the identity stored with the grant is
/// `hostname:pid`. The lease is driven by a spawned tokio task; call this from within
/// a runtime. Bound the wait with [`AcquireOptions::max_wait`].
///
/// **Cancel-safe**: dropping the future stops the attempt; if the service may have
/// granted the key already, a release is sent (best effort).
pub fn acquire<S>(
    service: Arc<S>,
    key: &str,
    config: Config,
) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static
where
    S: LockService + 'static,
{
    acquire_with(service, key, config, AcquireOptions::new())
}

/// Like [`acquire`], but tries once: [`AcquireError::Busy`] if another owner holds
/// `key`, [`AcquireError::Unavailable`] if the one attempt's outcome is unknown (a
/// grant that may have happened is released). `flock -n`.
pub fn try_acquire<S>(
    service: Arc<S>,
    key: &str,
    config: Config,
) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static
where
    S: LockService + 'static,
{
    acquire_with(
        service,
        key,
        config,
        AcquireOptions::new().max_wait(std::time::Duration::ZERO),
    )
}

/// [`acquire`] with [`AcquireOptions`].
pub fn acquire_with<S>(
    service: Arc<S>,
    key: &str,
    config: Config,
    options: AcquireOptions,
) -> impl Future<Output = Result<LeaseHandle, AcquireError>> + Send + 'static
where
    S: LockService + 'static,
{
    let key = CalledKey::new(key);
    async move {
        let common = Common::for_task(config, options.identity);
        start(&service, key, common, options, |shared, give_up_at| {
            task::spawn(shared, service.clone(), give_up_at);
        })
        .await
    }
}

/// The acquire both driver shapes share: check the key, pick the owner, wait for this
/// process's turn, hand the new lease's shared state to `drive` (which starts driving
/// it on the clock of `common`, which also holds its config and the identity
/// `options` name), then wait for the grant or the core's verdict. Cancel-safe as
/// [`acquire`] says.
pub(crate) async fn start<S: LockService + 'static>(
    service: &Arc<S>,
    key: CalledKey,
    common: Arc<Common>,
    options: AcquireOptions,
    drive: impl FnOnce(Arc<Shared>, leasehold::Instant),
) -> Result<LeaseHandle, AcquireError> {
    leasehold::check_key(key.as_str()).map_err(AcquireError::InvalidKey)?;
    let owner = match options.owner {
        Some(owner) => owner,
        None => leasehold_driver::random_owner().ok_or(AcquireError::NoEntropy)?,
    };
    // The default is read again here: a process forked after the set was made has
    // another pid.
    let common = common.with_identity(options.identity);
    let (config, clock) = (common.config, common.clock);
    let began = clock.now();
    // The wait bound counts from the call, the wait for our turn included. A zero
    // bound is one attempt (`flock -n`), awaited for up to the request timeout; any
    // other bound is hard: the acquire returns at it, an attempt in flight or not.
    let hard_bound = options
        .max_wait
        .filter(|wait| !wait.is_zero())
        .and_then(|wait| tokio::time::Instant::now().checked_add(wait));
    let give_up_at = match options.max_wait {
        Some(wait) => began.saturating_add(leasehold::Duration::from(wait)),
        None => leasehold::Instant::MAX,
    };
    if options.yield_after_release {
        wait_for_turn(service, key.as_str(), config, options.max_wait).await;
    }
    let shared = Arc::new(Shared::new(key.into_owned(), owner, common, began));
    let mut attempt = Attempt(Some(Arc::clone(&shared)));
    drive(Arc::clone(&shared), give_up_at);

    let outcome = match hard_bound {
        None => shared.wait_for(settled).await,
        Some(bound) => match tokio::time::timeout_at(bound, shared.wait_for(settled)).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => settled(&shared).unwrap_or_else(|| timed_out(&shared)),
        },
    };
    if outcome.is_ok() {
        attempt.0 = None;
    }
    outcome.map(|()| LeaseHandle::new(shared))
}

/// The key an acquire was called with, until the acquire runs and makes the lease's
/// own copy.
///
/// A key of up to [`CalledKey::INLINE`] bytes travels inside the future, so the copy a
/// lease keeps for its life is allocated by the thread that runs the acquire, not by
/// the one that called it. Made by the caller, that copy would sit between the
/// caller's short-lived allocations (a task spawned for each acquire, say) and keep
/// their freed memory from being reused: with glibc, whose threads allocate from arenas
/// of their own, a set started by acquires spawned from `main` would hold 200–280 B of
/// RSS a lease more than it does (the `many_leases` bench, 100k and 1M leases).
pub(crate) enum CalledKey {
    Inline {
        len: u8,
        bytes: [u8; CalledKey::INLINE],
    },
    Boxed(Box<str>),
}

impl CalledKey {
    /// Longer keys are copied to the heap by the caller.
    const INLINE: usize = 64;

    pub(crate) fn new(key: &str) -> CalledKey {
        let mut bytes = [0; CalledKey::INLINE];
        match bytes.get_mut(..key.len()) {
            Some(inline) => {
                inline.copy_from_slice(key.as_bytes());
                // At most `INLINE` (64), so it fits.
                let len = u8::try_from(key.len()).unwrap_or(u8::MAX);
                CalledKey::Inline { len, bytes }
            }
            None => CalledKey::Boxed(key.into()),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Copied from a `str` whole, so always UTF-8; an empty key would be refused.
            CalledKey::Inline { len, bytes } => bytes
                .get(..usize::from(*len))
                .and_then(|key| std::str::from_utf8(key).ok())
                .unwrap_or_default(),
            CalledKey::Boxed(key) => key,
        }
    }

    /// The lease's own copy.
    fn into_owned(self) -> Box<str> {
        match self {
            CalledKey::Inline { .. } => self.as_str().into(),
            CalledKey::Boxed(key) => key,
        }
    }
}

/// Sleeps until this process may contend for `key` again after its own release
/// ([`Config::release_backoff`] after it), or until the wait bound, whichever is
/// first. Nothing has been sent yet, so dropping the future here is harmless.
async fn wait_for_turn<S: LockService + 'static>(
    service: &Arc<S>,
    key: &str,
    config: Config,
    max_wait: Option<std::time::Duration>,
) {
    let backoff = config.release_backoff().into();
    let Some(turn) = turns::turn(service, key, backoff) else {
        return;
    };
    let bound = max_wait.map(|wait| tokio::time::Instant::now() + wait);
    tokio::time::sleep_until(bound.map_or(turn, |bound| turn.min(bound))).await;
}

/// Whether the attempt is over, and how.
fn settled(shared: &Shared) -> Option<Result<(), AcquireError>> {
    // One consistent view: a grant published between separate reads would look like
    // a driver that stopped.
    let (granted, failed, holder, state) = shared.acquire_view();
    // Once granted, hand out the handle even if the term already ended: the caller
    // sees the fence, and the handle reports the loss.
    if granted {
        return Some(Ok(()));
    }
    if let Some(failure) = failed {
        return Some(Err(match failure {
            AcquireFailure::HeldByAnother => AcquireError::Busy { holder },
            AcquireFailure::Indeterminate(why) => AcquireError::Unavailable(why),
            AcquireFailure::Refused(why) => AcquireError::Refused(why),
            // GrantTooShort, and any failure a newer core adds.
            _ => AcquireError::GrantTooShort,
        }));
    }
    match state {
        LeaseState::Acquiring => None,
        LeaseState::Lost(reason) => Some(Err(AcquireError::Lost(reason))),
        _ => Some(Err(AcquireError::DriverStopped)),
    }
}

/// The wait bound ran out with an attempt in flight (or its answer not yet handled):
/// the term ends as for a cancelled acquire, once the attempt is answered or its
/// request timeout passes (see [`Shared::poll_release`]). A grant it got is then
/// released instead of blocking the next contender for a TTL. `Busy` if an attempt of this acquire found
/// the key held (with the holder it named), `Unavailable(Timeout)` otherwise.
fn timed_out(shared: &Shared) -> Result<(), AcquireError> {
    let (_, _, holder, _) = shared.acquire_view();
    shared.request_release(trace::ReleaseWhy::AcquireTimedOut);
    crate::metrics::acquire_timed_out(holder.is_some());
    let reason = if holder.is_some() {
        "the key is held by another owner"
    } else {
        "no answer within the wait bound"
    };
    trace::acquire_timed_out(&shared.key, shared.token(), reason);
    Err(match holder {
        Some(holder) => AcquireError::Busy {
            holder: Some(holder),
        },
        None => AcquireError::Unavailable(Indeterminate::Timeout),
    })
}

/// Releases the attempt if the acquire future is dropped before it completes.
struct Attempt(Option<Arc<Shared>>);

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.request_release(trace::ReleaseWhy::AcquireCancelled);
        }
    }
}

/// `hostname:pid`, cut to fit: who holds a lease, in words a person can look up.
/// Read once per process (a set that acquires a hundred thousand leases must not read
/// the host name as many times); a forked child, whose pid differs, reads it again.
/// Shared: every lease that names no identity of its own points to this one, rather
/// than keeping 65 bytes of its own.
pub(crate) fn default_identity() -> Arc<Identity> {
    static CACHED: std::sync::Mutex<Option<(u32, Arc<Identity>)>> = std::sync::Mutex::new(None);
    let pid = std::process::id();
    let mut cached = CACHED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match &*cached {
        Some((for_pid, identity)) if *for_pid == pid => Arc::clone(identity),
        _ => {
            let identity = Arc::new(read_identity(pid));
            *cached = Some((pid, Arc::clone(&identity)));
            identity
        }
    }
}

fn read_identity(pid: u32) -> Identity {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    Identity::lossy(&format!("{host}:{pid}"))
}
