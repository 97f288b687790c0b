//! The two driver shapes, a task per lease (`acquire`) and a [`LeaseSet`], agree on
//! every timeline: each is driven by the same script of answers, on a paused clock,
//! and must send the same requests at the same instants, report the same events at
//! the same instants, and end the same way.
//!
//! Both step each lease through one step (`leasehold_driver::step`); what differs is
//! how they wait (a runtime timer per lease, or one queue of deadlines for the whole
//! set) and how the lease's futures are polled. A difference in either shows here.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, Indeterminate, Owner,
    OwnerToken, ReleaseOutcome, RenewOutcome,
};
use leasehold_driver::LockService;
use leasehold_tokio::{AcquireOptions, LeaseEnd, LeaseSet};
use tokio::time::Instant;

/// One scripted answer: after how many ms, or never (the request times out).
#[derive(Clone, Copy, Debug)]
enum Reply<T> {
    After(u64, T),
    Never,
}

/// The answers, in order, to each kind of request; past the end of a list, an
/// acquire is never answered, a renewal is confirmed at once, a release too.
#[derive(Clone, Debug, Default)]
struct Script {
    acquires: Vec<Reply<AcquireOutcome>>,
    renewals: Vec<Reply<RenewOutcome>>,
    releases: Vec<Reply<ReleaseOutcome>>,
    /// When the user asks for the release, in ms after the grant (never if `None`).
    release_at: Option<u64>,
}

/// What one shape did: every request sent and every event, each with its instant
/// (µs since the acquire began), then how the term ended.
#[derive(Debug, PartialEq, Eq)]
struct Timeline {
    seen: Vec<(u64, String)>,
    end: LeaseEnd,
}

/// A lock service that answers from a [`Script`] and notes each request as it is
/// created.
struct Scripted {
    acquires: Mutex<VecDeque<Reply<AcquireOutcome>>>,
    renewals: Mutex<VecDeque<Reply<RenewOutcome>>>,
    releases: Mutex<VecDeque<Reply<ReleaseOutcome>>>,
    start: Instant,
    seen: Arc<Mutex<Vec<(u64, String)>>>,
}

impl Scripted {
    fn new(script: &Script, seen: Arc<Mutex<Vec<(u64, String)>>>) -> Scripted {
        Scripted {
            acquires: Mutex::new(script.acquires.iter().copied().collect()),
            renewals: Mutex::new(script.renewals.iter().copied().collect()),
            releases: Mutex::new(script.releases.iter().copied().collect()),
            start: Instant::now(),
            seen,
        }
    }

    fn note(&self, what: String) {
        let at = self.start.elapsed().as_micros() as u64;
        self.seen.lock().unwrap().push((at, what));
    }
}

/// The answer `reply` scripts, or `otherwise` once the script is used up (`None`:
/// never).
async fn answer<T: Send>(reply: Option<Reply<T>>, otherwise: Option<T>) -> T {
    let scripted = match reply {
        Some(Reply::After(ms, outcome)) => Some((ms, outcome)),
        Some(Reply::Never) => None,
        None => otherwise.map(|outcome| (0, outcome)),
    };
    match scripted {
        Some((ms, outcome)) => {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            outcome
        }
        None => std::future::pending().await,
    }
}

impl LockService for Scripted {
    fn acquire(
        &self,
        _key: &str,
        _token: OwnerToken,
        _identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send {
        self.note(format!("sent acquire {ttl:?}"));
        answer(self.acquires.lock().unwrap().pop_front(), None)
    }

    fn renew(
        &self,
        _key: &str,
        _token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send {
        self.note(format!("sent renew {fence:?} {ttl:?}"));
        let otherwise = RenewOutcome::Renewed { ttl };
        answer(self.renewals.lock().unwrap().pop_front(), Some(otherwise))
    }

    fn release(
        &self,
        _key: &str,
        _token: OwnerToken,
    ) -> impl Future<Output = ReleaseOutcome> + Send {
        self.note("sent release".into());
        let otherwise = ReleaseOutcome::Released;
        answer(self.releases.lock().unwrap().pop_front(), Some(otherwise))
    }

    fn holder(&self, _key: &str) -> impl Future<Output = HolderOutcome> + Send {
        std::future::ready(HolderOutcome::Free)
    }
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    TaskPerLease,
    Set,
}

/// Runs `script` through `shape` on a fresh paused runtime.
fn run(shape: Shape, script: &Script) -> Timeline {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let service = Arc::new(Scripted::new(script, Arc::clone(&seen)));
        let start = service.start;
        let config = leasehold::Config::builder(Duration::from_millis(900))
            .build()
            .unwrap();
        // One owner for both: it seeds the retry jitter.
        let options = AcquireOptions::new().owner(Owner([7; 16]));
        let handle = match shape {
            Shape::TaskPerLease => {
                leasehold_tokio::acquire_with(service, "k", config, options).await
            }
            Shape::Set => {
                let set = LeaseSet::with_drivers(service, config, 1);
                set.acquire_with("k", options).await
            }
        }
        .expect("the script grants the key");
        let mut events = handle.events();
        let end = match script.release_at {
            Some(ms) => {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                handle.release().await
            }
            None => handle.lost().await,
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), handle.settled())
            .await
            .expect("the release settles");
        while let Ok(timed) = events.try_recv() {
            let at = timed.at.duration_since(start).as_micros() as u64;
            seen.lock()
                .unwrap()
                .push((at, format!("{:?}", timed.event)));
        }
        let mut seen = std::mem::take(&mut *seen.lock().unwrap());
        // Sends and events at one instant in the order each was made.
        seen.sort_by_key(|(at, _)| *at);
        Timeline { seen, end }
    })
}

