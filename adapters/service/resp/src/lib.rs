#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

#[cfg(test)]
extern crate std;

mod connect;
mod error;
mod exchange;
mod lock_service;
mod replies;
mod resp;
pub mod scripts;
mod service;

pub use connect::Connect;
pub use error::{Error, ProtocolError, ServerError};
pub use service::{
    Auth, RespLockService, DEFAULT_MAX_TTL, DEFAULT_READ_BUFFER, DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_WRITE_BUFFER,
};
