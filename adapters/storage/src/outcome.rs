//! What a fenced write answers, the same for every store.

use leasehold::{Fence, StaleFence};

/// The answer to a fenced write: admitted, or refused because storage already admitted
/// a newer fence for the same resource.
///
/// A refusal is an answer, not an error: the writer lost its lease and a newer holder
/// wrote since. Stop writing and do not retry with the same fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a stale write was not stored: the caller must know"]
pub enum FencedWrite {
    /// Stored, and the fence is now the newest admitted for the resource. A fence
    /// equal to the newest is admitted (the same holder writes again).
    Written,
    /// Not stored: a newer fence was admitted before.
    Stale {
        /// The fence the writer presented.
        presented: Fence,
        /// The newest fence storage has admitted, newer than `presented`.
        newest: Fence,
    },
}

impl FencedWrite {
    /// Whether the write was stored.
    pub const fn is_written(&self) -> bool {
        matches!(self, FencedWrite::Written)
    }

    /// As a `Result`, with the core's [`StaleFence`] (what an in-memory
    /// [`FenceGate`](leasehold::FenceGate) answers), for `?`.
    pub const fn into_result(self) -> Result<(), StaleFence> {
        match self {
            FencedWrite::Written => Ok(()),
            FencedWrite::Stale { presented, newest } => Err(StaleFence { presented, newest }),
        }
    }
}

impl From<Result<(), StaleFence>> for FencedWrite {
    fn from(result: Result<(), StaleFence>) -> FencedWrite {
        match result {
            Ok(()) => FencedWrite::Written,
            Err(StaleFence { presented, newest }) => FencedWrite::Stale { presented, newest },
        }
    }
}

/// A stored value and the fence it was written with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fenced {
    /// The bytes written.
    pub value: Vec<u8>,
    /// The fence of the write that stored them: the newest admitted.
    pub fence: Fence,
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::FenceGate;

    #[test]
    fn converts_to_and_from_the_core_gate_answer() {
        let mut gate = FenceGate::new();
        assert_eq!(
            FencedWrite::from(gate.admit(Fence(5))),
            FencedWrite::Written
        );
        let stale = FencedWrite::from(gate.admit(Fence(4)));
        assert_eq!(
            stale,
            FencedWrite::Stale {
                presented: Fence(4),
                newest: Fence(5)
            }
        );
        assert!(!stale.is_written());
        assert_eq!(stale.into_result(), gate.admit(Fence(4)));
        assert_eq!(FencedWrite::Written.into_result(), Ok(()));
    }
}
