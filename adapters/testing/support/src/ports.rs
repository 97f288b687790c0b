//! Free loopback ports.

use std::collections::HashSet;
use std::sync::Mutex;

/// A loopback TCP port nobody listens on right now, never handed out twice by this
/// process.
///
/// `portpicker` checks that the port can be bound; the process-wide record keeps two
/// servers started back to back from getting the same port before either has bound
/// it. Another process can still take the port before our server binds it; the
/// starters in this crate retry their first start on a new port when that happens.
///
/// # Panics
///
/// When no port is free (the machine is out of ports): the test cannot run.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..1_000 {
        let port = portpicker::pick_unused_port().expect("a free loopback port");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
    panic!("no loopback port left that this process has not handed out already");
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
        for port in ports.iter().take(5) {
            std::net::TcpListener::bind(("127.0.0.1", *port))
                .unwrap_or_else(|e| panic!("port {port} is not free: {e}"));
        }
    }
}
