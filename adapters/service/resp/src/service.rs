//! The service: one connection, one request at a time, every request under a
//! deadline from the driver's clock.

use core::cell::{Cell, RefCell};

use embedded_io_async::{Read, Write};
use leasehold::{Duration, EncodedToken, Fence, Holder, Identity, OwnerToken};
use leasehold_driver::Clock;

use crate::connect::{before, Connect};
use crate::error::{Error, ProtocolError, ServerError};
use crate::replies::{self, Acquired};
use crate::resp::{self, read_reply, Out, Reply, Scalar};
use crate::scripts;

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
///   ([`DEFAULT_WRITE_BUFFER`]).
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
    read: [u8; R],
    write: [u8; W],
}

/// One script call: which script, its keys and arguments.
#[derive(Clone, Copy)]
enum Request<'r> {
    Acquire {
        key: &'r str,
        token: &'r EncodedToken,
        ms: u64,
        identity: &'r str,
    },
    Renew {
        key: &'r str,
        token: &'r EncodedToken,
        fence: u64,
        ms: u64,
    },
    Release {
        key: &'r str,
        token: &'r EncodedToken,
    },
    Holder {
        key: &'r str,
    },
}

impl Request<'_> {
    /// The script's source and SHA1.
    fn script(&self) -> (&'static str, &'static str) {
        match self {
            Request::Acquire { .. } => (scripts::ACQUIRE, scripts::ACQUIRE_SHA),
            Request::Renew { .. } => (scripts::RENEW, scripts::RENEW_SHA),
            Request::Release { .. } => (scripts::RELEASE, scripts::RELEASE_SHA),
            Request::Holder { .. } => (scripts::HOLDER, scripts::HOLDER_SHA),
        }
    }

    /// `EVALSHA sha numkeys keys… args…`.
    async fn send<C: Write>(&self, out: &mut Out<'_, '_, C>) -> Result<(), Error> {
        let (key, keys, args) = match self {
            Request::Acquire { key, .. } => (key, 2, 3),
            Request::Renew { key, .. } => (key, 1, 2),
            Request::Release { key, .. } => (key, 1, 1),
            Request::Holder { key } => (key, 1, 0),
        };
        out.array(3 + keys + args).await?;
        out.bulk(b"EVALSHA").await?;
        out.bulk(self.script().1.as_bytes()).await?;
        out.bulk_number(keys).await?;
        // `{name}`: the hash tag keeps both keys of a lock in one cluster slot.
        out.bulk_header(key.len() + 2).await?;
        out.put(b"{").await?;
        out.put(key.as_bytes()).await?;
        out.put(b"}").await?;
        out.end().await?;
        match *self {
            Request::Acquire {
                key,
                token,
                ms,
                identity,
            } => {
                out.bulk_header(key.len() + 8).await?;
                out.put(b"{").await?;
                out.put(key.as_bytes()).await?;
                out.put(b"}:fence").await?;
                out.end().await?;
                out.bulk(token.as_bytes()).await?;
                out.bulk_number(ms).await?;
                out.bulk(identity.as_bytes()).await
            }
            Request::Renew {
                token, fence, ms, ..
            } => {
                // `<token>\n<fence>\n`: the start of the value of this very grant.
                out.bulk_header(token.as_bytes().len() + decimal_len(fence) + 2)
                    .await?;
                out.put(token.as_bytes()).await?;
                out.put(b"\n").await?;
                out.number(fence).await?;
                out.put(b"\n").await?;
                out.end().await?;
                out.bulk_number(ms).await
            }
            Request::Release { token, .. } => {
                out.bulk_header(token.as_bytes().len() + 1).await?;
                out.put(token.as_bytes()).await?;
                out.put(b"\n").await?;
                out.end().await
            }
            Request::Holder { .. } => Ok(()),
        }
    }
}

/// How many decimal digits `n` has.
fn decimal_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// A TTL as `PX`/`PEXPIRE` take it: whole milliseconds, rounded up (a renewal never
/// applies less than asked), at least 1 (Redis refuses 0); also the TTL applied.
fn ttl_ms(ttl: Duration) -> (u64, Duration) {
    let ms = ttl.as_micros().div_ceil(1_000).max(1);
    (ms, Duration::from_millis(ms))
}

