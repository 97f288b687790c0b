//! `leasehold run`: wait for the lease, run the command while it is held (see
//! [`crate::supervise`]), release when the command exits.

use std::sync::Arc;
use std::time::Duration;

use leasehold::{Identity, Owner, Term};
use leasehold_tokio::{
    acquire_with, random_owner, AcquireError, AcquireOptions, Config, LockService,
};

use crate::cli::RunArgs;
use crate::signals::Signals;
use crate::supervise::supervise;
use crate::{exit, progress, Output};

/// The shortest bound on one request to the lock service. The lease's own default
/// (TTL/10) is raised to it, since that is what a request is given (see `main`): a
/// TTL too short to renew within it is refused up front instead of being lost at once.
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_millis(100);

/// The lease's configuration for a TTL of `ttl`.
fn config(ttl: Duration) -> Result<Config, leasehold::ConfigError> {
    let timeout = (ttl / 10).max(MIN_REQUEST_TIMEOUT);
    Config::builder(leasehold::Duration::from(ttl))
        .request_timeout(leasehold::Duration::from(timeout))
        .build()
}

/// The lease settings for `args`, and the SIGTERM→SIGKILL grace.
pub fn settings(args: &RunArgs) -> Result<(Config, Duration), String> {
    let config = config(args.ttl).map_err(|e| {
        let shortest = (1..=10_000)
            .map(Duration::from_millis)
            .find(|&ttl| config(ttl).is_ok())
            .unwrap_or(Duration::from_secs(10));
        format!(
            "--ttl {:?} is too short: {e} (a request to the lock service is given at least \
             {MIN_REQUEST_TIMEOUT:?}); use --ttl {shortest:?} or more",
            args.ttl
        )
    })?;
    let limit = args.ttl / 4;
    let grace = args.kill_after.unwrap_or(args.ttl / 5);
    if grace > limit {
        return Err(format!(
            "--kill-after {grace:?} is more than a quarter of --ttl ({limit:?}): the grace must \
             fit inside the time a failing renewal leaves; raise --ttl or lower --kill-after"
        ));
    }
    Ok((config, grace))
}

/// Runs `args` on `service`; returns the exit code.
pub async fn run<S: LockService + 'static>(service: Arc<S>, args: &RunArgs, out: Output) -> u8 {
    let (config, grace) = match settings(args) {
        Ok(s) => s,
        Err(why) => return fail(&why),
    };
    let identity = match &args.identity {
        Some(text) => match Identity::new(text) {
            Ok(identity) => identity,
            Err(e) => return fail(&format!("--identity: {e}")),
        },
        None => default_identity(),
    };
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return fail(&format!("cannot install signal handlers: {e}")),
    };
    // The acquire's owner, chosen here so that this function can still release a
    // grant that an attempt in flight may have made when a signal ends the wait: the
    // runtime ends with it, and the driver's own release might never go out.
    let Some(owner) = random_owner() else {
        return fail("the OS random source failed: cannot pick an owner id");
    };
    let mut options = AcquireOptions::new().identity(identity).owner(owner);
    if args.no_wait {
        options = options.max_wait(Duration::ZERO);
    } else if let Some(wait) = args.wait {
        options = options.max_wait(wait);
    }

    let progress = out
        .progress
        .then(|| progress::spawn(Arc::clone(&service), args.key.clone()));
    let acquire = acquire_with(Arc::clone(&service), &args.key, config, options);
    let acquired = tokio::select! {
        acquired = acquire => acquired,
        signal = signals.recv() => {
            progress::stop(progress);
            release_unheld(&*service, &args.key, owner, config).await;
            say!("{signal} while waiting for {:?}; gave up", args.key);
            return exit::signalled(signal as i32);
        }
    };
    progress::stop(progress);
    let lease = match acquired {
        Ok(lease) => lease,
        // The acquire ended after the core's own release of a grant in doubt.
        Err(e) => return not_acquired(args, &e),
    };
    tracing::info!(key = %args.key, fence = lease.granted_fence().0, "lease granted");
    let code = supervise(&lease, args, grace, identity, &mut signals, out).await;
    let end = lease.release().await;
    tracing::info!(key = %args.key, %end, "lease ended");
    // A release whose answer was lost is retried in the background; give it a little
    // time to land, so the next holder need not wait out the TTL.
    let settle = release_wait(config);
    if tokio::time::timeout(settle, lease.settled()).await.is_err() {
        tracing::warn!(key = %args.key, ?settle, "release not confirmed; the service's TTL frees the key");
    }
    code
}

/// How long `run` waits, after the command's term ended, for a release whose answer
/// was lost: three request timeouts, time for the first try and one retry that each
/// take their whole timeout (3 s at the default 10 s TTL). Past it, leasehold exits
/// with the command's status and the key's TTL frees it.
fn release_wait(config: Config) -> std::time::Duration {
    std::time::Duration::from(config.request_timeout()) * 3
}

/// Sends the release an acquire dropped mid-way may owe (an attempt may have been
/// granted with its answer still on the way), bounded by the request timeout. A
/// compare-and-delete with this acquire's own token: it deletes nothing else, and
/// nothing if the driver's release got there first. An acquire runs one term, term 1.
async fn release_unheld<S: LockService>(service: &S, key: &str, owner: Owner, config: Config) {
    let release = service.release(key, owner.token(Term(1)));
    let _ = tokio::time::timeout(config.request_timeout().into(), release).await;
}

/// The exit code and message for an acquire that did not succeed.
fn not_acquired(args: &RunArgs, e: &AcquireError) -> u8 {
    match e {
        AcquireError::Busy { .. } if args.no_wait => {
            say!("{:?} is busy: {e}", args.key);
            args.conflict_exit_code
        }
        AcquireError::Busy { .. } => {
            let waited = args.wait.unwrap_or_default();
            say!("timed out after {waited:?} waiting for {:?}: {e}", args.key);
            exit::TIMED_OUT
        }
        other => fail(&other.to_string()),
    }
}

/// Prints `why` and returns the "leasehold failed" code.
pub fn fail(why: &str) -> u8 {
    say!("{why}");
    exit::FAILURE
}

/// `hostname:pid`, as the tokio adapter's default, so it can be put in the command's
/// environment too.
fn default_identity() -> Identity {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    Identity::lossy(&format!("{host}:{}", std::process::id()))
}
