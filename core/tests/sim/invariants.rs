//! What must hold after every step: invariants (a)–(d) and liveness.

use leasehold::*;

use super::*;

impl Sim {
    /// Invariant (a): a check that passes at real time `now` returns the fence of a
    /// grant the service made to this very client and term (never released), and the
    /// service's hard TTL (its expiry mapped back to real time exactly) has not run out:
    ///
    /// * that grant's own TTL, and then the key's holder is that grant unless it was
    ///   deleted from outside (whose notice may still be on its way: the fence gate's
    ///   case); and when renewals compare the fence too, nothing less will do;
    /// * or, when renewals compare only the owner token, the TTL of a newer grant to the
    ///   same owner token, which those renewals extend: the service cannot tell two
    ///   grants of one term apart (see the timelines). Returns true in that case.
    #[track_caller]
    pub fn check_pass(&self, who: Who, fence: Fence, by: &str) -> bool {
        let c = &self.clients[who];
        let n = name(who);
        let lease = &c.lease;
        assert!(
            matches!(lease.state(), State::Holding | State::RenewPending),
            "(a) {by} of {n} passed check with {fence} while its lease is {:?}",
            lease.state()
        );
        assert_eq!(lease.fence(), Some(fence), "(a) {by} of {n}: wrong fence");
        assert!(
            !lease.writes_paused(),
            "(a) {by} of {n}: passed while paused"
        );
        let grant = (self.service.grant(fence))
            .unwrap_or_else(|| panic!("(a) {by} of {n} passed with {fence}: never granted"));
        let token = c.owner.token(lease.term());
        assert_eq!(
            grant.token, token,
            "(a) {by} of {n} passed with {fence}, granted to another owner or term"
        );
        assert_ne!(
            grant.ended,
            Some(Ended::Released),
            "(a) {by} of {n} passed with {fence}, which was released"
        );
        let expiry = self.service.real_of(grant.expiry);
        if self.now < expiry {
            debug_assert!(self.service.clock(self.now) < grant.expiry);
            if grant.ended.is_none() {
                let holder = self.service.live_holder(self.now);
                assert_eq!(
                    holder.map(|h| self.service.grants[h].fence),
                    Some(fence),
                    "(a) {by} of {n} passed with {fence}, not the key's holder"
                );
            }
            return false;
        }
        let cover = self.service.token_cover(token);
        let covered =
            self.scn.renew_compare == Compare::Owner && cover.is_some_and(|until| self.now < until);
        assert!(
            covered,
            "(a) {by} of {n} passed check at {} (its clock: {}) with {fence}, but the \
             service's hard TTL ended that lease at {expiry} (service clock {} ≥ expiry {})",
            self.now,
            self.local(who),
            self.service.clock(self.now),
            grant.expiry,
        );
        true
    }

    /// Rule 1 against the service: a safe deadline is never later than the real moment
    /// the service's hard TTL ends the grant (or, with owner-compare renewals, the
    /// newest grant to the same owner token, as in [`Sim::check_pass`]).
    #[track_caller]
    pub fn assert_deadline_is_safe(&self, who: Who, fence: Fence, deadline: Instant, what: &str) {
        let c = &self.clients[who];
        let grant = (self.service.grant(fence))
            .unwrap_or_else(|| panic!("{what}: {} holds {fence}, never granted", name(who)));
        let token = c.owner.token(c.lease.term());
        assert_eq!(
            grant.token,
            token,
            "{what}: {} holds {fence}, granted to another owner or term",
            name(who)
        );
        let real_deadline = deadline - c.origin;
        let expiry = self.service.real_of(grant.expiry);
        let covered = real_deadline <= expiry
            || (self.scn.renew_compare == Compare::Owner
                && (self.service.token_cover(token)).is_some_and(|until| real_deadline <= until));
        assert!(
            covered,
            "{what}: {}'s safe deadline {real_deadline} (real) outlives the service's \
             expiry {expiry} of {fence}",
            name(who),
        );
    }

    /// Everything that must hold after every step, for every client (paused or not).
    pub fn check_invariants(&mut self) {
        for who in 0..self.clients.len() {
            self.check_client(who);
        }
        self.check_one_holder();
        if self.quiet.is_some() {
            self.check_liveness();
        }
    }

