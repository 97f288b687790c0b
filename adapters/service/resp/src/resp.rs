//! RESP2, the part the scripts need: one reply parsed in place from a bounded buffer,
//! and requests written through a bounded buffer.
//!
//! The scripts answer integers, bulk strings and arrays of at most
//! [`MAX_ITEMS`] of those; error replies carry Redis's code. Everything else
//! (nested arrays, RESP3 types, numbers with signs or leading zeros, a bulk string
//! not followed by CRLF) is [`ProtocolError::Malformed`]: never guessed at.

use core::num::NonZeroU16;

/// The longest array a script answers: `{0, fence, identity, pttl}`.
pub const MAX_ITEMS: usize = 4;

/// One scalar of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scalar<'a> {
    /// `:n`
    Int(i64),
    /// `$n` and its bytes; `None` for the nil bulk string `$-1`.
    Bulk(Option<&'a [u8]>),
    /// `+text`
    Simple(&'a [u8]),
}

/// One reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply<'a> {
    /// A scalar.
    Scalar(Scalar<'a>),
    /// `-CODE message`: the whole line after the `-`.
    Error(&'a [u8]),
    /// `*n` with `n <= MAX_ITEMS` scalars.
    Array(Items<'a>),
}

/// The scalars of an array reply, read one by one from the reply's bytes (which
/// [`parse`] checked whole): no array of parsed items is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Items<'a> {
    buf: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Items<'a> {
    /// How many scalars are left.
    pub(crate) fn len(&self) -> usize {
        self.left
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = Scalar<'a>;

    fn next(&mut self) -> Option<Scalar<'a>> {
        self.left = self.left.checked_sub(1)?;
        let (item, after) = scalar(self.buf, self.at).ok()?;
        self.at = after;
        Some(item)
    }
}

/// Why `buf` holds no reply yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Partial {
    /// More bytes may complete it.
    Incomplete,
    /// No bytes can make this a reply the scripts give.
    Malformed,
}

/// The reply at the start of `buf` and its length in bytes.
pub(crate) fn parse(buf: &[u8]) -> Result<(Reply<'_>, usize), Partial> {
    let (kind, line, next) = line(buf, 0)?;
    match kind {
        b'-' => Ok((Reply::Error(line), next)),
        b'*' => {
            let count = usize::try_from(number(line)?).map_err(|_| Partial::Malformed)?;
            if count > MAX_ITEMS {
                return Err(Partial::Malformed);
            }
            let mut at = next;
            for _ in 0..count {
                at = scalar(buf, at)?.1;
            }
            let items = Items {
                buf,
                at: next,
                left: count,
            };
            Ok((Reply::Array(items), at))
        }
        _ => scalar(buf, 0).map(|(s, at)| (Reply::Scalar(s), at)),
    }
}

/// The scalar starting at `at` and where the next value starts.
fn scalar(buf: &[u8], at: usize) -> Result<(Scalar<'_>, usize), Partial> {
    let (kind, line, next) = line(buf, at)?;
    match kind {
        b':' => Ok((Scalar::Int(number(line)?), next)),
        b'+' => Ok((Scalar::Simple(line), next)),
        b'$' => {
            let len = number(line)?;
            if len == -1 {
                return Ok((Scalar::Bulk(None), next));
            }
            let len = usize::try_from(len).map_err(|_| Partial::Malformed)?;
            let end = next.checked_add(len).ok_or(Partial::Malformed)?;
            let after = end.checked_add(2).ok_or(Partial::Malformed)?;
            let (Some(data), Some(crlf)) = (buf.get(next..end), buf.get(end..after)) else {
                return Err(Partial::Incomplete);
            };
            if crlf != b"\r\n" {
                return Err(Partial::Malformed);
            }
            Ok((Scalar::Bulk(Some(data)), after))
        }
        _ => Err(Partial::Malformed),
    }
}

/// The type byte at `at`, the rest of its line (without CRLF), and where the next
/// line starts. A bare CR or LF inside a line is malformed.
fn line(buf: &[u8], at: usize) -> Result<(u8, &[u8], usize), Partial> {
    let rest = buf.get(at..).ok_or(Partial::Incomplete)?;
    let (&kind, body) = rest.split_first().ok_or(Partial::Incomplete)?;
    match body.iter().position(|&b| b == b'\r' || b == b'\n') {
        None => Err(Partial::Incomplete),
        Some(end) => match (body.get(end), body.get(end + 1)) {
            (Some(b'\r'), Some(b'\n')) => Ok((kind, body.get(..end).unwrap_or(&[]), at + end + 3)),
            (Some(b'\r'), None) => Err(Partial::Incomplete),
            _ => Err(Partial::Malformed),
        },
    }
}

/// A RESP integer as Redis writes it: `0`, or an optional `-` and digits without a
/// leading zero, within `i64`.
fn number(text: &[u8]) -> Result<i64, Partial> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let canonical = match digits {
        [] => false,
        [b'0'] => !negative,
        [first, ..] => *first != b'0',
    };
    if !canonical {
        return Err(Partial::Malformed);
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(Partial::Malformed);
        }
        let digit = i64::from(d - b'0');
        value = value
            .checked_mul(10)
            .and_then(|v| {
                if negative {
                    v.checked_sub(digit)
                } else {
                    v.checked_add(digit)
                }
            })
            .ok_or(Partial::Malformed)?;
    }
    Ok(value)
}

