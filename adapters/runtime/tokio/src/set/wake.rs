//! How the leases of one set driver reach it: new leases and wake-ups go into its
//! [`Inbox`], and the driver task drains it.
//!
//! Each lease's shared record is the waker of everything the driver polls for that
//! lease (its request in flight, its revocation watch, its release signal). A
//! wake-up queues the lease's slot once until the driver has looked at it, so a
//! lease woken a thousand times between two passes costs one look.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Wake;

use futures_util::task::AtomicWaker;

use crate::shared::Shared;

/// A lease handed to a driver, not yet started.
pub(super) struct Registration {
    pub(super) shared: Arc<Shared>,
    /// When to give up acquiring, on the set's clock.
    pub(super) give_up_at: leasehold::Instant,
}

/// What reaches one driver task from outside it.
#[derive(Default)]
pub(crate) struct Inbox {
    new: Mutex<NewLeases>,
    /// Slots of leases woken since the driver last looked.
    woken: Mutex<Vec<u32>>,
    /// The driver task's waker.
    driver: AtomicWaker,
    /// The set is gone: the driver ends once its last lease has.
    closed: AtomicBool,
}

/// Leases handed over and not yet taken, and whether anyone ever will take them.
#[derive(Default)]
struct NewLeases {
    waiting: Vec<Registration>,
    /// The driver is gone (its runtime shut down, or a service future panicked in
    /// it): a lease handed over now would wait for ever.
    abandoned: bool,
}

impl Inbox {
    /// Hands `lease` to the driver; if the driver is gone, its acquire ends at once
    /// as "driver stopped".
    pub(super) fn register(&self, lease: Registration) {
        let refused = {
            let mut new = lock(&self.new);
            if new.abandoned {
                Some(lease)
            } else {
                new.waiting.push(lease);
                None
            }
        };
        match refused {
            Some(lease) => lease.shared.finish(),
            None => self.driver.wake(),
        }
    }

    /// Moves the leases handed over since the last call to the back of `into`.
    pub(super) fn take_new(&self, into: &mut VecDeque<Registration>) {
        into.extend(lock(&self.new).waiting.drain(..));
    }

    /// Moves the slots woken since the last call into `into`.
    pub(super) fn take_woken(&self, into: &mut Vec<u32>) {
        into.append(&mut lock(&self.woken));
    }

    pub(super) fn register_driver(&self, waker: &std::task::Waker) {
        self.driver.register(waker);
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.driver.wake();
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The driver is gone: leases handed over but never started, and any handed over
    /// from now on, end their acquires as "driver stopped".
    pub(super) fn abandon(&self) {
        let waiting = {
            let mut new = lock(&self.new);
            new.abandoned = true;
            std::mem::take(&mut new.waiting)
        };
        for lease in waiting {
            lease.shared.finish();
        }
    }
}

/// A lease of a set is the waker of its own futures (its request in flight, its
/// revocation watch, its release signal): a wake-up queues its slot in its driver's
/// inbox, once until the driver looks, and wakes the driver.
impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let driver = usize::from(self.driver.load(Ordering::Relaxed));
        let Some(inbox) = self.common().drivers.as_ref().and_then(|d| d.get(driver)) else {
            return; // not a set's lease: nothing polls its futures with this waker
        };
        if !self.queued.swap(true, Ordering::AcqRel) {
            lock(&inbox.woken).push(self.slot.load(Ordering::Acquire));
            inbox.driver.wake();
        }
    }
}

impl Shared {
    /// The lease was given `slot` in its driver: wake-ups from now on name it.
    pub(super) fn placed(&self, slot: u32) {
        self.slot.store(slot, Ordering::Release);
    }

    /// The driver is about to look at the lease: wake-ups from now on queue it again.
    pub(super) fn looking(&self) {
        self.queued.store(false, Ordering::Release);
    }
}

impl fmt::Debug for Inbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

/// Nothing panics while these locks are held; if something did, the data is plain
/// values, so keep going.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
