//! Candidates of one `leasehold_tokio::Election`, each campaigning through a service
//! of its own (its own connection, typically through its own [`Proxy`],
//! so a fault can hit one candidate), for the election tests and failover benches
//! of every backend.
//!
//! Each candidate campaigns, leads until its leadership ends, and campaigns again.
//! [`Candidates::elected_after`] waits for a new leader and checks, at every sample
//! while it waits, that at most one candidate's `Leader::check()` passes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::{Config, Fence, Identity};
use leasehold_tokio::{AcquireError, Election, Leader, LockService};
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
