#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod bounded;
#[cfg(feature = "cluster")]
mod cluster;
mod connect;
mod error;
mod fair;
mod keys;
mod lock_service;
mod place;
mod scripts;
mod service;
#[cfg(feature = "tls")]
mod tls;
mod watch;

#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use cluster::{ClusterConnection, RedisClusterLockService};
pub use connect::Builder;
pub use error::{Op, ProtocolError, RedisLockError};
pub use keys::{FencedKeys, Keys, QueueKeys};
/// The answer of [`RedisLockService::fenced_write`] and the value
/// [`RedisLockService::fenced_read`] returns, shared with the SQL stores of
/// `leasehold-storage`.
pub use leasehold_storage::{Fenced, FencedWrite};
pub use service::{Acquired, RedisLockService, Released, Renewed, DEFAULT_MAX_TTL, MAX_IN_FLIGHT};

/// The Lua scripts exactly as they are loaded into Redis (for audits, for
/// `redis-benchmark`, or to `SCRIPT LOAD` them by hand). Each documents its keys,
/// arguments and answers.
pub mod lua {
    /// The fair scripts ([`RedisLockService::with_fair`](crate::RedisLockService::with_fair)),
    /// in this crate only, and their SHA1s.
    pub use crate::fair::{FAIR_ACQUIRE, FAIR_ACQUIRE_SHA, WAITING, WAITING_SHA};
    pub use crate::scripts::{
        ACQUIRE, EPOCH_KEY, FENCED_WRITE, HOLDER, NEW_EPOCH, RAISE_FENCE, RELEASE, RENEW,
    };
}

/// A fresh 128-bit owner from the operating system's random source (`None` when
/// it has none): the one generator of every leasehold crate.
pub use leasehold_driver::random_owner;
