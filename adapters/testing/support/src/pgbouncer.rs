//! A real PgBouncer in **transaction mode** in front of a [`PostgresServer`]: every
//! client transaction (every statement in autocommit) may run on another server
//! connection, so anything that keeps session state — advisory locks, temporary
//! tables, `SET`, named prepared statements (PgBouncer 1.18 does not track them) —
//! breaks behind it.
//!
//! Debian's `pgbouncer` puts the binary in `/usr/sbin`. It refuses to run as root, so
//! as root it runs as the `postgres` user, like the server.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::postgres::{PostgresServer, SUPERUSER};
use crate::process::{end_and_reap, exited};
use crate::{binary_in, fast_scratch_dir, free_port, ScratchDir};

/// How long PgBouncer gets to listen.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A PgBouncer of its own on a free loopback port, stopped when dropped.
pub struct PgBouncer {
    port: u16,
    dir: ScratchDir,
    child: Option<Child>,
}

impl PgBouncer {
    /// PgBouncer on a free port, pooling the `postgres` database of `server` in
    /// transaction mode with at most `server_connections` server connections (fewer
    /// than the clients' connections, so that clients share them), trusting
    /// [`SUPERUSER`].
    ///
    /// # Panics
    ///
    /// When `pgbouncer` is not installed (naming the package), or does not listen
    /// within 10 s (with its log).
    pub fn start(server: &PostgresServer, server_connections: u32) -> PgBouncer {
        let path = std::env::join_paths(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .chain([PathBuf::from("/usr/sbin")]),
        )
        .unwrap_or_default();
        let bin = binary_in("pgbouncer", "pgbouncer", &path).unwrap_or_else(|e| panic!("{e}"));
        let dir = fast_scratch_dir("pgbouncer");
        let port = free_port();
        let ini = dir.path().join("pgbouncer.ini");
        let users = dir.path().join("users.txt");
        let log = dir.path().join("pgbouncer.log");
        std::fs::write(&users, format!("\"{SUPERUSER}\" \"\"\n")).expect("write users.txt");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 postgres = host=127.0.0.1 port={upstream} dbname=postgres\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {server_connections}\n\
                 max_client_conn = 500\n\
                 logfile = {log}\n\
                 ignore_startup_parameters = extra_float_digits\n",
                upstream = server.port(),
                users = users.display(),
                log = log.display(),
            ),
        )
        .expect("write pgbouncer.ini");
        let mut cmd = Command::new(bin);
        if nix::unistd::Uid::effective().is_root() {
            let user = nix::unistd::User::from_name(SUPERUSER)
                .ok()
                .flatten()
                .expect("a postgres user to run PgBouncer as (it refuses root)");
            for file in [dir.path().to_path_buf(), ini.clone(), users] {
                let _ = std::os::unix::fs::chown(
                    &file,
                    Some(user.uid.as_raw()),
                    Some(user.gid.as_raw()),
                );
            }
            std::os::unix::process::CommandExt::uid(&mut cmd, user.uid.as_raw());
            std::os::unix::process::CommandExt::gid(&mut cmd, user.gid.as_raw());
        }
        let child = cmd
            .arg(&ini)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn pgbouncer: {e}"));
        let mut bouncer = PgBouncer {
            port,
            dir,
            child: Some(child),
        };
        let give_up = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = bouncer.child.as_mut().and_then(exited) {
                bouncer.child = None;
                panic!("pgbouncer exited ({status}); log:\n{}", bouncer.log());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return bouncer;
            }
            assert!(
                Instant::now() < give_up,
                "pgbouncer does not listen within {READY_WITHIN:?}; log:\n{}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            end_and_reap(child, Signal::SIGINT, "pgbouncer");
        }
    }
}
