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

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Gid, Pid, Uid, User};

use crate::process::{end_and_reap, exited, signal};
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

/// What the log says once the server takes connections (a standby: "… ready to
/// accept read-only connections").
const READY_LINE: &str = "database system is ready to accept";

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
    settings: Vec<(String, String)>,
}

/// Settings a test server starts with besides the throwaway defaults.
#[derive(Clone, Debug, Default)]
pub struct PostgresOptions {
    /// `-c name=value` settings, given after the defaults (`fsync=off`,
    /// `synchronous_commit=off`, …), which they override: e.g.
    /// `("synchronous_commit", "on")` for commits that wait for the WAL write (and
    /// for a synchronous standby, with `synchronous_standby_names`).
    pub settings: Vec<(String, String)>,
    /// `ssl = on` with these files' server certificate, key and CA, and a
    /// `pg_hba.conf` of `hostssl all all 127.0.0.1/32 cert` (a TLS client must present
    /// a certificate signed by the CA, whose common name is the user) next to
    /// `hostnossl … trust` (the test's own plain-text connections, such as
    /// [`PostgresServer::conninfo`]'s).
    pub tls: Option<crate::TlsFiles>,
}

impl PostgresOptions {
    /// These options with `name=value` added.
    pub fn set(mut self, name: &str, value: &str) -> PostgresOptions {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }
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
        PostgresServer::start_with(PostgresOptions::default())
    }

    /// A fresh cluster started with `options`, accepting connections.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(options: PostgresOptions) -> PostgresServer {
        let tls = options.tls.clone();
        let mut server = PostgresServer::unstarted(options);
        server.initdb();
        if let Some(tls) = &tls {
            server.set_up_tls(tls);
        }
        server.first_start();
        server
    }

    /// Copies the TLS files into the cluster's directory (owned by the user the server
    /// runs as; the key readable by it alone, as PostgreSQL demands), turns `ssl` on
    /// and writes the `pg_hba.conf` of [`PostgresOptions::tls`].
    fn set_up_tls(&mut self, tls: &crate::TlsFiles) {
        let dir = self.dir.path().join("tls");
        std::fs::create_dir_all(&dir).expect("create the TLS directory");
        for (from, name) in [
            (&tls.cert, "server.crt"),
            (&tls.key, "server.key"),
            (&tls.ca, "ca.crt"),
        ] {
            let to = dir.join(name);
            std::fs::copy(from, &to).expect("copy a TLS file");
            let only_owner =
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
            std::fs::set_permissions(&to, only_owner).expect("chmod a TLS file");
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&to, Some(uid.as_raw()), Some(gid.as_raw()))
                    .expect("hand a TLS file to postgres");
            }
        }
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(&dir, Some(uid.as_raw()), Some(gid.as_raw()))
                .expect("hand the TLS directory to postgres");
        }
        for (name, file) in [
            ("ssl_cert_file", "server.crt"),
            ("ssl_key_file", "server.key"),
            ("ssl_ca_file", "ca.crt"),
        ] {
            let path = dir.join(file).display().to_string();
            self.settings.push((name.to_owned(), path));
        }
        self.settings.push(("ssl".to_owned(), "on".to_owned()));
        std::fs::write(
            self.data_dir().join("pg_hba.conf"),
            "local all all trust\n\
             hostnossl all all 127.0.0.1/32 trust\n\
             hostssl all all 127.0.0.1/32 cert\n",
        )
        .expect("write pg_hba.conf");
    }

    /// A hot standby of `primary`, streaming from it: `pg_basebackup -R` (which writes
    /// `standby.signal` and `primary_conninfo`) into a directory of its own, then
    /// started on a port of its own with `options` (its `cluster_name` is `standby`,
    /// the name the primary's `synchronous_standby_names` can list). Returns once it
    /// accepts read-only connections.
    ///
    /// # Panics
    ///
    /// When the base backup fails or the standby does not come up within 20 s.
    pub fn standby_of(primary: &PostgresServer, options: PostgresOptions) -> PostgresServer {
        PostgresServer::standby_via(primary.port, options)
    }

    /// [`standby_of`](Self::standby_of) the primary reached at `port` on loopback:
    /// a [`Proxy`](crate::Proxy)'s, so that its replication can be stalled or cut.
    /// Call it from a blocking context (`block_in_place`) when the proxy runs on the
    /// same runtime.
    ///
    /// # Panics
    ///
    /// As [`standby_of`](Self::standby_of).
    pub fn standby_via(port: u16, options: PostgresOptions) -> PostgresServer {
        let mut server = PostgresServer::unstarted(options.set("cluster_name", "standby"));
        let output = server
            .command("pg_basebackup")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args([
                "-U",
                SUPERUSER,
                "-X",
                "stream",
                "-R",
                "--no-sync",
                "-c",
                "fast",
            ])
            .arg("-D")
            .arg(server.data_dir())
            .output()
            .unwrap_or_else(|e| panic!("cannot run pg_basebackup: {e}"));
        assert!(
            output.status.success(),
            "pg_basebackup failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        server.first_start();
        server
    }

    fn unstarted(options: PostgresOptions) -> PostgresServer {
        let bin = bin_dir().unwrap_or_else(|e| panic!("{e}"));
        let run_as = run_as();
        let dir = fast_scratch_dir("postgres");
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid.as_raw()), Some(gid.as_raw()))
                .unwrap_or_else(|e| {
                    panic!("cannot hand {} to postgres: {e}", dir.path().display())
                });
        }
        PostgresServer {
            port: free_port(),
            bin,
            run_as,
            dir,
            child: None,
            settings: options.settings,
        }
    }

    /// Starts the server the first time, on new ports while another process took one.
    fn first_start(&mut self) {
        let server = self;
        for attempt in 1.. {
            match server.spawn_and_wait() {
                Ok(()) => return,
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

    /// `SIGKILL` to the postmaster and every process it started, and reap: a crash.
    /// [`restart`](Self::restart) then runs crash recovery.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let children = children_of(child.id());
            let _ = child.kill();
            for &pid in &children {
                let _ = kill(pid, Signal::SIGKILL);
            }
            let _ = child.wait();
            wait_gone(&children);
        }
    }

    /// `SIGKILL` to every client backend (not the postmaster): PostgreSQL then
    /// ends every session and runs crash recovery without restarting the
    /// postmaster (`pg_postmaster_start_time()` stays; unlogged tables are emptied).
    /// Returns once it accepts connections again.
    ///
    /// # Panics
    ///
    /// When it is not running, has no client backend, or does not recover within
    /// 20 s.
    pub fn crash_backends(&mut self) {
        let pid = self.pid().expect("postgres is running");
        let skip = self.log().len();
        let backends: Vec<Pid> = children_of(pid)
            .into_iter()
            .filter(|p| cmdline(*p).is_some_and(|c| c.contains(&format!("{SUPERUSER} "))))
            .collect();
        assert!(!backends.is_empty(), "no client backend to crash");
        for backend in backends {
            let _ = kill(backend, Signal::SIGKILL);
        }
        if let Err(log) = self.wait_ready(skip) {
            panic!("postgres did not recover from the crash of its backends; log:\n{log}");
        }
    }

    /// `SIGSTOP` to the postmaster and every process it started: the server stops
    /// answering, connections stay open (and new ones are accepted by the kernel,
    /// then wait).
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn pause(&self) {
        let child = self.child.as_ref().expect("postgres is running");
        signal(child, Signal::SIGSTOP, "postgres");
        for pid in children_of(child.id()) {
            let _ = kill(pid, Signal::SIGSTOP);
        }
    }

    /// `SIGCONT` after [`pause`](Self::pause).
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn resume(&self) {
        let child = self.child.as_ref().expect("postgres is running");
        for pid in children_of(child.id()) {
            let _ = kill(pid, Signal::SIGCONT);
        }
        signal(child, Signal::SIGCONT, "postgres");
    }

    /// Promotes a standby (`pg_ctl promote -w`): it ends recovery on a new timeline
    /// and takes writes. Returns once it does.
    ///
    /// # Panics
    ///
    /// When `pg_ctl` fails (not a standby, not running).
    pub fn promote(&self) {
        let output = self
            .command("pg_ctl")
            .args(["promote", "-w", "-t", "20", "-D"])
            .arg(self.data_dir())
            .output()
            .unwrap_or_else(|e| panic!("cannot run pg_ctl: {e}"));
        assert!(
            output.status.success(),
            "pg_ctl promote failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
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
            .args(
                self.settings
                    .iter()
                    .flat_map(|(k, v)| ["-c".to_owned(), format!("{k}={v}")]),
            )
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
    /// it; paused ones are continued first), then `SIGKILL` if that takes more than
    /// 10 s.
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            for pid in children_of(child.id()) {
                let _ = kill(pid, Signal::SIGCONT);
            }
            end_and_reap(child, Signal::SIGQUIT, "postgres");
        }
    }
}

