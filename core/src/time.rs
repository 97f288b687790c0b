//! The core's own monotonic time: `u64` microseconds, no clock inside.
//!
//! The state machine never reads a clock. Every input carries an [`Instant`] the caller
//! took from a *monotonic* source (tokio's `Instant`, embassy's `Instant::as_micros()`,
//! a hardware timer). The origin is arbitrary and per process; only differences matter.
//!
//! All arithmetic is checked or saturating: nothing here can panic, whatever the input.
//! The `+`/`-` operators saturate (at [`Instant::MAX`], [`Duration::MAX`] or zero), which
//! is the conservative direction for every use in this crate: a saturated deadline is
//! only ever compared against, and `Instant::MAX` is 584,000 years away.

use core::fmt;
use core::num::NonZeroU16;
use core::ops::{Add, Sub};

const MICROS_PER_MILLI: u64 = 1_000;
const MICROS_PER_SEC: u64 = 1_000_000;

/// A point on the caller's monotonic clock, in microseconds since an arbitrary origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Instant {
    micros: u64,
}

/// A span of monotonic time, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Duration {
    micros: u64,
}

impl Instant {
    /// The origin of the clock.
    pub const ZERO: Instant = Instant { micros: 0 };
    /// The latest representable instant; used as "never".
    pub const MAX: Instant = Instant { micros: u64::MAX };

    /// An instant `micros` microseconds after the origin.
    pub const fn from_micros(micros: u64) -> Instant {
        Instant { micros }
    }

