//! The lease's timers, named. Which timer is armed, and when, is computed in one place
//! (`Lease::timer_at`); `poll_timeout` takes the earliest and `handle_timeout` fires the
//! due ones.

/// One of the lease's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The safe deadline of the grant held.
    Deadline,
    /// The request timeout of the request in flight.
    Request,
    /// The next acquire attempt or renewal.
    Send,
}

/// Every timer, for taking the earliest.
pub(crate) const TIMERS: [Timer; 3] = [Timer::Deadline, Timer::Request, Timer::Send];
