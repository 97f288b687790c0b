//! The link to the gateway, and the gateway itself.
//!
//! On a real device the link is a radio or a UART to a gateway that runs the lock
//! service; here it is a pair of embassy `Channel`s and the gateway is another task
//! with a **hard TTL**: it forgets a holder whose TTL ran out, whatever the holder
//! believes. It keeps the holder's identity with the grant and names it to contenders
//! and to the holder query. Requests carry a sequence number; an answer to a request the lease gave up
//! on (dropped after its timeout) is discarded by the next request, so a dropped
//! request leaves nothing behind (the `LocalLockService` contract).

use core::sync::atomic::{AtomicU32, Ordering};

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::channel::Channel;
use embassy_time::{Instant, Timer};
use leasehold::{
    AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};

/// One-way latency of the simulated link.
const LINK_MS: u64 = 5;
/// The longest TTL the gateway grants, whatever is asked (the lease uses the granted one).
const MAX_TTL: Duration = Duration::from_secs(3);
/// The gateway drops every frame in this window (ms since boot): a link outage longer
/// than the TTL, so the lease is lost, then re-acquired after the gateway's expiry.
const OUTAGE_MS: core::ops::Range<u64> = 7_000..11_000;

/// What the device asks.
#[derive(Clone, Copy)]
// The baseline (no `lease` feature) never asks who holds the key.
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
pub enum Op {
    Acquire(Duration, Identity),
    Renew(Fence, Duration),
    Release,
    Holder,
}

/// What the gateway answers.
#[derive(Clone, Copy)]
// The baseline (no `lease` feature) reads only the acquire answer.
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
pub enum Answer {
    Acquire(AcquireOutcome),
    Renew(RenewOutcome),
    Release(ReleaseOutcome),
    Holder(HolderOutcome),
}

struct Frame {
    seq: u32,
    token: OwnerToken,
    op: Op,
}

struct Reply {
    seq: u32,
    answer: Answer,
}

static UPLINK: Channel<CriticalSectionRawMutex, Frame, 2> = Channel::new();
static DOWNLINK: Channel<CriticalSectionRawMutex, Reply, 2> = Channel::new();

/// The device's end of the link. Used by one task (the lease task), so the sequence
/// counter needs only atomic load and store (no CAS on thumbv6m).
pub struct Link {
    next_seq: AtomicU32,
}

impl Link {
    pub const fn new() -> Link {
        Link {
            next_seq: AtomicU32::new(0),
        }
    }

    /// Sends `op` and waits for its answer, discarding answers to older requests.
    pub async fn call(&self, token: OwnerToken, op: Op) -> Answer {
        let seq = self.next_seq.load(Ordering::Relaxed);
        self.next_seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        UPLINK.send(Frame { seq, token, op }).await;
        loop {
            let reply = DOWNLINK.receive().await;
            if reply.seq == seq {
                return reply.answer;
            }
        }
    }
}

#[cfg(feature = "lease")]
mod service {
    use leasehold::{
        AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Indeterminate, Owner, OwnerToken,
        ReleaseOutcome, RenewOutcome, Term,
    };
    use leasehold_embassy::LocalLockService;

    use super::{Answer, Link, Op};

    /// The lock service, as the lease sees it. One key per gateway here, so `key` is
    /// not sent; a mismatched answer is a protocol error, never a guess.
    impl LocalLockService for Link {
        async fn acquire(
            &self,
            _key: &str,
            token: OwnerToken,
            identity: &Identity,
            ttl: Duration,
        ) -> AcquireOutcome {
            match self.call(token, Op::Acquire(ttl, *identity)).await {
                Answer::Acquire(outcome) => outcome,
                _ => AcquireOutcome::Indeterminate(Indeterminate::Protocol),
            }
        }

        async fn renew(
            &self,
            _key: &str,
            token: OwnerToken,
            fence: Fence,
            ttl: Duration,
        ) -> RenewOutcome {
            match self.call(token, Op::Renew(fence, ttl)).await {
                Answer::Renew(outcome) => outcome,
                _ => RenewOutcome::Indeterminate(Indeterminate::Protocol),
            }
        }

