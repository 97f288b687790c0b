//! `LEASEHOLD_DEADLINE_FILE`: the safe deadline, as Unix-epoch milliseconds, for the
//! command to read.
//!
//! The supervisor rewrites it (write to a temporary file, then rename: a reader never
//! sees half a number) after every change of the lease: each confirmed renewal moves
//! it forward; a loss writes `0`. It protects the command when the supervisor cannot:
//! if leasehold is paused (SIGSTOP, a VM stall) it renews nothing and kills nothing,
//! and the file stops moving. A command that checks `now < deadline` before each
//! write stops on time by itself. The value is converted from the monotonic lease
//! clock to the wall clock when it is written, so a wall-clock step between the write
//! and the read shifts it; the fence, checked by the storage, is the guarantee.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The file, removed when dropped.
pub struct DeadlineFile {
    path: PathBuf,
    tmp: PathBuf,
}

impl DeadlineFile {
    /// A new file in `$XDG_RUNTIME_DIR` (else the temp dir), named after this process,
    /// holding `0` until the first deadline is written.
    pub fn create() -> std::io::Result<DeadlineFile> {
        let dir = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let name = format!("leasehold-{}.deadline", std::process::id());
        let file = DeadlineFile {
            path: dir.join(&name),
            tmp: dir.join(format!("{name}.tmp")),
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

impl Drop for DeadlineFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(&self.tmp);
    }
}
