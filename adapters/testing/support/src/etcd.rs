//! Real `etcd` members on loopback: a client and a peer port each, a data directory
//! each on tmpfs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::{exited, kill_and_reap, signal, stop_and_reap};
use crate::{binary, fast_scratch_dir, free_port, ScratchDir, TlsFiles};

/// How long a member gets to report itself healthy (it needs a leader, so a quorum).
const HEALTHY_WITHIN: Duration = Duration::from_secs(20);

/// How many times a first start is retried on new ports when another process took
/// one between [`free_port`] and etcd's `bind`.
const PORT_RETRIES: usize = 3;

/// Raft timing of a test cluster.
///
/// etcd's minimum lease TTL is `ceil(1.5 × election timeout)` in whole seconds, so
/// short timings keep leases short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// `--heartbeat-interval`, in ms.
    pub heartbeat_ms: u64,
    /// `--election-timeout`, in ms.
    pub election_ms: u64,
}

impl Timing {
    /// Minimum lease TTL 1 s (1.5 × 300 ms, rounded up); elections not so short that
    /// a loaded 2-core machine triggers spurious ones.
    pub const FAST: Timing = Timing {
        heartbeat_ms: 30,
        election_ms: 300,
    };
    /// Minimum lease TTL 3 s (1.5 × 2,000 ms): to see etcd raise a requested TTL.
    pub const SLOW: Timing = Timing {
        heartbeat_ms: 100,
        election_ms: 2_000,
    };

    /// etcd's minimum lease TTL for this timing, in whole seconds.
    pub fn min_ttl_secs(&self) -> u64 {
        let ticks = self.election_ms / self.heartbeat_ms.max(1);
        (3 * ticks / 2 * self.heartbeat_ms).div_ceil(1_000)
    }
}

struct Member {
    name: String,
    client_port: u16,
    tls_port: u16,
    peer_port: u16,
    child: Option<Child>,
    /// Stopped by [`EtcdCluster::pause`] and not resumed.
    paused: AtomicBool,
}

/// `size` etcd members forming one cluster; every member killed when dropped.
pub struct EtcdCluster {
    members: Vec<Member>,
    timing: Timing,
    dir: ScratchDir,
    tls: Option<TlsFiles>,
}

impl EtcdCluster {
    /// One member with [`Timing::FAST`].
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn single() -> EtcdCluster {
        EtcdCluster::start(1, Timing::FAST)
    }

    /// `size` members (1 or 3 in practice) on loopback, all started, each healthy,
    /// the data set marked new ([`mark_data_set_new`](Self::mark_data_set_new)), as an
    /// operator may for a new deployment: its first grant is immediate.
    ///
    /// # Panics
    ///
    /// When `etcd` is not installed (naming the package) or a member is not healthy
    /// within 20 s (with its log).
    pub fn start(size: usize, timing: Timing) -> EtcdCluster {
        let cluster = EtcdCluster::start_unmarked(size, timing);
        cluster.mark_data_set_new();
        cluster
    }

