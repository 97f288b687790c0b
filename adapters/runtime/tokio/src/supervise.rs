//! [`supervise`]: run an async job only while a lease is held, term after term.
//!
//! The loop holds no lease policy of its own. How long to wait for a grant, how often
//! to retry while the key is held or the service is silent, and when a term is lost
//! are the core's decisions, reached through [`acquire_with`]. The loop adds the
//! plumbing around them: start the job with the term's fence and a token that fires
//! at the end of the term, stop the job (await it, abort it after a grace), release
//! on shutdown.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use leasehold::{Config, Fence, Identity, Owner};
use leasehold_driver::LockService;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{acquire_with, AcquireError, AcquireOptions, LeaseEnd, LeaseHandle};

/// Options for [`supervise`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SuperviseOptions {
    identity: Option<Identity>,
    max_wait: Option<std::time::Duration>,
    grace: Option<std::time::Duration>,
}

impl SuperviseOptions {
    /// The identity `hostname:pid`, no wait bound, a grace of one TTL.
    pub const fn new() -> SuperviseOptions {
        SuperviseOptions {
            identity: None,
            max_wait: None,
            grace: None,
        }
    }

    /// Store `identity` with every grant (default `hostname:pid`).
    pub const fn identity(mut self, identity: Identity) -> SuperviseOptions {
        self.identity = Some(identity);
        self
    }

    /// Bound each acquire: when no attempt of one acquire succeeded within `wait`,
    /// supervision ends with [`SuperviseEnd::Failed`] (see
    /// [`AcquireOptions::max_wait`]). Without it, each acquire waits as long as the
    /// key is held or the service is silent, retrying as the core decides.
    pub const fn max_wait(mut self, wait: std::time::Duration) -> SuperviseOptions {
        self.max_wait = Some(wait);
        self
    }

    /// How long a job may take to return after its token fired before it is aborted
    /// (default: the config's TTL — by then the service has expired the key and a
    /// new holder may be writing, so a job still running is only wasting work; its
    /// writes are refused by `check()` and by the fence anyway).
    pub const fn grace(mut self, grace: std::time::Duration) -> SuperviseOptions {
        self.grace = Some(grace);
        self
    }
}

/// One term of a [`supervise`]d job: what the job gets each time the lease is granted.
#[derive(Debug)]
#[non_exhaustive]
pub struct SupervisedTerm {
    /// 1 for the first grant of this supervision, then 2, 3, …
    pub number: u32,
    /// The fence of this term's grant, newer than every earlier term's: for logs and
    /// labels. **Not a permission to write**: write with the fence
    /// `handle.check()` returns, which refuses once the lease is lost.
    pub granted_fence: Fence,
    /// Cancelled the moment writes must stop: the lease was lost, or shutdown began.
    /// The job should return soon after; it is aborted after the grace.
    pub token: CancellationToken,
    /// The term's lease: call [`check`](LeaseHandle::check) before every write.
    pub handle: LeaseHandle,
}

/// Why [`supervise`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SuperviseEnd {
    /// The shutdown future completed: the job was stopped and the lease released.
    Shutdown,
    /// The job returned while its lease was still held: its work is done, the lease
    /// was released.
    JobDone,
    /// The job panicked while its lease was held; the lease was released.
    JobPanicked,
    /// An acquire failed in a way the next one would not fix (a final refusal, an
    /// invalid key, a grant too short for the config, no entropy, the runtime
    /// stopping), or it ran out of its [`max_wait`](SuperviseOptions::max_wait).
    Failed(AcquireError),
}

impl fmt::Display for SuperviseEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuperviseEnd::Shutdown => f.write_str("supervision shut down; the lease was released"),
            SuperviseEnd::JobDone => f.write_str("the job finished; the lease was released"),
            SuperviseEnd::JobPanicked => f.write_str("the job panicked; the lease was released"),
            SuperviseEnd::Failed(why) => write!(f, "supervision stopped: {why}"),
        }
    }
}

