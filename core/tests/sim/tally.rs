//! What happened across a run (or many): to show the faults were really exercised.

/// What happened across a run (or many): to show the faults were really exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub seeds: u64,
    pub steps: u64,
    pub checks_passed: u64,
    pub checks_refused_deadline: u64,
    pub woke_refused_deadline: u64,
    pub writes_admitted: u64,
    pub writes_rejected_stale: u64,
    pub worker_stalls: u64,
    pub acquired: u64,
    pub renewed: u64,
    pub renew_failed: u64,
    pub lost_expired: u64,
    pub lost_not_owner: u64,
    pub lost_revoked: u64,
    pub lost_shortened: u64,
    pub released: u64,
    pub stale_responses: u64,
    pub pauses: u64,
    pub pauses_over_ttl: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub service_errors: u64,
    pub regrants: u64,
    /// "Held by another" answers, each naming the true holder.
    pub held_by_another: u64,
    /// Releases while the acquire was in flight or its outcome unknown.
    pub released_while_acquiring: u64,
    /// Terms ended by a refused renewal.
    pub lost_refused: u64,
    /// Acquires ended by a final refusal.
    pub not_acquired_refused: u64,
    /// Acquires that ran out of their wait bound.
    pub gave_up: u64,
    /// Grants too short to hold (`GrantTooShort`): refused by the client.
    pub too_short: u64,
    /// Grants of less than the TTL asked for, accepted.
    pub short_grants: u64,
    /// Grants of more than the TTL asked for.
    pub longer_grants: u64,
    /// "Not owner" answers to a renewal the client no longer waited for, that ended its held term.
    pub late_not_owner: u64,
    /// Of those, answers that reached a client holding that term after it gave up on the request.
    pub shortened_late: u64,
    /// Renewals answered with less than asked (breaches).
    pub shortened_answers: u64,
    /// Final refusals the service answered (acquire or renew).
    pub refusals: u64,
    pub revocations: u64,
    pub liveness_ok: u64,
    /// Checks that passed after their own grant's hard TTL, covered only by a newer
    /// grant to the same owner token (owner-compare renewals; see the timelines).
    pub stale_fence_holds: u64,
    /// Runs whose steady holder, once faults stopped, held a fence older than one
    /// storage had admitted: a holder that can never write.
    pub stuck_holders: u64,
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        let Tally {
            seeds,
            steps,
            checks_passed,
            checks_refused_deadline,
            woke_refused_deadline,
            writes_admitted,
            writes_rejected_stale,
            worker_stalls,
            acquired,
            renewed,
            renew_failed,
            lost_expired,
            lost_not_owner,
            lost_revoked,
            lost_shortened,
            released,
            stale_responses,
            pauses,
            pauses_over_ttl,
            dropped,
            duplicated,
            service_errors,
            regrants,
            held_by_another,
            released_while_acquiring,
            lost_refused,
            not_acquired_refused,
            gave_up,
            too_short,
            short_grants,
            longer_grants,
            late_not_owner,
            shortened_late,
            shortened_answers,
            refusals,
            revocations,
            liveness_ok,
            stale_fence_holds,
            stuck_holders,
        } = *o;
        self.seeds += seeds;
        self.steps += steps;
        self.checks_passed += checks_passed;
        self.checks_refused_deadline += checks_refused_deadline;
        self.woke_refused_deadline += woke_refused_deadline;
        self.writes_admitted += writes_admitted;
        self.writes_rejected_stale += writes_rejected_stale;
        self.worker_stalls += worker_stalls;
        self.acquired += acquired;
        self.renewed += renewed;
        self.renew_failed += renew_failed;
        self.lost_expired += lost_expired;
        self.lost_not_owner += lost_not_owner;
        self.lost_revoked += lost_revoked;
        self.lost_shortened += lost_shortened;
        self.released += released;
        self.stale_responses += stale_responses;
        self.pauses += pauses;
        self.pauses_over_ttl += pauses_over_ttl;
        self.dropped += dropped;
        self.duplicated += duplicated;
        self.service_errors += service_errors;
        self.regrants += regrants;
        self.held_by_another += held_by_another;
        self.released_while_acquiring += released_while_acquiring;
        self.lost_refused += lost_refused;
        self.not_acquired_refused += not_acquired_refused;
        self.gave_up += gave_up;
        self.too_short += too_short;
        self.short_grants += short_grants;
        self.longer_grants += longer_grants;
        self.late_not_owner += late_not_owner;
        self.shortened_late += shortened_late;
        self.shortened_answers += shortened_answers;
        self.refusals += refusals;
        self.revocations += revocations;
        self.liveness_ok += liveness_ok;
        self.stale_fence_holds += stale_fence_holds;
        self.stuck_holders += stuck_holders;
    }
}
