//! What every leasehold integration test needs, in one place.
//!
//! * [`free_port`] — a loopback port nobody listens on, never handed out twice in
//!   this process.
//! * [`scratch_dir`] / [`fast_scratch_dir`] — temporary directories, removed on drop
//!   (the fast one on `/dev/shm` where it exists, for servers that `fsync`).
//! * [`binary`] — a server binary on `PATH`, or an error naming the Debian package
//!   that provides it. Tests fail on a missing binary; they never skip.
//! * [`RedisServer`] — a real `redis-server` on a free port: stop, kill, pause
//!   (`SIGSTOP`), resume, restart on the same port and directory; killed on drop.
//! * [`EtcdCluster`] — one or more real `etcd` members on loopback: stop, kill,
//!   pause, resume, restart a member, find the leader; every member killed on drop.
//! * [`PostgresServer`] — a real PostgreSQL cluster of its own (`initdb` in a scratch
//!   dir, `postgres` on a free loopback port; as the `postgres` user when run as
//!   root): stop, restart, kill, crash its backends, pause, a streaming standby and its
//!   promotion; shut down on drop. [`PgBouncer`] — a real PgBouncer in transaction
//!   mode in front of one.
//! * [`Proxy`] — a loopback TCP proxy that forwards, stalls (stops forwarding, keeps
//!   connections open), resumes, cuts every connection, retargets, or rewrites
//!   replies.
//! * [`Storage`] — the resource a lock protects: admits writes by fence, logs them.
//! * [`FencePlan`] / [`check_fenced_history`] — concurrent writers with interleaved
//!   fences against a fenced store, and the check that it never admitted an older
//!   fence after a newer one.
//! * [`wait_for`] — the bounded, event-driven wait used instead of bare sleeps.
//! * `Contest` (feature `scenarios`) — holders and contenders on a few keys through
//!   `leasehold-tokio`, with every client's `check()` sampled every millisecond: never
//!   two per key.
//! * `Candidates` (feature `scenarios`) — election candidates, each through its own
//!   service, with the "at most one leader at a time" check sampled while waiting for a
//!   new leader.
//!
//! The starters are blocking (`std::process`, `std::thread::sleep` while waiting for
//! the server to answer): call them before starting the code under test, or from
//! `spawn_blocking`. The proxy needs a tokio runtime.

#![warn(missing_docs)]

pub mod bench;
mod binary;
#[cfg(feature = "scenarios")]
pub mod contest;
mod dirs;
#[cfg(feature = "scenarios")]
pub mod election;
pub mod etcd;
pub mod fenced;
pub mod pgbouncer;
mod ports;
pub mod postgres;
mod process;
pub mod proxy;
pub mod redis;
pub mod redis_cluster;
mod storage;
mod wait;

pub use binary::{binary, binary_in, MissingBinary};
#[cfg(feature = "scenarios")]
pub use contest::{Contest, Outcome as ContestOutcome};
pub use dirs::{fast_scratch_dir, scratch_dir, ScratchDir};
#[cfg(feature = "scenarios")]
pub use election::{Candidates, Elected};
pub use etcd::{EtcdCluster, Timing};
pub use fenced::{check_fenced_history, Answer, FencePlan, HistoryCounts};
pub use pgbouncer::PgBouncer;
pub use ports::free_port;
pub use postgres::{PostgresOptions, PostgresServer};
pub use proxy::{Proxy, ProxyMode};
pub use redis::{RedisOptions, RedisServer, TlsFiles};
pub use redis_cluster::{ClusterNode, RedisCluster};
pub use storage::Storage;
pub use wait::wait_for;
