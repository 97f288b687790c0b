//! A loopback TCP proxy in front of an etcd member that can stop forwarding (a
//! stalled network: connections stay open, bytes stop moving both ways).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    stalled: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding every connection to `upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let port = listener.local_addr().expect("proxy addr").port();
        let (stalled, _) = watch::channel(false);
        let gate = stalled.clone();
        let task = tokio::spawn(async move {
            let upstream: SocketAddr = ([127, 0, 0, 1], upstream).into();
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_r, client_w) = client.into_split();
                    let (server_r, server_w) = server.into_split();
                    tokio::spawn(pipe(client_r, server_w, gate.subscribe()));
                    tokio::spawn(pipe(server_r, client_w, gate.subscribe()));
                });
            }
        });
        Proxy {
            port,
            stalled,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stop (`true`) or resume (`false`) forwarding.
    pub fn stall(&self, stalled: bool) {
        self.stalled.send_replace(stalled);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy is stalled.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
