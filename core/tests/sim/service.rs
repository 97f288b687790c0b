//! The lock service: a hard TTL on its own clock, strictly increasing fences.

use std::collections::VecDeque;
use std::fmt;

use leasehold::*;

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Acquire,
    Renew,
    Release,
}

#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub id: RequestId,
    pub term: Term,
    pub kind: Kind,
    pub ttl: Duration,
    /// The fence the client holds when it sends this (zero if none).
    pub fence: Fence,
}

#[derive(Clone, Copy, Debug)]
pub enum Reply {
    Acquire(RequestId, AcquireOutcome),
    Renew(RequestId, RenewOutcome),
    Release(RequestId, ReleaseOutcome),
    /// Pushed by the service: the grant with this fence is gone.
    Revoked(Fence),
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} #{} term {}", self.kind, self.id.0, self.term.0)?;
        if self.kind != Kind::Release {
            write!(f, " ttl {}", self.ttl)?;
        }
        if self.kind == Kind::Renew {
            write!(f, " holding {}", self.fence)?;
        }
        Ok(())
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reply::Acquire(id, AcquireOutcome::Granted { fence, ttl }) => {
                write!(f, "Acquire #{}: Granted {fence} ttl {ttl}", id.0)
            }
            Reply::Acquire(id, o) => write!(f, "Acquire #{}: {o:?}", id.0),
            Reply::Renew(id, RenewOutcome::Renewed { ttl }) => {
                write!(f, "Renew #{}: Renewed ttl {ttl}", id.0)
            }
            Reply::Renew(id, o) => write!(f, "Renew #{}: {o:?}", id.0),
            Reply::Release(id, o) => write!(f, "Release #{}: {o:?}", id.0),
            Reply::Revoked(fence) => write!(f, "Revoked {fence}"),
        }
    }
}

/// How the service behaves for one request: the faults it may commit now.
#[derive(Clone, Copy, Debug, Default)]
pub struct Conduct {
    /// Faults are on: erratic grant TTLs.
    pub faulty: bool,
    pub refuse_ppm: u32,
    pub longer_renewal_ppm: u32,
    pub shortened_ppm: u32,
}

/// What the service did with a request.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub reply: Reply,
    /// An acquire by the holder's own token was granted again.
    pub regranted: bool,
    /// A renewal was answered with less than it asked for (a breach of contract).
    pub shortened: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Released,
    Revoked,
}

/// One grant: from an acquire to its hard expiry (or deletion).
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    pub fence: Fence,
    pub token: OwnerToken,
    pub who: Who,
    /// The TTL granted at acquire; a re-grant applies it again.
    pub ttl: Duration,
    /// Hard expiry on the service's clock; every renewal replaces it.
    pub expiry: u64,
    pub ended: Option<Ended>,
}

pub struct Service {
    pub origin: u64,
    /// Service microseconds per million real microseconds.
    pub rate: u64,
    pub next_fence: u64,
    pub fence_step: u64,
    pub ttl_policy: TtlPolicy,
    /// Scripted TTLs for the coming renewals (see `Sim::renewals_answered`).
    pub renew_script: VecDeque<Duration>,
    /// Scripted final refusals: the next requests of these kinds (see `Sim::refuse`).
    pub refuse_script: VecDeque<Kind>,
    pub renew_compare: Compare,
    /// Every grant ever made, in fence order.
    pub grants: Vec<Grant>,
    /// Index of the grant holding the key, unless its hard TTL passed since.
    pub holder: Option<usize>,
}

impl Service {
    pub fn new(scn: &Scenario) -> Service {
        Service {
            origin: scn.service_origin,
            rate: (1_000_000 + scn.service_drift_ppm) as u64,
            next_fence: scn.first_fence,
            fence_step: scn.fence_step,
            ttl_policy: scn.ttl_policy,
            renew_script: VecDeque::new(),
            refuse_script: VecDeque::new(),
            renew_compare: scn.renew_compare,
            grants: Vec::new(),
            holder: None,
        }
    }

    /// The service's own clock at real time `real`.
    pub fn clock(&self, real: Instant) -> u64 {
        self.origin + (u128::from(real.as_micros()) * u128::from(self.rate) / 1_000_000) as u64
    }

    /// The first real instant at which the service's clock reads `service` or later:
    /// exactly, so `real < real_of(e)` if and only if `clock(real) < e`.
    pub fn real_of(&self, service: u64) -> Instant {
        let since = u128::from(service.saturating_sub(self.origin));
        Instant::from_micros((since * 1_000_000).div_ceil(u128::from(self.rate)) as u64)
    }

    pub fn grant(&self, fence: Fence) -> Option<&Grant> {
        let i = self.grants.binary_search_by_key(&fence, |g| g.fence).ok()?;
        Some(&self.grants[i])
    }

    /// Until when (real time) the service's hard TTL covers some grant to `token` that
    /// was not released: the latest expiry among them.
    pub fn token_cover(&self, token: OwnerToken) -> Option<Instant> {
        (self.grants.iter())
            .filter(|g| g.token == token && g.ended != Some(Ended::Released))
            .map(|g| self.real_of(g.expiry))
            .max()
    }

    /// The grant holding the key at `now`: the hard TTL is applied here.
    pub fn live_holder(&self, now: Instant) -> Option<usize> {
        let h = self.holder?;
        (self.clock(now) < self.grants[h].expiry).then_some(h)
    }

