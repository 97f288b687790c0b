//! Where connections come from, and the deadline every request runs under.

use core::future::Future;
use core::pin::pin;
use core::task::Poll;

use embedded_io_async::{Read, Write};

/// Makes a new connection to Redis: the service's reconnect hook.
///
/// The service calls it before its first request, and again before the first request
/// after a connection became unusable: a timeout, an I/O error, a reply that did not
/// parse, or a request whose future was dropped half-way (its reply may still be on
/// the way, so the next request must not read it). The old connection is dropped
/// first. The call runs under the request's deadline, so a factory that hangs costs
/// one `Timeout`, never a stuck lease.
///
/// Replies are matched to requests by their order alone, so the connection it returns
/// must not deliver a single byte meant for an earlier one. A new TCP connection never
/// does; a stream that outlives its connections (a UART to a gateway, a multiplexed
/// link) must be resynchronised here before it is returned — the firmware example
/// sends `ECHO` with a fresh nonce and discards everything up to that exact reply.
/// Otherwise a late answer to a timed-out acquire could be read as the next
/// request's grant.
///
/// Any `FnMut() -> impl Future<Output = Result<C, E>>` is a factory:
///
/// ```
/// use embedded_io_adapters::tokio_1::FromTokio;
/// use leasehold_resp::RespLockService;
/// use leasehold_tokio::LeaseClock;
///
/// // On a board: an embassy-net `TcpSocket`, or a UART, instead of a tokio stream.
/// let service: RespLockService<'_, _, _> = RespLockService::new(
///     || async { tokio::net::TcpStream::connect("127.0.0.1:6379").await.map(FromTokio::new) },
///     LeaseClock::start(),
/// );
/// assert_eq!(service.connects(), 0, "nothing happens until the first request");
/// ```
pub trait Connect {
    /// The stream: TCP, a UART, anything `embedded-io-async`.
    type Connection: Read + Write;
    /// Why connecting failed (reported as [`Error::Connect`](crate::Error::Connect)).
    type Error;

    /// A fresh connection, not yet authenticated (the service sends `AUTH`).
    fn connect(&mut self) -> impl Future<Output = Result<Self::Connection, Self::Error>>;
}

impl<F, Fut, C, E> Connect for F
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<C, E>>,
    C: Read + Write,
{
    type Connection = C;
    type Error = E;

    fn connect(&mut self) -> impl Future<Output = Result<C, E>> {
        self()
    }
}

/// Runs `work` until it completes or `deadline` does, whichever is first; `None` on
/// the deadline. `work` is dropped then, mid-request.
pub(crate) async fn before<T>(
    work: impl Future<Output = T>,
    deadline: impl Future<Output = ()>,
) -> Option<T> {
    let mut work = pin!(work);
    let mut deadline = pin!(deadline);
    core::future::poll_fn(|cx| {
        if let Poll::Ready(value) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(value));
        }
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}
