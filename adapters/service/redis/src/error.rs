//! Typed errors: what went wrong, precisely enough to log and to test.

use std::fmt;

use leasehold::Indeterminate;
use redis::{ErrorKind, RedisError, Value};

/// Which request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Connecting and loading the scripts.
    Connect,
    /// The acquire script.
    Acquire,
    /// The renew script.
    Renew,
    /// The release script.
    Release,
    /// [`RedisLockService::raise_fence`](crate::RedisLockService::raise_fence).
    RaiseFence,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Connect => "connect",
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::RaiseFence => "raise fence",
        })
    }
}

/// Redis answered something the scripts never produce: a different script behind the
/// SHA, a proxy that rewrites replies, a fence that is not a positive integer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError {
    /// The request.
    pub op: Op,
    /// What the script answers.
    pub expected: &'static str,
    /// What came back, rendered (truncated to 200 characters).
    pub found: String,
}

impl ProtocolError {
    pub(crate) fn new(op: Op, expected: &'static str, found: &Value) -> ProtocolError {
        let mut found = format!("{found:?}");
        if found.len() > 200 {
            let mut cut = 200;
            while !found.is_char_boundary(cut) {
                cut -= 1;
            }
            found.truncate(cut);
            found.push('…');
        }
        ProtocolError {
            op,
            expected,
            found,
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: expected {}, Redis answered {}",
            self.op, self.expected, self.found
        )
    }
}

impl std::error::Error for ProtocolError {}

/// Why a request to Redis did not produce a definitive answer.
///
/// Every variant is an *unknown* outcome for the lease: the
/// [`LockService`](leasehold_driver::LockService) impl turns it into
/// [`Indeterminate`] (see [`RedisLockError::indeterminate`]), and the lease retries
/// inside its remaining budget. None of them is ever read as "granted" or "renewed".
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisLockError {
    /// The connection failed: refused, reset, closed, or could not be re-established.
    Transport {
        /// The request.
        op: Op,
        /// The client's error.
        source: RedisError,
    },
    /// No answer within the configured request timeout.
    Timeout {
        /// The request.
        op: Op,
        /// The timeout that elapsed.
        after: std::time::Duration,
    },
    /// Redis answered with an error reply: `WRONGTYPE` (a key holds a hash, a list…),
    /// `LEASEHOLD` (the fence counter is not an integer), `READONLY` (a replica),
    /// `LOADING`, `BUSY`, `OOM`, `NOPERM`, `CROSSSLOT`…
    Service {
        /// The request.
        op: Op,
        /// The error code (the reply's first word), e.g. `WRONGTYPE`.
        code: String,
        /// The rest of the reply.
        message: String,
    },
    /// Redis answered something the scripts never produce.
    Protocol(ProtocolError),
    /// The request was not sent: the key or TTL cannot be expressed (see
    /// [`Keys::new`](crate::Keys::new)).
    InvalidRequest {
        /// The request.
        op: Op,
        /// Why.
        reason: &'static str,
    },
    /// The URL or the settings cannot be used (malformed URL, `rediss://` without
    /// the `tls` feature). Only [`Builder::connect`](crate::Builder::connect) returns it.
    Config(RedisError),
}

impl RedisLockError {
    /// The request that failed.
    pub fn op(&self) -> Op {
        match self {
            RedisLockError::Transport { op, .. }
            | RedisLockError::Timeout { op, .. }
            | RedisLockError::Service { op, .. }
            | RedisLockError::InvalidRequest { op, .. } => *op,
            RedisLockError::Protocol(e) => e.op,
            RedisLockError::Config(_) => Op::Connect,
        }
    }

    /// The indeterminate outcome the lease sees for this error.
    ///
    /// | error | [`Indeterminate`] |
    /// |---|---|
    /// | `Transport` | `Transport` |
    /// | `Timeout` | `Timeout` |
    /// | `Service` | `Service` |
    /// | `Protocol`, `InvalidRequest`, `Config` | `Protocol` |
    pub fn indeterminate(&self) -> Indeterminate {
        match self {
            RedisLockError::Transport { .. } => Indeterminate::Transport,
            RedisLockError::Timeout { .. } => Indeterminate::Timeout,
            RedisLockError::Service { .. } => Indeterminate::Service,
            RedisLockError::Protocol(_)
            | RedisLockError::InvalidRequest { .. }
            | RedisLockError::Config(_) => Indeterminate::Protocol,
        }
    }

    /// The error code of a `Service` error (`WRONGTYPE`, `READONLY`…).
    pub fn service_code(&self) -> Option<&str> {
        match self {
            RedisLockError::Service { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Sorts a client error into transport, service or protocol trouble.
    pub(crate) fn from_redis(op: Op, err: RedisError) -> RedisLockError {
        match err.kind() {
            ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::AuthenticationFailed => {
                let code = err.code().unwrap_or("ERR").to_owned();
                let message = err.detail().unwrap_or_default().to_owned();
                RedisLockError::Service { op, code, message }
            }
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
                RedisLockError::Protocol(ProtocolError {
                    op,
                    expected: "a well-formed RESP reply",
                    found: err.to_string(),
                })
            }
            _ => RedisLockError::Transport { op, source: err },
        }
    }
}

impl fmt::Display for RedisLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisLockError::Transport { op, source } => {
                write!(f, "{op}: connection to Redis failed: {source}")
            }
            RedisLockError::Timeout { op, after } => {
                write!(f, "{op}: no answer from Redis within {after:?}")
            }
            RedisLockError::Service { op, code, message } => {
                write!(f, "{op}: Redis answered an error: {code} {message}")
            }
            RedisLockError::Protocol(e) => e.fmt(f),
            RedisLockError::InvalidRequest { op, reason } => write!(f, "{op}: not sent: {reason}"),
            RedisLockError::Config(source) => write!(f, "unusable Redis settings: {source}"),
        }
    }
}

impl std::error::Error for RedisLockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisLockError::Transport { source, .. } | RedisLockError::Config(source) => {
                Some(source)
            }
            RedisLockError::Protocol(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ProtocolError> for RedisLockError {
    fn from(e: ProtocolError) -> Self {
        RedisLockError::Protocol(e)
    }
}
