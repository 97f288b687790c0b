//! Bounded waits for an event, instead of sleeps that guess how long it takes.

use std::future::Future;
use std::time::Duration;

/// Polls `cond` every few milliseconds until it holds; panics naming `what` after
/// `limit` (on tokio's clock, so it also works with a paused clock).
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = tokio::time::Instant::now() + limit;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < give_up,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}
