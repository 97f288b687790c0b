//! What an adapter supplies: its monotonic clock and its sleep.

use core::future::Future;

use leasehold::Instant;

/// A monotonic clock and a way to sleep on it.
///
/// Conversions between the runtime's instants and [`leasehold::Instant`] live in the
/// adapter's own `time` module; this trait is all the driver needs of a runtime.
pub trait Clock {
    /// The current instant. Must never go backwards (the lease clamps if it does).
    fn now(&self) -> Instant;

    /// Completes at or after `deadline`.
    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()>;
}
