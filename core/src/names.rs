//! The names a lock service stores: the key, and the holder's human-readable identity.
//!
//! Both are checked here, once, so every service accepts and refuses the same names.

use core::fmt;

use crate::{Duration, Fence};

/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// Checks `key` against the key rules every lock service follows.
///
/// A key is 1 to [`MAX_KEY_LEN`] bytes of UTF-8 with no control characters and no
/// braces. Braces are out because a Redis service wraps the key in a hash tag
/// (`{key}`) so that the lock and its fence counter share a cluster slot; a brace in
/// the key would move the tag. Everything else (spaces, `/`, `:`, non-ASCII) is fine.
///
/// ```
/// use leasehold::{check_key, KeyError};
///
/// assert_eq!(check_key("orders/eu-west:1"), Ok(()));
/// assert_eq!(check_key(""), Err(KeyError::Empty));
/// assert_eq!(check_key("a{b}"), Err(KeyError::Brace { at: 1 }));
/// ```
pub fn check_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    let bytes = key.as_bytes();
    for (at, &byte) in bytes.iter().enumerate() {
        if byte == b'{' || byte == b'}' {
            return Err(KeyError::Brace { at });
        }
        if control_at(bytes, at, byte) {
            return Err(KeyError::Control { at });
        }
    }
    Ok(())
}

/// Whether a control character (Unicode's `Cc`: U+0000–U+001F, U+007F–U+009F) starts at
/// byte `at` of valid UTF-8, `byte` being `bytes[at]`.
///
/// Read byte by byte, without decoding characters: on a 32-bit MCU a `char` decoder
/// costs several hundred bytes of flash, and in UTF-8 these characters are the bytes
/// below 0x20, 0x7F, and the two-byte sequences `C2 80`–`C2 9F`.
fn control_at(bytes: &[u8], at: usize, byte: u8) -> bool {
    byte < 0x20
        || byte == 0x7f
        || (byte == 0xc2
            && bytes
                .get(at.wrapping_add(1))
                .is_some_and(|&next| (0x80..=0x9f).contains(&next)))
}

/// How many bytes at the start of `bytes` are whole, valid UTF-8 characters (what
/// `str::from_utf8`'s `valid_up_to` says), checked byte by byte: no table.
fn valid_utf8_prefix(bytes: &[u8]) -> usize {
    // One pass: `start` is where the current character began, `more` how many of its
    // continuation bytes are still to come, and `low..=high` the range the next one
    // must be in (narrower for the second byte after some lead bytes, which rules
    // out overlong forms, surrogates and code points past U+10FFFF).
    let (mut start, mut more, mut low, mut high) = (0, 0u8, 0x80u8, 0xbfu8);
    for (at, &byte) in bytes.iter().enumerate() {
        if more == 0 {
            start = at;
            (more, low, high) = match byte {
                0x00..=0x7f => (0, 0x80, 0xbf),
                0xc2..=0xdf => (1, 0x80, 0xbf),
                0xe0 => (2, 0xa0, 0xbf),
                0xed => (2, 0x80, 0x9f),
                0xe1..=0xef => (2, 0x80, 0xbf),
                0xf0 => (3, 0x90, 0xbf),
                0xf1..=0xf3 => (3, 0x80, 0xbf),
                0xf4 => (3, 0x80, 0x8f),
                _ => return at,
            };
        } else if (low..=high).contains(&byte) {
            (more, low, high) = (more.saturating_sub(1), 0x80, 0xbf);
        } else {
            return start;
        }
    }
    if more == 0 {
        bytes.len()
    } else {
        start
    }
}

/// Why a key breaks the key rules (see [`check_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty.
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A `{` or `}` at this byte offset.
    Brace {
        /// Byte offset.
        at: usize,
    },
    /// A control character at this byte offset.
    Control {
        /// Byte offset.
        at: usize,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KeyError::Empty => f.write_str("invalid key: it is empty"),
            KeyError::TooLong { len } => {
                write!(f, "invalid key: {len} bytes, the limit is {MAX_KEY_LEN}")
            }
            KeyError::Brace { at } => {
                write!(
                    f,
                    "invalid key: a brace at byte {at} (braces are reserved for hash tags)"
                )
            }
            KeyError::Control { at } => write!(f, "invalid key: a control character at byte {at}"),
        }
    }
}

