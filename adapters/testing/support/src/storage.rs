//! The protected resource of a lock: storage that admits writes by fence.

use std::sync::{Arc, Mutex, MutexGuard};

use leasehold::{Fence, FenceGate, StaleFence};

/// Storage guarded by a [`FenceGate`], recording every write: what the resource a
/// lock protects does, so a test can check that no stale holder's write got in.
///
/// Clones share the storage (hand one to each contender).
#[derive(Clone, Debug, Default)]
pub struct Storage {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    gate: FenceGate,
    log: Vec<(Fence, bool)>,
    admitted: u64,
}

impl Storage {
    /// Storage that has already admitted `fence` (persisted before a restart).
    pub fn starting_at(fence: Fence) -> Storage {
        let storage = Storage::default();
        storage.lock().gate = FenceGate::starting_at(fence);
        storage
    }

    /// A write with `fence`: admitted (the number of admitted writes so far) unless
    /// a newer fence was admitted before.
    pub fn write(&self, fence: Fence) -> Result<u64, StaleFence> {
        let mut inner = self.lock();
        let result = inner.gate.admit(fence);
        inner.log.push((fence, result.is_ok()));
        result?;
        inner.admitted += 1;
        Ok(inner.admitted)
    }

    /// The newest fence admitted.
    pub fn newest(&self) -> Option<Fence> {
        self.lock().gate.newest()
    }

    /// Every write so far: its fence and whether it was admitted.
    pub fn log(&self) -> Vec<(Fence, bool)> {
        self.lock().log.clone()
    }

    /// Panics if a write was admitted after a write with a newer fence.
    pub fn assert_no_stale_admitted(&self) {
        let mut newest: Option<Fence> = None;
        for (fence, admitted) in self.log() {
            if admitted {
                assert!(
                    newest.is_none_or(|n| fence >= n),
                    "{fence} admitted after {newest:?}"
                );
                newest = Some(fence);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_writes_are_refused_and_logged() {
        let storage = Storage::default();
        let shared = storage.clone();
        assert_eq!(storage.write(Fence(3)), Ok(1));
        assert_eq!(shared.write(Fence(5)), Ok(2));
        assert!(storage.write(Fence(3)).is_err());
        assert_eq!(storage.newest(), Some(Fence(5)));
        assert_eq!(
            storage.log(),
            vec![(Fence(3), true), (Fence(5), true), (Fence(3), false)]
        );
        storage.assert_no_stale_admitted();
        assert!(Storage::starting_at(Fence(9)).write(Fence(8)).is_err());
    }
}
