//! Leader election on one key: [`Election::campaign`] until elected, a [`Leader`] to
//! check before every leader-only write, [`Election::observe`] to follow who leads.
//!
//! A leader is a lease holder and nothing more: campaigning is [`acquire_with`] with
//! the candidate's identity (the core decides the retries), leading is holding, and
//! resigning is releasing. A follower has no [`Leader`], so it has nothing to pass a
//! check with: it cannot believe it leads.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use leasehold::{Config, Fence, GateError, HolderOutcome, Identity, KeyError, Refusal};
use leasehold_driver::LockService;
use tokio_util::sync::CancellationToken;

use crate::{acquire_with, AcquireError, AcquireOptions, CheckError, LeaseEnd, LeaseHandle};

/// An election on one key among candidates that share a service.
///
/// [`campaign`](Self::campaign) until elected, or [`run`](Self::run) the candidate
/// with [`LeaderCallbacks`]. The key is held for as long as a [`Leader`] (or a clone
/// of it, or of its [`handle`](Leader::handle)) exists: **dropping the last one
/// releases the key** (in the background, best effort), like
/// [`resign`](Leader::resign) without waiting for it.
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

    /// Every change of who leads, as a [`LeaderView`], starting with the current one.
    ///
    /// Pushed where the service can watch the key
    /// ([`holder_changed`](leasehold_driver::LockService::holder_changed): etcd's
    /// watch; Redis's keyspace notifications where the server sends them): a change is
    /// reported one [`leader`](Self::leader) query after the event. Polled as well, on
    /// every service: one [`leader`](Self::leader) query every `retry_interval` of the
    /// config (T/20 by default; the cadence at which campaigning candidates retry),
    /// which is how a service that cannot watch (PostgreSQL, a Redis without
    /// notifications) is followed. A query the service does not answer within
    /// the request timeout yields [`LeaderView::Unknown`] at once (the last leader is
    /// not reported as still leading): a stopped server is reported within
    /// `retry_interval` + `request_timeout`. The stream ends after a final refusal.
    ///
    /// The stream is [`Unpin`]: `observe().next().await` with
    /// [`StreamExt`](futures_util::StreamExt) needs no `pin!`. Dropping it stops the
    /// polling and the watch.
    pub fn observe(&self) -> LeaderWatch {
        let state = Observer {
            election: self.clone(),
            last: None,
            watch: None,
        };
        let stream = futures_util::stream::unfold(state, |mut observer| async move {
            let view = observer.next().await?;
            Some((view, observer))
        });
        LeaderWatch {
            inner: Box::pin(stream),
        }
    }

    /// Runs this candidate until `cancel` fires: campaigns, leads until the
    /// leadership ends, campaigns again, and so on, telling `callbacks` as it goes
    /// (in the spirit of client-go's `RunOrDie` with `ReleaseOnCancel`).
    ///
    /// * **Started leading**: [`LeaderCallbacks::started_leading`] gets the
    ///   [`Leader`] and its [`cancellation_token`](Leader::cancellation_token), which
    ///   is cancelled the moment the leadership ends: at the latest at the lease's
    ///   safe deadline (the driver wakes for it on tokio's timer, which rounds up to
    ///   the millisecond; [`check`](Leader::check) refuses from the deadline itself),
    ///   which is the margin and the drift before the service can expire the key and
    ///   elect another.
    ///   Give the token to leader-only work, and [`check`](Leader::check) before
    ///   every write.
    /// * **Stopped leading**: [`LeaderCallbacks::stopped_leading`] once per started
    ///   leadership, after its token was cancelled, with how it ended.
    /// * **Release on cancel**: when `cancel` fires while leading, writes stop at
    ///   once, `stopped_leading` is called with [`LeaseEnd::Released`] (or the loss
    ///   that came first) before the release is sent (so before another candidate
    ///   can be elected), the key is released, and `run` returns once the release
    ///   has settled ([`LeaseHandle::settled`]: answered, or retried for at most twice
    ///   the TTL), so another candidate takes over without waiting for the TTL.
    ///   When `cancel` fires while campaigning, the campaign is withdrawn.
    /// * **New leader**: [`LeaderCallbacks::new_leader`] for every change of leader
    ///   [`observe`](Self::observe) reports (including this candidate), from the
    ///   first one on; [`LeaderView::Unknown`] is not a change (the service could not
    ///   be read), so it is not reported.
    ///
    /// Ordering: the callbacks are called one at a time, from the future `run`
    /// returns, never concurrently (so they take `&mut self`; keep them short and
    /// non-blocking: spawn the leader's work). `started_leading` and
    /// `stopped_leading` strictly alternate, starting with `started_leading`, and
    /// every `started_leading` is followed by its `stopped_leading` before `run`
    /// returns `Ok`. `new_leader` is polled, so it may come before or after this
    /// candidate's own `started_leading` (within one `retry_interval`).
    ///
    /// Ends with `Ok(())` after `cancel` fired, or with the error of a campaign
    /// that failed for good ([`AcquireError::is_final`]); a campaign that failed
    /// otherwise (the driver stopped, the lease lost before use) is retried after
    /// one `retry_interval`.
    pub async fn run<C: LeaderCallbacks>(
        self,
        mut callbacks: C,
        cancel: CancellationToken,
    ) -> Result<(), AcquireError> {
        let mut views = Views::new(self.observe());
        let retry: std::time::Duration = self.config.retry_interval().into();
        loop {
            // Campaign, following who leads meanwhile.
            let leader = {
                let campaign = self.campaign();
                tokio::pin!(campaign);
                loop {
                    tokio::select! {
                        biased;
                        () = cancel.cancelled() => return Ok(()),
                        elected = &mut campaign => break elected,
                        view = views.next() => views.report(view, &mut callbacks),
                    }
                }
            };
            let leader = match leader {
                Ok(leader) => leader,
                Err(why) if why.is_final() => return Err(why),
                Err(_) => {
                    tokio::select! {
                        () = cancel.cancelled() => return Ok(()),
                        () = tokio::time::sleep(retry) => continue,
                    }
                }
            };
            // Lead until the leadership ends or `cancel` fires.
            callbacks.started_leading(leader.cancellation_token(), &leader);
            let cancelled = loop {
                tokio::select! {
                    biased;
                    end = leader.lost() => break Some(end),
                    () = cancel.cancelled() => break None,
                    view = views.next() => views.report(view, &mut callbacks),
                }
            };
            if let Some(end) = cancelled {
                callbacks.stopped_leading(end);
                continue;
            }
            // Release on cancel: writes stop first, then the key goes.
            // No await between the two: the callback runs before the release can be
            // answered, hence before another candidate can be elected.
            leader.handle.request_release();
            callbacks.stopped_leading(leader.handle.end().unwrap_or(LeaseEnd::Released));
            leader.handle.release().await;
            leader.handle.settled().await;
            return Ok(());
        }
    }
}

