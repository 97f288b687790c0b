//! Typed errors, and how each becomes a final refusal or an unknown outcome.

use core::fmt;

use leasehold::{Indeterminate, KeyError, Refusal};

/// Why a request got no answer the scripts give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Error {
    /// The key breaks [`leasehold::check_key`]: refused before anything is sent.
    InvalidKey(KeyError),
    /// An acquire or a renewal asked for a TTL above the service's
    /// [`max_ttl`](crate::RespLockService::with_max_ttl), which its quarantine after a
    /// loss of state would not cover: refused before anything is sent.
    TtlAboveMax,
    /// The connection factory failed to connect.
    Connect,
    /// The connection failed while sending or reading.
    Io(embedded_io_async::ErrorKind),
    /// The server closed the connection before the reply was complete.
    Closed,
    /// No whole answer within the service's request timeout.
    Timeout,
    /// Another request of this service is in flight (one per connection): the caller
    /// issued two at once.
    Busy,
    /// Redis answered something this client cannot interpret.
    Protocol(ProtocolError),
    /// Redis answered an error reply.
    Server(ServerError),
    /// Redis refused `AUTH` (a wrong password, a user name to a Redis before 6, a
    /// password to a Redis that has none): whatever the code, the credentials or the
    /// configuration are wrong, and retrying cannot help.
    AuthRefused(ServerError),
}

/// An answer that does not parse, or parses to something the scripts never answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ProtocolError {
    /// Not RESP as Redis writes it (or a type the scripts never answer).
    Malformed,
    /// The reply does not fit in the read buffer (the const generic `R`).
    ReplyTooLong,
    /// Bytes after the reply: an answer to a request never sent.
    TrailingBytes,
    /// Well-formed, but not what the script answers.
    Unexpected,
    /// `SCRIPT LOAD` answered another SHA1 than the script's.
    WrongSha,
}

/// An error reply from Redis: its code (the first word, cut to
/// [`ServerError::CODE_CAPACITY`] bytes) and whether it is final.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ServerError {
    code: [u8; ServerError::CODE_CAPACITY],
    len: u8,
}

impl ServerError {
    /// The longest code kept, in bytes (`LEASEHOLD_EXHAUSTED` is 19).
    pub const CODE_CAPACITY: usize = 24;

    /// From the line of an error reply, after the `-`.
    pub(crate) fn from_line(line: &[u8]) -> ServerError {
        let word = line.split(|&b| b == b' ').next().unwrap_or(&[]);
        let mut code = [0u8; ServerError::CODE_CAPACITY];
        let mut len = 0u8;
        for (slot, &b) in code.iter_mut().zip(word) {
            *slot = if b.is_ascii_graphic() { b } else { b'?' };
            len += 1;
        }
        ServerError { code, len }
    }

    /// The error code Redis sent: `WRONGTYPE`, `NOAUTH`, `LOADING`…
    pub fn code(&self) -> &str {
        // ASCII by construction (see `from_line`): one valid chunk. (The lease's own
        // path compares `code_bytes` and links no UTF-8 check.)
        self.code_bytes()
            .utf8_chunks()
            .next()
            .map_or("", |chunk| chunk.valid())
    }

    /// The code's bytes.
    pub(crate) fn code_bytes(&self) -> &[u8] {
        self.code.get(..usize::from(self.len)).unwrap_or(&[])
    }

    /// The final refusal this code is, if it is one (the same sorting as
    /// `leasehold-redis`).
    pub fn refusal(&self) -> Option<Refusal> {
        const FINAL: [(&str, Refusal); 6] = [
            ("NOAUTH", Refusal::Unauthorized),
            ("WRONGPASS", Refusal::Unauthorized),
            ("NOPERM", Refusal::Unauthorized),
            ("WRONGTYPE", Refusal::WrongType),
            ("LEASEHOLD", Refusal::WrongType),
            ("LEASEHOLD_EXHAUSTED", Refusal::Unsupported),
        ];
        // Compared with `resp::same`, not `match` on `&str` (which links `memcmp`).
        let code = self.code_bytes();
        FINAL
            .iter()
            .find(|(name, _)| crate::resp::same(code, name.as_bytes()))
            .map(|&(_, refusal)| refusal)
    }
}

impl fmt::Debug for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerError({})", self.code())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for ServerError {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "ServerError({=str})", self.code());
    }
}

impl Error {
    /// The final refusal this error is, if it is one: an invalid key, or an error
    /// reply whose code says retrying cannot help.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::InvalidKey(_) => Some(Refusal::InvalidKey),
            Error::TtlAboveMax => Some(Refusal::Unsupported),
            Error::Server(e) => e.refusal(),
            Error::AuthRefused(_) => Some(Refusal::Unauthorized),
            _ => None,
        }
    }

    /// The unknown outcome this error is, unless it is a [`refusal`](Self::refusal).
    pub fn indeterminate(&self) -> Option<Indeterminate> {
        if self.refusal().is_some() {
            return None;
        }
        Some(match self {
            Error::Timeout => Indeterminate::Timeout,
            Error::Protocol(_) => Indeterminate::Protocol,
            Error::Server(_) => Indeterminate::Service,
            _ => Indeterminate::Transport,
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey(e) => write!(f, "{e}"),
            Error::TtlAboveMax => f.write_str(
                "the TTL asked for is above the service's max_ttl, which its quarantine covers",
            ),
            Error::Connect => {
                f.write_str("cannot connect to Redis (the connection factory failed)")
            }
            Error::Io(kind) => write!(f, "the connection to Redis failed: {kind:?}"),
            Error::Closed => f.write_str("Redis closed the connection mid-reply"),
            Error::Timeout => f.write_str("no answer from Redis within the request timeout"),
            Error::Busy => f.write_str("another request is in flight on this connection"),
            Error::Protocol(p) => write!(f, "unintelligible answer from Redis: {p:?}"),
            Error::Server(e) => write!(f, "Redis answered the error {}", e.code()),
            Error::AuthRefused(e) => write!(f, "Redis refused AUTH: {}", e.code()),
        }
    }
}

impl core::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_sort_like_leasehold_redis() {
        let refusal = |line: &[u8]| Error::Server(ServerError::from_line(line)).refusal();
        assert_eq!(
            refusal(b"WRONGTYPE Operation against a key"),
            Some(Refusal::WrongType)
        );
        assert_eq!(
            refusal(b"LEASEHOLD the lock key holds"),
            Some(Refusal::WrongType)
        );
        assert_eq!(
            refusal(b"LEASEHOLD_EXHAUSTED at 2^63-1"),
            Some(Refusal::Unsupported)
        );
        for auth in [
            &b"NOAUTH Authentication required."[..],
            b"WRONGPASS invalid",
            b"NOPERM no",
        ] {
            assert_eq!(refusal(auth), Some(Refusal::Unauthorized));
        }
        for transient in [&b"LOADING"[..], b"BUSY x", b"READONLY y", b"ERR z", b""] {
            let e = Error::Server(ServerError::from_line(transient));
            assert_eq!(e.refusal(), None);
            assert_eq!(e.indeterminate(), Some(Indeterminate::Service));
        }
        let long = ServerError::from_line(&[b'A'; 100]);
        assert_eq!(long.code().len(), ServerError::CODE_CAPACITY);
        assert_eq!(Error::Timeout.indeterminate(), Some(Indeterminate::Timeout));
        assert_eq!(
            Error::Protocol(ProtocolError::Malformed).indeterminate(),
            Some(Indeterminate::Protocol)
        );
        assert_eq!(
            Error::Closed.indeterminate(),
            Some(Indeterminate::Transport)
        );
    }
}
