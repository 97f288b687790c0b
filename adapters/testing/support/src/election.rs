//! Candidates of one `leasehold_tokio::Election`, each campaigning through a service
//! of its own (its own connection, typically through its own [`Proxy`](crate::Proxy),
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
