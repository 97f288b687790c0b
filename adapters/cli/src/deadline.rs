//! `LEASEHOLD_DEADLINE_FILE`: the safe deadline, as Unix-epoch milliseconds, for the
//! command to read.
//!
//! It lives in the run's private directory ([`crate::private_dir`]). The supervisor
//! rewrites it (write to a temporary file, then rename: a reader never
//! sees half a number) after every change of the lease: each confirmed renewal moves
//! it forward; a loss writes `0`. It protects the command when the supervisor cannot:
//! if leasehold is paused (SIGSTOP, a VM stall) it renews nothing and kills nothing,
//! and the file stops moving. A command that checks `now < deadline` before each
//! write stops on time by itself. The value is converted from the monotonic lease
//! clock to the wall clock when it is written, so a wall-clock step between the write
//! and the read shifts it; the fence, checked by the storage, is the guarantee.
//! (On Linux the reaper stops the command at the deadline by itself; the file is for
//! commands that want to stop earlier, and for systems without the reaper.)

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The file (removed with its directory).
pub struct DeadlineFile {
    path: PathBuf,
    tmp: PathBuf,
}

impl DeadlineFile {
    /// A new file `deadline` in `dir` (the run's private directory), holding `0`
    /// until the first deadline is written.
    pub fn create(dir: &Path) -> std::io::Result<DeadlineFile> {
        let file = DeadlineFile {
            path: dir.join("deadline"),
            tmp: dir.join("deadline.tmp"),
        };
        file.write_epoch_ms(0)?;
        Ok(file)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `deadline` (on the monotonic clock) as wall-clock ms (`None` or passed:
    /// `0`). The wall clock is read first: a pause between the two readings (a
    /// SIGSTOP, a busy machine) then moves the written deadline earlier, never later.
    pub fn write_deadline(&self, deadline: Option<tokio::time::Instant>) -> std::io::Result<()> {
        let wall = SystemTime::now();
        let remaining =
            deadline.and_then(|d| d.checked_duration_since(tokio::time::Instant::now()));
        let epoch_ms = remaining
            .and_then(|r| wall.checked_add(r))
            .and_then(|at| at.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.write_epoch_ms(epoch_ms)
    }

    fn write_epoch_ms(&self, epoch_ms: u64) -> std::io::Result<()> {
        std::fs::write(&self.tmp, format!("{epoch_ms}\n"))?;
        std::fs::rename(&self.tmp, &self.path)
    }
}
