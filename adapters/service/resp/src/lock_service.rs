//! The driver's view: the `LocalLockService` impl, errors turned into final refusals
//! or unknown outcomes exactly as `leasehold-redis` does.

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Indeterminate, OwnerToken, Refusal,
    ReleaseOutcome, RenewOutcome,
};
use leasehold_driver::{Clock, LocalLockService};

use crate::connect::Connect;
use crate::error::Error;
use crate::service::{Answered, Op, RespLockService};

/// How an operation ended, for the driver: its outcome, or why it has none.
enum Settled {
    Answered(Answered),
    Refused(Refusal),
    Indeterminate(Indeterminate),
}

/// A final refusal or an unknown outcome for every error (an answer to another
/// operation cannot happen: `perform` answers in kind). Out of line, so the four
/// methods share one copy.
#[inline(never)]
fn settle(result: Result<Answered, Error>) -> Settled {
    match result {
        Ok(answered) => Settled::Answered(answered),
        Err(err) => match err.refusal() {
            Some(refusal) => Settled::Refused(refusal),
            None => Settled::Indeterminate(err.indeterminate().unwrap_or(Indeterminate::Protocol)),
        },
    }
}

impl<F: Connect, K: Clock, const R: usize, const W: usize> LocalLockService
    for RespLockService<'_, F, K, R, W>
{
    // Each method awaits the one `perform` future and picks its outcome out: a few
    // bytes each, where an `async fn` per method would be a copy of the request path.
    async fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> AcquireOutcome {
        match settle(self.perform(Op::acquire(key, token, identity, ttl)).await) {
            Settled::Answered(Answered::Acquire(outcome)) => outcome,
            Settled::Refused(refusal) => AcquireOutcome::Refused(refusal),
            Settled::Indeterminate(why) => AcquireOutcome::Indeterminate(why),
            Settled::Answered(_) => AcquireOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> RenewOutcome {
        match settle(self.perform(Op::renew(key, token, fence, ttl)).await) {
            Settled::Answered(Answered::Renew(outcome)) => outcome,
            Settled::Refused(refusal) => RenewOutcome::Refused(refusal),
            Settled::Indeterminate(why) => RenewOutcome::Indeterminate(why),
            Settled::Answered(_) => RenewOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        match settle(self.perform(Op::release(key, token)).await) {
            Settled::Answered(Answered::Release(outcome)) => outcome,
            Settled::Refused(refusal) => ReleaseOutcome::Refused(refusal),
            Settled::Indeterminate(why) => ReleaseOutcome::Indeterminate(why),
            Settled::Answered(_) => ReleaseOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }

    async fn holder(&self, key: &str) -> HolderOutcome {
        match settle(self.perform(Op::holder(key)).await) {
            Settled::Answered(Answered::Holder(Some(holder))) => HolderOutcome::Held(holder),
            Settled::Answered(Answered::Holder(None)) => HolderOutcome::Free,
            Settled::Refused(refusal) => HolderOutcome::Refused(refusal),
            Settled::Indeterminate(why) => HolderOutcome::Indeterminate(why),
            Settled::Answered(_) => HolderOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }
}
