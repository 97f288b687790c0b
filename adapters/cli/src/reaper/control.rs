//! What `run` (the supervisor) and the reaper say to each other: one message per
//! line of ASCII, over two pipes the supervisor creates and the reaper inherits.
//!
//! Pipes rather than a socket: the reaper is handed its ends at spawn, so nobody else
//! can connect, and each side sees the other's death as end-of-file. Instants are
//! nanoseconds on `CLOCK_BOOTTIME` (see [`super::boottime`]), which both processes
//! read alike and which counts a suspend.

use std::path::PathBuf;

use crate::cli::OnStall;
pub use crate::tree::Exit;

/// Supervisor → reaper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToReaper {
    /// The tree may run until this instant (the safe deadline less the kill lead).
    /// The first one starts the command; a later one moves the instant forward, and
    /// thaws a tree frozen at the previous one.
    RunUntil(u64),
    /// SIGKILL the tree at this instant, deadline or not (the lease is ending, or a
    /// second signal asked for it); at once if the tree is frozen.
    KillAt(u64),
    /// Pass this signal to the command's process group.
    Signal(i32),
}

/// Reaper → supervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromReaper {
    /// The command's tree has this cgroup of its own (sent before `Started`).
    Cgroup(PathBuf),
    /// The command runs with this pid (also its process group).
    Started(u32),
    /// The run-until instant passed with no newer one: the reaper stopped the tree
    /// itself, this way.
    Stalled(OnStall),
    /// A newer run-until instant came: the frozen tree runs again.
    Thawed,
    /// The command exited and the rest of its tree is dead and reaped.
    Exited(Exit),
    /// The reaper cannot do its job (the message says why); the command is not
    /// running.
    Failed(String),
}

impl ToReaper {
    /// The line for the pipe.
    pub fn encode(self) -> String {
        match self {
            ToReaper::RunUntil(at) => format!("run-until {at}\n"),
            ToReaper::KillAt(at) => format!("kill-at {at}\n"),
            ToReaper::Signal(n) => format!("signal {n}\n"),
        }
    }

    /// The message on `line` (without its newline), if it is one.
    pub fn parse(line: &str) -> Option<ToReaper> {
        let (word, value) = line.split_once(' ')?;
        match word {
            "run-until" => value.parse().ok().map(ToReaper::RunUntil),
            "kill-at" => value.parse().ok().map(ToReaper::KillAt),
            "signal" => value.parse().ok().map(ToReaper::Signal),
            _ => None,
        }
    }
}

impl FromReaper {
    /// The line for the pipe (a newline in a path or a message becomes a space).
    pub fn encode(&self) -> String {
        let line = match self {
            FromReaper::Cgroup(path) => format!("cgroup {}", path.display()),
            FromReaper::Started(pid) => format!("started {pid}"),
            FromReaper::Stalled(OnStall::Kill) => "stalled kill".to_owned(),
            FromReaper::Stalled(OnStall::Freeze) => "stalled freeze".to_owned(),
            FromReaper::Thawed => "thawed".to_owned(),
            FromReaper::Exited(Exit::Code(code)) => format!("exited code {code}"),
            FromReaper::Exited(Exit::Signal(n)) => format!("exited signal {n}"),
            FromReaper::Exited(Exit::NotStarted) => "exited not-started".to_owned(),
            FromReaper::Failed(why) => format!("failed {why}"),
        };
        format!("{}\n", line.replace('\n', " "))
    }

    /// The message on `line` (without its newline), if it is one.
    pub fn parse(line: &str) -> Option<FromReaper> {
        let (word, value) = line.split_once(' ').unwrap_or((line, ""));
        Some(match (word, value) {
            ("cgroup", path) => FromReaper::Cgroup(PathBuf::from(path)),
            ("started", pid) => FromReaper::Started(pid.parse().ok()?),
            ("stalled", "kill") => FromReaper::Stalled(OnStall::Kill),
            ("stalled", "freeze") => FromReaper::Stalled(OnStall::Freeze),
            ("thawed", "") => FromReaper::Thawed,
            ("exited", "not-started") => FromReaper::Exited(Exit::NotStarted),
            ("exited", how) => {
                let (kind, n) = how.split_once(' ')?;
                let n = n.parse().ok()?;
                match kind {
                    "code" => FromReaper::Exited(Exit::Code(n)),
                    "signal" => FromReaper::Exited(Exit::Signal(n)),
                    _ => return None,
                }
            }
            ("failed", why) => FromReaper::Failed(why.to_owned()),
            _ => return None,
        })
    }
}

/// Bytes read so far, cut into lines.
#[derive(Debug, Default)]
pub struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    /// Adds what was read.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete line, without its newline (lossily decoded).
    pub fn next_line(&mut self) -> Option<String> {
        let end = self.buf.iter().position(|&b| b == b'\n')?;
        let line: Vec<u8> = self.buf.drain(..=end).collect();
        Some(String::from_utf8_lossy(&line[..end]).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_as_itself() {
        for m in [
            ToReaper::RunUntil(u64::MAX),
            ToReaper::KillAt(0),
            ToReaper::Signal(15),
        ] {
            let line = m.encode();
            assert_eq!(ToReaper::parse(line.trim_end_matches('\n')), Some(m));
        }
        for m in [
            FromReaper::Cgroup(PathBuf::from("/sys/fs/cgroup/a b/leasehold-1-ff")),
            FromReaper::Started(4711),
            FromReaper::Stalled(OnStall::Kill),
            FromReaper::Stalled(OnStall::Freeze),
            FromReaper::Thawed,
            FromReaper::Exited(Exit::Code(3)),
            FromReaper::Exited(Exit::Signal(9)),
            FromReaper::Exited(Exit::NotStarted),
            FromReaper::Failed("no timerfd: ENOSYS".into()),
        ] {
            let line = m.encode();
            assert_eq!(FromReaper::parse(line.trim_end_matches('\n')), Some(m));
        }
        assert_eq!(ToReaper::parse("run-until soon"), None);
        assert_eq!(FromReaper::parse("exited code x"), None);
    }

    #[test]
    fn lines_come_out_whole() {
        let mut lines = Lines::default();
        lines.push(b"started 1\nexi");
        assert_eq!(lines.next_line().as_deref(), Some("started 1"));
        assert_eq!(lines.next_line(), None);
        lines.push(b"ted code 0\n");
        assert_eq!(lines.next_line().as_deref(), Some("exited code 0"));
    }
}
