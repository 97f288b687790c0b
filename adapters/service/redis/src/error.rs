//! Typed errors: what failed, where, and what to do, precisely enough to log and to
//! test.
//!
//! Each message is complete on its own: `Display` says the request, the endpoint, the
//! cause and, where there is one, the remedy, and `source()` returns `None`, so a log
//! line or an `anyhow` chain prints the cause exactly once.

use std::fmt;

use leasehold::{Indeterminate, KeyError, Refusal};
use leasehold_driver::Clipped;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

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
    /// The holder query.
    Holder,
    /// [`RedisLockService::raise_fence`](crate::RedisLockService::raise_fence).
    RaiseFence,
    /// [`RedisLockService::fenced_write`](crate::RedisLockService::fenced_write).
    FencedWrite,
    /// [`RedisLockService::fenced_read`](crate::RedisLockService::fenced_read).
    FencedRead,
    /// [`mark_data_set_new`](crate::RedisLockService::mark_data_set_new).
    MarkNew,
    /// [`waiting`](crate::RedisLockService::waiting).
    Waiting,
    /// [`watch_holder`](crate::RedisLockService::watch_holder): keyspace notifications.
    HolderWatch,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Connect => "connect",
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::Holder => "holder",
            Op::RaiseFence => "raise fence",
            Op::FencedWrite => "fenced write",
            Op::FencedRead => "fenced read",
            Op::MarkNew => "mark the data set new",
            Op::Waiting => "waiting",
            Op::HolderWatch => "holder watch",
        })
    }
}

/// Redis answered something the scripts never produce: a different script behind the
/// SHA, a proxy that rewrites replies, a fence that is not a positive integer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError {
    /// The request.
    pub op: Op,
    /// Where: `host:port` of the Redis server.
    pub endpoint: String,
    /// What the script answers.
    pub expected: &'static str,
    /// What came back, rendered (cut to 200 bytes, `leasehold_driver::Clipped`).
    pub found: String,
}

impl ProtocolError {
    pub(crate) fn new(op: Op, expected: &'static str, found: &Value) -> ProtocolError {
        ProtocolError {
            op,
            endpoint: String::new(),
            expected,
            found: Clipped(&format!("{found:?}")).to_string(),
        }
    }

    /// The same error, naming the server.
    pub(crate) fn at(mut self, endpoint: &str) -> ProtocolError {
        endpoint.clone_into(&mut self.endpoint);
        self
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {}: expected {}, Redis answered {} (is something other than Redis, or a \
             proxy that rewrites replies, on this address?)",
            self.op, self.endpoint, self.expected, self.found
        )
    }
}

impl std::error::Error for ProtocolError {}

