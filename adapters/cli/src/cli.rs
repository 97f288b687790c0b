//! The command line, declared with clap's derive API.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration;

/// The exit codes, for `--help`.
const EXIT_CODES: &str = "Exit codes of run: the command's own status when it ran and the lease \
held; 1 busy (--no-wait, change with -E); 122 lease lost or not renewed in time, the command was \
stopped; 124 --wait ran out; 125 leasehold failed (usage, service URL, credentials, service down \
with --no-wait); 126 command not executable; 127 command not found; 128+N the command was \
killed by signal N. Of status: 0 held, 1 free, 125 failed.";

/// What `run` gives the command and what guards it, for `run --help`.
const RUN_HELP: &str = "The command runs in its own process group with LEASEHOLD_KEY, \
LEASEHOLD_FENCE (send it with every write so the storage can reject stale holders), \
LEASEHOLD_HOLDER, and LEASEHOLD_DEADLINE_FILE: a file holding the safe deadline as Unix-epoch \
milliseconds, rewritten after every renewal (0 once the lease is lost).

On Linux a second leasehold process (the reaper) is the command's parent: it stops the whole \
process tree (setsid and double-forked descendants too, through a cgroup where it can make one) \
at the safe deadline even when leasehold itself is stopped or paused, and at once when \
leasehold dies.

A second SIGINT, SIGTERM or SIGHUP is passed on too, and SIGKILL follows after --kill-after.

Exit codes: the command's own status when it ran and the lease held; 1 busy (--no-wait, change \
with -E); 122 lease lost or not renewed in time, the command was stopped; 124 --wait ran out; \
125 leasehold failed (usage, service URL, credentials); 126 command not executable; 127 command \
not found; 128+N the command was killed by signal N.";

/// What `status` answers, for `status --help`.
const STATUS_HELP: &str = "Exit codes: 0 KEY is held; 1 KEY is free; 125 leasehold failed \
(service URL, credentials, service down).";

/// Run a command under a distributed lease (Redis or etcd), and stop it before the
/// lease can expire.
///
/// Exit codes: the command's own status when it ran and the lease held; 1 busy
/// (--no-wait); 122 lease lost, the command was stopped; 124 --wait ran out;
/// 125 leasehold failed (usage, service); 126 command not executable; 127 command
/// not found; 128+N the command was killed by signal N.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, long_about = None, after_help = EXIT_CODES)]
pub struct Cli {
    /// The lock service's URL (see the help text).
    #[arg(
        long = "service",
        env = "LEASEHOLD_SERVICE",
        global = true,
        help = "The lock service: redis://[:PASSWORD@]HOST[:PORT][/DB], rediss://… (TLS), \
                etcd+http://HOST:PORT[,HOST:PORT…] (USER:PASSWORD@ before the first host), or \
                postgres://[USER[:PASSWORD]@]HOST[:PORT][,HOST:PORT…]/DBNAME (postgresql:// too)"
    )]
    pub service: Option<String>,

    /// A PEM file of the CA that signed the server's certificate (a private CA), for
    /// rediss://, etcd+https:// and postgres://; without it the system's roots are
    /// trusted.
    #[arg(long, env = "LEASEHOLD_TLS_CA", global = true, value_name = "PEM_FILE")]
    pub tls_ca: Option<std::path::PathBuf>,

    /// A PEM file of the client certificate to present (mutual TLS: Redis's
    /// tls-auth-clients, etcd's --client-cert-auth, PostgreSQL's `cert` auth); needs
    /// --tls-key.
    #[arg(
        long,
        env = "LEASEHOLD_TLS_CERT",
        global = true,
        value_name = "PEM_FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<std::path::PathBuf>,

    /// A PEM file of the client certificate's private key; needs --tls-cert.
    #[arg(
        long,
        env = "LEASEHOLD_TLS_KEY",
        global = true,
        value_name = "PEM_FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<std::path::PathBuf>,

    /// A file whose first line is the lock service's password (instead of the URL,
    /// where `ps` shows it to every user of the machine); the environment variable
    /// LEASEHOLD_PASSWORD works too (and is not passed on to the command).
    #[arg(
        long,
        env = "LEASEHOLD_PASSWORD_FILE",
        global = true,
        value_name = "FILE"
    )]
    pub password_file: Option<std::path::PathBuf>,

    /// The longest TTL any client of this lock service asks for (the same on every
    /// client; env LEASEHOLD_MAX_TTL). After the service lost grants that may still be
    /// alive (a Redis restarted without persistence or from an older snapshot, a
    /// failover, an etcd restored from a backup, a PostgreSQL that crashed, restarted
    /// or was promoted, a new data set), it grants no free key for this long. A --ttl
    /// above it is refused.
    #[arg(long, env = "LEASEHOLD_MAX_TTL", global = true, value_parser = duration::parse, default_value = "30s")]
    pub max_ttl: Duration,

    /// Print only errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    /// More log output (-v: lease events, -vv: debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Wait for the lease on KEY, run CMD while it is held, release it when CMD exits.
    Run(RunArgs),
    /// Who holds KEY: identity, fence, remaining TTL. Exits 0 when it is held, 1 when
    /// it is free.
    Status(StatusArgs),
    /// Raise KEY's fence counter to at least N: the recovery step when storage holds
    /// fences above what the lock service would grant next.
    RaiseFence(RaiseFenceArgs),
}

