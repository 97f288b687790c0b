//! A real local Redis Cluster: primaries with their replicas, each a `redis-server` on
//! a free loopback port, joined by `redis-cli --cluster create`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::{binary, RedisOptions, RedisServer};

/// How long the cluster gets to agree on its slots after `create`, or to promote a
/// replica after its primary died (the node timeout is 1 s).
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// A node as `CLUSTER NODES` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's id.
    pub id: String,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// A primary (`master`), not a replica.
    pub primary: bool,
    /// Flagged `fail` (or `fail?`) by the node asked.
    pub failed: bool,
    /// The id of the primary it replicates (replicas only).
    pub replica_of: Option<String>,
    /// The slot ranges it serves (primaries only), inclusive.
    pub slots: Vec<(u16, u16)>,
}

/// `primaries` primaries with `replicas` replicas each, all slots assigned, the
/// cluster state `ok` on every node and every replica synced. Nodes time out after
/// 1 s (`cluster-node-timeout 1000`), so a dead primary's replica takes over within a
/// few seconds, and a primary's death leaves the others serving their slots
/// (`cluster-require-full-coverage no`).
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Ports of nodes stopped with SIGSTOP: alive, but answering nobody.
    paused: Vec<u16>,
}

impl RedisCluster {
    /// Starts the servers and creates the cluster; panics with the tool's output if it
    /// cannot.
    pub fn start(primaries: usize, replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(RedisOptions {
                    cluster: true,
                    ..RedisOptions::default()
                })
            })
            .collect();
        let cluster = RedisCluster {
            nodes,
            paused: Vec::new(),
        };
        let mut create = Command::new(redis_cli());
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string()])
            .arg("--cluster-yes");
        run(&mut create, "redis-cli --cluster create");
        cluster.wait_settled(primaries);
        cluster.wait_replicas_linked(primaries * replicas);
        cluster
    }

    /// `redis://` URLs of every node, for a cluster client's seed list.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The servers, in start order (the first `primaries` were created primaries).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Kills the node on `port` (SIGKILL): no goodbye to its replicas.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port() == port) {
            node.kill();
        }
    }

    /// Stops the node on `port` with SIGSTOP: its connections stay open and it answers
    /// nobody (a partition, a hung host), until [`resume`](Self::resume).
    pub fn pause(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter().find(|n| n.port() == port) {
            node.pause();
            self.paused.push(port);
        }
    }

    /// Lets a paused node run again.
    pub fn resume(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter().find(|n| n.port() == port) {
            node.resume();
            self.paused.retain(|&p| p != port);
        }
    }

    /// The nodes that can answer: running and not paused.
    fn answering(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.is_running() && !self.paused.contains(&n.port()))
    }

    /// The cluster as a live node sees it.
    pub fn topology(&self) -> Vec<ClusterNode> {
        self.answering()
            .find_map(|n| n.inline("CLUSTER NODES"))
            .map(|reply| parse_nodes(&reply))
            .unwrap_or_default()
    }

    /// The slot of `key` as the cluster computes it (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let live = self.answering().next().expect("a live node");
        let reply = live
            .inline(&format!("CLUSTER KEYSLOT {key}"))
            .expect("CLUSTER KEYSLOT");
        reply
            .trim()
            .trim_start_matches(':')
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT answered {reply:?}"))
    }

    /// The port of the primary serving `slot` now.
    pub fn primary_of(&self, slot: u16) -> Option<u16> {
        self.topology()
            .into_iter()
            .find(|n| {
                n.primary && !n.failed && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|n| n.port)
    }

    /// Blocks until `primaries` healthy primaries serve all 16,384 slots and every live
    /// node reports `cluster_state:ok`.
    pub fn wait_settled(&self, primaries: usize) {
        let give_up = Instant::now() + SETTLE_WITHIN;
        loop {
            let nodes = self.topology();
            let (serving, slots) = serving(&nodes);
            let ok = self.answering().all(|n| {
                n.inline("CLUSTER INFO")
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            });
            if ok && serving.len() == primaries && slots == 16_384 {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "the cluster did not settle within {SETTLE_WITHIN:?}: {nodes:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Blocks until `replicas` nodes report, each of itself, a finished sync with
    /// their primary: a replica that never synced refuses to take over (its data is
    /// too old). Each node is asked for its own role, as the others learn of it by
    /// gossip only after `redis-cli --cluster create` has returned.
    fn wait_replicas_linked(&self, replicas: usize) {
        let give_up = Instant::now() + SETTLE_WITHIN;
        loop {
            let linked = self
                .answering()
                .filter(|node| {
                    node.inline("INFO replication").is_some_and(|info| {
                        info.contains("role:slave") && info.contains("master_link_status:up")
                    })
                })
                .count();
            if linked >= replicas {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "{linked} of {replicas} replicas synced within {SETTLE_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Blocks until every node that answers sees all slots served by primaries it does
    /// not suspect, none of them the node on `port`: that node's replica has taken
    /// over. (Right after a node stops, [`wait_settled`](Self::wait_settled) returns
    /// at once: nobody has noticed yet.)
    pub fn wait_taken_over(&self, port: u16) {
        let give_up = Instant::now() + SETTLE_WITHIN;
        let served_without = |node: &RedisServer| {
            let Some(nodes) = node.inline("CLUSTER NODES").map(|r| parse_nodes(&r)) else {
                return false;
            };
            let (serving, slots) = serving(&nodes);
            slots == 16_384 && serving.iter().all(|n| n.port != port)
        };
        while !self.answering().all(served_without) {
            assert!(
                Instant::now() < give_up,
                "no replica took over from {port} within {SETTLE_WITHIN:?}: {:#?}",
                self.topology()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Blocks until the replicas of the primary on `port` have every write it had
    /// when this was called (replication offsets compared).
    pub fn wait_replicated(&self, port: u16) {
        let offset = |node: &RedisServer, field: &str| -> u64 {
            node.inline("INFO replication")
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let topology = self.topology();
        let primary = topology
            .iter()
            .find(|n| n.port == port)
            .expect("the primary");
        let server = |p: u16| self.nodes.iter().find(|n| n.port() == p && n.is_running());
        let target = offset(server(port).expect("a live primary"), "master_repl_offset:");
        let give_up = Instant::now() + SETTLE_WITHIN;
        for replica in topology
            .iter()
            .filter(|n| n.replica_of.as_deref() == Some(primary.id.as_str()))
            .filter_map(|n| server(n.port))
        {
            while offset(replica, "slave_repl_offset:") < target {
                assert!(Instant::now() < give_up, "replica {} lags", replica.port());
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Moves `slots` slots from the primary on `from` to the primary on `to`
    /// (`redis-cli --cluster reshard`, keys migrated with them), while clients run.
    pub fn reshard(&self, from: u16, to: u16, slots: u16) {
        let id = |port: u16| {
            self.topology()
                .into_iter()
                .find(|n| n.port == port)
                .map(|n| n.id)
                .unwrap_or_else(|| panic!("no node on port {port}"))
        };
        let seed = format!("127.0.0.1:{from}");
        run(
            Command::new(redis_cli())
                .args(["--cluster", "reshard", &seed])
                .args(["--cluster-from", &id(from)])
                .args(["--cluster-to", &id(to)])
                .args(["--cluster-slots", &slots.to_string()])
                .arg("--cluster-yes"),
            "redis-cli --cluster reshard",
        );
    }
}

fn redis_cli() -> std::path::PathBuf {
    binary("redis-cli", "redis-tools").unwrap_or_else(|e| panic!("{e}"))
}

fn run(command: &mut Command, what: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The primaries serving slots that this view does not suspect, and how many slots
/// they serve together.
fn serving(nodes: &[ClusterNode]) -> (Vec<&ClusterNode>, u32) {
    let serving: Vec<&ClusterNode> = nodes
        .iter()
        .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
        .collect();
    let slots = serving
        .iter()
        .flat_map(|n| n.slots.iter())
        .map(|&(a, b)| u32::from(b - a) + 1)
        .sum();
    (serving, slots)
}

/// The node lines of a `CLUSTER NODES` reply (a bulk string: its `$len` line and
/// anything else without a `host:port@cport` field is skipped).
fn parse_nodes(reply: &str) -> Vec<ClusterNode> {
    reply
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let address = fields.get(1)?;
            let port = address
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let flags = fields.get(2)?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| {
                    let (a, b) = s.split_once('-').unwrap_or((s, s));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            Some(ClusterNode {
                id: (*fields.first()?).to_owned(),
                port,
                primary: flags.contains("master"),
                failed: flags.contains("fail"),
                replica_of: fields
                    .get(3)
                    .filter(|id| **id != "-")
                    .map(|id| (*id).to_owned()),
                slots,
            })
        })
        .collect()
}
