//! Fair waiting: this process remembers when it released a key through a service, so
//! that its next acquire of that key through that service first lets
//! [`Config::release_backoff`](leasehold::Config::release_backoff) pass and a waiting
//! contender takes its turn.
//!
//! The pause and its length are the core's rule (`leasehold::rules`, "Acquiring");
//! this module only remembers instants and answers "not before when", as an adapter
//! supplies clocks and sleeps. Nothing is asked of the service.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::time::Instant;

/// Recent releases, by service (its `Arc`'s address) and key.
struct Releases {
    by_service: HashMap<usize, Service>,
    /// Prune dead entries once this many are kept, so the map stays as small as the
    /// number of keys released within one back-off.
    prune_at: usize,
}

struct Service {
    /// Keeps the address from being reused by another service while the entry
    /// lives, and says when the service is gone.
    alive: Weak<dyn Any + Send + Sync>,
    /// Key → not before when this process contends for it again.
    keys: HashMap<Box<str>, Instant>,
}

static RELEASES: Mutex<Option<Releases>> = Mutex::new(None);

/// The fewest entries kept before a prune.
const PRUNE_FLOOR: usize = 64;

/// `key` was released through `service` just now: hold this process's next acquire
/// of it back for `backoff`.
pub(crate) fn released<S: Any + Send + Sync>(
    service: &Arc<S>,
    key: &str,
    backoff: std::time::Duration,
) {
    let now = Instant::now();
    let mut guard = RELEASES.lock().unwrap_or_else(PoisonError::into_inner);
    let releases = guard.get_or_insert_with(|| Releases {
        by_service: HashMap::new(),
        prune_at: PRUNE_FLOOR,
    });
    let alive: Weak<dyn Any + Send + Sync> = Arc::downgrade(service) as _;
    let entry = releases
        .by_service
        .entry(address(service))
        .or_insert_with(|| Service {
            alive,
            keys: HashMap::new(),
        });
    entry.keys.insert(key.into(), now + backoff);
    let kept: usize = releases.by_service.values().map(|s| s.keys.len()).sum();
    if kept >= releases.prune_at {
        for service in releases.by_service.values_mut() {
            service.keys.retain(|_, until| *until > now);
        }
        releases
            .by_service
            .retain(|_, s| s.alive.strong_count() > 0 && !s.keys.is_empty());
        let left: usize = releases.by_service.values().map(|s| s.keys.len()).sum();
        releases.prune_at = (left * 2).max(PRUNE_FLOOR);
    }
}

/// When this process may contend for `key` through `service` again, if that is
/// still ahead — never more than `backoff` from now (an instant noted on another
/// runtime's clock cannot hold an acquire back for longer).
pub(crate) fn turn<S: Any + Send + Sync>(
    service: &Arc<S>,
    key: &str,
    backoff: std::time::Duration,
) -> Option<Instant> {
    let now = Instant::now();
    let guard = RELEASES.lock().unwrap_or_else(PoisonError::into_inner);
    let until = *guard
        .as_ref()?
        .by_service
        .get(&address(service))?
        .keys
        .get(key)?;
    (until > now).then(|| until.min(now + backoff))
}

fn address<S>(service: &Arc<S>) -> usize {
    Arc::as_ptr(service).cast::<()>().addr()
}
