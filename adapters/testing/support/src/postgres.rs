//! A real PostgreSQL cluster on a free loopback port: `initdb` in a scratch directory,
//! then `postgres` listening on `127.0.0.1` with its socket in that directory.
//!
//! Debian's `postgresql` package puts `initdb` and `postgres` in
//! `/usr/lib/postgresql/<version>/bin`, which is not on `PATH`; they are looked for on
//! `PATH` first, then there (the newest version). PostgreSQL refuses to run as root,
//! so when the tests run as root the cluster runs as the `postgres` system user (which
//! the package creates) and the scratch directory is handed to it.

use std::ffi::OsString;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};

use crate::process::{end_and_reap, exited};
use crate::{binary_in, fast_scratch_dir, free_port, MissingBinary, ScratchDir};

/// How long `postgres` gets to accept connections after it was started.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// How many times a first start is retried on new ports when another process took
/// the port between [`free_port`] and the server's `bind`.
const PORT_RETRIES: usize = 3;

/// The Debian package that provides the binaries.
const PACKAGE: &str = "postgresql";

/// Where Debian installs the server binaries, one directory per major version.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// What the log says once the server takes connections.
const READY_LINE: &str = "database system is ready to accept connections";

/// The superuser `initdb` creates; trusted on loopback and the socket (no password).
pub const SUPERUSER: &str = "postgres";

/// A running (or stopped) PostgreSQL cluster of its own, killed when dropped.
///
/// The cluster is throwaway: `fsync` is off (a restart of the *process* keeps the
/// data, a crash of the machine need not), authentication is `trust` for
/// [`SUPERUSER`], and the only database is `postgres`.
pub struct PostgresServer {
    port: u16,
    bin: PathBuf,
    run_as: Option<(Uid, Gid)>,
    dir: ScratchDir,
    child: Option<Child>,
}

