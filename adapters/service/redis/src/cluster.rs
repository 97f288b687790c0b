//! Redis Cluster: the same scripts, routed by slot, one connection per node.
//!
//! A lock's two keys share the hash tag `{name}`, so they live in one slot and every
//! script runs on the one primary that serves it. [`ClusterConnection`] keeps the
//! cluster's slot map and a multiplexed connection per node, and sends each command
//! to the node of its key's slot: it follows a `MOVED` answer (and re-reads the map
//! in the background), answers an `ASK` with `ASKING` on the target node (a slot in
//! migration), and sends `SCRIPT LOAD` to every node, replicas included, so a
//! replica promoted later already knows the scripts.
//!
//! Why not redis-rs's own cluster connection: it is one pipeline for the whole
//! cluster, and while it recovers from a dead node it holds *every* request, so one
//! primary failing over stalls the renewals of every lease in the cluster past their
//! budget (measured: all 6,644 leases on the two healthy primaries expired). Here a
//! dead node fails only the requests for its own slots, at once, while a background
//! refresh (one at a time) learns which replica took over. A node that hangs instead
//! (a partition, a stopped host: its connections stay open and nothing fails) is
//! noticed by its requests going unanswered until their timeout: each such request
//! asks for the same background refresh. Commands sent to every node are bounded per
//! node, so a hung node delays a `SCRIPT LOAD` by at most 500 ms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, RedisError, RedisFuture, ServerErrorKind, Value,
};

use crate::connect::check_url;
use crate::error::{Op, RedisLockError};
use crate::keys::{slot_of, EpochScope};
use crate::service::RedisLockService;

/// The TLS certificates every node connection uses (none without the `tls` feature).
#[cfg(feature = "tls")]
type Certificates = redis::TlsCertificates;
#[cfg(not(feature = "tls"))]
type Certificates = std::convert::Infallible;

/// A [`RedisLockService`] on a Redis Cluster (feature `cluster`).
pub type RedisClusterLockService = RedisLockService<ClusterConnection>;

/// How long connecting to one node, or reading the slot map from it, may take.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The least time between two reads of the slot map while a node stays unreachable.
const REFRESH_PAUSE: Duration = Duration::from_millis(100);

/// How long a node that refused a connection is not tried again: its requests fail at
/// once meanwhile. Without it, every retry of every lease on a dead primary opens a
/// connection (thousands a second), and the CPU that takes starves the renewals of
/// the healthy primaries.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// Slots in a Redis Cluster.
const SLOTS: usize = 16_384;

/// Marks a slot no node serves (as far as this client knows).
const NOBODY: u16 = u16::MAX;

impl RedisLockService<ClusterConnection> {
    /// Connects to the cluster that `nodes` (`redis://[[user]:password@]host[:port]`,
    /// any of its nodes; more than one, so that one being down does not matter)
    /// belong to: reads its slot map, connects to its nodes, loads the scripts on
    /// every node. Requests are bounded by 1 s, as with
    /// [`connect`](RedisLockService::connect).
    ///
    /// A node that dies fails the requests for its slots (the leases there retry
    /// within their budget, or end with the gate closed) and nothing else. Run the
    /// cluster with `cluster-require-full-coverage no`: with the default, every node
    /// refuses every request while any slot is unserved, so one primary failing over
    /// ends every lease in the cluster.
    ///
    /// # Fences across a failover
    ///
    /// Redis replicates asynchronously. A grant that had not reached the replica when
    /// its primary died is unknown to the promoted replica: the key can be granted
    /// again, and its fence counter, one behind, gives the new grant the *same* fence.
    /// The old holder loses its lease at its next renewal, but storage that admits a
    /// fence equal to the newest it saw would admit both writers in between. Where
    /// that matters, [`raise_fence`](RedisLockService::raise_fence) past any fence
    /// storage has seen after a failover.
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<RedisClusterLockService, RedisLockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedisLockService::connect_cluster_inner(nodes, None).await
    }

    /// [`connect_cluster`](Self::connect_cluster) over `rediss://` seeds with a
    /// private CA (`root_cert`, PEM) and, for mutual TLS, a client certificate and
    /// key (`client`, PEM), presented to every node; checked as
    /// [`Builder::tls_client_cert`](crate::Builder::tls_client_cert) checks them.
    /// Needs the features `cluster` and `tls`.
    #[cfg(feature = "tls")]
    pub async fn connect_cluster_with_tls<I, S>(
        nodes: I,
        root_cert: Option<&[u8]>,
        client: Option<(&[u8], &[u8])>,
    ) -> Result<RedisClusterLockService, RedisLockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let files = crate::tls::TlsFiles {
            root_cert: root_cert.map(<[u8]>::to_vec),
            client: client.map(|(cert, key)| (cert.to_vec(), key.to_vec())),
        };
        let tls = files.certificates().map_err(|e| RedisLockError::Config {
            url: "the cluster's TLS files".to_owned(),
            reason: e.to_string(),
        })?;
        RedisLockService::connect_cluster_inner(nodes, tls).await
    }

    async fn connect_cluster_inner<I, S>(
        nodes: I,
        tls: Option<Certificates>,
    ) -> Result<RedisClusterLockService, RedisLockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        #[cfg(feature = "tls")]
        crate::tls::install_provider();
        let mut seeds = Vec::new();
        let mut named = Vec::new();
        for node in nodes {
            let node = node.as_ref();
            named.push(check_url(node)?);
            let url = url::Url::parse(node).map_err(|e| RedisLockError::Config {
                url: named.last().cloned().unwrap_or_default(),
                reason: e.to_string(),
            })?;
            seeds.push(url);
        }
        let endpoint = format!("the Redis Cluster at {}", named.join(", "));
        let Some(template) = seeds.first().cloned() else {
            return Err(RedisLockError::Config {
                url: String::new(),
                reason: "no cluster nodes given".to_owned(),
            });
        };
        #[cfg(not(feature = "tls"))]
        let _: Option<std::convert::Infallible> = tls;
        let router = Arc::new(Router {
            template,
            #[cfg(feature = "tls")]
            tls,
            seeds: seeds.iter().filter_map(address).collect(),
            map: RwLock::new(SlotMap::empty()),
            refreshing: AtomicBool::new(false),
        });
        router
            .refresh()
            .await
            .map_err(|e| RedisLockError::from_redis(Op::Connect, &endpoint, e))?;
        let conn = ClusterConnection { router };
        RedisLockService::loaded(conn, &endpoint, EpochScope::Slot)
            .await
            .map(|s| s.with_request_timeout(Duration::from_secs(1)))
    }
}

