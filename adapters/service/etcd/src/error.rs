//! Typed errors: what failed, where, and what to do — precise enough to log and test.
//!
//! [`EtcdLockError`]'s `Display` gives the context (the request, the key, the etcd
//! endpoints, what to do); [`source`](std::error::Error::source) gives the cause (the
//! client's error, etcd's status, the key rule broken). Neither repeats the other, so
//! a log line that prints the whole chain says each thing once.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use leasehold::{Indeterminate, Refusal};
use leasehold_driver::Clipped;

/// Which request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Connecting (building the client; authenticating if a user is set).
    Connect,
    /// The read of the key that starts an acquire.
    Read,
    /// `LeaseGrant` for an acquire.
    Grant,
    /// The acquire transaction (`create_revision == 0` and the counter unmoved → put).
    Acquire,
    /// `LeaseKeepAlive` (a renewal, or the re-grant of an acquire whose answer was lost).
    KeepAlive,
    /// `LeaseTimeToLive`: the holder's remaining TTL, or whether a refused lease is gone.
    TimeToLive,
    /// The ownership check after a keep-alive (a read of the key).
    Check,
    /// The release (a read of the key, then a compare-and-delete transaction).
    Release,
    /// `LeaseRevoke`.
    Revoke,
    /// The holder query (a read of the key).
    Holder,
    /// The revocation watch (its initial read, or the watch stream).
    Watch,
    /// The holder watch of an observer (its initial read, or the watch stream).
    HolderWatch,
    /// [`raise_fence`](crate::EtcdLockService::raise_fence): a read of the fence
    /// counter, then a compare-and-put.
    RaiseFence,
    /// Starting a quarantine after etcd may have lost grants: a lease grant and a
    /// transaction that puts the quarantine key.
    Quarantine,
    /// A fair acquire's place in the key's queue ([`with_fair`](crate::EtcdLockService::with_fair)):
    /// its lease grant, its put, its keep-alive; or the read of
    /// [`waiting`](crate::EtcdLockService::waiting).
    Queue,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Connect => "connect",
            Op::Read => "acquire (read key)",
            Op::Grant => "acquire (lease grant)",
            Op::Acquire => "acquire (txn)",
            Op::KeepAlive => "lease keep-alive",
            Op::TimeToLive => "lease time-to-live",
            Op::Check => "ownership check",
            Op::Release => "release",
            Op::Revoke => "lease revoke",
            Op::Holder => "holder query",
            Op::Watch => "revocation watch",
            Op::HolderWatch => "holder watch",
            Op::RaiseFence => "raise fence",
            Op::Quarantine => "quarantine (start)",
            Op::Queue => "acquire (place in the queue)",
        })
    }
}

/// What kind of failure an [`EtcdLockError`] is; it decides what the lease sees
/// ([`EtcdLockError::refusal`], [`EtcdLockError::indeterminate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The connection failed: refused, reset, closed, no endpoint reachable.
    Transport,
    /// No answer in time: `Some(after)` is our own bound that elapsed, `None` a gRPC
    /// deadline reported by the transport.
    Timeout(Option<std::time::Duration>),
    /// etcd answered with an error of its own that may clear: no leader, request timed
    /// out, too many requests, a cancelled watch…
    Service,
    /// The answer is not what etcd v3 sends: a missing field, an impossible revision,
    /// a reply that is not HTTP/2 gRPC.
    Protocol,
    /// etcd refused the credentials (wrong password, no user given while auth is on)
    /// or the permission asked for. Final: [`Refusal::Unauthorized`].
    Unauthorized,
    /// The key breaks the key rules ([`leasehold::check_key`]); nothing was sent.
    /// Final: [`Refusal::InvalidKey`].
    InvalidKey,
    /// The key holds a value this crate did not write (not `<token>\n<fence>\n<identity>` on a
    /// lease). Final: [`Refusal::WrongType`].
    WrongType,
    /// etcd cannot carry the request out as asked (a TTL above its maximum); nothing
    /// was sent. Final: [`Refusal::Unsupported`].
    Unsupported,
    /// The endpoints or settings cannot be used (only from
    /// [`Builder::connect`](crate::Builder::connect)): a TLS file that is not PEM,
    /// a client key that is not its certificate's, among others.
    Config,
    /// The TLS handshake failed for a reason retrying cannot clear (a certificate
    /// not trusted, not for this host, expired, or refused by etcd). Final:
    /// [`Refusal::Unauthorized`] (certificates are credentials).
    Tls(leasehold_driver::TlsProblem),
}

