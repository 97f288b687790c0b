//! The engine: virtual time, the event queue, the network and the service's side.

use std::cmp::Reverse;

use leasehold::*;

use super::*;

impl Sim {
    pub fn local(&self, who: Who) -> Instant {
        self.now + self.clients[who].origin
    }

    pub fn is_paused(&self, who: Who) -> bool {
        self.clients[who].paused_until.is_some()
    }

    pub fn schedule(&mut self, at: Instant, what: Happening) {
        self.seq += 1;
        self.queue.push(Reverse(Pending {
            at,
            seq: self.seq,
            what,
        }));
    }

    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    pub fn note(&mut self, line: impl FnOnce() -> String) {
        let now = self.now;
        let cap = self.trace_lines;
        if let Some(trace) = &mut self.trace {
            if trace.len() == cap {
                trace.pop_front();
            }
            trace.push_back(format!("{:>16}  {}", now.to_string(), line()));
        }
    }

    /// The earliest client timer, in real time: `(when, who)`. Paused clients have none.
    pub fn next_timer(&self) -> Option<(Instant, Who)> {
        let mut next: Option<(Instant, Who)> = None;
        for (who, c) in self.clients.iter().enumerate() {
            if c.paused_until.is_some() {
                continue;
            }
            if let Some(local) = c.lease.poll_timeout() {
                let real = (local - c.origin).max(self.now);
                if next.map_or(true, |(t, _)| real < t) {
                    next = Some((real, who));
                }
            }
        }
        next
    }

