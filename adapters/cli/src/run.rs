//! `leasehold run`: wait for the lease, run the command while it is held, stop the
//! command before the lease can expire, release when the command exits.

use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{GateError, Identity, Owner, Term};
use leasehold_tokio::{
    acquire_with, random_owner, AcquireError, AcquireOptions, CheckError, Config, LeaseEnd,
    LeaseHandle, LockService,
};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::child::{self, ChildEnv};
use crate::cli::RunArgs;
use crate::deadline::DeadlineFile;
use crate::signals::Signals;
use crate::{exit, progress, Output};

/// The lease settings for `args`, and the SIGTERM→SIGKILL grace.
pub fn settings(args: &RunArgs) -> Result<(Config, Duration), String> {
    let config = Config::builder(leasehold::Duration::from(args.ttl))
        .build()
        .map_err(|e| format!("--ttl {:?}: {e}", args.ttl))?;
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
            eprintln!("leasehold: {signal} while waiting for {:?}; gave up", args.key);
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
    let code = supervise(&lease, args, grace, identity, &mut signals).await;
    let end = lease.release().await;
    tracing::info!(key = %args.key, %end, "lease ended");
    code
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
            eprintln!("leasehold: {:?} is busy: {e}", args.key);
            args.conflict_exit_code
        }
        AcquireError::Busy { .. } => {
            let waited = args.wait.unwrap_or_default();
            eprintln!(
                "leasehold: timed out after {waited:?} waiting for {:?}: {e}",
                args.key
            );
            exit::TIMED_OUT
        }
        other => fail(&other.to_string()),
    }
}

/// Prints `why` and returns the "leasehold failed" code.
pub fn fail(why: &str) -> u8 {
    eprintln!("leasehold: {why}");
    exit::FAILURE
}

/// Where the child is in being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Running under a live lease.
    No,
    /// SIGTERM sent; SIGKILL due at the instant.
    Terminating(Instant),
    /// SIGKILL sent.
    Killed,
}

/// Runs the command under `lease` until it exits; returns the exit code.
async fn supervise(
    lease: &LeaseHandle,
    args: &RunArgs,
    grace: Duration,
    identity: Identity,
    signals: &mut Signals,
) -> u8 {
    let clock = lease.clock();
    let file = match DeadlineFile::create() {
        Ok(file) => file,
        Err(e) => return fail(&format!("cannot write the deadline file: {e}")),
    };
    let mut state = lease.subscribe();
    let mut deadline = lease.deadline().map(|d| clock.to_tokio(d));
    // Held when granted, but maybe not now (this process paused since, or the term
    // ended before this subscription, which then never reports it): no command.
    if lost(lease) {
        eprintln!(
            "leasehold: the lease on {:?} ended before the command could start",
            args.key
        );
        return exit::LOST;
    }
    write_deadline(&file, deadline);
    let env = ChildEnv {
        key: &args.key,
        fence: lease.granted_fence().0,
        holder: identity.as_str(),
        deadline_file: file.path(),
    };
    let mut child = match child::spawn(&args.command, &env) {
        Ok(child) => child,
        Err(e) => return fail(&format!("cannot start the command: {e}")),
    };
    let Some(pgid) = child.id() else {
        return fail("the command's process vanished before it could be supervised");
    };
    let mut stop = Stop::No;
    let mut ended: Option<LeaseEnd> = None;
    let mut watching = true;
    let status: std::io::Result<ExitStatus> = loop {
        // SIGTERM when less than the grace is left before the safe deadline: renewals
        // keep moving the deadline while they succeed, so this only fires when they
        // fail, and leaves the grace for the command to stop before SIGKILL.
        let watchdog = deadline.map(|d| d.checked_sub(grace).unwrap_or(d));
        tokio::select! {
            status = child.wait() => break status,
            signal = signals.recv() => {
                tracing::info!(%signal, "forwarding to the command");
                child::signal_group(pgid, signal);
            }
            changed = state.changed(), if watching => {
                if changed.is_err() {
                    // The driver is gone: nothing renews the lease.
                    watching = false;
                    ended = Some(LeaseEnd::DriverStopped);
                } else {
                    let now_state = *state.borrow_and_update();
                    if let Some(d) = now_state.deadline() {
                        deadline = Some(clock.to_tokio(d));
                        write_deadline(&file, deadline);
                    }
                    ended = ended.or(now_state.end());
                }
                if let Some(end) = ended {
                    watching = false;
                    write_deadline(&file, None);
                    if stop == Stop::No {
                        eprintln!("leasehold: {end}; stopping the command (SIGTERM)");
                        let kill_at = deadline
                            .map_or(Instant::now(), |d| kill_by(d, grace).min(Instant::now() + grace));
                        stop = terminate(pgid, kill_at);
                    }
                }
            }
            () = sleep_until(watchdog), if stop == Stop::No => {
                eprintln!(
                    "leasehold: the lease on {:?} was not renewed in time; stopping the command \
                     (SIGTERM, SIGKILL in {grace:?}) before the safe deadline",
                    args.key
                );
                stop = terminate(pgid, deadline.map_or_else(Instant::now, |d| kill_by(d, grace)));
            }
            () = sleep_until(kill_time(stop)), if matches!(stop, Stop::Terminating(_)) => {
                eprintln!("leasehold: the command did not stop in time; SIGKILL");
                child::signal_group(pgid, Signal::SIGKILL);
                stop = Stop::Killed;
            }
        }
    };
    // Whatever the command left in its process group must not outlive the lease.
    child::signal_group(pgid, Signal::SIGKILL);
    drop(file);
    exit_after(stop, lease, status, &args.key)
}

