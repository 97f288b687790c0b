//! Running one server process: spawn, signal, stop, reap.

use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a server gets to exit after `SIGTERM` before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How long the kernel gets to carry out a `SIGSTOP` or `SIGCONT`.
const SIGNAL_TAKES_EFFECT: Duration = Duration::from_secs(5);

/// Sends `signal` to `child`, by pid. For `SIGSTOP` and `SIGCONT`, returns once the
/// process is stopped or running again: `kill` only queues the signal, and a server
/// thread on another core can still answer a request sent right after it.
///
/// # Panics
///
/// When the signal cannot be sent (the process is gone), or does not take effect
/// within 5 s: the test's picture of the server is wrong.
pub(crate) fn signal(child: &Child, signal: Signal, what: &str) {
    send(child, signal, what);
    let pid = child.id();
    let stopped = match signal {
        Signal::SIGSTOP => true,
        Signal::SIGCONT => false,
        _ => return,
    };
    let give_up = Instant::now() + SIGNAL_TAKES_EFFECT;
    while is_stopped(child.id()) != Some(stopped) {
        assert!(
            Instant::now() < give_up,
            "{what} (pid {pid}) did not {} within {SIGNAL_TAKES_EFFECT:?} of {signal}",
            if stopped { "stop" } else { "continue" }
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends `signal` to `child`, by pid, without waiting for it to take effect.
fn send(child: &Child, signal: Signal, what: &str) {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"));
    kill(pid, signal).unwrap_or_else(|e| panic!("cannot send {signal} to {what}: {e}"));
}

/// Whether every thread of process `pid` is stopped by a signal (state `T` in
/// `/proc/<pid>/task/*/stat`; `Some(false)` once none is); `None` while they differ or
/// when that cannot be read.
fn is_stopped(pid: u32) -> Option<bool> {
    let mut states = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
        // "tid (comm) S …": the state follows the last ')', as comm may contain ')'.
        let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
        states.push(state == 'T');
    }
    let first = *states.first()?;
    states.iter().all(|&s| s == first).then_some(first)
}

/// `SIGKILL`, by pid, and reap.
pub(crate) fn kill_and_reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// `SIGTERM` (and `SIGCONT`, in case it was paused), then waits for the exit; kills it
/// if it has not exited within [`STOP_GRACE`].
pub(crate) fn stop_and_reap(child: Child, what: &str) {
    end_and_reap(child, Signal::SIGTERM, what);
}

/// [`stop_and_reap`] with `signal` instead of `SIGTERM`, for servers whose shutdown
/// modes are signals (PostgreSQL: `SIGINT` fast, `SIGQUIT` immediate).
pub(crate) fn end_and_reap(mut child: Child, signal: Signal, what: &str) {
    send(&child, signal, what);
    send(&child, Signal::SIGCONT, what);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_and_continue_take_effect_before_signal_returns() {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        signal(&child, Signal::SIGSTOP, "sleep");
        assert_eq!(is_stopped(child.id()), Some(true));
        signal(&child, Signal::SIGCONT, "sleep");
        assert_eq!(is_stopped(child.id()), Some(false));
        kill_and_reap(child);
    }
}
