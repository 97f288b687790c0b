//! The gateway's lock table: the lock service at the far end of the example
//! firmware's link, as a pure state machine.
//!
//! No clock, no I/O, no allocation, no panics: [`Gateway::handle`] is given the
//! instant at which it handles a request and answers it. The firmware's gateway task
//! (`examples/firmware/src/link.rs`) feeds it frames and the embassy clock on the
//! device; the conformance suite (`adapters/testing/conformance/tests/firmware_gateway.rs`)
//! feeds it the same calls on tokio's clock on the host, so the table the firmware
//! runs is the table that keeps the `LocalLockService`
//! contract (the trait doc in `leasehold-driver`; why each clause matters is in
//! `leasehold::rules`, "The service contract").
//!
//! What it keeps, per key (at most `N` keys held at once):
//! * a **hard TTL**: a grant is gone at its expiry, whatever its holder believes;
//! * the holder's token, fence and identity, named to contenders and to the query;
//! * fences from one counter for the whole table, so every grant's fence is greater
//!   than every fence granted before, for any key, across expiries and releases. The
//!   counter lives in RAM: a gateway that restarts must start it above every fence it
//!   ever granted (a stored high-water mark, or a real-time clock), which this
//!   simulated gateway, never restarted, does not need.

#![no_std]
#![forbid(unsafe_code)]

use leasehold::{
    check_key, AcquireOutcome, Duration, Fence, Holder, HolderOutcome, Identity, Indeterminate,
    Instant, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, MAX_KEY_LEN,
};

/// The longest TTL the firmware's gateway grants, whatever is asked (the lease uses
/// the granted one).
pub const MAX_TTL: Duration = Duration::from_secs(3);

/// What the device asks.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Acquire(Duration, Identity),
    Renew(Fence, Duration),
    Release,
    Holder,
}

/// What the gateway answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Acquire(AcquireOutcome),
    Renew(RenewOutcome),
    Release(ReleaseOutcome),
    Holder(HolderOutcome),
}

