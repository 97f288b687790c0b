//! Scratch directories for server data and logs.

use std::path::{Path, PathBuf};

/// A temporary directory, removed when dropped — unless the thread is panicking, in
/// which case it is kept and its path printed, so a failed test leaves its server
/// logs behind for reading.
#[derive(Debug)]
pub struct ScratchDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl ScratchDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!("test data and logs kept in {}", kept.display());
            }
        }
    }
}

/// A fresh directory in the system's temp dir, named `leasehold-<what>-…`.
///
/// # Panics
///
/// When the temp dir is not writable: the test cannot run.
pub fn scratch_dir(what: &str) -> ScratchDir {
    in_base(&std::env::temp_dir(), what)
}

/// A fresh directory on `/dev/shm` (tmpfs) where it exists and is writable, else in
/// the temp dir.
///
/// For servers that `fsync` on every write (etcd's WAL, Redis with
/// `appendfsync always`): on a disk shared with other builds one `fdatasync` was seen
/// to take 3.8 s, longer than any request timeout in the tests. Data on tmpfs still
/// survives a restart of the server *process*, which is what restart tests need.
pub fn fast_scratch_dir(what: &str) -> ScratchDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = make(shm, what) {
            return wrap(dir);
        }
    }
    scratch_dir(what)
}

fn in_base(base: &Path, what: &str) -> ScratchDir {
    let dir = make(base, what)
        .unwrap_or_else(|e| panic!("cannot create a scratch dir in {}: {e}", base.display()));
    wrap(dir)
}

fn make(base: &Path, what: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("leasehold-{what}-"))
        .tempdir_in(base)
}

fn wrap(dir: tempfile::TempDir) -> ScratchDir {
    let path = dir.path().to_path_buf();
    ScratchDir {
        dir: Some(dir),
        path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_dirs_are_fresh_and_removed_on_drop() {
        let a = scratch_dir("unit");
        let b = fast_scratch_dir("unit");
        assert_ne!(a.path(), b.path());
        assert!(a.path().is_dir() && b.path().is_dir());
        if Path::new("/dev/shm").is_dir() {
            assert!(b.path().starts_with("/dev/shm"), "{}", b.path().display());
        }
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        drop((a, b));
        assert!(!pa.exists() && !pb.exists());
    }
}
