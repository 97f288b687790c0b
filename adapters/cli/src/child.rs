//! Starting the command: in its own process group, with a parent-death signal on
//! Linux, through a re-exec of this binary so that no `unsafe` `pre_exec` hook is
//! needed.
//!
//! `leasehold run` spawns `leasehold __exec CMD ARGS…` (this same binary, found with
//! [`std::env::current_exe`]) with `process_group(0)`. That helper asks the kernel for
//! `PR_SET_PDEATHSIG = SIGKILL` (a safe call in `nix`), checks that its parent is
//! still the supervisor that spawned it (the supervisor may have died between the
//! fork and the `prctl`, in which case the signal would never come), and replaces
//! itself with CMD (`execvp`). The death signal survives the `exec`, so CMD is killed
//! the moment the supervisor dies, even by SIGKILL.
//!
//! The kernel sends the death signal when the parent *thread* exits; the supervisor
//! spawns from the main thread of a current-thread runtime, which lives as long as
//! the process.
//!
//! On other Unix systems the helper only `exec`s: no parent-death signal exists, so a
//! SIGKILLed supervisor leaves CMD running; it must stop on its own at the deadline
//! in `LEASEHOLD_DEADLINE_FILE`, and its storage must check `LEASEHOLD_FENCE`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use crate::exit;

/// The hidden first argument that selects the helper.
pub const EXEC_HELPER: &str = "__exec";

/// The supervisor's pid, for the helper's check (removed before CMD runs).
const SUPERVISOR_PID: &str = "LEASEHOLD_SUPERVISOR_PID";

/// Runs as the helper: arms the death signal and becomes `command`; returns the exit
/// code only when that fails (126 or 127, like `timeout(1)`).
pub fn exec_helper(command: &[OsString]) -> u8 {
    let Some((program, args)) = command.split_first() else {
        eprintln!("leasehold: {EXEC_HELPER}: no command");
        return exit::FAILURE;
    };
    #[cfg(target_os = "linux")]
    {
        use nix::sys::signal::Signal;
        if let Err(e) = nix::sys::prctl::set_pdeathsig(Some(Signal::SIGKILL)) {
            eprintln!("leasehold: cannot set the parent-death signal: {e}");
            return exit::FAILURE;
        }
        let expected = std::env::var(SUPERVISOR_PID).ok();
        let parent = nix::unistd::getppid().as_raw().to_string();
        if expected.as_deref() != Some(parent.as_str()) {
            // The supervisor is already gone: nothing guards the lease any more.
            return exit::LOST;
        }
    }
    let err = std::process::Command::new(program)
        .args(args)
        .env_remove(SUPERVISOR_PID)
        .exec();
    let shown = program.to_string_lossy();
    match err.kind() {
        std::io::ErrorKind::NotFound => {
            eprintln!("leasehold: {shown}: command not found");
            exit::NOT_FOUND
        }
        _ => {
            eprintln!("leasehold: {shown}: cannot execute: {err}");
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
    pub deadline_file: &'a std::path::Path,
}

/// Spawns `command` through the helper, in a new process group whose id is the
/// child's pid.
pub fn spawn(command: &[OsString], env: &ChildEnv<'_>) -> std::io::Result<tokio::process::Child> {
    let me = std::env::current_exe()?;
    let mut cmd = tokio::process::Command::new(me);
    cmd.arg(EXEC_HELPER)
        .args(command)
        .env("LEASEHOLD_KEY", env.key)
        .env("LEASEHOLD_FENCE", env.fence.to_string())
        .env("LEASEHOLD_HOLDER", env.holder)
        .env("LEASEHOLD_DEADLINE_FILE", env.deadline_file)
        .env(SUPERVISOR_PID, std::process::id().to_string())
        .process_group(0);
    cmd.spawn()
}

/// Sends `signal` to the process group `pgid` (the child and what it started),
/// ignoring a group that is already gone.
pub fn signal_group(pgid: u32, signal: nix::sys::signal::Signal) {
    let Ok(pgid) = i32::try_from(pgid) else {
        return;
    };
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal);
}
