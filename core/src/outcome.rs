//! The vocabulary between the state machine and a lock service: who asks, what came
//! back, and why a lease ended.

use core::fmt;

use crate::{Duration, Fence, Holder};

/// Identifies one request the state machine asked its driver to send.
///
/// Ids only grow for the life of a [`Lease`](crate::Lease) (across terms), so an answer
/// that carries an old id is recognisably stale. They are unique within one lease,
/// not across leases (every lease's first request is term 1, sequence 1): a driver of
/// several leases keys answers by (lease, id).
///
/// ```
/// use leasehold::{RequestId, Term};
///
/// let id = RequestId::new(Term(3), 7);
/// assert_eq!((id.term(), id.sequence()), (Term(3), 7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RequestId(pub u64);

impl RequestId {
    /// The id of the `sequence`th request of `term`: the term in the high 32 bits, the
    /// sequence in the low 32.
    pub const fn new(term: Term, sequence: u32) -> RequestId {
        RequestId(((term.0 as u64) << 32) | sequence as u64)
    }

    /// The term the request belongs to.
    pub const fn term(self) -> Term {
        Term((self.0 >> 32) as u32)
    }

    /// The request's number within its term, from 1 (the term's first acquire).
    pub const fn sequence(self) -> u32 {
        self.0 as u32
    }
}

/// One acquisition of the lease, from grant to loss or release.
///
/// A new acquire starts a new term with a new fence; a term never comes back once it
/// ended, so "lost" is final within a term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Term(pub u32);

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The 128-bit identity a client presents to the lock service.
///
/// Random where an RNG exists (the adapters do that); supplied by the caller on bare
/// metal, e.g. from a device serial number. It must differ between clients contending
/// for the same key. The value stored at the service is an [`OwnerToken`]: this owner
/// *and* the term, so that a late release from an old term can never delete the
/// caller's own newer grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Owner(pub [u8; 16]);

/// What the lock service stores as the holder of a key: owner plus term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct OwnerToken {
    /// The client.
    pub owner: Owner,
    /// The client's term the grant belongs to.
    pub term: Term,
}

/// An [`OwnerToken`] rendered as ASCII, `<32 hex digits>.<term in hex>`, without
/// allocating; what text-based services (Redis, etcd) store.
#[derive(Clone, Copy)]
pub struct EncodedToken {
    buf: [u8; EncodedToken::CAPACITY],
    len: u8,
}

impl Owner {
    /// The token stored at the service for this owner's `term`.
    pub const fn token(self, term: Term) -> OwnerToken {
        OwnerToken { owner: self, term }
    }
}

impl OwnerToken {
    /// The ASCII form, e.g. `000102030405060708090a0b0c0d0e0f.1c`.
    pub fn encode(&self) -> EncodedToken {
        let mut buf = [0; EncodedToken::CAPACITY];
        // Every renewal on a text-based service encodes its token: each owner byte's
        // two digits in one step, no branch on the position.
        for (digits, byte) in buf.chunks_exact_mut(2).zip(self.owner.0) {
            if let [high, low] = digits {
                *high = hex_digit(byte >> 4);
                *low = hex_digit(byte);
            }
        }
        buf[OWNER_HEX_LEN] = b'.';
        let term_digits = hex_digits(self.term.0);
        let end = (OWNER_HEX_LEN + 1).wrapping_add(term_digits);
        // The term's digits, written from the lowest (the last).
        let mut rest = self.term.0;
        if let Some(digits) = buf.get_mut(OWNER_HEX_LEN + 1..end) {
            for digit in digits.iter_mut().rev() {
                *digit = hex_digit(rest as u8);
                rest >>= 4;
            }
        }
        EncodedToken {
            buf,
            len: end as u8,
        }
    }
}

/// Hex digits of the owner in an encoded token.
const OWNER_HEX_LEN: usize = 32;

/// Hex digits of `value` without leading zeros (zero is one digit "0"): 1 to 8.
///
/// Counted with shifts, not `leading_zeros`: thumbv6m has no count-leading-zeros
/// instruction, and its library routine (`__clzsi2`, 108 B) is in no other part of a
/// firmware.
const fn hex_digits(value: u32) -> usize {
    let mut digits: usize = 1;
    let mut rest = value >> 4;
    while rest != 0 {
        digits = digits.wrapping_add(1);
        rest >>= 4;
    }
    digits
}

