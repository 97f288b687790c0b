//! Exhaustive model check of the real `leasehold` core with
//! [stateright](https://docs.rs/stateright).
//!
//! The client states hold the real [`leasehold::Lease`] and [`leasehold::WriteGate`]
//! (the core is `no_std`; it runs here on std), driven as a driver drives them:
//! drain every output after every call. Around them:
//!
//! * a lock service ([`service`]) with a hard TTL on its own clock, keeping the
//!   contract of `leasehold_driver::LocalLockService`: grants are a function (a clamp)
//!   of the TTL asked, a renewal *replaces* the expiry with handling time + r where
//!   r >= the TTL asked, owner token and fence are compared, a re-acquire by the same
//!   token keeps the fence, fences strictly increase;
//! * a network that delays, drops, duplicates and reorders messages (a bounded
//!   multiset in flight);
//! * discrete time (ticks) and pauses (a client takes no step for some ticks);
//! * storage behind the real [`leasehold::FenceGate`].
//!
//! The checker explores every interleaving within the bounds of [`Params`] and checks
//! the properties of [`props`] in every reachable state. Two cargo features put back
//! defects the check must find (see `tests/mutants.rs`).
//!
//! See `cells` for how the core's types are hashed without changing the core.

pub mod cells;
pub mod client;
pub mod model;
pub mod params;
pub mod props;
pub mod run;
pub mod service;
pub mod wire;

pub use model::{LeaseModel, Step, Sys};
pub use params::Params;
pub use run::{check, Outcome};