/// Waits until every process of `pids` has exited (gone, or a zombie waiting for
/// init): a restart needs the killed backends' shared memory released, and once the
/// postmaster is dead they are no longer its children.
fn wait_gone(pids: &[Pid]) {
    let give_up = Instant::now() + READY_WITHIN;
    let alive = |pid: &Pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
    };
    while pids.iter().any(alive) && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The processes whose parent is `parent` (from `/proc/*/stat`).
fn children_of(parent: u32) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // "pid (comm) S ppid …": fields after the last ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == parent).then_some(Pid::from_raw(pid))
        })
        .collect()
}

/// A process's command line as shown by `ps` (PostgreSQL rewrites its own: "postgres:
/// postgres postgres 127.0.0.1(…) idle").
fn cmdline(pid: Pid) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// The directory holding `initdb` and `postgres`: on `PATH`, else the newest of
/// Debian's `/usr/lib/postgresql/<version>/bin`.
pub fn bin_dir() -> Result<PathBuf, MissingBinary> {
    let mut search: Vec<PathBuf> =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect();
    search.extend(debian_bin_dirs(Path::new(DEBIAN_ROOT)));
    let path: OsString = std::env::join_paths(search).unwrap_or_default();
    let initdb = binary_in("initdb", PACKAGE, &path)?;
    // A link on `PATH` (`/usr/local/bin/initdb`) leads to the directory that also has
    // the other binaries (`pg_ctl`, `pg_basebackup`).
    let initdb = std::fs::canonicalize(&initdb).unwrap_or(initdb);
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
