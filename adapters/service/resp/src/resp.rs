//! RESP2, the part the scripts need: one reply parsed in place from a bounded buffer,
//! and requests written through a bounded buffer.
//!
//! The scripts answer integers, bulk strings and arrays of at most
//! [`MAX_ITEMS`] of those; error replies carry Redis's code. Everything else
//! (nested arrays, RESP3 types, numbers with signs or leading zeros, a bulk string
//! not followed by CRLF) is [`ProtocolError::Malformed`]: never guessed at.

use embedded_io_async::{Read, Write};

use crate::error::{Error, ProtocolError};

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

/// The scalars of an array reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Items<'a> {
    items: [Scalar<'a>; MAX_ITEMS],
    len: usize,
}

impl<'a> Items<'a> {
    pub(crate) fn as_slice(&self) -> &[Scalar<'a>] {
        self.items.get(..self.len).unwrap_or(&[])
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
            let mut items = [Scalar::Int(0); MAX_ITEMS];
            let mut at = next;
            for slot in items.iter_mut().take(count) {
                let (item, after) = scalar(buf, at)?;
                *slot = item;
                at = after;
            }
            Ok((Reply::Array(Items { items, len: count }), at))
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
    if text.first().map_or(true, |&d| d == b'0') {
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

/// Reads until `buf` starts with one whole reply, and returns its length. The reply
/// must be all there is: bytes after it (an answer to nothing) are a protocol error.
pub(crate) async fn read_reply<C: Read>(conn: &mut C, buf: &mut [u8]) -> Result<usize, Error> {
    let mut len = 0;
    loop {
        let filled = buf.get(..len).unwrap_or(&[]);
        match parse(filled) {
            Ok((_, used)) if used == len => return Ok(len),
            Ok(_) => return Err(Error::Protocol(ProtocolError::TrailingBytes)),
            Err(Partial::Malformed) => return Err(Error::Protocol(ProtocolError::Malformed)),
            Err(Partial::Incomplete) => {}
        }
        let free = match buf.get_mut(len..) {
            Some(free) if !free.is_empty() => free,
            _ => return Err(Error::Protocol(ProtocolError::ReplyTooLong)),
        };
        match conn.read(free).await {
            Ok(0) => return Err(Error::Closed),
            Ok(n) => len = len.saturating_add(n).min(buf.len()),
            Err(e) => return Err(Error::io(&e)),
        }
    }
}

/// Digits of `n` in decimal, at the end of `buf`; returns the start.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> usize {
    let mut at = buf.len();
    loop {
        at -= 1;
        if let Some(slot) = buf.get_mut(at) {
            *slot = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || at == 0 {
            return at;
        }
    }
}

/// `Write::write_all` without its panic paths (an over-long count is taken as all
/// written; no write at all is an error).
async fn write_all<C: Write>(conn: &mut C, mut bytes: &[u8]) -> Result<(), Error> {
    while !bytes.is_empty() {
        match conn.write(bytes).await {
            Ok(0) => return Err(Error::Io(embedded_io_async::ErrorKind::WriteZero)),
            Ok(n) => bytes = bytes.get(n..).unwrap_or(&[]),
            Err(e) => return Err(Error::io(&e)),
        }
    }
    Ok(())
}

/// A request on its way out: bytes gather in a bounded buffer that is written to the
/// connection whenever it fills, so a request of any size (a script of a kilobyte, a
/// key of 256 bytes) needs no more RAM than the buffer.
pub(crate) struct Out<'c, 'b, C> {
    conn: &'c mut C,
    buf: &'b mut [u8],
    len: usize,
}

impl<'c, 'b, C: Write> Out<'c, 'b, C> {
    pub(crate) fn new(conn: &'c mut C, buf: &'b mut [u8]) -> Self {
        Out { conn, buf, len: 0 }
    }

    /// Appends `bytes`, writing out the buffer each time it fills.
    pub(crate) async fn put(&mut self, mut bytes: &[u8]) -> Result<(), Error> {
        if self.buf.is_empty() {
            // No buffer at all: write straight through.
            return write_all(self.conn, bytes).await;
        }
        while !bytes.is_empty() {
            if self.len >= self.buf.len() {
                self.drain().await?;
            }
            let free = self.buf.get_mut(self.len..).unwrap_or(&mut []);
            let mut n = 0;
            for (dst, &src) in free.iter_mut().zip(bytes) {
                *dst = src;
                n += 1;
            }
            self.len += n;
            bytes = bytes.get(n..).unwrap_or(&[]);
        }
        Ok(())
    }

    async fn drain(&mut self) -> Result<(), Error> {
        write_all(self.conn, self.buf.get(..self.len).unwrap_or(&[])).await?;
        self.len = 0;
        Ok(())
    }

    /// `n` in decimal (no framing).
    pub(crate) async fn number(&mut self, n: u64) -> Result<(), Error> {
        let mut digits = [0u8; 20];
        let at = decimal(n, &mut digits);
        self.put(digits.get(at..).unwrap_or(&[])).await
    }

    /// Writes out what is left and flushes the connection: the request is sent.
    pub(crate) async fn send(mut self) -> Result<(), Error> {
        self.drain().await?;
        self.conn.flush().await.map_err(|e| Error::io(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn parses_what_the_scripts_answer() {
        let (reply, used) = parse(b"*2\r\n:1\r\n$2\r\n42\r\n").unwrap();
        assert_eq!(used, 16);
        let Reply::Array(items) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(
            items.as_slice(),
            &[Scalar::Int(1), Scalar::Bulk(Some(b"42"))]
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

    /// A connection that records what is written, in writes of at most 3 bytes.
    struct Sink(Vec<u8>);

    impl embedded_io_async::ErrorType for Sink {
        type Error = core::convert::Infallible;
    }

    impl Write for Sink {
        async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
            let n = buf.len().min(3);
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        async fn flush(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    #[test]
    fn requests_of_any_size_pass_through_a_small_buffer() {
        let long = [b'k'; 300];
        for size in [0usize, 1, 7, 64] {
            let mut sink = Sink(Vec::new());
            let mut buf = std::vec![0u8; size];
            futures::executor::block_on(async {
                let mut out = Out::new(&mut sink, &mut buf);
                out.put(b"*3\r\n$3\r\nGET\r\n$300\r\n").await.unwrap();
                out.put(&long).await.unwrap();
                out.put(b"\r\n$20\r\n").await.unwrap();
                out.number(u64::MAX).await.unwrap();
                out.put(b"\r\n").await.unwrap();
                out.send().await.unwrap();
            });
            let mut want = b"*3\r\n$3\r\nGET\r\n$300\r\n".to_vec();
            want.extend_from_slice(&long);
            want.extend_from_slice(b"\r\n$20\r\n18446744073709551615\r\n");
            assert_eq!(sink.0, want, "buffer of {size}");
        }
    }
}