/// A request to etcd that did not produce a definitive answer, or was refused for good.
///
/// Built by the service; read it with [`op`](Self::op), [`kind`](Self::kind),
/// [`endpoints`](Self::endpoints), [`key`](Self::key) and the
/// [`source`](std::error::Error::source) chain.
pub struct EtcdLockError {
    op: Op,
    kind: ErrorKind,
    endpoints: Arc<str>,
    key: Option<Box<str>>,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// A cause that is a sentence of ours (what was wrong with an answer).
#[derive(Debug)]
struct Cause(String);

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Cause {}

/// A client error shared by the requests of one batch: shown as itself, its causes
/// after it.
#[derive(Debug)]
struct SharedCause(Arc<etcd_client::Error>);

impl fmt::Display for SharedCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl StdError for SharedCause {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

impl EtcdLockError {
    /// An error of `kind` for `op` on the etcd at `endpoints`, without a cause yet.
    pub(crate) fn new(op: Op, kind: ErrorKind, endpoints: &Arc<str>) -> EtcdLockError {
        EtcdLockError {
            op,
            kind,
            endpoints: endpoints.clone(),
            key: None,
            source: None,
        }
    }

    /// The same error, about `key`.
    pub(crate) fn for_key(mut self, key: &str) -> EtcdLockError {
        self.key = Some(key.into());
        self
    }