    /// An instant `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Instant {
        Instant {
            micros: millis.saturating_mul(MICROS_PER_MILLI),
        }
    }

    /// An instant `secs` seconds after the origin (saturating).
    pub const fn from_secs(secs: u64) -> Instant {
        Instant {
            micros: secs.saturating_mul(MICROS_PER_SEC),
        }
    }

    /// Microseconds since the origin.
    pub const fn as_micros(self) -> u64 {
        self.micros
    }

    /// Milliseconds since the origin, rounded down.
    pub const fn as_millis(self) -> u64 {
        self.micros / MICROS_PER_MILLI
    }

    /// `self + d`, or `None` if that is past [`Instant::MAX`].
    pub const fn checked_add(self, d: Duration) -> Option<Instant> {
        match self.micros.checked_add(d.micros) {
            Some(micros) => Some(Instant { micros }),
            None => None,
        }
    }

    /// `self - d`, or `None` if that is before the origin.
    pub const fn checked_sub(self, d: Duration) -> Option<Instant> {
        match self.micros.checked_sub(d.micros) {
            Some(micros) => Some(Instant { micros }),
            None => None,
        }
    }

    /// `self + d`, clamped to [`Instant::MAX`].
    pub const fn saturating_add(self, d: Duration) -> Instant {
        Instant {
            micros: saturating_add(self.micros, d.micros),
        }
    }

    /// `self - d`, clamped to the origin.
    pub const fn saturating_sub(self, d: Duration) -> Instant {
        Instant {
            micros: self.micros.saturating_sub(d.micros),
        }
    }

    /// Time from `earlier` to `self`, or `None` if `earlier` is later than `self`.
    pub const fn checked_duration_since(self, earlier: Instant) -> Option<Duration> {
        match self.micros.checked_sub(earlier.micros) {
            Some(micros) => Some(Duration { micros }),
            None => None,
        }
    }

    /// Time from `earlier` to `self`, or zero if `earlier` is later than `self`.
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration {
            micros: self.micros.saturating_sub(earlier.micros),
        }
    }
}

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration { micros: 0 };
    /// The longest representable span.
    pub const MAX: Duration = Duration { micros: u64::MAX };

    /// `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Duration {
        Duration { micros }
    }

    /// `millis` milliseconds (saturating).
    pub const fn from_millis(millis: u64) -> Duration {
        Duration {
            micros: millis.saturating_mul(MICROS_PER_MILLI),
        }
    }

    /// `secs` seconds (saturating).
    pub const fn from_secs(secs: u64) -> Duration {
        Duration {
            micros: secs.saturating_mul(MICROS_PER_SEC),
        }
    }

    /// The span in microseconds.
    pub const fn as_micros(self) -> u64 {
        self.micros
    }

    /// The span in milliseconds, rounded down.
    pub const fn as_millis(self) -> u64 {
        self.micros / MICROS_PER_MILLI
    }

    /// Whether this is the empty span.
    pub const fn is_zero(self) -> bool {
        self.micros == 0
    }

    /// `self + rhs`, or `None` on overflow.
    pub const fn checked_add(self, rhs: Duration) -> Option<Duration> {
        match self.micros.checked_add(rhs.micros) {
            Some(micros) => Some(Duration { micros }),
            None => None,
        }
    }

    /// `self - rhs`, or `None` if `rhs` is longer.
    pub const fn checked_sub(self, rhs: Duration) -> Option<Duration> {
        match self.micros.checked_sub(rhs.micros) {
            Some(micros) => Some(Duration { micros }),
            None => None,
        }
    }

    /// `self + rhs`, clamped to [`Duration::MAX`].
    pub const fn saturating_add(self, rhs: Duration) -> Duration {
        Duration {
            micros: saturating_add(self.micros, rhs.micros),
        }
    }

    /// `self - rhs`, clamped to zero.
    pub const fn saturating_sub(self, rhs: Duration) -> Duration {
        Duration {
            micros: self.micros.saturating_sub(rhs.micros),
        }
    }

    /// `self * n`, clamped to [`Duration::MAX`].
    pub const fn saturating_mul(self, n: u64) -> Duration {
        Duration {
            micros: self.micros.saturating_mul(n),
        }
    }

    /// `self / n`, rounded down; `None` when `n` is zero.
    pub const fn checked_div(self, n: u64) -> Option<Duration> {
        match self.micros.checked_div(n) {
            Some(micros) => Some(Duration { micros }),
            None => None,
        }
    }

    /// The share `ppm / 1_000_000` of this span, rounded *up*, saturating.
    ///
    /// Rounding up makes a clock-drift allowance never smaller than the exact value, so a
    /// deadline computed with it is never later than the exact one. Computed in two parts
    /// so that it needs no 128-bit arithmetic, and with 32-bit divisions only: on a
    /// 32-bit MCU a 64-bit division is a library routine of about 1 KiB of flash.
    pub const fn ppm_ceil(self, ppm: u32) -> Duration {
        let ppm = ppm as u64;
        let (secs, rem) = div_rem_million(self.micros);
        let whole = secs.saturating_mul(ppm);
        // `rem < 1e6` and `ppm < 2^32`, so the product fits in a u64.
        let (part, part_rem) = div_rem_million(rem.wrapping_mul(ppm));
        // `part < 2^32`: adding one cannot overflow.
        let part = if part_rem == 0 {
            part
        } else {
            part.wrapping_add(1)
        };
        Duration {
            micros: whole.saturating_add(part),
        }
    }
}

/// From the standard library's duration (`core::time::Duration`, the same type as
/// `std::time::Duration`), rounded down to whole microseconds and saturating at
/// [`Duration::MAX`]: the one conversion the adapters use.
impl From<core::time::Duration> for Duration {
    fn from(d: core::time::Duration) -> Duration {
        let micros = d.as_micros();
        Duration::from_micros(if micros > u64::MAX as u128 {
            u64::MAX
        } else {
            micros as u64
        })
    }
}

/// To the standard library's duration; exact.
impl From<Duration> for core::time::Duration {
    fn from(d: Duration) -> core::time::Duration {
        core::time::Duration::from_micros(d.as_micros())
    }
}

/// `a + b`, clamped to `u64::MAX`: what `Instant + Duration` and `Duration + Duration`
/// do.
///
/// Out of line: on a 32-bit MCU a saturating 64-bit add is a carry chain and two
/// conditional moves, and the lease computes a dozen deadlines with it.
#[inline(never)]
const fn saturating_add(a: u64, b: u64) -> u64 {
    a.saturating_add(b)
}

