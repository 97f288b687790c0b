//! The command's process tree as `run` (the supervisor) sees it: start it, tell it how
//! long it may run, pass signals on, learn how it ended.
//!
//! On Linux this is the reaper (`reaper::Reaper`), a second process that holds the
//! tree and enforces the deadline by itself. Elsewhere it is the command as a direct
//! child (`direct::Direct`): it is stopped only while the supervisor runs, as the
//! deadline is the supervisor's alone there.

use crate::cli::{CgroupMode, OnStall};

#[cfg(target_os = "linux")]
pub use crate::reaper::Reaper as Tree;

#[cfg(not(target_os = "linux"))]
mod direct;
#[cfg(not(target_os = "linux"))]
pub use direct::Direct as Tree;

/// How the tree is guarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `--on-stall`.
    pub on_stall: OnStall,
    /// `--cgroup`.
    pub cgroup: CgroupMode,
    /// `--quiet`, for the reaper's own messages.
    pub quiet: bool,
    /// `-v`, for the reaper's own log.
    pub verbose: u8,
}

/// What happened to the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // Stalled and Thawed: reaper only.
pub enum Report {
    /// The command runs with this pid.
    Started(u32),
    /// The run-until instant passed with no newer one (this process was stalled):
    /// the tree was stopped without it, this way.
    Stalled(OnStall),
    /// A newer instant came while the tree was frozen: it runs again.
    Thawed,
    /// The command exited; the rest of its tree is dead and reaped.
    Exited(Exit),
    /// The tree could not be run or guarded, for this reason; nothing of it is left.
    Failed(String),
}

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // NotStarted: reaper only.
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// It never started: its first instant to run until had passed, or the lease
    /// ended first.
    NotStarted,
}
