//! The service: one connection, one request at a time, every request under a
//! deadline from the driver's clock.

use core::cell::{Cell, RefCell};

use embedded_io_async::{Error as _, Read, Write};
use leasehold::{Duration, EncodedToken, Fence, Holder, Identity, OwnerToken};
use leasehold_driver::Clock;

use crate::connect::{before, Connect};
use crate::error::{Error, ProtocolError, ServerError};
use crate::exchange::{Exchange, Fault, Next};
use crate::replies::{self, Acquired};
use crate::resp::{self, Reply, Window};
use crate::scripts::{self, Script};

/// The read buffer's default size: the longest answer a script gives (a holder with
/// a 64-byte identity and a 20-digit fence) is about 120 bytes, and Redis's error
/// replies fit too.
pub const DEFAULT_READ_BUFFER: usize = 256;

/// The write buffer's default size. Requests longer than it (a 256-byte key, a
/// script being reloaded) are written in pieces, so it only sets how many writes a
/// request takes.
pub const DEFAULT_WRITE_BUFFER: usize = 128;

/// The request timeout unless [`RespLockService::with_request_timeout`] sets one.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest TTL an acquire may ask for unless [`RespLockService::with_max_ttl`]
/// sets another, and so the quarantine after Redis lost its data (the same default as
/// `leasehold-redis`, so that both kinds of client of one Redis agree).
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(30);

/// Credentials for `AUTH`, sent on every new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Auth<'a> {
    /// The ACL user; `None` for the default user (`requirepass`).
    pub user: Option<&'a str>,
    /// The password.
    pub password: &'a str,
}

/// A Redis lock service over one `embedded-io-async` stream, without `std` or a heap.
///
/// * `F` makes connections ([`Connect`]: any async closure returning a stream).
/// * `K` is the driver's clock: every request (connect, `AUTH`, `EVALSHA`, a script
///   reload) runs under one deadline, [`with_request_timeout`](Self::with_request_timeout)
///   after it starts; nothing else tells time.
/// * `R` bytes hold one reply ([`DEFAULT_READ_BUFFER`]); a longer one is
///   `Indeterminate(Protocol)`. `W` bytes gather a request before it is written
///   ([`DEFAULT_WRITE_BUFFER`]); at least one, or [`new`](Self::new) does not compile.
///
/// One request is in flight at a time; a second caller gets
/// [`Error::Busy`] (`Indeterminate(Transport)`), never a mixed-up reply. The
/// connection is dropped and made anew by `F` before the next request whenever the
/// last one did not end with a whole reply: a timeout, an I/O error, an answer that
/// did not parse, or a request future dropped half-way.
pub struct RespLockService<
    'a,
    F: Connect,
    K,
    const R: usize = { DEFAULT_READ_BUFFER },
    const W: usize = { DEFAULT_WRITE_BUFFER },
> {
    clock: K,
    request_timeout: Duration,
    max_ttl: Duration,
    auth: Option<Auth<'a>>,
    connects: Cell<u32>,
    reloads: Cell<u32>,
    inner: RefCell<Inner<F, R, W>>,
}

/// What a request needs exclusively.
struct Inner<F: Connect, const R: usize, const W: usize> {
    connect: F,
    conn: Option<F::Connection>,
    /// The last request on `conn` ended with a whole reply read: `conn` holds no
    /// answer to anything, the next request may use it.
    clean: bool,
    read: Buffer<R>,
    write: Buffer<W>,
}

/// A buffer, word-aligned so that zeroing it takes the aligned `memclr` every
/// firmware links already, not a byte-wise one of its own (200 B of flash).
#[repr(align(4))]
struct Buffer<const N: usize>([u8; N]);