/// The exit code once the command has exited: 122 if it was being stopped; also if
/// it exited on its own but the lease no longer holds (this process was paused past
/// the lease: the command's exit and the lapse then wake the loop together, in either
/// order, and its code may only claim "ran under the lease" if that is true); else
/// the command's own code.
fn exit_after(
    stop: Stop,
    lease: &LeaseHandle,
    status: std::io::Result<ExitStatus>,
    key: &str,
) -> u8 {
    if stop != Stop::No {
        return exit::LOST;
    }
    if lost(lease) {
        eprintln!("leasehold: the lease on {key:?} lapsed while the command ran; it has exited");
        return exit::LOST;
    }
    match status {
        Ok(status) => exit_code(status),
        Err(e) => fail(&format!("lost track of the command: {e}")),
    }
}

/// Whether the lease no longer lets writes through for good: lost, released, past its
/// deadline or not held (a transient refusal, busy or paused, is not that).
fn lost(lease: &LeaseHandle) -> bool {
    match lease.check() {
        Ok(_) => false,
        Err(CheckError::Gate(GateError::Busy | GateError::Paused)) => false,
        Err(_) => true,
    }
}

/// When SIGKILL is sent at the latest: a little before the safe deadline `deadline`
/// (a tenth of the grace, at most 50 ms), so that the kernel has reaped the command by
/// the deadline itself, not just been asked to.
fn kill_by(deadline: Instant, grace: Duration) -> Instant {
    let lead = (grace / 10).min(Duration::from_millis(50));
    deadline.checked_sub(lead).unwrap_or(deadline)
}

/// SIGTERM to the group now, SIGKILL due at `kill_at`.
fn terminate(pgid: u32, kill_at: Instant) -> Stop {
    child::signal_group(pgid, Signal::SIGTERM);
    if kill_at <= Instant::now() {
        child::signal_group(pgid, Signal::SIGKILL);
        return Stop::Killed;
    }
    Stop::Terminating(kill_at)
}

fn kill_time(stop: Stop) -> Option<Instant> {
    match stop {
        Stop::Terminating(at) => Some(at),
        _ => None,
    }
}

/// Sleeps until `at`, or forever for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn write_deadline(file: &DeadlineFile, deadline: Option<Instant>) {
    if let Err(e) = file.write_deadline(deadline) {
        tracing::warn!("cannot update {}: {e}", file.path().display());
    }
}

/// The command's status as a shell reports it: its code, or 128 + the signal.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::FAILURE),
        (None, Some(signal)) => exit::signalled(signal),
        (None, None) => exit::FAILURE,
    }
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

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use leasehold_tokio::memory::MemoryService;

    use super::*;

    /// A command that exited 0 while the lease held reports 0; one that exited 0 after
    /// the lease lapsed (seen in that order when this process resumes) reports 122.
    #[tokio::test(start_paused = true)]
    async fn a_command_that_exits_after_the_lease_lapsed_reports_the_loss() {
        let service = Arc::new(MemoryService::new());
        let config = Config::builder(leasehold::Duration::from_secs(3))
            .build()
            .unwrap();
        let lease = leasehold_tokio::acquire(Arc::clone(&service), "k", config)
            .await
            .unwrap();
        let exited = || Ok(ExitStatus::from_raw(0));
        assert_eq!(exit_after(Stop::No, &lease, exited(), "k"), 0);
        // The service stops answering; past the safe deadline the gate refuses.
        service.stall(leasehold_tokio::memory::Scope::All);
        tokio::time::advance(std::time::Duration::from_secs(4)).await;
        assert_eq!(exit_after(Stop::No, &lease, exited(), "k"), exit::LOST);
    }
}
