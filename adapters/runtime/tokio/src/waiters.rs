//! Who waits to hear of one lease: the futures of its handles (an acquire, `lost()`,
//! `release()`, `settled()`), each woken by any change. Kept under the lease's status
//! lock with what only some leases need, allocated only while a future waits: a tokio
//! `Notify` beside the lock would cost every lease 32 B, and once granted most leases
//! have no handle waiting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;

/// A handle's future waiting for a change, named by the id it registered under.
pub(crate) type WaiterId = u64;

/// The ids of waiting futures: unique in the process, so that two futures of one
/// task (a `select!` over `lost()` and `release()`) keep one entry each, and the
/// first to finish does not take the other's.
pub(crate) fn next_id() -> WaiterId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The waiting futures, each until it completes or is dropped.
#[derive(Default)]
pub(crate) struct Waiters {
    handles: Vec<(WaiterId, Waker)>,
}

impl Waiters {
    /// The future `id` waits with `waker`, until [`remove`](Self::remove)d. `at` is
    /// where it was found last time: every change wakes every waiting future, which
    /// registers again, so a lease watched by a thousand tasks must not search its
    /// list a thousand times each.
    pub(crate) fn register(&mut self, id: WaiterId, waker: &Waker, at: &mut usize) {
        let handles = &mut self.handles;
        if handles.get(*at).is_none_or(|(waiting, _)| *waiting != id) {
            match handles.iter().position(|(waiting, _)| *waiting == id) {
                Some(found) => *at = found,
                None => {
                    *at = handles.len();
                    handles.push((id, waker.clone()));
                    return;
                }
            }
        }
        if let Some((_, registered)) = handles.get_mut(*at) {
            // The same future polled again usually has the same waker: no clone.
            if !registered.will_wake(waker) {
                registered.clone_from(waker);
            }
        }
    }

    /// The future `id` stopped waiting (it completed, or was dropped).
    pub(crate) fn remove(&mut self, id: WaiterId) {
        if let Some(at) = self.handles.iter().position(|(waiting, _)| *waiting == id) {
            self.handles.swap_remove(at);
        }
        if self.handles.is_empty() {
            // No buffer kept for a future that may never come.
            self.handles = Vec::new();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Something changed: every waiting future looks again. They stay registered.
    /// Woken under the lease's lock: `wake_by_ref` neither polls nor drops a task.
    pub(crate) fn wake_all(&self) {
        for (_, waker) in &self.handles {
            waker.wake_by_ref();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    use super::Waiters;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (Arc::clone(&count), Waker::from(count))
    }

    /// Two futures of one task wait with the same waker: the first to finish leaves
    /// the other registered, and nothing is allocated once neither waits.
    #[test]
    fn a_waiter_that_finishes_leaves_the_others_of_its_task_registered() {
        let (count, waker) = counter();
        let mut waiters = Waiters::default();
        let (mut first, mut second) = (0, 0);
        waiters.register(1, &waker, &mut first);
        waiters.register(2, &waker, &mut second);
        waiters.register(1, &waker, &mut first);
        waiters.remove(1);
        // Moved by the removal: found again where it is now.
        waiters.register(2, &waker, &mut second);
        assert_eq!(waiters.handles.len(), 1);
        waiters.wake_all();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        waiters.remove(2);
        assert_eq!(waiters.handles.capacity(), 0);
    }
}
