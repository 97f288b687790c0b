//! Picking and connecting the lock service from a URL.
//!
//! `redis://` and `rediss://` go to [`RedisLockService`] as they are (it checks them
//! and hides the password in its messages); `etcd+http://h:p[,h:p…]` becomes the
//! endpoint list of an [`EtcdLockService`]; `postgres://` and `postgresql://` go to
//! a [`PostgresLockService`] as they are (libpq's URL form: several hosts and
//! `target_session_attrs=read-write` find the primary), which creates its lease
//! tables if they are missing (`run`, `raise-fence`). `memory:` is not offered: an
//! in-process service cannot exclude other processes.
//!
//! A Redis that is not up when `run` starts (the connection is refused or times out,
//! or Redis is still loading) is waited for, as an etcd is (its client connects on
//! first use): the service then connects on its first request, so
//! connecting becomes part of the bounded acquire, retried until the grant or the end
//! of `--wait`. The first connection is still tried at once, so that a wrong password
//! or an unusable URL fails promptly with its own message, and `--no-wait`, `status`
//! and `raise-fence` fail at once when Redis is down.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_etcd::EtcdLockService;
use leasehold_postgres::PostgresLockService;
use leasehold_redis::RedisLockService;

/// A connected lock service.
pub enum Service {
    /// Redis.
    Redis(Arc<RedisLockService>),
    /// etcd.
    Etcd(Arc<EtcdLockService>),
    /// PostgreSQL.
    Postgres(Arc<PostgresLockService>),
}

const FORMS: &str = "use redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://…, \
                     etcd+http://HOST:PORT[,HOST:PORT…] or \
                     postgres://[USER[:PASSWORD]@]HOST[:PORT][,HOST:PORT…]/DBNAME";

/// Whether to wait for a lock service that does not answer yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Down {
    /// Fail at once (`status`, `raise-fence`, `run --no-wait`).
    Fail,
    /// Connect on the first request, inside the bounded acquire (`run`).
    Wait,
}

/// How to connect.
pub struct Settings<'a> {
    /// `--tls-ca`.
    pub tls_ca: Option<&'a Path>,
    /// The bound on each request.
    pub request_timeout: Duration,
    /// `--max-ttl`: the longest TTL, and the quarantine after a loss of state.
    pub max_ttl: Duration,
    /// Whether to wait for a service that does not answer yet.
    pub down: Down,
    /// Whether to create the lock service's tables if they are missing (PostgreSQL).
    pub create_tables: bool,
}

/// Connects to the service at `url`. The error is a complete sentence for the user.
pub async fn connect(url: &str, settings: &Settings<'_>) -> Result<Service, String> {
    let Settings {
        tls_ca,
        request_timeout,
        max_ttl,
        down,
        create_tables,
    } = *settings;
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        let mut builder = RedisLockService::builder(url)
            .request_timeout(Some(request_timeout))
            .max_ttl(max_ttl);
        if let Some(path) = tls_ca {
            builder = with_ca(builder, path)?;
        }
        let service = match builder.clone().connect().await {
            Ok(service) => service,
            Err(e) if down == Down::Wait && may_come_up(&e) => {
                note!("{e}; waiting for it");
                builder.connect_lazily().await.map_err(|e| e.to_string())?
            }
            Err(e) => return Err(e.to_string()),
        };
        return Ok(Service::Redis(Arc::new(service)));
    }
    if let Some(rest) = url.strip_prefix("etcd+http://") {
        let (user, hosts) = etcd_hosts(rest).map_err(|why| format!("unusable etcd URL: {why}"))?;
        let endpoints: Vec<String> = hosts.iter().map(|h| format!("http://{h}")).collect();
        let mut builder = EtcdLockService::builder(&endpoints)
            .request_timeout(request_timeout)
            .max_ttl(max_ttl)
            .connect_timeout(request_timeout.max(Duration::from_millis(500)));
        if let Some((name, password)) = user {
            builder = builder.user(name, password);
        }
        let service = builder.connect().await.map_err(|e| e.to_string())?;
        return Ok(Service::Etcd(Arc::new(service)));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        if tls_ca.is_some() {
            return Err("--tls-ca: the command line connects to PostgreSQL without TLS".into());
        }
        let builder = PostgresLockService::builder(url)
            .request_timeout(request_timeout)
            .max_ttl(max_ttl)
            .create_tables(create_tables);
        let service = match builder.clone().connect().await {
            Ok(service) => service,
            Err(e) if down == Down::Wait && pg_may_come_up(&e) => {
                note!("{e}; waiting for it");
                builder.connect_lazily().map_err(|e| e.to_string())?
            }
            Err(e) => return Err(e.to_string()),
        };
        return Ok(Service::Postgres(Arc::new(service)));
    }
    if url.starts_with("etcd+https://") {
        return Err(format!(
            "unusable service URL `{url}`: TLS to etcd is not supported by the command line \
             yet; {FORMS}"
        ));
    }
    let shown = match url.split_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => url.to_owned(),
    };
    Err(format!("unusable service URL `{shown}`; {FORMS}"))
}