/// Runs `job` only while `key` is held: acquire, call `job(term)` in a task of its
/// own, and when the term ends (lost), cancel `term.token`, await the job (abort it
/// after the [grace](SuperviseOptions::grace)), back off, and acquire again — for as
/// long as it takes, until `shutdown` completes, the job returns while its lease is
/// still held, or an acquire fails for good.
///
/// * **Each term is a new holder**: a fresh random owner and a new, higher fence.
///   Storage that admits only the newest fence rejects a previous term's late writes.
/// * **Back-off**: the acquire waits and retries as the core decides (jittered
///   around the config's `retry_interval`, seeded per owner, so contenders do not
///   retry in lock step). After a term ends (lost, or released by the job through
///   its handle) the loop first waits one such jittered interval (between half and
///   one and a half `retry_interval`, derived from the ended term's random owner),
///   so a lease that is granted and lost at once cannot spin. After a release, the
///   acquire also lets [`Config::release_backoff`] pass first, so that a waiting
///   contender takes its turn (see [`AcquireOptions::yield_after_release`]).
/// * **Shutdown** (`shutdown` completes): writes stop and the job's token fires at
///   once, the job is awaited (aborted after the grace), the key is released (best
///   effort, bounded by the request timeout). During an acquire, the acquire is
///   dropped, which releases a grant that may have been made.
///
/// Call from within a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::sync::Arc;
/// use leasehold_tokio::memory::MemoryService;
/// use std::time::Duration;
/// use leasehold_tokio::{supervise, SuperviseEnd, SuperviseOptions, SupervisedTerm};
///
/// let service = Arc::new(MemoryService::new());
/// let config = leasehold_tokio::config(Duration::from_secs(3)).build().unwrap();
/// let shutdown = tokio::time::sleep(std::time::Duration::from_secs(10));
/// let end = supervise(service, "orders", config, SuperviseOptions::new(), shutdown, |term: SupervisedTerm| async move {
///     while let Ok(fence) = term.handle.check() {
///         // storage.write(fence, ...)
/// #       let _ = fence;
///         tokio::select! {
///             _ = term.token.cancelled() => break,
///             _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
///         }
///     }
/// })
/// .await;
/// assert_eq!(end, SuperviseEnd::Shutdown);
/// # }
/// ```
pub async fn supervise<S, F, Fut>(
    service: Arc<S>,
    key: &str,
    config: Config,
    options: SuperviseOptions,
    shutdown: impl Future<Output = ()>,
    mut job: F,
) -> SuperviseEnd
where
    S: LockService + 'static,
    F: FnMut(SupervisedTerm) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let grace = options.grace.unwrap_or_else(|| config.ttl().into());
    let mut acquire_options = AcquireOptions::new();
    if let Some(identity) = options.identity {
        acquire_options = acquire_options.identity(identity);
    }
    if let Some(wait) = options.max_wait {
        acquire_options = acquire_options.max_wait(wait);
    }
    let mut shutdown = std::pin::pin!(shutdown);
    let mut number = 0_u32;
    loop {
        let acquire = acquire_with(Arc::clone(&service), key, config, acquire_options);
        let handle = tokio::select! {
            // Dropping the acquire releases a grant that may have been made.
            () = &mut shutdown => return SuperviseEnd::Shutdown,
            acquired = acquire => match acquired {
                Ok(handle) => handle,
                // Lost before use: the next acquire (a new owner) may well succeed.
                Err(AcquireError::Lost(_)) => continue,
                Err(why) => return SuperviseEnd::Failed(why),
            },
        };
        number = number.saturating_add(1);
        let token = handle.cancellation_token();
        let term = SupervisedTerm {
            number,
            granted_fence: handle.granted_fence(),
            token: token.clone(),
            handle: handle.clone(),
        };
        let mut running = tokio::spawn(job(term));
        let ended = tokio::select! {
            () = &mut shutdown => None,
            end = handle.lost() => Some(end),
            // The job returned (or panicked) on its own: if its lease is still held,
            // that is the job's end; if the term ended just now, treat it as a loss.
            joined = &mut running => match handle.end() {
                // `stop` below sees the job finished and does not poll it again.
                Some(end) => Some(end),
                None => {
                    handle.release().await;
                    return if joined.is_ok() {
                        SuperviseEnd::JobDone
                    } else {
                        SuperviseEnd::JobPanicked
                    };
                }
            },
        };
        match ended {
            None => {
                // Shutdown: stop writes and the job first, then finish the release.
                let release = handle.release();
                let ((), _) = tokio::join!(stop(running, &token, grace), release);
                return SuperviseEnd::Shutdown;
            }
            Some(LeaseEnd::DriverStopped) => {
                stop(running, &token, grace).await;
                return SuperviseEnd::Failed(AcquireError::DriverStopped);
            }
            // Lost, or released by the job through its handle (only the job can: this
            // loop releases only on its way out). Either way the term is over: stop
            // the job, pause, take a new term.
            Some(_) => {
                stop(running, &token, grace).await;
                let owner = handle.owner();
                drop(handle);
                tokio::select! {
                    () = &mut shutdown => return SuperviseEnd::Shutdown,
                    () = tokio::time::sleep(backoff(config, owner)) => {}
                }
            }
        }
    }
}

/// Cancels `token` (already cancelled at a loss; a no-op then), waits up to `grace`
/// for the job to return, then aborts it.
async fn stop(mut running: JoinHandle<()>, token: &CancellationToken, grace: std::time::Duration) {
    token.cancel();
    if running.is_finished() {
        return;
    }
    if tokio::time::timeout(grace, &mut running).await.is_err() {
        running.abort();
        // Await the abort so that the job's resources are gone when we go on.
        let _ = running.await;
    }
}

/// The pause after a term that ended (lost, or released by the job): `retry_interval` times a factor in [0.5, 1.5),
/// derived from the lost term's random owner (so two supervisors that lost at the
/// same moment do not come back in lock step). Not a policy of its own: the same
/// range as the core's acquire retries.
fn backoff(config: Config, owner: Owner) -> std::time::Duration {
    let [a, b, c, d, ..] = owner.0;
    let mut x = u32::from_le_bytes([a, b, c, d]) | 1;
    // Murmur3's finaliser, so that owners close together spread out.
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^= x >> 16;
    let interval: std::time::Duration = config.retry_interval().into();
    let factor = 0.5 + f64::from(x) / (f64::from(u32::MAX) + 1.0);
    interval.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use leasehold::{Config, Duration, Owner};

    #[test]
    fn the_backoff_stays_within_half_and_one_and_a_half_retry_intervals() {
        let config = Config::builder(Duration::from_secs(3)).build().unwrap();
        let retry: std::time::Duration = config.retry_interval().into();
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..1000_u32 {
            let mut bytes = [0; 16];
            bytes[..4].copy_from_slice(&i.to_le_bytes());
            let pause = super::backoff(config, Owner(bytes));
            assert!(pause >= retry / 2 && pause < retry * 3 / 2, "{pause:?}");
            seen.insert(pause.as_millis());
        }
        assert!(
            seen.len() > 50,
            "owners spread out: {} distinct",
            seen.len()
        );
    }
}
