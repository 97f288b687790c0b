//! Helpers shared by the examples: a readable timeline and a toy storage.
//!
//! Every line reads `[  1234 ms] who       what happened`, milliseconds since the
//! example started.

use std::fmt::Display;

use leasehold::{Fence, FenceGate, Identity, Owner, StaleFence};
use leasehold_tokio::AcquireOptions;

/// Acquire options for the contender called `name` (one letter): a fixed owner token
/// (so the retry jitter, seeded from the owner, and with it the whole timeline, is
/// the same on every run) and `name` as the holder identity.
pub fn contender(name: &str) -> AcquireOptions {
    let mut owner = [0u8; 16];
    for (slot, byte) in owner.iter_mut().zip(name.bytes().chain(*b"-example-owner")) {
        *slot = byte;
    }
    AcquireOptions::new()
        .owner(Owner(owner))
        .identity(Identity::new(name).expect("a short printable name"))
}

/// Prints one timeline line.
pub fn line(ms: u128, who: &str, what: impl Display) {
    println!("[{ms:>6} ms] {who:<8} {what}");
}

/// A timeline on tokio's clock (virtual when the runtime starts paused).
#[derive(Clone, Copy, Debug)]
pub struct Timeline {
    start: tokio::time::Instant,
}

impl Timeline {
    /// Starts the timeline now.
    pub fn start() -> Timeline {
        Timeline {
            start: tokio::time::Instant::now(),
        }
    }

    /// Milliseconds since the start.
    pub fn ms(&self) -> u128 {
        self.ms_at(tokio::time::Instant::now())
    }

    /// Milliseconds from the start to `at`.
    pub fn ms_at(&self, at: tokio::time::Instant) -> u128 {
        at.saturating_duration_since(self.start).as_millis()
    }

    /// The instant `ms` after the start.
    pub fn at(&self, ms: u64) -> tokio::time::Instant {
        self.start + std::time::Duration::from_millis(ms)
    }

    /// Sleeps until `ms` after the start.
    pub async fn until(&self, ms: u64) {
        tokio::time::sleep_until(self.at(ms)).await;
    }

    /// Prints a line stamped with the current time.
    pub fn log(&self, who: &str, what: impl Display) {
        line(self.ms(), who, what);
    }
}

/// A single-threaded runtime on tokio's paused clock: time jumps straight to the next
/// timer when every task waits, so an example of seconds runs instantly and prints the
/// same timeline every time.
pub fn virtual_time_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// A toy storage: a list of writes behind a [`FenceGate`], which rejects any write
/// whose fence is older than the newest one it has admitted.
#[derive(Debug, Default)]
pub struct Storage {
    gate: FenceGate,
    writes: Vec<(Fence, String)>,
}

impl Storage {
    /// Writes `value` if `fence` is not stale.
    pub fn write(&mut self, fence: Fence, value: impl Into<String>) -> Result<(), StaleFence> {
        self.gate.admit(fence)?;
        self.writes.push((fence, value.into()));
        Ok(())
    }

    /// Writes `value` and describes the outcome for the timeline.
    pub fn write_and_say(&mut self, fence: Fence, value: impl Into<String>) -> String {
        match self.write(fence, value) {
            Ok(()) => format!("fence {} -> accepted", fence.0),
            Err(stale) => format!("fence {} -> REJECTED: {stale}", fence.0),
        }
    }

    /// How many writes were admitted.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}
