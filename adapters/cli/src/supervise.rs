//! The command under a held lease: start its tree, keep telling it how long it may
//! run, stop it before the lease can expire, and say how it ended.
//!
//! The lease's safe deadline `D` (no other holder can be granted the key before it)
//! governs everything, with a grace `G` (`--kill-after`) and a lead
//! `L` = min(G/10, 50 ms), so that the tree is dead and reaped by `D` itself, not
//! just signalled:
//!
//! - after the grant and every confirmed renewal the tree is told it may run until
//!   `D − L`; the reaper stops it then by itself if nothing newer comes (this
//!   process stalled);
//! - when `D − G` comes and no renewal moved `D` (renewals are failing), or when the
//!   lease ends, the command's group gets SIGTERM and the tree SIGKILL at `D − L`;
//! - a second SIGINT, SIGTERM or SIGHUP is passed on like the first, and SIGKILL
//!   follows `G` later (no later than `D − L`).

use std::time::Duration;

use leasehold::{GateError, Identity};
use leasehold_tokio::{CheckError, LeaseEnd, LeaseHandle};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::child::ChildEnv;
use crate::cli::{OnStall, RunArgs};
use crate::deadline::DeadlineFile;
use crate::private_dir::PrivateDir;
use crate::run::fail;
use crate::signals::Signals;
use crate::tree::{Exit, Report, Settings, Tree};
use crate::{exit, Output};

/// Where the command is in being stopped for the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Running under a live lease.
    No,
    /// SIGTERM sent; SIGKILL due at the instant.
    Terminating(Instant),
}

/// Runs the command under `lease` until it exits; returns the exit code.
pub async fn supervise(
    lease: &LeaseHandle,
    args: &RunArgs,
    grace: Duration,
    identity: Identity,
    signals: &mut Signals,
    out: Output,
) -> u8 {
    let clock = lease.clock();
    let dir = match PrivateDir::create() {
        Ok(dir) => dir,
        Err(e) => return fail(&format!("cannot make a private directory: {e}")),
    };
    let file = match DeadlineFile::create(dir.path()) {
        Ok(file) => file,
        Err(e) => return fail(&format!("cannot write the deadline file: {e}")),
    };
    let mut state = lease.subscribe();
    let mut deadline = lease.deadline().map(|d| clock.to_tokio(d));
    // Held when granted, but maybe not now (this process paused since, or the term
    // ended before this subscription, which then never reports it): no command.
    let Some(first) = deadline.filter(|_| !lost(lease)) else {
        say!(
            "the lease on {:?} ended before the command could start",
            args.key
        );
        return exit::LOST;
    };
    write_deadline(&file, deadline);
    let env = ChildEnv {
        key: &args.key,
        fence: lease.granted_fence().0,
        holder: identity.as_str(),
        deadline_file: file.path(),
    };
    let settings = Settings {
        on_stall: args.on_stall,
        cgroup: args.cgroup,
        quiet: out.quiet,
        verbose: out.verbose,
    };
    let mut tree = match Tree::spawn(&args.command, &env, dir.path(), &settings, clock) {
        Ok(tree) => tree,
        Err(e) => return fail(&format!("cannot start the command: {e}")),
    };
    tree.run_until(kill_by(first, grace));
    let mut stop = Stop::No;
    let mut stalled: Option<OnStall> = None;
    let mut signals_seen = 0u32;
    let mut ended: Option<LeaseEnd> = None;
    let mut watching = true;
    let ending = loop {
        // SIGTERM when less than the grace is left before the safe deadline: renewals
        // keep moving the deadline while they succeed, so this only fires when they
        // fail, and leaves the grace for the command to stop before SIGKILL.
        let watchdog = deadline.map(|d| d.checked_sub(grace).unwrap_or(d));
        tokio::select! {
            // What the reaper did comes first: after a stall it explains the rest.
            biased;
            report = tree.next() => match report {
                Report::Started(pid) => tracing::debug!(pid, "the command started"),
                Report::Stalled(how) => stalled = Some(how),
                Report::Thawed => {
                    stalled = None;
                    tracing::info!("leasehold was stalled but the lease held: the command runs again");
                }
                Report::Exited(exit) => break Ok(exit),
                Report::Failed(why) => break Err(why),
            },
            signal = signals.recv() => {
                signals_seen += 1;
                tree.signal(signal);
                if signals_seen == 1 {
                    tracing::info!(%signal, "passed on to the command");
                } else {
                    let now = Instant::now();
                    let kill_at = deadline.map_or(now + grace, |d| (now + grace).min(kill_by(d, grace)));
                    note!(
                        "{signal} again: passed on to the command; SIGKILL in {} unless it exits",
                        ms(kill_at.saturating_duration_since(now))
                    );
                    tree.kill_at(kill_at);
                }
            }
            changed = state.changed(), if watching => {
                if changed.is_err() {
                    // The driver is gone: nothing renews the lease.
                    watching = false;
                    ended = Some(LeaseEnd::DriverStopped);
                } else {
                    let now_state = *state.borrow_and_update();
                    if let Some(d) = now_state.deadline() {
                        let d = clock.to_tokio(d);
                        deadline = Some(d);
                        write_deadline(&file, deadline);
                        if ended.is_none() && now_state.end().is_none() {
                            tree.run_until(kill_by(d, grace));
                        }
                    }
                    ended = ended.or(now_state.end());
                }
                if let Some(end) = ended {
                    watching = false;
                    write_deadline(&file, None);
                    if stop == Stop::No {
                        let now = Instant::now();
                        let kill_at = deadline
                            .map_or(now, |d| kill_by(d, grace).min(now + grace));
                        if stalled.is_none() {
                            say!(
                                "{end}; stopping the command (SIGTERM, SIGKILL in {})",
                                ms(kill_at.saturating_duration_since(now))
                            );
                        }
                        stop = terminate(&mut tree, kill_at);
                    }
                }
            }
            () = sleep_until(watchdog), if stop == Stop::No => {
                let now = Instant::now();
                let kill_at = deadline.map_or(now, |d| kill_by(d, grace));
                // After a stall the reaper has stopped the tree already (see the end).
                if stalled.is_none() {
                    say!(
                        "the lease on {:?} was not renewed in time; stopping the command \
                         (SIGTERM, SIGKILL in {}) before the safe deadline",
                        args.key,
                        ms(kill_at.saturating_duration_since(now))
                    );
                }
                stop = terminate(&mut tree, kill_at);
            }
        }
    };
    tree.close().await;
    drop((file, dir));
    match ending {
        Ok(exit) => exit_after(stop, stalled, lease, exit, &args.key),
        Err(why) => fail(&why),
    }
}