impl PostgresServer {
    /// A fresh cluster, accepting connections.
    ///
    /// # Panics
    ///
    /// When the binaries are not installed (naming the package), when running as
    /// root and there is no `postgres` user, or when the server does not come up
    /// within 20 s (with its log).
    pub fn start() -> PostgresServer {
        let bin = bin_dir().unwrap_or_else(|e| panic!("{e}"));
        let run_as = run_as();
        let dir = fast_scratch_dir("postgres");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid.as_raw()), Some(gid.as_raw()))
                .unwrap_or_else(|e| {
                    panic!("cannot hand {} to postgres: {e}", dir.path().display())
                });
        }
        let mut server = PostgresServer {
            port: free_port(),
            bin,
            run_as,
            dir,
            child: None,
        };
        server.initdb();
        for attempt in 1.. {
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(log) if attempt < PORT_RETRIES && log.contains("Address already in use") => {
                    server.port = free_port();
                }
                Err(log) => panic!(
                    "postgres on port {} did not start; log:\n{log}",
                    server.port
                ),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// The TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq / `tokio-postgres` connection string:
    /// `host=127.0.0.1 port=… user=postgres dbname=postgres`.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={SUPERUSER} dbname=postgres",
            self.port
        )
    }

    /// The directory holding the Unix socket (`.s.PGSQL.<port>`), the data directory
    /// `data/` and the log `postgres.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The directory of the binaries in use (`initdb`, `postgres`).
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// The process id of the postmaster, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server was started and has not been stopped or killed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// A fast shutdown (`SIGINT`: clients are disconnected, the data is written out)
    /// and wait for it; killed if it takes more than 10 s. Nothing if not running.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            end_and_reap(child, Signal::SIGINT, "postgres");
        }
    }

    /// Stops the server if it runs, then starts it again on the same port and data
    /// directory and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When it does not come up within 20 s.
    pub fn restart(&mut self) {
        self.stop();
        if let Err(log) = self.spawn_and_wait() {
            panic!(
                "postgres did not restart on port {}; log:\n{log}",
                self.port
            );
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// A command for binary `name` of the cluster, as the user the cluster runs as.
    fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        if let Some((uid, gid)) = self.run_as {
            // std drops the supplementary groups too when root changes its uid.
            std::os::unix::process::CommandExt::uid(&mut cmd, uid.as_raw());
            std::os::unix::process::CommandExt::gid(&mut cmd, gid.as_raw());
        }
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    /// `initdb`: a cluster with a trusted superuser, no `fsync` while it is made.
    fn initdb(&self) {
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "--auth=trust", "--encoding=UTF8"])
            .args(["--locale=C", "--no-sync", "--no-instructions"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb: {e}"));
        assert!(
            output.status.success(),
            "initdb failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Spawns the server and waits until it is ready; on failure kills it and
    /// returns its log.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("cannot open the postgres log: {e}"));
        let stderr = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot share the postgres log: {e}"));
        let skip = self.log().len();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off", "-c", "shared_buffers=16MB"])
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn postgres: {e}"));
        self.child = Some(child);
        self.wait_ready(skip).inspect_err(|_| {
            if let Some(child) = self.child.take() {
                end_and_reap(child, Signal::SIGQUIT, "postgres");
            }
        })
    }

    /// Waits until this start's log says the server is ready and the port accepts a
    /// connection.
    fn wait_ready(&mut self, skip: usize) -> Result<(), String> {
        let give_up = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = self.child.as_mut().and_then(exited) {
                self.child = None;
                return Err(format!("(exited during startup: {status})\n{}", self.log()));
            }
            let ready = self
                .log()
                .get(skip..)
                .is_some_and(|l| l.contains(READY_LINE));
            if ready && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "(not accepting connections within {READY_WITHIN:?})\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PostgresServer {
    /// An immediate shutdown (`SIGQUIT`: the postmaster takes its backends down with
    /// it), then `SIGKILL` if that takes more than 10 s.
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            end_and_reap(child, Signal::SIGQUIT, "postgres");
        }
    }
}

/// The directory holding `initdb` and `postgres`: on `PATH`, else the newest of
/// Debian's `/usr/lib/postgresql/<version>/bin`.
pub fn bin_dir() -> Result<PathBuf, MissingBinary> {
    let mut search: Vec<PathBuf> =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect();
    search.extend(debian_bin_dirs(Path::new(DEBIAN_ROOT)));
    let path: OsString = std::env::join_paths(search).unwrap_or_default();
    let initdb = binary_in("initdb", PACKAGE, &path)?;
    let dir = initdb.parent().map(Path::to_path_buf).unwrap_or_default();
    // `postgres` must be the one next to `initdb`: the same version.
    binary_in("postgres", PACKAGE, dir.as_os_str())?;
    Ok(dir)
}

/// `<root>/<version>/bin` for every numeric version under `root`, newest first.
fn debian_bin_dirs(root: &Path) -> Vec<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort_by_key(|v| std::cmp::Reverse(v.0));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

/// The `postgres` user's ids when running as root (PostgreSQL refuses root), else
/// `None`: run as ourselves.
///
/// # Panics
///
/// As root, when there is no `postgres` user.
fn run_as() -> Option<(Uid, Gid)> {
    if !Uid::effective().is_root() {
        return None;
    }
    match User::from_name(SUPERUSER) {
        Ok(Some(user)) => Some((user.uid, user.gid)),
        _ => panic!(
            "running as root and there is no `postgres` user to run PostgreSQL as (it \
             refuses root): install the Debian package `{PACKAGE}`, which creates it"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_versions_are_found_newest_first() {
        let root = crate::scratch_dir("pg-root");
        for v in ["13", "15", "9", "notes"] {
            std::fs::create_dir_all(root.path().join(v).join("bin")).unwrap();
        }
        let dirs = debian_bin_dirs(root.path());
        let names: Vec<_> = dirs
            .iter()
            .map(|d| d.parent().unwrap().file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, ["15", "13", "9"]);
        assert!(debian_bin_dirs(&root.path().join("absent")).is_empty());
    }

    #[test]
    fn starts_accepts_connections_restarts_and_is_gone_after_drop() {
        let mut a = PostgresServer::start();
        let b = PostgresServer::start();
        assert_ne!(a.port(), b.port());
        assert!(a.bin_dir().join("initdb").is_file());
        assert!(a.conninfo().contains(&format!("port={}", a.port())));
        assert!(a.dir().join(format!(".s.PGSQL.{}", a.port())).exists());
        let old = a.pid().unwrap();
        a.restart();
        assert_ne!(a.pid(), Some(old));
        TcpStream::connect(("127.0.0.1", a.port())).expect("accepts after restart");
        a.stop();
        assert!(!a.is_running());
        assert!(TcpStream::connect(("127.0.0.1", a.port())).is_err());
        let pid = b.pid().unwrap();
        drop(b);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "reaped");
    }
}
