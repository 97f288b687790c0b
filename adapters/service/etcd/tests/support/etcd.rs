//! Real `etcd` processes, started by the test on free loopback ports (a client and a
//! peer port per member, a fresh data directory each) and killed by pid when dropped.
//! A missing binary fails the test, naming the Debian package; it never skips.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Raft timing of a test cluster. etcd's minimum lease TTL is
/// `ceil(1.5 × election timeout)` in whole seconds, so short timings keep leases short.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_ms: u64,
}

impl Timing {
    /// Minimum lease TTL 1 s (1.5 × 300 ms, rounded up). Elections are not so short
    /// that a loaded 2-core machine triggers spurious ones.
    pub const FAST: Timing = Timing {
        heartbeat_ms: 30,
        election_ms: 300,
    };
    /// Minimum lease TTL 3 s (1.5 × 2,000 ms): to see etcd raise a requested TTL.
    pub const SLOW: Timing = Timing {
        heartbeat_ms: 100,
        election_ms: 2_000,
    };

    /// etcd's minimum lease TTL for this timing, in seconds.
    pub fn min_ttl_secs(&self) -> u64 {
        let ticks = self.election_ms / self.heartbeat_ms;
        (3 * ticks / 2 * self.heartbeat_ms).div_ceil(1_000)
    }
}

pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    child: Option<Child>,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    fn log_path(&self) -> PathBuf {
        self.data_dir.with_extension("log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

pub struct Cluster {
    pub members: Vec<Member>,
    pub timing: Timing,
    dir: PathBuf,
    token: String,
}

/// The `etcd` binary on PATH, or a failure that names the package.
pub fn binary() -> PathBuf {
    find_binary(std::env::var_os("PATH"))
}

/// `etcd` in the directories of `path` (a `PATH`-style list); panics naming the
/// Debian package if it is in none of them.
pub fn find_binary(path: Option<std::ffi::OsString>) -> PathBuf {
    let found = path.and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("etcd"))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "`etcd` not found on PATH: the etcd tests need a real server. Install the Debian \
             package `etcd-server` (apt-get install etcd-server; scripts/setup.sh does it)."
        )
    })
}

/// A loopback port nobody listens on right now, never handed out twice in this process.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind a loopback port")
            .port();
        let mut given = GIVEN.lock().unwrap();
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// A fresh directory for one cluster's data and logs: on `/dev/shm` (tmpfs) when there
/// is one, else in the temp dir. etcd fsyncs its WAL on every write; on a shared disk
/// a single `fdatasync` was seen to take 3.8 s, longer than any request timeout here.
/// Data on tmpfs still survives an etcd *process* restart, which is what the restart
/// tests need.
fn scratch_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() && tempfile_ok(shm) {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!(
        "leasehold-etcd-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Whether a directory can be created in `base`.
fn tempfile_ok(base: &Path) -> bool {
    let probe = base.join(format!("leasehold-etcd-probe-{}", std::process::id()));
    let ok = std::fs::create_dir_all(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    ok
}

impl Cluster {
    /// One member, fast timing.
    pub fn single() -> Cluster {
        Cluster::start(1, Timing::FAST)
    }

    /// `size` members on loopback, all started, each answering `/health`.
    pub fn start(size: usize, timing: Timing) -> Cluster {
        let dir = scratch_dir();
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.join(format!("m{i}")),
                child: None,
            })
            .collect();
        let mut cluster = Cluster {
            members,
            timing,
            token: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            dir,
        };
        for i in 0..size {
            cluster.spawn(i);
        }
        for i in 0..size {
            cluster.wait_healthy(i);
        }
        cluster
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every member's client URL (the stopped ones too).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].endpoint()
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) {
        let initial_cluster = self.initial_cluster();
        let timing = self.timing;
        let token = self.token.clone();
        let member = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(member.log_path())
            .expect("etcd log file");
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new(binary())
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &token])
            .arg(format!("--heartbeat-interval={}", timing.heartbeat_ms))
            .arg(format!("--election-timeout={}", timing.election_ms))
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        member.child = Some(child);
    }

    /// Waits until member `i` answers `GET /health` with `"health":"true"` (it has a
    /// leader and serves reads).
    pub fn wait_healthy(&mut self, i: usize) {
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            let member = &mut self.members[i];
            if let Some(status) = member
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "etcd {} exited during startup ({status}); log:\n{}",
                    member.name,
                    member.log()
                );
            }
            if health(member.client_port).is_some_and(|body| body.contains("\"health\":\"true\"")) {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "etcd {} on port {} not healthy within 20 s; log:\n{}",
                member.name,
                member.client_port,
                member.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL member `i`, by pid, and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its ports and data directory (its WAL and database
    /// are replayed) without waiting for it.
    pub fn start_member(&mut self, i: usize) {
        assert!(!self.members[i].running(), "member {i} is running");
        self.spawn(i);
    }

    /// Kill, start again, wait until healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.start_member(i);
        self.wait_healthy(i);
    }

    /// A plain etcd client on every member (for "outside" actions and inspection).
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect(
            self.endpoints(),
            Some(
                etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(1))
                    .with_timeout(Duration::from_secs(5)),
            ),
        )
        .await
        .expect("outside client")
    }

    /// A plain client on member `i` only.
    pub async fn client_of(&self, i: usize) -> etcd_client::Client {
        etcd_client::Client::connect(
            [self.endpoint(i)],
            Some(
                etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(1))
                    .with_timeout(Duration::from_secs(2)),
            ),
        )
        .await
        .expect("member client")
    }

    /// The index of the member that is leader, as every running member agrees; waits
    /// (up to `limit`) for an election to settle.
    pub async fn leader(&self, limit: Duration) -> usize {
        let give_up = tokio::time::Instant::now() + limit;
        loop {
            let mut seen = Vec::new();
            for (i, member) in self.members.iter().enumerate() {
                if !member.running() {
                    continue;
                }
                let mut client = self.client_of(i).await;
                if let Ok(status) = client.status().await {
                    let id = status.header().map_or(0, |h| h.member_id());
                    seen.push((i, id, status.leader()));
                }
            }
            let leader_id = seen.first().map(|s| s.2).unwrap_or(0);
            let running = self.members.iter().filter(|m| m.running()).count();
            if leader_id != 0 && seen.len() == running && seen.iter().all(|s| s.2 == leader_id) {
                if let Some(&(i, _, _)) = seen.iter().find(|s| s.1 == leader_id) {
                    return i;
                }
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "no agreed leader within {limit:?}: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("etcd data and logs kept in {}", self.dir.display());
        }
    }
}

/// `GET /health` over a fresh socket; the body, if any.
fn health(port: u16) -> Option<String> {
    http_get(port, "/health")
}

/// The value of the Prometheus counter `name` on member `port` (`GET /metrics`), e.g.
/// `etcd_debugging_lease_granted_total`.
pub fn counter(port: u16, name: &str) -> u64 {
    let body = http_get(port, "/metrics").expect("GET /metrics");
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .unwrap_or_else(|| panic!("no counter {name} in /metrics"))
}

/// `GET path` over a fresh socket (HTTP/1.0, so the body is not chunked); the body.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(1_000)))
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.split("\r\n\r\n").nth(1).map(str::to_owned)
}
