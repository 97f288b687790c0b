//! The world: clients, the network, workers and storage, driven by one event queue
//! in virtual time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;

use leasehold::*;

use super::*;

#[derive(Clone, Copy, Debug)]
pub enum Happening {
    ToService {
        from: Who,
        req: Request,
    },
    ToClient {
        to: Who,
        resp: Reply,
    },
    PauseStart {
        who: Who,
        len: Duration,
        scripted: bool,
    },
    PauseEnd {
        who: Who,
    },
    WorkerWake {
        who: Who,
    },
    /// A scripted worker: `check` now, and if it passes, the write lands `delay` later.
    Write {
        who: Who,
        delay: Duration,
    },
    WriteLands {
        who: Who,
        fence: Fence,
        term: Term,
        checked: Instant,
        /// The periodic worker goes on after this write.
        worker: bool,
    },
    Acquire {
        who: Who,
    },
    /// A scripted `acquire_until(now + wait)`.
    AcquireUntil {
        who: Who,
        wait: Duration,
    },
    Release {
        who: Who,
        scripted: bool,
    },
    Revoke {
        scripted: bool,
    },
    FaultsStop,
    LivenessDeadline,
}

impl fmt::Display for Happening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Happening::ToService { from, req } => write!(f, "{} -> service: {req}", name(*from)),
            Happening::ToClient { to, resp } => write!(f, "service -> {}: {resp}", name(*to)),
            other => write!(f, "{other:?}"),
        }
    }
}

impl Happening {
    /// What a client does itself, and so cannot do while it is paused.
    pub fn runs_on_client(&self) -> Option<Who> {
        match *self {
            Happening::WorkerWake { who }
            | Happening::Write { who, .. }
            | Happening::Acquire { who }
            | Happening::AcquireUntil { who, .. }
            | Happening::Release { who, .. } => Some(who),
            _ => None,
        }
    }
}

pub struct Pending {
    pub at: Instant,
    pub seq: u64,
    pub what: Happening,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

pub struct Client {
    pub owner: Owner,
    /// This client's clock reads `real + origin`.
    pub origin: Duration,
    pub lease: Lease,
    pub gate: WriteGate,
    /// Stopped (stop-the-world) until then.
    pub paused_until: Option<Instant>,
    /// Responses that arrived while paused, in arrival order.
    pub inbox: Vec<Reply>,
    /// Its own doings that fell into a pause.
    pub deferred: Vec<Happening>,
    // ----- what the invariants remember about the current term -----
    pub seen_term: Term,
    pub last_deadline: Option<Instant>,
    pub last_gate_deadline: Option<Instant>,
    /// The state that closed the term (Lost, Releasing, Released), if it is closed.
    pub closed: Option<State>,
}

/// Who checked the gate, for scripted assertions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Worker,
    Script,
    /// A worker running the moment a pause ends, before the driver has run.
    Waking,
}

#[derive(Clone, Copy, Debug)]
pub struct Checked {
    pub who: Who,
    pub by: By,
    pub at: Instant,
    pub result: Result<Fence, GateError>,
}

#[derive(Clone, Copy, Debug)]
pub struct Landed {
    pub who: Who,
    pub at: Instant,
    pub fence: Fence,
    pub result: Result<(), StaleFence>,
}

/// After faults stop: who has held the lock, with which fence, since when.
pub struct Quiet {
    pub holder: Option<(Who, Fence, Instant)>,
}

pub struct Sim {
    pub scn: Scenario,
    pub seed: Option<u64>,
    pub rng: Rng,
    pub now: Instant,
    pub seq: u64,
    pub queue: BinaryHeap<Reverse<Pending>>,
    pub clients: Vec<Client>,
    pub service: Service,
    pub storage: FenceGate,
    /// The newest fence storage admitted, as the simulation saw it.
    pub newest_admitted: Option<Fence>,
    pub faults_on: bool,
    /// `(client, from, until)`: every message to or from it is lost.
    pub partitions: Vec<(Who, Instant, Instant)>,
    /// `(client, from, until, extra)`: every message to or from it sent in
    /// `[from, until)` takes `extra` longer.
    pub slow: Vec<(Who, Instant, Instant, Duration)>,
    pub quiet: Option<Quiet>,
    pub done: bool,
    /// `(when, who, how often)`: timers fired at one instant, to catch a busy loop.
    pub timer_burst: (Instant, Who, u32),
    pub tally: Tally,
    /// Scripted runs keep everything for assertions.
    pub record: bool,
    pub events: Vec<(Who, Instant, Event)>,
    pub sent: Vec<(Who, Request)>,
    pub checks: Vec<Checked>,
    pub landed: Vec<Landed>,
    pub trace: Option<VecDeque<String>>,
    pub trace_lines: usize,
}

