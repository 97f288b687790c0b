//! The deadlines of one driver's leases: a radix heap, with a small binary heap for
//! deadlines earlier than its minimum.
//!
//! A radix heap serves a queue whose pops come in time order: a push is an append
//! to one of 65 buckets, chosen by the highest bit in which the deadline differs from
//! `last` (the minimum, once found); the minimum is taken from bucket 0, and when that
//! is empty the lowest non-empty bucket is spread over the buckets below it. An entry
//! moves down at most once per bit, each move a sequential copy, where a binary heap
//! of a hundred thousand leases misses the cache at each of its 17 levels on every pop
//! (measured: a third of a `LeaseSet`'s CPU at 100,000 leases).
//!
//! A radix heap cannot hold a key below `last`, and a driver does push such keys: a
//! request's timeout can fall before every other lease's next deadline, and a
//! deadline can already be past. Those go to `early`, a binary heap that holds only
//! deadlines earlier than the radix heap's minimum, so it stays small when a driver
//! has many leases (theirs are spread over the coming seconds).
//!
//! Entries are not removed when a lease's deadline changes: the driver pushes the new
//! one and skips the old when it comes out (its lease's deadline is no longer it).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use leasehold::Instant;

/// One bucket per bit of a µs deadline, and bucket 0 for "equal to `last`".
const BUCKETS: usize = 65;

/// A bucket emptied by a refill keeps its allocation up to this many entries.
const KEEP: usize = 1_024;

/// A full bucket grows by this fraction of its entries (at least [`KEEP`]), not by
/// doubling: the bucket that holds the coming second's deadlines holds one entry per
/// lease, and doubling left up to half of it empty (16 B per lease at 100k leases).
/// Growing by an eighth copies each entry eight times over on average, a few
/// nanoseconds per push, where a large bucket's `realloc` usually copies nothing.
const GROWTH: usize = 8;

/// One entry: a deadline (µs) and its lease's slot, 12 bytes (a tuple would be 16:
/// two per lease, a hundred thousand leases).
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Timer {
    at: u64,
    slot: u32,
}

/// A min-queue of `(deadline, slot)`.
pub(super) struct Timers {
    buckets: [Vec<Timer>; BUCKETS],
    /// Every entry in `buckets` is at or after it; bucket 0 holds those equal to it.
    last: u64,
    /// Entries pushed below `last`.
    early: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            buckets: std::array::from_fn(|_| Vec::new()),
            last: 0,
            early: BinaryHeap::new(),
        }
    }
}

/// The bucket of `at` relative to `last` (`at >= last`): 0 when equal, else one
/// more than the index of the highest differing bit.
fn bucket(at: u64, last: u64) -> usize {
    (u64::BITS - (at ^ last).leading_zeros()) as usize
}

impl Timers {
    /// Adds `slot`'s deadline.
    pub(super) fn push(&mut self, at: Instant, slot: u32) {
        let at = at.as_micros();
        if at < self.last {
            self.early.push(Reverse((at, slot)));
        } else if let Some(bucket) = self.buckets.get_mut(bucket(at, self.last)) {
            append(bucket, Timer { at, slot });
        }
    }

    /// The earliest deadline, if any.
    pub(super) fn peek(&mut self) -> Option<Instant> {
        let radix = self.radix_min();
        let early = self.early.peek().map(|entry| entry.0 .0);
        // `early` holds only deadlines below the radix heap's minimum.
        early.or(radix).map(Instant::from_micros)
    }

    /// Takes an entry whose deadline is at or before `now`, earliest first.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(Instant, u32)> {
        let now = now.as_micros();
        if let Some(&Reverse((at, slot))) = self.early.peek() {
            if at > now {
                return None;
            }
            self.early.pop();
            return Some((Instant::from_micros(at), slot));
        }
        if self.radix_min()? > now {
            return None;
        }
        let Timer { at, slot } = self.buckets[0].pop()?;
        Some((Instant::from_micros(at), slot))
    }

    /// The radix heap's minimum (then in bucket 0, and `last`), if it has entries.
    fn radix_min(&mut self) -> Option<u64> {
        if self.buckets[0].is_empty() && !self.refill() {
            return None;
        }
        Some(self.last)
    }

    /// Makes the radix heap's minimum the new `last` and spreads its bucket over the
    /// buckets below (each entry lands strictly lower); false when empty.
    fn refill(&mut self) -> bool {
        let Some(index) = (1..BUCKETS).find(|&i| !self.buckets[i].is_empty()) else {
            return false;
        };
        let mut entries = std::mem::take(&mut self.buckets[index]);
        let Some(min) = entries.iter().map(|timer| timer.at).min() else {
            return false;
        };
        self.last = min;
        for timer in entries.drain(..) {
            if let Some(bucket) = self.buckets.get_mut(bucket(timer.at, min)) {
                append(bucket, timer);
            }
        }
        // Keep a small allocation for the next time this bucket fills; a large one
        // would sit idle beside the copies its entries now live in.
        if entries.capacity() <= KEEP {
            self.buckets[index] = entries;
        }
        true
    }
}

