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
pub use leasehold_driver::{LocalLockService, Report, Target, TermEnd};

use core::borrow::Borrow;
use core::future::Future;

use embassy_sync::blocking_mutex::raw::RawMutex;
use leasehold::{AlreadyActive, Config, Event, Instant, Lease};

/// Runs one term of `lease` on embassy-time: acquires (giving up at `give_up_at`,
/// `Instant::MAX` to wait as long as it takes), renews, and returns when the term is
/// lost, released, or was never acquired.
///
/// This is the shared [`leasehold_driver::run_term`] loop with the embassy clock
/// ([`EmbassyClock`]), `shared`'s gate as the write gate, `shared`'s release request as
/// the release trigger, and `shared`'s loss signal raised on [`Event::Lost`] (the gate
/// was closed before that event exists). `on_report` sees every event, in order, and
/// the holder named by each "held by another" answer ([`Report::HeldBy`]).
///
/// A term that follows the release of a held key first lets the lease's
/// [`turn`](Lease::turn) pass (up to `give_up_at`), so a contender that waits for the
/// key takes its turn instead of finding it taken again at once.
///
/// `give_up_at` is on the lease's clock: [`now`] plus how long to wait. An acquire
/// refused for good (an invalid key, revoked credentials) ends at once as
/// [`TermEnd::NotAcquired`], whatever the bound.
///
/// Call it from your own `#[embassy_executor::task]` (tasks cannot be generic, so the
/// adapter cannot ship one): see the crate docs for the pattern. Fails only if `lease`
/// is in the middle of a term already.
///
/// The lease may own its config or borrow it: a `Lease<&'static Config>` shares one
/// `static` config and keeps 40 bytes less RAM on a 32-bit target.
///
/// (Not an `async fn`, which would keep its arguments twice in the task.)
#[allow(clippy::manual_async_fn)]
pub fn run_term<'a, L, M, S, F>(
    lease: &'a mut Lease<L>,
    shared: &'a LeaseShared<M>,
    target: Target<'a, S>,
    give_up_at: Instant,
    mut on_report: F,
) -> impl Future<Output = Result<TermEnd, AlreadyActive>> + 'a
where
    L: Borrow<Config>,
    M: RawMutex,
    S: LocalLockService,
    F: FnMut(Report) + 'a,
{
    async move {
        shared.start_term();
        // A fair turn: after this lease released the key it held, waiters go first.
        if let Some(turn) = lease.turn() {
            embassy_time::Timer::at(to_embassy(turn.min(give_up_at))).await;
        }
        leasehold_driver::run_term(
            lease,
            shared.gate(),
            target,
            &EmbassyClock,
            give_up_at,
            shared.release_requested(),
            |report| {
                if let Report::Event(Event::Lost { reason, .. }) = report {
                    shared.signal_lost(reason);
                }
                on_report(report);
            },
        )
        .await
    }
}