/// The exit code once the command has exited: 122 if it was being stopped for the
/// lease, or stopped by the reaper while this process was stalled; also if it exited
/// on its own but the lease no longer holds (this process was paused past the lease:
/// the command's exit and the lapse then wake the loop together, in either order, and
/// its code may only claim "ran under the lease" if that is true); else the command's
/// own code.
fn exit_after(
    stop: Stop,
    stalled: Option<OnStall>,
    lease: &LeaseHandle,
    exit: Exit,
    key: &str,
) -> u8 {
    if let Some(how) = stalled {
        let done = match how {
            OnStall::Kill => "killed the command at the deadline",
            OnStall::Freeze => "froze the command at the deadline, then killed it",
        };
        say!("leasehold was stalled past the safe deadline of the lease on {key:?}; the reaper {done}");
        return exit::LOST;
    }
    if stop != Stop::No {
        return exit::LOST;
    }
    if lost(lease) {
        say!("the lease on {key:?} lapsed while the command ran; it has exited");
        return exit::LOST;
    }
    match exit {
        Exit::Code(code) => u8::try_from(code & 0xff).unwrap_or(exit::FAILURE),
        Exit::Signal(signal) => exit::signalled(signal),
        Exit::NotStarted => {
            say!("the lease on {key:?} ended before the command could start");
            exit::LOST
        }
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

/// SIGTERM to the group now, SIGKILL to the tree at `kill_at`.
fn terminate(tree: &mut Tree, kill_at: Instant) -> Stop {
    tree.signal(Signal::SIGTERM);
    tree.kill_at(kill_at);
    Stop::Terminating(kill_at)
}

/// `d` in whole milliseconds, as messages show it.
fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use leasehold_tokio::memory::MemoryService;
    use leasehold_tokio::Config;

    use super::*;

    /// A command that exited 0 while the lease held reports 0; one that exited 0 after
    /// the lease lapsed (seen in that order when this process resumes) reports 122;
    /// so does one the reaper stopped while this process was stalled.
    #[tokio::test(start_paused = true)]
    async fn a_command_that_exits_after_the_lease_lapsed_reports_the_loss() {
        let service = Arc::new(MemoryService::new());
        let config = Config::builder(leasehold::Duration::from_secs(3))
            .build()
            .unwrap();
        let lease = leasehold_tokio::acquire(Arc::clone(&service), "k", config)
            .await
            .unwrap();
        let ok = Exit::Code(0);
        assert_eq!(exit_after(Stop::No, None, &lease, ok, "k"), 0);
        assert_eq!(
            exit_after(Stop::No, None, &lease, Exit::Signal(9), "k"),
            137
        );
        let stalled = Some(OnStall::Kill);
        assert_eq!(exit_after(Stop::No, stalled, &lease, ok, "k"), exit::LOST);
        // The service stops answering; past the safe deadline the gate refuses.
        service.stall(leasehold_tokio::memory::Scope::All);
        tokio::time::advance(std::time::Duration::from_secs(4)).await;
        assert_eq!(exit_after(Stop::No, None, &lease, ok, "k"), exit::LOST);
    }
}
