#![doc = include_str!("../README.md")]
// docs.rs only (`--cfg docsrs`, see Cargo.toml): label feature-gated items with their feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod clip;
mod clock;
mod drive;
#[cfg(feature = "getrandom")]
mod owner;
mod service;
mod severity;
mod step;
pub mod tls;

pub use clip::Clipped;
pub use clock::Clock;
pub use drive::{run_term, Report, Target, TermEnd};
#[cfg(feature = "getrandom")]
pub use owner::random_owner;
pub use service::{LocalLockService, LockService};
pub use severity::Severity;
pub use step::{step, Hooks, LeaseIo, Stepped};
pub use tls::TlsProblem;
