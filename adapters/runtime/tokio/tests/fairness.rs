//! Fair waiting (`leasehold::rules`, "Acquiring"): a holder that releases and acquires
//! again lets the waiters go first, so contenders that loop acquire → work → release
//! all get turns; and the retry jitter spreads waiting contenders over the retry
//! interval instead of sending their attempts in lock step.
//!
//! Both are measured against the alternative in the same run (contending at once
//! after a release; one jitter seed for every waiter) and print their figures:
//! `cargo test -p leasehold-tokio --test fairness -- --nocapture`.

mod common;

use std::sync::{Arc, Mutex};

use common::{config, ms, Kind, Recording, Timeline};
use leasehold::{Identity, Owner};
use leasehold_tokio::memory::MemoryService;
use leasehold_tokio::{acquire_with, AcquireOptions, LockService};

const KEY: &str = "turns";

/// A deterministic owner for contender `i`'s `n`-th acquire, unique per acquire; its
/// first four bytes seed the acquire's retry jitter, so runs repeat exactly.
fn owner(i: u64, n: u64) -> Owner {
    let mut x = (i << 32 | n).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let mut bytes = [0; 16];
    bytes[..8].copy_from_slice(&x.to_le_bytes());
    bytes[8..].copy_from_slice(&(i << 32 | n).to_le_bytes());
    Owner(bytes)
}

/// Terms per contender, and Jain's fairness index of them: (Σx)² / (n · Σx²), 1 when
/// all are equal, 1/n when one contender has them all.
struct Spread {
    terms: Vec<u64>,
}

impl Spread {
    fn jain(&self) -> f64 {
        let sum: f64 = self.terms.iter().map(|&t| t as f64).sum();
        let squares: f64 = self.terms.iter().map(|&t| (t as f64).powi(2)).sum();
        if squares == 0.0 {
            return 0.0;
        }
        sum * sum / (self.terms.len() as f64 * squares)
    }

    fn min(&self) -> u64 {
        self.terms.iter().copied().min().unwrap_or(0)
    }

    fn max(&self) -> u64 {
        self.terms.iter().copied().max().unwrap_or(0)
    }
}

/// `contenders` tasks on one key for `secs` virtual seconds, each looping acquire →
/// `work_ms` of work (checking its lease) → release → acquire again at once.
async fn contend(contenders: u64, secs: u64, work_ms: u64, yield_turn: bool) -> Spread {
    let timeline = Timeline::start();
    let service = Arc::new(MemoryService::new());
    let terms = Arc::new(Mutex::new(vec![0_u64; contenders as usize]));
    let holding = Arc::new(Mutex::new(None::<u64>));
    let mut tasks = Vec::new();
    for i in 0..contenders {
        let (service, terms, holding) = (service.clone(), terms.clone(), holding.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0.. {
                let options = AcquireOptions::new()
                    .owner(owner(i, n))
                    .identity(Identity::new(&format!("contender-{i}")).unwrap())
                    .yield_after_release(yield_turn);
                let lease = acquire_with(service.clone(), KEY, config(900), options)
                    .await
                    .unwrap();
                let before = holding.lock().unwrap().replace(i);
                assert_eq!(before, None, "two holders at once");
                terms.lock().unwrap()[i as usize] += 1;
                tokio::time::sleep(ms(work_ms)).await;
                assert!(lease.check().is_ok(), "the lease holds through the work");
                holding.lock().unwrap().take();
                lease.release().await;
            }
        }));
    }
    timeline.until(secs * 1_000).await;
    for task in tasks {
        task.abort();
    }
    let terms = terms.lock().unwrap().clone();
    Spread { terms }
}

/// 8 contenders, each acquire → 20 ms of work → release → acquire, for 60 virtual
/// seconds (TTL 900 ms, retry interval 45 ms). Contending at once after a release,
/// the releaser finds the key free while the others sleep between retries and wins
/// every time; letting the release back-off pass first, every contender gets turns.
#[tokio::test(start_paused = true)]
async fn contenders_that_release_and_acquire_again_all_get_turns() {
    let before = contend(8, 60, 20, false).await;
    let after = contend(8, 60, 20, true).await;
    for (what, spread) in [("at once", &before), ("yielding", &after)] {
        println!(
            "{what}: terms per contender {:?}; min {} max {}, Jain's index {:.3}",
            spread.terms,
            spread.min(),
            spread.max(),
            spread.jain()
        );
    }
    // Starvation without the back-off: one contender has (nearly) every term.
    assert!(before.jain() < 0.2, "Jain's index {:.3}", before.jain());
    assert!(before.min() == 0, "{:?}", before.terms);
    // With it: every contender gets a fair share.
    let total: u64 = after.terms.iter().sum();
    assert!(
        after.min() * 8 * 2 >= total,
        "every contender gets at least half of a fair share: {:?}",
        after.terms
    );
    assert!(after.jain() > 0.95, "Jain's index {:.3}", after.jain());
}