/// The connection a [`RedisClusterLockService`] runs on: routes each command to the
/// node serving its key's slot (see the module docs). Cheap to clone; clones share
/// the slot map and the connections.
#[derive(Clone)]
pub struct ClusterConnection {
    router: Arc<Router>,
}

impl std::fmt::Debug for ClusterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let map = self
            .router
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let nodes: Vec<&str> = map.nodes.iter().map(|n| n.addr.as_str()).collect();
        f.debug_struct("ClusterConnection")
            .field("nodes", &nodes)
            .finish()
    }
}

struct Router {
    /// The first seed URL: scheme, credentials and database for every node.
    template: url::Url,
    /// The CA and client certificate for every node, when set.
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
    /// `host:port` of the seeds, asked for the slot map when no known node answers.
    seeds: Vec<String>,
    map: RwLock<SlotMap>,
    /// A background refresh is running (at most one at a time).
    refreshing: AtomicBool,
}

/// Which node serves each slot, and every node seen (primaries and replicas).
struct SlotMap {
    owner: Box<[u16]>,
    nodes: Vec<Arc<Node>>,
}

impl SlotMap {
    fn empty() -> SlotMap {
        SlotMap {
            owner: vec![NOBODY; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
        }
    }
}

/// One node and its connection, opened on first use and again after it broke.
struct Node {
    addr: String,
    conn: Mutex<Option<MultiplexedConnection>>,
    /// Not tried again before this instant: a connection attempt is under way or
    /// just failed.
    down_until: Mutex<Option<tokio::time::Instant>>,
}

/// Where a command goes.
enum Target {
    /// The node serving this slot.
    Slot(u16),
    /// Every node (`SCRIPT LOAD`, `SCRIPT FLUSH`).
    All,
    /// Any node.
    Any,
}

impl ConnectionLike for ClusterConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let router = Arc::clone(&self.router);
        Box::pin(async move { router.send(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let router = Arc::clone(&self.router);
        Box::pin(async move {
            // A pipeline goes to the slot of its first command with a key.
            let slot = pipeline.cmd_iter().find_map(|cmd| match target(cmd) {
                Target::Slot(slot) => Some(slot),
                _ => None,
            });
            let node = match slot {
                Some(slot) => router.node_for(slot).await?,
                None => router.any_node()?,
            };
            let unanswered = Unanswered::new(&router);
            let mut conn = router.connect(&node).await?;
            let answer = conn.req_packed_commands(pipeline, offset, count).await;
            unanswered.answered();
            router.note(&node, answer)
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl Router {
    /// Sends `cmd` where it belongs, following one redirection.
    async fn send(self: &Arc<Self>, cmd: &Cmd) -> Result<Value, RedisError> {
        let slot = match target(cmd) {
            Target::Slot(slot) => slot,
            Target::All => return self.send_to_all(cmd).await,
            Target::Any => {
                let node = self.any_node()?;
                return self.query(&node, cmd).await;
            }
        };
        let node = self.node_for(slot).await?;
        let error = match self.query(&node, cmd).await {
            Err(error) => error,
            answer => return answer,
        };
        let Some((addr, slot)) = error.redirect_node() else {
            return Err(error);
        };
        let redirected = self.node_at(addr);
        match error.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => {
                self.set_owner(slot, &redirected);
                self.refresh_soon();
                self.query(&redirected, cmd).await
            }
            // The slot is migrating and the key is already on `addr`: ask there,
            // once, without changing the map.
            _ => {
                let mut asking = redis::pipe();
                asking.cmd("ASKING").ignore().add_command(cmd.clone());
                let mut conn = self.connect(&redirected).await?;
                let answer = conn.req_packed_commands(&asking, 1, 1).await;
                let mut values = self.note(&redirected, answer)?;
                values
                    .pop()
                    .ok_or_else(|| RedisError::from((ErrorKind::Client, "no answer after ASKING")))
            }
        }
    }

    /// Sends `cmd` to every node, each bounded by [`NODE_TIMEOUT`]; the first success
    /// answers (a dead or hung node must not fail, or hold up forever, a `SCRIPT LOAD`
    /// that every live node took).
    async fn send_to_all(self: &Arc<Self>, cmd: &Cmd) -> Result<Value, RedisError> {
        let nodes = self.read().nodes.clone();
        let mut answer = Err(RedisError::from((
            ErrorKind::Client,
            "no cluster node known",
        )));
        for node in nodes {
            let this = tokio::time::timeout(NODE_TIMEOUT, self.query(&node, cmd))
                .await
                .unwrap_or_else(|_| {
                    Err(RedisError::from((ErrorKind::Io, "the node did not answer")))
                });
            if answer.is_err() {
                answer = this;
            }
        }
        answer
    }

    async fn query(self: &Arc<Self>, node: &Arc<Node>, cmd: &Cmd) -> Result<Value, RedisError> {
        let unanswered = Unanswered::new(self);
        let mut conn = self.connect(node).await?;
        // A server's error comes back as a value; as an error, a redirection is seen.
        let answer = conn
            .req_packed_command(cmd)
            .await
            .and_then(Value::extract_error);
        unanswered.answered();
        self.note(node, answer)
    }

    /// Passes `answer` on; a broken connection is dropped (the next request to the
    /// node connects again) and the slot map re-read, since the node may be gone.
    fn note<T>(
        self: &Arc<Self>,
        node: &Node,
        answer: Result<T, RedisError>,
    ) -> Result<T, RedisError> {
        if let Err(error) = &answer {
            if error.is_unrecoverable_error() || error.is_timeout() || error.is_io_error() {
                *node.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
                self.refresh_soon();
            }
        }
        answer
    }

    /// The node's connection, connecting if it has none.
    async fn connect(
        self: &Arc<Self>,
        node: &Arc<Node>,
    ) -> Result<MultiplexedConnection, RedisError> {
        if let Some(conn) = node
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(conn);
        }
        let now = tokio::time::Instant::now();
        {
            let mut down = node
                .down_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if down.is_some_and(|until| now < until) {
                return Err(RedisError::from((
                    ErrorKind::Io,
                    "the node refused a connection moments ago",
                )));
            }
            // Whoever connects first holds the others off for the pause.
            *down = Some(now + RECONNECT_PAUSE);
        }
        let conn = match self.open(&node.addr).await {
            Ok(conn) => conn,
            Err(error) => {
                self.refresh_soon();
                return Err(error);
            }
        };
        *node
            .down_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        // Two requests may have connected at once: keep the first, drop ours.
        let mut slot = node.conn.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(slot.get_or_insert(conn).clone())
    }

    async fn open(&self, addr: &str) -> Result<MultiplexedConnection, RedisError> {
        let mut url = self.template.clone();
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| {
                RedisError::from((ErrorKind::Client, "a node address without a port"))
            })?;
        // A node that has not learned its own address (a one-node cluster, whose
        // node never met another) reports an empty host: the seed's host reaches it.
        if !host.is_empty() {
            url.set_host(Some(host)).map_err(|_| {
                RedisError::from((ErrorKind::Client, "a node address that is no host"))
            })?;
        }
        url.set_port(Some(port))
            .map_err(|()| RedisError::from((ErrorKind::Client, "a node URL without a port")))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(NODE_TIMEOUT))
            .set_response_timeout(None);
        #[cfg(feature = "tls")]
        let client = match &self.tls {
            Some(tls) => redis::Client::build_with_tls(url.as_str(), tls.clone())?,
            None => redis::Client::open(url.as_str())?,
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(url.as_str())?;
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, SlotMap> {
        self.map.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node serving `slot`; if none is known, the map is read first.
    async fn node_for(self: &Arc<Self>, slot: u16) -> Result<Arc<Node>, RedisError> {
        if let Some(node) = self.owner(slot) {
            return Ok(node);
        }
        self.refresh().await?;
        self.owner(slot).ok_or_else(|| {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ClusterDown),
                "no node serves the slot",
            ))
        })
    }

    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        let map = self.read();
        let index = *map.owner.get(usize::from(slot))?;
        map.nodes.get(usize::from(index)).cloned()
    }

    fn any_node(&self) -> Result<Arc<Node>, RedisError> {
        let map = self.read();
        let served = map.owner.iter().find(|&&i| i != NOBODY).copied();
        served
            .and_then(|i| map.nodes.get(usize::from(i)))
            .or_else(|| map.nodes.first())
            .cloned()
            .ok_or_else(|| RedisError::from((ErrorKind::Client, "no cluster node known")))
    }

    /// The node at `addr`, added to the map if new.
    fn node_at(&self, addr: &str) -> Arc<Node> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        index_of(&mut map, addr)
            .and_then(|i| map.nodes.get(i).cloned())
            .unwrap_or_else(|| new_node(addr))
    }

