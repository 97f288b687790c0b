#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

pub mod memory;
mod time;

pub use time::LeaseClock;
