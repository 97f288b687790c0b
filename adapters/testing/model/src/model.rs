//! The checked system: clients, the service, the network and storage, as one
//! stateright [`Model`].

use std::fmt;

use leasehold::FenceGate;
use stateright::{Model, Property};

use crate::cells::StorageCell;
use crate::client::{local, Client};
use crate::params::Params;
use crate::props;
use crate::service::{Service, Variant};
use crate::wire::{Msg, Wire};

/// The whole system at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sys {
    /// The service's clock, in ticks; every client reads the same (no drift).
    pub now: u8,
    /// Faults this behaviour may still contain.
    pub faults_left: u8,
    /// User releases it may still contain.
    pub releases_left: u8,
    /// The clients.
    pub clients: Vec<Client>,
    /// The lock service.
    pub service: Service,
    /// Messages in flight, sorted (a multiset: delivery order is the checker's choice).
    pub net: Vec<Msg>,
    /// Storage, behind the real `FenceGate`.
    pub storage: StorageCell,
    /// Storage admitted a fence older than one it admitted before (property b).
    pub storage_went_back: bool,
    /// Storage refused a stale write (a `sometimes` property: the fence did work).
    pub stale_write_refused: bool,
    /// Some gate admitted at a tick after the fault window (liveness).
    pub held_after_faults: bool,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Time passes one tick.
    Tick,
    /// Client `i`'s user acquires (a new term).
    Start(u8),
    /// Client `i`'s driver fires its due timers.
    Timer(u8),
    /// Client `i`'s user releases.
    Release(u8),
    /// A worker of client `i` passes the gate and sends a write to storage.
    Write(u8),
    /// Client `i`'s write reaches storage.
    Land(u8),
    /// Fault: client `i` stops for `pause_ticks`.
    Pause(u8),
    /// Message `k` is delivered (to the service, handled as the variant says).
    Deliver(u8, Variant),
    /// Fault: message `k` is lost.
    Drop(u8),
    /// Fault: message `k` is duplicated.
    Dup(u8),
    /// Fault: message `k` is delayed up to `late_ticks`.
    Late(u8),
}

/// The model: the bounds, and the mutation being checked (if any).
#[derive(Clone, Copy, Debug)]
pub struct LeaseModel {
    /// The bounds.
    pub params: Params,
}

impl fmt::Display for Sys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={} faults_left={}", self.now, self.faults_left)?;
        for (i, c) in self.clients.iter().enumerate() {
            write!(f, " | c{i}: {:?}; gate {:?}", c.lease, c.gate)?;
            if c.paused_until > self.now {
                write!(f, "; paused until {}", c.paused_until)?;
            }
        }
        match self.service.live(self.now) {
            Some(g) => write!(
                f,
                " | service: c{} term {} fence {} expires {}",
                g.client, g.term, g.fence, g.expiry
            )?,
            None => write!(f, " | service: free")?,
        }
        write!(f, " | net:")?;
        for m in &self.net {
            write!(f, " {m}")?;
        }
        Ok(())
    }
}

impl Sys {
    /// Whether faults may happen now.
    fn may_fault(&self, p: &Params) -> bool {
        self.faults_left > 0 && self.now <= p.fault_window
    }

    /// Whether the receiver of `m` can take it now.
    fn receiver_awake(&self, m: &Msg) -> bool {
        m.body.is_request() || self.clients[usize::from(m.client)].awake(self.now)
    }

    fn send(&mut self, p: &Params, client: u8, out: Vec<Wire>) {
        for body in out {
            if self.net.len() < usize::from(p.capacity) {
                self.net.push(Msg {
                    client,
                    sent: self.now,
                    late: false,
                    body,
                });
            }
        }
        self.net.sort();
    }

    fn tick_allowed(&self, p: &Params) -> bool {
        let clients_done = self
            .clients
            .iter()
            .all(|c| !c.awake(self.now) || (!c.wants_acquire() && !c.timer_due(self.now)));
        let net_done = self.net.iter().all(|m| {
            !self.receiver_awake(m) || (m.late && m.sent.saturating_add(p.late_ticks) > self.now)
        });
        clients_done && net_done
    }
}

/// The owner client `i` presents (it also seeds the client's retry jitter).
pub fn owner_of(i: u8) -> leasehold::Owner {
    let mut owner = *b"model client #0\0";
    owner[14] = b'0'.wrapping_add(i);
    leasehold::Owner(owner)
}

impl LeaseModel {
    fn initial(&self, grant_max: u8) -> Sys {
        Sys {
            now: 0,
            faults_left: self.params.faults,
            releases_left: self.params.releases,
            clients: (0..self.params.clients)
                .map(|i| Client::new(owner_of(i)))
                .collect(),
            service: Service::new(grant_max),
            net: Vec::new(),
            storage: StorageCell(FenceGate::new()),
            storage_went_back: false,
            stale_write_refused: false,
            held_after_faults: false,
        }
    }
}

