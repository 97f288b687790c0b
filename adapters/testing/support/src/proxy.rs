//! A loopback TCP proxy between a client and a real server, for fault injection.
//!
//! It forwards bytes both ways; on command it *stalls* (stops forwarding in both
//! directions while every connection stays open — a network that went silent, which
//! only a client-side timeout can detect), *resumes* (the held bytes flow on, nothing
//! is lost), *cuts* every open connection (clients see the connection close and must
//! reconnect), *retargets* new connections to another server (a failover), or
//! *rewrites* each reply with given bytes (a server that answers garbage).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// What the proxy does with the bytes of every connection, new and open.
#[derive(Clone, Debug, Default)]
pub enum ProxyMode {
    /// Bytes flow both ways.
    #[default]
    Forward,
    /// Nothing is forwarded in either direction (bytes wait in buffers);
    /// connections stay open and new ones are accepted.
    Stall,
    /// Requests reach the server; every complete reply is replaced with `reply`.
    RewriteReplies {
        /// What the client receives instead of each reply.
        reply: Vec<u8>,
        /// The length of the first complete reply at the start of a buffer, `None`
        /// while it is incomplete (for Redis: [`resp_frame_len`](crate::redis::resp_frame_len)).
        frame: fn(&[u8]) -> Option<usize>,
    },
}