/// One command: a script call, a script load, or `AUTH`.
#[derive(Clone, Copy)]
pub(crate) enum Request<'r> {
    Acquire {
        key: &'r str,
        token: &'r EncodedToken,
        ms: u64,
        identity: &'r [u8],
        /// The quarantine after a loss of state, ms (see `scripts::ACQUIRE`).
        quarantine: u64,
        script: Script,
    },
    Renew {
        key: &'r str,
        token: &'r EncodedToken,
        fence: u64,
        ms: u64,
        script: Script,
    },
    Release {
        key: &'r str,
        token: &'r EncodedToken,
        script: Script,
    },
    Holder {
        key: &'r str,
        script: Script,
    },
    /// `SCRIPT LOAD source`.
    Load {
        source: &'static str,
    },
    /// `AUTH [user] password`.
    /// (By reference: copying the credentials into the request future's state costs
    /// a `memmove`, 1.5 KiB of flash on a microcontroller.)
    Auth(&'r Auth<'r>),
}

impl<'r> Request<'r> {
    /// The script's source and SHA1 (an `EVALSHA` request), or `None`.
    pub(crate) fn script(&self) -> Option<(&'static str, &'static str)> {
        match self {
            Request::Acquire { script, .. }
            | Request::Renew { script, .. }
            | Request::Release { script, .. }
            | Request::Holder { script, .. } => Some(*script),
            Request::Load { .. } | Request::Auth(_) => None,
        }
    }

    /// How many arguments the command has.
    fn args(&self) -> usize {
        match self {
            Request::Acquire { .. } => 10,
            Request::Renew { .. } => 6,
            Request::Release { .. } => 5,
            Request::Holder { .. } => 4,
            Request::Load { .. } => 3,
            Request::Auth(auth) => 2 + usize::from(auth.user.is_some()),
        }
    }

    /// Argument `i`, into `out` (no framing). Script calls are `EVALSHA sha numkeys
    /// keys… args…`; the lock key is `{name}` (the hash tag keeps both keys of a lock
    /// in one cluster slot).
    fn arg(&self, i: usize, out: &mut Window<'_>) {
        match (*self, i) {
            (Request::Load { .. }, 0) => out.put(b"SCRIPT"),
            (Request::Load { .. }, 1) => out.put(b"LOAD"),
            (Request::Load { source }, _) => out.put(source.as_bytes()),
            (Request::Auth(_), 0) => out.put(b"AUTH"),
            (
                Request::Auth(&Auth {
                    user: Some(user), ..
                }),
                1,
            ) => out.put(user.as_bytes()),
            (Request::Auth(&Auth { password, .. }), _) => out.put(password.as_bytes()),
            (_, 0) => out.put(b"EVALSHA"),
            (_, 1) => out.put(self.script().map_or("", |s| s.1).as_bytes()),
            (Request::Acquire { .. }, 2) => out.put(b"3"),
            (_, 2) => out.put(b"1"),
            (
                Request::Acquire { key, .. }
                | Request::Renew { key, .. }
                | Request::Release { key, .. }
                | Request::Holder { key, .. },
                3,
            ) => {
                out.put(b"{");
                out.put(key.as_bytes());
                out.put(b"}");
            }
            (Request::Acquire { key, .. }, 4) => {
                out.put(b"{");
                out.put(key.as_bytes());
                out.put(b"}:fence");
            }
            (Request::Acquire { .. }, 5) => out.put(scripts::EPOCH_KEY.as_bytes()),
            (Request::Acquire { token, .. }, 6) => out.put(token.as_bytes()),
            (Request::Acquire { ms, .. }, 7) | (Request::Renew { ms, .. }, 5) => out.number(ms),
            (Request::Acquire { identity, .. }, 8) => out.put(identity),
            (Request::Acquire { quarantine, .. }, _) => out.number(quarantine),
            // `<token>\n<fence>\n`: the start of the value of this very grant.
            (Request::Renew { token, fence, .. }, _) => {
                out.put(token.as_bytes());
                out.put(b"\n");
                out.number(fence);
                out.put(b"\n");
            }
            (Request::Release { token, .. }, _) => {
                out.put(token.as_bytes());
                out.put(b"\n");
            }
            (Request::Holder { .. }, _) => {}
        }
    }

