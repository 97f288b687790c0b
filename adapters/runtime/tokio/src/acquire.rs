//! Starting a lease: [`acquire`] (wait while the key is held), [`try_acquire`] (give
//! up on the first "held by another"), and [`acquire_with`] for options.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use leasehold::{Config, LossReason, Owner};
use leasehold_driver::LockService;

use crate::shared::Shared;
use crate::{task, trace, LeaseClock, LeaseHandle, LeaseState};

/// Options for [`acquire_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireOptions {
    owner: Option<Owner>,
    wait_while_held: bool,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions::new()
    }
}

impl AcquireOptions {
    /// A random owner, waiting while the key is held by another.
    pub const fn new() -> AcquireOptions {
        AcquireOptions {
            owner: None,
            wait_while_held: true,
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

    /// Keep retrying (every `retry_interval`) while the key is held by another
    /// (`true`, the default), or give up on the first such answer (`false`).
    pub const fn wait_while_held(mut self, wait: bool) -> AcquireOptions {
        self.wait_while_held = wait;
        self
    }
}

/// Why no lease was acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The key is held by another owner (only with `wait_while_held(false)`, as
    /// [`try_acquire`] does).
    HeldByAnother,
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
            AcquireError::HeldByAnother => f.write_str("the key is held by another owner"),
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

/// Acquires `key` on `service`, waiting (retrying every `retry_interval`) while
/// another owner holds it, and keeps it renewed every `renew_interval` until it is
/// lost, released, or the last [`LeaseHandle`] is dropped.
///
/// The owner token is a fresh random 128-bit value. The lease is driven by a spawned
/// tokio task; call this from within a runtime.
///
/// **Cancel-safe**: dropping the future stops the attempt; if the service may have
/// granted the key already, a release is sent (best effort). Bound the wait with
/// [`tokio::time::timeout`]. An attempt whose answers never come (service down)
/// retries until dropped.
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

/// Like [`acquire`], but gives up with [`AcquireError::HeldByAnother`] on the first
/// answer saying another owner holds `key`.
///
/// An indeterminate answer (timeout, transport error) is retried: the key may have
/// been granted, and a retry with the same owner token is answered idempotently.
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
        AcquireOptions::new().wait_while_held(false),
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
    let key: Box<str> = key.into();
    async move {
        let owner = match options.owner {
            Some(owner) => owner,
            None => random_owner().ok_or(AcquireError::NoEntropy)?,
        };
        let shared = Arc::new(Shared::new(key, owner, config, LeaseClock::start()));
        let mut attempt = Attempt(Some(Arc::clone(&shared)));
        task::spawn(Arc::clone(&shared), service, !options.wait_while_held);

        let outcome = shared.wait_for(settled).await;
        if outcome.is_ok() {
            attempt.0 = None;
        }
        outcome.map(|()| LeaseHandle::new(shared))
    }
}

/// Whether the attempt is over, and how.
fn settled(shared: &Shared) -> Option<Result<(), AcquireError>> {
    if shared.refused() {
        return Some(Err(AcquireError::HeldByAnother));
    }
    // Once granted, hand out the handle even if the term already ended: the caller
    // sees the fence, and the handle reports the loss.
    if shared.granted().is_some() {
        return Some(Ok(()));
    }
    match shared.state() {
        LeaseState::Acquiring => None,
        LeaseState::Lost(reason) => Some(Err(AcquireError::Lost(reason))),
        _ => Some(Err(AcquireError::DriverStopped)),
    }
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

/// A fresh 128-bit owner from the operating system's random generator.
fn random_owner() -> Option<Owner> {
    let mut bytes = [0; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(Owner(bytes))
}
