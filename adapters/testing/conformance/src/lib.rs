//! The lock-service contract, written once: one async function per clause of the
//! [`LocalLockService`] doc, which every backend runs against a real server.
//!
//! ```
//! use leasehold::Duration;
//! use leasehold_conformance::{run_all, Capabilities};
//! use leasehold_tokio::memory::MemoryService;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // A backend's test starts its real server and connects instead (see the README).
//! let service = MemoryService::new();
//! run_all(&service, &Capabilities::new(Duration::from_secs(1))).await;
//! # }
//! ```
//!
//! Each clause works on keys of its own (a per-process random prefix, then the
//! clause's name), so clauses never interfere, also with other runs on the same
//! server. Each returns a [`Violation`] naming the clause and what differed; every
//! call is bounded by [`Capabilities::request_timeout`], so a hang is a violation too.
//! Waiting out a TTL uses `tokio::time::sleep`: real time on a real server, no time on
//! tokio's paused clock.
//!
//! The clauses take any [`LocalLockService`], so every `LockService` (through the
//! blanket impl) and single-threaded services run them alike. Why each clause matters
//! to a lease is in [`leasehold::rules`] ("The service contract").

#![warn(missing_docs)]

pub mod breach;
mod caps;
mod clauses;
mod ctx;

pub use caps::Capabilities;
pub use clauses::abandon::abandoned_requests_leave_nothing_behind;
pub use clauses::expiry::{
    renew_never_recreates_an_expired_key, renewals_and_reacquires_extend_the_expiry,
    the_ttl_is_hard,
};
pub use clauses::grant::{
    another_token_is_told_who_holds_the_key, fences_increase_across_releases,
    grant_on_a_free_key_reports_ttl_and_fence, grants_are_a_function_of_the_ttl_asked,
    same_token_reacquire_keeps_the_fence,
};
pub use clauses::names::{
    identities_round_trip, invalid_keys_are_refused, keys_that_share_a_prefix_are_separate,
    odd_but_valid_keys_work_end_to_end,
};
pub use clauses::quarantine::a_lost_state_grants_nothing_until_the_quarantine_ends;
pub use clauses::release::{
    a_late_release_never_frees_the_next_holders_grant,
    a_release_whose_first_tries_are_lost_frees_the_key, holder_reports_and_changes_nothing,
    release_by_another_token_is_not_owner, release_by_the_holder_frees_the_key,
};
pub use clauses::renew::{
    a_renewal_holds_for_the_ttl_it_reports, a_renewal_replaces_the_expiry,
    renew_by_another_token_is_not_owner, renew_by_the_holder_applies_at_least_the_ttl_asked,
    renew_never_recreates_a_released_key, renew_with_another_fence_is_not_owner,
};
pub use clauses::watch::{
    holder_changed_fires_on_every_change, revoked_fires_only_when_the_grant_is_gone,
};
pub use ctx::{Verdict, Violation};

use leasehold_driver::LocalLockService;

/// Calls `$m!` with every clause, in the order [`check_all`] runs them.
macro_rules! with_every_clause {
    ($m:ident) => {
        $m!(
            grant_on_a_free_key_reports_ttl_and_fence,
            same_token_reacquire_keeps_the_fence,
            grants_are_a_function_of_the_ttl_asked,
            another_token_is_told_who_holds_the_key,
            fences_increase_across_releases,
            renew_by_the_holder_applies_at_least_the_ttl_asked,
            renew_with_another_fence_is_not_owner,
            renew_by_another_token_is_not_owner,
            renew_never_recreates_a_released_key,
            release_by_another_token_is_not_owner,
            release_by_the_holder_frees_the_key,
            a_late_release_never_frees_the_next_holders_grant,
            a_release_whose_first_tries_are_lost_frees_the_key,
            holder_reports_and_changes_nothing,
            invalid_keys_are_refused,
            odd_but_valid_keys_work_end_to_end,
            keys_that_share_a_prefix_are_separate,
            identities_round_trip,
            revoked_fires_only_when_the_grant_is_gone,
            holder_changed_fires_on_every_change,
            abandoned_requests_leave_nothing_behind,
            the_ttl_is_hard,
            renewals_and_reacquires_extend_the_expiry,
            renew_never_recreates_an_expired_key,
            a_renewal_replaces_the_expiry,
            a_renewal_holds_for_the_ttl_it_reports,
        )
    };
}

macro_rules! names {
    ($($clause:ident),* $(,)?) => {
        &[$(stringify!($clause)),*]
    };
}

/// The name of every clause, in the order [`check_all`] runs them (each is also the
/// name of its function).
pub const CLAUSES: &[&str] = with_every_clause!(names);

/// Runs every clause, one after the other; the violations, empty if `s` keeps the
/// contract.
///
/// # Panics
///
/// When `caps` do not fit together ([`Capabilities::check`]).
pub async fn check_all<S: LocalLockService>(s: &S, caps: &Capabilities) -> Vec<Violation> {
    if let Err(why) = caps.check() {
        panic!("leasehold conformance: invalid capabilities: {why}");
    }
    let mut violations = Vec::new();
    // Each clause boxed: inline, the clauses' futures made this one so large that
    // polling it overflowed a test thread's stack (etcd's, unoptimised).
    macro_rules! run {
        ($($clause:ident),* $(,)?) => {
            $(
                if let Err(violation) = Box::pin($clause(s, caps)).await {
                    violations.push(violation);
                }
            )*
        };
    }
    with_every_clause!(run);
    violations
}

/// Runs every clause and panics listing each one `s` breaks (clause name and what
/// differed).
///
/// # Panics
///
/// When a clause fails, or `caps` do not fit together.
pub async fn run_all<S: LocalLockService>(s: &S, caps: &Capabilities) {
    let violations = check_all(s, caps).await;
    if !violations.is_empty() {
        let list: Vec<String> = violations.iter().map(|v| format!("  - {v}")).collect();
        panic!(
            "leasehold conformance: {} of {} clauses broken:\n{}",
            violations.len(),
            CLAUSES.len(),
            list.join("\n")
        );
    }
}
