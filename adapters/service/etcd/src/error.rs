//! Typed errors: what went wrong, precisely enough to log and to test.

use std::fmt;

use leasehold::Indeterminate;

/// Which request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Connecting (building the client).
    Connect,
    /// The read of the key that starts an acquire.
    Read,
    /// `LeaseGrant` for an acquire.
    Grant,
    /// The acquire transaction (`create_revision == 0` → put).
    Acquire,
    /// `LeaseKeepAlive` (a renewal, or the re-grant of an acquire whose answer was lost).
    KeepAlive,
    /// `LeaseTimeToLive`, asked when a keep-alive stream refuses a lease.
    TimeToLive,
    /// The ownership check after a keep-alive (a read-only transaction comparing value,
    /// create revision and lease).
    Check,
    /// The release transaction (compare value → delete).
    Release,
    /// `LeaseRevoke`.
    Revoke,
    /// The revocation watch (its initial read, or the watch stream).
    Watch,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Connect => "connect",
            Op::Read => "read key",
            Op::Grant => "lease grant",
            Op::Acquire => "acquire txn",
            Op::KeepAlive => "lease keep-alive",
            Op::TimeToLive => "lease time-to-live",
            Op::Check => "ownership check txn",
            Op::Release => "release txn",
            Op::Revoke => "lease revoke",
            Op::Watch => "watch",
        })
    }
}

/// Why a request to etcd did not produce a definitive answer.
///
/// Every variant is an *unknown* outcome for the lease: the
/// [`LockService`](leasehold_driver::LockService) impl turns it into
/// [`Indeterminate`] (see [`EtcdLockError::indeterminate`]), logs it with `tracing`,
/// and the lease retries inside its remaining budget. None of them is ever read as
/// "granted" or "renewed".
#[derive(Debug)]
#[non_exhaustive]
pub enum EtcdLockError {
    /// The connection failed: refused, reset, closed, no endpoint reachable.
    Transport {
        /// The request.
        op: Op,
        /// What the client said.
        detail: String,
    },
    /// No answer within the configured request timeout.
    Timeout {
        /// The request.
        op: Op,
        /// The timeout that elapsed.
        after: std::time::Duration,
    },
    /// etcd answered with an error of its own: `etcdserver: no leader`,
    /// `etcdserver: request timed out`, `etcdserver: too many requests`, a permission
    /// error…
    Service {
        /// The request.
        op: Op,
        /// The gRPC status code, e.g. `Unavailable`.
        code: String,
        /// etcd's message.
        message: String,
    },
    /// etcd (or whatever answered) said something this client cannot interpret: a
    /// missing field, an impossible revision, a reply that is not HTTP/2 gRPC.
    Protocol {
        /// The request.
        op: Op,
        /// What was wrong (truncated to 200 characters).
        detail: String,
    },
    /// The request was not sent: the key or the TTL cannot be expressed.
    InvalidRequest {
        /// The request.
        op: Op,
        /// Why.
        reason: &'static str,
    },
    /// The endpoints or the settings cannot be used. Only
    /// [`Builder::connect`](crate::Builder::connect) returns it.
    Config(String),
}

impl EtcdLockError {
    /// The request that failed.
    pub fn op(&self) -> Op {
        match self {
            EtcdLockError::Transport { op, .. }
            | EtcdLockError::Timeout { op, .. }
            | EtcdLockError::Service { op, .. }
            | EtcdLockError::Protocol { op, .. }
            | EtcdLockError::InvalidRequest { op, .. } => *op,
            EtcdLockError::Config(_) => Op::Connect,
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
            EtcdLockError::Transport { .. } => Indeterminate::Transport,
            EtcdLockError::Timeout { .. } => Indeterminate::Timeout,
            EtcdLockError::Service { .. } => Indeterminate::Service,
            EtcdLockError::Protocol { .. }
            | EtcdLockError::InvalidRequest { .. }
            | EtcdLockError::Config(_) => Indeterminate::Protocol,
        }
    }

    pub(crate) fn protocol(op: Op, detail: impl fmt::Display) -> EtcdLockError {
        EtcdLockError::Protocol {
            op,
            detail: truncate(detail.to_string()),
        }
    }

    /// Sorts a client error into transport, timeout, service or protocol trouble.
    pub(crate) fn from_client(op: Op, err: etcd_client::Error) -> EtcdLockError {
        use etcd_client::Error as E;
        match err {
            E::GRpcStatus(status) => EtcdLockError::from_status(op, &status),
            E::TransportError(e) => EtcdLockError::Transport {
                op,
                detail: truncate(error_chain(&e)),
            },
            E::IoError(e) => EtcdLockError::Transport {
                op,
                detail: truncate(e.to_string()),
            },
            // The client's request channel into a stream closed: the stream is gone.
            E::WatchError(e) | E::LeaseKeepAliveError(e) => EtcdLockError::Transport {
                op,
                detail: truncate(e),
            },
            E::InvalidArgs(e) | E::EndpointError(e) => EtcdLockError::Config(truncate(e)),
            E::InvalidUri(e) => EtcdLockError::Config(e.to_string()),
            other => EtcdLockError::protocol(op, other),
        }
    }