    /// [`start`](Self::start) without marking the data set new: the first grant
    /// waits the client's quarantine, as on an etcd that lost its data.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_unmarked(size: usize, timing: Timing) -> EtcdCluster {
        EtcdCluster::start_inner(size, timing, None)
    }

    /// One member ([`Timing::FAST`], marked new) that also serves clients over mutual
    /// TLS on [`tls_endpoint`](Self::tls_endpoint): `--client-cert-auth` with the
    /// files' server certificate, key and CA (a client must present a certificate
    /// signed by that CA). The plain-text [`endpoint`](Self::endpoint) stays, for the
    /// test's own checks and administration.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn single_tls(tls: TlsFiles) -> EtcdCluster {
        let cluster = EtcdCluster::start_inner(1, Timing::FAST, Some(tls));
        cluster.mark_data_set_new();
        cluster
    }

    fn start_inner(size: usize, timing: Timing, tls: Option<TlsFiles>) -> EtcdCluster {
        assert!(size > 0, "a cluster has at least one member");
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            timing,
            dir: fast_scratch_dir("etcd"),
            tls,
        };
        for attempt in 1.. {
            cluster.members = (0..size)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: free_port(),
                    tls_port: free_port(),
                    peer_port: free_port(),
                    child: None,
                    paused: AtomicBool::new(false),
                })
                .collect();
            let started = (0..size)
                .try_for_each(|i| cluster.spawn(i))
                .and_then(|()| (0..size).try_for_each(|i| cluster.wait_healthy_or_log(i)));
            match started {
                Ok(()) => return cluster,
                Err(log) => {
                    for i in 0..size {
                        cluster.kill(i);
                        let _ = std::fs::remove_dir_all(cluster.data_dir(i));
                    }
                    if attempt >= PORT_RETRIES || !log.contains("address already in use") {
                        panic!("etcd did not start; {log}");
                    }
                }
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// How many members it has (running or not).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Its raft timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The directory holding every member's data directory and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every member's client URL, the stopped ones too.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.size()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.client_port(i))
    }

    /// Member `i`'s mutual-TLS client URL, `https://127.0.0.1:<port>`, when the
    /// cluster was started with [`single_tls`](Self::single_tls).
    pub fn tls_endpoint(&self, i: usize) -> Option<String> {
        self.tls
            .as_ref()
            .map(|_| format!("https://127.0.0.1:{}", self.members[i].tls_port))
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Member `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Whether member `i` was started and has not been stopped or killed.
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    /// `SIGTERM` member `i` and wait for it to exit (killed after 10 s). Nothing if
    /// it is not running.
    pub fn stop(&mut self, i: usize) {
        if let Some(child) = self.members[i].child.take() {
            stop_and_reap(child, "etcd");
        }
        self.members[i].paused.store(false, Ordering::Relaxed);
    }

    /// `SIGKILL` member `i`, by pid, and reap it. Nothing if it is not running.
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = self.members[i].child.take() {
            kill_and_reap(child);
        }
        self.members[i].paused.store(false, Ordering::Relaxed);
    }

    /// `SIGSTOP` member `i`: it stops answering clients and peers, its connections
    /// stay open (a frozen VM, a long GC pause).
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn pause(&self, i: usize) {
        signal(self.running(i), Signal::SIGSTOP, "etcd");
        self.members[i].paused.store(true, Ordering::Relaxed);
    }

    /// `SIGCONT` after [`pause`](Self::pause).
    ///
    /// # Panics
    ///
    /// When it is not running.
    pub fn resume(&self, i: usize) {
        signal(self.running(i), Signal::SIGCONT, "etcd");
        self.members[i].paused.store(false, Ordering::Relaxed);
    }

    /// Starts member `i` again on its ports and data directory (its WAL is replayed)
    /// without waiting for it: with the rest of a 3-member cluster down it cannot be
    /// healthy alone.
    ///
    /// # Panics
    ///
    /// When it is running.
    pub fn start_member(&mut self, i: usize) {
        assert!(!self.is_running(i), "etcd member {i} is running");
        if let Err(log) = self.spawn(i) {
            panic!("{log}");
        }
    }

    /// Waits until member `i` answers `GET /health` with `"health":"true"` (it has a
    /// leader and serves reads).
    ///
    /// # Panics
    ///
    /// When it is not healthy within 20 s, or exits (with its log).
    pub fn wait_healthy(&mut self, i: usize) {
        if let Err(log) = self.wait_healthy_or_log(i) {
            panic!("{log}");
        }
    }

    /// Kills member `i` if it runs, starts it again on the same ports and data, and
    /// waits until it is healthy.
    ///
    /// # Panics
    ///
    /// As [`wait_healthy`](Self::wait_healthy).
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.start_member(i);
        self.wait_healthy(i);
    }

    /// Writes the epoch marker a leasehold client keeps (`{leasehold}epoch`, see
    /// `leasehold-etcd`'s epoch docs) as `0 0`: a data set that cannot hold a
    /// forgotten grant, whose cluster and term the next grant records.
    ///
    /// # Panics
    ///
    /// When no running member accepts the write.
    pub fn mark_data_set_new(&self) {
        let written = (0..self.size())
            .filter(|&i| self.is_running(i))
            .any(|i| put(self.client_port(i), b"{leasehold}epoch", b"0 0"));
        assert!(written, "marking the etcd data set new");
    }

    /// `etcdctl snapshot save` of member `i` into `file` (Debian package
    /// `etcd-client`).
    ///
    /// # Panics
    ///
    /// When `etcdctl` is missing or fails.
    pub fn save_snapshot(&self, i: usize, file: &Path) {
        let etcdctl = binary("etcdctl", "etcd-client").unwrap_or_else(|e| panic!("{e}"));
        let out = Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint(i), "snapshot", "save"])
            .arg(file)
            .output()
            .expect("run etcdctl");
        assert!(out.status.success(), "etcdctl snapshot save: {out:?}");
    }

    /// Restores the one member of a single-member cluster from `file` as an operator
    /// would: kills it, `etcdctl snapshot restore` into a new data directory with the
    /// member's own name, peer URL and cluster token (so the cluster keeps its id),
    /// swaps it in, starts the member and waits until it is healthy.
    ///
    /// # Panics
    ///
    /// With more than one member, or when `etcdctl` or the start fails.
    pub fn restore_snapshot(&mut self, file: &Path) {
        assert_eq!(self.size(), 1, "restore_snapshot restores a single member");
        let etcdctl = binary("etcdctl", "etcd-client").unwrap_or_else(|e| panic!("{e}"));
        self.kill(0);
        let data_dir = self.data_dir(0);
        let restored = data_dir.with_extension("restored");
        let _ = std::fs::remove_dir_all(&restored);
        let peer = format!("http://127.0.0.1:{}", self.members[0].peer_port);
        let out = Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(file)
            .arg("--data-dir")
            .arg(&restored)
            .args(["--name", &self.members[0].name])
            .args(["--initial-cluster", &self.initial_cluster()])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster-token", &self.token()])
            .output()
            .expect("run etcdctl");
        assert!(out.status.success(), "etcdctl snapshot restore: {out:?}");
        std::fs::remove_dir_all(&data_dir).expect("remove the old data directory");
        std::fs::rename(&restored, &data_dir).expect("swap in the restored data");
        self.start_member(0);
        self.wait_healthy(0);
    }

    /// The index of the leader, as every running member agrees (a
    /// [`pause`](Self::pause)d one cannot answer and is not asked); waits up to `limit`
    /// for an election to settle.
    ///
    /// # Panics
    ///
    /// When the running members do not agree on a leader within `limit`.
    pub async fn leader(&self, limit: Duration) -> usize {
        let give_up = tokio::time::Instant::now() + limit;
        let answering =
            |i: &usize| self.is_running(*i) && !self.members[*i].paused.load(Ordering::Relaxed);
        loop {
            let mut seen = Vec::new();
            for i in (0..self.size()).filter(answering) {
                if let Some((me, leader)) = status(self.client_port(i)).await {
                    seen.push((i, me, leader));
                }
            }
            let running = (0..self.size()).filter(answering).count();
            let leader = seen.first().map_or(0, |s| s.2);
            if leader != 0 && seen.len() == running && seen.iter().all(|s| s.2 == leader) {
                if let Some(&(i, _, _)) = seen.iter().find(|s| s.1 == leader) {
                    return i;
                }
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "no agreed etcd leader within {limit:?}: (member, id, leader id) {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn running(&self, i: usize) -> &Child {
        let member = &self.members[i];
        member
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("etcd member {i} is not running"))
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir().join(&self.members[i].name)
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.data_dir(i).with_extension("log")
    }

    fn initial_cluster(&self) -> String {
        let peers: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        peers.join(",")
    }

    /// The cluster token: the scratch directory's name, unique per cluster.
    fn token(&self) -> String {
        self.dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let etcd = binary("etcd", "etcd-server").unwrap_or_else(|e| panic!("{e}"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .map_err(|e| format!("cannot open the etcd log: {e}"))?;
        let initial_cluster = self.initial_cluster();
        let token = self.token();
        let data_dir = self.data_dir(i);
        let member = &self.members[i];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let mut cmd = Command::new(etcd);
        let listen = match &self.tls {
            Some(tls) => {
                cmd.arg("--cert-file")
                    .arg(&tls.cert)
                    .arg("--key-file")
                    .arg(&tls.key)
                    .arg("--trusted-ca-file")
                    .arg(&tls.ca)
                    .arg("--client-cert-auth");
                format!("{client},https://127.0.0.1:{}", member.tls_port)
            }
            None => client.clone(),
        };
        let child = cmd
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &listen])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &token])
            .arg(format!("--heartbeat-interval={}", self.timing.heartbeat_ms))
            .arg(format!("--election-timeout={}", self.timing.election_ms))
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot spawn etcd: {e}"))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn wait_healthy_or_log(&mut self, i: usize) -> Result<(), String> {
        let give_up = Instant::now() + HEALTHY_WITHIN;
        loop {
            let port = self.client_port(i);
            if let Some(status) = self.members[i].child.as_mut().and_then(exited) {
                self.members[i].child = None;
                return Err(format!(
                    "etcd member {i} exited during startup ({status}); log:\n{}",
                    self.log(i)
                ));
            }
            if health(port).is_some_and(|body| body.contains("\"health\":\"true\"")) {
                return Ok(());
            }
            if Instant::now() >= give_up {
                return Err(format!(
                    "etcd member {i} on port {port} not healthy within {HEALTHY_WITHIN:?}; log:\n{}",
                    self.log(i)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.size() {
            self.kill(i);
        }
    }
}

/// `GET /health` over a fresh socket; the body, if any.
fn health(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.split("\r\n\r\n").nth(1).map(str::to_owned)
}

/// `PUT key = value` through the JSON gateway (`/v3/kv/put`); whether it was accepted.
fn put(port: u16, key: &[u8], value: &[u8]) -> bool {
    let body = format!(
        "{{\"key\":\"{}\",\"value\":\"{}\"}}",
        base64(key),
        base64(value)
    );
    let request = format!(
        "POST /v3/kv/put HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.1 200") && reply.contains("\"revision\"")
}

/// Standard base64, padded: what the gateway takes for bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The member's own id and its leader's id, from the JSON gateway's
/// `/v3/maintenance/status` (no gRPC client needed); `None` if it did not answer
/// within a second.
async fn status(port: u16) -> Option<(u64, u64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(
                b"POST /v3/maintenance/status HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                  Content-Type: application/json\r\nContent-Length: 2\r\n\
                  Connection: close\r\n\r\n{}",
            )
            .await
            .ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.ok()?;
        Some(reply)
    };
    let reply = tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()??;
    Some((json_u64(&reply, "member_id")?, json_u64(&reply, "leader")?))
}

/// The first `"field":"<digits>"` (the gateway writes 64-bit numbers as strings).
fn json_u64(json: &str, field: &str) -> Option<u64> {
    let start = json.find(&format!("\"{field}\":\""))? + field.len() + 4;
    let digits = json.get(start..)?.split('"').next()?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(cluster: &EtcdCluster, i: usize) -> bool {
        health(cluster.client_port(i)).is_some_and(|b| b.contains("\"health\":\"true\""))
    }

    #[test]
    fn min_ttls_follow_the_timing() {
        assert_eq!(Timing::FAST.min_ttl_secs(), 1);
        assert_eq!(Timing::SLOW.min_ttl_secs(), 3);
    }

    #[test]
    fn base64_pads_like_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"{leasehold}epoch"), "e2xlYXNlaG9sZH1lcG9jaA==");
    }

    #[test]
    fn status_fields_parse() {
        let body = r#"{"header":{"cluster_id":"3","member_id":"12","revision":"1"},"leader":"12"}"#;
        assert_eq!(json_u64(body, "member_id"), Some(12));
        assert_eq!(json_u64(body, "leader"), Some(12));
        assert_eq!(json_u64(body, "missing"), None);
    }

    #[tokio::test]
    async fn a_single_member_is_healthy_and_leads_and_restarts_in_place() {
        let mut cluster = EtcdCluster::single();
        assert!(healthy(&cluster, 0));
        assert_eq!(cluster.leader(Duration::from_secs(5)).await, 0);
        let (port, pid) = (cluster.client_port(0), cluster.pid(0).unwrap());
        cluster.stop(0);
        assert!(!cluster.is_running(0) && health(port).is_none());
        cluster.restart(0);
        assert_eq!(cluster.client_port(0), port);
        assert_ne!(cluster.pid(0), Some(pid));
        assert!(healthy(&cluster, 0));
        cluster.pause(0);
        assert!(health(port).is_none(), "a paused member does not answer");
        cluster.resume(0);
        assert!(healthy(&cluster, 0));
        assert_eq!(cluster.leader(Duration::from_secs(5)).await, 0);
        let pid = cluster.pid(0).unwrap();
        cluster.pause(0);
        drop(cluster);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "drop kills, even a paused member"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_members_elect_again_when_the_leader_is_killed() {
        let mut cluster = EtcdCluster::start(3, Timing::FAST);
        assert_eq!(cluster.endpoints().len(), 3);
        let leader = cluster.leader(Duration::from_secs(10)).await;
        cluster.kill(leader);
        let next = cluster.leader(Duration::from_secs(10)).await;
        assert_ne!(next, leader);
        let other = (0..3).find(|&i| i != leader && i != next).unwrap();
        assert!(healthy(&cluster, next) && healthy(&cluster, other));
        cluster.start_member(leader);
        cluster.wait_healthy(leader);
        assert_eq!(cluster.leader(Duration::from_secs(10)).await, next);
    }
}
