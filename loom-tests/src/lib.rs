//! Scaffolding shared by the loom models in `tests/`.
//!
//! Everything here exists only under `cfg(loom)`; without it this crate is empty.
//! Run the models with `scripts/loom.sh` (see `loom-tests/README.md`).
//!
//! The models drive the real [`leasehold::WriteGate`] through the public
//! [`leasehold::Lease`] API (the gate's publish methods are crate-private), with
//! fences and deadlines whose high *and* low 32-bit halves differ from term to term,
//! so a snapshot that mixes the halves of two publishes is always detectable.

#[cfg(loom)]
mod chain;
#[cfg(loom)]
mod driver;
#[cfg(loom)]
mod runner;

#[cfg(loom)]
pub use chain::*;
#[cfg(loom)]
pub use driver::*;
#[cfg(loom)]
pub use runner::*;
