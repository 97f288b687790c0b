//! The reaper's loop: wait for the first of a message from the supervisor, SIGCHLD,
//! and the timer (the earlier of the run-until and kill-at instants), on
//! `CLOCK_BOOTTIME`; act; repeat until the supervisor is gone.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::boottime;
use super::cgroup::Cgroup;
use super::control::{Exit, FromReaper, Lines, ToReaper};
use super::procs;
use crate::cli::{CgroupMode, OnStall};
use crate::tree::Settings;

/// How long a freeze may take before the tree is killed instead.
const FREEZE_BOUND: Duration = Duration::from_millis(100);

/// Where the command is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Command {
    /// Not started: waiting for the first run-until instant.
    Waiting,
    /// Running with this pid (its process group too), not yet reaped.
    Running(Pid),
    /// Exited (or never started), reported; the tree is dead.
    Done,
}

/// How the tree was frozen, so that a thaw undoes just that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frozen {
    /// `cgroup.freeze`.
    Cgroup,
    /// SIGSTOP to every descendant.
    Signals,
}

/// The reaper's state.
pub struct Watch {
    settings: Settings,
    control: File,
    lines: Lines,
    report: File,
    sigchld: SignalFd,
    timer: TimerFd,
    private_dir: PathBuf,
    cgroup: Option<Cgroup>,
    argv: Vec<OsString>,
    command: Command,
    /// The command's status once reaped.
    status: Option<Exit>,
    run_until: Option<u64>,
    kill_at: Option<u64>,
    frozen: Option<Frozen>,
}