#[derive(Debug, Args)]
#[command(
    override_usage = "leasehold run [OPTIONS] KEY -- CMD [ARGS]...",
    after_help = RUN_HELP
)]
pub struct RunArgs {
    /// Give up after waiting this long for the key (default: wait until granted).
    #[arg(long, value_parser = duration::parse, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,

    /// Fail at once if the key is held (like flock -n).
    #[arg(short = 'n', long)]
    pub no_wait: bool,

    /// Exit code when --no-wait finds the key held (like flock -E).
    #[arg(short = 'E', long, default_value_t = crate::exit::BUSY)]
    pub conflict_exit_code: u8,

    /// The lease's TTL: how long the service keeps the key after the last renewal.
    /// Renewals go out every TTL/3. To ride out a failover of the service (etcd: twice
    /// its election timeout; Redis Sentinel: down-after-milliseconds plus about 1 s),
    /// the TTL must exceed 2.2 × (failover + a round trip); shorter, a failover ends
    /// the lease and stops the command.
    #[arg(long, value_parser = duration::parse, default_value = "10s")]
    pub ttl: Duration,

    /// Grace between SIGTERM and SIGKILL when the lease is lost or cannot be renewed
    /// in time (default TTL/5, at most TTL/4): SIGKILL is sent no later than the safe
    /// deadline, before the service can expire the key.
    #[arg(long, value_parser = duration::parse)]
    pub kill_after: Option<Duration>,

    /// Wait in line: contenders that ask with --fair are granted the key in the order
    /// they first asked (Redis; etcd once this build offers it; refused on PostgreSQL).
    /// A contender that stops asking (killed, --wait ran out) leaves the line within
    /// its --ttl; until then a free key waits for it when it is its turn. Give --fair
    /// to every contender of the key: one without it ignores the line.
    #[arg(long)]
    pub fair: bool,

    /// Who holds the key, as contenders and `status` show it (default hostname:pid).
    #[arg(long)]
    pub identity: Option<String>,

    /// What the reaper does when the safe deadline passes without news from a stalled
    /// leasehold (stopped, paused): kill the command's tree, or freeze it (thawed if
    /// leasehold comes back with the lease still held, killed otherwise).
    #[arg(long, value_enum, default_value_t = OnStall::Kill)]
    pub on_stall: OnStall,

    /// Whether the reaper puts the command in a cgroup of its own (cgroup v2, where
    /// this machine lets it make one), which stops every descendant at once; `off`
    /// finds the descendants through /proc instead.
    #[arg(long, value_enum, env = "LEASEHOLD_CGROUP", default_value_t = CgroupMode::Auto)]
    pub cgroup: CgroupMode,

    /// The lock's name (1-256 bytes, no braces or control characters).
    pub key: String,

    /// The command and its arguments (after `--`).
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `--on-stall`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnStall {
    /// SIGKILL every process of the command's tree.
    Kill,
    /// Freeze the tree (cgroup.freeze, else SIGSTOP to every process).
    Freeze,
}

/// `--cgroup`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupMode {
    /// A cgroup v2 of the command's own where the machine allows it, else /proc.
    Auto,
    /// No cgroup: the command's descendants are found through /proc.
    Off,
}

#[derive(Debug, Args)]
#[command(after_help = STATUS_HELP)]
pub struct StatusArgs {
    /// The lock's name.
    pub key: String,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RaiseFenceArgs {
    /// The lock's name.
    pub key: String,
    /// The newest fence your storage has admitted: the next grant gets a larger one.
    pub fence: u64,
}