    /// Does the next thing due no later than `limit`; false if there is none.
    pub fn step(&mut self, limit: Instant) -> bool {
        let queued = self.queue.peek().map(|p| p.0.at);
        let timer = self.next_timer();
        let take_timer = match (queued, timer) {
            (None, None) => return false,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(q), Some((t, _))) => t < q || (t == q && self.rng.chance(500_000)),
        };
        if take_timer {
            let (t, who) = timer.unwrap();
            if t > limit {
                return false;
            }
            self.now = t;
            self.fire_timer(who);
        } else {
            if queued.unwrap() > limit {
                return false;
            }
            let Reverse(p) = self.queue.pop().unwrap();
            self.now = self.now.max(p.at);
            self.happen(p.what);
        }
        self.tally.steps += 1;
        self.check_invariants();
        true
    }

    pub fn fire_timer(&mut self, who: Who) {
        let (when, last, count) = self.timer_burst;
        let count = if when == self.now && last == who {
            count + 1
        } else {
            1
        };
        self.timer_burst = (self.now, who, count);
        assert!(
            count <= 4,
            "{}'s poll_timeout keeps asking for {} but handle_timeout never clears it",
            name(who),
            self.now
        );
        let local = self.local(who);
        let c = &mut self.clients[who];
        c.lease.handle_timeout(local, &c.gate);
        self.note(|| format!("{} timer", name(who)));
        self.drain(who);
    }

    pub fn happen(&mut self, what: Happening) {
        if let Some(who) = what.runs_on_client() {
            if self.is_paused(who) {
                self.clients[who].deferred.push(what);
                return;
            }
        }
        match what {
            Happening::ToService { from, req } => self.serve(from, req),
            Happening::ToClient { to, resp } => {
                if self.is_paused(to) {
                    self.clients[to].inbox.push(resp);
                } else {
                    self.deliver(to, resp);
                }
            }
            Happening::PauseStart { who, len, scripted } => {
                if !scripted && !self.faults_on {
                    return;
                }
                let until = self.now + len;
                let c = &mut self.clients[who];
                let until = c.paused_until.map_or(until, |u| u.max(until));
                c.paused_until = Some(until);
                self.tally.pauses += 1;
                if len > self.scn.config.ttl() {
                    self.tally.pauses_over_ttl += 1;
                }
                self.note(|| format!("{} PAUSED for {len} (until {until})", name(who)));
                self.schedule(until, Happening::PauseEnd { who });
            }
            Happening::PauseEnd { who } => {
                if self.clients[who].paused_until == Some(self.now) {
                    self.resume(who);
                }
            }
            Happening::WorkerWake { who } => self.worker(who),
            Happening::Write { who, delay } => self.scripted_write(who, delay),
            Happening::WriteLands {
                who,
                fence,
                term,
                checked,
                worker,
            } => self.land(who, fence, term, checked, worker),
            Happening::Acquire { who } => {
                let local = self.local(who);
                let (bounded, release) = match &self.scn.faults {
                    Some(f) => (f.bounded_acquire_ppm, f.release_while_acquiring_ppm),
                    None => (0, 0),
                };
                // Wait as long as it takes, or only so long: not at all (`flock -n`), a
                // retry or two, or about one TTL.
                let wait = self.rng.chance(bounded).then(|| {
                    let config = &self.scn.config;
                    let choices = [Duration::ZERO, config.retry_interval(), config.ttl()];
                    self.rng.pick(&choices)
                });
                let c = &mut self.clients[who];
                let result = match wait {
                    Some(wait) => c.lease.acquire_until(local, local + wait, &c.gate),
                    None => c.lease.acquire(local, &c.gate),
                };
                self.note(|| format!("{} acquire(wait {wait:?}) -> {result:?}", name(who)));
                self.drain(who);
                if self.faults_on && self.rng.chance(release) {
                    // Let go while the outcome may still be unknown.
                    let timeout = self.scn.config.request_timeout();
                    let when = self.now + self.rng.duration((Duration::ZERO, timeout.times(2)));
                    self.schedule(
                        when,
                        Happening::Release {
                            who,
                            scripted: false,
                        },
                    );
                }
            }
            Happening::AcquireUntil { who, wait } => {
                let local = self.local(who);
                let c = &mut self.clients[who];
                let result = c.lease.acquire_until(local, local + wait, &c.gate);
                self.note(|| format!("{} acquire_until(+{wait}) -> {result:?}", name(who)));
                self.drain(who);
            }
            Happening::Release { who, scripted } => {
                if !scripted && !self.faults_on {
                    return;
                }
                let local = self.local(who);
                let c = &mut self.clients[who];
                let acquiring = c.lease.state() == State::Acquiring;
                let result = c.lease.release(local, &c.gate);
                self.tally.released_while_acquiring += u64::from(acquiring);
                self.note(|| format!("{} release() -> {result:?}", name(who)));
                self.drain(who);
            }
            Happening::Revoke { scripted } => {
                if !scripted && !self.faults_on {
                    return;
                }
                if let Some((victim, fence)) = self.service.revoke(self.now) {
                    self.tally.revocations += 1;
                    self.note(|| format!("service: key DELETED from outside ({fence})"));
                    let resp = Reply::Revoked(fence);
                    self.transmit(victim, Happening::ToClient { to: victim, resp });
                }
                let bogus = self.scn.faults.as_ref().map_or(0, |f| f.bogus_notice_ppm);
                if !scripted && self.rng.chance(bogus) {
                    // A late notice about some grant that is already over.
                    let ended: Vec<Fence> = (self.service.grants.iter())
                        .filter(|g| g.ended.is_some())
                        .map(|g| g.fence)
                        .collect();
                    if !ended.is_empty() {
                        let fence = self.rng.pick(&ended);
                        let to = self.rng.below(self.clients.len() as u64) as usize;
                        let resp = Reply::Revoked(fence);
                        self.transmit(to, Happening::ToClient { to, resp });
                    }
                }
            }
            Happening::FaultsStop => {
                self.faults_on = false;
                self.quiet = Some(Quiet { holder: None });
                let within = self.scn.faults.as_ref().unwrap().liveness_within;
                self.note(|| "FAULTS STOP".to_string());
                self.schedule(self.now + within, Happening::LivenessDeadline);
            }
            Happening::LivenessDeadline => {
                assert!(
                    self.done,
                    "liveness: {} after the faults stopped nobody holds the lock steadily \
                     (states: {:?})",
                    self.scn.faults.as_ref().unwrap().liveness_within,
                    self.clients
                        .iter()
                        .map(|c| c.lease.state())
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    /// Sends `what` (a message to or from `who`) through the network.
    pub fn transmit(&mut self, who: Who, what: Happening) {
        let net = if self.faults_on {
            self.scn.net
        } else {
            self.scn.calm_net
        };
        let now = self.now;
        let cut = (self.partitions.iter())
            .any(|&(p, from, until)| p == who && from <= now && now < until);
        if cut || self.rng.chance(net.drop_ppm) {
            self.tally.dropped += 1;
            self.note(|| format!("net DROPS {what}"));
            return;
        }
        let copies = if self.rng.chance(net.dup_ppm) {
            self.tally.duplicated += 1;
            2
        } else {
            1
        };
        let extra = (self.slow.iter())
            .filter(|&&(p, from, until, _)| p == who && from <= now && now < until)
            .map(|s| s.3)
            .fold(Duration::ZERO, |a, b| a + b);
        for _ in 0..copies {
            let delay = extra
                + if self.rng.chance(net.instant_ppm) {
                    Duration::ZERO
                } else if self.rng.chance(net.long_ppm) {
                    self.rng.duration((Duration::ZERO, net.long))
                } else {
                    self.rng.duration(net.delay)
                };
            self.schedule(now + delay, what);
        }
    }

    pub fn serve(&mut self, from: Who, req: Request) {
        let faulty = self.faults_on;
        let owner = self.clients[from].owner;
        let (error_ppm, conduct) = match &self.scn.faults {
            Some(f) if faulty => (
                f.service_error_ppm,
                Conduct {
                    faulty,
                    refuse_ppm: f.refuse_ppm,
                    longer_renewal_ppm: f.longer_renewal_ppm,
                    shortened_ppm: f.shortened_ppm,
                },
            ),
            _ => (0, Conduct::default()),
        };
        let mut failing = self.rng.chance(error_ppm);
        let perform = !failing || self.rng.chance(500_000);
        let mut resp = None;
        let mut shortened = false;
        if perform {
            let answer = (self.service).handle(self.now, from, owner, req, conduct, &mut self.rng);
            self.tally.regrants += u64::from(answer.regranted);
            shortened = answer.shortened;
            // A shortened renewal is always answered: see `Faults::shortened_ppm`.
            failing &= !shortened;
            resp = Some(answer.reply);
        }
        if failing {
            self.tally.service_errors += 1;
            let why = self
                .rng
                .pick(&[Indeterminate::Service, Indeterminate::Protocol]);
            resp = Some(match req.kind {
                Kind::Acquire => Reply::Acquire(req.id, AcquireOutcome::Indeterminate(why)),
                Kind::Renew => Reply::Renew(req.id, RenewOutcome::Indeterminate(why)),
                Kind::Release => Reply::Release(req.id, ReleaseOutcome::Indeterminate(why)),
            });
        }
        let resp = resp.unwrap();
        if self.tracing() {
            let holder = match self.service.live_holder(self.now) {
                Some(h) => {
                    let g = self.service.grants[h];
                    let until = self.service.real_of(g.expiry);
                    format!(
                        "{} of {} term {} until {until}",
                        g.fence,
                        name(g.who),
                        g.token.term.0
                    )
                }
                None => "nobody".to_string(),
            };
            let error = if failing { " (as an error)" } else { "" };
            self.note(|| {
                format!(
                    "service: {}'s {req} => {resp}{error}; holder {holder}",
                    name(from)
                )
            });
        }
        if let Reply::Acquire(_, AcquireOutcome::Refused(_))
        | Reply::Renew(_, RenewOutcome::Refused(_)) = resp
        {
            self.tally.refusals += 1;
        }
        let what = Happening::ToClient { to: from, resp };
        self.tally.shortened_answers += u64::from(shortened);
        if shortened && self.scn.faults.is_some() {
            let late_ppm = self.scn.faults.as_ref().map_or(0, |f| f.late_shortened_ppm);
            let delay = if self.rng.chance(late_ppm) {
                // Past the request timeout: the client has given up on it already.
                let timeout = self.scn.config.request_timeout();
                timeout + self.rng.duration((us(1), self.scn.config.ttl()))
            } else {
                self.rng.duration(self.scn.calm_net.delay)
            };
            self.note(|| format!("net holds the shortened answer back for {delay}"));
            self.schedule(self.now + delay, what);
        } else {
            self.transmit(from, what);
        }
    }
}
