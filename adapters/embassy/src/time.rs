//! The one place where embassy-time meets leasehold time.
//!
//! leasehold counts microseconds; embassy-time counts ticks at `TICK_HZ`, which may be
//! coarser (1 kHz, 32.768 kHz) or finer than a microsecond. Two rules keep the lease
//! safe and the loop from spinning:
//!
//! * **now rounds down**: a tick is reported as the last whole microsecond it has
//!   reached, so the lease never believes it is later than it is;
//! * **deadlines round up**: a sleep until `d` ends on the first tick whose
//!   rounded-down time is `>= d`, so when the timer fires, `now()` has really reached
//!   the deadline and `handle_timeout` makes progress (rounding the deadline down would
//!   wake the loop a tick early, find nothing due, and re-arm the same timer until the
//!   tick count catches up).
//!
//! Both conversions saturate and never panic. They split the value into whole seconds
//! and a remainder so that no product can overflow `u64` and no 128-bit arithmetic is
//! needed (which would cost flash on a Cortex-M0).

use core::future::Future;

use embassy_time::{Timer, TICK_HZ};
use leasehold::Instant;
use leasehold_driver::Clock;

const MICROS_PER_SEC: u64 = 1_000_000;

/// The embassy-time clock: `now` from [`embassy_time::Instant::now`], sleeps with
/// [`Timer::at`].
///
/// Any embassy time driver works (a HAL's, `std`, `mock-driver`, your own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EmbassyClock;

impl Clock for EmbassyClock {
    fn now(&self) -> Instant {
        from_embassy(embassy_time::Instant::now())
    }

    fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> {
        Timer::at(to_embassy(deadline))
    }
}

/// The current embassy-time instant as a leasehold [`Instant`] (rounded down to the
/// microsecond). Use it for [`WriteGate::check`](leasehold::WriteGate::check) in code
/// that does not go through [`LeaseShared::check`](crate::LeaseShared::check).
pub fn now() -> Instant {
    from_embassy(embassy_time::Instant::now())
}

/// An embassy-time instant as a leasehold [`Instant`]: whole microseconds since boot,
/// rounded down, saturating.
pub const fn from_embassy(instant: embassy_time::Instant) -> Instant {
    Instant::from_micros(ticks_to_micros_floor(instant.as_ticks(), TICK_HZ))
}

/// A leasehold [`Instant`] as the first embassy-time tick at or after it (rounded up),
/// saturating at [`embassy_time::Instant::MAX`].
pub const fn to_embassy(instant: Instant) -> embassy_time::Instant {
    embassy_time::Instant::from_ticks(micros_to_ticks_ceil(instant.as_micros(), TICK_HZ))
}

/// `floor(ticks * 1e6 / hz)`, saturating; `u64::MAX` for a zero `hz`.
const fn ticks_to_micros_floor(ticks: u64, hz: u64) -> u64 {
    let (Some(secs), Some(rem)) = (ticks.checked_div(hz), ticks.checked_rem(hz)) else {
        return u64::MAX;
    };
    // `rem < hz`; embassy's highest tick rate is ~1.3e9, so `rem * 1e6` fits easily.
    let part = match rem.saturating_mul(MICROS_PER_SEC).checked_div(hz) {
        Some(part) => part,
        None => 0,
    };
    secs.saturating_mul(MICROS_PER_SEC).saturating_add(part)
}

/// `ceil(micros * hz / 1e6)`, saturating.
const fn micros_to_ticks_ceil(micros: u64, hz: u64) -> u64 {
    let secs = micros / MICROS_PER_SEC;
    let rem = micros % MICROS_PER_SEC;
    // `rem < 1e6`, so `rem * hz` fits for any tick rate below ~1.8e13.
    let part = rem.saturating_mul(hz).div_ceil(MICROS_PER_SEC);
    secs.saturating_mul(hz).saturating_add(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tick rate the property is checked at: finer, equal and coarser than 1 µs,
    /// and ones that do not divide a second evenly.
    const RATES: [u64; 6] = [
        1_000,
        32_768,
        1_000_000,
        1_048_576,
        16_000_000,
        1_000_000_000,
    ];

    #[test]
    fn a_timer_set_for_a_deadline_fires_when_now_has_reached_it() {
        for hz in RATES {
            for micros in [0, 1, 29, 30, 31, 999, 1_000, 1_001, 123_456_789, 3_000_000] {
                let tick = micros_to_ticks_ceil(micros, hz);
                assert!(
                    ticks_to_micros_floor(tick, hz) >= micros,
                    "{hz} Hz: deadline {micros} µs -> tick {tick} reads back earlier"
                );
                // And it is the *first* such tick: one tick earlier is still before it.
                if tick > 0 {
                    assert!(
                        ticks_to_micros_floor(tick - 1, hz) < micros,
                        "{hz} Hz: deadline {micros} µs -> tick {tick} is later than needed"
                    );
                }
            }
        }
    }

    #[test]
    fn now_never_reads_later_than_the_tick() {
        // 1 kHz: tick 3 is exactly 3 ms; 32.768 kHz: tick 1 is 30.517… µs -> 30.
        assert_eq!(ticks_to_micros_floor(3, 1_000), 3_000);
        assert_eq!(ticks_to_micros_floor(1, 32_768), 30);
        assert_eq!(ticks_to_micros_floor(32_768, 32_768), 1_000_000);
        assert_eq!(ticks_to_micros_floor(1_999, 1_000_000_000), 1);
    }

    #[test]
    fn conversions_saturate_instead_of_overflowing() {
        assert_eq!(micros_to_ticks_ceil(u64::MAX, 1_000_000_000), u64::MAX);
        assert_eq!(ticks_to_micros_floor(u64::MAX, 1_000), u64::MAX);
        assert_eq!(ticks_to_micros_floor(7, 0), u64::MAX);
        assert_eq!(
            to_embassy(Instant::MAX),
            embassy_time::Instant::from_ticks(u64::MAX)
        );
    }
}
