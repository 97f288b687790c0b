//! Grants: the TTL applied, the fence, idempotent re-acquire, contenders, and fences
//! that only grow.

use leasehold::{AcquireOutcome, Duration, Refusal, ReleaseOutcome};
use leasehold_driver::LocalLockService;

use crate::caps::std_of;
use crate::ctx::{ensure, Ctx, Verdict};
use crate::Capabilities;

/// An acquire on a free key answers `Granted` with the TTL it applied (the one asked
/// for, as the capabilities say it can apply it) and a fence, and `holder` then
/// reports the grant: the holder's identity, that fence, at most that TTL left.
pub async fn grant_on_a_free_key_reports_ttl_and_fence<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "grant_on_a_free_key_reports_ttl_and_fence");
    let key = ctx.key("k");
    let me = ctx.identity("holder");
    ctx.free(&key, "before any grant").await?;
    let fence = ctx.granted(&key, ctx.token(), &me, ctx.ttl()).await?;
    ctx.held_by(&key, &me, fence, ctx.ttl(), "after the grant")
        .await
}

/// An acquire by the token that already holds the key (its first answer was lost) is
/// granted again with the *same* fence and the same TTL (the same TTL asked always
/// gets the same grant), and the key stays its own.
pub async fn same_token_reacquire_keeps_the_fence<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "same_token_reacquire_keeps_the_fence");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    match ctx.acquire(&key, token, &me, ctx.ttl()).await? {
        AcquireOutcome::Granted { fence: again, ttl } => {
            ensure!(
                ctx,
                again == fence && ttl == ctx.ttl(),
                "re-acquire by the holder's own token: expected Granted with the first \
                 {fence} and the first grant's ttl {:?}, got {again} and ttl {:?}",
                std_of(ctx.ttl()),
                std_of(ttl)
            );
        }
        other => {
            return Err(ctx.violation(format!(
                "re-acquire by the holder's own token: expected Granted with {fence}, got \
                 {other:?}"
            )))
        }
    }
    ctx.held_by(&key, &me, fence, ctx.ttl(), "after the re-acquire")
        .await
}

/// An acquire by another token answers `HeldByAnother` with the holder's identity,
/// fence and remaining TTL (no more than granted), and changes nothing: the holder
/// still holds the key and can renew it.
pub async fn another_token_is_told_who_holds_the_key<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "another_token_is_told_who_holds_the_key");
    let key = ctx.key("k");
    let (me, token) = (ctx.identity("first holder"), ctx.token());
    let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    let contender = ctx.token();
    ctx.held_by_another(&key, contender, &me, fence, ctx.ttl(), "while held")
        .await?;
    ctx.held_by_another(&key, contender, &me, fence, ctx.ttl(), "asked again")
        .await?;
    ctx.held_by(
        &key,
        &me,
        fence,
        ctx.ttl(),
        "after a contender was turned away",
    )
    .await?;
    ctx.renewed(
        &key,
        token,
        fence,
        ctx.ttl(),
        "by the holder after a contender",
    )
    .await?;
    Ok(())
}

/// The fence of every grant is strictly greater than every fence granted before for
/// the key, across releases — also when the same token acquires again after its
/// release (a late duplicate acquire re-creates the key with a new fence).
pub async fn fences_increase_across_releases<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "fences_increase_across_releases");
    let key = ctx.key("k");
    let (first, second) = (ctx.token(), ctx.token());
    let me = ctx.identity("holder");
    let mut fences = Vec::new();
    for (term, token) in [first, second, first].into_iter().enumerate() {
        let fence = ctx.granted(&key, token, &me, ctx.ttl()).await?;
        if let Some(&before) = fences.last() {
            ensure!(
                ctx,
                fence > before,
                "grant {} after a release has {fence}, not above the previous {before} \
                 (fences so far: {fences:?})",
                term + 1
            );
        }
        fences.push(fence);
        ctx.release_is(&key, token, ReleaseOutcome::Released, "by the holder")
            .await?;
    }
    Ok(())
}

/// The TTL granted is a function of the TTL asked (a clamp to the service's bounds,
/// never a mood), also for TTLs the service cannot apply as asked (1 µs, one
/// microsecond past a multiple of its granularity): two keys asked with the same TTL
/// get the same answer — `Granted` with the same TTL, or both `Refused(Unsupported)`
/// — and the holder's re-acquire of a long enough grant gets the same TTL and fence.
pub async fn grants_are_a_function_of_the_ttl_asked<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "grants_are_a_function_of_the_ttl_asked");
    let me = ctx.identity("holder");
    let odd = Duration::from_micros(1);
    let asks = [
        odd,
        ctx.ttl().saturating_add(odd),
        ctx.ttl(),
        ctx.ttl().saturating_mul(3),
    ];
    // The asks whose re-acquire was checked: at least the TTL the capabilities say
    // the service grants as asked, so the check below never passes by skipping.
    let mut reacquired = 0;
    for (i, ask) in asks.into_iter().enumerate() {
        let (a, b) = (ctx.key(&format!("{i}a")), ctx.key(&format!("{i}b")));
        let token = ctx.token();
        let first = ctx.acquire(&a, token, &me, ask).await?;
        let second = ctx.acquire(&b, ctx.token(), &me, ask).await?;
        let g = match (first, second) {
            (AcquireOutcome::Granted { ttl: g, .. }, AcquireOutcome::Granted { ttl: h, .. })
                if g == h =>
            {
                g
            }
            (AcquireOutcome::Refused(Refusal::Unsupported), same) if same == first => continue,
            _ => {
                return Err(ctx.violation(format!(
                    "two free keys asked for ttl {:?}: expected the same answer (Granted \
                     with the same ttl, or Refused(Unsupported)), got {first:?} and \
                     {second:?}",
                    std_of(ask)
                )))
            }
        };
        if ask < ctx.ttl() || g < ctx.ttl() {
            // Too short to re-acquire before it expires.
            continue;
        }
        let AcquireOutcome::Granted { fence, .. } = first else {
            continue;
        };
        let again = ctx.acquire(&a, token, &me, ask).await?;
        ensure!(
            ctx,
            again == AcquireOutcome::Granted { fence, ttl: g },
            "the holder's re-acquire asking {:?} again: expected Granted with {fence} and \
             ttl {:?} as the first time, got {again:?}",
            std_of(ask),
            std_of(g)
        );
        reacquired += 1;
    }
    ensure!(
        ctx,
        reacquired >= 1,
        "no ask was granted long enough to check the holder's re-acquire, not even the \
         ttl {:?} the capabilities say the service grants as asked",
        std_of(ctx.ttl())
    );
    Ok(())
}
