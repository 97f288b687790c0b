//! The TTL is hard: the key is gone at its expiry, whoever asks.

use leasehold::AcquireOutcome;
use leasehold_driver::LocalLockService;

use crate::caps::std_of;
use crate::ctx::{ensure, Ctx, Verdict};
use crate::Capabilities;

/// A grant lasts its TTL, no less and no longer, on the service's own time base: right
/// after the grant, and again when the TTL less the
/// [tolerance](Capabilities::tolerance) has passed since the request was sent,
/// another token is turned away and told no less than the time left of the TTL (less
/// tolerance and granularity); once the TTL (plus the service's expiry slack) has
/// passed since the answer the key is `Free`, another token is granted it with a
/// greater fence, and the old holder's renewal answers `NotOwner`.
pub async fn the_ttl_is_hard<S: LocalLockService>(s: &S, caps: &Capabilities) -> Verdict {
    let ctx = Ctx::new(s, caps, "the_ttl_is_hard");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let ttl = ctx.ttl();
    let sent = tokio::time::Instant::now();
    let fence = ctx.granted(&key, token, &me, ttl).await?;
    let answered = tokio::time::Instant::now();
    ctx.refused_until(&key, &me, fence, ttl, sent, "right after the grant")
        .await?;
    // Handled after `sent`, so held until at least sent + ttl.
    let before_the_end = std_of(ttl.saturating_sub(caps.tolerance));
    ctx.sleep_until(sent + before_the_end).await;
    ctx.refused_until(
        &key,
        &me,
        fence,
        ttl,
        sent,
        "a tolerance before the TTL ends",
    )
    .await?;
    // Handled before `answered`, so gone by answered + ttl (+ the service's lag).
    ctx.sleep_until(answered + std_of(ttl.saturating_add(caps.expiry_slack)))
        .await;
    ctx.free(&key, "once the TTL has passed").await?;
    match ctx.acquire(&key, ctx.token(), &me, ttl).await? {
        AcquireOutcome::Granted { fence: next, .. } => ensure!(
            ctx,
            next > fence,
            "the grant after an expiry has {next}, not above the expired {fence}"
        ),
        other => {
            return Err(ctx.violation(format!(
                "acquire by another token once the TTL has passed: expected Granted, got \
                 {other:?}"
            )))
        }
    }
    ctx.renew_not_owner(&key, token, fence, "by the expired holder")
        .await
}

/// A renewal never re-creates an expired key, and the holder's own re-acquire after
/// its expiry is a new grant with a greater fence.
pub async fn renew_never_recreates_an_expired_key<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "renew_never_recreates_an_expired_key");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    let answered = tokio::time::Instant::now();
    ctx.sleep_until(answered + std_of(ctx.ttl().saturating_add(caps.expiry_slack)))
        .await;
    ctx.renew_not_owner(&key, token, fence, "after the TTL has passed")
        .await?;
    ctx.free(&key, "after a renewal of an expired key").await?;
    let again = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    ensure!(
        ctx,
        again > fence,
        "the holder's own re-acquire after its expiry has {again}, not above {fence}"
    );
    Ok(())
}

/// A renewal, and a re-acquire by the holder's own token, move the expiry to their
/// handling time + TTL: both keys, granted for the TTL and renewed (or re-acquired)
/// halfway through it, are still held once the first grant's TTL has passed since
/// its answer.
pub async fn renewals_and_reacquires_extend_the_expiry<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "renewals_and_reacquires_extend_the_expiry");
    let (renewed, reacquired) = (ctx.key("renewed"), ctx.key("reacquired"));
    let me = ctx.identity("holder");
    let (first, second) = (ctx.token(), ctx.token());
    let ttl = ctx.ttl();
    let sent = tokio::time::Instant::now();
    let renewed_fence = ctx.granted(&renewed, first, &me, ttl).await?;
    let reacquired_fence = ctx.granted(&reacquired, second, &me, ttl).await?;
    let answered = tokio::time::Instant::now();
    // Handled after this, so the new expiries are at least sent + 1.5 × ttl.
    ctx.sleep_until(sent + std_of(ttl) / 2).await;
    ctx.renewed(
        &renewed,
        first,
        renewed_fence,
        ttl,
        "halfway through the TTL",
    )
    .await?;
    match ctx.acquire(&reacquired, second, &me, ttl).await? {
        AcquireOutcome::Granted { fence, ttl: g } if fence == reacquired_fence && g == ttl => {}
        other => {
            return Err(ctx.violation(format!(
                "re-acquire by the holder halfway through the TTL: expected Granted with \
                 {reacquired_fence} and ttl {:?}, got {other:?}",
                std_of(ttl)
            )))
        }
    }
    // Both grants' first expiries (handled before `answered`) have passed.
    ctx.sleep_until(answered + std_of(ttl)).await;
    let past = "once the first grant's TTL has passed since its answer";
    ctx.held_by_another(&renewed, ctx.token(), &me, renewed_fence, ttl, past)
        .await?;
    ctx.held_by_another(&reacquired, ctx.token(), &me, reacquired_fence, ttl, past)
        .await
}
