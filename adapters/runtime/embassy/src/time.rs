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
//! Both conversions saturate and never panic. They work in the reduced ratio
//! `1e6 / gcd : TICK_HZ / gcd` (1000 : 1 at 1 kHz, 15625 : 512 at 32.768 kHz), split the
//! value by the divisor so that no product overflows `u64`, and divide with 32-bit
//! operations when the divisor is below 2^16 (every common tick rate): on a 32-bit MCU
//! a 64-bit division is a library routine of about 1 KiB of flash.

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

/// `(micros, ticks)` per second, reduced by their greatest common divisor.
const RATIO: Ratio = Ratio::of(TICK_HZ);

/// An embassy-time instant as a leasehold [`Instant`]: whole microseconds since boot,
/// rounded down, saturating.
pub const fn from_embassy(instant: embassy_time::Instant) -> Instant {
    Instant::from_micros(RATIO.ticks_to_micros_floor(instant.as_ticks()))
}

/// A leasehold [`Instant`] as the first embassy-time tick at or after it (rounded up),
/// saturating at [`embassy_time::Instant::MAX`].
pub const fn to_embassy(instant: Instant) -> embassy_time::Instant {
    embassy_time::Instant::from_ticks(RATIO.micros_to_ticks_ceil(instant.as_micros()))
}

/// `micros : ticks` in lowest terms; both non-zero.
#[derive(Clone, Copy)]
struct Ratio {
    micros: u64,
    ticks: u64,
}

impl Ratio {
    /// The ratio for `hz` ticks per second (a zero `hz` is treated as 1 Hz).
    const fn of(hz: u64) -> Ratio {
        let hz = if hz == 0 { 1 } else { hz };
        let (mut a, mut b) = (MICROS_PER_SEC, hz);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        Ratio {
            micros: MICROS_PER_SEC / a,
            ticks: hz / a,
        }
    }

    /// `floor(ticks * micros / ticks_per)`, saturating.
    const fn ticks_to_micros_floor(self, ticks: u64) -> u64 {
        let (whole, rem) = div_rem(ticks, self.ticks);
        // `rem < self.ticks`, so `rem * self.micros < 1e6 * TICK_HZ`: no overflow.
        let (part, _) = div_rem(rem.wrapping_mul(self.micros), self.ticks);
        whole.saturating_mul(self.micros).saturating_add(part)
    }

    /// `ceil(micros * ticks_per / micros_per)`, saturating.
    const fn micros_to_ticks_ceil(self, micros: u64) -> u64 {
        let (whole, rem) = div_rem(micros, self.micros);
        let (part, part_rem) = div_rem(rem.wrapping_mul(self.ticks), self.micros);
        let part = if part_rem == 0 {
            part
        } else {
            part.saturating_add(1)
        };
        whole.saturating_mul(self.ticks).saturating_add(part)
    }
}

/// `(x / d, x % d)` for `d > 0`; with 32-bit divisions only when `d < 2^16` (16-bit
/// digits: every partial dividend stays below `2^32`). `d` is a constant in firmware,
/// so the branch folds away.
const fn div_rem(x: u64, d: u64) -> (u64, u64) {
    if d == 0 {
        return (u64::MAX, 0);
    }
    if d >= 1 << 16 {
        return (x / d, x % d);
    }
    let divisor = d as u32;
    let (mut quotient, mut rem, mut shift) = (0u64, 0u32, 64u32);
    while shift > 0 {
        shift -= 16;
        let partial = (rem << 16) | ((x >> shift) & 0xffff) as u32;
        quotient = (quotient << 16) | (partial / divisor) as u64;
        rem = partial % divisor;
    }
    (quotient, rem as u64)
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
                let ratio = Ratio::of(hz);
                let tick = ratio.micros_to_ticks_ceil(micros);
                assert!(
                    ratio.ticks_to_micros_floor(tick) >= micros,
                    "{hz} Hz: deadline {micros} µs -> tick {tick} reads back earlier"
                );
                // And it is the *first* such tick: one tick earlier is still before it.
                if tick > 0 {
                    assert!(
                        ratio.ticks_to_micros_floor(tick - 1) < micros,
                        "{hz} Hz: deadline {micros} µs -> tick {tick} is later than needed"
                    );
                }
            }
        }
    }

    #[test]
    fn now_never_reads_later_than_the_tick() {
        // 1 kHz: tick 3 is exactly 3 ms; 32.768 kHz: tick 1 is 30.517… µs -> 30.
        let floor = |ticks, hz| Ratio::of(hz).ticks_to_micros_floor(ticks);
        assert_eq!(floor(3, 1_000), 3_000);
        assert_eq!(floor(1, 32_768), 30);
        assert_eq!(floor(32_768, 32_768), 1_000_000);
        assert_eq!(floor(1_999, 1_000_000_000), 1);
    }

    #[test]
    fn small_divisor_division_is_exact() {
        for d in [1, 3, 512, 1_000, 15_625, 65_535, 65_536, 1_000_000] {
            for x in [
                0,
                1,
                d - 1,
                d,
                u64::MAX,
                u64::MAX / 3,
                0x1234_5678_9abc_def0,
            ] {
                assert_eq!(div_rem(x, d), (x / d, x % d), "{x} / {d}");
            }
        }
    }

    #[test]
    fn conversions_saturate_instead_of_overflowing() {
        assert_eq!(
            Ratio::of(1_000_000_000).micros_to_ticks_ceil(u64::MAX),
            u64::MAX
        );
        assert_eq!(Ratio::of(1_000).ticks_to_micros_floor(u64::MAX), u64::MAX);
        // Exact where nothing saturates, at a rate that divides nothing evenly.
        let ratio = Ratio::of(32_768);
        for ticks in [1_234_567_890_123u64, u64::MAX / 15_625] {
            let exact = u128::from(ticks) * 1_000_000 / 32_768;
            assert_eq!(u128::from(ratio.ticks_to_micros_floor(ticks)), exact);
        }
        assert_eq!(
            to_embassy(Instant::MAX),
            embassy_time::Instant::from_ticks(u64::MAX)
        );
    }
}
