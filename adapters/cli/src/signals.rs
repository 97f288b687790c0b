//! The signals leasehold catches so that it can pass them on: SIGINT, SIGTERM, SIGHUP.
//!
//! Catching them means Ctrl-C no longer kills leasehold outright: while waiting it
//! stops waiting (and releases any grant in flight); while the command runs it
//! forwards the signal to the command's process group and keeps guarding the lease
//! until the command exits.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The three handlers.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (from now on these signals no longer kill leasehold).
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}