/// `(n / d, n % d)` for a divisor below 2^16, with 32-bit divisions only: a long
/// division over four 16-bit digits.
///
/// On a 32-bit microcontroller a 64-bit division links the compiler's routine, about
/// 1 KiB of flash; the core's clock arithmetic and the RESP client's number formatting
/// share this one instead.
///
/// ```
/// use core::num::NonZeroU16;
///
/// let ten = NonZeroU16::new(10).unwrap();
/// assert_eq!(leasehold::div_rem_u16(1_234, ten), (123, 4));
/// ```
pub const fn div_rem_u16(n: u64, d: NonZeroU16) -> (u64, u16) {
    let d = d.get() as u32;
    let mut rest_of_n = n;
    let mut quotient: u64 = 0;
    let mut rest: u32 = 0;
    let mut digits: u32 = 0;
    while digits < 4 {
        digits = digits.wrapping_add(1);
        // The digits high first, each by a constant shift: a 64-bit shift by a variable
        // amount is a library routine of its own on a 32-bit microcontroller.
        let digit = (rest_of_n >> 48) as u32;
        rest_of_n <<= 16;
        // `rest < d < 2^16`, so this fits in 32 bits.
        let partial = (rest << 16) | digit;
        // `d` came from a `NonZeroU16`: neither can divide by zero. (`u32 / NonZeroU32`
        // would say so in the type, but is not `const`.)
        #[allow(clippy::arithmetic_side_effects)]
        {
            quotient = (quotient << 16) | (partial / d) as u64;
            rest = partial % d;
        }
    }
    (quotient, rest as u16)
}

/// `(x / 1_000_000, x % 1_000_000)`, exactly: `1_000_000 = 64 × 15_625`, so
/// `x = 1_000_000 q + (64 r + x mod 64)` where `(q, r)` divides `x / 64` by 15,625.
const fn div_rem_million(x: u64) -> (u64, u64) {
    const DIVISOR: NonZeroU16 = match NonZeroU16::new(15_625) {
        Some(d) => d,
        None => NonZeroU16::MIN,
    };
    let (quotient, rem) = div_rem_u16(x >> 6, DIVISOR);
    (quotient, (rem as u64).wrapping_mul(64) | (x & 63))
}

/// Saturates at [`Instant::MAX`]: never panics.
impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

/// Saturates at the origin: never panics.
impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        self.saturating_sub(rhs)
    }
}

/// Saturates at zero (an earlier minus a later instant is zero): never panics.
impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

/// Saturates at [`Duration::MAX`]: never panics.
impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        self.saturating_add(rhs)
    }
}

