//! A real `redis-server` on a free loopback port.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::{exited, kill_and_reap, signal, stop_and_reap};
use crate::{binary, fast_scratch_dir, free_port, ScratchDir};

/// How long a server gets to answer `PING` after it was started.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// How many times a first start is retried on new ports when another process took
/// the port between [`free_port`] and the server's `bind`.
const PORT_RETRIES: usize = 3;

/// How to run the server. The default: no password, no persistence at all
/// (`--save '' --appendonly no`).
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// `requirepass`: clients must `AUTH` with it.
    pub password: Option<String>,
    /// AOF with `appendfsync always` (the durable setup a lock service needs to keep
    /// fences across restarts).
    pub appendonly: bool,
    /// `--replicaof 127.0.0.1 <port>`; the start waits until the replica has synced.
    pub replica_of: Option<u16>,
    /// `--cluster-enabled yes` (with [`tls`](Self::tls), `--tls-cluster yes`). The
    /// node starts with no slots; assigning them is the test's business
    /// (`CLUSTER ADDSLOTSRANGE 0 16383`).
    pub cluster: bool,
    /// Also listen for TLS on [`RedisServer::tls_port`] with these PEM files.
    pub tls: Option<TlsFiles>,
    /// With [`tls`](Self::tls): `tls-auth-clients yes` (Redis's default), so a TLS
    /// client must present a certificate signed by the CA (mutual TLS).
    pub tls_auth_clients: bool,
    /// Start without marking the data set as new. By default a primary started by
    /// [`RedisServer::start_with`] (not a replica, not a cluster node, not a restart)
    /// gets the epoch marker a leasehold client writes after its quarantine
    /// (`{leasehold}:epoch` = `<run_id> 0`, see `leasehold_redis::lua::ACQUIRE`), as
    /// an operator may for a new deployment: its first grant is then immediate. With
    /// `unmarked`, the first grant waits the client's quarantine, as on a Redis that
    /// lost its data.
    pub unmarked: bool,
}

/// The PEM files of a TLS listener, and of a client it accepts.
///
/// Made by [`TlsFiles::generate`] for each test (nothing that expires is checked in);
/// [`issue`](TlsFiles::issue) makes more certificates from the same CA (another name,
/// an expired one).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The server's certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signed it (and the client's); its key, `ca.key`, is next to it
    /// (for [`issue`](TlsFiles::issue)).
    pub ca: PathBuf,
    /// A client certificate signed by the CA, for mutual TLS. Its common name is
    /// `postgres`, the user a PostgreSQL `cert` line in `pg_hba.conf` maps it to.
    pub client_cert: PathBuf,
    /// Its private key.
    pub client_key: PathBuf,
}

/// The subjectAltName of the server certificates [`TlsFiles::generate`] makes.
pub const LOOPBACK_NAMES: &str = "IP:127.0.0.1,DNS:localhost";

impl TlsFiles {
    /// Makes a private CA, a server certificate for `127.0.0.1` and `localhost` and a
    /// client certificate, both signed by it, in `dir`, with the `openssl` command
    /// (Debian package `openssl`). P-256 keys; valid for a day: for tests.
    pub fn generate(dir: &Path) -> TlsFiles {
        std::fs::create_dir_all(dir).expect("create the certificate directory");
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                "/CN=leasehold test CA",
            ],
        );
        let mut files = TlsFiles {
            cert: PathBuf::new(),
            key: PathBuf::new(),
            ca: dir.join("ca.crt"),
            client_cert: PathBuf::new(),
            client_key: PathBuf::new(),
        };
        (files.cert, files.key) = files.issue("server", "127.0.0.1", Some(LOOPBACK_NAMES), 1);
        (files.client_cert, files.client_key) = files.issue("client", "postgres", None, 1);
        files
    }

    /// A certificate and key signed by this CA, as `<name>.crt` and `<name>.key` next
    /// to it: with common name `cn`; a server certificate for `san` (e.g.
    /// `DNS:elsewhere.invalid`), or a client certificate without one; valid for `days`
    /// days (`-1`: expired since yesterday).
    pub fn issue(&self, name: &str, cn: &str, san: Option<&str>, days: i32) -> (PathBuf, PathBuf) {
        let dir = self.ca.parent().expect("the CA is in a directory");
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        let extensions = match san {
            Some(san) => format!("subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"),
            None => "extendedKeyUsage=clientAuth\n".to_owned(),
        };
        std::fs::write(dir.join(&ext), extensions).expect("write the extensions");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                &days.to_string(),
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
        );
        (dir.join(crt), dir.join(key))
    }
}

