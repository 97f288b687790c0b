//! The `metrics` feature: the values after one scripted timeline on the in-memory
//! service, read from a debugging recorder installed for this test's thread only
//! (`metrics::with_local_recorder`), so tests do not share global state.

#![cfg(feature = "metrics")]

mod common;

use std::collections::BTreeMap;

use common::{config, ms, Timeline};
use leasehold_tokio::memory::{MemoryService, Scope};
use leasehold_tokio::{acquire, try_acquire, AcquireError, LeaseEnd, LeaseSet, LossReason};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::sync::Arc;

const KEY: &str = "orders";

/// `name{label=value,…}` → value, counters and gauges as f64, histograms as their
/// samples.
#[derive(Debug, Default)]
struct Seen {
    scalars: BTreeMap<String, f64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

fn name(key: &metrics::Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

/// Runs `scenario` on a paused current-thread runtime with a local debugging
/// recorder; every task (the lease drivers too) runs on this thread, inside it. What
/// the scenario returns is kept until the snapshot is taken.
fn record<T, F: std::future::Future<Output = T>>(scenario: impl FnOnce() -> F) -> Seen {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The snapshot is taken before the runtime (and what the scenario returned) is
    // dropped: dropping a runtime stops every lease driver, which is a loss.
    let (snapshot, _kept, _runtime) = metrics::with_local_recorder(&recorder, || {
        let runtime = common::paused_runtime();
        let kept = runtime.block_on(scenario());
        (snapshotter.snapshot(), kept, runtime)
    });
    let mut seen = Seen::default();
    for (key, _, _, value) in snapshot.into_vec() {
        let name = name(key.key());
        match value {
            DebugValue::Counter(n) => drop(seen.scalars.insert(name, n as f64)),
            DebugValue::Gauge(v) => drop(seen.scalars.insert(name, v.into_inner())),
            DebugValue::Histogram(samples) => drop(
                seen.histograms
                    .insert(name, samples.into_iter().map(|v| v.into_inner()).collect()),
            ),
        }
    }
    seen
}

/// 900 ms TTL (renew every 300 ms, timeout 90, margin 45, drift 0.9 ms), every
/// request 10 ms round trip. A holds from 0 (granted at 10 ms: waited 10 ms); B tries
/// once at 100 ms (busy); A's renewal at 900 ms is lost (timeout at 990 ms, retried,
/// confirmed); A is revoked at 1 500 ms.
#[test]
fn one_scripted_timeline_gives_these_values() {
    let seen = record(|| async {
        let timeline = Timeline::start();
        let service = Arc::new(MemoryService::new());
        service.set_latency(Scope::All, ms(10));
        let a = acquire(service.clone(), KEY, config(900)).await.unwrap();
        timeline.until(100).await;
        let b = try_acquire(service.clone(), KEY, config(900)).await;
        assert!(matches!(b, Err(AcquireError::Busy { .. })), "{b:?}");
        timeline.until(700).await;
        service.drop_requests(a.owner(), 1);
        timeline.until(1_500).await;
        service.revoke(KEY).unwrap();
        assert_eq!(a.lost().await, LeaseEnd::Lost(LossReason::Revoked));
        // Let the driver finish its best-effort release.
        timeline.until(2_000).await;
    });
    println!("{seen:#?}");
    let scalar = |n: &str| seen.scalars.get(n).copied();
    assert_eq!(
        scalar("leasehold_acquires_total{result=granted}"),
        Some(1.0)
    );
    assert_eq!(scalar("leasehold_acquires_total{result=busy}"), Some(1.0));
    assert_eq!(
        scalar("leasehold_renewal_failures_total{reason=timeout}"),
        Some(1.0)
    );
    assert_eq!(scalar("leasehold_losses_total{reason=revoked}"), Some(1.0));
    assert_eq!(
        scalar("leasehold_leases_held"),
        Some(0.0),
        "held, then lost"
    );
    assert_eq!(seen.histograms["leasehold_acquire_wait_seconds"], [0.010]);
    // Renewals sent at 300, 600 (confirmed), 900 (lost), then the retry and the one
    // after it, before the revocation at 1 500 ms: every confirmed one took 10 ms.
    let renewals = scalar("leasehold_renewals_total").unwrap();
    let rtts = &seen.histograms["leasehold_renewal_rtt_seconds"];
    assert_eq!(rtts.len() as f64, renewals);
    assert!(rtts.iter().all(|&rtt| rtt == 0.010), "{rtts:?}");
    assert_eq!(renewals, 4.0);
    // At each confirmed renewal the safe deadline is sent + 854.1 ms and the answer
    // comes 10 ms after the send: 844.1 ms left.
    assert_eq!(
        scalar("leasehold_safety_margin_seconds{key=orders}"),
        Some(0.8441)
    );
    assert_eq!(seen.scalars.len(), 7, "nothing else: {seen:?}");
}

/// An acquire's wait counts from the acquire, whenever the lease's clock started: a
/// set's clock starts with the set, and tasks started the same way share one.
#[test]
fn an_acquire_waits_from_its_own_start_not_from_its_clock_s() {
    let seen = record(|| async {
        let service = Arc::new(MemoryService::new());
        service.set_latency(Scope::All, ms(10));
        let set = LeaseSet::new(service.clone(), config(900));
        let first = acquire(service.clone(), "a", config(900)).await.unwrap();
        tokio::time::sleep(ms(1_000)).await;
        let second = acquire(service.clone(), "b", config(900)).await.unwrap();
        let in_set = set.acquire("c").await.unwrap();
        (first, second, in_set)
    });
    assert_eq!(
        seen.histograms["leasehold_acquire_wait_seconds"],
        [0.010, 0.010, 0.010]
    );
}

#[test]
fn the_held_gauge_counts_live_leases_and_a_release_takes_one_off() {
    let seen = record(|| async {
        let service = Arc::new(MemoryService::new());
        let a = acquire(service.clone(), "a", config(900)).await.unwrap();
        let b = acquire(service.clone(), "b", config(900)).await.unwrap();
        let c = acquire(service.clone(), "c", config(900)).await.unwrap();
        assert_eq!(a.release().await, LeaseEnd::Released);
        drop(b);
        tokio::time::sleep(ms(100)).await;
        c
    });
    assert_eq!(seen.scalars["leasehold_leases_held"], 1.0, "{seen:?}");
    assert_eq!(
        seen.scalars["leasehold_acquires_total{result=granted}"],
        3.0
    );
    assert!(!seen
        .scalars
        .keys()
        .any(|k| k.starts_with("leasehold_losses")));
}

#[test]
fn a_runtime_shut_down_under_a_held_lease_counts_a_driver_stopped_loss() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let snapshot = metrics::with_local_recorder(&recorder, || {
        let runtime = common::paused_runtime();
        let lease = runtime.block_on(async {
            acquire(Arc::new(MemoryService::new()), KEY, config(900))
                .await
                .unwrap()
        });
        drop(runtime);
        assert_eq!(lease.end(), Some(LeaseEnd::DriverStopped));
        snapshotter.snapshot()
    });
    let values: BTreeMap<String, DebugValue> = snapshot
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (name(key.key()), value))
        .collect();
    assert_eq!(
        values["leasehold_losses_total{reason=driver_stopped}"],
        DebugValue::Counter(1)
    );
    assert_eq!(
        values["leasehold_leases_held"],
        DebugValue::Gauge(0.0.into())
    );
}
