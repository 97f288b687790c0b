//! Workers and storage: gate checks, writes and what storage admits.

use leasehold::*;

use super::*;

impl Sim {
    /// Invariant (a) on a check that passed, plus the bookkeeping of every check.
    pub fn checked(&mut self, who: Who, by: By, result: Result<Fence, GateError>) {
        match result {
            Ok(fence) => {
                let stale = self.check_pass(who, fence, "a worker");
                self.tally.stale_fence_holds += u64::from(stale);
                self.tally.checks_passed += 1;
            }
            Err(GateError::DeadlinePassed { .. }) => {
                self.tally.checks_refused_deadline += 1;
                self.tally.woke_refused_deadline += u64::from(by == By::Waking);
            }
            Err(_) => {}
        }
        if self.record {
            let at = self.now;
            self.checks.push(Checked {
                who,
                by,
                at,
                result,
            });
        }
        self.note(|| format!("{} check by {by:?}: {result:?}", name(who)));
    }

    pub fn worker(&mut self, who: Who) {
        let w = self.scn.workers.unwrap();
        let result = self.clients[who].gate.check(self.local(who));
        self.checked(who, By::Worker, result);
        match result {
            Ok(fence) => {
                let delay = if self.rng.chance(w.stall_ppm) {
                    self.tally.worker_stalls += 1;
                    self.rng.duration(w.stall)
                } else {
                    self.rng.duration(w.write_delay)
                };
                let term = self.clients[who].lease.term();
                let what = Happening::WriteLands {
                    who,
                    fence,
                    term,
                    checked: self.now,
                    worker: true,
                };
                self.schedule(self.now + delay, what);
            }
            Err(_) => {
                let when = self.now + self.rng.duration(w.wake);
                self.schedule(when, Happening::WorkerWake { who });
            }
        }
    }

    pub fn scripted_write(&mut self, who: Who, delay: Duration) {
        let result = self.clients[who].gate.check(self.local(who));
        self.checked(who, By::Script, result);
        if let Ok(fence) = result {
            let term = self.clients[who].lease.term();
            let what = Happening::WriteLands {
                who,
                fence,
                term,
                checked: self.now,
                worker: false,
            };
            self.schedule(self.now + delay, what);
        }
    }

    /// A write reaches storage. Invariant (b).
    pub fn land(&mut self, who: Who, fence: Fence, term: Term, checked: Instant, worker: bool) {
        let result = self.storage.admit(fence);
        self.note(|| format!("storage: {}'s write with {fence}: {result:?}", name(who)));
        match result {
            Ok(()) => {
                if let Some(newest) = self.newest_admitted {
                    assert!(
                        fence >= newest,
                        "(b) storage admitted {fence} after already admitting {newest}"
                    );
                }
                let grant = self.service.grant(fence).unwrap_or_else(|| {
                    panic!("(b) storage admitted {fence}, which the service never granted")
                });
                assert_eq!(
                    grant.token,
                    self.clients[who].owner.token(term),
                    "(b) {}'s write carries {fence}, granted to another owner or term",
                    name(who)
                );
                assert!(checked <= self.now);
                self.newest_admitted = Some(fence);
                self.tally.writes_admitted += 1;
            }
            Err(StaleFence { presented, newest }) => {
                assert_eq!(presented, fence);
                assert_eq!(Some(newest), self.newest_admitted);
                assert!(fence < newest, "storage refused a fence that is not stale");
                self.tally.writes_rejected_stale += 1;
            }
        }
        if self.record {
            let at = self.now;
            self.landed.push(Landed {
                who,
                at,
                fence,
                result,
            });
        }
        if worker {
            let w = self.scn.workers.unwrap();
            let when = self.now + self.rng.duration(w.wake);
            self.schedule(when, Happening::WorkerWake { who });
        }
    }
}
