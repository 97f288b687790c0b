//! [`Timed`]: the lease's service, noting when each acquire attempt is sent, so that
//! a release waits for its outcome ([`Shared::poll_release`]).

use std::future::Future;
use std::sync::Arc;

use leasehold::{
    AcquireOutcome, Duration, Fence, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_driver::LockService;

use crate::shared::Shared;

/// `service`, with [`Shared::attempt_sent`] noted as each acquire is created. Owns
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
