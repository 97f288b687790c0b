//! The lock service: one key, a hard TTL on its own clock (the model's tick), and the
//! contract of `leasehold_driver::LocalLockService`.

use crate::wire::{Ans, Kind, Wire};

/// The grant the service holds for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The holder's client.
    pub client: u8,
    /// The holder's term (client and term are the owner token).
    pub term: u32,
    /// The grant's fence.
    pub fence: u64,
    /// The tick at which the key is gone.
    pub expiry: u8,
}

/// How the service answers one request: the plain contract, or a variant the checker
/// chooses (each but `Plain` spends a fault).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// As the contract says, renewals applying exactly the TTL asked.
    Plain,
    /// A renewal applies one tick more than asked and says so (allowed: `r >= ttl`).
    Longer,
    /// A renewal applies what was asked but *answers* one tick less: the contract's
    /// breach (a PTTL read-back), which the client must answer by ending the term.
    Short,
    /// A renewal is answered NOT_OWNER but the key is kept: what a client sees when a
    /// failover lost the key, without the model losing it (which would break property
    /// (a) by construction). The client must end the term on receipt, also when the
    /// answer is to an older renewal that arrives after a newer one succeeded.
    Disown,
    /// A final refusal (credentials revoked).
    Refuse,
    /// A service error: the outcome is unknown (the request was still carried out).
    Unknown,
}

/// The service's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    /// The live grant, if any (dropped as soon as a tick reaches its expiry).
    pub key: Option<Grant>,
    /// The fence of the next new grant: fences only grow.
    pub next_fence: u64,
    /// The largest TTL it grants, in ticks.
    pub grant_max: u8,
}

impl Service {
    /// An empty service granting at most `grant_max` ticks.
    pub fn new(grant_max: u8) -> Service {
        Service {
            key: None,
            next_fence: 1,
            grant_max,
        }
    }

    /// The live grant at tick `now` (the hard TTL: gone at its expiry).
    pub fn live(&self, now: u8) -> Option<Grant> {
        self.key.filter(|g| now < g.expiry)
    }

    /// Forgets an expired grant, so equal services are equal states.
    pub fn expire(&mut self, now: u8) {
        self.key = self.live(now);
    }

    /// The TTL granted for `asked`: a clamp, the same for the same ask.
    pub fn grant_for(&self, asked: u64) -> u64 {
        asked.clamp(1, u64::from(self.grant_max))
    }

    /// Handles a request from `client` at tick `now`; returns the answer, or `None`
    /// for something that is not a request.
    pub fn handle(
        &mut self,
        now: u8,
        client: u8,
        req: Wire,
        variant: Variant,
    ) -> Option<(u64, Ans)> {
        self.expire(now);
        let at = |ttl: u64| now.saturating_add(u8::try_from(ttl).unwrap_or(u8::MAX));
        let (id, kind) = match req {
            Wire::Acquire { id, .. } => (id, Kind::Acquire),
            Wire::Renew { id, .. } => (id, Kind::Renew),
            Wire::Release { id, .. } => (id, Kind::Release),
            Wire::Answer { .. } => return None,
        };
        if variant == Variant::Refuse {
            return Some((id, Ans::Refused(kind)));
        }
        let ans = match req {
            Wire::Acquire { term, ttl, .. } => {
                let g = self.grant_for(ttl);
                match self.key {
                    None => {
                        let fence = self.next_fence;
                        self.next_fence += 1;
                        self.key = Some(Grant {
                            client,
                            term,
                            fence,
                            expiry: at(g),
                        });
                        Ans::Granted { fence, ttl: g }
                    }
                    // Same token: its earlier attempt won; same fence, expiry reset
                    // as a renewal would.
                    Some(ref mut held) if held.client == client && held.term == term => {
                        held.expiry = at(g);
                        Ans::Granted {
                            fence: held.fence,
                            ttl: g,
                        }
                    }
                    Some(held) => Ans::HeldBy {
                        client: held.client,
                        fence: held.fence,
                        remaining: u64::from(held.expiry - now),
                    },
                }
            }
            Wire::Renew {
                term, fence, ttl, ..
            } => match self.key {
                Some(_) if variant == Variant::Disown => Ans::NotOwner(Kind::Renew),
                Some(ref mut held)
                    if held.client == client && held.term == term && held.fence == fence =>
                {
                    let (applied, told) = match variant {
                        Variant::Longer => (ttl + 1, ttl + 1),
                        Variant::Short => (ttl, ttl.saturating_sub(1)),
                        _ => (ttl, ttl),
                    };
                    // Replaces the expiry, even with an earlier one.
                    held.expiry = at(applied);
                    Ans::Renewed {
                        ttl: told,
                        asked: ttl,
                    }
                }
                _ => Ans::NotOwner(Kind::Renew),
            },
            Wire::Release { term, .. } => match self.key {
                Some(held) if held.client == client && held.term == term => {
                    self.key = None;
                    Ans::Released
                }
                _ => Ans::NotOwner(Kind::Release),
            },
            Wire::Answer { .. } => return None,
        };
        Some((
            id,
            if variant == Variant::Unknown {
                Ans::Indeterminate(kind)
            } else {
                ans
            },
        ))
    }
}
