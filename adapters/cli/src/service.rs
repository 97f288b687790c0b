//! Picking and connecting the lock service from a URL.
//!
//! `redis://` and `rediss://` go to [`RedisLockService`] as they are (it checks them
//! and hides the password in its messages); `etcd+http://h:p[,h:p…]` and
//! `etcd+https://…` become the endpoint list of an [`EtcdLockService`];
//! `postgres://` and `postgresql://` go to a [`PostgresLockService`] as they are
//! (libpq's URL form: several hosts and `target_session_attrs=read-write` find the
//! primary; `sslmode` as libpq reads it), which creates its lease tables if they are
//! missing (`run`, `raise-fence`). `memory:` is not offered: an in-process service
//! cannot exclude other processes.
//!
//! `--tls-ca`, `--tls-cert` and `--tls-key` go to whichever service the URL names
//! (over TLS only). A password from `--password-file` or `LEASEHOLD_PASSWORD` goes
//! into the URL's user information (percent-encoded), or to etcd's user, so that it
//! never shows in `ps`; no message prints it.
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

const FORMS: &str = "use redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://… (TLS), \
                     etcd+http://HOST:PORT[,HOST:PORT…], etcd+https://… (TLS) or \
                     postgres://[USER[:PASSWORD]@]HOST[:PORT][,HOST:PORT…]/DBNAME";

/// Whether to wait for a lock service that does not answer yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Down {
    /// Fail at once (`status`, `raise-fence`, `run --no-wait`).
    Fail,
    /// Connect on the first request, inside the bounded acquire (`run`).
    Wait,
}

/// The environment variable that may hold the lock service's password.
pub const PASSWORD_ENV: &str = "LEASEHOLD_PASSWORD";

/// How to connect.
pub struct Settings<'a> {
    /// `--tls-ca`.
    pub tls_ca: Option<&'a Path>,
    /// `--tls-cert` and `--tls-key` (clap makes sure both or neither are given).
    pub tls_client: Option<(&'a Path, &'a Path)>,
    /// `--password-file`, or else `LEASEHOLD_PASSWORD`.
    pub password: Option<Password>,
    /// The bound on each request.
    pub request_timeout: Duration,
    /// `--max-ttl`: the longest TTL, and the quarantine after a loss of state.
    pub max_ttl: Duration,
    /// Whether to wait for a service that does not answer yet.
    pub down: Down,
    /// Whether to create the lock service's tables if they are missing (PostgreSQL).
    pub create_tables: bool,
    /// `run --fair`: first-in, first-out waiting (Redis).
    pub fair: bool,
}

/// `--fair` on a service that does not offer first-in, first-out waiting: a usage
/// error before anything connects.
fn no_fair(service: &str) -> String {
    format!(
        "--fair is offered on Redis and etcd, not on {service}: leave it out to take the \
         key whenever it is free"
    )
}

/// A password kept out of the URL; never shown (its `Debug` hides it).
pub struct Password(String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(***)")
    }
}

impl Password {
    /// The password from `--password-file` (its first line), or else from
    /// `LEASEHOLD_PASSWORD`; `None` when neither is given.
    pub fn from_file_or_env(file: Option<&Path>) -> Result<Option<Password>, String> {
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--password-file {}: cannot read it: {e}", path.display()))?;
            let line = text.lines().next().unwrap_or_default();
            if line.is_empty() {
                return Err(format!(
                    "--password-file {}: its first line is empty",
                    path.display()
                ));
            }
            return Ok(Some(Password(line.to_owned())));
        }
        Ok(std::env::var(PASSWORD_ENV)
            .ok()
            .filter(|p| !p.is_empty())
            .map(Password))
    }
}

/// The TLS files, read.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
struct TlsPem {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsPem {
    fn read(settings: &Settings<'_>) -> Result<Option<TlsPem>, String> {
        let read = |flag: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| format!("{flag} {}: cannot read it: {e}", path.display()))
        };
        let ca = settings.tls_ca.map(|p| read("--tls-ca", p)).transpose()?;
        let client = match settings.tls_client {
            Some((cert, key)) => Some((read("--tls-cert", cert)?, read("--tls-key", key)?)),
            None => None,
        };
        Ok((ca.is_some() || client.is_some()).then_some(TlsPem { ca, client }))
    }
}

