#![doc = include_str!("../README.md")]
// docs.rs only (`--cfg docsrs`, see Cargo.toml): label feature-gated items with their feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
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
mod names;
mod outcome;
mod sync;
mod time;
mod timers;

#[doc = include_str!("../RULES.md")]
pub mod rules {}

pub use budget::{Budget, BudgetError, BudgetPart};
pub use config::{Config, ConfigBuilder, ConfigError};
pub use fence::{Fence, FenceGate, StaleFence};
pub use gate::{GateError, GateSnapshot, GateStatus, WriteGate, READ_ATTEMPTS};
pub use lease::{
    AcquireFailure, Action, AlreadyActive, Event, Handled, Lease, NotActive, State, Stats, MAX_TERM,
};
pub use names::{check_key, Holder, Identity, IdentityError, KeyError, MAX_KEY_LEN};
pub use outcome::{
    AcquireOutcome, EncodedToken, HolderOutcome, Indeterminate, LossReason, Owner, OwnerToken,
    Refusal, ReleaseOutcome, RenewOutcome, RequestId, Response, Term,
};
pub use time::{div_rem_u16, Duration, Instant};