    /// The same error, caused by `source`.
    pub(crate) fn caused_by(
        mut self,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> EtcdLockError {
        self.source = Some(source.into());
        self
    }

    /// The same error, caused by what `detail` says (truncated to 200 bytes).
    pub(crate) fn because(self, detail: impl fmt::Display) -> EtcdLockError {
        self.caused_by(Cause(Clipped(&detail.to_string()).to_string()))
    }

    /// An answer etcd would not send, for `op`, because of `detail`.
    pub(crate) fn protocol(op: Op, endpoints: &Arc<str>, detail: impl fmt::Display) -> Self {
        EtcdLockError::new(op, ErrorKind::Protocol, endpoints).because(detail)
    }

    /// Sorts a client error into transport, timeout, service, protocol or credential
    /// trouble; the client error becomes the source.
    pub(crate) fn from_client(op: Op, endpoints: &Arc<str>, err: etcd_client::Error) -> Self {
        EtcdLockError::new(op, classify(&err), endpoints).caused_by(err)
    }

    /// As [`from_client`](Self::from_client), for a client error that several
    /// requests share (one batched read answered for all of them).
    pub(crate) fn from_shared_client(
        op: Op,
        endpoints: &Arc<str>,
        err: Arc<etcd_client::Error>,
    ) -> Self {
        EtcdLockError::new(op, classify(&err), endpoints).caused_by(SharedCause(err))
    }

    /// The request that failed.
    pub fn op(&self) -> Op {
        self.op
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The etcd endpoints the service talks to, as configured.
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// The key the request was about, if any.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The final refusal this error is, if it is one: the request can never succeed as
    /// asked, and the lease never retries it.
    pub fn refusal(&self) -> Option<Refusal> {
        match self.kind {
            ErrorKind::Unauthorized | ErrorKind::Tls(_) => Some(Refusal::Unauthorized),
            ErrorKind::InvalidKey => Some(Refusal::InvalidKey),
            ErrorKind::WrongType => Some(Refusal::WrongType),
            ErrorKind::Unsupported => Some(Refusal::Unsupported),
            _ => None,
        }
    }

    /// The unknown outcome the lease sees for an error that is not a
    /// [`refusal`](Self::refusal).
    ///
    /// | kind | [`Indeterminate`] |
    /// |---|---|
    /// | `Transport` | `Transport` |
    /// | `Timeout` | `Timeout` |
    /// | `Service` | `Service` |
    /// | `Protocol`, `Config` (and the refusals) | `Protocol` |
    pub fn indeterminate(&self) -> Indeterminate {
        match self.kind {
            ErrorKind::Transport => Indeterminate::Transport,
            ErrorKind::Timeout(_) => Indeterminate::Timeout,
            ErrorKind::Service => Indeterminate::Service,
            _ => Indeterminate::Protocol,
        }
    }

    /// What happened, with where (the endpoints).
    fn what(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at: &str = if self.endpoints.is_empty() {
            "(no endpoints)"
        } else {
            &self.endpoints
        };
        match self.kind {
            ErrorKind::Transport => write!(f, "could not reach etcd at {at}"),
            ErrorKind::Timeout(Some(after)) => {
                write!(f, "no answer from etcd at {at} within {after:?}")
            }
            ErrorKind::Timeout(None) => write!(f, "the gRPC deadline to etcd at {at} passed"),
            ErrorKind::Service => {
                write!(f, "etcd at {at} answered an error that may clear")
            }
            ErrorKind::Protocol => write!(f, "the answer from {at} is not what etcd v3 sends"),
            ErrorKind::Unauthorized => {
                write!(f, "etcd at {at} refused our credentials or permission")
            }
            ErrorKind::InvalidKey => write!(f, "not sent to etcd at {at}: the key is invalid"),
            ErrorKind::WrongType => write!(
                f,
                "the key at etcd {at} holds a value leasehold did not write"
            ),
            ErrorKind::Unsupported => {
                write!(f, "not sent to etcd at {at}: etcd cannot carry it out")
            }
            ErrorKind::Config => write!(f, "cannot use the etcd settings {at}"),
            ErrorKind::Tls(problem) => write!(f, "TLS to etcd at {at}: {problem}"),
        }
    }

    /// What to do about it.
    fn todo(&self) -> &'static str {
        match (self.kind, self.op) {
            (ErrorKind::Transport, Op::Connect) => "check that etcd is running and listening there",
            (ErrorKind::Timeout(_), Op::Connect) => {
                "check that etcd is running there and answers, or raise the connect and \
                 request timeouts"
            }
            _ => self.todo_request(),
        }
    }

    /// What to do about a failed request (not a connect).
    fn todo_request(&self) -> &'static str {
        match self.kind {
            ErrorKind::Transport => {
                "check that etcd is running and listening there (the lease retries meanwhile)"
            }
            ErrorKind::Timeout(_) => {
                "check etcd's health and load, or raise the request timeout \
                 (the lease retries meanwhile)"
            }
            ErrorKind::Service => {
                "if it persists, check the cluster's health: leader, quorum (the lease retries \
                 meanwhile)"
            }
            ErrorKind::Protocol => {
                "check that the endpoint is an etcd v3 client port (not a proxy or another \
                 service)"
            }
            ErrorKind::Unauthorized => {
                "check the user and password (Builder::user) and that the user's role may \
                 read and write the key and grant leases"
            }
            ErrorKind::InvalidKey => {
                "use 1 to 256 bytes without control characters or braces (leasehold::check_key)"
            }
            ErrorKind::WrongType => "use another key, or delete the value if nothing needs it",
            ErrorKind::Unsupported => {
                "ask for something this service can do (a TTL up to 9e9 s, fences up to 2^63 - 1)"
            }
            ErrorKind::Config => {
                "give endpoints as host:port, http://host:port or https://host:port, and \
                 valid options"
            }
            ErrorKind::Tls(_) => "retrying does not help until the certificates are fixed",
        }
    }
}

/// The kind of a client error.
fn classify(err: &etcd_client::Error) -> ErrorKind {
    use etcd_client::Error as E;
    // A failed handshake comes as a transport error (or a status wrapping one); only
    // its text says what failed.
    let tls = match err {
        E::GRpcStatus(status) => {
            leasehold_driver::TlsProblem::from_error_text(&status_text(status))
        }
        E::TransportError(e) => leasehold_driver::TlsProblem::from_error_text(&error_chain(e)),
        _ => None,
    };
    if let Some(problem) = tls {
        return ErrorKind::Tls(problem);
    }
    match err {
        E::GRpcStatus(status) => classify_status(status),
        E::TransportError(_) | E::IoError(_) => ErrorKind::Transport,
        // The client's request channel into a stream closed: the stream is gone.
        E::WatchError(_) | E::LeaseKeepAliveError(_) => ErrorKind::Transport,
        E::InvalidArgs(_) | E::EndpointError(_) | E::InvalidUri(_) => ErrorKind::Config,
        _ => ErrorKind::Protocol,
    }
}

/// The kind of a gRPC status from etcd (or from the transport under it).
fn classify_status(status: &tonic::Status) -> ErrorKind {
    use tonic::Code;
    let message = status.message();
    let code = status.code();
    // A token etcd no longer knows (a member restarted: simple tokens live in its
    // memory; a JWT past its TTL): the client authenticates again on the next request
    // (auto token refresh), so this one is worth retrying, not final. If the password
    // itself is now wrong, that re-authentication is refused as below.
    if message.contains("invalid auth token") {
        return ErrorKind::Service;
    }
    // etcd's credential errors: "etcdserver: authentication failed, invalid user ID
    // or password" (InvalidArgument), "etcdserver: permission denied"
    // (PermissionDenied), "etcdserver: user name is empty" (InvalidArgument: auth is
    // on and no user was given).
    let refused = [
        "authentication failed",
        "permission denied",
        "user name is empty",
    ]
    .iter()
    .any(|sign| message.contains(sign));
    if refused || matches!(code, Code::Unauthenticated | Code::PermissionDenied) {
        return ErrorKind::Unauthorized;
    }
    // etcd's own errors: "etcdserver: no leader", "etcdserver: request timed out",
    // "etcdserver: requested lease not found", "mvcc: required revision has been
    // compacted", "auth: revision of auth store is old"; they come with various codes.
    let from_etcd = ["etcdserver:", "mvcc:", "auth:", "lease:"]
        .iter()
        .any(|prefix| message.starts_with(prefix));
    match code {
        Code::DeadlineExceeded if !from_etcd => ErrorKind::Timeout(None),
        _ if from_etcd => ErrorKind::Service,
        Code::Unavailable | Code::Cancelled => ErrorKind::Transport,
        // tonic reports both a broken connection and an answer that is not HTTP/2
        // gRPC (a peer that is not etcd, a corrupting proxy) this way.
        Code::Unknown | Code::Internal | Code::DataLoss | Code::Unimplemented => {
            let text = status_text(status);
            let garbled = ["protocol error", "decode", "invalid", "malformed"]
                .iter()
                .any(|sign| text.contains(sign));
            if !garbled && text.contains("transport error") {
                ErrorKind::Transport
            } else {
                ErrorKind::Protocol
            }
        }
        _ => ErrorKind::Service,
    }
}

/// Whether `status` reports a failure to reach etcd or to hear from it in time
/// (made by the transport), rather than an answer etcd sent.
pub(crate) fn is_transport_status(status: &tonic::Status) -> bool {
    matches!(
        classify_status(status),
        ErrorKind::Transport | ErrorKind::Timeout(_)
    )
}

/// A status's message with its source chain (tonic hides the transport cause there).
pub(crate) fn status_text(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = StdError::source(status);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An error with its source chain.
pub(crate) fn error_chain(err: &dyn StdError) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl fmt::Display for EtcdLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd lock {}", self.op)?;
        if let Some(key) = &self.key {
            write!(f, " of key {key:?}")?;
        }
        f.write_str(" failed: ")?;
        self.what(f)?;
        write!(f, "; {}", self.todo())
    }
}

impl fmt::Debug for EtcdLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLockError")
            .field("op", &self.op)
            .field("kind", &self.kind)
            .field("endpoints", &self.endpoints)
            .field("key", &self.key)
            .field("source", &self.source)
            .finish()
    }
}

