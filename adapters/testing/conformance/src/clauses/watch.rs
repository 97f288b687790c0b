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

/// `holder_changed(key, seen)` does not complete while the holder stays the one
/// seen (a free key through another token's failed release; a held key through its
/// holder's renewal), since an observer would only query again, but with
/// [`Capabilities::holder_watch`] it must complete within the request timeout of
/// every change: a grant of the free key, the holder's release, and at once when
/// the holder already differs from the one seen (nothing that changed before the
/// call is missed).
pub async fn holder_changed_fires_on_every_change<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "holder_changed_fires_on_every_change");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let quiet = std_of(ctx.ttl()) / 4;
    let within = std_of(caps.request_timeout);
    let fired = |what: &str| {
        ctx.violation(format!(
            "holder_changed({key:?}) completed {what}, while the holder stayed the one seen"
        ))
    };
    let missed = |what: &str| {
        ctx.violation(format!(
            "holder_changed({key:?}) did not complete within {within:?} of {what} (the \
             capabilities say the service watches)"
        ))
    };

    // A free key: quiet through another token's failed release, then a grant.
    let mut vacant = pin!(s.holder_changed(&key, None));
    let stands = async {
        tokio::time::sleep(quiet).await;
        ctx.release_is(&key, ctx.token(), ReleaseOutcome::NotOwner, "of a free key")
            .await
    };
    tokio::select! {
        () = &mut vacant => return Err(fired("on a free key")),
        result = stands => result?,
    }
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    if caps.holder_watch && tokio::time::timeout(within, &mut vacant).await.is_err() {
        return Err(missed("a grant of the free key"));
    }

    // A held key: quiet through a renewal, then the release.
    let mut held = pin!(s.holder_changed(&key, Some(fence)));
    let stands = async {
        tokio::time::sleep(quiet).await;
        ctx.renewed(&key, token, fence, ctx.ttl(), "while watched")
            .await
            .map(drop)
    };
    tokio::select! {
        () = &mut held => return Err(fired("while the holder renewed")),
        result = stands => result?,
    }
    ctx.release_is(&key, token, ReleaseOutcome::Released, "by the holder")
        .await?;
    if caps.holder_watch && tokio::time::timeout(within, &mut held).await.is_err() {
        return Err(missed("the holder's release"));
    }

    // Seen long ago: the holder changed before the call.
    ctx.granted(&key, ctx.token(), &me, ctx.ttl()).await?;
    if caps.holder_watch
        && tokio::time::timeout(within, s.holder_changed(&key, Some(fence)))
            .await
            .is_err()
    {
        return Err(missed("a call that saw a holder gone before it"));
    }
    Ok(())
}
