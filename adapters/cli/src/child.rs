//! Starting the command: in its own process group, through a re-exec of this binary
//! (`leasehold __exec CMD ARGS…`), so that what must happen between fork and `exec`
//! needs no `unsafe` `pre_exec` hook.
//!
//! On Linux the helper is spawned by the reaper (see `reaper`), and before it
//! becomes CMD (`execvp`) it:
//!
//! 1. asks for `PR_SET_PDEATHSIG = SIGKILL` (a safe call in `nix`): the command is
//!    killed the moment the reaper dies, even by SIGKILL. The signal survives the
//!    `exec`; the kernel sends it when the parent *thread* exits, and the reaper is
//!    single-threaded;
//! 2. checks that its parent is still the reaper that spawned it (the reaper may have
//!    died between the fork and the `prctl`, in which case the signal would never
//!    come);
//! 3. joins the command's cgroup, when the reaper made one, by writing `0` to its
//!    `cgroup.procs`: everything the command forks is in the cgroup from the start.
//!    (The reaper checked that such a move is allowed when it made the cgroup; if it
//!    fails anyway, the command does not run.)
//!
//! Everywhere, it then empties its signal mask: a blocked signal stays blocked across
//! `fork` and `exec`, and the reaper blocks SIGINT, SIGTERM, SIGHUP, SIGCHLD and
//! SIGTTOU for itself; the command must get them.
//!
//! On other Unix systems `run` spawns the helper itself and the helper only `exec`s:
//! no parent-death signal exists, so a SIGKILLed supervisor leaves CMD running; it
//! must stop on its own at the deadline in `LEASEHOLD_DEADLINE_FILE`, and its storage
//! must check `LEASEHOLD_FENCE`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::exit;

/// The hidden first argument that selects the helper.
pub const EXEC_HELPER: &str = "__exec";

/// The helper's expected parent pid (removed before CMD runs).
const PARENT_PID: &str = "LEASEHOLD_PARENT_PID";

/// The `cgroup.procs` file the helper joins (removed before CMD runs).
const CGROUP_PROCS: &str = "LEASEHOLD_CGROUP_PROCS";

/// Runs as the helper: arms the death signal, joins the cgroup and becomes `command`;
/// returns the exit code only when that fails (126 or 127, like `timeout(1)`).
pub fn exec_helper(command: &[OsString]) -> u8 {
    let Some((program, args)) = command.split_first() else {
        say!("{EXEC_HELPER}: no command");
        return exit::FAILURE;
    };
    #[cfg(target_os = "linux")]
    {
        use nix::sys::signal::Signal;
        if let Err(e) = nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL)) {
            say!("cannot set the parent-death signal: {e}");
            return exit::FAILURE;
        }
        let expected = std::env::var(PARENT_PID).ok();
        let parent = nix::unistd::getppid().as_raw().to_string();
        if expected.as_deref() != Some(parent.as_str()) {
            // The reaper is already gone: nothing guards the lease any more.
            return exit::LOST;
        }
        if let Some(procs) = std::env::var_os(CGROUP_PROCS) {
            if let Err(e) = std::fs::write(&procs, "0") {
                say!(
                    "cannot join the command's cgroup ({}): {e}; --cgroup off runs it without one",
                    Path::new(&procs).display()
                );
                return exit::FAILURE;
            }
        }
    }
    let unblock = nix::sys::signal::SigSet::empty();
    if let Err(e) = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&unblock),
        None,
    ) {
        say!("cannot unblock signals for the command: {e}");
        return exit::FAILURE;
    }
    let err = std::process::Command::new(program)
        .args(args)
        .env_remove(PARENT_PID)
        .env_remove(CGROUP_PROCS)
        // The lock service's password is leasehold's, not the command's.
        .env_remove(crate::service::PASSWORD_ENV)
        .exec();
    let shown = program.to_string_lossy();
    match err.kind() {
        std::io::ErrorKind::NotFound => {
            say!("{shown}: command not found");
            exit::NOT_FOUND
        }
        _ => {
            say!("{shown}: cannot execute: {err}");
            exit::NOT_EXECUTABLE
        }
    }
}

/// What the command gets in its environment.
pub struct ChildEnv<'a> {
    /// `LEASEHOLD_KEY`.
    pub key: &'a str,
    /// `LEASEHOLD_FENCE`.
    pub fence: u64,
    /// `LEASEHOLD_HOLDER`: the identity stored with the grant.
    pub holder: &'a str,
    /// `LEASEHOLD_DEADLINE_FILE`.
    pub deadline_file: &'a Path,
}

impl ChildEnv<'_> {
    /// The variables, as pairs for `Command::envs`.
    pub fn vars(&self) -> [(&'static str, OsString); 4] {
        [
            ("LEASEHOLD_KEY", self.key.into()),
            ("LEASEHOLD_FENCE", self.fence.to_string().into()),
            ("LEASEHOLD_HOLDER", self.holder.into()),
            ("LEASEHOLD_DEADLINE_FILE", self.deadline_file.into()),
        ]
    }
}

/// `leasehold __exec COMMAND…`, to be spawned by this process (its pid is the
/// helper's expected parent), in a new process group whose id is the child's pid;
/// `cgroup_procs` is the cgroup it joins.
pub fn helper(
    command: &[OsString],
    cgroup_procs: Option<&Path>,
) -> std::io::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(EXEC_HELPER)
        .args(command)
        .env(PARENT_PID, std::process::id().to_string())
        .process_group(0);
    if let Some(procs) = cgroup_procs {
        cmd.env(CGROUP_PROCS, procs);
    }
    Ok(cmd)
}
