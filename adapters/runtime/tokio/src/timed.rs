//! [`Timed`]: the lease's service, noting when each renewal is sent, so that the
//! round trip of a confirmed renewal can be reported (metrics, tracing) without the
//! core or the shared driver knowing about it, and when each acquire attempt is sent,
//! so that a release waits for its outcome ([`Shared::poll_release`]).
//!
//! Only the send instant is stored (in the lease's shared state, as microseconds on
//! its clock); the answer instant is the moment the driver reports
//! [`Event::Renewed`](leasehold::Event::Renewed). The driver keeps at most one
//! renewal current: an answer to an older one is refused as stale by the core, so
//! "the latest renewal sent" is the one a `Renewed` confirms.

use std::future::Future;
use std::sync::Arc;

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_driver::LockService;

use crate::shared::Shared;

/// `service`, with [`Shared::renewal_sent`] noted as each renewal is created. Owns
/// the driver task's two `Arc`s, so that the task future holds nothing more than
/// before.
pub(crate) struct Timed<S> {
    pub(crate) service: Arc<S>,
    pub(crate) shared: Arc<Shared>,
}

impl<S: LockService> LockService for Timed<S> {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> + Send {
        self.shared.attempt_sent();
        self.service.acquire(key, token, identity, ttl)
    }

    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> + Send {
        self.shared.renewal_sent(self.shared.clock().now());
        self.service.renew(key, token, fence, ttl)
    }

    fn release(&self, key: &str, token: OwnerToken) -> impl Future<Output = ReleaseOutcome> + Send {
        self.service.release(key, token)
    }

    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> + Send {
        self.service.holder(key)
    }

    fn revoked(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
    ) -> impl Future<Output = ()> + Send {
        self.service.revoked(key, token, fence)
    }
}
