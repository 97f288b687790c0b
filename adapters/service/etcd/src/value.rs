//! The value stored at a held key: `<owner token>\n<identity>`.
//!
//! The token decides ownership (renew, release, the revocation watch compare it); the
//! identity is only reported to others. A newline cannot occur in either part (a token
//! is hex digits and a dot, an identity has no control characters), so the first one
//! separates them.

use leasehold::{EncodedToken, Identity, OwnerToken};

/// The bytes to put at a key granted to `token` presenting `identity`.
pub(crate) fn encode(token: OwnerToken, identity: &Identity) -> Vec<u8> {
    let token = token.encode();
    let mut value = Vec::with_capacity(token.as_bytes().len() + 1 + identity.as_str().len());
    value.extend_from_slice(token.as_bytes());
    value.push(b'\n');
    value.extend_from_slice(identity.as_str().as_bytes());
    value
}

/// A stored value read back: the token part (checked to be a token's encoding) and
/// the identity. `None` if the value is not in this crate's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stored<'a> {
    token: &'a [u8],
    identity: &'a [u8],
}

impl<'a> Stored<'a> {
    /// Parses `value`; `None` if it is not `<token>\n<identity>`.
    pub(crate) fn parse(value: &'a [u8]) -> Option<Stored<'a>> {
        let newline = value.iter().position(|&b| b == b'\n')?;
        let (token, rest) = value.split_at(newline);
        let identity = rest.get(1..)?;
        is_token(token).then_some(Stored { token, identity })
    }

    /// Whether the value names `token` as its holder.
    pub(crate) fn is(&self, token: &EncodedToken) -> bool {
        self.token == token.as_bytes()
    }

    /// The holder's identity, made printable and cut to [`Identity::CAPACITY`] if
    /// someone stored more (it is reported, never trusted).
    pub(crate) fn identity(&self) -> Identity {
        Identity::lossy(&String::from_utf8_lossy(self.identity))
    }
}

/// Whether `bytes` is an [`OwnerToken`] encoding: 32 lowercase hex digits, a dot, and
/// 1 to 8 lowercase hex digits.
fn is_token(bytes: &[u8]) -> bool {
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
    fn a_value_round_trips_token_and_identity() {
        let identity = Identity::new("host-7:4711").unwrap();
        let value = encode(token(), &identity);
        assert_eq!(
            value,
            format!("{}\nhost-7:4711", token().encode().as_str()).into_bytes()
        );
        let stored = Stored::parse(&value).unwrap();
        assert!(stored.is(&token().encode()));
        assert!(!stored.is(&Owner([0xab; 16]).token(Term(0x1d)).encode()));
        assert_eq!(stored.identity(), identity);
        let anonymous = encode(token(), &Identity::EMPTY);
        assert!(Stored::parse(&anonymous).unwrap().identity().is_empty());
    }

    #[test]
    fn foreign_values_are_not_ours() {
        let t = token().encode();
        let t = t.as_str();
        for foreign in [
            String::new(),
            "hello".into(),
            t.to_owned(),                       // no separator
            format!("{}\nx", &t[1..]),          // short owner
            format!("{}\nx", t.to_uppercase()), // not lowercase hex
            format!("{}\nx", t.replace('.', ":")),
            format!("{}0000000\nx", t),  // term of 9 digits
            format!("{}.\nx", &t[..32]), // empty term
        ] {
            assert_eq!(Stored::parse(foreign.as_bytes()), None, "{foreign:?}");
        }
    }

    #[test]
    fn identities_read_back_are_made_printable_and_bounded() {
        let mut value = encode(token(), &Identity::EMPTY);
        value.extend_from_slice(b"a\x07b\n\xffc");
        assert_eq!(
            Stored::parse(&value).unwrap().identity().as_str(),
            "a?b?\u{fffd}c"
        );
        let mut long = encode(token(), &Identity::EMPTY);
        long.extend_from_slice("x".repeat(100).as_bytes());
        assert_eq!(
            Stored::parse(&long).unwrap().identity().as_str().len(),
            Identity::CAPACITY
        );
    }
}