/// Why a request to Redis did not succeed.
///
/// Each error is either a final refusal ([`refusal`](Self::refusal) is `Some`: the
/// [`LockService`](leasehold_driver::LockService) impl answers `Refused`, and the
/// lease never retries it) or an unknown outcome ([`indeterminate`](Self::indeterminate)
/// is `Some`: the impl answers `Indeterminate`, and the lease retries inside its
/// remaining budget). None of them is ever read as "granted" or "renewed".
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisLockError {
    /// The key breaks the key rules ([`leasehold::check_key`]); nothing was sent.
    InvalidKey {
        /// The request.
        op: Op,
        /// The key as given (cut to 200 bytes).
        key: String,
        /// Which rule it breaks.
        error: KeyError,
    },
    /// Redis answered with a refusal that retrying cannot clear: `WRONGTYPE` (the
    /// key holds a hash, a list…), `LEASEHOLD` (it holds a string leasehold did not
    /// write), `WRONGPASS`, `NOAUTH`, `NOPERM` (credentials), `LEASEHOLD_EXHAUSTED`
    /// (the fence counter is at 2^63 - 1).
    Refused {
        /// The request.
        op: Op,
        /// Where: `host:port` of the Redis server.
        endpoint: String,
        /// The final outcome the lease sees.
        refusal: Refusal,
        /// The error code (the reply's first word), e.g. `WRONGTYPE`.
        code: String,
        /// The rest of the reply.
        message: String,
    },
    /// The connection failed: refused, reset, closed, or could not be re-established.
    Transport {
        /// The request.
        op: Op,
        /// Where: `host:port` of the Redis server.
        endpoint: String,
        /// The client's error (its text is part of this error's message).
        cause: RedisError,
    },
    /// The TLS handshake failed for a reason retrying cannot clear: the server's
    /// certificate is not trusted, not for this host or expired, or the server
    /// refused ours (none given, from another CA, expired). A final refusal
    /// (`Unauthorized`): certificates are credentials.
    Tls {
        /// The request.
        op: Op,
        /// Where: `host:port` of the Redis server.
        endpoint: String,
        /// What went wrong.
        problem: leasehold_driver::TlsProblem,
        /// The TLS library's own words.
        detail: String,
    },
    /// No answer within the configured request timeout.
    Timeout {
        /// The request.
        op: Op,
        /// Where: `host:port` of the Redis server.
        endpoint: String,
        /// The timeout that elapsed.
        after: std::time::Duration,
    },
    /// Redis answered with an error reply that may clear: `LOADING`, `READONLY` (a
    /// replica), `BUSY`, `OOM`, `MASTERDOWN`, `ERR`…
    Service {
        /// The request.
        op: Op,
        /// Where: `host:port` of the Redis server.
        endpoint: String,
        /// The error code (the reply's first word), e.g. `LOADING`.
        code: String,
        /// The rest of the reply.
        message: String,
    },
    /// Redis answered something the scripts never produce.
    Protocol(ProtocolError),
    /// The request was not sent: an argument cannot be expressed (a fence beyond what
    /// the counter can hold).
    InvalidRequest {
        /// The request.
        op: Op,
        /// Why.
        reason: &'static str,
    },
    /// A grant or a renewal was made on the primary, but fewer replicas than
    /// [`min_replicas`](crate::RedisLockService::with_min_replicas) confirmed it within
    /// the request timeout: its outcome is unknown (`Indeterminate(Service)`), and the
    /// lease retries within its budget. Persistent when the primary has fewer replicas
    /// connected than that; [`Builder::connect`](crate::Builder::connect) checks it and
    /// fails with this error (`op` `Connect`).
    TooFewReplicas {
        /// The request.
        op: Op,
        /// Where: `host:port` of the Redis server.
        endpoint: String,
        /// `min_replicas`.
        wanted: u32,
        /// How many replicas `WAIT` counted.
        confirmed: u32,
    },
    /// An acquire or a renewal asked for a TTL above the service's
    /// [`max_ttl`](crate::RedisLockService::with_max_ttl), which its quarantine after
    /// a loss of state would not cover. Not sent; a final refusal (`Unsupported`).
    TtlAboveMax {
        /// The request.
        op: Op,
        /// The TTL asked for.
        asked: std::time::Duration,
        /// The service's `max_ttl`.
        max: std::time::Duration,
    },
    /// The URL or the settings cannot be used (malformed URL, `rediss://` without the
    /// `tls` feature). Only [`Builder::connect`](crate::Builder::connect) returns it.
    Config {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// What is wrong with it, and what to do.
        reason: String,
    },
}

impl RedisLockError {
    /// The request that failed.
    pub fn op(&self) -> Op {
        match self {
            RedisLockError::InvalidKey { op, .. }
            | RedisLockError::Refused { op, .. }
            | RedisLockError::Transport { op, .. }
            | RedisLockError::Tls { op, .. }
            | RedisLockError::Timeout { op, .. }
            | RedisLockError::Service { op, .. }
            | RedisLockError::TooFewReplicas { op, .. }
            | RedisLockError::InvalidRequest { op, .. }
            | RedisLockError::TtlAboveMax { op, .. } => *op,
            RedisLockError::Protocol(e) => e.op,
            RedisLockError::Config { .. } => Op::Connect,
        }
    }