    /// The command, into a window (see `resp::send`): `*N`, then each argument as a
    /// bulk string, its length found by writing it into a window that only counts.
    /// Synchronous and not generic: one copy serves every connection.
    pub(crate) fn encode(&self, out: &mut Window<'_>) {
        out.put(b"*");
        out.number(self.args() as u64);
        out.put(b"\r\n");
        for i in 0..self.args() {
            let mut count = Window::new(usize::MAX, &mut []);
            self.arg(i, &mut count);
            out.put(b"$");
            out.number(count.written() as u64);
            out.put(b"\r\n");
            self.arg(i, out);
            out.put(b"\r\n");
        }
    }
}

impl<'a, F: Connect, K: Clock, const R: usize, const W: usize> RespLockService<'a, F, K, R, W> {
    /// A service that connects with `connect` when it first needs to, with no
    /// `AUTH` and the [`DEFAULT_REQUEST_TIMEOUT`].
    pub fn new(connect: F, clock: K) -> Self {
        // A request goes out through the write buffer: with no room, none would.
        const { assert!(W > 0, "the write buffer needs at least one byte") };
        RespLockService {
            clock,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_ttl: DEFAULT_MAX_TTL,
            auth: None,
            connects: Cell::new(0),
            reloads: Cell::new(0),
            inner: RefCell::new(Inner {
                connect,
                conn: None,
                clean: true,
                read: Buffer([0; R]),
                write: Buffer([0; W]),
            }),
        }
    }

