//! Renewals: only the holder's token with the grant's fence, at least the TTL asked,
//! never re-creating a key, and replacing (possibly shortening) the expiry.

use leasehold::{AcquireOutcome, Fence, ReleaseOutcome, Term};
use leasehold_driver::LocalLockService;

use crate::caps::std_of;
use crate::ctx::{ensure, Ctx, Verdict};
use crate::Capabilities;

/// A renewal with the holder's token and fence answers `Renewed { ttl: r }` with
/// `r >= ttl` asked, and leaves the grant (identity, fence) as it was.
pub async fn renew_by_the_holder_applies_at_least_the_ttl_asked<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(
        s,
        caps,
        "renew_by_the_holder_applies_at_least_the_ttl_asked",
    );
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    for round in 1..=3 {
        let r = ctx
            .renewed(&key, token, fence, ctx.ttl(), &format!("(renewal {round})"))
            .await?;
        ctx.held_by(&key, &me, fence, r, &format!("after renewal {round}"))
            .await?;
    }
    Ok(())
}

/// A renewal with the holder's token but another fence (older or newer) answers
/// `NotOwner`, and the grant stands.
pub async fn renew_with_another_fence_is_not_owner<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "renew_with_another_fence_is_not_owner");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    let mut others = vec![Fence(fence.0.saturating_add(1)), Fence(u64::MAX)];
    if let Some(older) = fence.0.checked_sub(1) {
        others.push(Fence(older));
    }
    for other in others.into_iter().filter(|&f| f != fence) {
        ctx.renew_not_owner(&key, token, other, &format!("while {fence} holds"))
            .await?;
    }
    ctx.held_by(
        &key,
        &me,
        fence,
        ctx.ttl(),
        "after renewals with wrong fences",
    )
    .await
}

/// A renewal by another token — another owner, or the holder's owner in another
/// term — answers `NotOwner`, and the grant stands.
pub async fn renew_by_another_token_is_not_owner<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "renew_by_another_token_is_not_owner");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    let next_term = token.owner.token(Term(token.term.0.wrapping_add(1)));
    for other in [ctx.token(), next_term] {
        ctx.renew_not_owner(&key, other, fence, "while another token holds")
            .await?;
    }
    ctx.held_by(
        &key,
        &me,
        fence,
        ctx.ttl(),
        "after renewals by other tokens",
    )
    .await
}

/// A renewal never re-creates a key: after a release, and on a key never used, it
/// answers `NotOwner` and the key stays free (the next grant has a greater fence).
pub async fn renew_never_recreates_a_released_key<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "renew_never_recreates_a_released_key");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    ctx.release_is(&key, token, ReleaseOutcome::Released, "by the holder")
        .await?;
    ctx.renew_not_owner(&key, token, fence, "after the release")
        .await?;
    ctx.free(&key, "after a renewal of a released key").await?;
    let never = ctx.key("never-used");
    ctx.renew_not_owner(&never, token, fence, "on a key never used")
        .await?;
    ctx.free(&never, "after a renewal of a key never used")
        .await?;
    let next = ctx.granted(&key, ctx.token(), &me, ctx.ttl()).await?;
    ensure!(
        ctx,
        next > fence,
        "the grant after a release has {next}, not above the released {fence}"
    );
    Ok(())
}

/// A renewal **replaces** the expiry with handling time + the TTL it applied: a
/// grant of 2×ttl renewed with ttl answers `Renewed { ttl: r }` (r >= ttl) and the
/// key is free for another token once r (plus the service's expiry slack) has passed
/// since the answer — not when the longer grant would have ended. A service that
/// cannot shorten reports the longer r it applied, and is held to that.
pub async fn a_renewal_replaces_the_expiry<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "a_renewal_replaces_the_expiry");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let long = ctx.ttl().saturating_mul(2);
    let fence = ctx.granted(&key, token, &me, long).await?;
    let r = ctx
        .renewed(&key, token, fence, ctx.ttl(), "asking less than granted")
        .await?;
    let answered = tokio::time::Instant::now();
    ctx.sleep_until(answered + std_of(r.saturating_add(caps.expiry_slack)))
        .await;
    let contender = ctx.token();
    match ctx.acquire(&key, contender, &me, ctx.ttl()).await? {
        AcquireOutcome::Granted { fence: next, .. } => {
            ensure!(
                ctx,
                next > fence,
                "the grant after the renewed TTL ran out has {next}, not above {fence}"
            );
            Ok(())
        }
        other => Err(ctx.violation(format!(
            "a grant of {:?} renewed with ttl {:?} answered Renewed {{ ttl: {:?} }}, yet \
             {:?} after that answer (+ slack {:?}) another token got {other:?} instead of \
             Granted",
            std_of(long),
            std_of(ctx.ttl()),
            std_of(r),
            std_of(r),
            std_of(caps.expiry_slack)
        ))),
    }
}

/// A renewal holds the key for the TTL it reports, on the service's own time base: a
/// grant renewed halfway through its TTL, answered `Renewed { ttl: r }`, turns another
/// token away right after the renewal and again when r less the
/// [tolerance](Capabilities::tolerance) has passed since the renewal was sent — after
/// the grant's own TTL ran out, so only the renewal can hold it — telling it no less
/// than the time left of r; once r (plus the service's expiry slack) has passed since
/// the renewal's answer, another token is granted the key with a greater fence. A
/// renewal that applies less than it reports fails here.
pub async fn a_renewal_holds_for_the_ttl_it_reports<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "a_renewal_holds_for_the_ttl_it_reports");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let ttl = ctx.ttl();
    let granted = tokio::time::Instant::now();
    let fence = ctx.granted(&key, token, &me, ttl).await?;
    ctx.sleep_until(granted + std_of(ttl) / 2).await;
    let sent = tokio::time::Instant::now();
    let r = ctx
        .renewed(&key, token, fence, ttl, "halfway through the TTL")
        .await?;
    let answered = tokio::time::Instant::now();
    ctx.refused_until(&key, &me, fence, r, sent, "right after the renewal")
        .await?;
    ctx.sleep_until(sent + std_of(r.saturating_sub(caps.tolerance)))
        .await;
    ctx.refused_until(
        &key,
        &me,
        fence,
        r,
        sent,
        "a tolerance before the renewed TTL ends",
    )
    .await?;
    ctx.sleep_until(answered + std_of(r.saturating_add(caps.expiry_slack)))
        .await;
    match ctx.acquire(&key, ctx.token(), &me, ttl).await? {
        AcquireOutcome::Granted { fence: next, .. } => {
            ensure!(
                ctx,
                next > fence,
                "the grant after the renewed TTL ran out has {next}, not above {fence}"
            );
            Ok(())
        }
        other => Err(ctx.violation(format!(
            "acquire by another token once the renewed TTL {:?} (+ slack {:?}) has passed \
             since the renewal's answer: expected Granted, got {other:?}",
            std_of(r),
            std_of(caps.expiry_slack)
        ))),
    }
}
