//! One set driver: the leases it was handed, each a [`Lease`] core with its own write
//! gate and handles, run by one task on one timer.
//!
//! Each lease is stepped by the shared [`step`](leasehold_driver::step) of
//! `leasehold-driver`, as in `run_term`. Only the waiting differs: the core's next
//! deadline goes into one queue of deadlines (a radix heap) for the whole driver
//! instead of a runtime timer per lease, and the lease's futures are polled when they
//! wake it (the lease's shared record is their waker) rather than by a task of their
//! own.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use leasehold::{Action, Config, Fence, Instant, Lease, Response, Term};
use leasehold_driver::{Hooks, LeaseIo, LockService, Report, Stepped};
use tokio::time::Sleep;

use super::admission::Admission;
use super::timers::Timers;
use super::wake::{Inbox, Registration};
use crate::shared::Shared;
use crate::task::publish;
use crate::LeaseClock;

/// A request or watch of one lease, owning what it borrows.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How many leases a driver steps before it yields to the runtime, so a burst (ten
/// thousand leases falling due in one millisecond, or acquired at once) does not hold
/// a worker thread for all of it.
const STEPS_PER_POLL: usize = 512;

/// How many acquire requests one driver keeps in flight; leases handed over beyond
/// that wait in the inbox until answers come back. A process that acquires a hundred
/// thousand leases at once would otherwise put them all in the service's queue in
/// the same instant: past the request timeout, every attempt times out and is sent
/// again while the service still works through the first copy. Waiting contenders
/// between attempts do not count.
const ACQUIRES_IN_FLIGHT: usize = 256;

/// The driver task's future.
pub(super) struct Driver<S> {
    service: Arc<S>,
    clock: LeaseClock,
    inbox: Arc<Inbox>,
    slots: Slots,
    /// Acquire requests in flight (at most [`ACQUIRES_IN_FLIGHT`]), counted by
    /// their futures ([`InFlight`]).
    acquiring: Arc<AtomicUsize>,
    /// Whether new leases may start: not while the leases held are renewed late.
    admission: Admission,
    /// Every lease's next deadline, earliest first. An entry is stale (skipped when
    /// popped) unless it is still its lease's deadline (the core's `poll_timeout`): a
    /// deadline is pushed once, when a step changes it, and never searched for.
    timers: Timers,
    /// The one runtime timer: until the earliest deadline.
    sleep: Pin<Box<Sleep>>,
    sleeping_until: Option<Instant>,
    /// Taken from the inbox, not yet stepped (kept across polls when the step budget
    /// runs out).
    new: VecDeque<Registration>,
    woken: Vec<u32>,
}

/// How many slots are allocated at a time: small enough that a set of a few leases
/// stays small, large enough that a million leases need few allocations, and unlike a
/// `Vec` that doubles, never more than one chunk of slots to spare.
const CHUNK: usize = 64;

/// The leases, by slot; a slot is reused once its lease has ended.
#[derive(Default)]
struct Slots {
    chunks: Vec<Box<[Option<Entry>]>>,
    free: Vec<u32>,
    live: usize,
}

impl Slots {
    fn get_mut(&mut self, slot: u32) -> Option<&mut Entry> {
        let slot = slot as usize;
        self.chunks
            .get_mut(slot / CHUNK)?
            .get_mut(slot % CHUNK)?
            .as_mut()
    }

    /// A free slot, or `None` when four billion are in use.
    fn vacant(&mut self) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        let first = u32::try_from(self.chunks.len() * CHUNK).ok()?;
        u32::try_from((self.chunks.len() + 1) * CHUNK).ok()?;
        self.chunks.push((0..CHUNK).map(|_| None).collect());
        // The chunk's other slots, lowest first.
        self.free.extend((first + 1..first + CHUNK as u32).rev());
        Some(first)
    }

    fn put(&mut self, slot: u32, entry: Entry) {
        let slot = slot as usize;
        if let Some(place) = self
            .chunks
            .get_mut(slot / CHUNK)
            .and_then(|c| c.get_mut(slot % CHUNK))
        {
            *place = Some(entry);
            self.live += 1;
        }
    }

    fn take(&mut self, slot: u32) -> Option<Entry> {
        let index = slot as usize;
        let entry = self
            .chunks
            .get_mut(index / CHUNK)?
            .get_mut(index % CHUNK)?
            .take()?;
        self.free.push(slot);
        self.live -= 1;
        Some(entry)
    }
}

