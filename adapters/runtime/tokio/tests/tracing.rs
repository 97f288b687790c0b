//! The `tracing` feature: the events of one scripted timeline, as a `fmt` subscriber
//! (installed for this test's thread only) prints them — the lease span with key,
//! holder and fence, the crate as target, human durations, info-level grant and
//! release, the round trip of each renewal.

#![cfg(feature = "tracing")]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{config, ms, Timeline};
use leasehold::{Identity, LossReason};
use leasehold_tokio::memory::{MemoryService, Scope};
use leasehold_tokio::{acquire_with, AcquireOptions, LeaseEnd, Owner};

/// Everything the subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `scenario` on a paused current-thread runtime under a `fmt` subscriber at
/// `level`, returning the printed lines.
fn capture<F: std::future::Future<Output = ()>>(
    level: tracing::Level,
    scenario: impl FnOnce() -> F,
) -> Vec<String> {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .without_time()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        common::paused_runtime().block_on(scenario());
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_owned).collect()
}

const OWNER: Owner = Owner([7; 16]);
const TOKEN: &str = "07070707070707070707070707070707";

/// 900 ms TTL, 10 ms round trips. Granted at 10 ms, renewed at 310 and 610 ms, the
/// renewal sent at 900 ms is lost (timeout at 990 ms), the retry confirmed; then the
/// service is partitioned at 1 100 ms and the lease lost at its safe deadline. Then,
/// healed, a second lease is acquired (fence 2) and released.
async fn timeline() {
    let timeline = Timeline::start();
    let service = Arc::new(MemoryService::new());
    service.set_latency(Scope::All, ms(10));
    let options = AcquireOptions::new()
        .owner(OWNER)
        .identity(Identity::new("worker-1").unwrap());
    let lease = acquire_with(service.clone(), "orders", config(900), options)
        .await
        .unwrap();
    timeline.until(850).await;
    service.drop_requests(OWNER, 1);
    timeline.until(1_100).await;
    service.partition(OWNER);
    assert_eq!(lease.lost().await, LeaseEnd::Lost(LossReason::Expired));
    service.heal(OWNER);
    timeline.until(3_000).await;
    let options = AcquireOptions::new()
        .owner(Owner([8; 16]))
        .identity(Identity::new("worker-2").unwrap());
    let next = acquire_with(service, "orders", config(900), options)
        .await
        .unwrap();
    assert_eq!(next.release().await, LeaseEnd::Released);
}

#[test]
fn info_shows_grant_and_loss_in_the_lease_span_with_the_crate_as_target() {
    let lines = capture(tracing::Level::INFO, timeline);
    for line in &lines {
        println!("{line}");
    }
    let first = "lease{key=\"orders\" holder=worker-1 fence=1}: leasehold_tokio:";
    let second = "lease{key=\"orders\" holder=worker-2 fence=2}: leasehold_tokio:";
    let token2 = "08080808080808080808080808080808";
    let renewal_failed = |deadline_in: &str| {
        format!(
            " WARN {first} renewal failed, retrying inside the remaining budget key=\"orders\" \
             token={TOKEN}.1 reason=no answer within the request timeout retry_in=45ms \
             deadline_in={deadline_in} writes_paused=false"
        )
    };
    let expected = [
        format!(
            " INFO {first} lease acquired key=\"orders\" token={TOKEN}.1 fence=1 ttl=900ms \
             deadline_in=844.1ms waited=10ms"
        ),
        // The renewal sent at 900 ms, lost: at its timeout (990 ms), the deadline of
        // the one sent at 600 ms (1 454.1 ms) is 464.1 ms away. Retried at 1 035 ms,
        // confirmed (debug).
        renewal_failed("464.1ms"),
        // Partitioned from 1 100 ms: the renewal sent at 1 335 ms (deadline 1 889.1 ms)
        // times out at 1 425 ms, and so do its retries, 135 ms apart.
        renewal_failed("464.1ms"),
        renewal_failed("329.1ms"),
        renewal_failed("194.1ms"),
        renewal_failed("59.1ms"),
        format!(
            "ERROR {first} lease lost: writes stopped key=\"orders\" token={TOKEN}.1 \
             reason=the safe deadline passed without a confirmed renewal"
        ),
        format!(
            " INFO {second} lease acquired key=\"orders\" token={token2}.1 fence=2 ttl=900ms \
             deadline_in=844.1ms waited=10ms"
        ),
        format!(" INFO {second} lease released key=\"orders\" token={token2}.1"),
    ];
    assert_eq!(lines, expected);
}

#[test]
fn debug_adds_each_renewal_with_its_round_trip_and_the_failed_one_with_its_retry() {
    let lines = capture(tracing::Level::DEBUG, timeline);
    for line in &lines {
        println!("{line}");
    }
    let renewed: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("lease renewed"))
        .collect();
    assert!(renewed.len() >= 3, "{lines:#?}");
    for line in &renewed {
        assert!(line.contains(" rtt=10ms "), "{line}");
        assert!(line.contains("deadline_in=844.1ms"), "{line}");
        assert!(line
            .starts_with("DEBUG lease{key=\"orders\" holder=worker-1 fence=1}: leasehold_tokio:"));
    }
    let failed: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("renewal failed"))
        .collect();
    assert!(!failed.is_empty(), "{lines:#?}");
    assert!(failed[0].starts_with(" WARN "), "{}", failed[0]);
    // No instant on the lease's private clock, no `Instant { micros }`.
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("t+") && !l.contains("micros")),
        "{lines:#?}"
    );
}
