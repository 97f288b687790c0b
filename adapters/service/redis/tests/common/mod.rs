//! What the Redis tests share beyond `leasehold-test-support` (servers, proxy,
//! `Storage`, `wait_for` come from there and are re-exported here): a monotonic clock
//! shared across processes, a lease runner built on `leasehold_driver::run_term`, the
//! service and raw connections on a server, and a watcher that measures the
//! service-side expiry. Everything here knows Redis's lock values or the
//! `RedisLockService` type, which is why it is not in the shared crate.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use leasehold::{
    Config, Duration, Event, Fence, Identity, Instant, Lease, LossReason, Owner, OwnerToken,
    WriteGate,
};
use leasehold_driver::{run_term, Clock, Report, Target, TermEnd};
use leasehold_redis::{Acquired, RedisLockService, Renewed};
use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, oneshot};

#[allow(unused_imports)]
pub use leasehold_test_support::redis::resp_frame_len;
#[allow(unused_imports)]
pub use leasehold_test_support::{
    binary, binary_in, free_port, scratch_dir, wait_for, Proxy, ProxyMode, RedisOptions,
    RedisServer, Storage, TlsFiles,
};

/// Now on `CLOCK_MONOTONIC`, in microseconds: the same timeline in every process on
/// this machine, so a child process's deadlines compare with the parent's readings.
pub fn mono_now() -> Instant {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    Instant::from_micros(ts.tv_sec() as u64 * 1_000_000 + ts.tv_nsec() as u64 / 1_000)
}

/// The driver's clock: `CLOCK_MONOTONIC` for now, tokio's timer for sleeping.
#[derive(Clone, Copy, Debug, Default)]
pub struct MonoClock;

impl Clock for MonoClock {
    fn now(&self) -> Instant {
        mono_now()
    }
    fn sleep_until(&self, deadline: Instant) -> impl std::future::Future<Output = ()> {
        let wait = deadline.saturating_duration_since(mono_now());
        tokio::time::sleep(StdDuration::from_micros(wait.as_micros()))
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn std_ms(n: u64) -> StdDuration {
    StdDuration::from_millis(n)
}

/// A lease config for TTL `ttl_ms` with the defaults (renew at T/3, margin T/20…).
pub fn config(ttl_ms: u64) -> Config {
    Config::builder(ms(ttl_ms)).build().expect("valid config")
}

/// A single-threaded runtime with a `LocalSet`: `run_term` over the blanket
/// `LocalLockService` impl is not `Send`, so terms run on `spawn_local`.
pub fn run_local<F: std::future::Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    tokio::task::LocalSet::new().block_on(&rt, f)
}

/// One term of a lease, running on the current `LocalSet`.
pub struct Running {
    pub gate: Arc<WriteGate>,
    pub owner: Owner,
    pub key: String,
    events: mpsc::UnboundedReceiver<(Instant, Event)>,
    /// Every event seen so far, with the monotonic time it was reported.
    pub log: Rc<RefCell<Vec<(Instant, Event)>>>,
    release: Option<oneshot::Sender<()>>,
    /// When the driver took the release request: the gate closes in that same poll.
    release_taken: Rc<Cell<Option<Instant>>>,
    end: Option<tokio::task::JoinHandle<TermEnd>>,
}

/// Starts one term for `key` (acquire, renew every T/3, until lost or released).
pub fn spawn_term<C>(service: RedisLockService<C>, key: &str, config: Config) -> Running
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    spawn_term_as(
        service,
        key,
        config,
        leasehold_redis::random_owner().expect("an OS random source"),
    )
}

