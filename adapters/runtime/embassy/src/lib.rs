#![doc = include_str!("../README.md")]
// docs.rs only (`--cfg docsrs`, see Cargo.toml): label feature-gated items with their feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
//!
//! # Features
#![doc = document_features::document_features!()]

mod shared;
mod time;

pub use shared::LeaseShared;
pub use time::{from_embassy, now, to_embassy, EmbassyClock};

/// The lease core this adapter drives, re-exported so firmware needs one dependency.
pub use leasehold;
/// The shared driver, re-exported for [`LocalLockService`] and [`Target`].
pub use leasehold_driver;
pub use leasehold_driver::{LocalLockService, Target, TermEnd};

use embassy_sync::blocking_mutex::raw::RawMutex;
use leasehold::{AlreadyActive, Event, Lease};

/// Runs one term of `lease` on embassy-time: acquires, renews, and returns when the
/// term is lost or released.
///
/// This is the shared [`leasehold_driver::run_term`] loop with the embassy clock
/// ([`EmbassyClock`]), `shared`'s gate as the write gate, `shared`'s release request as
/// the release trigger, and `shared`'s loss signal raised on
/// [`Event::Lost`] (the gate was closed before that event
/// exists). `on_event` sees every event, in order.
///
/// Call it from your own `#[embassy_executor::task]` (tasks cannot be generic, so the
/// adapter cannot ship one): see the crate docs for the pattern. Fails only if `lease`
/// is in the middle of a term already.
pub async fn run_term<M, S, F>(
    lease: &mut Lease,
    shared: &LeaseShared<M>,
    target: Target<'_, S>,
    mut on_event: F,
) -> Result<TermEnd, AlreadyActive>
where
    M: RawMutex,
    S: LocalLockService,
    F: FnMut(Event),
{
    shared.start_term();
    leasehold_driver::run_term(
        lease,
        shared.gate(),
        target,
        &EmbassyClock,
        shared.release_requested(),
        |event| {
            if let Event::Lost { reason } = event {
                shared.signal_lost(reason);
            }
            on_event(event);
        },
    )
    .await
}
