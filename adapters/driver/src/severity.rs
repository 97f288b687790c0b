//! How loudly a lock service logs a request that failed: one policy for every backend,
//! so an operator reads the same levels whatever the service.

use leasehold::Indeterminate;

/// The level a service logs a failed request at ([`Severity::of_failure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Severity {
    /// A person has to act: the request can never succeed as sent (a final refusal:
    /// credentials, the key, the key's type, a server or schema that cannot hold
    /// leases), or the server gave an answer no lock service gives
    /// ([`Indeterminate::Protocol`]: the endpoint is not what the configuration says).
    Error,
    /// It may clear by itself, and the lease retries: a timeout, a dropped
    /// connection, a busy, read-only or failing-over server.
    Warning,
}

impl Severity {
    /// The level of a failed request that the lease sees as a final refusal
    /// (`refused`) or else as the unknown outcome `why`.
    pub const fn of_failure(refused: bool, why: Indeterminate) -> Severity {
        if refused || matches!(why, Indeterminate::Protocol) {
            Severity::Error
        } else {
            Severity::Warning
        }
    }
}

#[cfg(test)]
mod tests {
    use leasehold::Indeterminate;

    use super::Severity;

    #[test]
    fn refusals_and_answers_no_service_gives_need_a_person() {
        use Indeterminate::{Protocol, Service, Timeout, Transport};
        for why in [Timeout, Transport, Service, Protocol] {
            assert_eq!(Severity::of_failure(true, why), Severity::Error);
        }
        assert_eq!(Severity::of_failure(false, Protocol), Severity::Error);
        for why in [Timeout, Transport, Service] {
            assert_eq!(Severity::of_failure(false, why), Severity::Warning);
        }
    }
}
