//! Release (compare-and-delete) and the holder query.

use std::cell::Cell;
use std::future::Future;

use leasehold::{
    AcquireOutcome, Config, Duration, Event, Fence, HolderOutcome, Identity, Indeterminate,
    Instant, Lease, OwnerToken, ReleaseOutcome, RenewOutcome, WriteGate,
};
use leasehold_driver::{run_term, Clock, LocalLockService, Report, Target, TermEnd};

use crate::caps::std_of;
use crate::ctx::{ensure, Ctx, Verdict};
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

/// A late or repeated release never frees the next holder's grant: the holder
/// releases, a next holder is granted the key under the same identity (two terms of
/// one process, `hostname:pid`), and the first holder's release arrives again — a
/// duplicate, or a retry whose first try had landed. It answers `NotOwner`, and the
/// next holder keeps the key, its fence and its renewals.
pub async fn a_late_release_never_frees_the_next_holders_grant<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "a_late_release_never_frees_the_next_holders_grant");
    let key = ctx.key("k");
    let me = ctx.identity("one process");
    let (first, next) = (ctx.token(), ctx.token());
    ctx.granted(&key, first, &me, ctx.ttl()).await?;
    ctx.release_is(&key, first, ReleaseOutcome::Released, "by the first holder")
        .await?;
    let fence = ctx.granted(&key, next, &me, ctx.ttl()).await?;
    for why in ["a late duplicate", "a retry"] {
        ctx.release_is(&key, first, ReleaseOutcome::NotOwner, why)
            .await?;
    }
    ctx.held_by(
        &key,
        &me,
        fence,
        ctx.ttl(),
        "after the first holder's late release",
    )
    .await?;
    ctx.renewed(
        &key,
        next,
        fence,
        ctx.ttl(),
        "after the first holder's late release",
    )
    .await?;
    Ok(())
}

/// A release whose first tries are lost on the way (a timeout, a broken connection)
/// still frees the key: a term driven by `leasehold_driver::run_term` is released
/// while its first three releases never reach the service, and the key is free for
/// another token well before the grant's TTL would have freed it.
///
/// Run through the lease and its driver, with the default timings for the TTL asked:
/// the client's retries and the service's answers to them together keep the clause.
pub async fn a_release_whose_first_tries_are_lost_frees_the_key<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(
        s,
        caps,
        "a_release_whose_first_tries_are_lost_frees_the_key",
    );
    let key = ctx.key("k");
    let lossy = LosesReleases {
        inner: s,
        lost: Cell::new(0),
    };
    let ttl = ctx.ttl();
    let config = Config::builder(ttl)
        .build()
        .map_err(|e| ctx.violation(format!("no lease config for the TTL {ttl:?}: {e}")))?;
    let owner = ctx.token().owner;
    let mut lease = Lease::new(config, owner);
    let gate = WriteGate::new();
    let clock = TokioClock(tokio::time::Instant::now());
    let started = tokio::time::Instant::now();
    let identity = ctx.identity("holder");
    let target = Target {
        service: &lossy,
        key: &key,
        owner,
        identity: &identity,
    };
    // Release once the key is held: a tenth of the TTL after the start.
    let release = tokio::time::sleep(std_of(ttl) / 10);
    let mut acquired = false;
    let term = run_term(
        &mut lease,
        &gate,
        target,
        &clock,
        Instant::MAX,
        release,
        |r| {
            acquired |= matches!(r, Report::Event(Event::Acquired { .. }));
        },
    );
    // Bounded: the TTL, then the retries' own bound (twice the TTL) and a margin.
    let end = tokio::time::timeout(std_of(ttl) * 4, term)
        .await
        .map_err(|_| ctx.violation("the term did not end within 4 TTLs".into()))?;
    ensure!(ctx, acquired, "the term was never granted the key: {end:?}");
    ensure!(
        ctx,
        matches!(end, Ok(TermEnd::Released)),
        "the term ended {end:?}, not released"
    );
    let lost = lossy.lost.get();
    ensure!(ctx, lost == 3, "{lost} releases lost, not 3: never retried");
    // Free before the grant (sent at `started` or later) could have expired.
    let by = started + std_of(ttl) - std_of(caps.tolerance);
    ctx.free(&key, "after the term's release was retried")
        .await?;
    ctx.granted(&key, ctx.token(), &ctx.identity("next"), ttl)
        .await?;
    let now = tokio::time::Instant::now();
    ensure!(
        ctx,
        now < by,
        "the key was free only {:?} after the grant, not within its TTL less the \
         tolerance ({:?})",
        now - started,
        by - started
    );
    Ok(())
}

/// A service whose first three releases are lost on the way: they never reach it,
/// and the caller learns only that the outcome is unknown.
struct LosesReleases<'a, S> {
    inner: &'a S,
    lost: Cell<u32>,
}

impl<S: LocalLockService> LocalLockService for LosesReleases<'_, S> {
    fn acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> impl Future<Output = AcquireOutcome> {
        self.inner.acquire(key, token, identity, ttl)
    }

    fn renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> impl Future<Output = RenewOutcome> {
        self.inner.renew(key, token, fence, ttl)
    }

    async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
        if self.lost.get() < 3 {
            self.lost.set(self.lost.get() + 1);
            return ReleaseOutcome::Indeterminate(Indeterminate::Transport);
        }
        self.inner.release(key, token).await
    }

    fn holder(&self, key: &str) -> impl Future<Output = HolderOutcome> {
        self.inner.holder(key)
    }

    fn revoked(&self, key: &str, token: OwnerToken, fence: Fence) -> impl Future<Output = ()> {
        self.inner.revoked(key, token, fence)
    }
}

/// tokio's clock as the lease's: microseconds since `.0`.
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        let since = self.0.elapsed();
        Instant::from_micros(u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> {
        tokio::time::sleep_until(self.0 + std::time::Duration::from_micros(deadline.as_micros()))
    }
}
