//! UART0 of the Arm MPS2 boards (QEMU's `mps2-an385` and `mps2-an386`): a CMSDK APB
//! UART, as an `embedded-io-async` stream.
//!
//! The UART has a one-byte buffer each way and no FIFO. This driver polls its status
//! register and, when the UART is not ready, yields to the executor (the task is polled
//! again at once, the other tasks run in between): no interrupt, no waker to register.
//! The cost is that the executor does not sleep while a read is waiting; the lease task
//! is the only reader and reads only while a request is in flight.

use core::convert::Infallible;
use core::future::poll_fn;
use core::task::Poll;

use embedded_io_async::{ErrorType, Read, Write};

use crate::mps2::{self as mmio, Reg};

const TX_FULL: u32 = 1 << 0;
const RX_FULL: u32 = 1 << 1;
const TX_ENABLE: u32 = 1 << 0;
const RX_ENABLE: u32 = 1 << 1;
/// 25 MHz APB clock / 115 200 baud (QEMU does not pace the bytes; hardware would).
const BAUD_DIV: u32 = 25_000_000 / 115_200;

/// UART0, enabled for sending and receiving. A handle: every copy drives the same
/// UART, so only one task may use it (here: the lease task, through the Redis service).
#[derive(Clone, Copy)]
pub struct Uart0(());

impl Uart0 {
    /// Sets the baud rate and enables both directions.
    pub fn enable() -> Uart0 {
        mmio::write(Reg::UartBaudDiv, BAUD_DIV);
        mmio::write(Reg::UartCtrl, TX_ENABLE | RX_ENABLE);
        Uart0(())
    }

    /// The received byte, if one is waiting.
    pub fn try_read(&mut self) -> Option<u8> {
        if mmio::read(Reg::UartState) & RX_FULL != 0 {
            Some(mmio::read(Reg::UartData) as u8)
        } else {
            None
        }
    }

    /// Sends `byte` if the TX buffer is free; `false` if it is full.
    fn try_write(&mut self, byte: u8) -> bool {
        if mmio::read(Reg::UartState) & TX_FULL != 0 {
            return false;
        }
        mmio::write(Reg::UartData, u32::from(byte));
        true
    }
}

/// Lets the other tasks run once, then resumes.
async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await;
}

impl ErrorType for Uart0 {
    type Error = Infallible;
}

impl Read for Uart0 {
    /// Waits for at least one byte, then takes what is there without waiting again.
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Infallible> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let mut n = 0;
            for slot in buf.iter_mut() {
                match self.try_read() {
                    Some(byte) => {
                        *slot = byte;
                        n += 1;
                    }
                    None => break,
                }
            }
            if n > 0 {
                return Ok(n);
            }
            yield_now().await;
        }
    }
}

impl Write for Uart0 {
    /// Waits until at least one byte went out, then sends what fits without waiting.
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Infallible> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let mut n = 0;
            for &byte in buf {
                if !self.try_write(byte) {
                    break;
                }
                n += 1;
            }
            if n > 0 {
                return Ok(n);
            }
            yield_now().await;
        }
    }

    /// Waits until the last byte left the TX buffer.
    async fn flush(&mut self) -> Result<(), Infallible> {
        while mmio::read(Reg::UartState) & TX_FULL != 0 {
            yield_now().await;
        }
        Ok(())
    }
}
