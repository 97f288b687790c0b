#![doc = include_str!("../README.md")]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod clock;
mod drive;
mod service;

pub use clock::Clock;
pub use drive::{run_term, Report, Target, TermEnd};
pub use service::{LocalLockService, LockService};