/// What [`Election::run`] tells its caller. Every method has a default that does
/// nothing; see [`Election::run`] for when each is called and in which order.
pub trait LeaderCallbacks {
    /// This candidate was elected. `token` is cancelled the moment the leadership
    /// ends (at the latest at the safe deadline, before another can be elected):
    /// give it to the leader's work (spawned; this must not block), and write with
    /// the fence [`Leader::check`] returns.
    fn started_leading(&mut self, token: CancellationToken, leader: &Leader) {
        let _ = (token, leader);
    }

    /// The leadership that [`started_leading`](Self::started_leading) reported has
    /// ended (its token is already cancelled), and how.
    fn stopped_leading(&mut self, end: LeaseEnd) {
        let _ = end;
    }

    /// Who leads changed, as polled by [`Election::observe`] (`None`: nobody). Not
    /// called for [`LeaderView::Unknown`].
    fn new_leader(&mut self, leader: Option<LeaderInfo>) {
        let _ = leader;
    }
}

/// [`Election::observe`]'s state: the last view reported, and the watch of the key
/// for as long as that view stands.
struct Observer<S> {
    election: Election<S>,
    last: Option<LeaderView>,
    watch: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<S: LockService + 'static> Observer<S> {
    /// The next view that differs from the last one; `None` after a final refusal.
    async fn next(&mut self) -> Option<LeaderView> {
        let interval: std::time::Duration = self.election.config.retry_interval().into();
        loop {
            if self.last.is_some() {
                let tick = tokio::time::sleep(interval);
                match self.watch.as_mut() {
                    Some(watch) => {
                        tokio::select! {
                            () = tick => {}
                            () = watch => self.watch = None,
                        }
                    }
                    None => tick.await,
                }
            }
            let now = match self.election.leader().await {
                Ok(Some(info)) => LeaderView::Led(info),
                Ok(None) => LeaderView::Vacant,
                Err(ObserveError::Unavailable) => LeaderView::Unknown,
                Err(ObserveError::Refused(_)) => return None,
            };
            if self.last != Some(now) || self.watch.is_none() {
                self.watch = self.watch_from(now);
            }
            if self.last != Some(now) {
                self.last = Some(now);
                return Some(now);
            }
        }
    }

    /// A watch for a change from `view` (none while the service cannot be read: the
    /// polling finds out when it can).
    fn watch_from(&self, view: LeaderView) -> Option<Pin<Box<dyn Future<Output = ()> + Send>>> {
        let seen = match view {
            LeaderView::Unknown => return None,
            LeaderView::Vacant => None,
            LeaderView::Led(info) => Some(info.fence),
        };
        let service = Arc::clone(&self.election.service);
        let key = self.election.key.clone();
        Some(Box::pin(
            async move { service.holder_changed(&key, seen).await },
        ))
    }
}

/// `run`'s observer: a stream that stops being polled once it ended, and the last
/// known leader, to report only changes of it.
struct Views {
    stream: Option<LeaderWatch>,
    last: Option<Option<LeaderInfo>>,
}

