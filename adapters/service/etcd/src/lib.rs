#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod checks;
mod epoch;
mod error;
mod keep_alive;
mod lock_service;
mod members;
mod queue;
mod requests;
mod service;
#[cfg(feature = "tls")]
mod tls;
mod value;

pub use error::{ErrorKind, EtcdLockError, Op};
pub use service::{
    ttl_secs, Acquired, Builder, EtcdLockService, NotHeld, Released, Renewed, Revoked,
    DEFAULT_MAX_TTL, MAX_TTL_SECS,
};

/// A fresh 128-bit owner from the operating system's random source (`None` when
/// it has none): the one generator of every leasehold crate.
pub use leasehold_driver::random_owner;
