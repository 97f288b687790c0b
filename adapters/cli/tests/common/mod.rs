//! What the CLI tests share: the built binary, a fenced file store the children write
//! to, bounded waits on files and processes.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_test_support::ScratchDir;

/// `leasehold` with `--service url`, its deadline files in `dir`.
pub fn leasehold(url: &str, dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    cmd.arg("--service")
        .arg(url)
        .env("XDG_RUNTIME_DIR", dir)
        .env("STORE", dir.join("store"))
        .env("STORE_LIB", dir.join("store.sh"))
        .env_remove("LEASEHOLD_SERVICE")
        .stdin(Stdio::null());
    cmd
}

/// A spawned process, SIGKILLed and reaped on drop (a failing test leaves nothing).
pub struct Proc {
    pub child: Child,
    pub stderr: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with stderr to `dir/<name>.err`, stdout to `dir/<name>.out`.
    pub fn spawn(mut cmd: Command, dir: &Path, name: &str) -> Proc {
        let stderr = dir.join(format!("{name}.err"));
        let stdout = dir.join(format!("{name}.out"));
        cmd.stderr(std::fs::File::create(&stderr).unwrap())
            .stdout(std::fs::File::create(stdout).unwrap());
        Proc {
            child: cmd.spawn().expect("spawn leasehold"),
            stderr,
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Waits for the exit, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let give_up = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < give_up,
                "leasehold did not exit within {limit:?}; stderr:\n{}",
                self.err()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn err(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal).unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` to completion (bounded by 30 s), capturing its output.
pub fn output(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn leasehold");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("leasehold did not finish within 30 s");
        }
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A scratch directory with the fenced store's shell library in it.
///
/// `store_write FENCE WHAT` appends `FENCE ok|stale EPOCH_NS WHAT` to `$STORE` under
/// `flock`, admitting the write only if FENCE is at least the newest fence admitted
/// before (kept in `$STORE.newest`): the storage a fenced lock protects. It returns 1
/// for a stale write.
pub fn scratch(name: &str) -> ScratchDir {
    let dir = leasehold_test_support::fast_scratch_dir(name);
    std::fs::write(
        dir.path().join("store.sh"),
        r#"store_write() {
  flock "$STORE.lock" sh -c '
    newest=$(cat "$STORE.newest" 2>/dev/null || echo 0)
    now=$(date +%s%N)
    if [ "$1" -ge "$newest" ]; then
      echo "$1" > "$STORE.newest"; echo "$1 ok $now $2" >> "$STORE"
    else
      echo "$1 stale $now $2" >> "$STORE"; exit 1
    fi' _ "$1" "$2"
}
"#,
    )
    .unwrap();
    dir
}

/// One record of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub fence: u64,
    pub admitted: bool,
    pub at_ns: u128,
    pub what: String,
}

pub fn records(dir: &Path) -> Vec<Record> {
    std::fs::read_to_string(dir.join("store"))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            Record {
                fence: parts.next().unwrap().parse().unwrap(),
                admitted: parts.next().unwrap() == "ok",
                at_ns: parts.next().unwrap().parse().unwrap(),
                what: parts.next().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

/// Waits until `path` exists (and is not empty), at most `limit`; its contents.
pub fn wait_file(path: &Path, limit: Duration) -> String {
    let give_up = Instant::now() + limit;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.is_empty() {
                return text;
            }
        }
        assert!(
            Instant::now() < give_up,
            "{} did not appear within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until `path` contains `needle`, at most `limit`.
pub fn wait_contains(path: &Path, needle: &str, limit: Duration) {
    let give_up = Instant::now() + limit;
    loop {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{} did not contain {needle:?} within {limit:?}: {}",
            path.display(),
            std::fs::read_to_string(path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until `path` exists, at most `limit`.
pub fn wait_exists(path: &Path, limit: Duration) {
    let give_up = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < give_up,
            "{} did not appear within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether process `pid` is alive (not gone, not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Waits until `pid` is dead, at most `limit`; the wall-clock time it was first seen
/// dead (Unix-epoch ms).
pub fn wait_dead(pid: i32, limit: Duration) -> u128 {
    let give_up = Instant::now() + limit;
    while alive(pid) {
        assert!(
            Instant::now() < give_up,
            "process {pid} still alive after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    epoch_ms()
}

pub fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

pub fn epoch_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Fields of `/proc/<pid>/stat` after the command name: (state, ppid, session).
pub fn stat(pid: i32) -> Option<(char, i32, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = text[text.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let _pgrp = fields.next()?;
    let session = fields.next()?.parse().ok()?;
    Some((state, ppid, session))
}

/// The cgroup v2 path of `pid` (the `0::` line of `/proc/<pid>/cgroup`).
pub fn cgroup_of(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
}

/// The mount point of a writable cgroup2 file system, if this machine has one (then
/// `leasehold run` must use a cgroup of its own).
pub fn writable_cgroup2() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (fields, after) = line.split_once(" - ")?;
        let mut after = after.split(' ');
        if after.next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = fields.split(' ').collect();
        let writable = fields.get(5)?.split(',').any(|o| o == "rw")
            && nix::unistd::access(*fields.get(4)?, nix::unistd::AccessFlags::W_OK).is_ok();
        writable.then(|| PathBuf::from(fields[4]))
    })
}

/// Waits until every process in `pids` is dead, at most until `by`; the instant the
/// last was seen dead, or the ones still alive.
pub fn wait_all_dead(pids: &[i32], by: Instant) -> Result<Instant, Vec<i32>> {
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if alive.is_empty() {
            return Ok(Instant::now());
        }
        if Instant::now() >= by {
            return Err(alive);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Waits until `check` holds, at most `limit`; panics with `what` otherwise.
pub fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let give_up = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < give_up, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The etcd URL for `leasehold --service`.
pub fn etcd_url(etcd: &leasehold_test_support::EtcdCluster) -> String {
    format!(
        "etcd+http://{}",
        etcd.endpoints().join(",").replace("http://", "")
    )
}
