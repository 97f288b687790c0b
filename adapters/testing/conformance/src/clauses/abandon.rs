//! Requests the client gave up on: dropped futures must leave nothing behind.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;

use leasehold::{AcquireOutcome, ReleaseOutcome};
use leasehold_driver::LocalLockService;

use crate::ctx::{Ctx, Verdict};
use crate::Capabilities;

/// Polls `request` at most `polls + 1` times, yielding in between so it can get onto
/// the wire, then drops it unless it finished: what the driver does when a request
/// outlives its timeout.
async fn abandon<F: Future>(request: F, polls: usize) {
    let mut request = pin!(request);
    for _ in 0..=polls {
        let poll = std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx))).await;
        if poll.is_ready() {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Requests dropped part-way (after 0 to 7 polls) leave nothing behind: the next
/// answers belong to the next requests (a late reply to a dropped query is never
/// taken for the answer to another), and an abandoned acquire either took effect or
/// not — its token's next acquire is granted either way, and its release frees the
/// key.
pub async fn abandoned_requests_leave_nothing_behind<S: LocalLockService>(
    s: &S,
    caps: &Capabilities,
) -> Verdict {
    let ctx = Ctx::new(s, caps, "abandoned_requests_leave_nothing_behind");
    let (held, free) = (ctx.key("held"), ctx.key("free"));
    let (me, token) = (ctx.identity("holder"), ctx.token());
    let fence = ctx.granted(&held, token, &me, ctx.ttl()).await?;
    let them = ctx.identity("abandoning");
    for polls in 0..8 {
        let why = format!("after a dropped request ({polls} polls)");
        abandon(s.holder(&held), polls).await;
        ctx.free(&free, &why).await?;
        abandon(s.renew(&held, token, fence, ctx.ttl()), polls).await;
        ctx.held_by(&held, &me, fence, ctx.ttl(), &why).await?;
        let contender = ctx.token();
        abandon(s.acquire(&free, contender, &them, ctx.ttl()), polls).await;
        match ctx.acquire(&free, contender, &them, ctx.ttl()).await? {
            AcquireOutcome::Granted { .. } => {}
            other => {
                return Err(ctx.violation(format!(
                    "acquire({free:?}) by a token whose earlier acquire was dropped \
                     ({polls} polls): expected Granted (the drop either took effect or \
                     not), got {other:?}"
                )))
            }
        }
        abandon(s.release(&held, contender), polls).await;
        ctx.release_is(&free, contender, ReleaseOutcome::Released, &why)
            .await?;
        ctx.held_by(&held, &me, fence, ctx.ttl(), &why).await?;
    }
    Ok(())
}
