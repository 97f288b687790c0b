//! `revoked`: never while the grant stands; promptly once it is gone, where the
//! service can watch.

use std::pin::pin;

use leasehold::ReleaseOutcome;
use leasehold_driver::LocalLockService;

use crate::caps::std_of;
use crate::ctx::{Ctx, Verdict};
use crate::Capabilities;

/// `revoked(key, token, fence)` does not complete while the grant stands (a quarter
/// of its TTL is watched, through another token's failed release and the holder's
/// renewal): a spurious completion would end a healthy lease. With
/// [`Capabilities::revocation_watch`] it completes within the request timeout once
/// the holder releases the key.
pub async fn revoked_fires_only_when_the_grant_is_gone<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "revoked_fires_only_when_the_grant_is_gone");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    let mut revoked = pin!(s.revoked(&key, token, fence));
    let quiet = std_of(ctx.ttl()) / 4;
    let stands = async {
        tokio::time::sleep(quiet).await;
        ctx.release_is(
            &key,
            ctx.token(),
            ReleaseOutcome::NotOwner,
            "by another token",
        )
        .await?;
        ctx.renewed(&key, token, fence, ctx.ttl(), "while watched")
            .await
            .map(drop)
    };
    tokio::select! {
        () = &mut revoked => {
            return Err(ctx.violation(format!(
                "revoked({key:?}, {token}, {fence}) completed while the grant stood"
            )))
        }
        result = stands => result?,
    }
    if !caps.revocation_watch {
        return Ok(());
    }
    let released = async {
        ctx.release_is(&key, token, ReleaseOutcome::Released, "by the holder")
            .await?;
        tokio::time::timeout(std_of(caps.request_timeout), &mut revoked)
            .await
            .map_err(|_| {
                ctx.violation(format!(
                    "revoked({key:?}, {token}, {fence}) did not complete within {:?} of the \
                     release (the capabilities say the service watches)",
                    std_of(caps.request_timeout)
                ))
            })
    };
    released.await
}