/// Connects to the service at `url`. The error is a complete sentence for the user,
/// and never shows the password.
pub async fn connect(url: &str, settings: &Settings<'_>) -> Result<Service, String> {
    let Settings {
        request_timeout,
        max_ttl,
        down,
        create_tables,
        fair,
        ..
    } = *settings;
    let tls = TlsPem::read(settings)?;
    let password = settings.password.as_ref();
    let tls_needs = |scheme: &str| {
        format!(
            "--tls-ca, --tls-cert and --tls-key are for TLS connections: use {scheme} \
             (or leave them out)"
        )
    };
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        if tls.is_some() && url.starts_with("redis://") {
            return Err(tls_needs("rediss://"));
        }
        let url = match password {
            Some(password) => with_password(url, &password.0)?,
            None => url.to_owned(),
        };
        let mut builder = RedisLockService::builder(url)
            .request_timeout(request_timeout)
            .max_ttl(max_ttl);
        if let Some(tls) = tls {
            builder = redis_tls(builder, tls)?;
        }
        let service = match builder.clone().connect().await {
            Ok(service) => service,
            Err(e) if down == Down::Wait && may_come_up(&e) => {
                note!("{e}; waiting for it");
                builder.connect_lazily().await.map_err(|e| e.to_string())?
            }
            Err(e) => return Err(e.to_string()),
        };
        return Ok(Service::Redis(Arc::new(service.with_fair(fair))));
    }
    let etcd = url
        .strip_prefix("etcd+http://")
        .map(|rest| (rest, "http"))
        .or_else(|| {
            url.strip_prefix("etcd+https://")
                .map(|rest| (rest, "https"))
        });
    if let Some((rest, scheme)) = etcd {
        if tls.is_some() && scheme == "http" {
            return Err(tls_needs("etcd+https://"));
        }
        let (user, hosts) = etcd_hosts(rest, password.is_some())
            .map_err(|why| format!("unusable etcd URL: {why}"))?;
        let endpoints: Vec<String> = hosts.iter().map(|h| format!("{scheme}://{h}")).collect();
        let mut builder = EtcdLockService::builder(&endpoints)
            .request_timeout(request_timeout)
            .fair(fair)
            .max_ttl(max_ttl)
            .connect_timeout(request_timeout.max(Duration::from_millis(500)));
        match (user, password) {
            (Some((name, Some(_))), Some(_)) => {
                return Err(format!(
                    "the etcd URL has a password for `{name}` and --password-file or \
                     {PASSWORD_ENV} gives one too: give it once"
                ))
            }
            (Some((name, Some(pw))), None) => builder = builder.user(name, pw),
            (Some((name, None)), Some(pw)) => builder = builder.user(name, pw.0.clone()),
            (Some((name, None)), None) => {
                return Err(format!(
                    "the etcd user `{name}` needs a password: --password-file FILE or \
                     {PASSWORD_ENV}"
                ))
            }
            (None, Some(_)) => {
                return Err(format!(
                    "--password-file or {PASSWORD_ENV} needs a user in the etcd URL: \
                     etcd+https://USER@HOST:PORT"
                ))
            }
            (None, None) => {}
        }
        if let Some(tls) = tls {
            builder = etcd_tls(builder, tls)?;
        }
        let service = builder.connect().await.map_err(|e| with_causes(&e))?;
        return Ok(Service::Etcd(Arc::new(service)));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        if fair {
            return Err(no_fair("PostgreSQL"));
        }
        let url = match password {
            Some(password) => with_password(url, &password.0)?,
            None => url.to_owned(),
        };
        let mut builder = PostgresLockService::builder(url)
            .request_timeout(request_timeout)
            .max_ttl(max_ttl)
            .create_tables(create_tables);
        if let Some(tls) = tls {
            builder = postgres_tls(builder, tls)?;
        }
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
    let shown = match url.split_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => url.to_owned(),
    };
    Err(format!("unusable service URL `{shown}`; {FORMS}"))
}