impl Answer {
    /// The acquire outcome; an answer to another operation is a protocol error, never
    /// a guess.
    pub fn acquire(self) -> AcquireOutcome {
        match self {
            Answer::Acquire(outcome) => outcome,
            _ => AcquireOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }

    /// The renew outcome, or a protocol error.
    pub fn renew(self) -> RenewOutcome {
        match self {
            Answer::Renew(outcome) => outcome,
            _ => RenewOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }

    /// The release outcome, or a protocol error.
    pub fn release(self) -> ReleaseOutcome {
        match self {
            Answer::Release(outcome) => outcome,
            _ => ReleaseOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }

    /// The holder outcome, or a protocol error.
    pub fn holder(self) -> HolderOutcome {
        match self {
            Answer::Holder(outcome) => outcome,
            _ => HolderOutcome::Indeterminate(Indeterminate::Protocol),
        }
    }

    /// `op`'s answer when the request can never succeed as asked.
    fn refused(op: Op, why: Refusal) -> Answer {
        match op {
            Op::Acquire(..) => Answer::Acquire(AcquireOutcome::Refused(why)),
            Op::Renew(..) => Answer::Renew(RenewOutcome::Refused(why)),
            Op::Release => Answer::Release(ReleaseOutcome::Refused(why)),
            Op::Holder => Answer::Holder(HolderOutcome::Refused(why)),
        }
    }
}

/// A key as the table stores it and the link carries it: its bytes, up to the longest
/// valid key.
#[derive(Clone, Copy)]
pub struct KeyBytes {
    len: u16,
    bytes: [u8; MAX_KEY_LEN],
}

impl KeyBytes {
    /// `key`'s bytes. A key longer than any valid key does not fit: it is kept empty,
    /// which the table refuses as `InvalidKey`, the answer the whole key gets.
    pub fn new(key: &str) -> KeyBytes {
        let mut bytes = [0; MAX_KEY_LEN];
        let len = match u16::try_from(key.len()) {
            Ok(len) if key.len() <= MAX_KEY_LEN => len,
            _ => return KeyBytes { len: 0, bytes },
        };
        // A byte loop, not `copy_from_slice`: no length check left to panic.
        for (dst, src) in bytes.iter_mut().zip(key.as_bytes()) {
            *dst = *src;
        }
        KeyBytes { len, bytes }
    }

    /// The key; empty if the bytes are not UTF-8 (never, for bytes made by `new`).
    pub fn as_str(&self) -> &str {
        self.bytes
            .get(..usize::from(self.len))
            .and_then(|bytes| core::str::from_utf8(bytes).ok())
            .unwrap_or("")
    }

    fn is(&self, key: &str) -> bool {
        self.bytes.get(..usize::from(self.len)) == Some(key.as_bytes())
    }
}

/// One key's grant: the key as given, who holds it, until when.
#[derive(Clone, Copy)]
struct Grant {
    key: KeyBytes,
    token: OwnerToken,
    fence: Fence,
    expires: Instant,
    identity: Identity,
}

impl Grant {
    fn is_for(&self, key: &str) -> bool {
        self.key.is(key)
    }

    /// The holder as contenders and the query see it at `now`.
    fn named(&self, now: Instant) -> Holder {
        Holder {
            identity: self.identity,
            fence: self.fence,
            remaining: self.expires.saturating_duration_since(now),
        }
    }
}

/// The lock table: up to `N` keys held at once, each up to [`MAX_KEY_LEN`] bytes.
pub struct Gateway<const N: usize> {
    grants: [Option<Grant>; N],
    /// The fence of the latest grant, for any key.
    last_fence: u64,
    /// The latest handling time seen.
    latest: Instant,
    max_ttl: Duration,
}

impl<const N: usize> Gateway<N> {
    /// An empty table that grants at most `max_ttl`.
    pub const fn new(max_ttl: Duration) -> Self {
        Gateway {
            grants: [None; N],
            last_fence: 0,
            latest: Instant::from_micros(0),
            max_ttl,
        }
    }

    /// Handles `op` on `key` for `token` at `now` (the handling time: the expiries it
    /// sets and the remaining TTLs it reports count from it). A `now` earlier than one
    /// already seen is taken as that one, so time never goes back inside the table.
    pub fn handle(&mut self, now: Instant, key: &str, token: OwnerToken, op: Op) -> Answer {
        let now = now.max(self.latest);
        self.latest = now;
        if check_key(key).is_err() {
            return Answer::refused(op, Refusal::InvalidKey);
        }
        // The hard TTL: a grant whose expiry has come is gone, whoever asks.
        for slot in &mut self.grants {
            if slot.is_some_and(|grant| now >= grant.expires) {
                *slot = None;
            }
        }
        let max_ttl = self.max_ttl;
        let slot = self
            .grants
            .iter_mut()
            .find(|slot| slot.is_some_and(|grant| grant.is_for(key)));
        match op {
            Op::Acquire(ttl, identity) => {
                let Some(granted) = granted_ttl(ttl, max_ttl) else {
                    return Answer::refused(op, Refusal::Unsupported);
                };
                match slot.and_then(|slot| slot.as_mut()) {
                    // An earlier attempt of the same holder succeeded but its answer
                    // was lost: grant again with the same fence, extended as a renewal.
                    Some(grant) if grant.token == token => {
                        grant.expires = now.saturating_add(granted);
                        grant.identity = identity;
                        Answer::Acquire(AcquireOutcome::Granted {
                            fence: grant.fence,
                            ttl: granted,
                        })
                    }
                    Some(other) => Answer::Acquire(AcquireOutcome::HeldByAnother(other.named(now))),
                    None => Answer::Acquire(self.grant(now, key, token, granted, identity)),
                }
            }
            Op::Renew(fence, ttl) => {
                // A renewal asks for the TTL of its grant; one the gateway would never
                // have granted cannot be applied as asked (`r >= ttl`).
                if ttl.is_zero() || ttl > max_ttl {
                    return Answer::refused(op, Refusal::Unsupported);
                }
                match slot.and_then(|slot| slot.as_mut()) {
                    // The same token with another fence is another grant, older or
                    // newer: never extended (the trait doc, "renew").
                    Some(grant) if grant.token == token && grant.fence == fence => {
                        grant.expires = now.saturating_add(ttl);
                        Answer::Renew(RenewOutcome::Renewed { ttl })
                    }
                    _ => Answer::Renew(RenewOutcome::NotOwner),
                }
            }
            // Compare-and-delete, whatever the fence.
            Op::Release => match slot {
                Some(slot) if slot.is_some_and(|grant| grant.token == token) => {
                    *slot = None;
                    Answer::Release(ReleaseOutcome::Released)
                }
                _ => Answer::Release(ReleaseOutcome::NotOwner),
            },
            Op::Holder => Answer::Holder(match slot.and_then(|slot| slot.as_ref()) {
                Some(grant) => HolderOutcome::Held(grant.named(now)),
                None => HolderOutcome::Free,
            }),
        }
    }

    /// A new grant of the free `key`, with the next fence, in a free slot.
    fn grant(
        &mut self,
        now: Instant,
        key: &str,
        token: OwnerToken,
        ttl: Duration,
        identity: Identity,
    ) -> AcquireOutcome {
        let Some(slot) = self.grants.iter_mut().find(|slot| slot.is_none()) else {
            // Every slot is held: it clears when one expires or is released.
            return AcquireOutcome::Indeterminate(Indeterminate::Service);
        };
        // 2^64 grants never happen; if they did, no fence above the last is left.
        let Some(fence) = self.last_fence.checked_add(1) else {
            return AcquireOutcome::Refused(Refusal::Unsupported);
        };
        self.last_fence = fence;
        *slot = Some(Grant {
            key: KeyBytes::new(key),
            token,
            fence: Fence(fence),
            expires: now.saturating_add(ttl),
            identity,
        });
        AcquireOutcome::Granted {
            fence: Fence(fence),
            ttl,
        }
    }
}

/// The TTL granted for `ttl` asked: clamped to `max_ttl`, so the same ask always gets
/// the same grant; `None` for zero (a grant gone on arrival).
fn granted_ttl(ttl: Duration, max_ttl: Duration) -> Option<Duration> {
    if ttl.is_zero() {
        None
    } else if ttl > max_ttl {
        Some(max_ttl)
    } else {
        Some(ttl)
    }
}
