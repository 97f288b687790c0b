//! A loopback TCP proxy between the client and a real Redis: it forwards, stalls
//! (stops forwarding without closing anything), retargets new connections to another
//! server, severs every connection, or replaces each Redis reply with given bytes
//! (a lock service that answers garbage).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Bytes flow both ways.
    Forward,
    /// Nothing is forwarded (it waits in buffers); connections stay open.
    Stall,
    /// Requests reach Redis; each reply is replaced with these bytes.
    Garbage(Vec<u8>),
}

pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<ProxyMode>,
    upstream: Arc<Mutex<u16>>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let (mode, _) = watch::channel(ProxyMode::Forward);
        let upstream = Arc::new(Mutex::new(upstream));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let mode = mode.clone();
            let upstream = upstream.clone();
            let connections = connections.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let to = *upstream.lock().unwrap();
                    let task = tokio::spawn(pipe(client, to, mode.subscribe()));
                    connections.lock().unwrap().push(task);
                }
            })
        };
        Proxy {
            port,
            mode,
            upstream,
            connections,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// New connections go to `127.0.0.1:port` from now on.
    pub fn retarget(&self, port: u16) {
        *self.upstream.lock().unwrap() = port;
    }

    /// Closes every open connection (clients see a reset and reconnect).
    pub fn sever(&self) {
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.sever();
    }
}

async fn pipe(client: TcpStream, upstream: u16, mode: watch::Receiver<ProxyMode>) {
    let Ok(server) = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], upstream))).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, mode.clone(), false);
    let down = pump(server_read, client_write, mode, true);
    // Either side closing ends both.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Copies `from` → `to`, holding bytes while stalled. On the reply side (`replies`),
/// garbage mode swaps every complete RESP reply for the garbage bytes.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
    replies: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        // Hold everything while stalled.
        if mode.wait_for(|m| *m != ProxyMode::Stall).await.is_err() {
            return;
        }
        let current = mode.borrow().clone();
        let out = match current {
            ProxyMode::Garbage(garbage) if replies => {
                let mut out = Vec::new();
                while let Some(len) = resp_len(&pending) {
                    pending.drain(..len);
                    out.extend_from_slice(&garbage);
                }
                out
            }
            _ => std::mem::take(&mut pending),
        };
        if to.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// The length of the first complete RESP2 value in `buf`, if it is all there.
pub fn resp_len(buf: &[u8]) -> Option<usize> {
    fn line(buf: &[u8], at: usize) -> Option<(usize, &[u8])> {
        let rest = buf.get(at..)?;
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        Some((at + end + 2, &rest[..end]))
    }
    fn value(buf: &[u8], at: usize) -> Option<usize> {
        let kind = *buf.get(at)?;
        let (next, body) = line(buf, at + 1)?;
        match kind {
            b'+' | b'-' | b':' => Some(next),
            b'$' => {
                let n: i64 = std::str::from_utf8(body).ok()?.parse().ok()?;
                if n < 0 {
                    Some(next)
                } else {
                    let end = next + n as usize + 2;
                    (buf.len() >= end).then_some(end)
                }
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
