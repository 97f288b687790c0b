//! Running one server process: spawn, signal, stop, reap.

use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a server gets to exit after `SIGTERM` before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Sends `signal` to `child`, by pid.
///
/// # Panics
///
/// When the signal cannot be sent (the process is gone): the test's picture of the
/// server is wrong.
pub(crate) fn signal(child: &Child, signal: Signal, what: &str) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"));
    kill(pid, signal).unwrap_or_else(|e| panic!("cannot send {signal} to {what}: {e}"));
}

/// `SIGKILL`, by pid, and reap.
pub(crate) fn kill_and_reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// `SIGTERM` (and `SIGCONT`, in case it was paused), then waits for the exit; kills it
/// if it has not exited within [`STOP_GRACE`].
pub(crate) fn stop_and_reap(mut child: Child, what: &str) {
    signal(&child, Signal::SIGTERM, what);
    signal(&child, Signal::SIGCONT, what);
    let give_up = Instant::now() + STOP_GRACE;
    while Instant::now() < give_up {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("{what} did not exit within {STOP_GRACE:?} of SIGTERM; killing it");
    kill_and_reap(child);
}

/// Whether `child` has exited (and reaps it if so).
pub(crate) fn exited(child: &mut Child) -> Option<std::process::ExitStatus> {
    child.try_wait().ok().flatten()
}