    /// The final refusal this error is, if it is one.
    ///
    /// | error | [`Refusal`] |
    /// |---|---|
    /// | `InvalidKey` | `InvalidKey` |
    /// | `Refused` | its `refusal` (`WrongType`, `Unauthorized`, `Unsupported`) |
    /// | `Tls` | `Unauthorized` |
    /// | `InvalidRequest`, `Config` | `Unsupported` |
    /// | others | none: see [`indeterminate`](Self::indeterminate) |
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            RedisLockError::InvalidKey { .. } => Some(Refusal::InvalidKey),
            RedisLockError::Refused { refusal, .. } => Some(*refusal),
            RedisLockError::Tls { .. } => Some(Refusal::Unauthorized),
            RedisLockError::InvalidRequest { .. }
            | RedisLockError::TtlAboveMax { .. }
            | RedisLockError::Config { .. } => Some(Refusal::Unsupported),
            _ => None,
        }
    }

    /// The unknown outcome this error is, unless it is a [`refusal`](Self::refusal).
    ///
    /// | error | [`Indeterminate`] |
    /// |---|---|
    /// | `Transport` | `Transport` |
    /// | `Timeout` | `Timeout` |
    /// | `Service` | `Service` |
    /// | `Protocol` | `Protocol` |
    pub fn indeterminate(&self) -> Option<Indeterminate> {
        match self {
            RedisLockError::Transport { .. } => Some(Indeterminate::Transport),
            RedisLockError::Timeout { .. } => Some(Indeterminate::Timeout),
            RedisLockError::Service { .. } | RedisLockError::TooFewReplicas { .. } => {
                Some(Indeterminate::Service)
            }
            RedisLockError::Protocol(_) => Some(Indeterminate::Protocol),
            _ => None,
        }
    }

    /// The Redis error code of a `Refused` or `Service` error (`WRONGTYPE`,
    /// `READONLY`…).
    pub fn service_code(&self) -> Option<&str> {
        match self {
            RedisLockError::Refused { code, .. } | RedisLockError::Service { code, .. } => {
                Some(code)
            }
            _ => None,
        }
    }

    /// Sorts a client error into refusal, transport, service or protocol trouble.
    pub(crate) fn from_redis(op: Op, endpoint: &str, err: RedisError) -> RedisLockError {
        let endpoint = endpoint.to_owned();
        let kind = err.kind();
        let code = err.code().unwrap_or_default().to_owned();
        let message = err.detail().unwrap_or_default().trim().to_owned();
        let refusal = match (kind, code.as_str()) {
            (ErrorKind::AuthenticationFailed, _)
            | (ErrorKind::Server(ServerErrorKind::NoPerm), _)
            | (_, "WRONGPASS" | "NOAUTH" | "NOPERM") => Some(Refusal::Unauthorized),
            (_, "WRONGTYPE" | "LEASEHOLD") => Some(Refusal::WrongType),
            // A standalone client on a cluster node: the lock's keys and the data set's
            // epoch marker are in different slots.
            (_, "LEASEHOLD_EXHAUSTED" | "CROSSSLOT") => Some(Refusal::Unsupported),
            _ => None,
        };
        if let Some(refusal) = refusal {
            // An AUTH refused during the handshake has no reply text in the client's
            // error (Redis answers `WRONGPASS` to it): name what happened.
            let (code, message) = if code.is_empty() {
                (
                    "WRONGPASS".to_owned(),
                    "(to the AUTH of the connection handshake)".to_owned(),
                )
            } else if code == "CROSSSLOT" {
                let hint = "; this Redis runs in cluster mode: connect with \
                            RedisLockService::connect_cluster (feature `cluster`)";
                (code, format!("{message}{hint}"))
            } else {
                (code, message)
            };
            return RedisLockError::Refused {
                op,
                endpoint,
                refusal,
                code,
                message,
            };
        }
        if !matches!(kind, ErrorKind::Server(_) | ErrorKind::Extension) {
            let detail = err.to_string();
            if let Some(problem) = leasehold_driver::TlsProblem::from_error_text(&detail) {
                return RedisLockError::Tls {
                    op,
                    endpoint,
                    problem,
                    detail,
                };
            }
        }
        match kind {
            ErrorKind::Server(_) | ErrorKind::Extension => RedisLockError::Service {
                op,
                endpoint,
                code: if code.is_empty() { "ERR".into() } else { code },
                message,
            },
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
                RedisLockError::Protocol(ProtocolError {
                    op,
                    endpoint,
                    expected: "a well-formed RESP reply",
                    found: Clipped(&err.to_string()).to_string(),
                })
            }
            _ => RedisLockError::Transport {
                op,
                endpoint,
                cause: err,
            },
        }
    }
}

