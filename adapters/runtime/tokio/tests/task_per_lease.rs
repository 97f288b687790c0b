//! The lease rules and the handle's promises, each lease driven by a task of its own
//! (`leasehold_tokio::acquire`).

mod common;
mod handles;
mod rules;

mod shape {
    pub use leasehold_tokio::{acquire, acquire_with, try_acquire};
}
