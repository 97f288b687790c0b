//! Without the reaper (Unix other than Linux): the command is the supervisor's own
//! child, in its own process group, and only the supervisor stops it. Instants to run
//! until are not enforced (no one but the supervisor could); a kill-at instant is,
//! while the supervisor runs. A stalled or killed supervisor leaves the command
//! running: it must watch `LEASEHOLD_DEADLINE_FILE` itself, and its storage must
//! check `LEASEHOLD_FENCE`.

use std::ffi::OsString;
use std::path::Path;

use leasehold_tokio::LeaseClock;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;

use super::{Exit, Report, Settings};
use crate::child::ChildEnv;

/// The command as a direct child.
pub struct Direct {
    child: tokio::process::Child,
    pgid: Pid,
    started: bool,
    kill_at: Option<Instant>,
    exited: bool,
}

impl Direct {
    /// Spawns `command` through the helper with `env`.
    pub fn spawn(
        command: &[OsString],
        env: &ChildEnv<'_>,
        _dir: &Path,
        _settings: &Settings,
        _clock: LeaseClock,
    ) -> std::io::Result<Direct> {
        let mut cmd = crate::child::helper(command, None)?;
        cmd.envs(env.vars());
        let child = tokio::process::Command::from(cmd).spawn()?;
        let pid = child.id().ok_or_else(|| {
            std::io::Error::other("the command's process vanished before it could be supervised")
        })?;
        Ok(Direct {
            child,
            pgid: Pid::from_raw(pid.cast_signed()),
            started: false,
            kill_at: None,
            exited: false,
        })
    }

    /// Not enforced here (see the module docs).
    pub fn run_until(&mut self, _at: Instant) {}

    /// SIGKILL the group at `at` at the latest.
    pub fn kill_at(&mut self, at: Instant) {
        self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
    }

    /// Passes `signal` to the command's process group.
    pub fn signal(&mut self, signal: Signal) {
        if !self.exited {
            let _ = killpg(self.pgid, signal);
        }
    }

    /// The next report. Cancel-safe.
    pub async fn next(&mut self) -> Report {
        if !self.started {
            self.started = true;
            return Report::Started(self.pgid.as_raw().cast_unsigned());
        }
        loop {
            let kill_at = self.kill_at;
            tokio::select! {
                status = self.child.wait() => {
                    // Whatever the command left in its group must not outlive the lease.
                    let _ = killpg(self.pgid, Signal::SIGKILL);
                    self.exited = true;
                    return match status {
                        Ok(status) => Report::Exited(exit_of(status)),
                        Err(e) => Report::Failed(format!("lost track of the command: {e}")),
                    };
                }
                () = sleep_until(kill_at) => {
                    let _ = killpg(self.pgid, Signal::SIGKILL);
                    self.kill_at = None;
                }
            }
        }
    }

    /// Done with it.
    pub async fn close(self) {}
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Signal(0),
    }
}
