#![doc = include_str!("../README.md")]
// docs.rs only (`--cfg docsrs`, see Cargo.toml): label feature-gated items with their feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod acquire;
mod config;
mod election;
mod handle;
mod metrics;
mod set;
mod shared;
mod state;
mod supervise;
mod task;
mod time;
mod trace;
mod turns;
mod waiters;

pub use acquire::{acquire, acquire_with, try_acquire, AcquireError, AcquireOptions};
pub use election::{
    Election, Leader, LeaderCallbacks, LeaderInfo, LeaderView, LeaderWatch, ObserveError,
    CHECK_ATTEMPTS,
};
pub use leasehold_driver::random_owner;
/// The in-memory lock service (the crate `leasehold-memory`): the embedded default,
/// with fault injection.
pub use leasehold_memory as memory;
// The core and driver types a tokio user needs, so that `leasehold-tokio` (plus a
// service crate) is the only dependency to add.
//
// Durations: everything a tokio user passes is `std::time::Duration` (a lease's
// config through [`config`]). The core's own `no_std` duration is not re-exported
// under the name `Duration`: it is `leasehold_tokio::leasehold::Duration`, for
// code that talks to the core directly.
pub use config::{config, ConfigBuilder};
pub use handle::{CheckError, LeaseHandle};
/// The core crate, for what this crate does not re-export (its `Lease`, its
/// microsecond `Duration` and `Instant`, the core's own `ConfigBuilder`).
pub use leasehold;
pub use leasehold::{
    check_key, AcquireFailure, Config, ConfigError, Fence, FenceGate, GateError, Holder, Identity,
    Instant, KeyError, LossReason, Owner, OwnerToken, Refusal, StaleFence, Stats,
};
pub use leasehold_driver::LockService;
pub use set::LeaseSet;
pub use state::{LeaseEnd, LeaseState, LeaseStats, TimedEvent};
pub use supervise::{supervise, SuperviseEnd, SuperviseOptions, SupervisedTerm};
pub use time::LeaseClock;
/// The token [`Election::run`] stops on and hands to a new leader (re-exported from
/// `tokio-util`).
pub use tokio_util::sync::CancellationToken;