impl fmt::Display for RedisLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisLockError::InvalidKey { op, key, error } => write!(
                f,
                "{op} {key:?}: {error}; use 1 to {} bytes without braces or control characters",
                leasehold::MAX_KEY_LEN
            ),
            RedisLockError::Refused {
                op,
                endpoint,
                refusal,
                code,
                message,
            } => {
                let (what, remedy) = match (refusal, code.as_str()) {
                    (Refusal::Unauthorized, "NOPERM") => (
                        "permission denied",
                        "grant the Redis user the commands EVALSHA, SCRIPT, GET, SET, INCR, \
                         TIME, PEXPIRE, PTTL and DEL on the lock keys (ACL SETUSER)",
                    ),
                    (Refusal::Unauthorized, "NOAUTH") => (
                        "authentication failed: check the password",
                        "Redis requires one: redis://:PASSWORD@host:port",
                    ),
                    (Refusal::Unauthorized, _) => (
                        "authentication failed: check the password",
                        "and the user name, if the URL has one",
                    ),
                    (Refusal::WrongType, "LEASEHOLD") if *op == Op::FencedWrite => (
                        "the fenced data's fence key holds something that is not a fence",
                        "another program uses `{name}:data:fence`: pick another name, or \
                         delete both of its keys (which forgets the newest fence)",
                    ),
                    (Refusal::WrongType, "LEASEHOLD") => (
                        "the lock's keys hold a value leasehold did not write",
                        "another program uses this key: pick another key, or delete it",
                    ),
                    (Refusal::WrongType, _) => (
                        "the key holds a Redis type other than a string",
                        "another program uses this key: pick another key, or delete it",
                    ),
                    (_, "LEASEHOLD_EXHAUSTED") => (
                        "no fence is left for a new grant",
                        "use another key; resetting the counter would let old fences \
                         pass fenced storage",
                    ),
                    _ => ("refused", "retrying will not help"),
                };
                write!(
                    f,
                    "{op} on {endpoint}: {what} ({remedy}); Redis said: {code}"
                )?;
                if !message.is_empty() {
                    write!(f, " {message}")?;
                }
                Ok(())
            }
            RedisLockError::Transport {
                op,
                endpoint,
                cause,
            } => {
                write!(f, "{op} on {endpoint}: connection failed: {cause}")?;
                if cause.is_connection_refusal() {
                    f.write_str(" (is redis-server running and listening at that address?)")?;
                }
                Ok(())
            }
            RedisLockError::Tls {
                op,
                endpoint,
                problem,
                detail,
            } => write!(f, "{op} on {endpoint}: TLS: {problem}; {detail}"),
            RedisLockError::Timeout {
                op,
                endpoint,
                after,
            } => write!(
                f,
                "{op} on {endpoint}: no answer within {after:?} (Redis is stopped, overloaded \
                 or unreachable; the lease retries within its budget)"
            ),
            RedisLockError::Service {
                op,
                endpoint,
                code,
                message,
            } => write!(
                f,
                "{op} on {endpoint}: Redis answered an error that may clear: {code} {message}"
            ),
            RedisLockError::Protocol(e) => e.fmt(f),
            RedisLockError::InvalidRequest { op, reason } => write!(f, "{op}: not sent: {reason}"),
            RedisLockError::TooFewReplicas {
                op: Op::Connect,
                endpoint,
                wanted,
                confirmed,
            } => write!(
                f,
                "connect to {endpoint}: min_replicas({wanted}), but the primary has {confirmed} \
                 replica(s) connected (INFO replication), so no grant could be confirmed; connect the \
                 replicas first, or lower min_replicas"
            ),
            RedisLockError::TooFewReplicas {
                op,
                endpoint,
                wanted,
                confirmed,
            } => write!(
                f,
                "{op} on {endpoint}: done on the primary, but {confirmed} of the {wanted} \
                 replicas asked for (min_replicas) confirmed it in time, so it does not count \
                 (the lease retries within its budget); check `ROLE` on the primary: fewer \
                 replicas connected than min_replicas never confirm"
            ),
            RedisLockError::TtlAboveMax { op, asked, max } => write!(
                f,
                "{op}: not sent: a TTL of {asked:?} is above this service's max_ttl of \
                 {max:?}, the quarantine that covers the grants Redis may lose; raise max_ttl \
                 (the same on every client of this Redis) or ask for less"
            ),
            RedisLockError::Config { url, reason } => {
                write!(f, "unusable Redis URL `{url}`: {reason}")
            }
        }
    }
}

/// Every message carries its cause (see the module docs): no `source()`.
impl std::error::Error for RedisLockError {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    const AT: &str = "127.0.0.1:6379";

