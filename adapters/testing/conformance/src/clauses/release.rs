//! Release (compare-and-delete) and the holder query.

use leasehold::{AcquireOutcome, ReleaseOutcome};
use leasehold_driver::LocalLockService;

use crate::ctx::{Ctx, Verdict};
use crate::Capabilities;

/// A release by another token answers `NotOwner` and the key stays held, by the same
/// holder with the same fence.
pub async fn release_by_another_token_is_not_owner<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "release_by_another_token_is_not_owner");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    ctx.release_is(
        &key,
        ctx.token(),
        ReleaseOutcome::NotOwner,
        "by another token",
    )
    .await?;
    ctx.held_by(&key, &me, fence, ctx.ttl(), "after another token's release")
        .await?;
    ctx.renewed(
        &key,
        token,
        fence,
        ctx.ttl(),
        "after another token's release",
    )
    .await?;
    Ok(())
}

/// A release by the holder answers `Released` and frees the key: `holder` reports
/// `Free`, a second release answers `NotOwner`, and another token is granted the key.
pub async fn release_by_the_holder_frees_the_key<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "release_by_the_holder_frees_the_key");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    ctx.granted(&key, token, &me, ctx.ttl()).await?;
    ctx.release_is(&key, token, ReleaseOutcome::Released, "by the holder")
        .await?;
    ctx.free(&key, "after the release").await?;
    ctx.release_is(&key, token, ReleaseOutcome::NotOwner, "a second time")
        .await?;
    let never = ctx.key("never-used");
    ctx.release_is(
        &never,
        token,
        ReleaseOutcome::NotOwner,
        "of a key never used",
    )
    .await?;
    ctx.granted(&key, ctx.token(), &me, ctx.ttl()).await?;
    Ok(())
}

/// `holder` reports `Free` for a key never used and `Held` (identity, fence, at most
/// the TTL left) for a granted one, and changes nothing: asked repeatedly, the grant
/// stands, contenders are still turned away and the holder can still renew.
pub async fn holder_reports_and_changes_nothing<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "holder_reports_and_changes_nothing");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    for _ in 0..3 {
        ctx.free(&key, "of a key never used").await?;
    }
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    for _ in 0..3 {
        ctx.held_by(&key, &me, fence, ctx.ttl(), "while granted")
            .await?;
    }
    ctx.held_by_another(&key, ctx.token(), &me, fence, ctx.ttl(), "after queries")
        .await?;
    ctx.renewed(&key, token, fence, ctx.ttl(), "after queries")
        .await?;
    match ctx.acquire(&key, token, &me, ctx.ttl()).await? {
        AcquireOutcome::Granted { fence: again, .. } if again == fence => Ok(()),
        other => Err(ctx.violation(format!(
            "re-acquire by the holder after queries: expected Granted with {fence}, got \
             {other:?}"
        ))),
    }
}