/// Whether `e`, from the first connection, says Redis is not up yet (refused, no
/// answer in time, `LOADING` and the like) rather than that this can never work (a
/// certificate, the credentials, the URL, a host name that does not resolve).
fn may_come_up(e: &leasehold_redis::RedisLockError) -> bool {
    use leasehold_redis::RedisLockError;
    match e {
        RedisLockError::Timeout { .. } | RedisLockError::Service { .. } => true,
        RedisLockError::Transport { cause, .. } => {
            cause.is_connection_refusal() || cause.is_timeout()
        }
        _ => false,
    }
}

/// Whether `e`, from the first connection, says PostgreSQL is not up yet (refused, no
/// answer in time, starting up, a standby not promoted yet) rather than that this can
/// never work (credentials, a missing database, the URL).
fn pg_may_come_up(e: &leasehold_postgres::PostgresLockError) -> bool {
    use leasehold_postgres::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::Transport | ErrorKind::Timeout(_) | ErrorKind::Service
    )
}

/// Trusts the CA in the PEM file at `path` for `rediss://`.
#[cfg(feature = "tls")]
fn with_ca(
    builder: leasehold_redis::Builder,
    path: &Path,
) -> Result<leasehold_redis::Builder, String> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("--tls-ca {}: cannot read it: {e}", path.display()))?;
    Ok(builder.tls_root_cert(pem))
}

/// Without TLS support a CA file is a usage error.
#[cfg(not(feature = "tls"))]
fn with_ca(_: leasehold_redis::Builder, path: &Path) -> Result<leasehold_redis::Builder, String> {
    Err(format!(
        "--tls-ca {}: this leasehold was built without the `tls` feature",
        path.display()
    ))
}

/// The user (if any) and the `host:port` list of an `etcd+http://` URL's remainder.
type EtcdTarget = (Option<(String, String)>, Vec<String>);

fn etcd_hosts(rest: &str) -> Result<EtcdTarget, String> {
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (name, password) = userinfo
                .split_once(':')
                .ok_or("the user needs a password: etcd+http://USER:PASSWORD@HOST:PORT")?;
            (Some((name.to_owned(), password.to_owned())), hosts)
        }
        None => (None, rest),
    };
    let hosts = hosts.trim_end_matches('/');
    let mut list = Vec::new();
    for host in hosts.split(',') {
        let (name, port) = host
            .rsplit_once(':')
            .ok_or_else(|| format!("`{host}` has no port; {FORMS}"))?;
        if name.is_empty() || port.parse::<u16>().is_err() {
            return Err(format!("`{host}` is not HOST:PORT; {FORMS}"));
        }
        list.push(host.to_owned());
    }
    Ok((user, list))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_list_their_endpoints() {
        assert_eq!(
            etcd_hosts("127.0.0.1:2379,127.0.0.1:2380").unwrap(),
            (None, vec!["127.0.0.1:2379".into(), "127.0.0.1:2380".into()])
        );
        let (user, hosts) = etcd_hosts("root:pw@h:1/").unwrap();
        assert_eq!(user, Some(("root".into(), "pw".into())));
        assert_eq!(hosts, vec!["h:1".to_owned()]);
        assert!(etcd_hosts("h").unwrap_err().contains("no port"));
        assert!(etcd_hosts("h:x").unwrap_err().contains("not HOST:PORT"));
    }
}