/// The lowercase hex digit of the low nibble of `value`.
const fn hex_digit(value: u8) -> u8 {
    let nibble = value & 0xf;
    if nibble < 10 {
        b'0'.wrapping_add(nibble)
    } else {
        b'a'.wrapping_add(nibble.wrapping_sub(10))
    }
}

impl EncodedToken {
    /// The longest encoding: 32 hex digits, a dot, 8 hex digits.
    pub const CAPACITY: usize = 41;

    /// The encoded bytes (always ASCII).
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..usize::from(self.len)).unwrap_or(&[])
    }

    /// The encoded text.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

impl fmt::Debug for EncodedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.encode().as_str())
    }
}

/// Why an answer does not say whether the service did what was asked.
///
/// An indeterminate renewal is not a loss: the lease is retried inside its remaining
/// budget. Only the safe deadline passing turns it into [`LossReason::Expired`]. An
/// indeterminate acquire may have been granted: the lease retries it (the service
/// answers a retry with the same owner token idempotently) and releases it if it gives
/// up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Indeterminate {
    /// No answer within the request timeout.
    Timeout,
    /// The connection failed (refused, reset, closed).
    Transport,
    /// The service answered something this client cannot interpret.
    Protocol,
    /// The service answered with an error of its own that may clear (busy, loading,
    /// read-only replica, no leader…).
    Service,
}

impl fmt::Display for Indeterminate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Indeterminate::Timeout => "no answer within the request timeout",
            Indeterminate::Transport => "transport failure",
            Indeterminate::Protocol => "unintelligible answer from the lock service",
            Indeterminate::Service => "the lock service answered with an error that may clear",
        })
    }
}

/// A final refusal: the service understood the request and will never grant it as
/// asked, so retrying cannot help.
///
/// An acquire that meets one ends at once, whatever its wait bound; a renewal that
/// meets one ends the term ([`LossReason::Refused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Refusal {
    /// The key breaks the key rules ([`check_key`](crate::check_key)): empty, too
    /// long, a control character, or a brace.
    InvalidKey,
    /// The key exists but holds something that is not a lease (a Redis list, a value
    /// written by another program).
    WrongType,
    /// The service refused the credentials, or they lack the permission asked for.
    Unauthorized,
    /// The service cannot carry out the request as asked (a TTL it cannot represent,
    /// a command it does not support).
    Unsupported,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::InvalidKey => "the key is not a valid lock name",
            Refusal::WrongType => "the key holds something that is not a lease",
            Refusal::Unauthorized => "the lock service refused our credentials",
            Refusal::Unsupported => "the lock service cannot carry out the request",
        })
    }
}

/// What a lock service answered to an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum AcquireOutcome {
    /// The lease is ours for `ttl` *as granted by the service* (not as requested),
    /// with this fence.
    Granted {
        /// Strictly greater than every fence granted before for this key.
        fence: Fence,
        /// The TTL the service applied, counted from when it handled the request.
        ttl: Duration,
    },
    /// Somebody else holds it; who, with which fence, and for how much longer.
    HeldByAnother(Holder),
    /// The service will never grant this request: do not retry.
    Refused(Refusal),
    /// Unknown: it may or may not have been granted.
    Indeterminate(Indeterminate),
}

/// What a lock service answered to a renewal (compare owner token and fence, then
/// expire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum RenewOutcome {
    /// The key now expires `ttl` after the service handled the renewal.
    Renewed {
        /// The TTL the service applied.
        ttl: Duration,
    },
    /// The service says this owner token does not hold the key with this fence:
    /// definitive.
    NotOwner,
    /// The service will never renew as asked (e.g. our credentials were revoked).
    Refused(Refusal),
    /// Unknown: it may or may not have been extended.
    Indeterminate(Indeterminate),
}

/// What a lock service answered to a release (compare owner token, then delete).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// Deleted.
    Released,
    /// It was not ours any more (expired or taken): nothing to delete.
    NotOwner,
    /// The service will never carry out this release; its TTL will clean up.
    Refused(Refusal),
    /// Unknown; the service's TTL will clean up.
    Indeterminate(Indeterminate),
}

