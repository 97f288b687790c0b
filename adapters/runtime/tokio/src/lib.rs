#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod acquire;
mod handle;
pub mod memory;
mod shared;
mod state;
mod task;
mod time;
mod trace;

pub use acquire::{acquire, acquire_with, try_acquire, AcquireError, AcquireOptions};
pub use handle::{CheckError, LeaseHandle};
pub use state::{LeaseEnd, LeaseState, TimedEvent};
pub use time::LeaseClock;
