//! Keeping a dead or stopped member of a cluster out of the channel's rotation.
//!
//! etcd-client balances requests over its endpoints with tonic's power-of-two-choices
//! balancer, whose load metric is constant: each request (or stream) goes to a random
//! member among those whose connection is *ready*. A killed member's connection is
//! refused at once, so it is only briefly picked (and `timed` tries such an unsent
//! request again). A stopped member (`SIGSTOP`, a frozen VM, a long pause) is worse:
//! the kernel still accepts its TCP connections and hyper still sees the HTTP/2
//! connection as ready, so it keeps getting a third of the requests, and each of them
//! waits for its whole timeout. HTTP/2 keep-alive pings only close that connection
//! after their interval and timeout, and the next connection looks ready again.
//!
//! So each member is asked for its `Status` on a connection of its own, every
//! `interval`. A member that does not answer within `timeout` (or cannot be reached)
//! is removed from the channel (`remove_endpoint`): requests and new streams go to the
//! others. It is added back (a new connection) as soon as it answers again. Any answer
//! counts, an error from etcd too ("no leader" during an election): only silence or a
//! failed connection takes a member out, so an election never empties the rotation.
//! The last member in rotation is never removed, so requests still have somewhere to
//! go (and fail within their bound) when every member is down.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::Client;

use crate::service::Shared;

/// Which of the configured endpoints are out of rotation.
#[derive(Debug, Default)]
pub(crate) struct Rotation {
    /// One entry per endpoint, in the order given: `true` while it is out.
    out: Mutex<Vec<bool>>,
    /// The endpoints as given (and as the channel keys them, see [`channel_key`]).
    endpoints: Mutex<Vec<String>>,
}

impl Rotation {
    fn out(&self) -> std::sync::MutexGuard<'_, Vec<bool>> {
        // Only whole booleans are written: a poisoned lock is still usable.
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The endpoints out of rotation now, as given to the builder.
    pub(crate) fn endpoints_out(&self) -> Vec<String> {
        let out = self.out().clone();
        let endpoints = self
            .endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        endpoints
            .iter()
            .zip(out)
            .filter(|(_, out)| *out)
            .map(|(e, _)| e.clone())
            .collect()
    }

    /// Marks member `i` out if another member is still in; whether it was taken out.
    fn take_out(&self, i: usize) -> bool {
        let mut out = self.out();
        let others_in = out.iter().enumerate().any(|(j, &o)| j != i && !o);
        if out[i] || !others_in {
            return false;
        }
        out[i] = true;
        true
    }

    /// Marks member `i` in; whether it was out.
    fn put_back(&self, i: usize) -> bool {
        std::mem::replace(&mut self.out()[i], false)
    }
}

/// The key the channel knows an endpoint by: etcd-client prefixes a bare
/// `host:port` with `http://` (`https://` with TLS options) before parsing it, and
/// `remove_endpoint` parses what it is given as is.
pub(crate) fn channel_key(endpoint: &str, tls: bool) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint.to_owned()
    } else if tls {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    }
}

/// Starts one checking task per member; each ends once the service (every clone) is
/// dropped. `probes` are clients of one member each, in the endpoints' order, and
/// `keys` what the channel knows each member by.
pub(crate) fn start(
    shared: &Arc<Shared>,
    endpoints: Vec<String>,
    keys: Vec<String>,
    probes: Vec<Client>,
    interval: Duration,
    timeout: Duration,
) {
    {
        let rotation = &shared.rotation;
        *rotation.out() = vec![false; endpoints.len()];
        *rotation
            .endpoints
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = endpoints;
    }
    for (i, (probe, key)) in probes.into_iter().zip(keys).enumerate() {
        let shared = Arc::downgrade(shared);
        tokio::spawn(check(shared, i, key, probe, interval, timeout));
    }
}

/// Asks member `i` for its status every `interval`; takes it out of rotation when it
/// does not answer within `timeout`, puts it back when it answers.
async fn check(
    shared: Weak<Shared>,
    i: usize,
    key: String,
    mut probe: Client,
    interval: Duration,
    timeout: Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let answered = match tokio::time::timeout(timeout, probe.status()).await {
            Ok(Ok(_)) => true,
            // An error etcd itself sent: the member is alive and answering.
            Ok(Err(etcd_client::Error::GRpcStatus(status))) => {
                !crate::error::is_transport_status(&status)
            }
            Ok(Err(_)) | Err(_) => false,
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let rotation = &shared.rotation;
        let client = &shared.client;
        if answered {
            if rotation.put_back(i) {
                match client.add_endpoint(&key).await {
                    Ok(()) => {
                        tracing::info!(member = %key, "etcd member answers again: back in rotation")
                    }
                    Err(err) => {
                        tracing::warn!(member = %key, error = %err, "could not put the etcd member back in rotation")
                    }
                }
            }
        } else if rotation.take_out(i) {
            match client.remove_endpoint(&key).await {
                Ok(()) => tracing::warn!(
                    member = %key,
                    ?timeout,
                    "etcd member does not answer: out of rotation until it does"
                ),
                Err(err) => {
                    tracing::warn!(member = %key, error = %err, "could not take the etcd member out of rotation")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_member_in_rotation_stays() {
        let rotation = Rotation::default();
        *rotation.out() = vec![false; 3];
        *rotation.endpoints.lock().unwrap() = vec!["a".into(), "b".into(), "c".into()];
        assert!(rotation.take_out(0));
        assert!(!rotation.take_out(0), "already out");
        assert!(rotation.take_out(2));
        assert!(!rotation.take_out(1), "the last one in stays");
        assert_eq!(rotation.endpoints_out(), ["a", "c"]);
        assert!(rotation.put_back(2));
        assert!(!rotation.put_back(2));
        assert!(rotation.take_out(1));
        assert_eq!(rotation.endpoints_out(), ["a", "b"]);
    }

    #[test]
    fn channel_keys_get_the_scheme_the_client_adds() {
        assert_eq!(channel_key("10.0.0.1:2379", false), "http://10.0.0.1:2379");
        assert_eq!(channel_key("10.0.0.1:2379", true), "https://10.0.0.1:2379");
        assert_eq!(channel_key("http://h:2379", true), "http://h:2379");
        assert_eq!(channel_key("https://h:2379", false), "https://h:2379");
    }
}