/// One lease of the driver.
struct Entry {
    /// The core, which reads its config through the lease's shared record rather
    /// than keeping 48 bytes of its own that are the same in every lease of the set.
    lease: Lease<Record>,
    /// The request in flight and the revocation watch.
    io: LeaseIo<BoxFuture<Response>, BoxFuture<()>>,
}

/// A lease's shared record as the config of its core: the record is also the waker
/// of the lease's futures.
struct Record(Arc<Shared>);

impl Borrow<Config> for Record {
    fn borrow(&self) -> &Config {
        &self.0.common().config
    }
}

impl Entry {
    fn shared(&self) -> &Arc<Shared> {
        &self.lease.config_source().0
    }
}

/// One acquire request in flight, counted for as long as its future lives: answered,
/// given up at its timeout, or dropped with its lease, it no longer counts. The lease
/// keeps no count of its own.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: &Arc<AtomicUsize>) -> InFlight {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(count))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Entry {
    /// The lease leaves the driver: at its term's end, or with the task (runtime
    /// shutdown), when its handles learn that nothing renews it any more.
    fn drop(&mut self) {
        self.shared().finish();
    }
}

impl<S: LockService + 'static> Driver<S> {
    pub(super) fn new(
        service: Arc<S>,
        clock: LeaseClock,
        inbox: Arc<Inbox>,
        config: &Config,
    ) -> Driver<S> {
        Driver {
            service,
            clock,
            inbox,
            slots: Slots::default(),
            acquiring: Arc::default(),
            admission: Admission::new(config),
            timers: Timers::default(),
            sleep: Box::pin(tokio::time::sleep_until(clock.to_tokio(Instant::MAX))),
            sleeping_until: None,
            new: VecDeque::new(),
            woken: Vec::new(),
        }
    }

    /// Starts a lease handed over by an acquire: its first attempt goes out now.
    fn start(&mut self, registration: Registration) {
        let Registration { shared, give_up_at } = registration;
        // Four billion leases in one driver: refuse this one ("driver stopped")
        // rather than alias a slot.
        let Some(slot) = self.slots.vacant() else {
            return shared.finish();
        };
        shared.placed(slot);
        // The (random) owner also seeds the retry jitter: contenders do not retry
        // in lock step.
        let mut lease = Lease::new(Record(Arc::clone(&shared)), shared.owner);
        // A fresh lease is never mid-term, so this cannot fail.
        let _ = lease.acquire_until(shared.clock().now(), give_up_at, &shared.gate);
        let entry = Entry {
            lease,
            io: LeaseIo::new(),
        };
        self.slots.put(slot, entry);
        self.step(slot, None);
    }

    /// Steps the lease in `slot`, woken by its I/O: its deadline is in the timers.
    fn step_woken(&mut self, slot: u32) {
        let Some(entry) = self.slots.get_mut(slot) else {
            return; // ended already; a late wake-up
        };
        let queued = entry.lease.poll_timeout();
        self.step(slot, queued);
    }

    /// Steps the lease in `slot` and removes it if its term is over. `queued` is the
    /// deadline of the lease the timers hold (or have just fired): a new deadline is
    /// pushed, that one is not pushed again.
    fn step(&mut self, slot: u32, queued: Option<Instant>) {
        let Some(entry) = self.slots.get_mut(slot) else {
            return; // ended already
        };
        entry.shared().looking();
        let stepped = step(
            entry,
            slot,
            queued,
            &self.service,
            &mut self.timers,
            &mut self.admission,
            &self.acquiring,
        );
        if matches!(stepped, Stepped::Ended(_)) {
            if let Some(entry) = self.slots.take(slot) {
                entry.shared().record_core_stats(entry.lease.stats());
            }
        }
    }

    /// Fires the deadlines that have passed, up to `budget` of them (each lease's
    /// ready input first); returns what is left of the budget.
    fn fire_timers(&mut self, mut budget: usize) -> usize {
        let now = self.clock.now();
        while budget > 0 {
            let Some((at, slot)) = self.timers.pop_due(now) else {
                break;
            };
            let Some(entry) = self.slots.get_mut(slot) else {
                continue;
            };
            if entry.lease.poll_timeout() != Some(at) {
                continue; // stale: the lease moved on
            }
            budget -= 1;
            self.admission.deadline(at, now);
            // An answer that is already in comes before the deadline, as in the
            // single-lease loop (which polls the request before its timer): a refusal
            // that arrived at the instant its request timed out must end the lease,
            // not be dropped with the request. A deadline it leaves as it was is
            // still `at`, which has passed: the timeout below takes it.
            self.step(slot, Some(at));
            let Some(entry) = self.slots.get_mut(slot) else {
                continue; // that answer ended the term
            };
            let now = self.clock.now();
            if entry.lease.poll_timeout().is_some_and(|next| next <= now) {
                let shared = Arc::clone(entry.shared());
                entry.lease.handle_timeout(now, &shared.gate);
                self.step(slot, None);
            }
        }
        budget
    }
}