/// A positive `u64` written in decimal without a leading zero (a fence, exact
/// beyond 2^53).
pub(crate) fn fence_digits(text: &[u8]) -> Option<u64> {
    if text.first().is_none_or(|&d| d == b'0') {
        return None;
    }
    text.iter().try_fold(0u64, |value, &d| {
        if d.is_ascii_digit() {
            value.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

/// `a == b`, byte by byte: the texts compared are short, and `==` on slices links
/// `memcmp` (over 100 bytes of flash on a microcontroller).
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

const TEN: NonZeroU16 = match NonZeroU16::new(10) {
    Some(ten) => ten,
    None => unreachable!(),
};

/// Digits of `n` in decimal, at the end of `buf`; returns the start.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> usize {
    let mut at = buf.len();
    for slot in buf.iter_mut().rev() {
        let (rest, digit) = leasehold::div_rem_u16(n, TEN);
        *slot = b'0' + digit as u8;
        at -= 1;
        n = rest;
        if n == 0 {
            break;
        }
    }
    at
}

/// A window onto a request being encoded: the encoder writes the whole request from
/// its start each time, and the window keeps the bytes `from..` that fit in `buf`.
/// Encoding again from the start for each buffer-full costs a few microseconds; it
/// keeps the encoder plain, synchronous code, out of the async state machines (one
/// copy, whatever the connection type).
pub(crate) struct Window<'b> {
    from: usize,
    at: usize,
    buf: &'b mut [u8],
    len: usize,
}

impl<'b> Window<'b> {
    /// A window for bytes `from..` of the request into `buf`.
    pub(crate) fn new(from: usize, buf: &'b mut [u8]) -> Self {
        Window {
            from,
            at: 0,
            buf,
            len: 0,
        }
    }

    /// The next `bytes` of the request.
    pub(crate) fn put(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if self.at >= self.from {
                if let Some(slot) = self.buf.get_mut(self.len) {
                    *slot = byte;
                    self.len += 1;
                }
            }
            self.at += 1;
        }
    }

    /// `n` in decimal (no framing).
    pub(crate) fn number(&mut self, n: u64) {
        let mut digits = [0u8; 20];
        let at = decimal(n, &mut digits);
        self.put(digits.get(at..).unwrap_or(&[]));
    }

    /// How many bytes the window holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// How many bytes of the request were put so far, kept or not.
    pub(crate) fn written(&self) -> usize {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_scripts_answer() {
        let (reply, used) = parse(b"*2\r\n:1\r\n$2\r\n42\r\n").unwrap();
        assert_eq!(used, 16);
        let Reply::Array(items) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(items.len(), 2);
        assert_eq!(
            items.collect::<std::vec::Vec<_>>(),
            [Scalar::Int(1), Scalar::Bulk(Some(b"42"))]
        );
        assert_eq!(parse(b":-1\r\n"), Ok((Reply::Scalar(Scalar::Int(-1)), 5)));
        assert_eq!(
            parse(b"$-1\r\n"),
            Ok((Reply::Scalar(Scalar::Bulk(None)), 5))
        );
        assert_eq!(
            parse(b"-NOSCRIPT No matching script\r\n"),
            Ok((Reply::Error(b"NOSCRIPT No matching script"), 30))
        );
    }

    #[test]
    fn incomplete_and_malformed_are_told_apart() {
        for partial in [
            &b""[..],
            b"*",
            b"*2\r\n:1\r\n",
            b"$5\r\nab",
            b"$2\r\nab\r",
            b":1\r",
        ] {
            assert_eq!(parse(partial), Err(Partial::Incomplete), "{partial:?}");
        }
        for bad in [
            &b"?\r\n"[..],
            b":01\r\n",
            b":-0\r\n",
            b":+1\r\n",
            b":\r\n",
            b":99999999999999999999\r\n",
            b"*5\r\n",
            b"*-1\r\n",
            b"*1\r\n*1\r\n:1\r\n",
            b"*1\r\n-ERR\r\n",
            b"$2\r\nabc\r\n",
            b"$-2\r\n",
            b":1\n",
            b":1\rx",
            b"_\r\n",
        ] {
            assert_eq!(parse(bad), Err(Partial::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn fences_are_exact_to_u64_max() {
        assert_eq!(
            fence_digits(b"9007199254740993"),
            Some(9_007_199_254_740_993)
        );
        assert_eq!(fence_digits(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"0",
            b"018",
            b"18446744073709551616",
            b"1a",
            b"-1",
        ] {
            assert_eq!(fence_digits(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn decimal_digits_without_a_64_bit_divide() {
        for n in [
            0,
            1,
            9,
            10,
            999,
            1_000,
            65_535,
            65_536,
            1 << 40,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut digits = [0u8; 20];
            let at = decimal(n, &mut digits);
            assert_eq!(&digits[at..], std::format!("{n}").as_bytes());
        }
    }
}
