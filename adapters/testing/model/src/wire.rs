//! Messages in the network: requests to the service, answers to the clients.
//!
//! The core's outcome types are not `Hash`, so the wire carries this plain mirror and
//! turns it into a real [`Response`] when a client receives it.

use leasehold::{
    AcquireOutcome, Fence, Holder, Identity, Indeterminate, Refusal, ReleaseOutcome, RenewOutcome,
    Response,
};

use crate::params::ticks;

/// One message in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Msg {
    /// The client that sent the request, or receives the answer.
    pub client: u8,
    /// The tick it was sent.
    pub sent: u8,
    /// Marked late (a fault): it may stay `late_ticks` instead of being delivered in
    /// the tick it was sent.
    pub late: bool,
    /// What it says.
    pub body: Wire,
}

/// A request (to the service) or an answer (to a client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Wire {
    /// `Action::Acquire`.
    Acquire {
        /// Request id.
        id: u64,
        /// Owner token's term.
        term: u32,
        /// TTL asked, in ticks.
        ttl: u64,
    },
    /// `Action::Renew`.
    Renew {
        /// Request id.
        id: u64,
        /// Owner token's term.
        term: u32,
        /// Fence of the grant to extend.
        fence: u64,
        /// TTL asked, in ticks.
        ttl: u64,
    },
    /// `Action::Release`.
    Release {
        /// Request id.
        id: u64,
        /// Owner token's term.
        term: u32,
    },
    /// The service's answer to request `id`.
    Answer {
        /// The request answered.
        id: u64,
        /// What the service said.
        ans: Ans,
    },
}

impl Wire {
    /// Whether this goes to the service.
    pub fn is_request(&self) -> bool {
        !matches!(self, Wire::Answer { .. })
    }
}

/// Which request an answer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// An acquire.
    Acquire,
    /// A renewal.
    Renew,
    /// A release.
    Release,
}

/// An answer, in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ans {
    /// `AcquireOutcome::Granted`.
    Granted {
        /// The fence.
        fence: u64,
        /// The TTL applied.
        ttl: u64,
    },
    /// `AcquireOutcome::HeldByAnother`.
    HeldBy {
        /// The holding client.
        client: u8,
        /// Its fence.
        fence: u64,
        /// Ticks left.
        remaining: u64,
    },
    /// `RenewOutcome::Renewed`.
    Renewed {
        /// The TTL the answer reports.
        ttl: u64,
        /// The TTL the renewal asked for.
        asked: u64,
    },
    /// `RenewOutcome::NotOwner` / `ReleaseOutcome::NotOwner`.
    NotOwner(Kind),
    /// A final refusal.
    Refused(Kind),
    /// An unknown outcome (a service error).
    Indeterminate(Kind),
    /// `ReleaseOutcome::Released`.
    Released,
}

impl Ans {
    /// The real response a client receives.
    pub fn response(self) -> Response {
        let refusal = Refusal::Unauthorized;
        let unknown = Indeterminate::Service;
        match self {
            Ans::Granted { fence, ttl } => AcquireOutcome::Granted {
                fence: Fence(fence),
                ttl: ticks(ttl),
            }
            .into(),
            Ans::HeldBy {
                client,
                fence,
                remaining,
            } => AcquireOutcome::HeldByAnother(Holder {
                identity: Identity::lossy(&format!("client-{client}")),
                fence: Fence(fence),
                remaining: ticks(remaining),
            })
            .into(),
            Ans::Renewed { ttl, .. } => RenewOutcome::Renewed { ttl: ticks(ttl) }.into(),
            Ans::NotOwner(Kind::Release) => ReleaseOutcome::NotOwner.into(),
            Ans::NotOwner(_) => RenewOutcome::NotOwner.into(),
            Ans::Refused(Kind::Acquire) => AcquireOutcome::Refused(refusal).into(),
            Ans::Refused(Kind::Renew) => RenewOutcome::Refused(refusal).into(),
            Ans::Refused(Kind::Release) => ReleaseOutcome::Refused(refusal).into(),
            Ans::Indeterminate(Kind::Acquire) => AcquireOutcome::Indeterminate(unknown).into(),
            Ans::Indeterminate(Kind::Renew) => RenewOutcome::Indeterminate(unknown).into(),
            Ans::Indeterminate(Kind::Release) => ReleaseOutcome::Indeterminate(unknown).into(),
            Ans::Released => ReleaseOutcome::Released.into(),
        }
    }
}

/// `#term.seq` of a request id.
struct Id(u64);

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}.{}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl std::fmt::Display for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Wire::Acquire { id, ttl, .. } => write!(f, "acquire{} ttl {ttl}", Id(id)),
            Wire::Renew { id, fence, ttl, .. } => {
                write!(f, "renew{} fence {fence} ttl {ttl}", Id(id))
            }
            Wire::Release { id, .. } => write!(f, "release{}", Id(id)),
            Wire::Answer { id, ans } => write!(f, "answer{} {ans:?}", Id(id)),
        }
    }
}

impl std::fmt::Display for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = if self.body.is_request() {
            "c→s"
        } else {
            "s→c"
        };
        write!(
            f,
            "[{dir}{} t{}{} {}]",
            self.client,
            self.sent,
            if self.late { " late" } else { "" },
            self.body
        )
    }
}
