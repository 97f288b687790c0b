//! Finding the server binaries the tests run.

use std::ffi::OsStr;
use std::fmt;
use std::path::PathBuf;

/// A server binary that is not on `PATH`; its message names the Debian package that
/// provides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingBinary {
    /// The binary looked for, e.g. `redis-server`.
    pub name: String,
    /// The Debian package that installs it, e.g. `redis-server`.
    pub package: String,
}

impl fmt::Display for MissingBinary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` not found on PATH: these tests run a real server, they never mock or \
             skip it. Install the Debian package `{}` (apt-get install {}; \
             scripts/setup.sh does it).",
            self.name, self.package, self.package
        )
    }
}

impl std::error::Error for MissingBinary {}

/// The binary `name` on `PATH`, or which Debian `package` to install.
pub fn binary(name: &str, package: &str) -> Result<PathBuf, MissingBinary> {
    binary_in(name, package, std::env::var_os("PATH").unwrap_or_default())
}

/// [`binary`], searching the directories of `path` (a `PATH`-style list) instead.
pub fn binary_in(
    name: &str,
    package: &str,
    path: impl AsRef<OsStr>,
) -> Result<PathBuf, MissingBinary> {
    let cwd = std::env::current_dir().unwrap_or_default();
    which::which_in(name, Some(path), cwd).map_err(|_| MissingBinary {
        name: name.to_owned(),
        package: package.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installed_servers_are_found() {
        for (name, package) in [("redis-server", "redis-server"), ("etcd", "etcd-server")] {
            let path = binary(name, package).unwrap_or_else(|e| panic!("{e}"));
            assert!(path.is_file(), "{}", path.display());
        }
    }

    #[test]
    fn a_missing_binary_names_its_package() {
        let empty = tempfile::tempdir().unwrap();
        let err = binary_in("etcd", "etcd-server", empty.path()).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("`etcd` not found"), "{message}");
        assert!(message.contains("apt-get install etcd-server"), "{message}");
    }
}
