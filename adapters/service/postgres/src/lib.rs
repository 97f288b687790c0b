#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod guarded;
mod lock_service;
mod pool;
mod service;
mod sql;

pub use error::{ErrorKind, Op, PostgresLockError};
pub use guarded::LeaseTransaction;
pub use service::{
    Acquired, Builder, PostgresLockService, Released, Renewed, DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_TTL, DEFAULT_TABLE, MAX_TTL_LIMIT,
};

/// A fresh 128-bit owner from the operating system's random source (`None` when
/// it has none): the one generator of every leasehold crate.
pub use leasehold_driver::random_owner;
