//! The command's own cgroup (v2): the one handle on every process of its tree, wherever
//! they went (`setsid`, a double fork), which `cgroup.kill` kills and `cgroup.freeze`
//! freezes in one step, with no race against forks or pid reuse.
//!
//! Nothing about the machine is assumed. The cgroup2 mount is looked up in
//! `/proc/self/mountinfo` (`/sys/fs/cgroup` on most machines, `/sys/fs/cgroup/unified`
//! beside v1 controllers), this process's place in it in `/proc/self/cgroup` (the
//! `0::` line), and a child `leasehold-<pid>-<random>` is made there. Any failure —
//! no cgroup2, read-only, not permitted, no `cgroup.kill` (Linux < 5.14) — means no
//! cgroup; the reaper then finds the tree through `/proc` (see [`super::procs`]).
//!
//! `LEASEHOLD_CGROUP_ROOT` names the directory to make it in instead (a delegated
//! subtree, or a test that needs creation to fail).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A cgroup this process made; removed by [`remove`](Cgroup::remove).
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// Makes the cgroup and proves that a process can be moved into it (this process
    /// moves in and back out: the helper's later move needs the same permissions).
    /// The error says why there is none.
    pub fn create() -> Result<Cgroup, String> {
        let parent = parent_dir()?;
        let name = format!(
            "leasehold-{}-{}",
            std::process::id(),
            crate::private_dir::random_hex().map_err(|e| format!("no random name: {e}"))?
        );
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let cgroup = Cgroup { dir };
        if !cgroup.dir.join("cgroup.kill").exists() {
            cgroup.remove();
            return Err("no cgroup.kill (Linux 5.14 or later has it)".to_owned());
        }
        if let Err(e) = std::fs::write(cgroup.procs(), "0") {
            cgroup.remove();
            return Err(format!("cannot move a process into it: {e}"));
        }
        if let Err(e) = std::fs::write(parent.join("cgroup.procs"), "0") {
            // Stuck inside: the command will be too, but `cgroup.kill` would kill the
            // reaper with it, so the cgroup is not used (nor removable).
            return Err(format!(
                "cannot move back out of {}: {e}",
                cgroup.dir.display()
            ));
        }
        Ok(cgroup)
    }

    /// A cgroup made by another process (the reaper's, for the supervisor's second
    /// line).
    pub fn at(dir: PathBuf) -> Cgroup {
        Cgroup { dir }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs`: a process that writes `0` there joins it.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// SIGKILL to every process in it (they die without further notice; reap them).
    pub fn kill(&self) -> std::io::Result<()> {
        std::fs::write(self.dir.join("cgroup.kill"), "1")
    }

    /// Freezes every process in it and waits (at most `bound`) until the kernel says
    /// they all are; false if it cannot (no `cgroup.freeze`, or not frozen in time:
    /// a process in uninterruptible sleep, for one).
    pub fn freeze(&self, bound: Duration) -> bool {
        if std::fs::write(self.dir.join("cgroup.freeze"), "1").is_err() {
            return false;
        }
        let give_up = Instant::now() + bound;
        loop {
            if self.frozen() {
                return true;
            }
            if Instant::now() >= give_up {
                return false;
            }
            // The kernel stops each task at its next return to user space: well
            // under a millisecond for a task that is running or asleep.
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Lets a frozen cgroup run again.
    pub fn thaw(&self) {
        let _ = std::fs::write(self.dir.join("cgroup.freeze"), "0");
    }

    fn frozen(&self) -> bool {
        let mut events = String::new();
        std::fs::File::open(self.dir.join("cgroup.events"))
            .and_then(|mut f| f.read_to_string(&mut events))
            .is_ok()
            && events.lines().any(|l| l == "frozen 1")
    }

    /// Removes it, once its processes are reaped (the kernel may take a moment to
    /// see the last one leave: tried for up to 100 ms).
    pub fn remove(&self) {
        let give_up = Instant::now() + Duration::from_millis(100);
        while let Err(e) = std::fs::remove_dir(&self.dir) {
            if e.kind() == std::io::ErrorKind::NotFound || Instant::now() >= give_up {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::debug!("cannot remove {}: {e}", self.dir.display());
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Where to make the cgroup: `$LEASEHOLD_CGROUP_ROOT`, else this process's own cgroup
/// v2 directory.
fn parent_dir() -> Result<PathBuf, String> {
    if let Some(root) = std::env::var_os("LEASEHOLD_CGROUP_ROOT") {
        return Ok(PathBuf::from(root));
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let (root, mount) = cgroup2_mount(&mountinfo).ok_or("no cgroup2 file system is mounted")?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("this process has no cgroup v2 (no 0:: line in /proc/self/cgroup)")?;
    let relative = path
        .strip_prefix(root.as_str())
        .ok_or_else(|| format!("cgroup {path} is outside the mount's root {root}"))?;
    Ok(mount.join(relative.trim_start_matches('/')))
}

/// The root and mount point of the first cgroup2 mount in `mountinfo`.
fn cgroup2_mount(mountinfo: &str) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let (fields, after) = line.split_once(" - ")?;
        if after.split(' ').next()? != "cgroup2" {
            return None;
        }
        let mut fields = fields.split(' ');
        let root = unescape(fields.nth(3)?);
        let mount = unescape(fields.next()?);
        Some((root, PathBuf::from(mount)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_beside_v1_controllers() {
        let info = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                    37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(info),
            Some(("/".to_owned(), PathBuf::from("/sys/fs/cgroup/unified")))
        );
        let spaced = "41 31 0:38 /a /mnt/c\\040g rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(spaced),
            Some(("/a".to_owned(), PathBuf::from("/mnt/c g")))
        );
        assert_eq!(
            cgroup2_mount("37 31 0:34 / /x rw - cgroup cgroup rw\n"),
            None
        );
    }
}
