//! A client: the real `Lease` and its `WriteGate`, driven as a driver would (drain
//! every output after every call), plus what the properties remember about it.

use std::sync::Arc;

use leasehold::{Action, Instant, Lease, Owner, RequestId, Response, State, WriteGate};

use crate::cells::{GateCell, LeaseCell};
use crate::params::{lease_config, TICK_US};
use crate::wire::{Ans, Wire};

/// What started the newest request: replayed by the receive-time mutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmd {
    /// `Lease::acquire`.
    Acquire,
    /// `Lease::handle_timeout`.
    Timeout,
}

/// One client's state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// The real lease.
    pub lease: LeaseCell,
    /// Its real write gate.
    pub gate: GateCell,
    /// It takes no step before this tick (a pause).
    pub paused_until: u8,
    /// A write that passed the gate and has not reached storage yet.
    pub pending_write: Option<u64>,
    /// A term whose gate must stay closed: the client received, for it, a renewal
    /// answer that ends it (shortened TTL, not owner, refused).
    pub must_close: Option<u32>,
    /// The newest term whose gate showed `Lost`.
    pub lost_term: Option<leasehold::Term>,
    /// For the receive-time mutation: the lease as it was before the newest request
    /// was sent, and the call that sent it.
    pub before_send: Option<(LeaseCell, Cmd)>,
    /// Its gate opened again in a term it had lost (property c).
    pub relapsed: bool,
    /// It was refused an acquire for good and did not end the acquire (property f).
    pub refusal_ignored: bool,
}

/// The client's clock at model tick `now` (no drift: see `params::lease_config`).
pub fn local(now: u8) -> Instant {
    Instant::from_micros(u64::from(now) * TICK_US)
}

impl Client {
    /// A client that has not acquired yet, presenting `owner` (which also seeds its
    /// retry jitter).
    pub fn new(owner: Owner) -> Client {
        Client {
            lease: LeaseCell(Lease::new(lease_config(), owner)),
            gate: GateCell::new(),
            paused_until: 0,
            pending_write: None,
            must_close: None,
            lost_term: None,
            before_send: None,
            relapsed: false,
            refusal_ignored: false,
        }
    }

    /// Whether it may take a step at `now`.
    pub fn awake(&self, now: u8) -> bool {
        now >= self.paused_until
    }

    /// Whether its user wants a new term now (it always wants the lock).
    pub fn wants_acquire(&self) -> bool {
        matches!(
            self.lease.0.state(),
            State::Idle | State::Lost(_) | State::NotAcquired(_) | State::Released
        )
    }

    /// Whether a timer of the lease is due at `now`.
    pub fn timer_due(&self, now: u8) -> bool {
        self.lease
            .0
            .poll_timeout()
            .is_some_and(|at| at <= local(now))
    }

    /// Runs one call on the lease with a fresh gate, keeps the gate if the lease
    /// published to it, and drains every output: returns the requests to send.
    pub fn call(&mut self, f: impl FnOnce(&mut Lease, &WriteGate)) -> Vec<Wire> {
        let mut lease = self.lease.0.clone();
        let fresh = WriteGate::new();
        f(&mut lease, &fresh);
        if fresh.snapshot() != WriteGate::new().snapshot() {
            self.gate = GateCell(Arc::new(fresh));
        }
        let mut out = Vec::new();
        while let Some(action) = lease.poll_action() {
            out.push(to_wire(action));
        }
        while lease.poll_event().is_some() {}
        self.lease = LeaseCell(lease);
        if self.note_gate() {
            self.relapsed = true;
        }
        out
    }

    /// Remembers a loss seen on the gate, and returns whether the gate is held in a
    /// term it already lost (property c).
    pub fn note_gate(&mut self) -> bool {
        let Some(snap) = self.gate.snapshot() else {
            return false;
        };
        match snap.status {
            leasehold::GateStatus::Lost(_) => {
                self.lost_term = Some(snap.term);
                false
            }
            leasehold::GateStatus::Held | leasehold::GateStatus::Paused => {
                self.lost_term == Some(snap.term)
            }
            _ => false,
        }
    }

    /// Starts a term (the user acquires, waiting as long as it takes).
    pub fn start(&mut self, now: u8) -> Vec<Wire> {
        let before = self.lease.clone();
        let out = self.call(|lease, gate| {
            let _ = lease.acquire(local(now), gate);
        });
        self.remember_send(before, Cmd::Acquire);
        out
    }

