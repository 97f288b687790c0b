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

/// A random 128-bit owner identity from the operating system's RNG.
///
/// Use one per client (process, or per lease if leases in one process must exclude
/// each other). The value stored in the lease row is its
/// [`OwnerToken`](leasehold::OwnerToken) for the current term.
///
/// # Panics
///
/// If the operating system has no random source at all (`getrandom` failed), which
/// leaves no safe way to pick a unique identity.
pub fn random_owner() -> leasehold::Owner {
    let mut bytes = [0u8; 16];
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut bytes).expect("the OS random source failed: cannot pick an owner id");
    leasehold::Owner(bytes)
}