impl Sim {
    pub fn new(scn: Scenario, mut rng: Rng, seed: Option<u64>, trace: bool) -> Sim {
        let clients = (0..scn.clients)
            .map(|who| {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&rng.next().to_le_bytes());
                id[15] = who as u8; // distinct owners
                Client {
                    owner: Owner(id),
                    origin: scn.client_origins[who],
                    lease: Lease::new(scn.config),
                    gate: WriteGate::new(),
                    paused_until: None,
                    inbox: Vec::new(),
                    deferred: Vec::new(),
                    seen_term: Term(0),
                    last_deadline: None,
                    last_gate_deadline: None,
                    closed: None,
                }
            })
            .collect();
        let trace_lines = std::env::var("LEASEHOLD_SIM_TRACE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60);
        Sim {
            service: Service::new(&scn),
            faults_on: scn.faults.is_some(),
            record: scn.faults.is_none(),
            scn,
            seed,
            rng,
            now: Instant::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            clients,
            storage: FenceGate::new(),
            newest_admitted: None,
            partitions: Vec::new(),
            slow: Vec::new(),
            quiet: None,
            done: false,
            timer_burst: (Instant::ZERO, 0, 0),
            tally: Tally::default(),
            events: Vec::new(),
            sent: Vec::new(),
            checks: Vec::new(),
            landed: Vec::new(),
            trace: trace.then(VecDeque::new),
            trace_lines,
        }
    }

    /// A scripted world: calm unless the script says otherwise. Always traced.
    pub fn scripted(scn: Scenario) -> Sim {
        Sim::new(scn, Rng::new(0), None, true)
    }

    /// The seeded world: everyone acquires, workers write, faults are scheduled.
    pub fn seeded(seed: u64, trace: bool) -> Sim {
        let mut rng = Rng::new(seed);
        let scn = Scenario::random(&mut rng);
        let mut sim = Sim::new(scn, rng, Some(seed), trace);
        let t = sim.scn.config.ttl();
        let faults = sim.scn.faults.clone().unwrap();
        for who in 0..sim.clients.len() {
            let when = at(sim.rng.duration((Duration::ZERO, t.over(2))));
            sim.schedule(when, Happening::Acquire { who });
        }
        sim.start_workers(Instant::ZERO);
        for &(who, when, len) in &faults.pauses {
            sim.schedule(
                when,
                Happening::PauseStart {
                    who,
                    len,
                    scripted: false,
                },
            );
        }
        for &when in &faults.revocations {
            sim.schedule(when, Happening::Revoke { scripted: false });
        }
        sim.schedule(faults.until, Happening::FaultsStop);
        if sim.tracing() {
            let scenario = format!("scenario {:#?}", sim.scn);
            sim.note(|| scenario);
        }
        sim
    }

    // ----- scripting -----

    #[track_caller]
    pub fn at_or_after_now(&self, when: Instant) {
        assert!(
            when >= self.now,
            "cannot schedule at {when}: it is already {}",
            self.now
        );
    }

    #[track_caller]
    pub fn acquire(&mut self, who: Who, when: Instant) {
        self.at_or_after_now(when);
        self.schedule(when, Happening::Acquire { who });
    }

    #[track_caller]
    pub fn release(&mut self, who: Who, when: Instant) {
        self.at_or_after_now(when);
        self.schedule(
            when,
            Happening::Release {
                who,
                scripted: true,
            },
        );
    }

    /// Stops the whole client (driver and workers) for `len`.
    #[track_caller]
    pub fn pause(&mut self, who: Who, when: Instant, len: Duration) {
        self.at_or_after_now(when);
        self.schedule(
            when,
            Happening::PauseStart {
                who,
                len,
                scripted: true,
            },
        );
    }

    /// A worker of `who` checks the gate at `when`; if it passes, its write reaches
    /// storage `lands_after` later (a long one is a pause between check and write).
    #[track_caller]
    pub fn write(&mut self, who: Who, when: Instant, lands_after: Duration) {
        self.at_or_after_now(when);
        self.schedule(
            when,
            Happening::Write {
                who,
                delay: lands_after,
            },
        );
    }

    /// Every message to or from `who` sent in `[from, until)` is lost.
    #[track_caller]
    pub fn partition(&mut self, who: Who, from: Instant, until: Instant) {
        self.at_or_after_now(from);
        self.partitions.push((who, from, until));
    }

    /// Every message to or from `who` sent in `[from, until)` takes `extra` longer.
    #[track_caller]
    pub fn slow_down(&mut self, who: Who, from: Instant, until: Instant, extra: Duration) {
        self.at_or_after_now(from);
        self.slow.push((who, from, until, extra));
    }