    /// The TTL of a new grant for an acquire that asked for `asked`.
    pub fn granted_ttl(&self, asked: Duration, faulty: bool, rng: &mut Rng) -> Duration {
        let scale = |num: u64, den: u64| us(asked.as_micros() * num / den);
        match self.ttl_policy {
            TtlPolicy::Erratic if faulty => rng.pick(&[
                asked,
                asked,
                scale(3, 4),
                scale(1, 4),
                scale(1, 10),
                scale(2, 1),
                Duration::ZERO,
            ]),
            policy => policy.steady(asked),
        }
    }

    /// Applies `req` from `owner` at real time `now`, behaving as `conduct` says.
    pub fn handle(
        &mut self,
        now: Instant,
        who: Who,
        owner: Owner,
        req: Request,
        conduct: Conduct,
        rng: &mut Rng,
    ) -> Answer {
        let now_s = self.clock(now);
        self.holder = self.live_holder(now);
        let token = owner.token(req.term);
        let mut answer = Answer {
            reply: Reply::Revoked(Fence(0)),
            regranted: false,
            shortened: false,
        };
        let scripted = self.refuse_script.front() == Some(&req.kind);
        if scripted {
            self.refuse_script.pop_front();
        }
        if req.kind != Kind::Release && (scripted || rng.chance(conduct.refuse_ppm)) {
            // A final refusal (our credentials were revoked): nothing changes.
            answer.reply = match req.kind {
                Kind::Acquire => {
                    Reply::Acquire(req.id, AcquireOutcome::Refused(Refusal::Unauthorized))
                }
                _ => Reply::Renew(req.id, RenewOutcome::Refused(Refusal::Unauthorized)),
            };
            return answer;
        }
        answer.reply = match req.kind {
            Kind::Acquire => match self.holder {
                None => {
                    let ttl = self.granted_ttl(req.ttl, conduct.faulty, rng);
                    let fence = Fence(self.next_fence);
                    if let Some(last) = self.grants.last() {
                        assert!(fence > last.fence, "service fences must strictly increase");
                    }
                    self.next_fence += rng.between(1, self.fence_step);
                    self.grants.push(Grant {
                        fence,
                        token,
                        who,
                        ttl,
                        expiry: now_s + ttl.as_micros(),
                        ended: None,
                    });
                    self.holder = Some(self.grants.len() - 1);
                    Reply::Acquire(req.id, AcquireOutcome::Granted { fence, ttl })
                }
                // The holder's own retried acquire (an earlier answer was lost): granted
                // again with the same fence, the expiry set as a renewal would, for the
                // TTL of the grant (a service keeps a grant's TTL, as etcd keeps a lease's).
                Some(h) if self.grants[h].token == token => {
                    let g = &mut self.grants[h];
                    g.expiry = now_s + g.ttl.as_micros();
                    answer.regranted = true;
                    let (fence, ttl) = (g.fence, g.ttl);
                    Reply::Acquire(req.id, AcquireOutcome::Granted { fence, ttl })
                }
                Some(h) => Reply::Acquire(
                    req.id,
                    AcquireOutcome::HeldByAnother(self.holder_of(h, now_s)),
                ),
            },
            Kind::Renew => match self.holder {
                Some(h)
                    if self.grants[h].token == token
                        && (self.renew_compare == Compare::Owner
                            || self.grants[h].fence == req.fence) =>
                {
                    let asked = req.ttl.as_micros();
                    let g = &mut self.grants[h];
                    // The expiry is *replaced* (PEXPIRE): `r ≥ asked` by the contract.
                    let mut r = asked;
                    if rng.chance(conduct.longer_renewal_ppm) {
                        r = asked * rng.pick(&[3, 4]) / 2;
                    }
                    // The breach: `r < asked`, never below the expiry already kept.
                    let floor = g.expiry.saturating_sub(now_s).max(1);
                    if floor < asked && rng.chance(conduct.shortened_ppm) {
                        r = rng.between(floor, asked - 1);
                        answer.shortened = true;
                    }
                    if let Some(scripted) = self.renew_script.pop_front() {
                        r = scripted.as_micros();
                        answer.shortened = r < asked;
                    }
                    g.expiry = now_s + r;
                    Reply::Renew(req.id, RenewOutcome::Renewed { ttl: us(r) })
                }
                _ => Reply::Renew(req.id, RenewOutcome::NotOwner),
            },
            Kind::Release => match self.holder {
                Some(h) if self.grants[h].token == token => {
                    self.grants[h].ended = Some(Ended::Released);
                    self.holder = None;
                    Reply::Release(req.id, ReleaseOutcome::Released)
                }
                _ => Reply::Release(req.id, ReleaseOutcome::NotOwner),
            },
        };
        answer
    }

    /// What the service tells a contender about grant `h`, at service time `now_s`.
    pub fn holder_of(&self, h: usize, now_s: u64) -> Holder {
        let g = &self.grants[h];
        Holder {
            identity: identity_of(g.who),
            fence: g.fence,
            remaining: us(g.expiry.saturating_sub(now_s)),
        }
    }

    /// Deletes the key behind its holder's back; who held it, with which fence.
    pub fn revoke(&mut self, now: Instant) -> Option<(Who, Fence)> {
        let h = self.live_holder(now)?;
        self.holder = None;
        self.grants[h].ended = Some(Ended::Revoked);
        Some((self.grants[h].who, self.grants[h].fence))
    }
}
