//! Candidates of one `leasehold_tokio::Election`, each campaigning through a service
//! of its own (its own connection, typically through its own [`Proxy`],
//! so a fault can hit one candidate), for the election tests and failover benches
//! of every backend.
//!
//! Each candidate campaigns, leads until its leadership ends, and campaigns again.
//! [`Candidates::elected_after`] waits for a new leader and checks, at every sample
//! while it waits, that at most one candidate's `Leader::check()` passes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::{Config, Fence, Identity};
use leasehold_tokio::{
    AcquireError, CancellationToken, Election, Leader, LeaderCallbacks, LeaderView, LeaseEnd,
    LockService,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Proxy;

/// A leadership won by one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elected {
    /// Which candidate (its index in the services given to [`Candidates::start`]).
    pub index: usize,
    /// The leadership's fence.
    pub fence: Fence,
    /// When its `campaign()` returned.
    pub at: Instant,
}

#[derive(Default)]
struct Slot {
    /// The candidate's latest leadership, kept after it ended (its check must then
    /// fail on its own).
    leader: Option<(Leader, Instant)>,
    /// A campaign that failed for good.
    failed: Option<AcquireError>,
}

/// Candidates campaigning for one key; their tasks are aborted on drop.
pub struct Candidates {
    slots: Arc<Mutex<Vec<Slot>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Candidates {
    /// The identity candidate `i` campaigns with.
    pub fn identity(i: usize) -> Identity {
        Identity::lossy(&format!("candidate-{i}"))
    }

    /// One candidate per service, campaigning for `key` with `config`, on the
    /// current tokio runtime.
    ///
    /// # Panics
    ///
    /// When `key` breaks the key rules.
    pub fn start<S: LockService + 'static>(
        services: Vec<Arc<S>>,
        key: &str,
        config: Config,
    ) -> Candidates {
        let slots: Arc<Mutex<Vec<Slot>>> = Arc::new(Mutex::new(
            std::iter::repeat_with(Slot::default)
                .take(services.len())
                .collect(),
        ));
        let tasks = services
            .into_iter()
            .enumerate()
            .map(|(i, service)| {
                let election = Election::new(service, key, Candidates::identity(i), config)
                    .expect("a valid election key");
                let slots = slots.clone();
                tokio::spawn(async move {
                    loop {
                        match election.campaign().await {
                            Ok(leader) => {
                                lock(&slots)[i].leader = Some((leader.clone(), Instant::now()));
                                leader.lost().await;
                            }
                            Err(why) => {
                                lock(&slots)[i].failed = Some(why);
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        Candidates { slots, tasks }
    }

    /// The candidates whose leadership passes its check right now, with its fence.
    pub fn passing(&self) -> Vec<(usize, Fence)> {
        lock(&self.slots)
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| {
                let (leader, _) = slot.leader.as_ref()?;
                leader.check().ok().map(|fence| (i, fence))
            })
            .collect()
    }

    /// Candidate `i`'s latest leadership, ended or not.
    pub fn leader(&self, i: usize) -> Option<Leader> {
        lock(&self.slots)[i].leader.as_ref().map(|(l, _)| l.clone())
    }

    /// Waits until a candidate leads with a fence newer than `after` (any, for
    /// `None`) and returns it; samples every millisecond meanwhile, asserting that
    /// at most one candidate passes its check at each sample.
    ///
    /// # Panics
    ///
    /// When two candidates pass at once, a candidate's campaign failed for good, or
    /// no such leader is elected within `limit`.
    pub async fn elected_after(&self, after: Option<Fence>, limit: Duration) -> Elected {
        let give_up = Instant::now() + limit;
        loop {
            self.assert_at_most_one_leader();
            let newest = {
                let slots = lock(&self.slots);
                if let Some(failed) = slots.iter().find_map(|s| s.failed) {
                    panic!("a campaign failed: {failed}");
                }
                slots
                    .iter()
                    .enumerate()
                    .filter_map(|(index, slot)| {
                        let (leader, at) = slot.leader.as_ref()?;
                        let fence = leader.check().ok()?;
                        Some(Elected {
                            index,
                            fence,
                            at: *at,
                        })
                    })
                    .find(|e| after.is_none_or(|after| e.fence > after))
            };
            if let Some(elected) = newest {
                return elected;
            }
            assert!(
                Instant::now() < give_up,
                "no new leader within {limit:?} (after fence {after:?})"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Samples every millisecond for `span`, asserting at every sample that nobody
    /// passes its check (while the service cannot be reached by anyone).
    pub async fn assert_no_leader_for(&self, span: Duration) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            let passing = self.passing();
            assert!(
                passing.is_empty(),
                "a leader while nobody can renew: {passing:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Asserts that at most one candidate passes its check right now.
    pub fn assert_at_most_one_leader(&self) {
        let passing = self.passing();
        assert!(passing.len() <= 1, "two leaders at once: {passing:?}");
    }
}

impl Candidates {
    /// Failover after a stalled leader, `rounds` times: stall the leader's proxy
    /// (`proxies[i]` carries candidate `i`'s connection), time until a new leader's
    /// `campaign()` returned, resume the proxy. Before each stall, waits a growing
    /// part of `spread` (round k of n waits k/n of it) so the stalls fall at different
    /// points of the renewal cycle. Every wait samples "at most one leader".
    ///
    /// # Panics
    ///
    /// As [`elected_after`](Self::elected_after).
    pub async fn stalled_leader_failovers(
        &self,
        proxies: &[Proxy],
        rounds: usize,
        spread: Duration,
        limit: Duration,
    ) -> Vec<Duration> {
        let mut last = self.elected_after(None, limit).await;
        let mut times = Vec::new();
        for round in 0..rounds {
            let settle = spread.mul_f64(round as f64 / rounds.max(1) as f64);
            self.sample_for(settle).await;
            let stalled = self.leader(last.index).expect("the leader's slot");
            proxies[last.index].stall();
            let started = Instant::now();
            let next = self.elected_after(Some(last.fence), limit).await;
            times.push(next.at.saturating_duration_since(started));
            assert_ne!(
                next.index, last.index,
                "the stalled leader cannot lead again"
            );
            assert!(stalled.check().is_err(), "the stalled leader stopped");
            proxies[last.index].resume();
            last = next;
        }
        times
    }

    /// Failover after the server stopped, `rounds` times: `stop()` (e.g. `SIGSTOP`),
    /// wait `stopped_for` checking that nobody leads once `stopped_for` exceeds the
    /// TTL, `resume()`, and time from the resume until a new leader's `campaign()`
    /// returned.
    ///
    /// # Panics
    ///
    /// As [`elected_after`](Self::elected_after).
    pub async fn stopped_server_failovers(
        &self,
        rounds: usize,
        stopped_for: Duration,
        ttl: Duration,
        mut stop: impl FnMut(),
        mut resume: impl FnMut(),
        limit: Duration,
    ) -> Vec<Duration> {
        let mut last = self.elected_after(None, limit).await;
        let mut times = Vec::new();
        for _ in 0..rounds {
            stop();
            // Until the TTL has passed the leader may still pass (it cannot know);
            // after it, nobody may.
            self.sample_for(ttl).await;
            self.assert_no_leader_for(stopped_for.saturating_sub(ttl))
                .await;
            resume();
            let resumed = Instant::now();
            let next = self.elected_after(Some(last.fence), limit).await;
            times.push(next.at.saturating_duration_since(resumed));
            last = next;
        }
        times
    }

    /// Samples "at most one leader" every millisecond for `span`.
    pub async fn sample_for(&self, span: Duration) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            self.assert_at_most_one_leader();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// What a backend's election test gives [`five_candidates_scenario`].
pub struct Scenario<S, P, R> {
    /// One service per candidate, each through its own proxy (same order as
    /// `proxies`).
    pub services: Vec<Arc<S>>,
    /// The candidates' proxies, to stall a leader's connection.
    pub proxies: Vec<Proxy>,
    /// A service that does not campaign, straight to the server: the follower.
    pub outsider: Arc<S>,
    /// The election's key and config (its TTL is the one the stalls and the stop are
    /// measured against).
    pub key: &'static str,
    /// The candidates' config.
    pub config: Config,
    /// Stops the server (SIGSTOP).
    pub stop: P,
    /// Resumes it.
    pub resume: R,
    /// The longest wait for any new leader.
    pub limit: Duration,
}

/// The election contract on a real backend, the same for every one: five candidates
/// keep at most one leader at every sample; a follower's bounded campaign is refused
/// as `Busy` and names the leader, as `leader()` does; a leader whose connection
/// stalls past T is replaced (three times) by another with a newer fence, its own
/// check already failing; while the server is stopped for 2 T nobody leads once T
/// has passed, and after it resumes a leader comes with a newer fence.
///
/// # Panics
///
/// On any breach (this is a test helper).
pub async fn five_candidates_scenario<S: LockService + 'static>(
    scenario: Scenario<S, impl FnMut(), impl FnMut()>,
) {
    let Scenario {
        services,
        proxies,
        outsider,
        key,
        config,
        stop,
        resume,
        limit,
    } = scenario;
    let ttl: Duration = config.ttl().into();
    let candidates = Candidates::start(services, key, config);
    let last = candidates.elected_after(None, limit).await;

    let outsider = Election::new(outsider, key, Identity::lossy("outsider"), config)
        .expect("the outsider's election");
    match outsider.campaign_for(ttl / 5).await {
        Err(AcquireError::Busy { holder: Some(h) }) => {
            assert_eq!(h.identity, Candidates::identity(last.index));
            assert_eq!(h.fence, last.fence);
        }
        other => panic!("a follower's campaign: {other:?}"),
    }
    let named = outsider
        .leader()
        .await
        .expect("leader()")
        .expect("a leader");
    assert_eq!(named.identity, Candidates::identity(last.index));

    let stalls = candidates
        .stalled_leader_failovers(&proxies, 3, ttl / 3, limit)
        .await;
    println!(
        "failover after a stalled leader: {}",
        min_median_max(&stalls)
    );

    let stops = candidates
        .stopped_server_failovers(1, ttl * 2, ttl, stop, resume, limit)
        .await;
    println!(
        "leader again after the server resumed: {}",
        min_median_max(&stops)
    );
}

/// The failover figures of the election benches, the same for every backend: five
/// candidates (one service each, through `proxies`, same order); `rounds` stalls of
/// the leader's connection (timed from the stall to another candidate's `campaign()`
/// returning), then half as many stops of the server for 2 T (timed from `resume` to
/// a leader's `campaign()` returning). "At most one leader" is sampled throughout.
/// Prints the figures under `backend`'s name.
///
/// # Panics
///
/// On any breach of the election's safety, or no leader within 3 T.
pub async fn failover_figures<S: LockService + 'static>(
    backend: &str,
    services: Vec<Arc<S>>,
    proxies: &[Proxy],
    config: Config,
    rounds: usize,
    stop: impl FnMut(),
    resume: impl FnMut(),
) {
    let ttl: Duration = config.ttl().into();
    let limit = ttl * 3;
    let candidates = Candidates::start(services, "election", config);
    let stalls = candidates
        .stalled_leader_failovers(proxies, rounds, ttl / 3, limit)
        .await;
    let stops = candidates
        .stopped_server_failovers(rounds.div_ceil(2), ttl * 2, ttl, stop, resume, limit)
        .await;
    let retry = Duration::from(config.retry_interval());
    println!(
        "{backend}, 5 candidates, TTL {} ms (retry {retry:?}, jittered 0.5–1.5×):",
        ttl.as_millis()
    );
    println!("  stalled leader → new leader: {}", min_median_max(&stalls));
    println!(
        "    bound: TTL left at the stall (≤ {} ms) + {:?}",
        ttl.as_millis(),
        retry.mul_f64(1.5)
    );
    println!(
        "  server SIGCONT → leader again: {}",
        min_median_max(&stops)
    );
}

/// `min / median / max` of `times`, in ms, for a figures table.
pub fn min_median_max(times: &[Duration]) -> String {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    match (ms.first(), ms.get(ms.len() / 2), ms.last()) {
        (Some(min), Some(median), Some(max)) => {
            format!("{min:.0} / {median:.0} / {max:.0} ms ({} rounds)", ms.len())
        }
        _ => "no rounds".to_owned(),
    }
}

impl Drop for Candidates {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The five runners of [`run_scenario`]: what they need from the backend.
pub struct RunScenario<S, P, R> {
    /// One service per candidate.
    pub services: Vec<Arc<S>>,
    /// A service straight to the server for the observer (it does not campaign).
    pub observer: Arc<S>,
    /// The election's key.
    pub key: &'static str,
    /// The candidates' and the observer's config.
    pub config: Config,
    /// Stops the server (SIGSTOP).
    pub stop: P,
    /// Resumes it.
    pub resume: R,
    /// The longest wait for any new leader.
    pub limit: Duration,
}

/// A callback of [`Election::run`], as one candidate reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Called {
    /// `started_leading`, with the leadership's fence.
    Started(Fence),
    /// `stopped_leading`.
    Stopped(LeaseEnd),
}

struct Runner {
    i: usize,
    /// How many candidates are between `started_leading` and `stopped_leading`.
    leading: Arc<AtomicUsize>,
    /// Set when a `started_leading` found another candidate leading.
    two_leaders: Arc<AtomicBool>,
    calls: tokio::sync::mpsc::UnboundedSender<(usize, Called, Instant)>,
}

impl LeaderCallbacks for Runner {
    fn started_leading(&mut self, _token: CancellationToken, leader: &Leader) {
        if self.leading.fetch_add(1, Ordering::SeqCst) != 0 {
            self.two_leaders.store(true, Ordering::SeqCst);
        }
        let call = Called::Started(leader.granted_fence());
        let _ = self.calls.send((self.i, call, Instant::now()));
    }

    fn stopped_leading(&mut self, end: LeaseEnd) {
        self.leading.fetch_sub(1, Ordering::SeqCst);
        let _ = self
            .calls
            .send((self.i, Called::Stopped(end), Instant::now()));
    }
}

/// `Election::run` on a real backend: five candidates run; never two of them
/// between `started_leading` and `stopped_leading` at once; cancelling the leader's
/// `run` hands over to another (its `stopped_leading` says `Released`) well within
/// a TTL, and an observer reports the new leader; stopping the server (SIGSTOP) is
/// reported as [`LeaderView::Unknown`] within `retry_interval` + `request_timeout`
/// (plus 250 ms of scheduling slack), the leader stops leading, and after the server resumes a
/// new leader starts and is observed. Every candidate's callbacks alternate started /
/// stopped, starting with started and ending with stopped once all runs returned.
///
/// # Panics
///
/// On any breach (this is a test helper).
pub async fn run_scenario<S: LockService + 'static>(
    scenario: RunScenario<S, impl FnMut(), impl FnMut()>,
) {
    use futures_util::StreamExt;

    let RunScenario {
        services,
        observer,
        key,
        config,
        mut stop,
        mut resume,
        limit,
    } = scenario;
    let ttl: Duration = config.ttl().into();
    let retry: Duration = config.retry_interval().into();
    let request: Duration = config.request_timeout().into();
    let n = services.len();
    let leading = Arc::new(AtomicUsize::new(0));
    let two_leaders = Arc::new(AtomicBool::new(false));
    let (calls_tx, mut calls) = tokio::sync::mpsc::unbounded_channel();
    let mut runs = Vec::new();
    for (i, service) in services.into_iter().enumerate() {
        let election = Election::new(service, key, Candidates::identity(i), config)
            .expect("a valid election key");
        let cancel = CancellationToken::new();
        let runner = Runner {
            i,
            leading: leading.clone(),
            two_leaders: two_leaders.clone(),
            calls: calls_tx.clone(),
        };
        let run = tokio::spawn(election.run(runner, cancel.clone()));
        runs.push((cancel, Some(run)));
    }
    drop(calls_tx);

    let (views_tx, mut views) = tokio::sync::mpsc::unbounded_channel();
    let watch = Election::new(observer, key, Identity::lossy("observer"), config)
        .expect("the observer's election")
        .observe();
    let observing = tokio::spawn(async move {
        let mut watch = watch;
        while let Some(view) = watch.next().await {
            if views_tx.send((view, Instant::now())).is_err() {
                return;
            }
        }
    });

    let mut log: Vec<(usize, Called, Instant)> = Vec::new();
    // The next callback, logged.
    macro_rules! next_call {
        ($what:expr) => {{
            let call = tokio::time::timeout(limit, calls.recv())
                .await
                .unwrap_or_else(|_| panic!("{} within {:?}: {log:?}", $what, limit))
                .expect("the runners are alive");
            log.push(call);
            assert!(
                !two_leaders.load(Ordering::SeqCst),
                "two candidates lead at once: {log:?}"
            );
            call
        }};
    }
    // The observer's first view that satisfies `pred`.
    macro_rules! next_view {
        ($what:expr, $pred:expr) => {{
            let pred = $pred;
            loop {
                let (view, at) = tokio::time::timeout(limit, views.recv())
                    .await
                    .unwrap_or_else(|_| panic!("observed {} within {:?}", $what, limit))
                    .expect("the observer is alive");
                if pred(&view) {
                    break (view, at);
                }
            }
        }};
    }

    // A first leader, observed.
    let (first, first_fence) = match next_call!("a first leader") {
        (i, Called::Started(fence), _) => (i, fence),
        other => panic!("first callback {other:?}"),
    };
    let led_by = |i: usize, after: Fence| {
        move |view: &LeaderView| {
            matches!(view, LeaderView::Led(info)
                if info.identity == Candidates::identity(i) && info.fence >= after)
        }
    };
    next_view!("the first leader", led_by(first, first_fence));

    // Cancel the leader's run: it releases, another leads well within a TTL.
    let cancelled_at = Instant::now();
    runs[first].0.cancel();
    let run = runs[first].1.take().expect("running");
    let stopped = next_call!("the cancelled leader stops");
    assert!(
        matches!(stopped, (i, Called::Stopped(LeaseEnd::Released), _) if i == first),
        "{stopped:?}"
    );
    tokio::time::timeout(limit, run)
        .await
        .expect("run returns after the release settled")
        .expect("the run task")
        .expect("run ends with Ok after cancel");
    let (second, second_fence, second_at) = match next_call!("a second leader") {
        (i, Called::Started(fence), at) => (i, fence, at),
        other => panic!("after the release: {other:?}"),
    };
    assert_ne!(second, first);
    assert!(second_fence > first_fence);
    let handover = second_at - cancelled_at;
    println!("run cancelled → next leader started: {handover:?}");
    assert!(
        handover < ttl,
        "released on cancel: the next leader did not wait for the TTL ({handover:?})"
    );
    next_view!("the second leader", led_by(second, second_fence));

    // Stop the server: the observer says Unknown, the leader stops leading. (Views
    // from before the stop are dropped first.)
    while views.try_recv().is_ok() {}
    stop();
    let stopped_at = Instant::now();
    let (_, unknown_at) = next_view!("Unknown while stopped", |v: &LeaderView| {
        *v == LeaderView::Unknown
    });
    let unknown_after = unknown_at - stopped_at;
    println!("server stopped → observer reports Unknown: {unknown_after:?}");
    // The next query starts within a retry interval and times out after the request
    // timeout; the slack is for a loaded machine's scheduling.
    let bound = retry + request + Duration::from_millis(250);
    assert!(
        unknown_after <= bound,
        "Unknown after {unknown_after:?} (bound {bound:?})"
    );
    assert!(matches!(
        next_call!("the leader stops leading while the server is stopped"),
        (i, Called::Stopped(LeaseEnd::Lost(_)), _) if i == second
    ));
    resume();

    // After the resume, a new leader, observed.
    let (third, third_fence) = match next_call!("a leader after the resume") {
        (i, Called::Started(fence), _) => (i, fence),
        other => panic!("after the resume: {other:?}"),
    };
    assert!(third_fence > second_fence);
    next_view!("the leader after the resume", led_by(third, third_fence));

    // Cancel everyone; every run returns Ok.
    for (cancel, _) in &runs {
        cancel.cancel();
    }
    for (_, run) in &mut runs {
        if let Some(run) = run.take() {
            tokio::time::timeout(limit, run)
                .await
                .expect("run returns after cancel")
                .expect("the run task")
                .expect("run ends with Ok after cancel");
        }
    }
    while let Ok(call) = calls.try_recv() {
        log.push(call);
    }
    observing.abort();
    assert!(!two_leaders.load(Ordering::SeqCst), "two leaders: {log:?}");
    assert_eq!(leading.load(Ordering::SeqCst), 0, "{log:?}");
    for i in 0..n {
        let mine: Vec<Called> = log
            .iter()
            .filter(|&&(j, _, _)| j == i)
            .map(|&(_, c, _)| c)
            .collect();
        assert!(
            mine.chunks(2)
                .all(|pair| matches!(pair, [Called::Started(_), Called::Stopped(_)])),
            "candidate {i}: started / stopped alternate: {mine:?}"
        );
    }
    println!("callbacks: {log:?}");
}

/// An observer that polls only every `poll` (its config's `retry_interval`) sees a
/// candidate `a` elected, resigning, and `b` elected, each within `within` of the
/// change: pushed by the service's watch of the key
/// ([`LockService::holder_changed`]), not found by the poll. `a` and `b` campaign
/// for the observer's key; the key starts free.
pub async fn observer_sees_each_change_by_the_watch<S: LockService + 'static>(
    observer: Election<S>,
    a: Election<S>,
    b: Election<S>,
    poll: Duration,
    within: Duration,
) {
    use futures_util::StreamExt;

    let mut views = observer.observe();
    assert_eq!(views.next().await, Some(LeaderView::Vacant));

    let leader_a = a.campaign().await.expect("a is elected");
    let started = Instant::now();
    let seen = tokio::time::timeout(poll / 2, views.next()).await;
    let Ok(Some(LeaderView::Led(info))) = seen else {
        panic!("no new leader reported within {:?}: {seen:?}", poll / 2)
    };
    assert_eq!(info.fence, leader_a.granted_fence());
    let took = started.elapsed();
    assert!(took < within, "a's election reported after {took:?}");

    let started = Instant::now();
    leader_a.resign().await;
    let seen = tokio::time::timeout(poll / 2, views.next()).await;
    assert_eq!(seen.ok().flatten(), Some(LeaderView::Vacant));
    let took = started.elapsed();
    assert!(took < within, "a's resignation reported after {took:?}");

    let leader_b = b.campaign().await.expect("b is elected");
    let started = Instant::now();
    let seen = tokio::time::timeout(poll / 2, views.next()).await;
    let Ok(Some(LeaderView::Led(info))) = seen else {
        panic!("no new leader reported within {:?}: {seen:?}", poll / 2)
    };
    assert_eq!(info.fence, leader_b.granted_fence());
    let took = started.elapsed();
    assert!(took < within, "b's election reported after {took:?}");
}
