//! The clients' side: answers delivered, outputs drained, events checked, pauses.

use leasehold::*;

use super::*;

impl Sim {
    pub fn deliver(&mut self, who: Who, resp: Reply) {
        let local = self.local(who);
        let c = &mut self.clients[who];
        let (lease, gate) = (&mut c.lease, &c.gate);
        // What the lease held before the answer, to check what the answer must do.
        let held = (lease.fence().is_some() && lease.deadline().is_some_and(|d| local < d))
            .then(|| (lease.term(), lease.granted_ttl().unwrap_or(Duration::ZERO)));
        let result = match resp {
            Reply::Acquire(id, o) => lease.handle_response(local, id, o.into(), gate),
            Reply::Renew(id, o) => lease.handle_response(local, id, o.into(), gate),
            Reply::Release(id, o) => lease.handle_response(local, id, o.into(), gate),
            Reply::Revoked(fence) => lease.handle_revoked(local, fence, gate),
        };
        self.note(|| format!("{} <- {resp}: {result:?}", name(who)));
        // Rule 4: "not owner" is definitive, at once; so is a revocation of our grant.
        let state = self.clients[who].lease.state();
        match (resp, result) {
            (Reply::Renew(_, RenewOutcome::NotOwner), Handled::Applied) => {
                assert_eq!(state, State::Lost(LossReason::NotOwner), "rule 4");
            }
            (Reply::Revoked(_), Handled::Applied) => assert!(matches!(state, State::Lost(_))),
            (Reply::Acquire(_, AcquireOutcome::HeldByAnother(holder)), _) => {
                let grant = self
                    .service
                    .grant(holder.fence)
                    .expect("names a real grant");
                assert_eq!(holder.identity, identity_of(grant.who), "names the holder");
                self.tally.held_by_another += 1;
            }
            _ => {}
        }
        // An answer to a renewal of the held term that proves the grant gone, refused or
        // shortened ends the term at once, in time or late (only the deadline passing
        // in this very call may end it first).
        if let (Reply::Renew(id, outcome), Some((term, granted))) = (resp, held) {
            let ends = match outcome {
                RenewOutcome::NotOwner => Some(LossReason::NotOwner),
                RenewOutcome::Refused(_) => Some(LossReason::Refused),
                RenewOutcome::Renewed { ttl } if ttl < granted => Some(LossReason::Shortened),
                _ => None,
            };
            if let (Some(reason), true) = (ends, Term((id.0 >> 32) as u32) == term) {
                assert_eq!(
                    state,
                    State::Lost(reason),
                    "{} kept its term after {resp} ({result:?})",
                    name(who)
                );
                // Held until after `local`: the deadline cannot have ended it first.
                assert!(
                    matches!(result, Handled::Applied | Handled::EndedTerm),
                    "{} ended its term after {resp} as {result:?}",
                    name(who)
                );
                let late = result == Handled::EndedTerm;
                self.tally.late_not_owner += u64::from(late && reason == LossReason::NotOwner);
                self.tally.shortened_late += u64::from(late && reason == LossReason::Shortened);
            }
        }
        self.drain(who);
    }

    /// The driving contract: after every call, drain actions, then events.
    pub fn drain(&mut self, who: Who) {
        while let Some(action) = self.clients[who].lease.poll_action() {
            let (id, term) = (action.id(), action.term());
            let (kind, ttl, fence) = match action {
                Action::Acquire { ttl, .. } => (Kind::Acquire, ttl, Fence(0)),
                Action::Renew { ttl, fence, .. } => (Kind::Renew, ttl, fence),
                Action::Release { .. } => (Kind::Release, Duration::ZERO, Fence(0)),
            };
            if kind == Kind::Release {
                // Rules 5 and 6: the gate closed before the release was emitted.
                let gate = self.clients[who].gate.check(self.local(who));
                assert!(
                    gate.is_err(),
                    "{} emitted {action:?} while its gate still passes ({gate:?})",
                    name(who)
                );
            }
            let req = Request {
                id,
                term,
                kind,
                ttl,
                fence,
            };
            if self.record {
                self.sent.push((who, req));
            }
            self.note(|| format!("{} sends {req}", name(who)));
            self.transmit(who, Happening::ToService { from: who, req });
        }
        while let Some(event) = self.clients[who].lease.poll_event() {
            self.on_event(who, event);
        }
    }