/// What a lock service answered to "who holds this key?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum HolderOutcome {
    /// Held, by this holder.
    Held(Holder),
    /// Nobody holds the key.
    Free,
    /// The service will never answer this query (invalid key, credentials).
    Refused(Refusal),
    /// Unknown.
    Indeterminate(Indeterminate),
}

/// A lock service's answer to one request of a [`Lease`](crate::Lease), whatever its
/// kind: what a driver feeds to [`Lease::handle_response`](crate::Lease::handle_response).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Response {
    /// The answer to an [`Action::Acquire`](crate::Action::Acquire).
    Acquire(AcquireOutcome),
    /// The answer to an [`Action::Renew`](crate::Action::Renew).
    Renew(RenewOutcome),
    /// The answer to an [`Action::Release`](crate::Action::Release).
    Release(ReleaseOutcome),
}

impl From<AcquireOutcome> for Response {
    fn from(outcome: AcquireOutcome) -> Response {
        Response::Acquire(outcome)
    }
}
impl From<RenewOutcome> for Response {
    fn from(outcome: RenewOutcome) -> Response {
        Response::Renew(outcome)
    }
}
impl From<ReleaseOutcome> for Response {
    fn from(outcome: ReleaseOutcome) -> Response {
        Response::Release(outcome)
    }
}

/// Why a term ended in loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum LossReason {
    /// The service answered a renewal of this term with "not owner": definitive, at
    /// once, also when it answers an older renewal after a newer one succeeded.
    NotOwner,
    /// The safe deadline passed without a confirmed renewal.
    Expired,
    /// The service reported, unprompted, that the lease is gone (key deleted, lease
    /// revoked).
    Revoked,
    /// The service confirmed a renewal that may end *earlier* than the deadline the
    /// gate holds (a shorter TTL than asked, in time or late). Deadlines never move
    /// back, so the term ends.
    Shortened,
    /// The service refused a renewal for good (see [`Refusal`]).
    Refused,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::NotOwner => "the lock service says we are not the owner",
            LossReason::Expired => "the safe deadline passed without a confirmed renewal",
            LossReason::Revoked => "the lock service revoked the lease",
            LossReason::Shortened => "the lock service shortened the lease",
            LossReason::Refused => "the lock service refused to renew the lease",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_encoding_is_owner_hex_dot_term_hex() {
        let owner = Owner([
            0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d,
            0x0e, 0xff,
        ]);
        assert_eq!(
            owner.token(Term(0x1c)).encode().as_str(),
            "000102030405060708090a0b0c0d0eff.1c"
        );
        assert_eq!(owner.token(Term(0)).encode().as_str().len(), 34);
        let max = owner.token(Term(u32::MAX)).encode();
        assert_eq!(max.as_bytes().len(), EncodedToken::CAPACITY);
        assert!(max.as_str().ends_with(".ffffffff"));
    }

    #[test]
    fn token_encoding_matches_std_formatting_for_every_term_length() {
        extern crate std;
        use std::format;
        let owner = Owner([0xa5; 16]);
        let terms = (0..32).flat_map(|b| {
            let p = 1u32 << b;
            [p.wrapping_sub(1), p, p.wrapping_add(1)]
        });
        for term in terms.chain([u32::MAX]) {
            let expected = format!("{}.{term:x}", "a5".repeat(16));
            assert_eq!(owner.token(Term(term)).encode().as_str(), expected);
        }
    }

    #[test]
    fn token_encoding_matches_std_formatting_for_every_owner_byte() {
        extern crate std;
        use std::{format, string::String};
        for first in (0..=255u8).step_by(16) {
            let owner = Owner(core::array::from_fn(|i| first.wrapping_add(i as u8)));
            let hex: String = owner.0.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(owner.token(Term(7)).encode().as_str(), format!("{hex}.7"));
        }
    }

    #[test]
    fn tokens_of_different_terms_differ() {
        let owner = Owner([7; 16]);
        assert_ne!(
            owner.token(Term(1)).encode().as_str(),
            owner.token(Term(2)).encode().as_str()
        );
    }
}
