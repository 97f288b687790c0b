//! Driving `leasehold::Lease` by hand, with no async runtime: for programs that have
//! their own event loop (a game loop, a poll(2) loop, a firmware super-loop).
//!
//! ```text
//! cargo run -p leasehold-examples --example custom_loop
//! ```
//!
//! The loop follows the lease's driving contract: after every input, drain
//! `poll_action` (send each request) and `poll_event` (report each event), then sleep
//! until the earliest of `poll_timeout`, an answer, or the program's own work. The lock
//! service is a small struct in this process that answers after a 4 ms "round trip";
//! the clock is `std::time::Instant`. This one runs on real time, about 2 seconds.

use std::thread;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use leasehold::{
    AcquireOutcome, Action, Config, Duration, Event, Fence, Holder, Identity, Lease, Owner,
    OwnerToken, ReleaseOutcome, RenewOutcome, RequestId, Response, State, WriteGate,
};
use leasehold_examples::{line, Storage};

const ROUND_TRIP: StdDuration = StdDuration::from_millis(4);
const WRITE_EVERY: StdDuration = StdDuration::from_millis(150);

/// A one-key lock service in this process, on the same monotonic clock.
#[derive(Default)]
struct ToyService {
    grant: Option<(OwnerToken, Fence, StdInstant)>,
    last_fence: u64,
    cut_off: bool,
}

impl ToyService {
    /// Carries out `action` for `owner` at `now`; `None` if the request is lost.
    fn handle(&mut self, action: Action, owner: Owner, now: StdInstant) -> Option<Response> {
        if self.cut_off {
            return None;
        }
        if self.grant.is_some_and(|(_, _, expires)| expires <= now) {
            self.grant = None; // hard TTL
        }
        let token = owner.token(action.term());
        let ours = self.grant.is_some_and(|(holder, _, _)| holder == token);
        Some(match action {
            Action::Acquire { ttl, .. } => Response::Acquire(match self.grant {
                Some((_, fence, _)) if ours => {
                    self.grant = Some((token, fence, now + StdDuration::from(ttl)));
                    AcquireOutcome::Granted { fence, ttl }
                }
                Some((_, fence, expires)) => AcquireOutcome::HeldByAnother(Holder {
                    identity: Identity::EMPTY,
                    fence,
                    remaining: expires.saturating_duration_since(now).into(),
                }),
                None => {
                    self.last_fence += 1;
                    let fence = Fence(self.last_fence);
                    self.grant = Some((token, fence, now + StdDuration::from(ttl)));
                    AcquireOutcome::Granted { fence, ttl }
                }
            }),
            Action::Renew { fence, ttl, .. } => Response::Renew(match &mut self.grant {
                Some((_, held, expires)) if ours && *held == fence => {
                    *expires = now + StdDuration::from(ttl);
                    RenewOutcome::Renewed { ttl }
                }
                _ => RenewOutcome::NotOwner,
            }),
            Action::Release { .. } => Response::Release(if ours {
                self.grant = None;
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotOwner
            }),
        })
    }
}