impl core::error::Error for KeyError {}

/// Who holds a lease, in words a person can read in a log: e.g. `host-7:4711`.
///
/// Stored by the service with every grant, next to the owner token, and reported to
/// contenders ([`Holder`]). At most [`Identity::CAPACITY`] bytes of UTF-8 without
/// control characters; empty means "not given". It identifies nothing for safety: the
/// owner token and the fence do that.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    buf: [u8; Identity::CAPACITY],
    len: u8,
}

impl Identity {
    /// The longest identity, in bytes.
    pub const CAPACITY: usize = 64;

    /// The empty identity: a holder that did not say who it is.
    pub const EMPTY: Identity = Identity {
        buf: [0; Identity::CAPACITY],
        len: 0,
    };

    /// Checks and copies `text`.
    pub fn new(text: &str) -> Result<Identity, IdentityError> {
        if text.len() > Identity::CAPACITY {
            return Err(IdentityError::TooLong { len: text.len() });
        }
        let bytes = text.as_bytes();
        if let Some(at) = (0..bytes.len()).find(|&at| {
            bytes
                .get(at)
                .is_some_and(|&byte| control_at(bytes, at, byte))
        }) {
            return Err(IdentityError::Control { at });
        }
        // It fits and has no control character: `lossy` cuts and replaces nothing, and
        // one copy loop serves both.
        Ok(Identity::lossy(text))
    }

    /// Like [`new`](Self::new), but cuts `text` to the longest prefix that fits (on a
    /// character boundary) and replaces each byte of a control character with `?`: for
    /// identities read back from a service, which must not fail a query.
    pub fn lossy(text: &str) -> Identity {
        // One path for both (a `str` passes the check whole): less flash.
        Identity::lossy_utf8(text.as_bytes())
    }

    /// Like [`lossy`](Self::lossy), from bytes that should be UTF-8: the longest prefix
    /// that is valid UTF-8, then as `lossy`. For identities a service sends back as
    /// bytes: no UTF-8 check of the `str` kind is linked, which costs a microcontroller
    /// about 600 B of flash with its table.
    pub fn lossy_utf8(bytes: &[u8]) -> Identity {
        Identity::from_valid(bytes.get(..valid_utf8_prefix(bytes)).unwrap_or(&[]))
    }

    /// `lossy` of UTF-8 `bytes`.
    fn from_valid(bytes: &[u8]) -> Identity {
        let mut len = bytes.len().min(Identity::CAPACITY);
        // Cut on a character boundary: not before a continuation byte.
        while len > 0 && bytes.get(len).is_some_and(|&byte| byte & 0xc0 == 0x80) {
            len = len.saturating_sub(1);
        }
        let bytes = bytes.get(..len).unwrap_or(&[]);
        let mut control_tail = false;
        // Each byte is written once, the text's or zero past it: no zero fill first.
        let buf = core::array::from_fn(|at| match bytes.get(at) {
            Some(&byte) => {
                // The second byte of a `C2 80`–`C2 9F` control character goes too.
                let control = control_tail || control_at(bytes, at, byte);
                control_tail = control && byte == 0xc2;
                if control {
                    b'?'
                } else {
                    byte
                }
            }
            None => 0,
        });
        Identity {
            buf,
            len: len as u8,
        }
    }

    /// The identity's text.
    pub fn as_str(&self) -> &str {
        // The bytes are UTF-8 by construction (copied from a `str`, cut on a character
        // boundary), so they are one valid chunk. Safe code must still validate them;
        // `utf8_chunks` does it in less code than `str::from_utf8` (no word-at-a-time
        // ASCII fast path, which a 64-byte text does not need).
        let bytes = self.buf.get(..usize::from(self.len)).unwrap_or(&[]);
        bytes.utf8_chunks().next().map_or("", |chunk| chunk.valid())
    }

