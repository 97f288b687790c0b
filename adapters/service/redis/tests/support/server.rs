//! A real `redis-server`, started by the test on a free loopback port and stopped by
//! pid when dropped. A missing binary fails the test (never skips it).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How to run the server.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// AOF with `appendfsync always` (the durable setup); otherwise no persistence
    /// at all (`--save '' --appendonly no`).
    pub aof: bool,
    /// `requirepass`.
    pub password: Option<String>,
    /// `--replicaof 127.0.0.1 <port>`.
    pub replica_of: Option<u16>,
    /// `--cluster-enabled yes`, serving every slot itself.
    pub cluster: bool,
    /// Also listen for TLS with this certificate, key and CA (PEM files).
    pub tls: Option<TlsFiles>,
}

#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

pub struct RedisServer {
    pub port: u16,
    /// The TLS port, when `options.tls` is set.
    pub tls_port: u16,
    pub options: ServerOptions,
    dir: PathBuf,
    child: Option<Child>,
}

/// The `redis-server` binary on PATH, or a failure that names the package.
pub fn binary(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` not found on PATH: the Redis tests need a real server. Install the \
             Debian package `redis-server` (apt-get install redis-server; scripts/setup.sh \
             does it)."
        )
    })
}

/// A port nobody listens on right now: bind port 0, read it, let it go.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

fn scratch_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-redis-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(ServerOptions::default())
    }

    pub fn start_with(options: ServerOptions) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            tls_port: free_port(),
            options,
            dir: scratch_dir(),
            child: None,
        };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        match &self.options.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(binary("redis-server"));
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", ""])
            .args(["--logfile", "redis.log"]);
        if self.options.aof {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        if let Some(pw) = &self.options.password {
            cmd.args(["--requirepass", pw]);
        }
        if let Some(primary) = self.options.replica_of {
            cmd.args(["--replicaof", "127.0.0.1"])
                .arg(primary.to_string());
        }
        if let Some(tls) = &self.options.tls {
            cmd.arg("--tls-port")
                .arg(self.tls_port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args(["--tls-auth-clients", "no"]);
        }
        if self.options.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits until the server answers PING (and, for a replica, has synced).
    fn wait_ready(&mut self) {
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "redis-server exited during startup ({status}); log:\n{}",
                    self.log()
                );
            }
            if self.inline("PING").is_some_and(|r| r.starts_with("+PONG")) {
                let synced = self.options.replica_of.is_none()
                    || self
                        .inline("INFO replication")
                        .is_some_and(|r| r.contains("master_link_status:up"));
                if synced {
                    return;
                }
            }
            assert!(
                Instant::now() < give_up,
                "redis-server on port {} did not answer PING within 10 s; log:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// One inline command over a fresh socket (AUTH first if needed); the raw reply.
    pub fn inline(&self, command: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let mut request = String::new();
        if let Some(pw) = &self.options.password {
            request.push_str(&format!("AUTH {pw}\r\n"));
        }
        request.push_str(command);
        request.push_str("\r\nQUIT\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        let reply = match &self.options.password {
            Some(_) => reply.strip_prefix("+OK\r\n")?.to_owned(),
            None => reply,
        };
        Some(reply)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// SIGKILL, by pid, and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and directory (the AOF, if any, is replayed).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP / SIGCONT the server process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.pid().expect("running") as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .expect("signal redis-server");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
