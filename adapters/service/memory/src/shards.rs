//! The keys, split over independent shards by a hash of the key's name, so that
//! leases on different keys (100k of them, on every worker thread) rarely wait for
//! each other's mutex. A request touches one key, so it locks one shard; faults live
//! apart ([`super::FaultState`]) and are skipped entirely while none is set.

use std::sync::{Mutex, MutexGuard, PoisonError};

use leasehold::{OwnerToken, Refusal};
use tokio::time::Instant;

use super::request::{Answer, Op};
use super::table::Table;

/// How many shards: enough that two worker threads rarely pick the same one at the
/// same moment, few enough that summing the statistics stays cheap.
const SHARDS: usize = 64;

/// One shard: its keys and what it did to them.
#[derive(Debug, Default)]
pub(crate) struct Shard {
    pub(crate) table: Table,
    pub(crate) acquires: u64,
    pub(crate) renewals: u64,
    pub(crate) releases: u64,
}

#[derive(Debug)]
pub(crate) struct Shards {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Shards {
    fn default() -> Shards {
        Shards {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Shards {
    /// The shard holding `key`, locked.
    pub(crate) fn of(&self, key: &str) -> MutexGuard<'_, Shard> {
        self.at(Shards::index(key))
    }

    /// The number of the shard holding `key`.
    pub(crate) fn index(key: &str) -> u8 {
        // SHARDS is a power of two: the low bits of the hash pick the shard.
        (fnv1a(key.as_bytes()) as usize & (SHARDS - 1)) as u8
    }

    /// Shard number `index` (from [`index`](Self::index)), locked.
    pub(crate) fn at(&self, index: u8) -> MutexGuard<'_, Shard> {
        lock(&self.shards[usize::from(index) & (SHARDS - 1)])
    }

    /// Every shard, one after the other (each locked only while it is looked at).
    pub(crate) fn each(&self) -> impl Iterator<Item = MutexGuard<'_, Shard>> {
        self.shards.iter().map(lock)
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Nothing panics under this lock; a poisoned one still holds plain values.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// FNV-1a, 64 bits: a fixed, fast hash of short names; the shard of a key is the same
/// in every run (no per-process seed needed: nothing outside the process picks keys to
/// collide on purpose, and a collision only means sharing a mutex).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Shard {
    /// Carries out `op` on `key` (which hashes to this shard) at `now`.
    pub(crate) fn apply(&mut self, key: &str, token: OwnerToken, op: Op, now: Instant) -> Answer {
        if leasehold::check_key(key).is_err() {
            return Answer::refused(&op, Refusal::InvalidKey);
        }
        match op {
            Op::Acquire(ttl, identity) => {
                self.acquires += 1;
                Answer::Acquire(self.table.acquire(key, token, identity, ttl, now))
            }
            Op::Holder => Answer::Holder(self.table.holder(key, now)),
            Op::Renew(fence, ttl) => {
                self.renewals += 1;
                Answer::Renew(self.table.renew(key, token, fence, ttl, now))
            }
            Op::Release => {
                self.releases += 1;
                Answer::Release(self.table.release(key, token, now))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_every_shard() {
        let shards = Shards::default();
        let mut used = [false; SHARDS];
        for i in 0..10_000 {
            let key = format!("key-{i}");
            let index = (fnv1a(key.as_bytes()) as usize) & (SHARDS - 1);
            used[index] = true;
        }
        assert!(used.iter().all(|&u| u), "some shard never used: {used:?}");
        assert_eq!(shards.each().count(), SHARDS);
        assert!(SHARDS.is_power_of_two());
    }
}
