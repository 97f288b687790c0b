//! The clauses, grouped by the part of the contract they check.

pub mod abandon;
pub mod expiry;
pub mod grant;
pub mod names;
pub mod quarantine;
pub mod release;
pub mod renew;
pub mod watch;
