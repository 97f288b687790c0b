#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod audit;
mod error;
mod outcome;
mod table;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

pub use audit::{check_order, Admitted, OutOfOrder};
pub use error::Error;
pub use leasehold::{Fence, StaleFence};
pub use outcome::{Fenced, FencedWrite};
pub use table::{FenceOutOfRange, InvalidTableName, TableName, MAX_SQL_FENCE};