    fn set_owner(&self, slot: u16, node: &Arc<Node>) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = index_of(&mut map, &node.addr) {
            if let (Some(owner), Ok(index)) =
                (map.owner.get_mut(usize::from(slot)), u16::try_from(index))
            {
                *owner = index;
            }
        }
    }

    /// Re-reads the slot map in the background, unless that is already happening (or
    /// there is no runtime to do it on: a request dropped as its runtime shuts down).
    fn refresh_soon(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let router = Arc::clone(self);
        runtime.spawn(async move {
            let _ = router.refresh().await;
            tokio::time::sleep(REFRESH_PAUSE).await;
            router.refreshing.store(false, Ordering::Release);
        });
    }

    /// Reads `CLUSTER SLOTS` from the first node that answers (known nodes, then the
    /// seeds) and replaces the map, keeping the connections of nodes still in it.
    async fn refresh(self: &Arc<Self>) -> Result<(), RedisError> {
        let mut candidates: Vec<String> =
            self.read().nodes.iter().map(|n| n.addr.clone()).collect();
        candidates.extend(self.seeds.iter().cloned());
        let mut last = RedisError::from((ErrorKind::Client, "no cluster node answered"));
        for addr in candidates {
            let node = self.node_at(&addr);
            let asked = async {
                let mut conn = self.connect(&node).await?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
            };
            match tokio::time::timeout(NODE_TIMEOUT, asked).await {
                Ok(Ok(slots)) => match parse_slots(&slots) {
                    Some(ranges) => {
                        self.install(ranges);
                        return Ok(());
                    }
                    None => {
                        last = RedisError::from((
                            ErrorKind::Parse,
                            "an unreadable CLUSTER SLOTS answer",
                        ))
                    }
                },
                Ok(Err(error)) => {
                    *node.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    last = error;
                }
                Err(_) => {
                    // Hung, most likely: the next request to it connects afresh.
                    *node.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    last = RedisError::from((ErrorKind::Io, "CLUSTER SLOTS timed out"));
                }
            }
        }
        Err(last)
    }

    fn install(&self, ranges: Vec<SlotRange>) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let mut owner = vec![NOBODY; SLOTS].into_boxed_slice();
        let old = std::mem::take(&mut map.nodes);
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        let index = |addr: &str, nodes: &mut Vec<Arc<Node>>| -> Option<u16> {
            let at = match nodes.iter().position(|n| n.addr == addr) {
                Some(at) => at,
                None => {
                    nodes.push(
                        old.iter()
                            .find(|n| n.addr == addr)
                            .cloned()
                            .unwrap_or_else(|| new_node(addr)),
                    );
                    nodes.len() - 1
                }
            };
            u16::try_from(at).ok()
        };
        for range in ranges {
            let primary = index(&range.primary, &mut nodes);
            for replica in &range.replicas {
                index(replica, &mut nodes);
            }
            if let Some(primary) = primary {
                for slot in range.start..=range.end {
                    if let Some(owner) = owner.get_mut(usize::from(slot)) {
                        *owner = primary;
                    }
                }
            }
        }
        *map = SlotMap { owner, nodes };
    }
}