    /// The identity's text as bytes (UTF-8): what a service stores, with no check.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..usize::from(self.len)).unwrap_or(&[])
    }

    /// Whether no identity was given.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for Identity {
    fn default() -> Identity {
        Identity::EMPTY
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_empty() {
            "(anonymous)"
        } else {
            self.as_str()
        })
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Identity {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.as_str());
    }
}

/// Why a text cannot be an [`Identity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum IdentityError {
    /// Longer than [`Identity::CAPACITY`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A control character at this byte offset.
    Control {
        /// Byte offset.
        at: usize,
    },
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IdentityError::TooLong { len } => write!(
                f,
                "invalid holder identity: {len} bytes, the limit is {}",
                Identity::CAPACITY
            ),
            IdentityError::Control { at } => {
                write!(
                    f,
                    "invalid holder identity: a control character at byte {at}"
                )
            }
        }
    }
}

impl core::error::Error for IdentityError {}

/// Who holds a key, as the service saw it when it answered.
///
/// The fence names the grant: a service never gives two grants of a key the same
/// fence, so an observer matches a holder to a lease by comparing fences (the fence a
/// lease handle or an `Event::Acquired` reports). The owner token stays at the service:
/// it is what lets the holder renew and release, and an observer has no use for it.
///
/// A lock service in *quarantine* answers acquires with [`Holder::quarantine`]: no
/// client holds the key, but the service may have forgotten grants that are still
/// alive (it lost its data, was restored from a backup, or a replica that missed the
/// latest grants took over), so it grants nothing for `remaining`. Its fence is 0,
/// which no grant ever has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Holder {
    /// The identity the holder gave when it acquired.
    pub identity: Identity,
    /// The fence of its grant (0 for a quarantine).
    pub fence: Fence,
    /// How long until the service expires the grant unless it is renewed (for a
    /// quarantine: until it ends).
    pub remaining: Duration,
}

impl Holder {
    /// What a service in quarantine answers an acquire: nobody holds the key, and
    /// nothing is granted for `remaining`.
    pub const fn quarantine(remaining: Duration) -> Holder {
        Holder {
            identity: Identity::EMPTY,
            fence: Fence(0),
            remaining,
        }
    }

    /// What a fair (first-in, first-out) service answers a contender while the key is
    /// free but another contender, `identity`, has the turn: nobody holds the key
    /// (fence 0), and the turn lasts `remaining` unless that contender asks again.
    pub const fn turn_of(identity: Identity, remaining: Duration) -> Holder {
        Holder {
            identity,
            fence: Fence(0),
            remaining,
        }
    }