impl<'a, F: Connect, K: Clock, const R: usize, const W: usize> RespLockService<'a, F, K, R, W> {
    /// A service that connects with `connect` when it first needs to, with no
    /// `AUTH` and the [`DEFAULT_REQUEST_TIMEOUT`].
    pub fn new(connect: F, clock: K) -> Self {
        RespLockService {
            clock,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            auth: None,
            connects: Cell::new(0),
            reloads: Cell::new(0),
            inner: RefCell::new(Inner {
                connect,
                conn: None,
                clean: true,
                read: [0; R],
                write: [0; W],
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
        leasehold::check_key(key).map_err(Error::InvalidKey)?;
        let (ms, applied) = ttl_ms(ttl);
        let token = token.encode();
        let request = Request::Acquire {
            key,
            token: &token,
            ms,
            identity: identity.as_str(),
        };
        Ok(match self.call(&request, replies::acquire).await? {
            Acquired::Granted(fence) => leasehold::AcquireOutcome::Granted {
                fence,
                ttl: applied,
            },
            Acquired::HeldByAnother(holder) => leasehold::AcquireOutcome::HeldByAnother(holder),
        })
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
        leasehold::check_key(key).map_err(Error::InvalidKey)?;
        let (ms, applied) = ttl_ms(ttl);
        let token = token.encode();
        let request = Request::Renew {
            key,
            token: &token,
            fence: fence.0,
            ms,
        };
        Ok(if self.call(&request, replies::flag).await? {
            leasehold::RenewOutcome::Renewed { ttl: applied }
        } else {
            leasehold::RenewOutcome::NotOwner
        })
    }

    /// Deletes `key` if `token` holds it; `Ok` holds `Released` or `NotOwner`.
    pub async fn try_release(
        &self,
        key: &str,
        token: OwnerToken,
    ) -> Result<leasehold::ReleaseOutcome, Error> {
        leasehold::check_key(key).map_err(Error::InvalidKey)?;
        let token = token.encode();
        let request = Request::Release { key, token: &token };
        Ok(if self.call(&request, replies::flag).await? {
            leasehold::ReleaseOutcome::Released
        } else {
            leasehold::ReleaseOutcome::NotOwner
        })
    }

    /// Who holds `key` now, or `None`.
    pub async fn try_holder(&self, key: &str) -> Result<Option<Holder>, Error> {
        leasehold::check_key(key).map_err(Error::InvalidKey)?;
        self.call(&Request::Holder { key }, replies::holder_query)
            .await
    }

    /// Runs `request` under the deadline on a usable connection and reads its answer
    /// with `answer`; drops the connection unless the exchange ended with one whole
    /// reply.
    // The `RefCell` borrow spans the request on purpose: it *is* the one-in-flight
    // rule. A second caller meets `try_borrow_mut`'s error (`Busy`), never a panic.
    #[allow(clippy::await_holding_refcell_ref)]
    async fn call<T>(
        &self,
        request: &Request<'_>,
        answer: fn(Reply<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut inner = self.inner.try_borrow_mut().map_err(|_| Error::Busy)?;
        let deadline = self.clock.now().saturating_add(self.request_timeout);
        let result = before(
            self.exchange(&mut inner, request, answer),
            self.clock.sleep_until(deadline),
        )
        .await
        .unwrap_or(Err(Error::Timeout));
        inner.clean = match &result {
            Ok(_) => true,
            Err(e) => e.keeps_connection(),
        };
        if !inner.clean {
            inner.conn = None;
        }
        result
    }

    async fn exchange<T>(
        &self,
        inner: &mut Inner<F, R, W>,
        request: &Request<'_>,
        answer: fn(Reply<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        if !inner.clean {
            // The last request was dropped half-way: its answer may still come.
            inner.conn = None;
        }
        // Until this exchange reads its whole answer (`call` sets it back then).
        inner.clean = false;
        let Inner {
            connect,
            conn,
            read,
            write,
            ..
        } = inner;
        let conn = match conn {
            Some(conn) => conn,
            None => {
                let mut fresh = connect.connect().await.map_err(|_| Error::Connect)?;
                self.connects.set(self.connects.get().wrapping_add(1));
                if let Some(auth) = self.auth {
                    authenticate(&mut fresh, auth, read, write).await?;
                }
                conn.insert(fresh)
            }
        };
        let mut out = Out::new(&mut *conn, &mut write[..]);
        request.send(&mut out).await?;
        out.send().await?;
        let mut len = read_reply(conn, read).await?;
        if is_noscript(read.get(..len).unwrap_or(&[])) {
            // Redis forgot the script (a restart, SCRIPT FLUSH, a failover): load it
            // and ask again, once.
            self.reloads.set(self.reloads.get().wrapping_add(1));
            let (source, sha) = request.script();
            let mut out = Out::new(&mut *conn, &mut write[..]);
            out.array(3).await?;
            out.bulk(b"SCRIPT").await?;
            out.bulk(b"LOAD").await?;
            out.bulk(source.as_bytes()).await?;
            out.send().await?;
            let loaded = read_reply(conn, read).await?;
            match parsed(read.get(..loaded).unwrap_or(&[]))? {
                Reply::Scalar(Scalar::Bulk(Some(answer))) if answer == sha.as_bytes() => {}
                Reply::Scalar(Scalar::Bulk(Some(_))) => {
                    return Err(Error::Protocol(ProtocolError::WrongSha))
                }
                Reply::Error(line) => return Err(Error::Server(ServerError::from_line(line))),
                _ => return Err(Error::Protocol(ProtocolError::Unexpected)),
            }
            let mut out = Out::new(&mut *conn, &mut write[..]);
            request.send(&mut out).await?;
            out.send().await?;
            len = read_reply(conn, read).await?;
        }
        match parsed(read.get(..len).unwrap_or(&[]))? {
            Reply::Error(line) => Err(Error::Server(ServerError::from_line(line))),
            reply => answer(reply),
        }
    }
}

/// The reply `read_reply` found whole at the start of `buf`.
fn parsed(buf: &[u8]) -> Result<Reply<'_>, Error> {
    resp::parse(buf)
        .map(|(reply, _)| reply)
        .map_err(|_| Error::Protocol(ProtocolError::Malformed))
}

fn is_noscript(buf: &[u8]) -> bool {
    matches!(parsed(buf), Ok(Reply::Error(line)) if ServerError::from_line(line).code() == "NOSCRIPT")
}

/// `AUTH [user] password`, expecting `+OK`.
async fn authenticate<C: Read + Write>(
    conn: &mut C,
    auth: Auth<'_>,
    read: &mut [u8],
    write: &mut [u8],
) -> Result<(), Error> {
    let mut out = Out::new(&mut *conn, write);
    out.array(if auth.user.is_some() { 3 } else { 2 }).await?;
    out.bulk(b"AUTH").await?;
    if let Some(user) = auth.user {
        out.bulk(user.as_bytes()).await?;
    }
    out.bulk(auth.password.as_bytes()).await?;
    out.send().await?;
    let len = read_reply(conn, read).await?;
    match parsed(read.get(..len).unwrap_or(&[]))? {
        Reply::Scalar(Scalar::Simple(b"OK")) => Ok(()),
        Reply::Error(line) => Err(Error::Server(ServerError::from_line(line))),
        _ => Err(Error::Protocol(ProtocolError::Unexpected)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_milliseconds_and_never_below_one() {
        assert_eq!(ttl_ms(Duration::from_millis(300)).0, 300);
        assert_eq!(
            ttl_ms(Duration::from_micros(300_001)).1,
            Duration::from_millis(301)
        );
        assert_eq!(ttl_ms(Duration::ZERO).1, Duration::from_millis(1));
        assert_eq!(ttl_ms(Duration::MAX).0, u64::MAX / 1_000 + 1);
    }

    #[test]
    fn decimal_lengths() {
        for n in [0, 9, 10, 99, 100, u64::MAX] {
            assert_eq!(decimal_len(n), std::format!("{n}").len(), "{n}");
        }
    }
}