/// Appends `timer` to `bucket`, growing it by [`GROWTH`].
fn append(bucket: &mut Vec<Timer>, timer: Timer) {
    if bucket.len() == bucket.capacity() {
        bucket.reserve_exact((bucket.len() / GROWTH).max(KEEP));
    }
    bucket.push(timer);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A small deterministic generator (xorshift), so a failure replays.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Against a model (a map): random pushes (some already past, some before every
    /// other entry, some far away, `Instant::MAX` among them), peeks, and drains at a
    /// clock that moves forward. Each drain yields exactly the entries due, earliest
    /// first, each with its own deadline; `peek` is always the earliest deadline.
    #[test]
    fn pops_every_due_entry_and_only_those_in_order() {
        for seed in 1..300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut timers = Timers::default();
            let mut model: HashMap<u32, u64> = HashMap::new();
            let mut now = 0u64;
            for slot in 0..2_000u32 {
                match rng.next() % 4 {
                    0 | 1 => {
                        let at = match rng.next() % 8 {
                            0 => now.saturating_sub(rng.next() % 1_000),
                            1 => u64::MAX,
                            2 => now,
                            3 => now + rng.next() % 1_000,
                            _ => now + rng.next() % 5_000_000,
                        };
                        timers.push(Instant::from_micros(at), slot);
                        model.insert(slot, at);
                    }
                    2 => now += rng.next() % 100_000,
                    _ => {
                        let mut popped = Vec::new();
                        while let Some((at, slot)) = timers.pop_due(Instant::from_micros(now)) {
                            let pushed = model.remove(&slot).expect("popped twice");
                            assert_eq!(at.as_micros(), pushed, "seed {seed}");
                            assert!(pushed <= now, "seed {seed}: not due");
                            popped.push(pushed);
                        }
                        assert!(popped.is_sorted(), "seed {seed}: {popped:?}");
                        assert!(
                            model.values().all(|&at| at > now),
                            "seed {seed}: a due entry stayed"
                        );
                    }
                }
                // Peeking between pushes moves the radix heap's minimum up: later
                // pushes below it must still come out first.
                let peek = timers.peek().map(Instant::as_micros);
                assert_eq!(peek, model.values().copied().min(), "seed {seed}");
            }
        }
    }

    /// A hundred thousand leases renewed within the coming second: their bucket is at
    /// most an eighth empty, where a doubling `Vec` would be up to half empty.
    #[test]
    fn a_bucket_of_a_second_of_deadlines_is_at_most_an_eighth_empty() {
        let mut timers = Timers::default();
        let leases = 100_000;
        for slot in 0..leases {
            // Spread over one second, from 1 s on (one bucket: bit 20 of the µs).
            timers.push(Instant::from_micros(1 << 20 | u64::from(slot)), slot);
        }
        let held: usize = timers.buckets.iter().map(Vec::capacity).sum();
        let at_most = leases as usize + leases as usize / GROWTH + KEEP;
        assert!(held <= at_most, "{held} entries held for {leases}");
    }

    /// What a driver does: peeks to set its timer at the next renewal (300), then a
    /// request goes out whose timeout (190) comes first.
    #[test]
    fn a_deadline_pushed_below_the_minimum_comes_out_first() {
        let (t100, t190, t300) = (
            Instant::from_micros(100),
            Instant::from_micros(190),
            Instant::from_micros(300),
        );
        let mut timers = Timers::default();
        timers.push(t300, 1);
        assert_eq!(timers.peek(), Some(t300));
        timers.push(t190, 2);
        assert_eq!(timers.peek(), Some(t190));
        timers.push(t100, 3);
        assert_eq!(timers.pop_due(Instant::from_micros(99)), None);
        assert_eq!(timers.pop_due(Instant::MAX), Some((t100, 3)));
        assert_eq!(timers.pop_due(Instant::MAX), Some((t190, 2)));
        assert_eq!(timers.pop_due(Instant::MAX), Some((t300, 1)));
        assert_eq!(timers.pop_due(Instant::MAX), None);
        assert_eq!(timers.peek(), None);
    }
}
