//! Output that never panics: `eprintln!` and `println!` panic when the stream is a
//! closed pipe (`leasehold … 2>&1 | head -c0`), and a supervisor that panics leaves
//! its lease and its command unguarded. Write errors are ignored: there is nobody
//! left to tell.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

/// `--quiet`: `note!` prints nothing.
static QUIET: AtomicBool = AtomicBool::new(false);

/// Sets `--quiet` for `note!`.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// A line on stderr, prefixed with `leasehold: `.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::stderr_line(format_args!($($arg)*))
    };
}

/// A line on stderr that `--quiet` suppresses: news, not errors.
macro_rules! note {
    ($($arg:tt)*) => {
        if !$crate::say::quiet() {
            $crate::say::stderr_line(format_args!($($arg)*))
        }
    };
}

/// A line on stdout (the answer of `status` and `raise-fence`).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::say::stdout_line(format_args!($($arg)*))
    };
}

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Writes `leasehold: <args>\n` to stderr, ignoring errors.
pub fn stderr_line(args: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "leasehold: {args}");
}

/// Writes `<args>\n` to stdout, ignoring errors.
pub fn stdout_line(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{args}");
    let _ = out.flush();
}
