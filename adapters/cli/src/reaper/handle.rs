//! The supervisor's side of the reaper: spawn it with its two pipe ends, send it
//! instants and signals, read what it reports — and be the second line when it dies
//! without having reported the command's end.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::task::{Context, Poll};

use leasehold_tokio::LeaseClock;
use nix::errno::Errno;
use nix::sys::signal::Signal;
use tokio::net::unix::pipe;
use tokio::time::Instant;

use super::boottime;
use super::cgroup::Cgroup;
use super::control::{FromReaper, Lines, ToReaper};
use super::procs;
use crate::child::ChildEnv;
use crate::tree::{Report, Settings};

/// The running reaper.
pub struct Reaper {
    process: tokio::process::Child,
    /// Non-blocking: a write never stalls this process.
    control: std::io::PipeWriter,
    /// Read directly (`read(2)`) at every poll before tokio's readiness is consulted:
    /// tokio learns of readiness only when its reactor runs, so after this process was
    /// stopped, a report already in the pipe would lose to a timer that expired
    /// meanwhile; the report must come first, as it explains what happened.
    reports: pipe::Receiver,
    lines: Lines,
    clock: LeaseClock,
    /// The command's cgroup, once the reaper said it made one.
    cgroup: Option<PathBuf>,
    /// The reports reached end-of-file.
    eof: bool,
}

impl Reaper {
    /// Spawns the reaper for `command` with `env`; `dir` is the run's private directory
    /// (the reaper removes it if this process dies). Instants are converted on the
    /// lease's `clock`. The command starts with the first [`run_until`](Self::run_until).
    ///
    /// This process becomes a subreaper too: when the reaper dies, the tree's orphans
    /// come here, for [`next`](Self::next) to kill.
    pub fn spawn(
        command: &[OsString],
        env: &ChildEnv<'_>,
        dir: &Path,
        settings: &Settings,
        clock: LeaseClock,
    ) -> std::io::Result<Reaper> {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::debug!("cannot become a subreaper ({e}): no second line");
        }
        let me = std::env::current_exe()?;
        let (control_read, control_write) = std::io::pipe()?;
        let (reports_read, reports_write) = std::io::pipe()?;
        // Copies without close-on-exec, for the reaper to inherit; this process's own
        // ends keep it. Nothing else spawns meanwhile (one thread, see main).
        let control_fd = nix::unistd::dup(control_read.as_raw_fd())?;
        let report_fd = match nix::unistd::dup(reports_write.as_raw_fd()) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = nix::unistd::close(control_fd);
                return Err(e.into());
            }
        };
        let spawned = tokio::process::Command::new(me)
            .args(super::args_for(
                settings,
                control_fd,
                report_fd,
                dir.as_os_str(),
            ))
            .args(command)
            .envs(env.vars())
            .process_group(0)
            .spawn();
        let _ = nix::unistd::close(control_fd);
        let _ = nix::unistd::close(report_fd);
        drop((control_read, reports_write));
        let process = spawned?;
        non_blocking(&control_write)?;
        Ok(Reaper {
            process,
            control: control_write,
            reports: pipe::Receiver::from_owned_fd(OwnedFd::from(reports_read))?,
            lines: Lines::default(),
            clock,
            cgroup: None,
            eof: false,
        })
    }

    /// The tree may run until `at` (a tokio instant on the lease's clock).
    pub fn run_until(&mut self, at: Instant) {
        self.send(ToReaper::RunUntil(boottime::of(&self.clock, at)));
    }

    /// SIGKILL the tree at `at` at the latest.
    pub fn kill_at(&mut self, at: Instant) {
        self.send(ToReaper::KillAt(boottime::of(&self.clock, at)));
    }

    /// Passes `signal` to the command's process group.
    pub fn signal(&mut self, signal: Signal) {
        self.send(ToReaper::Signal(signal as i32));
    }

    fn send(&mut self, message: ToReaper) {
        // One short line is written whole or not at all (below PIPE_BUF); the pipe
        // is full only if the reaper stopped reading, and then waiting would not help.
        let line = message.encode();
        match self.control.write(line.as_bytes()) {
            Ok(n) if n == line.len() => {}
            Ok(_) | Err(_) => tracing::warn!("the reaper is not reading: {message:?} not sent"),
        }
    }

    /// The next report. Cancel-safe. When the reaper ends without having reported the
    /// command's end, this process kills what is left of the tree (the cgroup, and
    /// its own children: the reaper's orphans) and reports [`Report::Failed`].
    pub async fn next(&mut self) -> Report {
        loop {
            while let Some(line) = self.lines.next_line() {
                match FromReaper::parse(&line) {
                    Some(FromReaper::Cgroup(dir)) => self.cgroup = Some(dir),
                    Some(FromReaper::Started(pid)) => return Report::Started(pid),
                    Some(FromReaper::Stalled(how)) => return Report::Stalled(how),
                    Some(FromReaper::Thawed) => return Report::Thawed,
                    Some(FromReaper::Exited(exit)) => return Report::Exited(exit),
                    Some(FromReaper::Failed(why)) => return Report::Failed(why),
                    None => tracing::debug!("unknown report from the reaper: {line:?}"),
                }
            }
            if self.eof {
                return self.second_line().await;
            }
            std::future::poll_fn(|cx| self.poll_fill(cx)).await;
        }
    }

    /// Reads what the pipe holds now; ready once something was read or the pipe
    /// ended (see `reports`).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut buf = [0u8; 512];
        loop {
            let read = match nix::unistd::read(self.reports.as_raw_fd(), &mut buf) {
                // Empty now: let tokio know (a read through it clears its readiness),
                // then wait for the next.
                Err(Errno::EAGAIN) => match self.reports.try_read(&mut buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        match self.reports.poll_read_ready(cx) {
                            Poll::Ready(Ok(())) => continue,
                            Poll::Ready(Err(_)) => Ok(0),
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                    other => other.map_err(|_| Errno::EIO),
                },
                other => other,
            };
            match read {
                Ok(0) => self.eof = true,
                Ok(n) => self.lines.push(&buf[..n]),
                Err(Errno::EINTR) => continue,
                Err(_) => self.eof = true,
            }
            return Poll::Ready(());
        }
    }

    /// The reaper is gone and did not report the command's end: kill the tree here.
    async fn second_line(&mut self) -> Report {
        let status = self.process.wait().await;
        let cgroup = self.cgroup.take().map(Cgroup::at);
        if let Some(cgroup) = &cgroup {
            let _ = cgroup.kill();
        }
        procs::kill_descendants(false, |_, _| {});
        if let Some(cgroup) = &cgroup {
            cgroup.remove();
        }
        let how = status.map_or_else(|e| e.to_string(), |s| s.to_string());
        Report::Failed(format!(
            "the reaper ended unexpectedly ({how}); leasehold killed what was left of the \
             command"
        ))
    }

    /// Done with it: closes the control pipe (the reaper exits at its end) and reaps
    /// it, waiting at most a second.
    pub async fn close(self) {
        let Reaper {
            mut process,
            control,
            ..
        } = self;
        drop(control);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), process.wait()).await;
    }
}

/// Sets `O_NONBLOCK` on a pipe end.
fn non_blocking(fd: &impl AsRawFd) -> std::io::Result<()> {
    let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::F_SETFL(flags))?;
    Ok(())
}