/// Saturates at zero: never panics.
impl Sub for Duration {
    type Output = Duration;
    fn sub(self, rhs: Duration) -> Duration {
        self.saturating_sub(rhs)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ms, us) = (
            self.micros / MICROS_PER_MILLI,
            self.micros % MICROS_PER_MILLI,
        );
        if us == 0 {
            write!(f, "{ms}ms")
        } else {
            write!(f, "{ms}.{us:03}ms")
        }
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{}", Duration::from_micros(self.micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_saturate_instead_of_overflowing() {
        assert_eq!(Duration::from_secs(u64::MAX), Duration::MAX);
        assert_eq!(Instant::from_millis(u64::MAX), Instant::MAX);
        assert_eq!(Duration::from_millis(3).as_micros(), 3_000);
    }

    #[test]
    fn operators_saturate() {
        assert_eq!(Instant::MAX + Duration::from_micros(1), Instant::MAX);
        assert_eq!(Instant::ZERO - Duration::from_micros(1), Instant::ZERO);
        assert_eq!(Instant::ZERO - Instant::MAX, Duration::ZERO);
        assert_eq!(Duration::MAX + Duration::MAX, Duration::MAX);
        assert_eq!(
            Instant::from_micros(5).checked_duration_since(Instant::from_micros(6)),
            None
        );
    }

    #[test]
    fn ppm_rounds_up_and_never_overflows() {
        // 1,000 ppm of 1 s is exactly 1 ms.
        assert_eq!(
            Duration::from_secs(1).ppm_ceil(1_000),
            Duration::from_millis(1)
        );
        // 1 ppm of 1 µs rounds up to a whole microsecond.
        assert_eq!(
            Duration::from_micros(1).ppm_ceil(1),
            Duration::from_micros(1)
        );
        assert_eq!(Duration::from_micros(7).ppm_ceil(0), Duration::ZERO);
        assert!(Duration::MAX.ppm_ceil(u32::MAX) == Duration::MAX);
        // Exact for a value with both parts.
        let d = Duration::from_micros(2_500_000); // 2.5 s
        assert_eq!(d.ppm_ceil(400_000), Duration::from_micros(1_000_000));
    }

    #[test]
    fn small_division_is_exact_without_64_bit_division() {
        for n in [
            0,
            1,
            9,
            10,
            999,
            1_000,
            65_535,
            65_536,
            1 << 40,
            u64::MAX - 1,
            u64::MAX,
        ] {
            for d in [1u16, 3, 10, 1_000, 15_625, u16::MAX] {
                let divisor = NonZeroU16::new(d).unwrap();
                let exact = (n / u64::from(d), (n % u64::from(d)) as u16);
                assert_eq!(div_rem_u16(n, divisor), exact, "{n} / {d}");
            }
        }
    }

    #[test]
    fn million_division_is_exact_without_64_bit_division() {
        let edges = [0, 1, 63, 64, 999_999, 1_000_000, 1_000_001, 15_625 * 64 - 1];
        let powers = (0..64).map(|b| 1u64 << b);
        let near_powers = (1..64).map(|b| (1u64 << b) - 1);
        let spread = (0..10_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for x in edges
            .into_iter()
            .chain(powers)
            .chain(near_powers)
            .chain(spread)
        {
            assert_eq!(div_rem_million(x), (x / 1_000_000, x % 1_000_000), "{x}");
        }
        assert_eq!(
            div_rem_million(u64::MAX),
            (u64::MAX / 1_000_000, u64::MAX % 1_000_000)
        );
    }

    #[test]
    fn ppm_ceil_is_the_exact_ceiling() {
        let spans = (0..2_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (i % 64));
        for (i, micros) in spans.enumerate() {
            let ppm = (i as u32).wrapping_mul(2_654_435_761);
            for ppm in [ppm, 0, 1, 999_999, 1_000_000, u32::MAX] {
                let exact = (u128::from(micros) * u128::from(ppm)).div_ceil(1_000_000);
                let expected = u64::try_from(exact).unwrap_or(u64::MAX);
                assert_eq!(
                    Duration::from_micros(micros).ppm_ceil(ppm).as_micros(),
                    expected,
                    "{micros} µs × {ppm} ppm"
                );
            }
        }
    }

    #[test]
    fn converts_to_and_from_the_standard_duration() {
        let std_ms = core::time::Duration::from_millis(1_500);
        assert_eq!(Duration::from(std_ms), Duration::from_millis(1_500));
        assert_eq!(
            core::time::Duration::from(Duration::from_millis(1_500)),
            std_ms
        );
        // Rounded down to microseconds; saturating.
        assert_eq!(
            Duration::from(core::time::Duration::from_nanos(1_999)),
            Duration::from_micros(1)
        );
        assert_eq!(Duration::from(core::time::Duration::MAX), Duration::MAX);
    }

    #[test]
    fn display_is_readable() {
        extern crate std;
        use std::string::ToString;
        assert_eq!(Duration::from_millis(200).to_string(), "200ms");
        assert_eq!(Duration::from_micros(1_500).to_string(), "1.500ms");
        assert_eq!(Instant::from_millis(7).to_string(), "t+7ms");
    }
}