    pub fn check_client(&mut self, who: Who) {
        let local = self.local(who);
        let n = name(who);
        let c = &self.clients[who];
        let lease = &c.lease;
        let (state, term) = (lease.state(), lease.term());
        assert_eq!(
            lease.stats().overwritten_events,
            0,
            "{n}: an event was lost although the driver drains after every call"
        );
        // (a) the gate, as a worker running right now would see it.
        let gate = c.gate.check(local);
        match gate {
            Ok(fence) => {
                self.check_pass(who, fence, "the gate");
            }
            Err(err) => {
                let open = matches!(state, State::Holding | State::RenewPending)
                    && !lease.writes_paused()
                    && lease.deadline().is_some_and(|d| local < d);
                assert!(
                    !open,
                    "{n}: lease {state:?} is held, yet the gate says {err:?}"
                );
            }
        }
        if let (Some(fence), Some(deadline)) = (lease.fence(), lease.deadline()) {
            self.assert_deadline_is_safe(who, fence, deadline, "held");
        }
        let snapshot = c.gate.snapshot().expect("no concurrent writer");
        assert_eq!(snapshot.term, term, "{n}: gate of another term");
        let gate_deadline = matches!(snapshot.status, GateStatus::Held | GateStatus::Paused)
            .then_some(snapshot.deadline);
        let deadline = lease.deadline();

        let c = &mut self.clients[who];
        if c.seen_term != term {
            c.seen_term = term;
            c.last_deadline = None;
            c.last_gate_deadline = None;
            c.closed = None;
        }
        // Deadlines only move forward within a term, the lease's and the gate's.
        if let Some(d) = deadline {
            if let Some(prev) = c.last_deadline {
                assert!(d >= prev, "{n}: deadline moved back from {prev} to {d}");
            }
            c.last_deadline = Some(d);
        }
        if let Some(d) = gate_deadline {
            if let Some(prev) = c.last_gate_deadline {
                assert!(
                    d >= prev,
                    "{n}: gate deadline moved back from {prev} to {d}"
                );
            }
            c.last_gate_deadline = Some(d);
        }
        // A closed term stays closed: Lost is final, Releasing only becomes Released.
        if let Some(closed) = c.closed {
            let fine = match closed {
                State::Lost(_) | State::Released | State::NotAcquired(_) => state == closed,
                _ => matches!(state, State::Releasing | State::Released),
            };
            assert!(
                fine,
                "{n}: term {term:?} closed as {closed:?}, now {state:?}"
            );
            assert!(gate.is_err(), "{n}: closed term, open gate");
        }
        if matches!(
            state,
            State::Lost(_) | State::Releasing | State::Released | State::NotAcquired(_)
        ) {
            c.closed = Some(state);
            assert!(gate.is_err(), "{n}: {state:?} yet the gate passes");
        }
    }

    /// Invariant (d): at any instant, at most one gate admits writes — among grants not
    /// deleted from outside (a deleted grant's holder learns of it only when the notice
    /// arrives; until then the fence gate in storage is what stops its writes). Holds
    /// because every client's drift stays within its bound; with owner-compare renewals
    /// (a model the contract forbids) a revived grant breaks it, so it is not checked.
    pub fn check_one_holder(&self) {
        if self.scn.renew_compare == Compare::Owner {
            return;
        }
        let mut admitting = (0..self.clients.len()).filter_map(|who| {
            let fence = self.clients[who].gate.check(self.local(who)).ok()?;
            let grant = self.service.grant(fence)?;
            (grant.ended != Some(Ended::Revoked)).then_some((who, fence))
        });
        if let (Some(first), Some(second)) = (admitting.next(), admitting.next()) {
            panic!(
                "(d) two gates admit writes at {}: {} with {} and {} with {}",
                self.now,
                name(first.0),
                first.1,
                name(second.0),
                second.1
            );
        }
    }

    /// After the faults stop, somebody must come to hold the lock and keep it for 3 T.
    pub fn check_liveness(&mut self) {
        let mut holders = (0..self.clients.len())
            .filter_map(|who| {
                let gate = self.clients[who].gate.check(self.local(who));
                gate.ok().map(|fence| (who, fence))
            })
            .take(2);
        let (first, second) = (holders.next(), holders.next());
        let now = self.now;
        let steady = self.scn.config.ttl().times(3);
        let quiet = self.quiet.as_mut().unwrap();
        match (first, second, quiet.holder) {
            (Some((who, fence)), None, Some((w, f, since))) if (who, fence) == (w, f) => {
                if now - since >= steady {
                    self.done = true;
                    // And its writes can land: no newer fence reached storage before.
                    let stuck = self.storage.newest().is_some_and(|newest| fence < newest);
                    assert!(
                        !stuck || self.scn.renew_compare == Compare::Owner,
                        "liveness: {} holds {fence}, older than storage's newest",
                        name(who)
                    );
                    self.tally.stuck_holders += u64::from(stuck);
                }
            }
            (Some((who, fence)), None, _) => quiet.holder = Some((who, fence, now)),
            _ => quiet.holder = None,
        }
    }
}