    /// Whether no grant holds the key (fence 0): a quarantine ([`Holder::quarantine`])
    /// or another contender's turn ([`Holder::turn_of`]), rather than a holder.
    pub const fn is_quarantine(&self) -> bool {
        self.fence.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_rules() {
        assert_eq!(check_key("k"), Ok(()));
        assert_eq!(check_key("a b/c:d.é"), Ok(()));
        let long = "x".repeat(MAX_KEY_LEN);
        assert_eq!(check_key(&long), Ok(()));
        assert_eq!(
            check_key(&(long + "x")),
            Err(KeyError::TooLong {
                len: MAX_KEY_LEN + 1
            })
        );
        assert_eq!(check_key(""), Err(KeyError::Empty));
        assert_eq!(check_key("ab}"), Err(KeyError::Brace { at: 2 }));
        assert_eq!(check_key("a\nb"), Err(KeyError::Control { at: 1 }));
        assert_eq!(check_key("a\u{7f}"), Err(KeyError::Control { at: 1 }));
        assert_eq!(check_key("ab\u{9f}"), Err(KeyError::Control { at: 2 }));
        assert_eq!(check_key("\u{a0}\u{100}\u{1f600}"), Ok(()), "not controls");
    }

    /// What `str::from_utf8` finds valid at the start of `bytes`.
    fn std_valid_prefix(bytes: &[u8]) -> usize {
        core::str::from_utf8(bytes).map_or_else(|e| e.valid_up_to(), str::len)
    }

    #[test]
    fn the_utf8_check_agrees_with_std_on_every_short_sequence() {
        // Every one- and two-byte sequence; three and four bytes from the values
        // where the rules change (ASCII, continuation bounds, lead-byte bounds).
        for a in 0..=255u8 {
            assert_eq!(valid_utf8_prefix(&[a]), std_valid_prefix(&[a]), "{a:#x}");
            for b in 0..=255u8 {
                let two = [a, b];
                assert_eq!(valid_utf8_prefix(&two), std_valid_prefix(&two), "{two:x?}");
            }
        }
        let edges = [
            0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0,
            0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4, 0xf5, 0xff,
        ];
        for &a in &edges {
            for &b in &edges {
                for &c in &edges {
                    let three = [a, b, c];
                    assert_eq!(valid_utf8_prefix(&three), std_valid_prefix(&three));
                    for &d in &edges {
                        let four = [a, b, c, d, 0x41];
                        assert_eq!(
                            valid_utf8_prefix(&four),
                            std_valid_prefix(&four),
                            "{four:x?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn identities_from_bytes_keep_the_valid_prefix_and_cut_on_characters() {
        let text = "h\u{e9}llo \u{1f600}";
        assert_eq!(Identity::lossy_utf8(text.as_bytes()), Identity::lossy(text));
        assert_eq!(Identity::lossy_utf8(b"ok\xffno").as_str(), "ok");
        assert_eq!(Identity::lossy_utf8(b"\xe2\x82").as_str(), "");
        assert_eq!(Identity::lossy_utf8(b"a\x01b").as_str(), "a?b");
        // 63 ASCII bytes then a 4-byte character: cut before it, as `lossy` does.
        let long = std::format!("{}\u{1f600}", "a".repeat(63));
        assert_eq!(Identity::lossy_utf8(long.as_bytes()).as_str(), &long[..63]);
        assert_eq!(Identity::lossy(&long).as_bytes(), &long.as_bytes()[..63]);
    }

    #[test]
    fn identities_are_bounded_and_printable() {
        assert_eq!(
            Identity::new("host-7:4711").unwrap().as_str(),
            "host-7:4711"
        );
        assert!(Identity::new("").unwrap().is_empty());
        let full = "é".repeat(32);
        assert_eq!(Identity::new(&full).unwrap().as_str(), full);
        assert_eq!(
            Identity::new(&(full.clone() + "x")),
            Err(IdentityError::TooLong { len: 65 })
        );
        assert_eq!(Identity::new("a\tb"), Err(IdentityError::Control { at: 1 }));
        // Read back from a service: never fails, cut on a character boundary.
        assert_eq!(Identity::lossy(&(full.clone() + "é")).as_str(), full);
        assert_eq!(
            Identity::lossy(&("x".to_string() + &full)).as_str().len(),
            63
        );
        assert_eq!(Identity::lossy("a\u{7}b").as_str(), "a?b");
        assert_eq!(
            Identity::lossy("a\u{85}b").as_str(),
            "a??b",
            "both bytes of U+0085"
        );
        assert_eq!(
            Identity::new("a\u{85}"),
            Err(IdentityError::Control { at: 1 })
        );
        assert!(Identity::new("a\u{a0}é").is_ok(), "U+00A0 is not a control");
    }

    #[test]
    fn the_byte_scan_agrees_with_char_is_control_for_every_char() {
        extern crate std;
        use std::string::String;
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let text = String::from(c);
            let bytes = text.as_bytes();
            let scanned = (0..bytes.len()).any(|at| control_at(bytes, at, bytes[at]));
            assert_eq!(scanned, c.is_control(), "{c:?}");
        }
    }
}
