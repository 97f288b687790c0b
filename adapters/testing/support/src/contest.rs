//! Holders and contenders on a few keys through `leasehold-tokio`, and a sampler that
//! asks every client's `check()` every millisecond: the end-to-end form of "at most one
//! holder per key", for faults that only a whole system shows (a lock service that
//! restarts empty, is restored from a backup, or fails over).
//!
//! Each client loops: acquire its key (waiting as long as it takes), hold it for a
//! while, release, and again. The sampler counts, per key, the clients whose `check()`
//! passes at the same instant; two or more is an overlap, recorded with the fences.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::{Config, Fence};
use leasehold_tokio::{acquire_with, AcquireOptions, LeaseHandle, LockService};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Two clients of one key whose `check()` passed at the same sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// When (tokio's clock).
    pub at: Instant,
    /// The key.
    pub key: String,
    /// The fences `check()` returned.
    pub fences: Vec<Fence>,
}

/// A grant one of the clients received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// When `acquire` returned it (tokio's clock).
    pub at: Instant,
    /// The key.
    pub key: String,
    /// Its fence.
    pub fence: Fence,
}

/// What a [`Contest`] saw.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Samples taken (one per millisecond, or as often as the runtime allowed).
    pub samples: u64,
    /// The longest gap between two samples.
    pub longest_gap: Duration,
    /// Every overlap, in order.
    pub overlaps: Vec<Overlap>,
    /// Every grant, in order.
    pub grants: Vec<Grant>,
}

impl Outcome {
    /// The first grant at or after `at`.
    pub fn first_grant_since(&self, at: Instant) -> Option<&Grant> {
        self.grants.iter().find(|g| g.at >= at)
    }
}

/// Clients contending for keys, and the sampler; see the module docs.
pub struct Contest {
    stop: watch::Sender<bool>,
    clients: Vec<JoinHandle<()>>,
    sampler: JoinHandle<Outcome>,
    grants: Arc<Mutex<Vec<Grant>>>,
}

/// The clients holding a grant now: (key, handle), one slot per client.
type Holding = Arc<Mutex<Vec<Option<(String, LeaseHandle)>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Contest {
    /// Starts `per_key` clients on each of `keys`, each holding a grant for `hold`
    /// before it releases, with `config`; the sampler starts at once. Needs a tokio
    /// runtime (a multi-threaded one keeps the samples regular).
    pub fn start<S: LockService + 'static>(
        service: Arc<S>,
        keys: &[&str],
        per_key: usize,
        config: Config,
        hold: Duration,
    ) -> Contest {
        let (stop, stopped) = watch::channel(false);
        let holding: Holding = Arc::new(Mutex::new(vec![None; keys.len() * per_key]));
        let grants = Arc::new(Mutex::new(Vec::new()));
        let mut clients = Vec::new();
        for (i, key) in keys
            .iter()
            .flat_map(|k| std::iter::repeat_n(*k, per_key))
            .enumerate()
        {
            let (service, key, holding, grants) = (
                Arc::clone(&service),
                key.to_owned(),
                Arc::clone(&holding),
                Arc::clone(&grants),
            );
            let mut stopped = stopped.clone();
            clients.push(tokio::spawn(async move {
                while !*stopped.borrow() {
                    let acquire =
                        acquire_with(Arc::clone(&service), &key, config, AcquireOptions::new());
                    let lease = tokio::select! {
                        lease = acquire => lease,
                        _ = stopped.changed() => return,
                    };
                    let Ok(lease) = lease else {
                        continue;
                    };
                    lock(&grants).push(Grant {
                        at: Instant::now(),
                        key: key.clone(),
                        fence: lease.granted_fence(),
                    });
                    lock(&holding)[i] = Some((key.clone(), lease.clone()));
                    tokio::select! {
                        () = tokio::time::sleep(hold) => {}
                        _ = lease.lost() => {}
                        _ = stopped.changed() => {}
                    }
                    let _ = lease.release().await;
                    lock(&holding)[i] = None;
                }
            }));
        }
        let sampler = tokio::spawn(sample(holding, stopped));
        Contest {
            stop,
            clients,
            sampler,
            grants,
        }
    }

    /// The grants so far.
    pub fn grants(&self) -> Vec<Grant> {
        lock(&self.grants).clone()
    }

    /// Stops the clients (each releases what it holds) and the sampler; what it saw.
    ///
    /// # Panics
    ///
    /// When a client or the sampler panicked.
    pub async fn stop(self) -> Outcome {
        let _ = self.stop.send(true);
        for client in self.clients {
            client.await.expect("a contest client panicked");
        }
        let mut outcome = self.sampler.await.expect("the sampler panicked");
        outcome.grants = lock(&self.grants).clone();
        outcome
    }
}

/// Samples every millisecond until stopped.
async fn sample(holding: Holding, mut stopped: watch::Receiver<bool>) -> Outcome {
    let mut outcome = Outcome::default();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => return outcome,
        }
        let at = Instant::now();
        if let Some(last) = last {
            outcome.longest_gap = outcome.longest_gap.max(at - last);
        }
        last = Some(at);
        outcome.samples += 1;
        let mut passing: Vec<(String, Fence)> = lock(&holding)
            .iter()
            .flatten()
            .filter_map(|(key, lease)| lease.check().ok().map(|fence| (key.clone(), fence)))
            .collect();
        passing.sort();
        for pair in passing.windows(2) {
            if let [(a, fa), (b, fb)] = pair {
                if a == b {
                    outcome.overlaps.push(Overlap {
                        at,
                        key: a.clone(),
                        fences: vec![*fa, *fb],
                    });
                }
            }
        }
    }
}
