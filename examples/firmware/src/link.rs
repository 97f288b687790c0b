//! The link to the gateway, and the gateway task.
//!
//! On a real device the link is a radio or a UART to a gateway that runs the lock
//! service; here it is a pair of embassy `Channel`s and the gateway is another task
//! around the lock table of [`leasehold_gateway`] (hard TTL, identities, fences, any
//! number of keys up to its size). Frames carry the key. Requests carry a sequence
//! number; an answer to a request the lease gave up on (dropped after its timeout) is
//! discarded by the next request, so a dropped request leaves nothing behind (the
//! `LocalLockService` contract).

use core::sync::atomic::{AtomicU32, Ordering};

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::channel::Channel;
use embassy_time::{Instant, Timer};
use leasehold::OwnerToken;

use leasehold_gateway::{Answer, Gateway, KeyBytes, Op, MAX_TTL};

/// One-way latency of the simulated link.
const LINK_MS: u64 = 5;
/// The gateway drops every frame in this window (ms since boot): a link outage longer
/// than the TTL, so the lease is lost, then re-acquired after the gateway's expiry.
const OUTAGE_MS: core::ops::Range<u64> = 7_000..11_000;
/// Keys the gateway holds at once: the pump's one. Every key costs a slot of
/// `MAX_KEY_LEN` bytes and more; a key beyond them is answered `Indeterminate` until a
/// slot frees.
const GATEWAY_KEYS: usize = 1;

struct Frame {
    seq: u32,
    key: KeyBytes,
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

    /// Sends `op` on `key` and waits for its answer, discarding answers to older
    /// requests.
    pub async fn call(&self, key: &str, token: OwnerToken, op: Op) -> Answer {
        let seq = self.next_seq.load(Ordering::Relaxed);
        self.next_seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        let key = KeyBytes::new(key);
        UPLINK
            .send(Frame {
                seq,
                key,
                token,
                op,
            })
            .await;
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
        AcquireOutcome, Duration, Fence, HolderOutcome, Identity, Owner, OwnerToken,
        ReleaseOutcome, RenewOutcome, Term,
    };
    use leasehold_embassy::LocalLockService;

    use super::{Link, Op};

    /// The lock service, as the lease sees it. A mismatched answer is a protocol
    /// error, never a guess.
    impl LocalLockService for Link {
        async fn acquire(
            &self,
            key: &str,
            token: OwnerToken,
            identity: &Identity,
            ttl: Duration,
        ) -> AcquireOutcome {
            self.call(key, token, Op::Acquire(ttl, *identity))
                .await
                .acquire()
        }

        async fn renew(
            &self,
            key: &str,
            token: OwnerToken,
            fence: Fence,
            ttl: Duration,
        ) -> RenewOutcome {
            self.call(key, token, Op::Renew(fence, ttl)).await.renew()
        }

        async fn release(&self, key: &str, token: OwnerToken) -> ReleaseOutcome {
            self.call(key, token, Op::Release).await.release()
        }

        async fn holder(&self, key: &str) -> HolderOutcome {
            // The query changes nothing, so the token it carries is never compared.
            let anyone = Owner([0; 16]).token(Term(0));
            self.call(key, anyone, Op::Holder).await.holder()
        }
    }
}

/// The gateway: the lock table behind the link, which goes silent in the outage.
#[embassy_executor::task]
pub async fn gateway() {
    let mut table = Gateway::<GATEWAY_KEYS>::new(MAX_TTL);
    loop {
        let frame = UPLINK.receive().await;
        Timer::after_millis(LINK_MS).await;
        let now = Instant::now();
        if OUTAGE_MS.contains(&now.as_millis()) {
            continue;
        }
        let now = leasehold::Instant::from_micros(now.as_micros());
        let answer = table.handle(now, frame.key.as_str(), frame.token, frame.op);
        Timer::after_millis(LINK_MS).await;
        DOWNLINK
            .send(Reply {
                seq: frame.seq,
                answer,
            })
            .await;
    }
}
