//! The exit codes, one place: they follow `flock(1)` (1 when `-n` finds the lock
//! taken) and `timeout(1)` (124 timed out, 125 the tool itself failed, 126/127 the
//! command could not be run, 128+N killed by signal N).

/// `--no-wait` found the key held (`flock -n`'s 1; change it with `--conflict-exit-code`).
pub const BUSY: u8 = 1;
/// `status`: the key is free (0 when it is held, as `test` answers "is it held?").
pub const FREE: u8 = 1;
/// The lease was lost while the command ran: leasehold stopped the command (SIGTERM,
/// then SIGKILL) before another holder could be granted the key.
pub const LOST: u8 = 122;
/// `--wait` ran out while the key stayed held (`timeout(1)`'s 124).
pub const TIMED_OUT: u8 = 124;
/// leasehold itself failed: bad arguments, an unusable service URL, a service that
/// refused (credentials, wrong type) or never answered (`timeout(1)`'s 125).
pub const FAILURE: u8 = 125;
/// The command was found but could not be executed (`timeout(1)`'s 126).
pub const NOT_EXECUTABLE: u8 = 126;
/// The command was not found (`timeout(1)`'s 127).
pub const NOT_FOUND: u8 = 127;

/// 128 + N for a process ended by signal N, as shells report it.
pub fn signalled(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(255)
}