pub fn spawn_term_as<C>(
    service: RedisLockService<C>,
    key: &str,
    config: Config,
    owner: Owner,
) -> Running
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let gate = Arc::new(WriteGate::new());
    let (tx, events) = mpsc::unbounded_channel();
    let (release, release_rx) = oneshot::channel::<()>();
    let log = Rc::new(RefCell::new(Vec::new()));
    let task_gate = gate.clone();
    let task_key = key.to_owned();
    let task_log = log.clone();
    let release_taken = Rc::new(Cell::new(None));
    let taken = release_taken.clone();
    let end = tokio::task::spawn_local(async move {
        let mut lease = Lease::new(config, owner);
        let released = async move {
            // A dropped sender means "never release".
            if release_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
            taken.set(Some(mono_now()));
        };
        let identity = identity_of(owner);
        run_term(
            &mut lease,
            &task_gate,
            Target {
                service: &service,
                key: &task_key,
                owner,
                identity: &identity,
            },
            &MonoClock,
            Instant::MAX,
            released,
            |report| {
                if let Report::Event(event) = report {
                    let at = mono_now();
                    task_log.borrow_mut().push((at, event));
                    let _ = tx.send((at, event));
                }
            },
        )
        .await
        .expect("a fresh lease is idle")
    });
    Running {
        gate,
        owner,
        key: key.to_owned(),
        events,
        log,
        release: Some(release),
        release_taken,
        end: Some(end),
    }
}

/// The identity a test term presents: `term-` and the owner's first bytes in hex.
pub fn identity_of(owner: Owner) -> Identity {
    let hex: String = owner.0[..4].iter().map(|b| format!("{b:02x}")).collect();
    Identity::new(&format!("term-{hex}")).expect("a short printable identity")
}

/// The owner-token part of a lock value (`<token>\n<fence>\n<identity>`).
pub fn token_of(value: &str) -> &str {
    value.split('\n').next().unwrap_or(value)
}

/// The owner token stored in lock `key`, if any.
pub async fn stored_token(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    let lock = leasehold_redis::Keys::new(key).unwrap().lock;
    let value: Option<String> = redis::AsyncCommands::get(conn, lock).await.unwrap();
    value.map(|v| token_of(&v).to_owned())
}

impl Running {
    /// The owner token Redis stores for this holder's (first) term.
    pub fn token(&self) -> String {
        self.owner
            .token(leasehold::Term(1))
            .encode()
            .as_str()
            .to_owned()
    }