impl StdError for EtcdLockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Arc<str> {
        Arc::from("http://10.0.0.1:2379")
    }

    fn from_status(status: tonic::Status) -> EtcdLockError {
        EtcdLockError::from_client(Op::KeepAlive, &at(), status.into())
    }

    #[test]
    fn each_kind_maps_to_its_refusal_or_indeterminate() {
        use ErrorKind as K;
        let cases = [
            (K::Transport, None, Indeterminate::Transport),
            (K::Timeout(None), None, Indeterminate::Timeout),
            (K::Service, None, Indeterminate::Service),
            (K::Protocol, None, Indeterminate::Protocol),
            (K::Config, None, Indeterminate::Protocol),
            (
                K::Unauthorized,
                Some(Refusal::Unauthorized),
                Indeterminate::Protocol,
            ),
            (
                K::InvalidKey,
                Some(Refusal::InvalidKey),
                Indeterminate::Protocol,
            ),
            (
                K::WrongType,
                Some(Refusal::WrongType),
                Indeterminate::Protocol,
            ),
            (
                K::Unsupported,
                Some(Refusal::Unsupported),
                Indeterminate::Protocol,
            ),
        ];
        for (kind, refusal, indeterminate) in cases {
            let err = EtcdLockError::new(Op::Grant, kind, &at());
            assert_eq!(err.refusal(), refusal, "{kind:?}");
            if refusal.is_none() {
                assert_eq!(err.indeterminate(), indeterminate, "{kind:?}");
            }
        }
    }

    #[test]
    fn etcd_statuses_are_sorted_by_code_and_message() {
        let kind = |status| from_status(status).kind();
        assert_eq!(
            kind(tonic::Status::unavailable("etcdserver: no leader")),
            ErrorKind::Service
        );
        assert_eq!(
            kind(tonic::Status::unavailable("tcp connect error")),
            ErrorKind::Transport
        );
        assert_eq!(
            kind(tonic::Status::internal("h2 protocol error")),
            ErrorKind::Protocol
        );
        assert_eq!(
            kind(tonic::Status::deadline_exceeded("timeout")),
            ErrorKind::Timeout(None)
        );
        for refused in [
            tonic::Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            tonic::Status::permission_denied("etcdserver: permission denied"),
            tonic::Status::invalid_argument("etcdserver: user name is empty"),
            tonic::Status::unauthenticated("anything"),
            tonic::Status::permission_denied("anything"),
        ] {
            let err = from_status(refused);
            assert_eq!(err.refusal(), Some(Refusal::Unauthorized), "{err:?}");
        }
        // An expired or forgotten token: the client authenticates again; not final.
        for retry in [
            tonic::Status::unauthenticated("etcdserver: invalid auth token"),
            tonic::Status::unknown("etcdserver: invalid auth token"),
        ] {
            assert_eq!(kind(retry), ErrorKind::Service);
        }
        // etcd asks the client to retry this one: not final.
        assert_eq!(
            kind(tonic::Status::invalid_argument(
                "etcdserver: revision of auth store is old"
            )),
            ErrorKind::Service
        );
    }

    /// What etcd answers while its leader changes or its quorum is briefly away
    /// (etcd 3.4's `rpctypes`: each with the code etcd sends, and with the codes a
    /// proxy or another version may put on the same text) is transient: a `Service`
    /// error the lease retries, never a final refusal. So are the transport's own
    /// failures meanwhile (a member killed under the connection).
    #[test]
    fn leader_changes_and_quorum_loss_are_transient_not_refusals() {
        use tonic::Code;
        let etcd_says = [
            "etcdserver: no leader",
            "etcdserver: leader changed",
            "etcdserver: not leader",
            "etcdserver: request timed out",
            "etcdserver: request timed out, possibly due to previous leader failure",
            "etcdserver: request timed out, possibly due to connection lost",
            "etcdserver: request timed out, waiting for the applied index took too long",
            "etcdserver: unhealthy cluster",
            "etcdserver: server stopped",
            "etcdserver: too many requests",
        ];
        let codes = [
            Code::Unavailable,
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::Internal,
        ];
        for message in etcd_says {
            for code in codes {
                let err = from_status(tonic::Status::new(code, message));
                assert_eq!(err.kind(), ErrorKind::Service, "{code:?} {message}");
                assert_eq!(err.refusal(), None, "{code:?} {message}");
                assert_eq!(err.indeterminate(), Indeterminate::Service);
            }
        }
        for (status, kind) in [
            (
                tonic::Status::unavailable("tcp connect error: Connection refused"),
                ErrorKind::Transport,
            ),
            (
                tonic::Status::unknown("transport error: connection reset"),
                ErrorKind::Transport,
            ),
            (
                tonic::Status::cancelled("h2 stream reset"),
                ErrorKind::Transport,
            ),
            (
                tonic::Status::deadline_exceeded("Timeout expired"),
                ErrorKind::Timeout(None),
            ),
        ] {
            let err = from_status(status);
            assert_eq!(err.kind(), kind, "{err:?}");
            assert_eq!(err.refusal(), None, "{err:?}");
        }
    }

    /// Display names the request, the key, the endpoints and what to do; the cause is
    /// the source and only the source.
    #[test]
    fn texts_say_what_where_and_what_to_do_once() {
        let cause = "etcdserver: authentication failed, invalid user ID or password";
        let err = EtcdLockError::from_client(
            Op::Connect,
            &at(),
            tonic::Status::invalid_argument(cause).into(),
        );
        let text = err.to_string();
        assert_eq!(
            text,
            "etcd lock connect failed: etcd at http://10.0.0.1:2379 refused our credentials \
             or permission; check the user and password (Builder::user) and that the user's \
             role may read and write the key and grant leases"
        );
        let source = StdError::source(&err).expect("the cause").to_string();
        assert!(source.contains(cause), "{source}");
        assert!(!text.contains(cause));

        let err = EtcdLockError::new(
            Op::Grant,
            ErrorKind::Timeout(Some(std::time::Duration::from_millis(300))),
            &at(),
        )
        .for_key("orders");
        assert_eq!(
            err.to_string(),
            "etcd lock acquire (lease grant) of key \"orders\" failed: no answer from etcd at \
             http://10.0.0.1:2379 within 300ms; check etcd's health and load, or raise the \
             request timeout (the lease retries meanwhile)"
        );
        assert!(StdError::source(&err).is_none());

        let key_error = leasehold::check_key("a{b}").unwrap_err();
        let err = EtcdLockError::new(Op::Read, ErrorKind::InvalidKey, &at())
            .for_key("a{b}")
            .caused_by(key_error);
        assert_eq!(
            err.to_string(),
            "etcd lock acquire (read key) of key \"a{b}\" failed: not sent to etcd at \
             http://10.0.0.1:2379: the key is invalid; use 1 to 256 bytes without control \
             characters or braces (leasehold::check_key)"
        );
        assert_eq!(
            StdError::source(&err).unwrap().to_string(),
            key_error.to_string()
        );

        let err = EtcdLockError::protocol(Op::Check, &at(), "a read without a header");
        assert!(err
            .to_string()
            .contains("not what etcd v3 sends; check that the endpoint"));
        assert!(!err.to_string().contains("header"));
        assert_eq!(
            StdError::source(&err).unwrap().to_string(),
            "a read without a header"
        );

        let err = from_status(tonic::Status::unavailable("etcdserver: no leader"));
        assert!(err.to_string().starts_with("etcd lock lease keep-alive failed: etcd at http://10.0.0.1:2379 answered an error that may clear; if it persists"), "{err}");
        assert!(!err.to_string().contains("no leader"));

        for kind in [
            ErrorKind::Transport,
            ErrorKind::Service,
            ErrorKind::Protocol,
            ErrorKind::WrongType,
            ErrorKind::Unsupported,
            ErrorKind::Config,
        ] {
            let text = EtcdLockError::new(Op::Release, kind, &at()).to_string();
            assert!(text.starts_with("etcd lock release failed: "), "{text}");
            assert!(text.contains("http://10.0.0.1:2379"), "{text}");
            assert_eq!(
                text.matches("; ").count(),
                1,
                "one what, one what to do: {text}"
            );
        }
    }
}