/// Asks for a fresh slot map when the request it guards is dropped unanswered: the
/// caller's timeout gave up on a node. That is how a node that vanished without
/// closing its connections (a partition, a hung host) looks: no error ever comes,
/// and without this the map would point at it until TCP gave up, minutes later,
/// long after its replica took over.
struct Unanswered<'a> {
    router: Option<&'a Arc<Router>>,
}

impl<'a> Unanswered<'a> {
    fn new(router: &'a Arc<Router>) -> Unanswered<'a> {
        Unanswered {
            router: Some(router),
        }
    }

    /// The request came back (answer or error): nothing to do on drop.
    fn answered(mut self) {
        self.router = None;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(router) = self.router {
            router.refresh_soon();
        }
    }
}

fn new_node(addr: &str) -> Arc<Node> {
    Arc::new(Node {
        addr: addr.to_owned(),
        conn: Mutex::new(None),
        down_until: Mutex::new(None),
    })
}

fn index_of(map: &mut SlotMap, addr: &str) -> Option<usize> {
    if let Some(at) = map.nodes.iter().position(|n| n.addr == addr) {
        return Some(at);
    }
    map.nodes.push(new_node(addr));
    Some(map.nodes.len() - 1)
}

/// `host:port` of a seed URL.
fn address(url: &url::Url) -> Option<String> {
    Some(format!(
        "{}:{}",
        url.host_str()?,
        url.port().unwrap_or(6379)
    ))
}

/// One entry of `CLUSTER SLOTS`.
struct SlotRange {
    start: u16,
    end: u16,
    primary: String,
    replicas: Vec<String>,
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, …], [replica host, port, …]…]…]`.
/// `None` if any entry does not read.
fn parse_slots(value: &Value) -> Option<Vec<SlotRange>> {
    let Value::Array(entries) = value else {
        return None;
    };
    entries
        .iter()
        .map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            let number = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).ok().filter(|&n| usize::from(n) < SLOTS),
                _ => None,
            };
            let node = |v: &Value| {
                let Value::Array(parts) = v else { return None };
                let host = match parts.first()? {
                    Value::BulkString(host) => String::from_utf8(host.clone()).ok()?,
                    Value::SimpleString(host) => host.clone(),
                    _ => return None,
                };
                let Value::Int(port) = parts.get(1)? else {
                    return None;
                };
                Some(format!("{host}:{port}"))
            };
            Some(SlotRange {
                start: number(fields.first()?)?,
                end: number(fields.get(1)?)?,
                primary: node(fields.get(2)?)?,
                replicas: fields.iter().skip(3).map(node).collect::<Option<_>>()?,
            })
        })
        .collect()
}

/// Where `cmd` goes: scripts by their first key, other commands by their first
/// argument, `SCRIPT` to every node, anything without a key to any node.
fn target(cmd: &Cmd) -> Target {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes,
            _ => &b""[..],
        })
        .collect();
    let Some(name) = args.first() else {
        return Target::Any;
    };
    let key = if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        let keys = args
            .get(2)
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u32>().ok());
        match keys {
            Some(n) if n > 0 => args.get(3),
            _ => None,
        }
    } else if name.eq_ignore_ascii_case(b"SCRIPT") {
        return Target::All;
    } else if [&b"PING"[..], b"INFO", b"CLUSTER", b"ECHO"]
        .iter()
        .any(|c| name.eq_ignore_ascii_case(c))
    {
        None
    } else {
        args.get(1)
    };
    key.map_or(Target::Any, |key| Target::Slot(slot_of(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_go_to_their_first_keys_slot_and_script_load_everywhere() {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg("abc")
            .arg(2)
            .arg("{orders}")
            .arg("{orders}:fence")
            .arg("x");
        assert!(matches!(target(&evalsha), Target::Slot(s) if s == slot_of(b"{orders}")));
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg("return 1");
        assert!(matches!(target(&load), Target::All));
        assert!(matches!(target(&redis::cmd("PING")), Target::Any));
    }

    #[test]
    fn a_malformed_slot_map_is_refused_not_guessed() {
        assert!(parse_slots(&Value::Int(1)).is_none());
        let entry = |start, end| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(7000),
                ]),
            ])
        };
        assert_eq!(
            parse_slots(&Value::Array(vec![entry(0, 16_383)])).map(|r| r.len()),
            Some(1)
        );
        assert!(parse_slots(&Value::Array(vec![entry(0, 16_384)])).is_none());
        assert!(parse_slots(&Value::Array(vec![entry(-1, 5)])).is_none());
    }
}