impl Model for LeaseModel {
    type State = Sys;
    type Action = Step;

    fn init_states(&self) -> Vec<Sys> {
        match self.params.grant_max {
            0 => vec![self.initial(9), self.initial(6)],
            g => vec![self.initial(g)],
        }
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Step>) {
        let p = &self.params;
        if s.now >= p.horizon {
            return;
        }
        let fault = s.may_fault(p);
        for (i, c) in s.clients.iter().enumerate() {
            let i = i as u8;
            if !c.awake(s.now) {
                continue;
            }
            if c.wants_acquire() {
                out.push(Step::Start(i));
            }
            if c.timer_due(s.now) {
                out.push(Step::Timer(i));
            }
            if s.releases_left > 0 && c.lease.0.fence().is_some() {
                out.push(Step::Release(i));
            }
            match c.pending_write {
                None if c.gate.admits(local(s.now)).is_some() => out.push(Step::Write(i)),
                Some(_) => out.push(Step::Land(i)),
                None => {}
            }
            if fault {
                out.push(Step::Pause(i));
            }
        }
        for (k, m) in s.net.iter().enumerate() {
            if k > 0 && s.net[k - 1] == *m {
                continue; // the same message twice: one choice
            }
            let k = k as u8;
            if s.receiver_awake(m) {
                out.push(Step::Deliver(k, Variant::Plain));
                if fault {
                    let variants: &[Variant] = match m.body {
                        Wire::Acquire { .. } => &[Variant::Refuse, Variant::Unknown],
                        Wire::Renew { .. } => &[
                            Variant::Longer,
                            Variant::Short,
                            Variant::Disown,
                            Variant::Refuse,
                            Variant::Unknown,
                        ],
                        Wire::Release { .. } => &[Variant::Unknown],
                        Wire::Answer { .. } => &[],
                    };
                    out.extend(variants.iter().map(|&v| Step::Deliver(k, v)));
                }
            }
            if fault {
                out.push(Step::Drop(k));
                if !m.late {
                    out.push(Step::Late(k));
                }
                if s.net.len() < usize::from(p.capacity) {
                    out.push(Step::Dup(k));
                }
            }
        }
        if s.tick_allowed(p) {
            out.push(Step::Tick);
        }
    }

    fn next_state(&self, s: &Sys, step: Step) -> Option<Sys> {
        let p = &self.params;
        let mut n = s.clone();
        let now = s.now;
        match step {
            Step::Tick => {
                n.now += 1;
                n.service.expire(n.now);
            }
            Step::Start(i) => {
                let out = n.clients[usize::from(i)].start(now);
                n.send(p, i, out);
            }
            Step::Timer(i) => {
                let out = n.clients[usize::from(i)].timeout(now);
                n.send(p, i, out);
            }
            Step::Release(i) => {
                n.releases_left -= 1;
                let out = n.clients[usize::from(i)].release(now);
                n.send(p, i, out);
            }
            Step::Write(i) => {
                let c = &mut n.clients[usize::from(i)];
                c.pending_write = c.gate.admits(local(now)).map(|f| f.0);
            }
            Step::Land(i) => {
                let fence = n.clients[usize::from(i)].pending_write.take()?;
                let before = n.storage.0.newest();
                match n.storage.0.admit(leasehold::Fence(fence)) {
                    Ok(()) => {
                        n.storage_went_back |= before.is_some_and(|b| b.0 > fence);
                    }
                    Err(_) => n.stale_write_refused = true,
                }
            }
            Step::Pause(i) => {
                n.faults_left -= 1;
                n.clients[usize::from(i)].paused_until = now + p.pause_ticks;
            }
            Step::Deliver(k, variant) => {
                let m = n.net.remove(usize::from(k));
                if variant != Variant::Plain {
                    n.faults_left -= 1;
                }
                match m.body {
                    Wire::Answer { id, ans } => {
                        let out = n.clients[usize::from(m.client)].receive(now, id, ans);
                        n.send(p, m.client, out);
                    }
                    req => {
                        if let Some((id, ans)) = n.service.handle(now, m.client, req, variant) {
                            n.send(p, m.client, vec![Wire::Answer { id, ans }]);
                        }
                    }
                }
            }
            Step::Drop(k) => {
                n.faults_left -= 1;
                n.net.remove(usize::from(k));
            }
            Step::Dup(k) => {
                n.faults_left -= 1;
                let m = n.net[usize::from(k)];
                n.net.push(m);
                n.net.sort();
            }
            Step::Late(k) => {
                n.faults_left -= 1;
                n.net[usize::from(k)].late = true;
                n.net.sort();
            }
        }
        n.held_after_faults |= n.now > p.fault_window && props::admitting(&n) > 0;
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        props::all()
    }
}