/// The back-off holds back only the releaser's own next acquire of that key through
/// that service, and never past the wait bound: another key, another service, or a
/// `try_acquire` are not delayed.
#[tokio::test(start_paused = true)]
async fn the_release_back_off_holds_back_only_the_releasers_next_acquire_of_that_key() {
    let timeline = Timeline::start();
    let service = Arc::new(MemoryService::new());
    let other_service = Arc::new(MemoryService::new());
    let acquire = |service: &Arc<MemoryService>, key: &str, options: AcquireOptions| {
        acquire_with(service.clone(), key, config(900), options)
    };
    let lease = acquire(&service, KEY, AcquireOptions::new()).await.unwrap();
    lease.release().await;
    let released = timeline.now_ms();
    // Another key and another service: at once.
    let a = acquire(&service, "another", AcquireOptions::new())
        .await
        .unwrap();
    let b = acquire(&other_service, KEY, AcquireOptions::new())
        .await
        .unwrap();
    assert_eq!(timeline.now_ms(), released);
    a.release().await;
    b.release().await;
    // A bounded acquire of the key waits at most its bound: a try sends at once.
    let c = acquire(&service, KEY, AcquireOptions::new().max_wait(ms(0)))
        .await
        .unwrap();
    assert_eq!(timeline.now_ms(), released);
    c.release().await;
    // The unbounded one waits the back-off: 2 × 45 ms.
    let d = acquire(&service, KEY, AcquireOptions::new()).await.unwrap();
    assert_eq!(timeline.now_ms(), released + 90);
    d.release().await;
    let e = acquire(
        &service,
        KEY,
        AcquireOptions::new().yield_after_release(false),
    )
    .await
    .unwrap();
    assert_eq!(timeline.now_ms(), released + 90, "opted out: at once");
    drop(e);
}

/// When each of `contenders` (waiting for a key that stays held) sent its attempts,
/// µs since the start: with random owners, or with `serial` owners that differ only in
/// their last four bytes (a device serial number). The jitter is seeded from the
/// owner, so either way each contender has a sequence of its own.
async fn waiting_attempts(contenders: u64, secs: u64, serial: bool) -> Vec<Vec<u64>> {
    let timeline = Timeline::start();
    let service = Recording::new();
    let holder = acquire_with(service.clone(), KEY, config(900), AcquireOptions::new())
        .await
        .unwrap();
    let mut owners = Vec::new();
    let mut waiters = Vec::new();
    for i in 0..contenders {
        let mut owner = owner(i, 0);
        if serial {
            owner.0 = *b"pump-ctrl-\0\0\0\0\0\0";
            owner.0[12..].copy_from_slice(&(i as u32).to_be_bytes());
        }
        owners.push(owner);
        let options = AcquireOptions::new()
            .owner(owner)
            .max_wait(ms(secs * 1_000));
        waiters.push(tokio::spawn(acquire_with(
            service.clone(),
            KEY,
            config(900),
            options,
        )));
    }
    for waiter in waiters {
        assert!(waiter.await.unwrap().is_err(), "the key stays held");
    }
    assert!(holder.check().is_ok());
    let _ = service.holder(KEY).await;
    owners
        .iter()
        .map(|owner| service.sent_us(&timeline, owner.token(leasehold::Term(1)), Kind::Acquire))
        .collect()
}

/// How 100 waiting contenders' attempts fall in time after the first second (when
/// the simultaneous first attempts have spread out): the most in any 1 ms, and how
/// widely their 10th attempts are spread.
struct Herd {
    busiest_ms: usize,
    mean_per_ms: f64,
    tenth_spread_ms: f64,
}

fn herd(attempts: &[Vec<u64>], from_ms: u64, to_ms: u64) -> Herd {
    let mut per_ms = vec![0_usize; (to_ms - from_ms) as usize];
    for at in attempts.iter().flatten() {
        let at_ms = at / 1_000;
        if (from_ms..to_ms).contains(&at_ms) {
            per_ms[(at_ms - from_ms) as usize] += 1;
        }
    }
    let tenth: Vec<u64> = attempts.iter().filter_map(|a| a.get(9).copied()).collect();
    let (lo, hi) = (
        tenth.iter().min().copied().unwrap_or(0),
        tenth.iter().max().copied().unwrap_or(0),
    );
    Herd {
        busiest_ms: per_ms.iter().copied().max().unwrap_or(0),
        mean_per_ms: per_ms.iter().sum::<usize>() as f64 / per_ms.len() as f64,
        tenth_spread_ms: (hi - lo) as f64 / 1_000.0,
    }
}

/// 100 contenders wait 3 virtual seconds for a held key (retry interval 45 ms). Each
/// owner seeds its own jitter, so after the first second no millisecond carries more
/// than a handful of attempts — also for owners that differ only in a serial number
/// in their last bytes (a seed from the first four bytes, as the adapters once took
/// it, put all 100 in the same millisecond).
#[tokio::test(start_paused = true)]
async fn jitter_spreads_100_waiting_contenders() {
    let random = herd(&waiting_attempts(100, 3, false).await, 1_000, 3_000);
    let serial = herd(&waiting_attempts(100, 3, true).await, 1_000, 3_000);
    for (what, h) in [("random owners", &random), ("serial owners", &serial)] {
        println!(
            "{what}: busiest ms {} attempts (mean {:.2}/ms); 10th attempts spread over {:.1} ms",
            h.busiest_ms, h.mean_per_ms, h.tenth_spread_ms
        );
        assert!(h.busiest_ms <= 12, "{what}: busiest ms {}", h.busiest_ms);
        // Nine jittered gaps of 22.5–67.5 ms: the 10th attempts spread over well
        // beyond one retry interval.
        assert!(h.tenth_spread_ms > 90.0, "{what}: {}", h.tenth_spread_ms);
    }
}
