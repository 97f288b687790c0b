//! The run's private directory: where the deadline file lives, out of reach of other
//! users and with a name nobody can guess, so that no one can plant a file or a
//! symlink where leasehold will write.
//!
//! It is made with mode 0700 under `$XDG_RUNTIME_DIR` when that is set and usable,
//! else under the temporary directory, named `leasehold-` and 32 random hex digits;
//! `mkdir` fails rather than reuse anything that exists. It is removed when dropped
//! (every exit of `run`), and by the reaper when `run` itself dies (see
//! `reaper`), which learns its path from `run`.

use std::io::Read as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

/// The directory, removed with its contents when dropped.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Makes a fresh directory (see the module docs).
    pub fn create() -> std::io::Result<PrivateDir> {
        let runtime = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute() && d.is_dir());
        let name = format!("leasehold-{}", random_hex()?);
        if let Some(base) = runtime {
            if let Ok(dir) = make(&base.join(&name)) {
                return Ok(dir);
            }
        }
        make(&std::env::temp_dir().join(&name))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn make(path: &Path) -> std::io::Result<PrivateDir> {
    std::fs::DirBuilder::new().mode(0o700).create(path)?;
    Ok(PrivateDir {
        path: path.to_owned(),
    })
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// 128 random bits from the OS, as hex.
pub fn random_hex() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
