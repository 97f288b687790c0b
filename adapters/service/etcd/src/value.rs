//! What this crate stores in etcd.
//!
//! A held key's value is `<owner token>\n<fence>\n<identity>`. The token decides
//! ownership (renew, release, the revocation watch compare it); the fence is the
//! grant's (decimal, no leading zeros); the identity is only reported to others. A
//! newline cannot occur in a token, a fence or an identity (a token is hex digits and
//! a dot, an identity has no control characters), so the first two separate them.
//!
//! The fence counter of a key lives at [`fence_key`] (`<key>{fence}`: a name no
//! valid key has, since keys have no braces, under the key's own prefix, so a role
//! with permission on a prefix of keys covers their counters too), as the decimal
//! fence of the key's last grant, with no lease: it outlives the grants, so the next
//! grant's fence is above it.

use leasehold::{EncodedToken, Identity, OwnerToken};

/// The bytes to put at a key granted to `token` with `fence`, presenting `identity`.
pub(crate) fn encode(token: OwnerToken, fence: u64, identity: &Identity) -> Vec<u8> {
    let token = token.encode();
    let fence = fence.to_string();
    let mut value = Vec::with_capacity(token.as_bytes().len() + fence.len() + 2 + 64);
    value.extend_from_slice(token.as_bytes());
    value.push(b'\n');
    value.extend_from_slice(fence.as_bytes());
    value.push(b'\n');
    value.extend_from_slice(identity.as_bytes());
    value
}

/// The key of `key`'s fence counter.
pub(crate) fn fence_key(key: &str) -> String {
    format!("{key}{{fence}}")
}

/// A positive decimal without leading zeros (a fence), or `None`.
pub(crate) fn decimal(bytes: &[u8]) -> Option<u64> {
    match bytes.first() {
        Some(b'1'..=b'9') if bytes.iter().all(u8::is_ascii_digit) => {
            std::str::from_utf8(bytes).ok()?.parse().ok()
        }
        _ => None,
    }
}

/// A stored value read back: the token part (checked to be a token's encoding), the
/// fence and the identity. `None` if the value is not in this crate's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stored<'a> {
    token: &'a [u8],
    fence: u64,
    identity: &'a [u8],
}

impl<'a> Stored<'a> {
    /// Parses `value`; `None` if it is not `<token>\n<fence>\n<identity>`.
    pub(crate) fn parse(value: &'a [u8]) -> Option<Stored<'a>> {
        let mut parts = value.splitn(3, |&b| b == b'\n');
        let (token, fence, identity) = (parts.next()?, parts.next()?, parts.next()?);
        let fence = decimal(fence)?;
        is_token(token).then_some(Stored {
            token,
            fence,
            identity,
        })
    }

    /// Whether the value names `token` as its holder.
    pub(crate) fn is(&self, token: &EncodedToken) -> bool {
        self.token == token.as_bytes()
    }

    /// The grant's fence.
    pub(crate) fn fence(&self) -> u64 {
        self.fence
    }

    /// The holder's identity, made printable and cut to [`Identity::CAPACITY`] if
    /// someone stored more (it is reported, never trusted).
    pub(crate) fn identity(&self) -> Identity {
        Identity::lossy(&String::from_utf8_lossy(self.identity))
    }
}

/// Whether `bytes` is an [`OwnerToken`] encoding: 32 lowercase hex digits, a dot, and
/// 1 to 8 lowercase hex digits.
pub(crate) fn is_token(bytes: &[u8]) -> bool {
    let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    match bytes.split_at_checked(32) {
        Some((owner, [b'.', term @ ..])) => {
            owner.iter().all(hex) && (1..=8).contains(&term.len()) && term.iter().all(hex)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::{Owner, Term};

    fn token() -> OwnerToken {
        Owner([0xab; 16]).token(Term(0x1c))
    }

    #[test]
    fn a_value_round_trips_token_fence_and_identity() {
        let identity = Identity::new("host-7:4711").unwrap();
        let value = encode(token(), u64::MAX, &identity);
        assert_eq!(
            value,
            format!("{}\n{}\nhost-7:4711", token().encode().as_str(), u64::MAX).into_bytes()
        );
        let stored = Stored::parse(&value).unwrap();
        assert!(stored.is(&token().encode()));
        assert!(!stored.is(&Owner([0xab; 16]).token(Term(0x1d)).encode()));
        assert_eq!(stored.fence(), u64::MAX);
        assert_eq!(stored.identity(), identity);
        let anonymous = encode(token(), 7, &Identity::EMPTY);
        assert!(Stored::parse(&anonymous).unwrap().identity().is_empty());
        assert_eq!(fence_key("orders"), "orders{fence}");
    }

    #[test]
    fn foreign_values_are_not_ours() {
        let t = token().encode();
        let t = t.as_str();
        for foreign in [
            String::new(),
            "hello".into(),
            t.to_owned(),                            // no separator
            format!("{t}\nx"),                       // no fence
            format!("{t}\n\nx"),                     // empty fence
            format!("{t}\n07\nx"),                   // leading zero
            format!("{t}\n0\nx"),                    // zero
            format!("{t}\n18446744073709551616\nx"), // past u64
            format!("{t}\n-1\nx"),
            format!("{}\n1\nx", &t[1..]),          // short owner
            format!("{}\n1\nx", t.to_uppercase()), // not lowercase hex
            format!("{}\n1\nx", t.replace('.', ":")),
            format!("{t}0000000\n1\nx"),    // term of 9 digits
            format!("{}.\n1\nx", &t[..32]), // empty term
        ] {
            assert_eq!(Stored::parse(foreign.as_bytes()), None, "{foreign:?}");
        }
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(decimal(b"1a"), None);
    }

    #[test]
    fn identities_read_back_are_made_printable_and_bounded() {
        let mut value = encode(token(), 1, &Identity::EMPTY);
        value.extend_from_slice(b"a\x07b\n\xffc");
        assert_eq!(
            Stored::parse(&value).unwrap().identity().as_str(),
            "a?b?\u{fffd}c"
        );
        let mut long = encode(token(), 1, &Identity::EMPTY);
        long.extend_from_slice("x".repeat(100).as_bytes());
        assert_eq!(
            Stored::parse(&long).unwrap().identity().as_str().len(),
            Identity::CAPACITY
        );
    }
}