/// An etcd error with its causes (the TLS library's or etcd's own words), which its
/// `Display` leaves to `source()`.
fn with_causes(e: &leasehold_etcd::EtcdLockError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `url` (`SCHEME://[USER]@HOST…`) with `password` put in its user information,
/// percent-encoded; an error if the URL has a password already.
fn with_password(url: &str, password: &str) -> Result<String, String> {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return Err(format!(
            "--password-file or {PASSWORD_ENV} needs a URL (scheme://user@host…)"
        ));
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let encoded: String = password
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect();
    match rest[..authority_end].rfind('@') {
        Some(at) if rest[..at].contains(':') => Err(format!(
            "the service URL has a password and --password-file or {PASSWORD_ENV} gives one \
             too: give it once"
        )),
        Some(at) => Ok(format!(
            "{}{}:{encoded}{}",
            &url[..scheme_end],
            &rest[..at],
            &rest[at..]
        )),
        None => Ok(format!("{}:{encoded}@{rest}", &url[..scheme_end])),
    }
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

/// `fn $name(builder, tls)`: `builder` with the TLS files, for a service whose
/// builder has `tls_root_cert` and `tls_client_cert` (all three do).
#[cfg(feature = "tls")]
macro_rules! tls_for {
    ($name:ident, $builder:ty) => {
        fn $name(mut builder: $builder, tls: TlsPem) -> Result<$builder, String> {
            if let Some(ca) = tls.ca {
                builder = builder.tls_root_cert(ca);
            }
            if let Some((cert, key)) = tls.client {
                builder = builder.tls_client_cert(cert, key);
            }
            Ok(builder)
        }
    };
}
#[cfg(feature = "tls")]
tls_for!(redis_tls, leasehold_redis::Builder);
#[cfg(feature = "tls")]
tls_for!(etcd_tls, leasehold_etcd::Builder);
#[cfg(feature = "tls")]
tls_for!(postgres_tls, leasehold_postgres::Builder);

#[cfg(not(feature = "tls"))]
fn no_tls<B>(_: B, _: TlsPem) -> Result<B, String> {
    Err(
        "--tls-ca, --tls-cert, --tls-key: this leasehold was built without the `tls` feature"
            .into(),
    )
}
#[cfg(not(feature = "tls"))]
use no_tls as redis_tls;
#[cfg(not(feature = "tls"))]
use no_tls as etcd_tls;
#[cfg(not(feature = "tls"))]
use no_tls as postgres_tls;

/// The user and password (if any) and the `host:port` list of an `etcd+http://` or
/// `etcd+https://` URL's remainder.
type EtcdTarget = (Option<(String, Option<String>)>, Vec<String>);

/// `password_elsewhere`: a password comes from `--password-file` or the environment,
/// so a user alone is enough.
fn etcd_hosts(rest: &str, password_elsewhere: bool) -> Result<EtcdTarget, String> {
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((name, password)) => (Some((name.to_owned(), Some(password.to_owned()))), hosts),
            None if password_elsewhere => (Some((userinfo.to_owned(), None)), hosts),
            None => {
                return Err(format!(
                    "the user needs a password: --password-file FILE or {PASSWORD_ENV} \
                     (or etcd+http://USER:PASSWORD@HOST:PORT)"
                ))
            }
        },
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
            etcd_hosts("127.0.0.1:2379,127.0.0.1:2380", false).unwrap(),
            (None, vec!["127.0.0.1:2379".into(), "127.0.0.1:2380".into()])
        );
        let (user, hosts) = etcd_hosts("root:pw@h:1/", false).unwrap();
        assert_eq!(user, Some(("root".into(), Some("pw".into()))));
        assert_eq!(hosts, vec!["h:1".to_owned()]);
        assert!(etcd_hosts("root@h:1", false)
            .unwrap_err()
            .contains("--password-file"));
        let (user, _) = etcd_hosts("root@h:1", true).unwrap();
        assert_eq!(user, Some(("root".into(), None)));
        assert!(etcd_hosts("h", false).unwrap_err().contains("no port"));
        assert!(etcd_hosts("h:x", false)
            .unwrap_err()
            .contains("not HOST:PORT"));
    }

    #[test]
    fn a_password_goes_into_the_url_encoded_and_only_once() {
        assert_eq!(
            with_password("rediss://app@h:1/0", "p@ss:w/rd").unwrap(),
            "rediss://app:p%40ss%3Aw%2Frd@h:1/0"
        );
        assert_eq!(
            with_password("rediss://h:1", "s3cret").unwrap(),
            "rediss://:s3cret@h:1"
        );
        assert_eq!(
            with_password("postgres://u@a:1,b:2/db?sslmode=verify-full", "x y").unwrap(),
            "postgres://u:x%20y@a:1,b:2/db?sslmode=verify-full"
        );
        let twice = with_password("redis://:old@h:1", "new").unwrap_err();
        assert!(twice.contains("give it once") && !twice.contains("old") && !twice.contains("new"));
    }
}