    fn from_status(op: Op, status: &tonic::Status) -> EtcdLockError {
        use tonic::Code;
        let message = status.message();
        let code = status.code();
        // etcd's own errors: "etcdserver: no leader", "etcdserver: request timed out",
        // "etcdserver: requested lease not found", "mvcc: required revision has been
        // compacted", "auth: ..."; they come with various codes.
        let from_etcd = ["etcdserver:", "mvcc:", "auth:", "lease:"]
            .iter()
            .any(|prefix| message.starts_with(prefix));
        match code {
            Code::DeadlineExceeded if !from_etcd => EtcdLockError::Timeout {
                op,
                after: std::time::Duration::ZERO,
            },
            _ if from_etcd => EtcdLockError::Service {
                op,
                code: format!("{code:?}"),
                message: truncate(message.to_owned()),
            },
            Code::Unavailable | Code::Cancelled => EtcdLockError::Transport {
                op,
                detail: truncate(status_text(status)),
            },
            // tonic reports both a broken connection and an answer that is not
            // HTTP/2 gRPC (a peer that is not etcd, a corrupting proxy) this way.
            Code::Unknown | Code::Internal | Code::DataLoss | Code::Unimplemented => {
                let text = status_text(status);
                let garbled = ["protocol error", "decode", "invalid", "malformed"]
                    .iter()
                    .any(|sign| text.contains(sign));
                if !garbled && text.contains("transport error") {
                    EtcdLockError::Transport {
                        op,
                        detail: truncate(text),
                    }
                } else {
                    EtcdLockError::protocol(op, text)
                }
            }
            _ => EtcdLockError::Service {
                op,
                code: format!("{code:?}"),
                message: truncate(message.to_owned()),
            },
        }
    }
}

/// A status's message with its source chain (tonic hides the transport cause there).
pub(crate) fn status_text(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An error with its source chain.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// At most 200 characters, cut on a character boundary.
fn truncate(mut text: String) -> String {
    if text.len() > 200 {
        let mut cut = 200;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

impl fmt::Display for EtcdLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdLockError::Transport { op, detail } => {
                write!(f, "{op}: connection to etcd failed: {detail}")
            }
            EtcdLockError::Timeout { op, after } if after.is_zero() => {
                write!(f, "{op}: deadline exceeded")
            }
            EtcdLockError::Timeout { op, after } => {
                write!(f, "{op}: no answer from etcd within {after:?}")
            }
            EtcdLockError::Service { op, code, message } => {
                write!(f, "{op}: etcd answered an error ({code}): {message}")
            }
            EtcdLockError::Protocol { op, detail } => {
                write!(f, "{op}: unintelligible answer: {detail}")
            }
            EtcdLockError::InvalidRequest { op, reason } => write!(f, "{op}: not sent: {reason}"),
            EtcdLockError::Config(detail) => write!(f, "unusable etcd settings: {detail}"),
        }
    }
}

impl std::error::Error for EtcdLockError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_is_indeterminate_with_its_kind() {
        let cases = [
            (
                EtcdLockError::Transport {
                    op: Op::Grant,
                    detail: "refused".into(),
                },
                Indeterminate::Transport,
            ),
            (
                EtcdLockError::Timeout {
                    op: Op::KeepAlive,
                    after: std::time::Duration::from_millis(5),
                },
                Indeterminate::Timeout,
            ),
            (
                EtcdLockError::Service {
                    op: Op::Acquire,
                    code: "Unavailable".into(),
                    message: "etcdserver: no leader".into(),
                },
                Indeterminate::Service,
            ),
            (
                EtcdLockError::protocol(Op::Check, "no header"),
                Indeterminate::Protocol,
            ),
            (
                EtcdLockError::InvalidRequest {
                    op: Op::Grant,
                    reason: "empty key",
                },
                Indeterminate::Protocol,
            ),
        ];
        for (err, kind) in cases {
            assert_eq!(err.indeterminate(), kind, "{err}");
        }
    }

    #[test]
    fn etcd_messages_are_service_errors_whatever_their_code() {
        let status = tonic::Status::unavailable("etcdserver: no leader");
        let err = EtcdLockError::from_client(Op::KeepAlive, status.into());
        assert!(
            matches!(&err, EtcdLockError::Service { message, .. } if message == "etcdserver: no leader"),
            "{err:?}"
        );
        let status = tonic::Status::unavailable("tcp connect error");
        let err = EtcdLockError::from_client(Op::KeepAlive, status.into());
        assert!(matches!(err, EtcdLockError::Transport { .. }), "{err:?}");
        let status = tonic::Status::internal("h2 protocol error");
        let err = EtcdLockError::from_client(Op::KeepAlive, status.into());
        assert!(matches!(err, EtcdLockError::Protocol { .. }), "{err:?}");
    }

    #[test]
    fn long_details_are_truncated_on_a_char_boundary() {
        let text = "é".repeat(300);
        let cut = truncate(text);
        assert!(cut.ends_with('…'));
        assert!(cut.len() <= 204);
    }
}
