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
                    lease: Lease::new(scn.config, Owner(id)),
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

    /// The service refuses the next request of `kind` for good (`Unauthorized`).
    pub fn refuse(&mut self, kind: Kind) {
        self.service.refuse_script.push_back(kind);
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