    fn server_error(reply: &str) -> RedisError {
        let mut parser = redis::Parser::new();
        match parser.parse_value(reply.as_bytes()) {
            Ok(Value::ServerError(e)) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    fn text(op: Op, err: RedisError) -> (RedisLockError, String) {
        let e = RedisLockError::from_redis(op, AT, err);
        let shown = e.to_string();
        (e, shown)
    }

    #[test]
    fn a_wrong_password_names_the_address_and_the_remedy_never_an_empty_err() {
        let handshake = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        let (e, shown) = text(Op::Connect, handshake);
        assert_eq!(e.refusal(), Some(Refusal::Unauthorized));
        assert!(
            shown.starts_with(
                "connect on 127.0.0.1:6379: authentication failed: check the password"
            ),
            "{shown}"
        );
        assert!(!shown.contains("ERR "), "{shown}");
        assert!(e.source().is_none());

        let (e, shown) = text(
            Op::Renew,
            server_error("-WRONGPASS invalid username-password pair or user is disabled.\r\n"),
        );
        assert_eq!(e.refusal(), Some(Refusal::Unauthorized));
        assert!(
            shown.contains("authentication failed: check the password"),
            "{shown}"
        );
        assert_eq!(
            shown.matches("invalid username-password pair").count(),
            1,
            "{shown}"
        );

        let (_, shown) = text(
            Op::Connect,
            server_error("-NOAUTH Authentication required.\r\n"),
        );
        assert!(shown.contains("redis://:PASSWORD@host:port"), "{shown}");
        let (e, shown) = text(
            Op::Acquire,
            server_error("-NOPERM User app has no permissions to run the 'evalsha' command\r\n"),
        );
        assert_eq!(e.refusal(), Some(Refusal::Unauthorized));
        assert!(
            shown.contains("permission denied") && shown.contains("ACL"),
            "{shown}"
        );
    }

    #[test]
    fn wrongtype_and_foreign_values_are_wrong_type_refusals() {
        let (e, shown) = text(
            Op::Acquire,
            server_error("-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"),
        );
        assert_eq!(e.refusal(), Some(Refusal::WrongType));
        assert_eq!(e.indeterminate(), None);
        assert!(shown.contains("acquire on 127.0.0.1:6379"), "{shown}");
        assert!(shown.contains("pick another key"), "{shown}");
        let (e, shown) = text(Op::Holder, server_error("-LEASEHOLD not a lease value\r\n"));
        assert_eq!(e.refusal(), Some(Refusal::WrongType));
        assert!(
            shown.contains("did not write") && shown.contains("not a lease value"),
            "what + Redis's words: {shown}"
        );
        let (e, _) = text(
            Op::Acquire,
            server_error("-LEASEHOLD_EXHAUSTED the fence counter is at 2^63-1\r\n"),
        );
        assert_eq!(e.refusal(), Some(Refusal::Unsupported));
    }

    #[test]
    fn transient_errors_are_indeterminate() {
        for reply in [
            "-LOADING Redis is loading the dataset in memory\r\n",
            "-READONLY You can't write against a read only replica.\r\n",
            "-BUSY Redis is busy running a script.\r\n",
            "-OOM command not allowed when used memory > 'maxmemory'.\r\n",
        ] {
            let (e, shown) = text(Op::Renew, server_error(reply));
            assert_eq!(e.refusal(), None, "{reply}");
            assert_eq!(e.indeterminate(), Some(Indeterminate::Service), "{reply}");
            assert!(shown.starts_with("renew on 127.0.0.1:6379: "), "{shown}");
        }
    }

    #[test]
    fn a_refused_connection_names_the_address_once() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let (e, shown) = text(Op::Connect, io.into());
        assert_eq!(e.indeterminate(), Some(Indeterminate::Transport));
        assert!(shown.contains("127.0.0.1:6379"), "{shown}");
        assert!(shown.contains("is redis-server running"), "{shown}");
        assert_eq!(
            shown.to_lowercase().matches("refused").count(),
            1,
            "{shown}"
        );
        assert!(e.source().is_none(), "the cause is in the message, once");
    }

    #[test]
    fn invalid_keys_say_which_rule_and_what_to_do() {
        let e = RedisLockError::InvalidKey {
            op: Op::Acquire,
            key: "a{b}".into(),
            error: KeyError::Brace { at: 1 },
        };
        assert_eq!(e.refusal(), Some(Refusal::InvalidKey));
        assert_eq!(
            e.to_string(),
            "acquire \"a{b}\": invalid key: a brace at byte 1 (braces are reserved for hash \
             tags); use 1 to 256 bytes without braces or control characters"
        );
    }

    #[test]
    fn timeouts_and_protocol_errors_say_where_and_why() {
        let e = RedisLockError::Timeout {
            op: Op::Renew,
            endpoint: AT.into(),
            after: std::time::Duration::from_millis(250),
        };
        assert_eq!(e.indeterminate(), Some(Indeterminate::Timeout));
        assert!(e
            .to_string()
            .starts_with("renew on 127.0.0.1:6379: no answer within 250ms"));
        let p = ProtocolError::new(Op::Acquire, "an array", &Value::Okay).at(AT);
        assert!(
            p.to_string().starts_with("acquire on 127.0.0.1:6379: "),
            "{p}"
        );
        assert!(
            p.to_string().contains("expected an array, Redis answered"),
            "{p}"
        );
        let long = ProtocolError::new(Op::Acquire, "x", &Value::BulkString(vec![b'a'; 1_000]));
        assert!(long.found.len() <= 203, "{}", long.found.len());
    }
}
