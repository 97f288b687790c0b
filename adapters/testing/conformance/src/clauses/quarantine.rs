//! A service that lost its state grants nothing until every grant it may have
//! forgotten has expired.

use std::future::Future;

use leasehold::{AcquireOutcome, Duration, Fence, Holder, RenewOutcome};
use leasehold_driver::LocalLockService;

use crate::caps::std_of;
use crate::ctx::{ensure, Ctx, Verdict, Violation};
use crate::Capabilities;

/// After a loss of state, no free key is granted for `quarantine` — the longest TTL
/// the service may have granted before — neither the key whose grant was lost nor a
/// key never used; then keys are granted again, with fences above the lost grant's.
///
/// `lose` makes the service lose its state while a grant is held: it wipes the data
/// (Redis `FLUSHALL`, a restart without persistence, every etcd key deleted) or rolls
/// it back to a backup from before the grant. Only services that can lose state run
/// this clause (the in-memory service and the firmware gateway lose it only with
/// their clients). It checks, in order:
///
/// * the lost grant's renewal answers `NotOwner` (its holder stops at once);
///   unknown outcomes right after the loss (a connection the restart broke) are asked
///   again, a few times;
/// * an acquire of that key by another token, and one of a key never used, answer
///   `HeldByAnother` with [`Holder::quarantine`]: fence 0, more than nothing left and
///   at most `quarantine` (rounded up to the service's granularity);
/// * halfway through, and a tenth of the quarantine before its end, still so;
/// * once `quarantine` (rounded up), plus the service's expiry slack, has passed
///   since the first refused acquire was answered, the key is granted, with a fence
///   above the lost grant's.
pub async fn a_lost_state_grants_nothing_until_the_quarantine_ends<S, F, Fut>(
    s: &S,
    caps: &Capabilities,
    quarantine: Duration,
    lose: F,
) -> Verdict
where
    S: LocalLockService,
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let ctx = Ctx::new(
        s,
        caps,
        "a_lost_state_grants_nothing_until_the_quarantine_ends",
    );
    let (key, unused) = (ctx.key("held"), ctx.key("unused"));
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let them = ctx.identity("contender");
    let lost = ctx.granted(&key, token, &me, ctx.ttl()).await?;
    lose().await;
    let longest = round_up(quarantine, caps.granularity);

    // The first calls after a restart may meet the broken connection: retried.
    let renewed = settle(|| ctx.renew(&key, token, lost, ctx.ttl())).await?;
    ensure!(
        ctx,
        renewed == RenewOutcome::NotOwner,
        "renew({key:?}, {lost}) after the service lost its state: expected NotOwner, got \
         {renewed:?}"
    );
    let sent = tokio::time::Instant::now();
    let first = quarantined(&ctx, &key, longest, "right after the loss").await?;
    let answered = tokio::time::Instant::now();
    quarantined(&ctx, &unused, first.remaining, "for a key never used").await?;

    ctx.sleep_until(sent + std_of(quarantine) / 2).await;
    quarantined(&ctx, &key, longest, "halfway through the quarantine").await?;
    ctx.sleep_until(sent + std_of(quarantine) * 9 / 10).await;
    quarantined(&ctx, &key, longest, "a tenth before its end").await?;

    ctx.sleep_until(answered + std_of(longest.saturating_add(caps.expiry_slack)))
        .await;
    match ctx.acquire(&key, ctx.token(), &them, ctx.ttl()).await? {
        AcquireOutcome::Granted { fence, .. } => ensure!(
            ctx,
            fence > lost,
            "the first grant after the quarantine has {fence}, not above the lost {lost}"
        ),
        other => {
            return Err(ctx.violation(format!(
                "acquire({key:?}) once the quarantine ({:?}) has passed: expected Granted, \
                 got {other:?}",
                std_of(longest)
            )))
        }
    }
    Ok(())
}

/// An acquire of `key` by a new token must be refused as a quarantine with more than
/// nothing and at most `longest` left; the answer.
async fn quarantined<S: LocalLockService>(
    ctx: &Ctx<'_, S>,
    key: &str,
    longest: Duration,
    why: &str,
) -> Result<Holder, Violation> {
    let them = ctx.identity("contender");
    let token = ctx.token();
    match settle(|| ctx.acquire(key, token, &them, ctx.ttl())).await? {
        AcquireOutcome::HeldByAnother(holder) => {
            ensure!(
                ctx,
                holder.is_quarantine()
                    && holder.fence == Fence(0)
                    && !holder.remaining.is_zero()
                    && holder.remaining <= longest,
                "acquire({key:?}) {why}: expected a quarantine (fence 0) with at most {:?} \
                 left; got {holder:?}",
                std_of(longest)
            );
            Ok(holder)
        }
        other => Err(ctx.violation(format!(
            "acquire({key:?}) {why}: expected HeldByAnother(quarantine), got {other:?}"
        ))),
    }
}

/// The answer of `call`, asked again (up to five times, 50 ms apart) while it is
/// `Indeterminate`: a restart breaks the client's connection, and the first calls
/// after it may fail on it.
async fn settle<T: Indeterminate, Fut>(mut call: impl FnMut() -> Fut) -> Result<T, Violation>
where
    Fut: Future<Output = Result<T, Violation>>,
{
    let mut answer = call().await?;
    for _ in 0..4 {
        if !answer.is_indeterminate() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        answer = call().await?;
    }
    Ok(answer)
}

/// Answers that may leave the outcome unknown.
trait Indeterminate {
    fn is_indeterminate(&self) -> bool;
}

impl Indeterminate for AcquireOutcome {
    fn is_indeterminate(&self) -> bool {
        matches!(self, AcquireOutcome::Indeterminate(_))
    }
}

impl Indeterminate for RenewOutcome {
    fn is_indeterminate(&self) -> bool {
        matches!(self, RenewOutcome::Indeterminate(_))
    }
}

/// `d` rounded up to a multiple of `granularity`.
fn round_up(d: Duration, granularity: Duration) -> Duration {
    let g = granularity.as_micros().max(1);
    Duration::from_micros(d.as_micros().div_ceil(g).saturating_mul(g))
}