    /// The next event matching `pred`, within `limit`.
    pub async fn next_event(
        &mut self,
        what: &str,
        limit: StdDuration,
        mut pred: impl FnMut(&Event) -> bool,
    ) -> (Instant, Event) {
        let give_up = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(give_up, self.events.recv()).await {
                Ok(Some((at, event))) if pred(&event) => return (at, event),
                Ok(Some(_)) => {}
                Ok(None) => panic!(
                    "the term ended before {what}; events: {:?}",
                    self.log.borrow()
                ),
                Err(_) => panic!(
                    "timed out after {limit:?} waiting for {what}; events: {:?}",
                    self.log.borrow()
                ),
            }
        }
    }

    /// The grant (fence, deadline) if it comes before `until`; `None` otherwise or if
    /// the term ended first.
    pub async fn acquired_before(
        &mut self,
        until: tokio::time::Instant,
    ) -> Option<(Fence, Instant)> {
        loop {
            match tokio::time::timeout_at(until, self.events.recv()).await {
                Ok(Some((
                    _,
                    Event::Acquired {
                        fence, deadline, ..
                    },
                ))) => return Some((fence, deadline)),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// When the grant was reported (an upper bound on when the gate opened).
    pub fn acquired_at(&self) -> Option<Instant> {
        self.log.borrow().iter().find_map(|(at, e)| match e {
            Event::Acquired { .. } => Some(*at),
            _ => None,
        })
    }

    /// Waits for the grant: its fence and safe deadline.
    pub async fn acquired(&mut self, limit: StdDuration) -> (Fence, Instant) {
        match self
            .next_event("the grant", limit, |e| matches!(e, Event::Acquired { .. }))
            .await
        {
            (
                _,
                Event::Acquired {
                    fence, deadline, ..
                },
            ) => (fence, deadline),
            _ => unreachable!(),
        }
    }

    /// Waits for the loss: when it was reported and why.
    pub async fn lost(&mut self, limit: StdDuration) -> (Instant, LossReason) {
        match self
            .next_event("the loss", limit, |e| matches!(e, Event::Lost { .. }))
            .await
        {
            (at, Event::Lost { reason, .. }) => (at, reason),
            _ => unreachable!(),
        }
    }

    /// When the latest grant or renewal was reported (its reply had arrived, so Redis
    /// had executed it).
    pub fn last_grant_at(&self) -> Option<Instant> {
        self.log.borrow().iter().rev().find_map(|(at, e)| match e {
            Event::Acquired { .. } | Event::Renewed { .. } => Some(*at),
            _ => None,
        })
    }

    /// The latest safe deadline the gate was opened with (grant or renewal).
    pub fn last_deadline(&self) -> Option<Instant> {
        self.log.borrow().iter().rev().find_map(|(_, e)| match e {
            Event::Acquired { deadline, .. } | Event::Renewed { deadline, .. } => Some(*deadline),
            _ => None,
        })
    }

    /// When the gate closed for good: the last safe deadline, or earlier the loss
    /// report (the gate flips just before it) or the moment the driver took the
    /// release request (the gate closes in that same poll, before the release is
    /// sent, so before any other client can be granted the key).
    pub fn gate_closed_at(&self) -> Option<Instant> {
        let log = self.log.borrow();
        let lost = log.iter().find_map(|(at, e)| match e {
            Event::Lost { .. } => Some(*at),
            _ => None,
        });
        let ended = match (lost, self.release_taken.get()) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some(self.last_deadline().map_or(ended, |d| d.min(ended)))
    }

    pub fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.log.borrow().iter().filter(|(_, e)| pred(e)).count()
    }

    /// Asks for release and waits for the term to end.
    pub async fn release(mut self) -> TermEnd {
        self.release_and_wait().await
    }

    /// [`release`](Self::release), keeping the holder for inspection.
    pub async fn release_and_wait(&mut self) -> TermEnd {
        if let Some(tx) = self.release.take() {
            let _ = tx.send(());
        }
        self.end().await
    }

    /// Waits for the term to end by itself.
    pub async fn end(&mut self) -> TermEnd {
        let end = self.end.take().expect("end awaited once");
        tokio::time::timeout(std_ms(10_000), end)
            .await
            .expect("the term ends")
            .expect("the term task does not panic")
    }

    /// Stops the term's task without a release (a crash, as far as Redis can tell).
    pub fn crash(mut self) {
        if let Some(end) = self.end.take() {
            end.abort();
        }
    }
}

/// A raw connection for commands from "outside" (another client, an operator).
pub async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// `redis://127.0.0.1:<port>` of a proxy (in front of a server without a password).
pub fn proxy_url(proxy: &Proxy) -> String {
    format!("redis://127.0.0.1:{}", proxy.port())
}

/// The service on `url`: requests bounded by 2 s, TTLs up to 60 s (the longest the
/// tests ask for), and so a quarantine of 60 s after a loss of state.
pub async fn service(url: &str) -> RedisLockService {
    service_with_max_ttl(url, std_ms(60_000)).await
}

/// [`service`] with `max_ttl`: the longest TTL it grants, and its quarantine.
pub async fn service_with_max_ttl(url: &str, max_ttl: StdDuration) -> RedisLockService {
    RedisLockService::builder(url)
        .request_timeout(std_ms(2_000))
        .max_ttl(max_ttl)
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// Samples `GET key` + `PTTL key` atomically, every few ms, on its own connection.
pub struct KeyWatcher {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Debug)]
pub struct Sample {
    /// When the request was sent / its answer received (monotonic).
    pub sent: Instant,
    pub received: Instant,
    /// The owner token holding the key (the value's first line).
    pub holder: Option<String>,
    pub pttl_ms: i64,
}

impl KeyWatcher {
    pub async fn start(url: &str, key: &str) -> KeyWatcher {
        let mut conn = raw(url).await;
        let lock = leasehold_redis::Keys::new(key).unwrap().lock;
        let samples = Arc::new(Mutex::new(Vec::new()));
        let out = samples.clone();
        let task = tokio::spawn(async move {
            let script = redis::Script::new(
                "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}",
            );
            loop {
                let sent = mono_now();
                let reply: Result<(Option<String>, i64), _> =
                    script.key(&lock).invoke_async(&mut conn).await;
                let received = mono_now();
                if let Ok((value, pttl_ms)) = reply {
                    out.lock().unwrap().push(Sample {
                        sent,
                        received,
                        holder: value.map(|v| token_of(&v).to_owned()),
                        pttl_ms,
                    });
                }
                tokio::time::sleep(std_ms(2)).await;
            }
        });
        KeyWatcher { samples, task }
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// A lower bound on when Redis expires (or expired) `token`'s grant, on the
    /// monotonic clock: the latest `sent + PTTL` of a sample that saw `token` hold
    /// the key. Redis evaluated PTTL no earlier than `sent`, so its expiry moment is
    /// at least that late.
    pub fn expiry_lower_bound(&self, token: &str) -> Option<Instant> {
        self.samples()
            .iter()
            .filter(|s| s.holder.as_deref() == Some(token) && s.pttl_ms > 0)
            .map(|s| {
                s.sent
                    .saturating_add(Duration::from_millis(s.pttl_ms as u64))
            })
            .max()
    }

    /// The first moment a sample saw the key no longer held by `token`, after it was.
    pub fn gone_at(&self, token: &str) -> Option<Instant> {
        let samples = self.samples();
        let last = samples
            .iter()
            .rposition(|s| s.holder.as_deref() == Some(token))?;
        samples.get(last + 1).map(|s| s.received)
    }

    /// Waits for a sample, sent after `holder`'s latest grant or renewal was
    /// reported, that shows the key held by it: the expiry bound then covers that
    /// renewal.
    pub async fn wait_covers(&self, holder: &Running) {
        let token = holder.token();
        let after = holder.last_grant_at().expect("granted");
        self.wait_until("a sample after the latest renewal", std_ms(1_000), |s| {
            s.sent > after && s.holder.as_deref() == Some(token.as_str())
        })
        .await;
    }

    pub async fn wait_until(&self, what: &str, limit: StdDuration, pred: impl Fn(&Sample) -> bool) {
        wait_for(what, limit, || {
            let hit = self.samples().last().is_some_and(&pred);
            async move { hit }
        })
        .await;
    }
}

impl Drop for KeyWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// On a fresh `key`: `token` is granted, renews its fence, and `holder` names that
/// fence; returns it.
pub async fn grant_renew_and_find_fence(
    service: &RedisLockService,
    key: &str,
    token: OwnerToken,
    identity: &Identity,
) -> Fence {
    let granted = service
        .try_acquire(key, token, identity, ms(1_000))
        .await
        .unwrap();
    let Acquired::Granted { fence, .. } = granted else {
        panic!("{granted:?}")
    };
    assert!(matches!(
        service
            .try_renew(key, token, fence, ms(1_000))
            .await
            .unwrap(),
        Renewed::Renewed { .. }
    ));
    assert_eq!(
        service.try_holder(key).await.unwrap().map(|h| h.fence),
        Some(fence)
    );
    fence
}

/// The raw peer's script in the renewal benches: compare the whole value, `PEXPIRE`
/// (the honest floor a lease renewal can be compared with).
pub const COMPARE_PEXPIRE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// The fence every bench lease holds (17 digits; Redis's clock in µs has 16 until
/// 2286): [`bench_acquire`] raises each key's counter to just below it first, so that
/// the counter decides over the clock, a renewal knows its fence without asking, and
/// the raw peer's value is as long as leasehold's.
pub const BENCH_FENCE: Fence = Fence(10_000_000_000_000_001);

/// Acquires `key` for `token` at [`BENCH_FENCE`], for `ttl`.
pub async fn bench_acquire<C>(
    service: &RedisLockService<C>,
    key: &str,
    token: OwnerToken,
    ttl: Duration,
) where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let below = Fence(BENCH_FENCE.0 - 1);
    service.raise_fence(key, below).await.expect("raise_fence");
    let granted = service
        .try_acquire(key, token, &Identity::EMPTY, ttl)
        .await
        .expect("leasehold acquire");
    assert!(
        matches!(granted, Acquired::Granted { fence, .. } if fence == BENCH_FENCE),
        "{granted:?}"
    );
}

/// The raw peer's value: the same bytes as leasehold's (`<token>\n<fence>\n`, empty
/// identity, [`BENCH_FENCE`]), so both scripts compare equally long strings.
pub fn raw_value(token: OwnerToken) -> String {
    format!("{}\n{}\n", token.encode().as_str(), BENCH_FENCE.0)
}