    /// Fires the lease's due timers.
    pub fn timeout(&mut self, now: u8) -> Vec<Wire> {
        let before = self.lease.clone();
        let out = self.call(|lease, gate| lease.handle_timeout(local(now), gate));
        if !out.is_empty() {
            self.remember_send(before, Cmd::Timeout);
        }
        out
    }

    /// Keeps the lease from before a send, for the receive-time mutation only (in
    /// other builds it would only split equal states).
    fn remember_send(&mut self, before: LeaseCell, cmd: Cmd) {
        if cfg!(feature = "mutant-receive-time") {
            self.before_send = Some((before, cmd));
        }
    }

    /// The user releases.
    pub fn release(&mut self, now: u8) -> Vec<Wire> {
        self.before_send = None;
        self.call(|lease, gate| {
            let _ = lease.release(local(now), gate);
        })
    }

    /// Receives the answer `ans` to request `id` at `now`.
    pub fn receive(&mut self, now: u8, id: u64, ans: Ans) -> Vec<Wire> {
        let term = self.lease.0.term().0;
        let held = self.lease.0.fence().is_some();
        let this_term = (id >> 32) as u32 == term;
        // What the contract says must end the term, once received.
        let ends_term = match ans {
            Ans::Renewed { ttl, asked } => ttl < asked,
            Ans::NotOwner(crate::wire::Kind::Renew) | Ans::Refused(crate::wire::Kind::Renew) => {
                true
            }
            _ => false,
        };
        if held && this_term && ends_term {
            self.must_close = Some(term);
        }
        let awaited = self.lease.0.is_awaiting(RequestId(id));
        if cfg!(feature = "mutant-late-shortened") && !awaited {
            if let Ans::Renewed { ttl, asked } = ans {
                if ttl < asked {
                    // The old core's defect: a late shortened renewal is ignored.
                    return Vec::new();
                }
            }
        }
        if cfg!(feature = "mutant-receive-time") && awaited {
            if let Some(out) = self.receive_as_if_sent_now(now, id, ans) {
                return out;
            }
        }
        let response: Response = ans.response();
        let out = self.call(|lease, gate| {
            let _ = lease.handle_response(local(now), RequestId(id), response, gate);
        });
        if awaited && ans == Ans::Refused(crate::wire::Kind::Acquire) {
            self.refusal_ignored |= !matches!(
                self.lease.0.state(),
                State::NotAcquired(leasehold::AcquireFailure::Refused(_))
            );
        }
        out
    }

    /// The receive-time mutation: replays the send of request `id` at the receive
    /// instant, so the lease counts the grant from when the answer arrived.
    fn receive_as_if_sent_now(&mut self, now: u8, id: u64, ans: Ans) -> Option<Vec<Wire>> {
        if !matches!(ans, Ans::Granted { .. } | Ans::Renewed { .. }) {
            return None;
        }
        let (before, cmd) = self.before_send.clone()?;
        let mut replay = self.clone();
        replay.lease = before;
        let resent = match cmd {
            Cmd::Acquire => replay.start(now),
            Cmd::Timeout => replay.timeout(now),
        };
        let same = resent.iter().any(|w| wire_id(w) == Some(id));
        if !same {
            return None;
        }
        let response = ans.response();
        let out = replay.call(|lease, gate| {
            let _ = lease.handle_response(local(now), RequestId(id), response, gate);
        });
        *self = replay;
        Some(out)
    }
}

/// The id of a request.
pub fn wire_id(w: &Wire) -> Option<u64> {
    match *w {
        Wire::Acquire { id, .. } | Wire::Renew { id, .. } | Wire::Release { id, .. } => Some(id),
        Wire::Answer { .. } => None,
    }
}

fn to_wire(action: Action) -> Wire {
    let t = |d: leasehold::Duration| d.as_micros() / TICK_US;
    match action {
        Action::Acquire { id, term, ttl, .. } => Wire::Acquire {
            id: id.0,
            term: term.0,
            ttl: t(ttl),
        },
        Action::Renew {
            id,
            term,
            fence,
            ttl,
            ..
        } => Wire::Renew {
            id: id.0,
            term: term.0,
            fence: fence.0,
            ttl: t(ttl),
        },
        Action::Release { id, term, .. } => Wire::Release {
            id: id.0,
            term: term.0,
        },
    }
}
