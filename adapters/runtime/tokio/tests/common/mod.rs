//! Helpers for the adapter tests: a recording wrapper around the in-memory service,
//! and timeline helpers on tokio's paused clock.
//!
//! Every test runs on `#[tokio::test(start_paused = true)]`: time only moves when all
//! tasks wait, and jumps straight to the next timer, so a test of seconds of lease
//! time runs in milliseconds and every instant is exact.

#![allow(dead_code)]

use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use leasehold::{
    AcquireOutcome, Config, Duration, Fence, HolderOutcome, Identity, OwnerToken, Refusal,
    ReleaseOutcome, RenewOutcome,
};
use leasehold_driver::LockService;
use leasehold_tokio::memory::MemoryService;
use tokio::time::Instant;

/// `n` milliseconds, tokio's kind.
pub const fn ms(n: u64) -> std::time::Duration {
    std::time::Duration::from_millis(n)
}

/// A current-thread runtime on a paused clock, for a test that drives it by hand
/// (runs several, or drops one mid-lease), where `#[tokio::test]` gives one.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// `n` microseconds on a lease's clock.
pub const fn lease_us(n: u64) -> leasehold::Instant {
    leasehold::Instant::from_micros(n)
}

/// The default configuration for a lease of `ttl_ms`: renew every T/3, request
/// timeout T/10, retry T/20, margin T/20, drift 0.1 %.
///
/// For 900 ms: renew 300, timeout 90, retry 45, margin 45, drift 0.9 ms, so a grant
/// sent at `s` is safe until `s + 854.1 ms`.
pub fn config(ttl_ms: u64) -> Config {
    Config::builder(Duration::from_millis(ttl_ms))
        .build()
        .unwrap()
}

/// [`config`], failing closed or not: whether writes pause while a renewal's outcome
/// is unknown.
pub fn config_fail_closed(ttl_ms: u64, fail_closed: bool) -> Config {
    Config::builder(Duration::from_millis(ttl_ms))
        .fail_closed(fail_closed)
        .build()
        .unwrap()
}

/// A timeline: milliseconds since the test started.
#[derive(Clone, Copy, Debug)]
pub struct Timeline {
    pub start: Instant,
}

impl Timeline {
    pub fn start() -> Timeline {
        Timeline {
            start: Instant::now(),
        }
    }

    /// The instant `ms` after the start.
    pub fn at(&self, n: u64) -> Instant {
        self.start + ms(n)
    }

    /// Milliseconds since the start (rounded down).
    pub fn now_ms(&self) -> u64 {
        Instant::now().duration_since(self.start).as_millis() as u64
    }

    /// Microseconds since the start.
    pub fn now_us(&self) -> u64 {
        Instant::now().duration_since(self.start).as_micros() as u64
    }

    /// Sleeps until `n` ms after the start.
    pub async fn until(&self, n: u64) {
        tokio::time::sleep_until(self.at(n)).await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Acquire,
    Renew,
    Release,
}

/// One request a driver sent.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub at: Instant,
    pub kind: Kind,
    pub token: OwnerToken,
}

type Hook = Box<dyn FnMut(&Sent) + Send>;

/// The in-memory service, recording every request when it is sent (when the driver
/// creates it), and optionally calling a hook at that moment.
#[derive(Default)]
pub struct Recording {
    service: MemoryService,
    sent: Mutex<Vec<Sent>>,
    hook: Mutex<Option<Hook>>,
    /// Answer every acquire with this final refusal (what a Redis with a wrong
    /// password does), without asking the service.
    refuse: Mutex<Option<Refusal>>,
}

impl Deref for Recording {
    type Target = MemoryService;
    fn deref(&self) -> &MemoryService {
        &self.service
    }
}

impl Recording {
    pub fn new() -> Arc<Recording> {
        Arc::new(Recording::default())
    }

    /// From now on, every acquire is refused for good with `why`.
    pub fn refuse_acquires(&self, why: Refusal) {
        *self.refuse.lock().unwrap() = Some(why);
    }

    /// Calls `hook` as each request is sent, before the service sees it.
    pub fn on_send(&self, hook: impl FnMut(&Sent) + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }

    fn record(&self, kind: Kind, token: OwnerToken) {
        let sent = Sent {
            at: Instant::now(),
            kind,
            token,
        };
        self.sent.lock().unwrap().push(sent);
        if let Some(hook) = self.hook.lock().unwrap().as_mut() {
            hook(&sent);
        }
    }

    /// When `kind` requests from `owner`'s token were sent, in ms since `timeline`.
    pub fn sent_ms(&self, timeline: &Timeline, token: OwnerToken, kind: Kind) -> Vec<u64> {
        self.sent_us(timeline, token, kind)
            .into_iter()
            .map(|us| us / 1_000)
            .collect()
    }

    /// When `kind` requests from `token` were sent, in µs since `timeline`.
    pub fn sent_us(&self, timeline: &Timeline, token: OwnerToken, kind: Kind) -> Vec<u64> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.token == token && s.kind == kind)
            .map(|s| s.at.duration_since(timeline.start).as_micros() as u64)
            .collect()
    }

    /// Every request sent, in order.
    pub fn all_sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }
}

impl LockService for Recording {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send {
        self.record(Kind::Acquire, token);
        let refused = *self.refuse.lock().unwrap();
        async move {
            match refused {
                Some(why) => AcquireOutcome::Refused(why),
                None => LockService::acquire(&self.service, key, token, identity, ttl).await,
            }
        }
    }

    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> + Send {
        LockService::holder(&self.service, key)
    }

    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send {
        self.record(Kind::Renew, token);
        LockService::renew(&self.service, key, token, fence, ttl)
    }

    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> + Send {
        self.record(Kind::Release, token);
        LockService::release(&self.service, key, token)
    }

    fn revoked(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> impl Future<Output = ()> + Send {
        LockService::revoked(&self.service, key, token, fence)
    }
}

/// Awaits `future`, failing the test if it takes more than `limit_ms` of (virtual)
/// time: a broken rule must fail a test, not hang it.
#[track_caller]
pub fn within<F: Future>(limit_ms: u64, future: F) -> impl Future<Output = F::Output> {
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(ms(limit_ms), future).await {
            Ok(output) => output,
            Err(_) => panic!("{caller}: not done within {limit_ms} ms"),
        }
    }
}

/// Polls `future` once, without a runtime's help: `Some` if it completed.
pub fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::Pin::new(future).poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}