    /// Sends `AUTH` with these credentials on every new connection.
    #[must_use]
    pub fn with_auth(mut self, auth: Auth<'a>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Bounds every request, connecting included, by `timeout` on the clock.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The longest TTL an acquire or a renewal may ask for (default
    /// [`DEFAULT_MAX_TTL`]); a longer one is refused ([`Error::TtlAboveMax`]) before
    /// anything is sent. It is also the
    /// quarantine: after Redis lost its data (a restart without persistence, an older
    /// snapshot, a promoted replica), no free key is granted for this long, so that
    /// every grant Redis may have forgotten has expired first. Give every client of
    /// one Redis the same value, at least the longest TTL any of them asks for.
    ///
    /// At most 2^43 ms (278 years, the longest quarantine the script times exactly); a
    /// longer one is taken as that, and TTLs above it are refused.
    #[must_use]
    pub fn with_max_ttl(mut self, max_ttl: Duration) -> Self {
        self.max_ttl = max_ttl.min(Duration::from_millis(1 << 43));
        self
    }

    /// How many connections the factory has made so far.
    pub fn connects(&self) -> u32 {
        self.connects.get()
    }

    /// How often Redis answered `NOSCRIPT` and a script was loaded again.
    pub fn script_reloads(&self) -> u32 {
        self.reloads.get()
    }

    /// Acquires `key` for `token` (see the trait); `Ok` holds `Granted` or
    /// `HeldByAnother`.
    pub async fn try_acquire(
        &self,
        key: &str,
        token: OwnerToken,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<leasehold::AcquireOutcome, Error> {
        match self.perform(Op::acquire(key, token, identity, ttl)).await? {
            Answered::Acquire(outcome) => Ok(outcome),
            _ => Err(UNEXPECTED),
        }
    }

    /// Replaces the expiry of `key` with now + `ttl` (whole ms, rounded up) if
    /// `token` holds it with `fence`; `Ok` holds `Renewed` (with the TTL applied) or
    /// `NotOwner`.
    pub async fn try_renew(
        &self,
        key: &str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> Result<leasehold::RenewOutcome, Error> {
        match self.perform(Op::renew(key, token, fence, ttl)).await? {
            Answered::Renew(outcome) => Ok(outcome),
            _ => Err(UNEXPECTED),
        }
    }

    /// Deletes `key` if `token` holds it; `Ok` holds `Released` or `NotOwner`.
    pub async fn try_release(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<leasehold::ReleaseOutcome, Error> {
        match self.perform(Op::release(key, token)).await? {
            Answered::Release(outcome) => Ok(outcome),
            _ => Err(UNEXPECTED),
        }
    }

    /// Who holds `key` now, or `None`.
    pub async fn try_holder(&self, key: &str) -> Result<Option<Holder>, Error> {
        match self.perform(Op::holder(key)).await? {
            Answered::Holder(holder) => Ok(holder),
            _ => Err(UNEXPECTED),
        }
    }

    /// Any operation: one future type, whose code is linked once, serves all four
    /// (an `async fn` each would put four copies of the request path into the
    /// caller's state machine: kilobytes of flash on a microcontroller).
    ///
    /// The operation comes with its script (see [`Op::acquire`] and the others), so a
    /// program that never calls an operation does not link its script's text.
    // The `RefCell` borrow spans the request on purpose: it *is* the one-in-flight
    // rule. A second caller meets `try_borrow_mut`'s error (`Busy`), never a panic.
    #[allow(clippy::await_holding_refcell_ref)]
    pub(crate) async fn perform(&self, (op, script): (Op<'_>, Script)) -> Result<Answered, Error> {
        let key = op.key();
        leasehold::check_key(key).map_err(Error::InvalidKey)?;
        let token = &op.token().encode();
        // A grant (or a renewal) longer than the quarantine could outlive it.
        if op.ttl() > self.max_ttl {
            return Err(Error::TtlAboveMax);
        }
        let (ms, applied) = scripts::ttl_ms(op.ttl());
        let request = match op {
            Op::Acquire { identity, .. } => Request::Acquire {
                key,
                token,
                ms,
                identity: identity.as_bytes(),
                quarantine: scripts::ttl_ms(self.max_ttl).0,
                script,
            },
            Op::Renew { fence, .. } => Request::Renew {
                key,
                token,
                fence: fence.0,
                ms,
                script,
            },
            Op::Release { .. } => Request::Release { key, token, script },
            Op::Holder { .. } => Request::Holder { key, script },
        };
        let mut inner = self.inner.try_borrow_mut().map_err(|_| Error::Busy)?;
        let exchanged = self.transact(&mut inner, &request).await;
        let result = answer(&op, applied, exchanged, &inner.read.0);
        if let Err(Error::Protocol(_)) = result {
            // Not what the script answers: whoever answered, do not ask it again.
            inner.conn = None;
        }
        result
    }

    /// Sends `request` on a usable connection under the deadline and reads one whole
    /// reply (its length, at the start of the read buffer); drops the connection
    /// unless that succeeded.
    async fn transact(
        &self,
        inner: &mut Inner<F, R, W>,
        request: &Request<'_>,
    ) -> Result<usize, Fault> {
        let deadline = self.clock.now().saturating_add(self.request_timeout);
        let result = before(
            self.exchange(inner, request),
            self.clock.sleep_until(deadline),
        )
        .await
        .unwrap_or(Err(Fault::Timeout));
        inner.clean = result.is_ok();
        if !inner.clean {
            inner.conn = None;
        }
        result
    }

    /// Carries out what an [`Exchange`] says, on the connection (made first if there
    /// is none).
    async fn exchange(
        &self,
        inner: &mut Inner<F, R, W>,
        request: &Request<'_>,
    ) -> Result<usize, Fault> {
        if !inner.clean {
            // The last request was dropped half-way: its answer may still come.
            inner.conn = None;
        }
        // Until this exchange reads its whole answer (`transact` sets it then).
        inner.clean = false;
        let Inner {
            connect,
            conn,
            read,
            write,
            ..
        } = inner;
        let fresh = conn.is_none();
        let conn = match conn {
            Some(conn) => conn,
            None => {
                let made = connect.connect().await.map_err(|_| Fault::Connect)?;
                self.connects.set(self.connects.get().wrapping_add(1));
                conn.insert(made)
            }
        };
        // `AUTH` first on a new connection, when there are credentials.
        let mut exchange = Exchange::new(fresh && self.auth.is_some(), &self.reloads);
        loop {
            let (read, write) = (&mut read.0, &mut write.0);
            let did = match exchange.next(request, self.auth.as_ref(), read, write) {
                Ok(Next::Write(n)) => conn.write(write.get(..n).unwrap_or(&[])).await,
                Ok(Next::Flush) => conn.flush().await.map(|()| 0),
                Ok(Next::Read(from)) => conn.read(read.get_mut(from..).unwrap_or(&mut [])).await,
                Ok(Next::Done(len)) => return Ok(len),
                Err(fault) => return Err(fault),
            };
            did.map_err(|e| Fault::Io(e.kind()))
                .and_then(|n| exchange.did(n))?;
        }
    }
}

/// The operation's answer from what the exchange ended with: the reply at the start
/// of `read`, or a fault (an error line Redis answered is in `read` too). Plain
/// code, linked once.
fn answer(
    op: &Op<'_>,
    applied: Duration,
    exchanged: Result<usize, Fault>,
    read: &[u8],
) -> Result<Answered, Error> {
    let reply = match exchanged {
        Ok(len) => parsed(read.get(..len).unwrap_or(&[]))?,
        Err(fault) => return Err(error_of(fault, read)),
    };
    let reply = match reply {
        Reply::Error(line) => return Err(Error::Server(ServerError::from_line(line))),
        reply => reply,
    };
    match op {
        Op::Acquire { .. } => replies::acquire(reply).map(|acquired| {
            Answered::Acquire(match acquired {
                Acquired::Granted(fence) => leasehold::AcquireOutcome::Granted {
                    fence,
                    ttl: applied,
                },
                Acquired::HeldByAnother(holder) => leasehold::AcquireOutcome::HeldByAnother(holder),
                Acquired::Quarantined(left) => {
                    leasehold::AcquireOutcome::HeldByAnother(Holder::quarantine(left))
                }
            })
        }),
        Op::Renew { .. } => replies::flag(reply).map(|renewed| {
            Answered::Renew(if renewed {
                leasehold::RenewOutcome::Renewed { ttl: applied }
            } else {
                leasehold::RenewOutcome::NotOwner
            })
        }),
        Op::Release { .. } => replies::flag(reply).map(|released| {
            Answered::Release(if released {
                leasehold::ReleaseOutcome::Released
            } else {
                leasehold::ReleaseOutcome::NotOwner
            })
        }),
        Op::Holder { .. } => replies::holder_query(reply).map(Answered::Holder),
    }
}

/// The typed error of a fault; a refusal's error line is the reply in `read`.
fn error_of(fault: Fault, read: &[u8]) -> Error {
    let line = || match resp::parse(read) {
        Ok((Reply::Error(line), _)) => line,
        _ => &[],
    };
    match fault {
        Fault::Connect => Error::Connect,
        Fault::Io(kind) => Error::Io(kind),
        Fault::Closed => Error::Closed,
        Fault::Timeout => Error::Timeout,
        Fault::Protocol(p) => Error::Protocol(p),
        Fault::Server => Error::Server(ServerError::from_line(line())),
        Fault::AuthRefused => Error::AuthRefused(ServerError::from_line(line())),
    }
}

/// A lease operation and its arguments, as the trait's methods take them.
#[derive(Clone, Copy)]
pub(crate) enum Op<'r> {
    Acquire {
        key: &'r str,
        token: OwnerToken,
        identity: &'r Identity,
        ttl: Duration,
    },
    Renew {
        key: &'r str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    },
    Release {
        key: &'r str,
        token: OwnerToken,
    },
    Holder {
        key: &'r str,
    },
}

impl<'r> Op<'r> {
    /// An acquire and its script. Each operation's script is named only by its
    /// constructor, which only that operation's callers link.
    pub(crate) fn acquire(
        key: &'r str,
        token: OwnerToken,
        identity: &'r Identity,
        ttl: Duration,
    ) -> (Op<'r>, Script) {
        let op = Op::Acquire {
            key,
            token,
            identity,
            ttl,
        };
        (op, scripts::ACQUIRE_PAIR)
    }

    /// A renewal and its script.
    pub(crate) fn renew(
        key: &'r str,
        token: OwnerToken,
        fence: Fence,
        ttl: Duration,
    ) -> (Op<'r>, Script) {
        let op = Op::Renew {
            key,
            token,
            fence,
            ttl,
        };
        (op, scripts::RENEW_PAIR)
    }

    /// A release and its script.
    pub(crate) fn release(key: &'r str, token: OwnerToken) -> (Op<'r>, Script) {
        (Op::Release { key, token }, scripts::RELEASE_PAIR)
    }

    /// A holder query and its script.
    pub(crate) fn holder(key: &'r str) -> (Op<'r>, Script) {
        (Op::Holder { key }, scripts::HOLDER_PAIR)
    }

    fn key(&self) -> &str {
        match *self {
            Op::Acquire { key, .. }
            | Op::Renew { key, .. }
            | Op::Release { key, .. }
            | Op::Holder { key } => key,
        }
    }

    /// The owner's token (a holder query has none, and sends none).
    fn token(&self) -> OwnerToken {
        match *self {
            Op::Acquire { token, .. } | Op::Renew { token, .. } | Op::Release { token, .. } => {
                token
            }
            Op::Holder { .. } => leasehold::Owner([0; 16]).token(leasehold::Term(0)),
        }
    }

    fn ttl(&self) -> Duration {
        match *self {
            Op::Acquire { ttl, .. } | Op::Renew { ttl, .. } => ttl,
            Op::Release { .. } | Op::Holder { .. } => Duration::ZERO,
        }
    }
}

/// What an operation's script answered.
pub(crate) enum Answered {
    Acquire(leasehold::AcquireOutcome),
    Renew(leasehold::RenewOutcome),
    Release(leasehold::ReleaseOutcome),
    Holder(Option<Holder>),
}

const UNEXPECTED: Error = Error::Protocol(ProtocolError::Unexpected);

/// The reply the exchange found whole at the start of `buf`.
fn parsed(buf: &[u8]) -> Result<Reply<'_>, Error> {
    resp::parse(buf)
        .map(|(reply, _)| reply)
        .map_err(|_| Error::Protocol(ProtocolError::Malformed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of `request` as sent.
    fn wire(request: Request<'_>) -> std::string::String {
        let mut buf = [0u8; 1024];
        let mut window = Window::new(0, &mut buf);
        request.encode(&mut window);
        let len = window.len();
        std::string::String::from_utf8(buf[..len].to_vec()).unwrap()
    }

    #[test]
    fn commands_on_the_wire() {
        let token = leasehold::Owner([0xab; 16])
            .token(leasehold::Term(0x1c))
            .encode();
        let t = token.as_str();
        let sha = scripts::ACQUIRE_SHA;
        assert_eq!(
            wire(Request::Acquire {
                key: "k",
                token: &token,
                ms: 300,
                identity: b"dev",
                quarantine: 30_000,
                script: scripts::ACQUIRE_PAIR,
            }),
            std::format!(
                "*10\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n3\r\n$3\r\n{{k}}\r\n\
                 $9\r\n{{k}}:fence\r\n$17\r\n{{leasehold}}:epoch\r\n$35\r\n{t}\r\n\
                 $3\r\n300\r\n$3\r\ndev\r\n$5\r\n30000\r\n"
            )
        );
        let sha = scripts::RENEW_SHA;
        assert_eq!(
            wire(Request::Renew {
                key: "k",
                token: &token,
                fence: u64::MAX,
                ms: 1,
                script: scripts::RENEW_PAIR,
            }),
            std::format!(
                "*6\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$3\r\n{{k}}\r\n\
                 $57\r\n{t}\n18446744073709551615\n\r\n$1\r\n1\r\n"
            )
        );
        let sha = scripts::RELEASE_SHA;
        assert_eq!(
            wire(Request::Release {
                key: "k",
                token: &token,
                script: scripts::RELEASE_PAIR,
            }),
            std::format!(
                "*5\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$3\r\n{{k}}\r\n\
                 $36\r\n{t}\n\r\n"
            )
        );
        assert_eq!(
            wire(Request::Auth(&Auth {
                user: Some("u"),
                password: "p"
            })),
            "*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n"
        );
        assert!(wire(Request::Load {
            source: scripts::RENEW
        })
        .starts_with("*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$"));
    }
}
