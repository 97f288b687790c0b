//! One request to the in-memory service, as a future.
//!
//! The common case (no fault applies) is answered on the first poll from a small
//! inline future; only a request that a fault touches moves to a boxed async path
//! with its timers (and its own copy of the key). A driver keeps one future per kind of
//! request alive for every lease, so keeping the fault-free future small keeps every
//! lease small.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use leasehold::{
    AcquireOutcome, Fence, HolderOutcome, Identity, Indeterminate, OwnerToken, Refusal,
    ReleaseOutcome, RenewOutcome,
};
use tokio::time::Instant;

use super::faults::Plan;
use super::MemoryService;

/// What a request asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Acquire(std::time::Duration, Identity),
    Renew(Fence, std::time::Duration),
    Release,
    Holder,
}

/// What the service answered, for any [`Op`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Answer {
    Acquire(AcquireOutcome),
    Renew(RenewOutcome),
    Release(ReleaseOutcome),
    Holder(HolderOutcome),
}

impl Answer {
    /// The final refusal of `op` on a key that breaks the key rules.
    pub(crate) fn refused(op: &Op, why: Refusal) -> Answer {
        match op {
            Op::Acquire(..) => Answer::Acquire(AcquireOutcome::Refused(why)),
            Op::Renew(..) => Answer::Renew(RenewOutcome::Refused(why)),
            Op::Release => Answer::Release(ReleaseOutcome::Refused(why)),
            Op::Holder => Answer::Holder(HolderOutcome::Refused(why)),
        }
    }
}

/// The outcome type of one kind of request.
pub(crate) trait FromAnswer {
    fn from_answer(answer: Answer) -> Self;
}

// An answer of the wrong kind cannot happen (each op maps to its own answer); should it
// ever, it is an answer this client cannot interpret, never a guess.
impl FromAnswer for AcquireOutcome {
    fn from_answer(answer: Answer) -> Self {
        match answer {
            Answer::Acquire(outcome) => outcome,
            _ => AcquireOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }
}
impl FromAnswer for RenewOutcome {
    fn from_answer(answer: Answer) -> Self {
        match answer {
            Answer::Renew(outcome) => outcome,
            _ => RenewOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }
}
impl FromAnswer for ReleaseOutcome {
    fn from_answer(answer: Answer) -> Self {
        match answer {
            Answer::Release(outcome) => outcome,
            _ => ReleaseOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }
}
impl FromAnswer for HolderOutcome {
    fn from_answer(answer: Answer) -> Self {
        match answer {
            Answer::Holder(outcome) => outcome,
            _ => HolderOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }
}

/// A request that carries out its [`Op`] on the service when (and if) it arrives.
pub(crate) struct Request<'s, 'k, T> {
    stage: Stage<'s, 'k>,
    output: PhantomData<fn() -> T>,
}

enum Stage<'s, 'k> {
    /// Not polled yet: faults are decided on the first poll, i.e. when it is sent.
    Unsent {
        service: &'s MemoryService,
        key: &'k str,
        token: OwnerToken,
        op: Op,
    },
    /// A fault applies: the slow path, with its latency, stall and loss.
    Faulty(Pin<Box<dyn Future<Output = Answer> + Send + 's>>),
    Done,
}

impl<'s, 'k, T> Request<'s, 'k, T> {
    pub(crate) fn new(service: &'s MemoryService, key: &'k str, token: OwnerToken, op: Op) -> Self {
        Request {
            stage: Stage::Unsent {
                service,
                key,
                token,
                op,
            },
            output: PhantomData,
        }
    }
}

impl<T: FromAnswer> Future for Request<'_, '_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let mut faulty = match std::mem::replace(&mut this.stage, Stage::Done) {
            Stage::Unsent {
                service,
                key,
                token,
                op,
            } => match service.send(key, token, op) {
                Ok(answer) => return Poll::Ready(T::from_answer(answer)),
                Err(plan) => Box::pin(service.faulty(key.into(), token, op, plan)),
            },
            Stage::Faulty(future) => future,
            Stage::Done => panic!("request polled after it completed"),
        };
        match faulty.as_mut().poll(cx) {
            Poll::Ready(answer) => Poll::Ready(T::from_answer(answer)),
            Poll::Pending => {
                this.stage = Stage::Faulty(faulty);
                Poll::Pending
            }
        }
    }
}

/// What a request finds when it reaches the service.
enum Arrival {
    Lost,
    Stalled,
    Done(Answer),
}

impl MemoryService {
    /// Sends a request: carries it out at once when no fault touches it, or answers
    /// the plan its faults make for it (using up drop counters).
    fn send(&self, key: &str, token: OwnerToken, op: Op) -> Result<Answer, Plan> {
        if !self.any_faults.load(Ordering::Acquire) {
            // No fault set anywhere: only the key's shard is locked.
            return Ok(self.shards.of(key).apply(key, token, op, Instant::now()));
        }
        let mut faults = self.lock_faults();
        let plan = faults.table.plan(token.owner);
        self.any_faults.store(faults.table.any(), Ordering::Release);
        match plan {
            // Carried out under the faults lock, so no fault can change in between.
            None => Ok(self.shards.of(key).apply(key, token, op, Instant::now())),
            Some(plan) => Err(plan),
        }
    }

    /// The slow path of a request that a fault touches.
    async fn faulty(&self, key: Box<str>, token: OwnerToken, op: Op, plan: Plan) -> Answer {
        let owner = token.owner;
        if plan.lose_request {
            self.lock_faults().lost_requests += 1;
            return std::future::pending().await;
        }
        let there = plan.latency / 2;
        let back = plan.latency - there;
        if !there.is_zero() {
            tokio::time::sleep(there).await;
        }
        let answer = loop {
            let changed = self.faults_changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Register before looking, so an un-stall in between still wakes us.
            changed.as_mut().enable();
            let arrival = {
                let mut faults = self.lock_faults();
                match faults.table.blocked(owner) {
                    (_, true) => {
                        faults.lost_requests += 1;
                        Arrival::Lost
                    }
                    (true, false) => Arrival::Stalled,
                    // Carried out under the faults lock, like every faulty request.
                    (false, false) => {
                        Arrival::Done(self.shards.of(&key).apply(&key, token, op, Instant::now()))
                    }
                }
            };
            match arrival {
                Arrival::Done(answer) => break answer,
                Arrival::Lost => return std::future::pending().await,
                Arrival::Stalled => changed.await,
            }
        };
        if plan.lose_response {
            self.lock_faults().lost_responses += 1;
            return std::future::pending().await;
        }
        if !back.is_zero() {
            tokio::time::sleep(back).await;
        }
        let lost_on_the_way_back = {
            let mut faults = self.lock_faults();
            // Partitioned while the answer travelled back: lost.
            let lost = faults.table.blocked(owner).1;
            faults.lost_responses += u64::from(lost);
            lost
        };
        if lost_on_the_way_back {
            return std::future::pending().await;
        }
        answer
    }
}
