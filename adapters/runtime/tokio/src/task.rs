//! The driver task: the shared [`run_term`] loop on tokio's clock, spawned once per
//! lease. This adapter decides no lease policy (the core decides when to retry and
//! when to give up); it only wires the loop's reports and its release signal to the
//! handles.

use std::future::Future;
use std::sync::Arc;

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Instant, Lease, OwnerToken,
    ReleaseOutcome, RenewOutcome,
};
use leasehold_driver::{run_term, LockService, Report, Target};

use crate::shared::Shared;
use crate::{turns, LeaseEnd};

/// What the driver task owns: the service and the lease's shared state. Ends the
/// term when it is dropped (see its `Drop`).
struct Task<S> {
    service: Arc<S>,
    shared: Arc<Shared>,
}

/// Spawns the task that runs `shared`'s one term against `service`, giving up
/// acquiring at `give_up_at` (on the lease's clock). Must be called from within a
/// tokio runtime.
pub(crate) fn spawn<S>(shared: Arc<Shared>, service: Arc<S>, give_up_at: Instant)
where
    S: LockService + 'static,
{
    tokio::spawn(drive(Task { service, shared }, give_up_at));
}

/// Runs the term. Not an `async fn`, which would keep its arguments twice in every
/// lease's task.
#[allow(clippy::manual_async_fn)]
fn drive<S: LockService + 'static>(task: Task<S>, give_up_at: Instant) -> impl Future<Output = ()> {
    async move {
        // `task` ends the term when it is dropped (see its `Drop`).
        let shared = &*task.shared;
        // The (random) owner also seeds the retry jitter: contenders do not retry in
        // lock step.
        let mut lease = Lease::new(shared.config(), shared.owner);
        let service = Boxed(&*task.service);
        let target = Target {
            service: &service,
            key: &shared.key,
            owner: shared.owner,
            identity: shared.identity(),
        };
        // A fresh lease is never mid-term, so this cannot fail; if it ever did, the
        // guard above ends the term as "driver stopped", which is the safe reading.
        let term = run_term(
            &mut lease,
            &shared.gate,
            target,
            shared.clock(),
            give_up_at,
            shared.release_wanted(),
            |report| publish(&task.service, shared, report, tokio::time::Instant::now()),
        );
        // Inside the lease's span (key, holder, fence), with the `tracing` feature.
        #[cfg(feature = "tracing")]
        let term = tracing::Instrument::instrument(
            term,
            crate::trace::lease_span(&shared.key, shared.identity()),
        );
        // Awaited apart from the call, so the call's temporaries do not take room in the
        // task next to the loop's own future.
        let _ = term.await;
        // The core's counters live in the lease, which the loop borrowed until now.
        task.shared.record_core_stats(lease.stats());
    }
}

/// `S` with its requests on the heap. A task keeps room for the largest request
/// future the whole term long (136 B for the in-memory service, about 500 B for
/// Redis), while a request lives only until it is answered: boxed, it costs the lease
/// 8 B in its task and the rest only in flight, as a [`LeaseSet`](crate::LeaseSet)'s
/// requests do. The revocation watch lives as long as the grant and stays inline.
struct Boxed<'s, S>(&'s S);

impl<S: LockService> LockService for Boxed<'_, S> {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send {
        Box::pin(self.0.acquire(key, token, identity, ttl))
    }

    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send {
        Box::pin(self.0.renew(key, token, fence, ttl))
    }

    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> + Send {
        Box::pin(self.0.release(key, token))
    }

    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> + Send {
        self.0.holder(key)
    }

    fn revoked(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> impl Future<Output = ()> + Send {
        self.0.revoked(key, token, fence)
    }

    fn holder_changed(&self, key: &str, seen: Option<Fence>) -> impl Future<Output = ()> + Send {
        self.0.holder_changed(key, seen)
    }
}

/// Hands a driver's report to the handles. A term released after a grant first
/// takes its turn (see [`note_release`]), so that an acquire started by a waiter of
/// `release()`, which wakes on this report, finds it taken.
pub(crate) fn publish<S: LockService + 'static>(
    service: &Arc<S>,
    shared: &Shared,
    report: Report,
    at: tokio::time::Instant,
) {
    if let Report::Event(leasehold::Event::Released) = report {
        note_release(service, shared);
    }
    shared.publish(report, at);
}

/// Fair turns: after a release of a granted term, this process's next acquire of the
/// key lets waiters go first (`leasehold::rules`, "Acquiring"). Not inlined into the
/// task, whose future it would grow.
#[inline(never)]
fn note_release<S: LockService + 'static>(service: &Arc<S>, shared: &Shared) {
    if shared.end() == Some(LeaseEnd::Released) && shared.granted().is_some() {
        let backoff = shared.config().release_backoff().into();
        turns::released(service, &shared.key, backoff);
    }
}

/// The term is over when the task's future goes: at its end, when it unwinds, or
/// when the runtime drops it unfinished — even before its first poll (a runtime
/// that is shutting down drops what is spawned on it unpolled), which a guard made
/// inside the task would miss, leaving the acquire waiting for ever. The handles
/// then learn that nothing renews.
impl<S> Drop for Task<S> {
    fn drop(&mut self) {
        self.shared.finish();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use leasehold::Instant;

    use crate::memory::MemoryService;
    use crate::shared::{Common, Shared};

    /// A driver task per lease is most of a lease's memory: keep its future and the
    /// shared state from growing unnoticed. Tokio rounds a task up to a multiple of
    /// 128 B, and adds about 104 B to the future: a future of at most 536 B keeps the
    /// task at 640 B, which holds because requests are boxed ([`super::Boxed`]). The
    /// lease's `tracing` span (feature `tracing`, on by default) adds 40 B to the
    /// task, which runs inside it. The shared state keeps the handles' waiting
    /// futures behind one pointer under its lock ([`crate::waiters`]). The config,
    /// clock and identity
    /// ([`Common`]) are shared by the tasks started on one thread the same way, and
    /// point to the process's default identity rather than keeping one.
    /// CHANGELOG.md records what each size change bought.
    #[tokio::test]
    async fn a_lease_task_and_its_shared_state_stay_small() {
        let shared = Shared::sample();
        let task = super::Task {
            service: Arc::new(MemoryService::new()),
            shared,
        };
        let task = super::drive(task, Instant::MAX);
        let (task, shared, common) = (size_of_val(&task), size_of::<Shared>(), size_of::<Common>());
        println!("driver task future: {task} B, shared state: {shared} B, common: {common} B");
        let limit = if cfg!(feature = "tracing") { 536 } else { 496 };
        assert!(task <= limit, "driver task future is {task} B");
        assert!(shared <= 144, "shared state is {shared} B");
        assert!(common <= 88, "config, clock and identity are {common} B");
    }
}