/// A proxy listening on a free loopback port; stops and closes every connection when
/// dropped.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    mode: watch::Sender<ProxyMode>,
    upstream: Mutex<SocketAddr>,
    connections: Mutex<JoinSet<()>>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding each new connection to
    /// `127.0.0.1:upstream`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or when no loopback port can be bound.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy on loopback");
        let port = listener.local_addr().expect("the proxy's address").port();
        let shared = Arc::new(Shared {
            mode: watch::channel(ProxyMode::Forward).0,
            upstream: Mutex::new(SocketAddr::from(([127, 0, 0, 1], upstream))),
            connections: Mutex::new(JoinSet::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Proxy {
            port,
            shared,
            accept,
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Switches every connection, open and new, to `mode`.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.shared.mode.send_replace(mode);
    }

    /// Stops forwarding in both directions; connections stay open.
    pub fn stall(&self) {
        self.set_mode(ProxyMode::Stall);
    }

    /// Forwards again, starting with whatever was held while stalled.
    pub fn resume(&self) {
        self.set_mode(ProxyMode::Forward);
    }

    /// Closes every open connection, on both sides; bytes held by a stall are lost.
    /// New connections are still accepted.
    pub fn cut(&self) {
        lock(&self.shared.connections).abort_all();
    }

    /// Sends new connections to `127.0.0.1:port` from now on; open ones stay where
    /// they are (cut them to move them).
    pub fn retarget(&self, port: u16) {
        *lock(&self.shared.upstream) = SocketAddr::from(([127, 0, 0, 1], port));
    }

    /// How many connections are open right now.
    pub fn open_connections(&self) -> usize {
        let mut connections = lock(&self.shared.connections);
        while connections.try_join_next().is_some() {}
        connections.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        let upstream = *lock(&shared.upstream);
        let mode = shared.mode.subscribe();
        let mut connections = lock(&shared.connections);
        // Reap finished connections so the set only holds open ones.
        while connections.try_join_next().is_some() {}
        connections.spawn(connection(client, upstream, mode));
    }
}

/// One proxied connection. A clean close on one side is passed on and the other
/// direction finishes; a failure on either side ends both.
async fn connection(client: TcpStream, upstream: SocketAddr, mode: watch::Receiver<ProxyMode>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        // The server is down: the client sees its connection close.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, mode.clone(), false);
    let down = pump(server_read, client_write, mode, true);
    tokio::pin!(up, down);
    tokio::select! {
        closed = &mut up => if closed.is_ok() { let _ = down.await; },
        closed = &mut down => if closed.is_ok() { let _ = up.await; },
    }
}

/// Copies `from` to `to` until `from` closes (then shuts `to` down: `Ok`) or either
/// fails (`Err`). Holds what it read while stalled; on the reply side (`replies`),
/// rewrite mode swaps each complete reply for the given bytes.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
    replies: bool,
) -> Result<(), ()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = from.read(&mut buf).await.map_err(drop)?;
        if n == 0 {
            return to.shutdown().await.map_err(drop);
        }
        pending.extend_from_slice(buf.get(..n).unwrap_or_default());
        if mode
            .wait_for(|m| !matches!(m, ProxyMode::Stall))
            .await
            .is_err()
        {
            return Err(());
        }
        let current = mode.borrow().clone();
        let out = match current {
            ProxyMode::RewriteReplies { reply, frame } if replies => {
                let mut out = Vec::new();
                while let Some(len) = frame(&pending).filter(|&len| len > 0) {
                    pending.drain(..len.min(pending.len()));
                    out.extend_from_slice(&reply);
                }
                out
            }
            _ => std::mem::take(&mut pending),
        };
        to.write_all(&out).await.map_err(drop)?;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::timeout;

    use super::*;

    const PROMPT: Duration = Duration::from_secs(5);

    /// An upstream that answers every chunk with `tag` + the chunk, and closes its
    /// side when the client closes its own.
    async fn echo(tag: &'static [u8]) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n @ 1..) = stream.read(&mut buf).await {
                        let mut out = tag.to_vec();
                        out.extend_from_slice(&buf[..n]);
                        if stream.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    async fn roundtrip(stream: &mut TcpStream, send: &[u8], expect: &[u8]) {
        stream.write_all(send).await.unwrap();
        let mut got = vec![0u8; expect.len()];
        timeout(PROMPT, stream.read_exact(&mut got))
            .await
            .expect("the reply arrives")
            .expect("read the reply");
        assert_eq!(got, expect);
    }

    /// True if nothing arrives for `quiet` (a bounded observation of silence).
    async fn silent_for(stream: &mut TcpStream, quiet: Duration) -> bool {
        let mut byte = [0u8; 1];
        timeout(quiet, stream.read(&mut byte)).await.is_err()
    }

    #[tokio::test]
    async fn forwards_both_ways() {
        let proxy = Proxy::start(echo(b"a:").await).await;
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        roundtrip(&mut client, b"ping", b"a:ping").await;
        roundtrip(&mut client, b"again", b"a:again").await;
        assert_eq!(proxy.open_connections(), 1);
    }

    #[tokio::test]
    async fn a_stall_holds_bytes_and_resume_delivers_them() {
        let proxy = Proxy::start(echo(b"").await).await;
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        roundtrip(&mut client, b"before", b"before").await;
        proxy.stall();
        client.write_all(b"held").await.unwrap();
        assert!(silent_for(&mut client, Duration::from_millis(300)).await);
        // A connection opened during the stall is accepted but silent too.
        let mut late = TcpStream::connect(proxy.addr()).await.unwrap();
        late.write_all(b"late").await.unwrap();
        assert!(silent_for(&mut late, Duration::from_millis(100)).await);
        proxy.resume();
        let mut got = [0u8; 4];
        timeout(PROMPT, client.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"held");
        timeout(PROMPT, late.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"late");
    }

    #[tokio::test]
    async fn cut_closes_open_connections_and_new_ones_work() {
        let proxy = Proxy::start(echo(b"").await).await;
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        roundtrip(&mut client, b"x", b"x").await;
        proxy.stall();
        client.write_all(b"lost").await.unwrap();
        proxy.cut();
        let mut buf = [0u8; 16];
        let read = timeout(PROMPT, client.read(&mut buf))
            .await
            .expect("the cut is seen promptly");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        proxy.resume();
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        roundtrip(&mut again, b"new", b"new").await;
        assert_eq!(proxy.open_connections(), 1);
    }

    #[tokio::test]
    async fn retarget_moves_new_connections_only() {
        let proxy = Proxy::start(echo(b"a:").await).await;
        let mut old = TcpStream::connect(proxy.addr()).await.unwrap();
        roundtrip(&mut old, b"1", b"a:1").await;
        proxy.retarget(echo(b"b:").await);
        roundtrip(&mut old, b"2", b"a:2").await;
        let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
        roundtrip(&mut new, b"3", b"b:3").await;
    }

    #[tokio::test]
    async fn rewrite_replaces_each_reply() {
        fn line(buf: &[u8]) -> Option<usize> {
            buf.iter().position(|&b| b == b'\n').map(|at| at + 1)
        }
        let proxy = Proxy::start(echo(b"").await).await;
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        proxy.set_mode(ProxyMode::RewriteReplies {
            reply: b"-ERR\n".to_vec(),
            frame: line,
        });
        roundtrip(&mut client, b"one\ntwo\n", b"-ERR\n-ERR\n").await;
        proxy.resume();
        roundtrip(&mut client, b"ok\n", b"ok\n").await;
    }

    #[tokio::test]
    async fn a_half_close_is_passed_on() {
        let proxy = Proxy::start(echo(b"").await).await;
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"last").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        timeout(PROMPT, client.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, b"last");
    }

    #[tokio::test]
    async fn a_dead_upstream_closes_the_client_connection() {
        let dead = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let proxy = Proxy::start(dead).await;
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 1];
        let read = timeout(PROMPT, client.read(&mut buf))
            .await
            .expect("closed promptly");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}
