#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod checks;
mod epoch;
mod error;
mod keep_alive;
mod lock_service;
mod members;
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

/// A random 128-bit owner identity from the operating system's RNG.
///
/// Use one per client (process, or per lease if leases in one process must exclude
/// each other). The value stored in etcd is its [`OwnerToken`](leasehold::OwnerToken)
/// for the current term.
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
