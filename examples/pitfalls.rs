//! Sizing a lease, and what happens outside the size: work p99 is 200 ms, renew RTT
//! p99 is 20 ms, GC budget 150 ms. Pick T and a T/3 heartbeat with `Budget`. Now inject
//! a 400 ms stop-the-world pause. Is the lock lost? What does the lost flag do, and
//! what must storage do with the old fence?
//!
//! ```text
//! cargo run -p leasehold-examples --example pitfalls
//! ```
//!
//! A stop-the-world pause freezes the whole process: worker *and* lease driver. It is
//! simulated with `tokio::time::advance`, which jumps the (virtual) clock while no task
//! runs. The other contender and the lock service only wait on timers, so for them the
//! jump is simply time passing.

use std::time::Duration as StdDuration;

use leasehold::{Budget, Config, Duration, Event, LossReason};
use leasehold_examples::{contender, virtual_time_runtime, Storage, Timeline};
use leasehold_tokio::memory::MemoryService;
use leasehold_tokio::{acquire_with, LeaseEnd, LeaseHandle};

const KEY: &str = "ledger";

fn main() {
    virtual_time_runtime().block_on(pitfalls());
}

async fn pitfalls() {
    println!("leasehold pitfalls: size a lease, then pause past its budget");
    println!(
        "(virtual time: tokio's paused clock, so this runs instantly and the same every time)\n"
    );

    // ----- 1. Size T with the Budget API -----
    let ms = Duration::from_millis;
    let budget = Budget {
        work_p99: ms(200),
        renew_rtt_p99: ms(20),
        pause_budget: ms(150),
        margin: ms(30),
    };
    println!(
        "budget: work p99 {} + renew RTT p99 {} + GC budget {} + margin {} = {}",
        budget.work_p99,
        budget.renew_rtt_p99,
        budget.pause_budget,
        budget.margin,
        budget.total()
    );
    match budget.check(ms(400)) {
        Ok(()) => println!("  T = 400ms: ok"),
        Err(err) => println!("  T = 400ms: no, {err}"),
    }
    let ttl = ms(600);
    budget.check(ttl).expect("600 ms covers the budget");
    let config = Config::builder(ttl).margin(budget.margin).build().unwrap();
    println!(
        "  T = {ttl} (1.5 x the budget): ok. Heartbeat T/3 = {}, request timeout {}, \
         retry after {}; a renewal sent at s is safe until s + {}",
        config.renew_interval(),
        config.request_timeout(),
        config.retry_interval(),
        Duration::from_micros(
            config
                .safe_deadline(leasehold::Instant::ZERO, ttl)
                .unwrap()
                .as_micros()
        ),
    );
    let stw = Budget {
        pause_budget: ms(400),
        ..budget
    };
    println!(
        "  with a 400 ms pause instead of 150 ms: {}\n",
        stw.check(ttl).unwrap_err()
    );

    // ----- 2. Run it -----
    let t = Timeline::start();
    let service = std::sync::Arc::new(MemoryService::new());
    let mut storage = Storage::default();

    let a = acquire_with(service.clone(), KEY, config, contender("A"))
        .await
        .unwrap();
    t.log("A", format!("acquired with fence {}", a.granted_fence().0));
    tokio::spawn(narrate(t, a.clone()));
    let b = tokio::spawn({
        let service = service.clone();
        async move {
            let b = acquire_with(service, KEY, config, contender("B"))
                .await
                .unwrap();
            t.log("B", format!("acquired with fence {}", b.granted_fence().0));
            b
        }
    });
    t.log("B", "waiting for the key");

    // A GC pause inside the budget, in the middle of a work slice.
    t.until(100).await;
    let fence = a.check().unwrap();
    t.log(
        "A",
        format!("work slice starts: check() -> fence {}", fence.0),
    );
    t.log(
        "A",
        "GC: stop-the-world for 150 ms (inside the 150 ms budget)",
    );
    tokio::time::advance(StdDuration::from_millis(150)).await;
    t.log(
        "A",
        format!(
            "resumes; the slice writes with {}",
            storage.write_and_say(fence, "slice 1")
        ),
    );
    tokio::task::yield_now().await;
    t.log(
        "A",
        format!("check() -> {}: the lease survived", say(a.check())),
    );

    // The 400 ms pause, landing just before the next renewal is due.
    t.until(440).await;
    let fence = a.check().unwrap();
    t.log(
        "A",
        format!("work slice starts: check() -> fence {}", fence.0),
    );
    t.log("A", "GC: stop-the-world for 400 ms (2.7 x the budget)");
    tokio::time::advance(StdDuration::from_millis(400)).await;
    t.log(
        "A",
        format!("resumes; the lost flag: check() -> {}", say(a.check())),
    );
    let end = a.lost().await;
    t.log(
        "A",
        format!(
            "lost() -> {end}; the cancellation token is cancelled: {}",
            a.cancellation_token().is_cancelled()
        ),
    );
    t.log("A", "but the slice that passed check() at 440 ms is still running: it writes after 150 ms more work");

    let b = b.await.unwrap();
    let fence_b = b.check().unwrap();
    t.log(
        "B",
        format!(
            "writes with {}",
            storage.write_and_say(fence_b, "B's first")
        ),
    );

    t.until(990).await;
    t.log(
        "A",
        format!(
            "the old slice's write arrives with {}",
            storage.write_and_say(fence, "slice 2")
        ),
    );

    println!();
    println!(
        "Did A lose the lock? {}",
        match end {
            LeaseEnd::Lost(LossReason::Expired) =>
                "Yes. The pause froze the driver past the safe deadline (the renewal due at 450 ms \
             never went out), so the lease is Lost(Expired). A 400 ms pause does not always lose \
             a 600 ms lease: one that ends before the deadline (up to 569 ms after the last \
             renewal was sent) is survived. But 400 ms is outside the budget, so nothing \
             guarantees it.",
            _ => "Unexpectedly not.",
        }
    );
    println!(
        "What does the lost flag do? check() refused from the instant A resumed, before the \
              driver even ran, because the gate holds the deadline; lost() and the cancellation \
              token fired when the driver ran. No write that checks after the pause gets through."
    );
    println!(
        "What must storage do with the old fence? Reject it. A work slice that passed check() \
              before the pause still carries fence 1; B's fence 2 reached storage first, so the \
              fence gate refuses fence 1. That is the only thing that stops it."
    );
    b.release().await;
}

/// A check's outcome, for the timeline.
fn say(check: Result<leasehold::Fence, leasehold_tokio::CheckError>) -> String {
    match check {
        Ok(fence) => format!("fence {}", fence.0),
        Err(refused) => format!("refused ({refused})"),
    }
}

/// Prints the driver's view of A's lease.
async fn narrate(t: Timeline, lease: LeaseHandle) {
    let mut events = lease.events();
    let clock = lease.clock();
    drop(lease);
    while let Ok(timed) = events.recv().await {
        let ms = |at: leasehold::Instant| t.ms_at(clock.to_tokio(at));
        match timed.event {
            Event::Renewed { deadline, .. } => t.log(
                "A driver",
                format!("renewed: safe until {} ms", ms(deadline)),
            ),
            Event::Lost { reason, .. } => t.log(
                "A driver",
                format!("LOST ({reason}); gate closed; best-effort release sent"),
            ),
            Event::RenewFailed { reason, .. } => {
                t.log("A driver", format!("renewal failed: {reason}"))
            }
            _ => {}
        }
    }
}