    pub fn on_event(&mut self, who: Who, event: Event) {
        self.note(|| format!("{} EVENT {event:?}", name(who)));
        if self.record {
            self.events.push((who, self.now, event));
        }
        let local = self.local(who);
        let t = self.scn.config.ttl();
        match event {
            Event::Acquired {
                term,
                fence,
                deadline,
                granted,
                ..
            } => {
                assert_eq!(term, self.clients[who].lease.term());
                let grant = self.service.grant(fence).expect("acquired a real grant");
                assert_eq!(grant.ttl, granted, "Acquired reports the TTL granted");
                assert!(
                    self.scn.config.accepts_grant(granted),
                    "held a grant too short"
                );
                let asked = self.scn.config.ttl();
                self.tally.longer_grants += u64::from(granted > asked);
                self.tally.short_grants += u64::from(granted < asked);
                self.assert_deadline_is_safe(who, fence, deadline, "Acquired");
                assert!(local < deadline, "acquired with a deadline already past");
                self.tally.acquired += 1;
                let release_ppm = self.scn.faults.as_ref().map_or(0, |f| f.release_ppm);
                if self.faults_on && self.rng.chance(release_ppm) {
                    let when = self.now + self.rng.duration((Duration::ZERO, t.times(4)));
                    let what = Happening::Release {
                        who,
                        scripted: false,
                    };
                    self.schedule(when, what);
                }
            }
            Event::Renewed { deadline, .. } => {
                let fence = self.clients[who]
                    .lease
                    .fence()
                    .expect("renewed but not held");
                self.assert_deadline_is_safe(who, fence, deadline, "Renewed");
                self.tally.renewed += 1;
            }
            Event::RenewFailed {
                retry_at,
                deadline,
                writes_paused,
                ..
            } => {
                assert_eq!(writes_paused, self.scn.config.fail_closed());
                if let Some(retry) = retry_at {
                    assert!(
                        retry < deadline,
                        "rule 3: a retry scheduled past the deadline"
                    );
                }
                if writes_paused {
                    let gate = self.clients[who].gate.check(local);
                    assert!(gate.is_err(), "fail-closed, yet the gate passes");
                }
                self.tally.renew_failed += 1;
            }
            Event::Lost { reason, .. } => {
                // Rule 5: the gate closed before this was emitted.
                let gate = self.clients[who].gate.check(local);
                assert_eq!(
                    gate,
                    Err(GateError::Lost(reason)),
                    "rule 5: lost, gate open"
                );
                match reason {
                    LossReason::Expired => self.tally.lost_expired += 1,
                    LossReason::NotOwner => self.tally.lost_not_owner += 1,
                    LossReason::Revoked => self.tally.lost_revoked += 1,
                    LossReason::Shortened => self.tally.lost_shortened += 1,
                    LossReason::Refused => self.tally.lost_refused += 1,
                    _ => {}
                }
                self.acquire_again_later(who);
            }
            Event::AcquireFailed {
                reason,
                retry_at: None,
                ..
            } => {
                // The acquire is over: the gate never opened in this term.
                assert!(
                    matches!(self.clients[who].lease.state(), State::NotAcquired(r) if r == reason)
                );
                let gate = self.clients[who].gate.check(local);
                assert_eq!(gate, Err(GateError::NotHeld), "not acquired, gate open");
                match reason {
                    AcquireFailure::GrantTooShort => self.tally.too_short += 1,
                    AcquireFailure::Refused(_) => self.tally.not_acquired_refused += 1,
                    _ => self.tally.gave_up += 1,
                }
                self.acquire_again_later(who);
            }
            Event::Released => {
                let gate = self.clients[who].gate.check(local);
                assert_eq!(gate, Err(GateError::Released), "released, gate open");
                self.tally.released += 1;
                self.acquire_again_later(who);
            }
            _ => {}
        }
    }

    pub fn acquire_again_later(&mut self, who: Who) {
        if let Some(within) = self.scn.reacquire_within {
            let within = if self.faults_on {
                within
            } else {
                within.over(10)
            };
            let when = self.now + self.rng.duration((Duration::ZERO, within));
            self.schedule(when, Happening::Acquire { who });
        }
    }

    pub fn resume(&mut self, who: Who) {
        self.clients[who].paused_until = None;
        self.note(|| format!("{} RESUMES", name(who)));
        // A worker thread can run before the driver does: the gate alone must refuse a
        // lease whose deadline passed during the pause.
        let local = self.local(who);
        let result = self.clients[who].gate.check(local);
        self.checked(who, By::Waking, result);
        let deferred = std::mem::take(&mut self.clients[who].deferred);
        let inbox = std::mem::take(&mut self.clients[who].inbox);
        let workers_first = self.rng.chance(500_000);
        let is_worker =
            |h: &Happening| matches!(h, Happening::WorkerWake { .. } | Happening::Write { .. });
        if workers_first {
            for &what in deferred.iter().filter(|h| is_worker(h)) {
                self.happen(what);
            }
        }
        let c = &mut self.clients[who];
        c.lease.handle_timeout(local, &c.gate);
        self.drain(who);
        self.check_invariants();
        for resp in inbox {
            self.deliver(who, resp);
            self.check_invariants();
        }
        for &what in deferred.iter().filter(|h| !workers_first || !is_worker(h)) {
            self.happen(what);
        }
    }
}
