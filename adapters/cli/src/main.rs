//! `leasehold`: run a command under a distributed lease, and stop it before the lease
//! can expire. See the crate README and `leasehold --help`.

#![deny(missing_docs)]

mod child;
mod cli;
mod deadline;
mod duration;
mod exit;
mod progress;
mod run;
mod service;
mod signals;
mod status;

use std::ffi::OsStr;
use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser as _;

use crate::cli::{Cli, Command};
use crate::service::Service;

/// How much to say on stderr.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// Show the one-line wait display (stderr is a terminal and not `--quiet`).
    pub progress: bool,
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    if argv.nth(1).as_deref() == Some(OsStr::new(child::EXEC_HELPER)) {
        let command: Vec<_> = argv.collect();
        return ExitCode::from(child::exec_helper(&command));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::FAILURE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_tracing(cli.quiet, cli.verbose);
    // One thread: the command is spawned from the main thread, which lives as long as
    // the process, so the parent-death signal fires only when leasehold dies.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return ExitCode::from(run::fail(&format!("cannot start the runtime: {e}"))),
    };
    ExitCode::from(runtime.block_on(dispatch(cli)))
}

async fn dispatch(cli: Cli) -> u8 {
    let Some(url) = cli.service.as_deref() else {
        return run::fail("no lock service: give --service URL or set LEASEHOLD_SERVICE");
    };
    let output = Output {
        progress: !cli.quiet && std::io::stderr().is_terminal(),
    };
    // Requests are bounded like the lease's own (TTL/10), at least 100 ms.
    let request_timeout = match &cli.command {
        Command::Run(args) => match run::settings(args) {
            Ok((config, _)) => {
                std::time::Duration::from_micros(config.request_timeout().as_micros())
            }
            Err(why) => return run::fail(&why),
        },
        _ => std::time::Duration::from_secs(2),
    }
    .max(std::time::Duration::from_millis(100));
    let service = match service::connect(url, cli.tls_ca.as_deref(), request_timeout).await {
        Ok(service) => service,
        Err(why) => return run::fail(&why),
    };
    match (&cli.command, &service) {
        (Command::Run(args), Service::Redis(s)) => run::run(s.clone(), args, output).await,
        (Command::Run(args), Service::Etcd(s)) => run::run(s.clone(), args, output).await,
        (Command::Status(args), Service::Redis(s)) => {
            status::status(&**s, &args.key, args.json).await
        }
        (Command::Status(args), Service::Etcd(s)) => {
            status::status(&**s, &args.key, args.json).await
        }
        (Command::RaiseFence(args), _) => {
            status::raise_fence(&service, &args.key, args.fence).await
        }
    }
}

/// Logs to stderr: errors only with `--quiet`, lease events with `-v`, debug with
/// `-vv`. Without `-v` the lease driver's own log is off: leasehold prints what the
/// user must know (busy, timed out, lost, stopping the command) itself.
fn init_tracing(quiet: bool, verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let level = match (quiet, verbose) {
        (true, _) => LevelFilter::ERROR,
        (false, 0) => LevelFilter::WARN,
        (false, 1) => LevelFilter::INFO,
        (false, 2) => LevelFilter::DEBUG,
        (false, _) => LevelFilter::TRACE,
    };
    let driver = if verbose == 0 {
        LevelFilter::OFF
    } else {
        level
    };
    let filter = Targets::new()
        .with_default(level)
        .with_target("leasehold_tokio", driver);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    tracing_subscriber::registry().with(layer).init();
}