impl<S: LockService + 'static> Future for Driver<S> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        // Register before looking, so anything handed over after the look wakes us.
        this.inbox.register_driver(cx.waker());
        loop {
            // Deadlines first: a flood of wake-ups (a service waking every watch at
            // once) must not delay a renewal that is due.
            let mut budget = this.fire_timers(STEPS_PER_POLL);

            this.inbox.take_woken(&mut this.woken);
            let waking = this.woken.len().min(budget);
            for i in 0..waking {
                let slot = this.woken[i];
                this.step_woken(slot);
            }
            this.woken.drain(..waking);
            budget -= waking;

            // New leases, as far as the acquires in flight allow (answers just
            // stepped above made room, and a lease answered at once makes room again).
            this.inbox.take_new(&mut this.new);
            let now = this.clock.now();
            let most = this.admission.acquires_in_flight(now, ACQUIRES_IN_FLIGHT);
            while budget > 0 && this.acquiring.load(Ordering::Relaxed) < most {
                let Some(registration) = this.new.pop_front() else {
                    break;
                };
                this.start(registration);
                budget -= 1;
            }

            if budget == 0 {
                // More may be due: yield, and come straight back.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }

            // The next deadline, or the instant more new leases may start at once.
            let reopens = if this.new.is_empty() {
                None
            } else {
                this.admission.reopens(now)
            };
            let next = match (this.timers.peek(), reopens) {
                (Some(due), Some(reopens)) => Some(due.min(reopens)),
                (due, reopens) => due.or(reopens),
            };
            if let Some(at) = next {
                if this.sleeping_until != Some(at) {
                    this.sleep.as_mut().reset(this.clock.to_tokio(at));
                    this.sleeping_until = Some(at);
                }
                if this.sleep.as_mut().poll(cx).is_ready() {
                    this.sleeping_until = None;
                    continue;
                }
            }

            if this.inbox.is_closed() && this.slots.live == 0 && this.new.is_empty() {
                return Poll::Ready(());
            }
            return Poll::Pending;
        }
    }
}

impl<S> Drop for Driver<S> {
    fn drop(&mut self) {
        // The leases still here end with their entries; those never started end now.
        self.inbox.abandon();
        for registration in self.new.drain(..) {
            registration.shared.finish();
        }
    }
}