/// Runs `openssl args` in `dir`; panics with its error output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let openssl = binary("openssl", "openssl").unwrap_or_else(|e| panic!("{e}"));
    let output = Command::new(openssl)
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A running (or stopped) `redis-server`, killed when dropped.
///
/// Every restart keeps the port and the directory, so clients reconnect to the
/// same URL and an AOF is replayed.
pub struct RedisServer {
    port: u16,
    tls_port: u16,
    options: RedisOptions,
    dir: ScratchDir,
    child: Option<Child>,
}

impl RedisServer {
    /// A server with the default options, answering `PING`.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (naming the package) or does not come up
    /// within 10 s (with its log).
    pub fn start() -> RedisServer {
        RedisServer::start_with(RedisOptions::default())
    }

    /// A server with `options`, answering `PING` (and synced, for a replica).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(options: RedisOptions) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            tls_port: free_port(),
            options,
            dir: fast_scratch_dir("redis"),
            child: None,
        };
        for attempt in 1.. {
            match server.spawn_and_wait() {
                Ok(()) => {
                    let options = &server.options;
                    if !(options.unmarked || options.cluster || options.replica_of.is_some()) {
                        server.mark_data_set_new();
                    }
                    return server;
                }
                Err(log) if attempt < PORT_RETRIES && log.contains("already in use") => {
                    server.port = free_port();
                    server.tls_port = free_port();
                }
                Err(log) => panic!(
                    "redis-server on port {} did not start; log:\n{log}",
                    server.port
                ),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// The plain-text port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, when the server was started with [`RedisOptions::tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.options.tls.as_ref().map(|_| self.tls_port)
    }

    /// `redis://[:password@]127.0.0.1:port`.
    pub fn url(&self) -> String {
        match &self.options.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// Its working directory (AOF, `nodes.conf`, `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process was started and has not been stopped or killed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("redis.log")).unwrap_or_default()
    }

    /// `SIGTERM` and wait for the exit (a clean shutdown: the AOF is flushed); killed
    /// if it takes more than 10 s. Nothing if it is not running.
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_and_reap(child, "redis-server");
        }
    }

    /// `SIGKILL` and reap: a crash, as far as clients can tell. Nothing if it is not
    /// running.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            kill_and_reap(child);
        }
    }

    /// `SIGSTOP`: the server stops answering, its connections stay open.
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn pause(&self) {
        signal(self.running(), Signal::SIGSTOP, "redis-server");
    }

    /// `SIGCONT` after [`pause`](Self::pause).
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn resume(&self) {
        signal(self.running(), Signal::SIGCONT, "redis-server");
    }

    /// Kills the server if it runs, then starts it again on the same port and
    /// directory (an AOF is replayed) and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// When it does not come up within 10 s.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.spawn_and_wait() {
            panic!(
                "redis-server did not restart on port {}; log:\n{log}",
                self.port
            );
        }
    }

    /// One command in the inline protocol over a fresh connection (after `AUTH` when
    /// there is a password); the raw reply, or `None` if the server did not answer
    /// within 500 ms.
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
        let reply = reply.strip_suffix("+OK\r\n").unwrap_or(&reply).to_owned();
        (!reply.is_empty()).then_some(reply)
    }

    /// Writes the epoch marker of a data set that cannot hold a forgotten grant: this
    /// process's `run_id` and a quarantine that ended at 0.
    ///
    /// # Panics
    ///
    /// When the server does not answer.
    pub fn mark_data_set_new(&self) {
        let info = self.inline("INFO server").expect("INFO server");
        let run_id = info
            .lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .expect("INFO server names the run_id")
            .trim();
        let reply = self.inline(&format!("SET {{leasehold}}:epoch \"{run_id} 0\""));
        assert_eq!(
            reply.as_deref(),
            Some("+OK\r\n"),
            "marking the data set new"
        );
    }

    fn running(&self) -> &Child {
        self.child.as_ref().expect("redis-server is not running")
    }

    /// Spawns the server and waits until it is ready; on failure kills it and
    /// returns its log.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let redis = binary("redis-server", "redis-server").unwrap_or_else(|e| panic!("{e}"));
        let mut cmd = Command::new(redis);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--daemonize", "no", "--save", ""])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"]);
        if self.options.appendonly {
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
                .args([
                    "--tls-auth-clients",
                    if self.options.tls_auth_clients {
                        "yes"
                    } else {
                        "no"
                    },
                ]);
        }
        if self.options.cluster {
            // A dead primary is noticed after 1 s, so a replica takes over within
            // a few seconds.
            // Healthy primaries keep serving their slots while another's are
            // uncovered (the default refuses every query in the cluster then).
            cmd.args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", "1000"])
                .args(["--cluster-require-full-coverage", "no"])
                // A replica's first sync starts at once, not after the default 5 s
                // wait for more replicas to share it.
                .args(["--repl-diskless-sync-delay", "0"]);
            if self.options.tls.is_some() {
                // The slot map then names the TLS ports, and the cluster bus is TLS.
                cmd.args(["--tls-cluster", "yes"]);
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn redis-server: {e}"));
        self.child = Some(child);
        self.wait_ready().inspect_err(|_| self.kill())
    }

    /// Waits until the server answers `PING` (and, for a replica, has synced).
    fn wait_ready(&mut self) -> Result<(), String> {
        let give_up = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = self.child.as_mut().and_then(exited) {
                return Err(format!("(exited during startup: {status})\n{}", self.log()));
            }
            if self.inline("PING").is_some_and(|r| r.starts_with("+PONG")) {
                let synced = self.options.replica_of.is_none()
                    || self
                        .inline("INFO replication")
                        .is_some_and(|r| r.contains("master_link_status:up"));
                if synced {
                    return Ok(());
                }
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "(no answer to PING within {READY_WITHIN:?})\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The length of the first complete RESP2 value in `buf`, or `None` while it is
/// incomplete: the reply framing for [`ProxyMode::RewriteReplies`](crate::ProxyMode).
pub fn resp_frame_len(buf: &[u8]) -> Option<usize> {
    fn line(buf: &[u8], at: usize) -> Option<(usize, &[u8])> {
        let rest = buf.get(at..)?;
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        Some((at + end + 2, rest.get(..end)?))
    }
    fn value(buf: &[u8], at: usize) -> Option<usize> {
        let kind = *buf.get(at)?;
        let (next, body) = line(buf, at + 1)?;
        match kind {
            b'+' | b'-' | b':' => Some(next),
            b'$' => {
                let n: i64 = std::str::from_utf8(body).ok()?.parse().ok()?;
                let Ok(n) = usize::try_from(n) else {
                    return Some(next);
                };
                let end = next.checked_add(n)?.checked_add(2)?;
                (buf.len() >= end).then_some(end)
            }
            b'*' => {
                let n: i64 = std::str::from_utf8(body).ok()?.parse().ok()?;
                let mut at = next;
                for _ in 0..n.max(0) {
                    at = value(buf, at)?;
                }
                Some(at)
            }
            _ => None,
        }
    }
    value(buf, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pong(server: &RedisServer) -> bool {
        server
            .inline("PING")
            .is_some_and(|r| r.starts_with("+PONG"))
    }

    fn process_exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn starts_on_a_free_port_and_answers() {
        let a = RedisServer::start();
        let b = RedisServer::start();
        assert_ne!(a.port(), b.port());
        assert!(pong(&a) && pong(&b));
        assert_eq!(a.url(), format!("redis://127.0.0.1:{}", a.port()));
        assert_eq!(a.tls_port(), None);
    }

    #[test]
    fn requirepass_is_enforced() {
        let server = RedisServer::start_with(RedisOptions {
            password: Some("s3cret".into()),
            ..RedisOptions::default()
        });
        assert!(pong(&server), "AUTH first, then PING");
        assert!(server.url().starts_with("redis://:s3cret@127.0.0.1:"));
        let mut raw = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        raw.write_all(b"PING\r\n").unwrap();
        let mut reply = [0u8; 7];
        raw.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"-NOAUTH");
    }

    #[test]
    fn appendonly_data_survives_a_kill_and_restart_on_the_same_port() {
        let mut server = RedisServer::start_with(RedisOptions {
            appendonly: true,
            ..RedisOptions::default()
        });
        let (port, dir) = (server.port(), server.dir().to_path_buf());
        assert_eq!(server.inline("SET fence 41").as_deref(), Some("+OK\r\n"));
        let old = server.pid().unwrap();
        server.restart();
        assert_ne!(server.pid(), Some(old));
        assert!(!process_exists(old), "the old process was reaped");
        assert_eq!((server.port(), server.dir()), (port, dir.as_path()));
        assert_eq!(server.inline("GET fence").as_deref(), Some("$2\r\n41\r\n"));
    }

    #[test]
    fn without_persistence_a_restart_loses_everything() {
        let mut server = RedisServer::start();
        assert_eq!(server.inline("SET k v").as_deref(), Some("+OK\r\n"));
        server.stop();
        assert!(!server.is_running());
        assert!(
            server.inline("PING").is_none(),
            "nothing listens once stopped"
        );
        server.restart();
        assert_eq!(server.inline("GET k").as_deref(), Some("$-1\r\n"));
    }

    #[test]
    fn a_paused_server_is_silent_until_resumed() {
        let server = RedisServer::start();
        server.pause();
        assert!(server.inline("PING").is_none(), "no answer within 500 ms");
        server.resume();
        assert!(pong(&server));
    }

    #[test]
    fn a_replica_starts_synced() {
        let primary = RedisServer::start();
        assert_eq!(primary.inline("SET k v").as_deref(), Some("+OK\r\n"));
        let replica = RedisServer::start_with(RedisOptions {
            replica_of: Some(primary.port()),
            ..RedisOptions::default()
        });
        assert_eq!(replica.inline("GET k").as_deref(), Some("$1\r\nv\r\n"));
    }

    #[test]
    fn drop_kills_the_process_even_when_paused() {
        let server = RedisServer::start();
        let pid = server.pid().unwrap();
        server.pause();
        drop(server);
        assert!(!process_exists(pid));
    }

    #[tokio::test]
    async fn through_the_proxy_a_real_server_stalls_resumes_is_cut_and_answers_garbage() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        async fn ask(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<Vec<u8>> {
            stream.write_all(b"PING\r\n").await.ok()?;
            let mut reply = [0u8; 64];
            let n = tokio::time::timeout(within, stream.read(&mut reply))
                .await
                .ok()?
                .ok()?;
            reply.get(..n).map(<[u8]>::to_vec)
        }
        let server = RedisServer::start();
        let proxy = crate::Proxy::start(server.port()).await;
        let mut client = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
        let long = Duration::from_secs(5);
        assert_eq!(
            ask(&mut client, long).await.as_deref(),
            Some(&b"+PONG\r\n"[..])
        );
        proxy.stall();
        assert_eq!(ask(&mut client, Duration::from_millis(300)).await, None);
        proxy.resume();
        let mut reply = [0u8; 7];
        tokio::time::timeout(long, client.read_exact(&mut reply))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            &reply, b"+PONG\r\n",
            "the stalled PING is answered on resume"
        );
        proxy.set_mode(crate::ProxyMode::RewriteReplies {
            reply: b"-GARBAGE\r\n".to_vec(),
            frame: resp_frame_len,
        });
        assert_eq!(
            ask(&mut client, long).await.as_deref(),
            Some(&b"-GARBAGE\r\n"[..])
        );
        proxy.cut();
        assert_eq!(
            ask(&mut client, long).await.unwrap_or_default(),
            b"",
            "cut: EOF"
        );
    }

    #[test]
    fn resp_frames() {
        assert_eq!(resp_frame_len(b"+OK\r\n"), Some(5));
        assert_eq!(resp_frame_len(b":12\r\n+OK"), Some(5));
        assert_eq!(resp_frame_len(b"$3\r\nabc\r\n"), Some(9));
        assert_eq!(resp_frame_len(b"$3\r\nab"), None);
        assert_eq!(resp_frame_len(b"$-1\r\n"), Some(5));
        assert_eq!(resp_frame_len(b"*2\r\n:1\r\n$1\r\nx\r\n"), Some(15));
        assert_eq!(resp_frame_len(b"*2\r\n:1\r\n"), None);
        assert_eq!(resp_frame_len(b""), None);
    }
}
