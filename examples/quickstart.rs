//! Two contenders, one lock service, one storage: the whole point of leasehold in a
//! few seconds of (virtual) time.
//!
//! A holds the lease and writes; B waits. A gets cut off from the lock service, its
//! renewals fail, and its write gate closes at the lease's safe deadline — before the
//! service expires the key — so A stops writing. B acquires with a higher fence. A
//! write that A sent before the cut and that the network delayed arrives afterwards,
//! and storage rejects it by its fence.
//!
//! ```text
//! cargo run -p leasehold-examples --example quickstart
//! ```

use std::sync::{Arc, Mutex};

use std::time::Duration;

use leasehold::Event;
use leasehold_examples::{contender, virtual_time_runtime, Storage, Timeline};
use leasehold_tokio::memory::MemoryService;
use leasehold_tokio::{acquire_with, LeaseEnd, LeaseHandle, TimedEvent};

const KEY: &str = "orders";

fn main() {
    virtual_time_runtime().block_on(quickstart());
}

async fn quickstart() {
    println!("leasehold quickstart: two contenders, the in-memory lock service, a toy storage");
    println!(
        "(virtual time: tokio's paused clock, so this runs instantly and the same every time)"
    );
    // Every duration a tokio user passes is std's `Duration`.
    let config = leasehold_tokio::config(Duration::from_secs(3))
        .build()
        .unwrap();
    println!(
        "lease: ttl {}, renew every {}, request timeout {}, retry after {}; a grant sent at s \
         is safe until s + {} ms\n",
        config.ttl(),
        config.renew_interval(),
        config.request_timeout(),
        config.retry_interval(),
        config
            .safe_deadline(leasehold::Instant::ZERO, config.ttl())
            .unwrap()
            .as_millis(),
    );

    let t = Timeline::start();
    let service = Arc::new(MemoryService::new());
    let storage = Arc::new(Mutex::new(Storage::default()));

    let a = acquire_with(service.clone(), KEY, config, contender("A"))
        .await
        .unwrap();
    t.log(
        "A",
        format!("acquired {KEY:?} with fence {}", a.granted_fence().0),
    );
    tokio::spawn(narrate("A", t, a.clone()));

    // B waits in `acquire`, retrying every 150 ms while A holds the key.
    let b = tokio::spawn({
        let (service, storage) = (service.clone(), storage.clone());
        async move {
            t.log("B", format!("waiting for {KEY:?}"));
            let b = acquire_with(service, KEY, config, contender("B"))
                .await
                .unwrap();
            t.log(
                "B",
                format!("acquired {KEY:?} with fence {}", b.granted_fence().0),
            );
            let fence = b.check().unwrap();
            let said = storage
                .lock()
                .unwrap()
                .write_and_say(fence, "B's first write");
            t.log("storage", format!("B's write with {said}"));
            b
        }
    });

    // A's worker: a write every 500 ms, each right after a check().
    let worker = tokio::spawn(write_every_500ms(t, a.clone(), storage.clone()));

    // At 2100 ms A passes a check and sends a write that the network then holds back
    // (the cut below) until 5200 ms.
    t.until(2_100).await;
    let delayed = a.check().unwrap();
    t.log(
        "A",
        format!(
            "write with fence {} passed check(); the network delays it",
            delayed.0
        ),
    );
    tokio::spawn({
        let storage = storage.clone();
        async move {
            t.until(5_200).await;
            let said = storage
                .lock()
                .unwrap()
                .write_and_say(delayed, "A's delayed write");
            t.log("storage", format!("A's delayed write arrives with {said}"));
        }
    });

    t.until(2_200).await;
    service.partition(a.owner());
    let expiry = service.grant(KEY).unwrap().expires_at;
    t.log(
        "network",
        format!(
            "A is cut off from the lock service (the service holds A's key until {} ms)",
            t.ms_at(expiry)
        ),
    );
    tokio::spawn({
        let service = service.clone();
        async move {
            tokio::time::sleep_until(expiry).await;
            if service.grant(KEY).is_none() {
                t.log("service", "A's key expired (hard TTL)");
            }
        }
    });

    let end = a.lost().await;
    let lost_at = t.ms();
    worker.await.unwrap();
    let b = b.await.unwrap();
    t.until(5_300).await;

    println!();
    println!(
        "A: {end}; its gate closed at {lost_at} ms, {} ms before the service's expiry at {} ms.",
        t.ms_at(expiry) - lost_at,
        t.ms_at(expiry)
    );
    println!(
        "B took over with fence {}; storage admitted {} writes and rejected A's late one.",
        b.granted_fence().0,
        storage.lock().unwrap().len()
    );
    assert_eq!(end, LeaseEnd::Lost(leasehold::LossReason::Expired));
    b.release().await;
}

/// Writes every 500 ms while `check()` passes; stops for good at the first refusal.
async fn write_every_500ms(t: Timeline, lease: LeaseHandle, storage: Arc<Mutex<Storage>>) {
    for n in 1.. {
        t.until(500 * n).await;
        match lease.check() {
            Ok(fence) => {
                let said = storage
                    .lock()
                    .unwrap()
                    .write_and_say(fence, format!("A's write #{n}"));
                t.log("A", format!("write #{n} with {said}"));
            }
            Err(refused) => {
                t.log("A", format!("check() refused: {refused}; A stops writing"));
                return;
            }
        }
    }
}

/// Prints what the lease's driver reports.
async fn narrate(who: &'static str, t: Timeline, lease: LeaseHandle) {
    let mut events = lease.events();
    let clock = lease.clock();
    drop(lease); // observe without keeping the lease alive
    while let Ok(TimedEvent { event, .. }) = events.recv().await {
        let ms = |at: leasehold::Instant| t.ms_at(clock.to_tokio(at));
        let what = match event {
            Event::Renewed { deadline, .. } => format!("renewed: safe until {} ms", ms(deadline)),
            Event::RenewFailed {
                reason,
                retry_at,
                deadline,
                ..
            } => match retry_at {
                Some(at) => format!(
                    "renewal failed ({reason}); retry at {} ms, still safe until {} ms",
                    ms(at),
                    ms(deadline)
                ),
                None => format!(
                    "renewal failed ({reason}); no retry fits before {} ms",
                    ms(deadline)
                ),
            },
            Event::Lost { reason, .. } => {
                format!("LOST: {reason}. The gate is closed: no more writes")
            }
            Event::Released => "released".to_string(),
            other => format!("{other:?}"),
        };
        t.log(who, what);
    }
}