impl Watch {
    /// Takes over the inherited pipe ends, blocks the signals it handles or ignores,
    /// becomes a subreaper, makes the cgroup (or says why not).
    pub fn start(
        settings: Settings,
        control_fd: i32,
        report_fd: i32,
        private_dir: PathBuf,
        argv: Vec<OsString>,
    ) -> Result<Watch, String> {
        let reopen = |fd: i32, write: bool| {
            let path = format!("/proc/self/fd/{fd}");
            let file = std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(&path)
                .map_err(|e| format!("cannot open {path}: {e}"));
            // The inherited descriptor has no close-on-exec: close it before anything
            // is spawned; the re-opened one has it.
            let _ = nix::unistd::close(fd);
            file
        };
        let control = reopen(control_fd, false)?;
        let mut report = reopen(report_fd, true)?;
        let mut blocked = SigSet::empty();
        for s in [
            Signal::SIGCHLD,
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGHUP,
            Signal::SIGTTOU,
        ] {
            blocked.add(s);
        }
        nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None)
            .map_err(|e| format!("cannot block signals: {e}"))?;
        let mut chld = SigSet::empty();
        chld.add(Signal::SIGCHLD);
        let sigchld = SignalFd::with_flags(&chld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(|e| format!("no signalfd: {e}"))?;
        let timer = TimerFd::new(
            ClockId::CLOCK_BOOTTIME,
            TimerFlags::TFD_CLOEXEC | TimerFlags::TFD_NONBLOCK,
        )
        .map_err(|e| format!("no timerfd on CLOCK_BOOTTIME: {e}"))?;
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| format!("cannot become a subreaper: {e}"))?;
        let cgroup = match settings.cgroup {
            CgroupMode::Off => None,
            CgroupMode::Auto => match Cgroup::create() {
                Ok(cgroup) => {
                    tracing::debug!("the command's cgroup: {}", cgroup.dir().display());
                    let _ = report.write_all(
                        FromReaper::Cgroup(cgroup.dir().to_owned())
                            .encode()
                            .as_bytes(),
                    );
                    Some(cgroup)
                }
                Err(why) => {
                    tracing::debug!(
                        "no cgroup for the command ({why}): its tree is found through /proc"
                    );
                    None
                }
            },
        };
        Ok(Watch {
            settings,
            control,
            lines: Lines::default(),
            report,
            sigchld,
            timer,
            private_dir,
            cgroup,
            argv,
            command: Command::Waiting,
            status: None,
            run_until: None,
            kill_at: None,
            frozen: None,
        })
    }

    /// The loop; returns when the supervisor is gone, the tree dead and the private
    /// directory and cgroup removed.
    pub fn run(mut self) -> u8 {
        loop {
            self.arm_timer();
            let (control, child, timer) = {
                let mut fds = [
                    PollFd::new(self.control.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.sigchld.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.timer.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => {
                        say!("the reaper cannot wait: {e}; stopping the command");
                        break;
                    }
                }
                let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]), ready(&fds[2]))
            };
            if child {
                while let Ok(Some(_)) = self.sigchld.read_signal() {}
                self.reap();
            }
            if timer {
                self.on_timer();
            }
            if control && !self.read_control() {
                break;
            }
        }
        // The supervisor is gone (or the loop cannot go on): nothing guards the lease.
        if matches!(self.command, Command::Running(_)) {
            self.kill_tree();
        }
        if let Some(cgroup) = &self.cgroup {
            cgroup.remove();
        }
        let _ = std::fs::remove_dir_all(&self.private_dir);
        0
    }

    /// Sets the timer to the next instant to act at, or disarms it.
    fn arm_timer(&self) {
        let due = match self.command {
            Command::Running(_) => {
                let stall = if self.frozen.is_some() {
                    None
                } else {
                    self.run_until
                };
                [stall, self.kill_at].into_iter().flatten().min()
            }
            Command::Waiting | Command::Done => None,
        };
        // Setting the timer also clears an expiry not yet read.
        let _ = match due {
            Some(at) => self.timer.set(
                Expiration::OneShot(TimeSpec::from_duration(Duration::from_nanos(at.max(1)))),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => self.timer.unset(),
        };
    }

    /// Reads what the supervisor sent; false at end-of-file (it is gone).
    fn read_control(&mut self) -> bool {
        let mut buf = [0u8; 512];
        match self.control.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => self.lines.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                say!("the reaper cannot read from leasehold: {e}");
                return false;
            }
        }
        while let Some(line) = self.lines.next_line() {
            match ToReaper::parse(&line) {
                Some(message) => self.on_message(message),
                None => tracing::debug!("reaper: unknown message {line:?}"),
            }
        }
        true
    }

    fn on_message(&mut self, message: ToReaper) {
        let now = boottime::now_ns();
        match message {
            ToReaper::RunUntil(at) => {
                self.run_until = Some(self.run_until.map_or(at, |r| r.max(at)));
                match self.command {
                    Command::Waiting if at > now => self.spawn(),
                    Command::Waiting => self.finish(Exit::NotStarted),
                    Command::Running(_) if self.frozen.is_some() && at > now => {
                        self.thaw();
                        self.send(&FromReaper::Thawed);
                    }
                    Command::Running(_) | Command::Done => {}
                }
            }
            ToReaper::KillAt(at) => {
                self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
                match self.command {
                    Command::Waiting => self.finish(Exit::NotStarted),
                    // Frozen because the deadline passed, and now the lease is ending.
                    Command::Running(_) if self.frozen.is_some() || at <= now => {
                        self.kill_and_report();
                    }
                    Command::Running(_) | Command::Done => {}
                }
            }
            ToReaper::Signal(n) => {
                if let (Command::Running(pid), Ok(signal)) = (self.command, Signal::try_from(n)) {
                    // Unreaped, so its process group id is still its own.
                    let _ = killpg(pid, signal);
                }
            }
        }
    }

    /// The timer fired: kill at kill-at; at run-until, stop the tree as `--on-stall`
    /// says (the supervisor sent nothing newer: it is stalled).
    fn on_timer(&mut self) {
        let _ = self.timer.unset();
        let Command::Running(_) = self.command else {
            return;
        };
        let now = boottime::now_ns();
        if self.kill_at.is_some_and(|at| at <= now) {
            self.kill_and_report();
        } else if self.frozen.is_none() && self.run_until.is_some_and(|at| at <= now) {
            if self.settings.on_stall == OnStall::Freeze {
                self.frozen = self.freeze();
            }
            if self.frozen.is_some() {
                self.send(&FromReaper::Stalled(OnStall::Freeze));
            } else {
                self.send(&FromReaper::Stalled(OnStall::Kill));
                self.kill_and_report();
            }
        }
    }

    /// Starts the command through the `__exec` helper, in its own process group.
    fn spawn(&mut self) {
        let cgroup_procs = self.cgroup.as_ref().map(Cgroup::procs);
        let spawned = crate::child::helper(&self.argv, cgroup_procs.as_deref())
            .and_then(|mut command| command.spawn());
        match spawned {
            Ok(child) => {
                let pid = child.id();
                // Reaped with waitpid below, never through `child`.
                drop(child);
                self.command = Command::Running(Pid::from_raw(pid.cast_signed()));
                self.send(&FromReaper::Started(pid));
            }
            Err(e) => {
                self.command = Command::Done;
                self.send(&FromReaper::Failed(format!(
                    "cannot start the command: {e}"
                )));
            }
        }
    }

    /// Reaps whatever exited; when the command did, kills what it left and reports.
    fn reap(&mut self) {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) => self.note(status),
            }
        }
        if self.status.is_some() && matches!(self.command, Command::Running(_)) {
            // Whatever the command left must not outlive the lease.
            self.kill_and_report();
        }
    }

    /// Remembers the command's status if `status` is its.
    fn note(&mut self, status: WaitStatus) {
        let Command::Running(pid) = self.command else {
            return;
        };
        if status.pid() != Some(pid) {
            return;
        }
        self.status = match status {
            WaitStatus::Exited(_, code) => Some(Exit::Code(code)),
            WaitStatus::Signaled(_, signal, _) => Some(Exit::Signal(signal as i32)),
            _ => self.status,
        };
    }

    /// Kills and reaps the whole tree; leaves the command's status in `self.status`.
    fn kill_tree(&mut self) {
        if let Some(cgroup) = &self.cgroup {
            if let Err(e) = cgroup.kill() {
                tracing::debug!("cgroup.kill failed ({e}): killing through /proc");
            }
        }
        if let (Command::Running(pid), None) = (self.command, self.status) {
            // Not reaped yet, so the group id cannot belong to anyone else: one signal
            // for everything still in the command's group.
            let _ = killpg(pid, Signal::SIGKILL);
        }
        let mut statuses = Vec::new();
        procs::kill_descendants(true, |_, status| statuses.push(status));
        for status in statuses {
            self.note(status);
        }
        self.frozen = None;
    }

    fn kill_and_report(&mut self) {
        self.kill_tree();
        let exit = self.status.unwrap_or(Exit::Signal(Signal::SIGKILL as i32));
        self.finish(exit);
    }

    /// Reports the end; from now on only the supervisor's end-of-file matters.
    fn finish(&mut self, exit: Exit) {
        self.command = Command::Done;
        self.send(&FromReaper::Exited(exit));
    }

    /// Freezes the tree: the cgroup, else SIGSTOP to every process; `None` if neither
    /// worked in time (the caller kills instead).
    fn freeze(&self) -> Option<Frozen> {
        if let Some(cgroup) = &self.cgroup {
            if cgroup.freeze(FREEZE_BOUND) {
                return Some(Frozen::Cgroup);
            }
            cgroup.thaw();
        }
        if procs::stop_descendants() {
            return Some(Frozen::Signals);
        }
        procs::continue_descendants();
        None
    }

    fn thaw(&mut self) {
        match self.frozen.take() {
            Some(Frozen::Cgroup) => {
                if let Some(cgroup) = &self.cgroup {
                    cgroup.thaw();
                }
            }
            Some(Frozen::Signals) => procs::continue_descendants(),
            None => {}
        }
    }

    fn send(&mut self, message: &FromReaper) {
        // A supervisor that is gone cannot be told; the end-of-file comes next.
        let _ = self.report.write_all(message.encode().as_bytes());
    }
}
