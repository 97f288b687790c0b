//! The simulation harness: a seeded, deterministic world of clients, a faulty network,
//! a lock service with a hard TTL, workers and fenced storage. The scenarios and specs
//! are in `simulation.rs`.

mod client;
mod engine;
mod invariants;
mod rng;
mod scenario;
mod service;
mod tally;
mod workers;
mod world;

pub use rng::*;
pub use scenario::*;
pub use service::*;
pub use tally::*;
pub use world::*;

use leasehold::{Config, Duration, Event, Fence, Identity, Instant, LossReason, State};

/// `n` milliseconds.
pub const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` microseconds.
pub const fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// The moment `d` after the simulation starts, in real time. A client whose clock
/// origin is zero (every client of a scripted run) reads the same instant.
pub const fn at(d: Duration) -> Instant {
    Instant::ZERO.saturating_add(d)
}

/// Scaling a span: `t.times(3)`, `t.over(10)`.
pub trait Scale {
    fn times(self, n: u64) -> Duration;
    fn over(self, n: u64) -> Duration;
}

impl Scale for Duration {
    fn times(self, n: u64) -> Duration {
        self.saturating_mul(n)
    }
    fn over(self, n: u64) -> Duration {
        self.checked_div(n).unwrap()
    }
}

/// A client, by index.
pub type Who = usize;
pub const A: Who = 0;
pub const B: Who = 1;

/// The identity a client presents with its acquires: `client-A`, `client-B`…
pub fn identity_of(who: Who) -> Identity {
    Identity::new(&format!("client-{}", name(who))).unwrap()
}

pub fn name(who: Who) -> char {
    char::from(b'A'.wrapping_add(who as u8))
}

/// A 600 ms lease, renewed every T/3 = 200 ms, default margins.
pub fn t600() -> Config {
    Config::builder(ms(600)).build().unwrap()
}

/// `who` holds the lease, its gate passes right now; its fence.
#[track_caller]
pub fn assert_holds(sim: &mut Sim, who: Who) -> Fence {
    let state = sim.state(who);
    assert!(
        matches!(state, State::Holding | State::RenewPending),
        "{} should hold the lease at {}, but is {state:?}",
        name(who),
        sim.now
    );
    match sim.check(who) {
        Ok(fence) => fence,
        Err(err) => panic!("{} holds, but its gate says {err:?}", name(who)),
    }
}

#[track_caller]
pub fn assert_lost(sim: &Sim, who: Who, reason: LossReason) {
    assert_eq!(
        sim.state(who),
        State::Lost(reason),
        "{} at {}",
        name(who),
        sim.now
    );
}

pub fn losses(sim: &Sim, who: Who) -> usize {
    (sim.events_of(who).iter())
        .filter(|e| matches!(e, Event::Lost { .. }))
        .count()
}

pub fn count(events: &[Event], what: fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| what(e)).count()
}