        async fn release(&self, _key: &str, token: OwnerToken) -> ReleaseOutcome {
            match self.call(token, Op::Release).await {
                Answer::Release(outcome) => outcome,
                _ => ReleaseOutcome::Indeterminate(Indeterminate::Protocol),
            }
        }

        async fn holder(&self, _key: &str) -> HolderOutcome {
            // The query changes nothing, so the token it carries is never compared.
            let anyone = Owner([0; 16]).token(Term(0));
            match self.call(anyone, Op::Holder).await {
                Answer::Holder(outcome) => outcome,
                _ => HolderOutcome::Indeterminate(Indeterminate::Protocol),
            }
        }
    }
}

/// The gateway: a one-key lock service with a hard TTL and a fence counter.
#[embassy_executor::task]
pub async fn gateway() {
    let mut holder: Option<(OwnerToken, Fence, Instant, Identity)> = None;
    let mut fence = 0u64;
    loop {
        let frame = UPLINK.receive().await;
        Timer::after_millis(LINK_MS).await;
        let now = Instant::now();
        if OUTAGE_MS.contains(&now.as_millis()) {
            continue;
        }
        // The hard TTL: an expired holder is gone, whatever it believes.
        if holder.is_some_and(|(_, _, expires, _)| now >= expires) {
            holder = None;
        }
        let expiry = |ttl: Duration| {
            let granted = if ttl < MAX_TTL { ttl } else { MAX_TTL };
            let ticks = embassy_time::Duration::from_millis(granted.as_millis());
            (granted, now.saturating_add(ticks))
        };
        let named = |(_, fence, expires, identity): (OwnerToken, Fence, Instant, Identity)| {
            let left = expires.saturating_duration_since(now).as_micros();
            Holder {
                identity,
                fence,
                remaining: Duration::from_micros(left),
            }
        };
        let answer = match (frame.op, holder) {
            (Op::Acquire(ttl, identity), None) => {
                fence = fence.wrapping_add(1);
                let (granted, expires) = expiry(ttl);
                holder = Some((frame.token, Fence(fence), expires, identity));
                Answer::Acquire(AcquireOutcome::Granted {
                    fence: Fence(fence),
                    ttl: granted,
                })
            }
            // An earlier attempt of the same holder succeeded but its answer was lost:
            // grant again with the existing fence.
            (Op::Acquire(ttl, identity), Some((token, held, _, _))) if token == frame.token => {
                let (granted, expires) = expiry(ttl);
                holder = Some((token, held, expires, identity));
                Answer::Acquire(AcquireOutcome::Granted {
                    fence: held,
                    ttl: granted,
                })
            }
            (Op::Acquire(..), Some(other)) => {
                Answer::Acquire(AcquireOutcome::HeldByAnother(named(other)))
            }
            (Op::Renew(fence, ttl), Some((token, held, _, identity)))
                if token == frame.token && fence == held =>
            {
                let (granted, expires) = expiry(ttl);
                holder = Some((token, held, expires, identity));
                Answer::Renew(RenewOutcome::Renewed { ttl: granted })
            }
            (Op::Renew(..), _) => Answer::Renew(RenewOutcome::NotOwner),
            (Op::Release, Some((token, ..))) if token == frame.token => {
                holder = None;
                Answer::Release(ReleaseOutcome::Released)
            }
            (Op::Release, _) => Answer::Release(ReleaseOutcome::NotOwner),
            (Op::Holder, Some(held)) => Answer::Holder(HolderOutcome::Held(named(held))),
            (Op::Holder, None) => Answer::Holder(HolderOutcome::Free),
        };
        Timer::after_millis(LINK_MS).await;
        DOWNLINK
            .send(Reply {
                seq: frame.seq,
                answer,
            })
            .await;
    }
}
