//! Leader election on one key: [`Election::campaign`] until elected, a [`Leader`] to
//! check before every leader-only write, [`Election::observe`] to follow who leads.
//!
//! A leader is a lease holder and nothing more: campaigning is [`acquire_with`] with
//! the candidate's identity (the core decides the retries), leading is holding, and
//! resigning is releasing. A follower has no [`Leader`], so it has nothing to pass a
//! check with: it cannot believe it leads.

use std::fmt;
use std::sync::Arc;

use futures_util::Stream;
use leasehold::{Config, Fence, HolderOutcome, Identity, KeyError, Refusal};
use leasehold_driver::LockService;
use tokio_util::sync::CancellationToken;

use crate::{acquire_with, AcquireError, AcquireOptions, CheckError, LeaseEnd, LeaseHandle};

/// An election on one key among candidates that share a service.
#[derive(Debug)]
pub struct Election<S> {
    service: Arc<S>,
    key: Box<str>,
    identity: Identity,
    config: Config,
}

impl<S> Clone for Election<S> {
    fn clone(&self) -> Self {
        Election {
            service: Arc::clone(&self.service),
            key: self.key.clone(),
            identity: self.identity,
            config: self.config,
        }
    }
}

/// Who leads, as [`Election::observe`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The leader's identity (what it campaigned with).
    pub identity: Identity,
    /// Its fence: a new leader always has a higher one.
    pub fence: Fence,
}

impl<S: LockService + 'static> Election<S> {
    /// An election on `key` where this candidate is `identity`. Checks the key at
    /// once, so a bad key fails here rather than on the first campaign.
    pub fn new(
        service: Arc<S>,
        key: &str,
        identity: Identity,
        config: Config,
    ) -> Result<Election<S>, KeyError> {
        leasehold::check_key(key)?;
        Ok(Election {
            service,
            key: key.into(),
            identity,
            config,
        })
    }

    /// Campaigns until elected: acquires the key with this candidate's identity,
    /// waiting while another leads (retrying about every `retry_interval`, jittered,
    /// as the core decides). Fails only on a final refusal or a runtime shutting down.
    /// Cancel-safe, like [`acquire`](crate::acquire): dropping it withdraws.
    ///
    /// A candidate that resigned moments ago first lets
    /// [`Config::release_backoff`] pass, so a waiting candidate takes its turn (see
    /// [`AcquireOptions::yield_after_release`]).
    pub async fn campaign(&self) -> Result<Leader, AcquireError> {
        self.campaign_with(AcquireOptions::new()).await
    }

    /// [`campaign`](Self::campaign), giving up after `wait`
    /// ([`AcquireError::Busy`] if another leads).
    pub async fn campaign_for(&self, wait: std::time::Duration) -> Result<Leader, AcquireError> {
        self.campaign_with(AcquireOptions::new().max_wait(wait))
            .await
    }

    async fn campaign_with(&self, options: AcquireOptions) -> Result<Leader, AcquireError> {
        let options = options.identity(self.identity);
        let handle =
            acquire_with(Arc::clone(&self.service), &self.key, self.config, options).await?;
        Ok(Leader { handle })
    }

    /// Who leads now, by one `holder` query (bounded by the request timeout):
    /// `Ok(None)` when nobody does, `Err` when the service did not answer or refused.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, ObserveError> {
        let query = self.service.holder(&self.key);
        match tokio::time::timeout(self.config.request_timeout().into(), query).await {
            Ok(HolderOutcome::Held(holder)) => Ok(Some(LeaderInfo {
                identity: holder.identity,
                fence: holder.fence,
            })),
            Ok(HolderOutcome::Free) => Ok(None),
            Ok(HolderOutcome::Refused(why)) => Err(ObserveError::Refused(why)),
            Ok(_) | Err(_) => Err(ObserveError::Unavailable),
        }
    }

    /// Every change of leader, starting with the current one (`None`: nobody leads).
    ///
    /// Polled: one [`leader`](Self::leader) query every `retry_interval` of the
    /// config (T/20 by default; the cadence at which campaigning candidates retry, so
    /// an observer learns of a new leader about as soon as the candidates do). A
    /// query the service does not answer is skipped (the last value stands); the
    /// stream ends after a final refusal. Pushed changes (an etcd watch) are a
    /// follow-up.
    pub fn observe(&self) -> impl Stream<Item = Option<LeaderInfo>> + Send + 'static {
        let election = self.clone();
        let state = (election, None::<Option<LeaderInfo>>, true);
        futures_util::stream::unfold(state, |(election, last, first)| async move {
            let interval: std::time::Duration = election.config.retry_interval().into();
            let mut first = first;
            loop {
                if !first {
                    tokio::time::sleep(interval).await;
                }
                first = false;
                match election.leader().await {
                    Ok(now) if last != Some(now) => {
                        return Some((now, (election, Some(now), false)));
                    }
                    Ok(_) | Err(ObserveError::Unavailable) => {}
                    Err(ObserveError::Refused(_)) => return None,
                }
            }
        })
    }
}

/// Why [`Election::leader`] could not tell who leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObserveError {
    /// The service refused the query for good (invalid key, credentials).
    Refused(Refusal),
    /// No answer within the request timeout, or an answer that says nothing.
    Unavailable,
}

impl fmt::Display for ObserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObserveError::Refused(why) => write!(f, "the lock service refused the query: {why}"),
            ObserveError::Unavailable => f.write_str("the lock service did not answer"),
        }
    }
}

impl std::error::Error for ObserveError {}

/// This candidate leads, for as long as [`check`](Self::check) passes.
#[derive(Clone, Debug)]
pub struct Leader {
    handle: LeaseHandle,
}

impl Leader {
    /// The fence this leadership was granted, for logs and labels. **Not a
    /// permission to write**: it stays the same after the leadership ends; write with
    /// the fence [`check`](Self::check) returns.
    pub fn granted_fence(&self) -> Fence {
        self.handle.granted_fence()
    }

    /// The fence, if this candidate may act as leader *now*; otherwise why not.
    /// Call it right before every leader-only write (see [`LeaseHandle::check`]).
    pub fn check(&self) -> Result<Fence, CheckError> {
        self.handle.check()
    }

    /// Completes when the leadership ends: lost, resigned, or the driver gone.
    pub async fn lost(&self) -> LeaseEnd {
        self.handle.lost().await
    }

    /// Cancelled the moment the leadership ends; give it to leader-only work.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.handle.cancellation_token()
    }

    /// Steps down at once: checks fail from now on, and the key is released so a
    /// campaigning candidate takes over at its next attempt (within one jittered
    /// retry interval: at most 1.5 × `retry_interval`, plus a round trip). Campaigning
    /// again at once does not win it back from a waiting candidate.
    pub async fn resign(self) -> LeaseEnd {
        self.handle.release().await
    }

    /// The lease behind the leadership (state, events, clock).
    pub fn handle(&self) -> &LeaseHandle {
        &self.handle
    }
}
