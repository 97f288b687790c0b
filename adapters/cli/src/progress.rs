//! The one-line progress display on a terminal while `run` waits: who holds the key,
//! with which fence, for how much longer. Asked of the service once a second with
//! `holder()`, in its own task so that waiting and signals are never delayed by it.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use leasehold::HolderOutcome;
use leasehold_tokio::LockService;
use tokio::task::JoinHandle;

/// Starts the display.
pub fn spawn<S: LockService + 'static>(service: Arc<S>, key: String) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let line = match LockService::holder(&*service, &key).await {
                HolderOutcome::Held(h) => format!(
                    "waiting for {key:?}: held by {} (fence {}), {} s left",
                    h.identity,
                    h.fence.0,
                    h.remaining.as_millis().div_ceil(1_000)
                ),
                HolderOutcome::Free => format!("waiting for {key:?}: free, acquiring"),
                HolderOutcome::Refused(why) => format!("waiting for {key:?}: {why}"),
                HolderOutcome::Indeterminate(why) => format!("waiting for {key:?}: {why}"),
                _ => format!("waiting for {key:?}"),
            };
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K{line}");
            let _ = err.flush();
        }
    })
}

/// Stops the display and clears its line.
pub fn stop(task: Option<JoinHandle<()>>) {
    if let Some(task) = task {
        task.abort();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K");
        let _ = err.flush();
    }
}
