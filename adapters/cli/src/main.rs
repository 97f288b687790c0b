//! `leasehold`: run a command under a distributed lease, and stop it before the lease
//! can expire. See the crate README and `leasehold --help`.

#![deny(missing_docs)]

#[macro_use]
mod say;

mod child;
mod cli;
mod deadline;
mod duration;
mod exit;
mod private_dir;
mod progress;
#[cfg(target_os = "linux")]
mod reaper;
mod run;
mod service;
mod signals;
mod status;
mod supervise;
mod tree;

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
    /// `--quiet`.
    pub quiet: bool,
    /// `-v` (counted).
    pub verbose: u8,
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let first = argv.nth(1);
    if first.as_deref() == Some(OsStr::new(child::EXEC_HELPER)) {
        let command: Vec<_> = argv.collect();
        return ExitCode::from(child::exec_helper(&command));
    }
    #[cfg(target_os = "linux")]
    if first.as_deref() == Some(OsStr::new(reaper::REAPER)) {
        let args: Vec<_> = argv.collect();
        return ExitCode::from(reaper::main(&args));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::FAILURE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    say::set_quiet(cli.quiet);
    init_tracing(cli.quiet, cli.verbose);
    // One thread: nothing else spawns a process while `run` hands the reaper its two
    // inheritable pipe ends (see `tree::spawn`).
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
        quiet: cli.quiet,
        verbose: cli.verbose,
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
    if let Command::Run(args) = &cli.command {
        if args.ttl > cli.max_ttl {
            return run::fail(&format!(
                "--ttl {:?} is above --max-ttl {:?}: the quarantine after the lock service \
                 loses its data covers grants up to --max-ttl only; raise --max-ttl (the same \
                 on every client of this service) or lower --ttl",
                args.ttl, cli.max_ttl
            ));
        }
    }
    let down = match &cli.command {
        Command::Run(args) if !args.no_wait => service::Down::Wait,
        _ => service::Down::Fail,
    };
    let password = match service::Password::from_file_or_env(cli.password_file.as_deref()) {
        Ok(password) => password,
        Err(why) => return run::fail(&why),
    };
    let settings = service::Settings {
        tls_ca: cli.tls_ca.as_deref(),
        tls_client: cli.tls_cert.as_deref().zip(cli.tls_key.as_deref()),
        password,
        request_timeout,
        max_ttl: cli.max_ttl,
        down,
        create_tables: !matches!(cli.command, Command::Status(_)),
        fair: matches!(&cli.command, Command::Run(args) if args.fair),
    };
    let service = match service::connect(url, &settings).await {
        Ok(service) => service,
        Err(why) => return run::fail(&why),
    };
    match (&cli.command, &service) {
        (Command::Run(args), Service::Redis(s)) => run::run(s.clone(), args, output).await,
        (Command::Run(args), Service::Etcd(s)) => run::run(s.clone(), args, output).await,
        (Command::Run(args), Service::Postgres(s)) => run::run(s.clone(), args, output).await,
        (Command::Status(args), Service::Redis(s)) => {
            let waiting = async { s.waiting(&args.key).await.map_err(|e| e.to_string()) };
            status::status(&**s, &args.key, args.json, waiting).await
        }
        (Command::Status(args), Service::Etcd(s)) => {
            let waiting = async { s.waiting(&args.key).await.map_err(|e| e.to_string()) };
            status::status(&**s, &args.key, args.json, waiting).await
        }
        (Command::Status(args), Service::Postgres(s)) => {
            let nobody = async { Ok(Vec::new()) };
            status::status(&**s, &args.key, args.json, nobody).await
        }
        (Command::RaiseFence(args), _) => {
            status::raise_fence(&service, &args.key, args.fence).await
        }
    }
}

/// Logs to stderr: errors only with `--quiet`, lease events with `-v`, debug with
/// `-vv`. Without `-v` only leasehold's own warnings are shown: it prints what the
/// user must know (busy, timed out, lost, stopping the command) itself, and the
/// libraries' logs (the lease driver, the Redis and etcd services, and under them
/// tonic, h2 and the etcd client, which warn about every failed connection) would
/// repeat it in their own words. Libraries other than leasehold's log their warnings
/// from `-v` and everything from `-vvv`. A log line that cannot be written is
/// dropped (a closed stderr must not panic).
pub fn init_tracing(quiet: bool, verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let level = match (quiet, verbose) {
        (true, _) => LevelFilter::ERROR,
        (false, 0) => LevelFilter::WARN,
        (false, 1) => LevelFilter::INFO,
        (false, 2) => LevelFilter::DEBUG,
        (false, _) => LevelFilter::TRACE,
    };
    let (libraries, others) = match (quiet, verbose) {
        (true, _) | (false, 0) => (LevelFilter::OFF, LevelFilter::OFF),
        (false, 1 | 2) => (level, LevelFilter::WARN),
        (false, _) => (level, level),
    };
    // Targets match by prefix: `leasehold` is this binary (and the core, which does
    // not log), `leasehold_` every leasehold library.
    let filter = Targets::new()
        .with_default(others)
        .with_target("leasehold", level)
        .with_target("leasehold_", libraries);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false)
        .with_filter(filter);
    tracing_subscriber::registry().with(layer).init();
}
