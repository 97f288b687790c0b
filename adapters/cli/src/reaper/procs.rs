//! The command's tree without a cgroup: found through `/proc`, from the process that
//! is its subreaper (`PR_SET_CHILD_SUBREAPER`), to which every orphan of the tree is
//! re-parented — `setsid` and double-forked descendants included.
//!
//! **Killing** signals only this process's own children, generation by generation:
//! SIGKILL to each child, reap it, and the children it leaves become this process's
//! children for the next round. A child's pid cannot be reused before its parent
//! reaps it, so no signal can reach a stranger that got a dead descendant's pid; and
//! a process with SIGKILL pending cannot fork, so the rounds end. A tree n
//! generations deep takes n rounds (each well under a millisecond here).
//!
//! **Freezing** must reach grandchildren without killing their parents, so it
//! signals every descendant by pid, parents first, rescanning until all are stopped.
//! A stopped parent cannot reap, so a stopped parent's child keeps its pid; the one
//! race left is a descendant that exits between the scan and the signal while its
//! parent (still running, and ignoring SIGCHLD so the kernel reaps for it) has not
//! been stopped yet, and whose pid a new, unrelated process takes within those
//! microseconds: that process would be stopped (and continued on thaw).

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The parent and state letter of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(i32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid …": comm may hold spaces and parentheses.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Every process's (pid, parent, state).
fn all() -> Vec<(i32, i32, char)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| stat(pid).map(|(ppid, state)| (pid, ppid, state)))
        .collect()
}

/// The descendants of `root` with their states, parents before their children.
pub fn descendants(root: i32) -> Vec<(i32, char)> {
    let table = all();
    let mut found: Vec<(i32, char)> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, state) in &table {
            if ppid == parent && pid != root {
                found.push((pid, state));
                frontier.push(pid);
            }
        }
    }
    found
}

/// SIGKILLs and reaps every descendant of this process (see the module docs), calling
/// `reaped` with each child's status. With `any_child`, a final `waitpid(-1)` also
/// confirms that no child is left; without it (the supervisor, whose tokio runtime
/// reaps its own child) only the children seen in `/proc` are waited for.
pub fn kill_descendants(any_child: bool, mut reaped: impl FnMut(Pid, WaitStatus)) {
    let me = std::process::id().cast_signed();
    // A child that /proc does not show (hidepid) is waited for a little, not forever.
    let mut unseen_rounds = 0;
    loop {
        let children: Vec<i32> = all()
            .into_iter()
            .filter(|&(_, ppid, _)| ppid == me)
            .map(|(pid, _, _)| pid)
            .collect();
        if children.is_empty() {
            if !any_child {
                return;
            }
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) if unseen_rounds < 100 => {
                    unseen_rounds += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(status) => {
                    if let Some(pid) = status.pid() {
                        reaped(pid, status);
                    }
                }
            }
            continue;
        }
        for &pid in &children {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        for pid in children {
            loop {
                match waitpid(Pid::from_raw(pid), None) {
                    Err(Errno::EINTR) => continue,
                    Ok(status) => reaped(Pid::from_raw(pid), status),
                    Err(_) => {}
                }
                break;
            }
        }
    }
}

/// SIGSTOPs every descendant of this process, parents first, until a scan finds
/// them all stopped; false if that did not happen within 200 scans.
pub fn stop_descendants() -> bool {
    let me = std::process::id().cast_signed();
    for _ in 0..200 {
        let running: Vec<i32> = descendants(me)
            .into_iter()
            .filter(|&(_, state)| !matches!(state, 'T' | 't' | 'Z' | 'X'))
            .map(|(pid, _)| pid)
            .collect();
        if running.is_empty() {
            return true;
        }
        for pid in running {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        }
        std::thread::yield_now();
    }
    false
}

/// SIGCONTs every descendant of this process, parents first.
pub fn continue_descendants() {
    let me = std::process::id().cast_signed();
    for (pid, _) in descendants(me) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_s_parent_is_read_from_proc() {
        let me = std::process::id().cast_signed();
        let (ppid, _state) = super::stat(me).unwrap();
        assert_eq!(ppid, nix::unistd::getppid().as_raw());
    }
}