/// [`run`] on a thread of its own, bounded in real time: a driver that never lets
/// the paused clock advance (it spins) fails the test instead of hanging it.
fn run_bounded(shape: Shape, script: &Script) -> Timeline {
    let (done, timeline) = std::sync::mpsc::channel();
    let script = script.clone();
    std::thread::spawn(move || done.send(run(shape, &script)));
    timeline
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{shape:?}: the script did not end within 60 s"))
}

/// Both shapes, one script: the same timeline, and it has the length the script
/// makes (so an empty run does not pass).
fn agree(script: Script, at_least: usize) {
    let task = run_bounded(Shape::TaskPerLease, &script);
    let set = run_bounded(Shape::Set, &script);
    assert_eq!(task, set, "the task per lease and the set disagree");
    assert!(
        task.seen.len() >= at_least,
        "only {} steps seen: {:#?}",
        task.seen.len(),
        task.seen
    );
}

fn granted(fence: u64) -> AcquireOutcome {
    AcquireOutcome::Granted {
        fence: Fence(fence),
        ttl: Duration::from_millis(900),
    }
}

/// Held, unanswered, granted; then renewals confirmed late, lost to the request
/// timeout, failed, confirmed, and finally refused: the term is lost, and the release
/// after the loss is retried once.
#[test]
fn a_term_lost_after_failed_renewals() {
    let held = Holder::turn_of(Identity::lossy("other"), Duration::from_millis(40));
    agree(
        Script {
            acquires: vec![
                Reply::After(10, AcquireOutcome::HeldByAnother(held)),
                Reply::Never,
                Reply::After(5, granted(7)),
            ],
            renewals: vec![
                Reply::After(
                    20,
                    RenewOutcome::Renewed {
                        ttl: Duration::from_millis(900),
                    },
                ),
                Reply::Never,
                Reply::After(3, RenewOutcome::Indeterminate(Indeterminate::Transport)),
                Reply::After(
                    1,
                    RenewOutcome::Renewed {
                        ttl: Duration::from_millis(900),
                    },
                ),
                Reply::After(10, RenewOutcome::NotOwner),
            ],
            releases: vec![Reply::After(
                2,
                ReleaseOutcome::Indeterminate(Indeterminate::Service),
            )],
            release_at: None,
        },
        13,
    );
}

/// Renewals that never come back: the lease holds to its safe deadline and no
/// further, then the release is sent.
#[test]
fn a_term_that_runs_out_of_time() {
    agree(
        Script {
            acquires: vec![Reply::After(1, granted(3))],
            renewals: vec![Reply::Never; 20],
            releases: vec![],
            release_at: None,
        },
        8,
    );
}

/// The user releases while a renewal is in flight; the release is answered late.
#[test]
fn a_release_during_a_renewal() {
    agree(
        Script {
            acquires: vec![Reply::After(2, granted(9))],
            renewals: vec![
                Reply::After(
                    1,
                    RenewOutcome::Renewed {
                        ttl: Duration::from_millis(900),
                    },
                ),
                Reply::After(
                    50,
                    RenewOutcome::Renewed {
                        ttl: Duration::from_millis(900),
                    },
                ),
            ],
            releases: vec![Reply::After(30, ReleaseOutcome::Released)],
            release_at: Some(620),
        },
        6,
    );
}

/// Answers that arrive at the very instant their request times out (the request
/// timeout is 90 ms): the answer counts, in both shapes, before the timeout.
#[test]
fn answers_at_the_instant_of_their_timeout() {
    agree(
        Script {
            acquires: vec![Reply::After(90, granted(4))],
            renewals: vec![
                Reply::After(
                    90,
                    RenewOutcome::Renewed {
                        ttl: Duration::from_millis(900),
                    },
                ),
                Reply::After(90, RenewOutcome::NotOwner),
            ],
            releases: vec![],
            release_at: None,
        },
        5,
    );
}