fn main() {
    println!("leasehold custom_loop: Lease driven by a plain loop, no async runtime");
    println!("(real time on std::time::Instant: about 2 seconds)\n");

    let origin = StdInstant::now();
    // The core's clock: microseconds since `origin`.
    let to_lease = |at: StdInstant| {
        leasehold::Instant::from_micros(at.duration_since(origin).as_micros() as u64)
    };
    let to_std = |at: leasehold::Instant| origin + StdDuration::from_micros(at.as_micros());
    let ms = |at: StdInstant| at.duration_since(origin).as_millis();

    let config = Config::builder(Duration::from_millis(600)).build().unwrap();
    let gate = WriteGate::new();
    // The owner the service sees; it also seeds the lease's retry jitter, so two
    // contenders (two owners) never retry in lock step.
    let owner = Owner(*b"custom-loop-demo");
    let mut lease = Lease::new(config, owner);
    let mut service = ToyService::default();
    let mut storage = Storage::default();
    let mut answers: Vec<(StdInstant, RequestId, Response)> = Vec::new();
    let mut next_write = origin + WRITE_EVERY;
    // The script: cut the client off at 700 ms; reconnect and start a second term at
    // 1,250 ms; release at 1,800 ms.
    let (cut_at, reconnect_at, release_at) = (700, 1_250, 1_800);
    let mut step = 0;

    lease.acquire(to_lease(origin), &gate).unwrap();
    loop {
        // 1. Drain the outputs: send every request, report every event.
        let now = StdInstant::now();
        while let Some(action) = lease.poll_action() {
            match service.handle(action, owner, now) {
                Some(answer) => answers.push((now + ROUND_TRIP, action.id(), answer)),
                None => {
                    let kind = match action {
                        Action::Acquire { .. } => "acquire",
                        Action::Renew { .. } => "renew",
                        Action::Release { .. } => "release",
                    };
                    let id = action.id().0;
                    line(
                        ms(now),
                        "net",
                        format!("{kind} request #{id} lost on the way"),
                    );
                }
            }
        }
        while let Some(event) = lease.poll_event() {
            let what = match event {
                Event::Acquired {
                    fence, deadline, ..
                } => format!(
                    "acquired, fence {}: safe until {} ms",
                    fence.0,
                    deadline.as_millis()
                ),
                Event::Renewed { deadline, .. } => {
                    format!("renewed: safe until {} ms", deadline.as_millis())
                }
                Event::RenewFailed { reason, .. } => format!("renewal failed: {reason}"),
                Event::Lost { reason, .. } => format!("LOST: {reason}; the gate is closed"),
                Event::Released => "released".into(),
                other => format!("{other:?}"),
            };
            line(ms(now), "lease", what);
        }
        // Released, and nothing left to send (a release whose answer is lost is
        // retried after the term has ended).
        if lease.state() == State::Released && lease.poll_timeout().is_none() {
            break;
        }

        // 2. Sleep until the next thing to do.
        let script_at = [cut_at, reconnect_at, release_at]
            .get(step)
            .map(|&at| origin + StdDuration::from_millis(at));
        let wake = [
            lease.poll_timeout().map(to_std),
            answers.iter().map(|(at, ..)| *at).min(),
            Some(next_write),
            script_at,
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("the worker always has a next write");
        thread::sleep(wake.saturating_duration_since(StdInstant::now()));

        // 3. Feed in what happened, all with one `now`.
        let now = StdInstant::now();
        let t = to_lease(now);
        let (due, later): (Vec<_>, Vec<_>) = answers.drain(..).partition(|(at, ..)| *at <= now);
        answers = later;
        for (_, id, answer) in due {
            // Whatever the answer did, the drain at the top of the loop hands out what
            // it queued. A late answer may still end the term (`EndedTerm`) or queue a
            // release (`ReleaseQueued`); only `Stale` and `WrongKind` changed nothing.
            let handled = lease.handle_response(t, id, answer, &gate);
            if !handled.changed() {
                line(
                    ms(now),
                    "lease",
                    format!("answer #{} ignored: {handled:?}", id.0),
                );
            }
        }
        // Harmless when nothing is due.
        lease.handle_timeout(t, &gate);

        if now >= next_write {
            next_write += WRITE_EVERY;
            let what = match gate.check(t) {
                Ok(fence) => format!("write with {}", storage.write_and_say(fence, "work")),
                Err(refused) => format!("no write: {refused}"),
            };
            line(ms(now), "worker", what);
        }
        if script_at.is_some_and(|at| now >= at) {
            step += 1;
            match step {
                1 => {
                    service.cut_off = true;
                    line(ms(now), "net", "client cut off from the service");
                }
                2 => {
                    service.cut_off = false;
                    line(ms(now), "net", "reconnected; starting a new term");
                    lease.acquire(t, &gate).unwrap();
                }
                _ => {
                    line(ms(now), "app", "done: release");
                    // Nothing to release if the second term was lost meanwhile.
                    let _ = lease.release(t, &gate);
                }
            }
        }
    }
    println!(
        "\n{} writes admitted; {} stale answers ignored.",
        storage.len(),
        lease.stats().stale_responses
    );
}
