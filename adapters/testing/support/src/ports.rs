//! Free loopback ports.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::ops::Range;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// A loopback TCP port nobody listens on right now, never handed out twice by this
/// process.
///
/// Drawn at random from 15000..25000, below Linux's ephemeral ports (32768 and up), so
/// that an outgoing connection's local port does not take it before our server binds
/// it; checked by binding it; the process-wide record keeps two servers started back
/// to back from getting the same port before either has bound it. Another process can
/// still take the port before our server binds it; the starters in this crate retry
/// their first start on a new port when that happens.
///
/// # Panics
///
/// When no port is free (the machine is out of ports): the test cannot run.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<(HashSet<u16>, u64)>> = Mutex::new(None);
    let mut guard = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let (given, state) = guard.get_or_insert_with(|| (HashSet::new(), seed()));
    for _ in 0..10_000 {
        let port = RANGE.start + (next(state) % u64::from(RANGE.end - RANGE.start)) as u16;
        if !given.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {RANGE:?} that this process has not handed out");
}

/// Where [`free_port`] draws from.
const RANGE: Range<u16> = 15_000..25_000;

/// A different start for each process: the clock and the process id.
fn seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

/// xorshift64: a spread of ports, not secrecy.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_bindable_and_never_repeat() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(
            unique.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
        assert!(ports.iter().all(|port| RANGE.contains(port)), "{ports:?}");
        for port in ports.iter().take(5) {
            std::net::TcpListener::bind(("127.0.0.1", *port))
                .unwrap_or_else(|e| panic!("port {port} is not free: {e}"));
        }
    }
}