    /// `who` starts a term at `when` that waits for the key at most `wait`.
    #[track_caller]
    pub fn acquire_until(&mut self, who: Who, when: Instant, wait: Duration) {
        self.at_or_after_now(when);
        self.schedule(when, Happening::AcquireUntil { who, wait });
    }

    /// The service answers the coming renewals (of any client) with these TTLs, in
    /// order, applying each as the new expiry; then as asked again.
    pub fn renewals_answered(&mut self, ttls: &[Duration]) {
        self.service.renew_script.extend(ttls);
    }

    /// A copy of request `id` that `who` sent earlier reaches the service at `when`
    /// (a duplicate the network held back).
    #[track_caller]
    pub fn deliver_again(&mut self, who: Who, id: u64, when: Instant) {
        self.at_or_after_now(when);
        let sent = self
            .sent
            .iter()
            .find(|(w, r)| *w == who && r.id == RequestId(id));
        let &(_, req) = sent.expect("no such request was sent");
        self.schedule(when, Happening::ToService { from: who, req });
    }

    /// The key is deleted behind its holder's back at `when`; the holder is told.
    #[track_caller]
    pub fn revoke(&mut self, when: Instant) {
        self.at_or_after_now(when);
        self.schedule(when, Happening::Revoke { scripted: true });
    }

    pub fn start_workers(&mut self, from: Instant) {
        let Some(w) = self.scn.workers else { return };
        for who in 0..self.clients.len() {
            let when = from + self.rng.duration(w.wake);
            self.schedule(when, Happening::WorkerWake { who });
        }
    }

    /// Runs everything due up to and including `until`, then sets the clock to it.
    #[track_caller]
    pub fn run_until(&mut self, until: Instant) {
        self.at_or_after_now(until);
        while self.step(until) {}
        self.now = until;
        self.check_invariants();
    }

    /// Runs a seeded world until the liveness check is satisfied.
    pub fn run_to_the_end(&mut self) {
        while !self.done {
            assert!(self.step(Instant::MAX), "nothing left to happen");
        }
        self.tally.seeds = 1;
        self.tally.liveness_ok = 1;
        for c in &self.clients {
            self.tally.stale_responses += u64::from(c.lease.stats().stale_responses);
        }
    }

    // ----- observations for scripted tests -----

    /// What a worker of `who` that runs right now (e.g. on another core, while the
    /// client is paused) sees. The invariants apply to it.
    pub fn check(&mut self, who: Who) -> Result<Fence, GateError> {
        let result = self.clients[who].gate.check(self.local(who));
        if let Ok(fence) = result {
            let stale = self.check_pass(who, fence, "a scripted check");
            self.tally.stale_fence_holds += u64::from(stale);
        }
        result
    }

    pub fn state(&self, who: Who) -> State {
        self.clients[who].lease.state()
    }

    pub fn events_of(&self, who: Who) -> Vec<Event> {
        self.events
            .iter()
            .filter(|e| e.0 == who)
            .map(|e| e.2)
            .collect()
    }

    /// The check a worker made the moment `who` last woke from a pause.
    pub fn wake_check(&self, who: Who) -> Option<Result<Fence, GateError>> {
        self.checks
            .iter()
            .rev()
            .find(|c| c.who == who && c.by == By::Waking)
            .map(|c| c.result)
    }

    pub fn scripted_checks(&self, who: Who) -> Vec<(Instant, Result<Fence, GateError>)> {
        self.checks
            .iter()
            .filter(|c| c.who == who && c.by == By::Script)
            .map(|c| (c.at, c.result))
            .collect()
    }

    pub fn landed_from(&self, who: Who) -> Vec<(Instant, Fence, Result<(), StaleFence>)> {
        self.landed
            .iter()
            .filter(|l| l.who == who)
            .map(|l| (l.at, l.fence, l.result))
            .collect()
    }

    // ----- the engine -----

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
            (Reply::Renew(_, RenewOutcome::NotOwner), Ok(())) => {
                assert_eq!(state, State::Lost(LossReason::NotOwner), "rule 4");
            }
            (Reply::Revoked(_), Ok(())) => assert!(matches!(state, State::Lost(_))),
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
                let late = result.is_err();
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
            Event::Renewed { deadline } => {
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
            Event::Lost { reason } => {
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

impl Drop for Sim {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(trace) = &self.trace {
                let mut out = String::new();
                if let Some(seed) = self.seed {
                    out += &format!("\n=== seed {seed} ===\n{:?}\n", self.scn);
                }
                out += &format!("=== the last {} steps (real time) ===\n", trace.len());
                for line in trace {
                    out += line;
                    out.push('\n');
                }
                out += &format!("=== failed at {} ===\n", self.now);
                eprint!("{out}");
            }
        }
    }
}