/// One step of one lease (the shared [`step`]), its next deadline pushed to the
/// driver's timers unless it is the one `queued` there.
fn step<S: LockService + 'static>(
    entry: &mut Entry,
    slot: u32,
    queued: Option<Instant>,
    service: &Arc<S>,
    timers: &mut Timers,
    admission: &mut Admission,
    acquiring: &Arc<AtomicUsize>,
) -> Stepped {
    // A reference of its own: the core borrows the record mutably with the lease.
    let shared = &Arc::clone(entry.shared());
    let waker = Waker::from(Arc::clone(shared));
    let mut cx = Context::from_waker(&waker);
    let Entry { lease, io } = entry;
    let mut hooks = Hooks {
        send: |action| send(service, shared, action, acquiring),
        watch: |term, fence| revoked(service, shared, term, fence),
        release: |cx: &mut Context<'_>| shared.poll_release(cx),
        report: |report| {
            if let Report::Event(event) = &report {
                admission.event(event, shared.clock().now());
            }
            publish(service, shared, report, tokio::time::Instant::now());
        },
    };
    let stepped = leasehold_driver::step(
        lease,
        &shared.gate,
        shared.clock(),
        Pin::new(io),
        &mut cx,
        &mut hooks,
    );
    if let Stepped::Waiting(Some(next)) = stepped {
        // `Instant::MAX` never comes.
        if Some(next) != queued && next != Instant::MAX {
            timers.push(next, slot);
        }
    }
    stepped
}

/// The request for `action`, owning what it needs; an acquire counts in `acquiring`
/// while it is in flight.
fn send<S: LockService + 'static>(
    service: &Arc<S>,
    shared: &Arc<Shared>,
    action: Action,
    acquiring: &Arc<AtomicUsize>,
) -> BoxFuture<Response> {
    let (service, shared) = (Arc::clone(service), Arc::clone(shared));
    match action {
        Action::Acquire { term, ttl, .. } => {
            let in_flight = InFlight::new(acquiring);
            Box::pin(async move {
                let _in_flight = in_flight;
                let token = shared.owner.token(term);
                let outcome = service.acquire(&shared.key, token, shared.identity(), ttl);
                Response::Acquire(outcome.await)
            })
        }
        Action::Renew {
            term, fence, ttl, ..
        } => Box::pin(async move {
            let token = shared.owner.token(term);
            Response::Renew(service.renew(&shared.key, token, fence, ttl).await)
        }),
        Action::Release { term, .. } => Box::pin(async move {
            let token = shared.owner.token(term);
            Response::Release(service.release(&shared.key, token).await)
        }),
    }
}

/// The revocation watch of the grant with `fence`.
fn revoked<S: LockService + 'static>(
    service: &Arc<S>,
    shared: &Arc<Shared>,
    term: Term,
    fence: Fence,
) -> BoxFuture<()> {
    let (service, shared) = (Arc::clone(service), Arc::clone(shared));
    // The token is made inside: kept for as long as the grant is, the future carries
    // the 4-byte term rather than the 24-byte token.
    Box::pin(async move {
        let token = shared.owner.token(term);
        service.revoked(&shared.key, token, fence).await
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use leasehold::{Fence, Lease, Term};

    use super::{revoked, Entry, Record};
    use crate::memory::MemoryService;
    use crate::shared::Shared;

    /// What a lease costs a set besides its shared state (the same as with a task of
    /// its own): its slot (the core without a config of its own, its request and
    /// watch) and, for a service that can watch, the watch future; the
    /// request future lives only while a request is in flight. No waker of its own:
    /// the shared state is the waker.
    #[tokio::test]
    async fn a_lease_in_a_set_stays_small() {
        let shared = Shared::sample();
        let service = Arc::new(MemoryService::new());
        let watch = revoked(&service, &shared, Term(1), Fence(1));
        let (entry, watch) = (size_of::<Option<Entry>>(), size_of_val(&*watch));
        println!(
            "slot {entry} B (lease {} B), shared state {} B, memory service watch {watch} B",
            size_of::<Lease<Record>>(),
            size_of::<Shared>(),
        );
        assert!(entry <= 144, "a slot is {entry} B");
        assert!(watch <= 56, "the watch is {watch} B");
    }
}
