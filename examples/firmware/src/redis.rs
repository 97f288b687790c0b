//! The lock service of the `redis` mode: `leasehold-resp` speaking RESP2 to a real
//! Redis over UART0 (under QEMU, `-serial tcp:127.0.0.1:PORT` puts Redis at the other
//! end of the wire).
//!
//! # Reconnecting over a wire that cannot re-dial
//!
//! The service calls its connection factory again after a request ended without a
//! whole reply (a timeout, a reply that did not parse, a request dropped half-way):
//! the answer to that request may still arrive and must not be taken for the answer
//! to the next. Over TCP the factory would open a new connection; a UART is always the
//! same wire. So this factory *resynchronises the byte stream* instead:
//!
//! 1. it discards the bytes already received;
//! 2. it sends `ECHO <nonce>`, a nonce fresh for every call;
//! 3. it discards every byte until the exact reply `$10\r\n<nonce>\r\n` has arrived.
//!
//! Redis answers the commands of one connection in the order it received them, so
//! once the echo of this nonce is in, every answer to an earlier request (and every
//! earlier echo, which carries another nonce) is behind it: the stream is clean. While
//! Redis is silent the echo never comes, and the factory runs until the request's
//! deadline (the service bounds it), costing one `Timeout`; the next request
//! resynchronises again with a new nonce. If Redis dropped the connection (a request
//! cut mid-write leaves it a broken command), QEMU's `reconnect=` re-dials and the
//! echo works on the new connection.

use core::convert::Infallible;

use embedded_io_async::{Read, Write};
use leasehold::Duration;
use leasehold_embassy::EmbassyClock;
use leasehold_resp::{Connect, RespLockService};

use crate::uart::Uart0;

/// The bound on every request, resynchronising included: a round trip over the UART
/// takes a few milliseconds, and the lease renews every second (TTL 3 s).
const REQUEST_TIMEOUT: Duration = Duration::from_millis(800);

/// The lock service over UART0, with the default buffers (one reply: 256 bytes; a
/// request is written through 128).
pub fn service() -> RespLockService<'static, impl Connect<Connection = Uart0>, EmbassyClock> {
    let uart = Uart0::enable();
    let mut calls = 0u32;
    let connect = move || {
        calls = calls.wrapping_add(1);
        // Fresh for each call and, with the tick count, unlikely to repeat across boots.
        let ticks = embassy_time::Instant::now().as_ticks() as u32;
        resync(uart, calls ^ ticks.rotate_left(16))
    };
    RespLockService::new(connect, EmbassyClock).with_request_timeout(REQUEST_TIMEOUT)
}

/// `ECHO <nonce>`'s bulk string: `lh` and the nonce in 8 hex digits (10 bytes).
fn nonce_text(nonce: u32) -> [u8; 10] {
    let mut text = *b"lh00000000";
    for (i, slot) in text.iter_mut().skip(2).enumerate() {
        let digit = (nonce >> (28 - 4 * i)) & 0xf;
        *slot = b"0123456789abcdef"
            .get(digit as usize)
            .copied()
            .unwrap_or(b'0');
    }
    text
}

/// The byte stream after it is resynchronised (see the module docs).
async fn resync(mut uart: Uart0, nonce: u32) -> Result<Uart0, Infallible> {
    while uart.try_read().is_some() {}
    let text = nonce_text(nonce);
    let mut command = *b"*2\r\n$4\r\nECHO\r\n$10\r\nlh00000000\r\n";
    // The nonce goes before the final CRLF.
    let at = command.len() - text.len() - 2;
    for (slot, &byte) in command.iter_mut().skip(at).zip(&text) {
        *slot = byte;
    }
    let mut rest = &command[..];
    while !rest.is_empty() {
        let sent = uart.write(rest).await?;
        rest = rest.get(sent..).unwrap_or(&[]);
    }
    // The reply we wait for, and the last bytes received, as long as it.
    let mut want = *b"$10\r\nlh00000000\r\n";
    for (slot, &byte) in want.iter_mut().skip(5).zip(&text) {
        *slot = byte;
    }
    let mut seen = [0u8; 17];
    loop {
        let mut byte = [0u8; 1];
        uart.read(&mut byte).await?;
        seen.rotate_left(1);
        if let Some(last) = seen.last_mut() {
            *last = byte[0];
        }
        if seen == want {
            return Ok(uart);
        }
    }
}
