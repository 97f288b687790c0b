#![doc = include_str!("../README.md")]
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::panic,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects
    )
)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod budget;
mod config;
mod fence;
mod gate;
mod lease;
mod outcome;
mod sync;
mod time;

pub use budget::{Budget, BudgetError, BudgetTerm};
pub use config::{Config, ConfigBuilder, ConfigError};
pub use fence::{Fence, FenceGate, StaleFence};
pub use gate::{GateError, GateSnapshot, GateStatus, WriteGate, READ_ATTEMPTS};
pub use lease::{
    AcquireFailure, Action, AlreadyActive, Event, Lease, NotActive, StaleResponse, State, Stats,
};
pub use outcome::{
    AcquireOutcome, EncodedToken, Indeterminate, LossReason, Owner, OwnerToken, ReleaseOutcome,
    RenewOutcome, RequestId, Term,
};
pub use time::{Duration, Instant};
