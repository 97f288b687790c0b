//! The reaper (Linux): a second leasehold process that is the command's parent and
//! enforces the lease's deadline on its own, so that **a command never outlives its
//! lease**, even when `run` (the supervisor) is stopped, paused or killed.
//!
//! ```text
//!  leasehold run (supervisor)  ── run-until / kill-at / signal ──▶  leasehold __reap
//!   acquires, renews, decides  ◀── started / stalled / exited ───   (its own process
//!   subreaper, second line          two pipes, one line each         group, subreaper)
//!                                                                         │ spawns
//!                                                                 leasehold __exec CMD
//!                                                            (PDEATHSIG, joins the cgroup,
//!                                                             its own process group, execs)
//! ```
//!
//! - **Why a second process.** A supervisor that is stopped (SIGSTOP, a VM stall, a
//!   swap storm) renews nothing and stops nothing: the command would run on beside
//!   the next holder. The reaper needs nothing from the supervisor to stop it: it is
//!   told the instant the tree may run until (the safe deadline less the kill lead,
//!   as an absolute `CLOCK_BOOTTIME` instant, see [`boottime`]) after the grant and
//!   after every confirmed renewal, and stops the tree when that instant passes
//!   without a newer one — by SIGKILL, or with `--on-stall freeze` by freezing it
//!   (thawed if a newer instant comes, killed if the lease ends or the supervisor
//!   dies).
//! - **Why a subreaper and a cgroup.** A process group does not hold a tree:
//!   `setsid` and double forks leave it. The reaper sets `PR_SET_CHILD_SUBREAPER`, so
//!   every orphan of the tree is re-parented to it, not to init; and where the
//!   machine allows it, the command runs in a cgroup of its own ([`cgroup`]), which
//!   kills or freezes the whole tree in one step. Without a cgroup, [`procs`] finds
//!   the tree through `/proc`.
//! - **When the supervisor dies**, by any signal, its end of the control pipe closes:
//!   the reaper kills the whole tree at once, removes the run's private directory
//!   and exits.
//! - **Signals sent to the reaper itself** — SIGINT, SIGTERM, SIGHUP — are blocked
//!   and ignored: the supervisor passes those it gets on to the command (`signal`),
//!   so `pkill leasehold` reaches the command once, not twice. SIGTTOU is blocked
//!   too, so that a message from the reaper in a background process group never
//!   stops it.
//! - **What the reaper cannot survive**: SIGKILL or SIGSTOP of the reaper itself. A
//!   dead reaper's command gets its parent-death signal at once, and the supervisor
//!   (a subreaper too) kills the orphans of the tree; but when both leasehold
//!   processes are killed together (`pkill -9 leasehold`), orphans go to init and a
//!   cgroup is left behind. A stopped reaper stops nothing; neither does a paused
//!   machine (both processes are paused with the command).
//!
//! No `unsafe`: the control pipes are inherited without close-on-exec and re-opened
//! through `/proc/self/fd/N`; the timer is a `timerfd`, SIGCHLD comes through a
//! `signalfd`, all polled together.

mod boottime;
pub mod cgroup;
mod control;
mod handle;
pub mod procs;
mod watch;

pub use handle::Reaper;

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use crate::cli::{CgroupMode, OnStall};
use crate::exit;
use crate::tree::Settings;

/// The hidden first argument that selects the reaper.
pub const REAPER: &str = "__reap";

/// Runs as the reaper with `args` (after [`REAPER`]); the exit code.
pub fn main(args: &[OsString]) -> u8 {
    let Some((settings, control_fd, report_fd, private_dir, command)) = parse(args) else {
        say!("{REAPER}: bad arguments (it is started by `leasehold run`)");
        return exit::FAILURE;
    };
    crate::say::set_quiet(settings.quiet);
    crate::init_tracing(settings.quiet, settings.verbose);
    match watch::Watch::start(settings, control_fd, report_fd, private_dir, command) {
        Ok(watch) => watch.run(),
        Err(why) => {
            say!("the reaper cannot start: {why}");
            exit::FAILURE
        }
    }
}

/// The arguments [`handle::Reaper::spawn`] passes, in its order:
/// `CONTROL_FD REPORT_FD PRIVATE_DIR kill|freeze auto|off q|VERBOSITY -- CMD ARGS…`.
fn args_for(settings: &Settings, control_fd: i32, report_fd: i32, dir: &OsStr) -> Vec<OsString> {
    let on_stall = match settings.on_stall {
        OnStall::Kill => "kill",
        OnStall::Freeze => "freeze",
    };
    let cgroup = match settings.cgroup {
        CgroupMode::Auto => "auto",
        CgroupMode::Off => "off",
    };
    let verbosity = if settings.quiet {
        "q".to_owned()
    } else {
        settings.verbose.to_string()
    };
    vec![
        REAPER.into(),
        control_fd.to_string().into(),
        report_fd.to_string().into(),
        dir.to_owned(),
        on_stall.into(),
        cgroup.into(),
        verbosity.into(),
        "--".into(),
    ]
}

type Parsed = (Settings, i32, i32, PathBuf, Vec<OsString>);

fn parse(args: &[OsString]) -> Option<Parsed> {
    let [control, report, dir, on_stall, cgroup, verbosity, dashes, command @ ..] = args else {
        return None;
    };
    if dashes != "--" || command.is_empty() {
        return None;
    }
    let on_stall = match on_stall.to_str()? {
        "kill" => OnStall::Kill,
        "freeze" => OnStall::Freeze,
        _ => return None,
    };
    let cgroup = match cgroup.to_str()? {
        "auto" => CgroupMode::Auto,
        "off" => CgroupMode::Off,
        _ => return None,
    };
    let (quiet, verbose) = match verbosity.to_str()? {
        "q" => (true, 0),
        n => (false, n.parse().ok()?),
    };
    let settings = Settings {
        on_stall,
        cgroup,
        quiet,
        verbose,
    };
    Some((
        settings,
        control.to_str()?.parse().ok()?,
        report.to_str()?.parse().ok()?,
        PathBuf::from(dir),
        command.to_vec(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_read_back() {
        let settings = Settings {
            on_stall: OnStall::Freeze,
            cgroup: CgroupMode::Off,
            quiet: false,
            verbose: 2,
        };
        let mut args = args_for(&settings, 7, 9, OsStr::new("/run/x"));
        args.push("sh".into());
        args.push("-c".into());
        let (parsed, c, r, dir, command) = parse(&args[1..]).unwrap();
        assert_eq!(parsed, settings);
        assert_eq!((c, r), (7, 9));
        assert_eq!(dir, PathBuf::from("/run/x"));
        assert_eq!(command, vec![OsString::from("sh"), OsString::from("-c")]);
    }
}