impl Views {
    fn new(stream: LeaderWatch) -> Views {
        Views {
            stream: Some(stream),
            last: None,
        }
    }

    /// The next view; pending forever once the stream ended (after a final refusal).
    async fn next(&mut self) -> Option<LeaderView> {
        use futures_util::StreamExt;
        match self.stream.as_mut() {
            Some(stream) => stream.next().await,
            None => std::future::pending().await,
        }
    }

    fn report<C: LeaderCallbacks>(&mut self, view: Option<LeaderView>, callbacks: &mut C) {
        let known = match view {
            None => {
                self.stream = None;
                return;
            }
            Some(LeaderView::Unknown) => return,
            Some(LeaderView::Vacant) => None,
            Some(LeaderView::Led(info)) => Some(info),
        };
        if self.last != Some(known) {
            self.last = Some(known);
            callbacks.new_leader(known);
        }
    }
}

/// Who leads, as [`Election::observe`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderView {
    /// The service could not be read (no answer within the request timeout): who
    /// leads is not known. Not a vacancy, and not the last leader either.
    Unknown,
    /// Nobody leads.
    Vacant,
    /// A candidate leads (its identity and fence).
    Led(LeaderInfo),
}

impl LeaderView {
    /// The leader, if one is known to lead.
    pub const fn leader(&self) -> Option<LeaderInfo> {
        match *self {
            LeaderView::Led(info) => Some(info),
            LeaderView::Unknown | LeaderView::Vacant => None,
        }
    }
}

/// The stream [`Election::observe`] returns: [`Unpin`] and `Send`, so
/// [`StreamExt::next`](futures_util::StreamExt::next) works on it as it is.
pub struct LeaderWatch {
    inner: Pin<Box<dyn Stream<Item = LeaderView> + Send + 'static>>,
}

impl Stream for LeaderWatch {
    type Item = LeaderView;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaderView>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderWatch").finish_non_exhaustive()
    }
}

/// How many times [`Leader::check`] reads the gate when reads are torn
/// ([`GateError::Busy`](leasehold::GateError::Busy)) before it returns the refusal.
pub const CHECK_ATTEMPTS: u32 = 4;

/// `check`, read again while it is refused as `Busy` (a torn read), up to
/// [`CHECK_ATTEMPTS`] reads.
fn check_retrying_busy(
    mut check: impl FnMut() -> Result<Fence, CheckError>,
) -> Result<Fence, CheckError> {
    let mut attempts = 1;
    loop {
        match check() {
            Err(CheckError::Gate(GateError::Busy)) if attempts < CHECK_ATTEMPTS => {
                attempts += 1;
                std::hint::spin_loop();
            }
            done => return done,
        }
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
///
/// `Clone`: every clone (and every clone of its [`handle`](Self::handle)) keeps the
/// leadership. **Dropping the last one releases the key**: checks fail from then on
/// and the key is released in the background, best effort, bounded by the request
/// timeout, so a waiting candidate takes over without waiting for the TTL. To wait
/// for the release, [`resign`](Self::resign) instead.
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
    ///
    /// A refusal is not always a lost leadership. A torn read of the write gate
    /// ([`GateError::Busy`](leasehold::GateError::Busy)) is retried here, up to
    /// [`CHECK_ATTEMPTS`] reads in all, so it is returned only under a writer that
    /// keeps the gate busy. A fail-closed pause
    /// ([`GateError::Paused`](leasehold::GateError::Paused): a renewal's outcome is
    /// unknown) refuses this write but may pass again in this term:
    /// [`CheckError::is_temporary`] says so, and the leadership is lost only when
    /// [`CheckError::loss`] names a reason, the term was released
    /// ([`CheckError::ReleaseRequested`]), or the driver stopped — i.e. when
    /// [`lost`](Self::lost) completes.
    pub fn check(&self) -> Result<Fence, CheckError> {
        check_retrying_busy(|| self.handle.check())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_reads_again_after_torn_reads_and_gives_up_after_the_bound() {
        let busy = Err(CheckError::Gate(GateError::Busy));
        let mut reads = 0;
        let passed = check_retrying_busy(|| {
            reads += 1;
            if reads < CHECK_ATTEMPTS {
                busy
            } else {
                Ok(Fence(7))
            }
        });
        assert_eq!(passed, Ok(Fence(7)), "torn reads are not a lost leadership");
        assert_eq!(reads, CHECK_ATTEMPTS);

        let mut reads = 0;
        let refused = check_retrying_busy(|| {
            reads += 1;
            busy
        });
        assert_eq!(refused, busy, "bounded: a busy gate is returned in the end");
        assert_eq!(reads, CHECK_ATTEMPTS);

        let mut reads = 0;
        let paused = Err(CheckError::Gate(GateError::Paused));
        assert_eq!(
            check_retrying_busy(|| {
                reads += 1;
                paused
            }),
            paused
        );
        assert_eq!(reads, 1, "anything but a torn read is returned at once");
    }
}

/// `docs/election.md`, so that its `run` example is compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/election.md")]
struct ElectionGuide;
