//! Runs the exhaustive check and prints states explored, depth reached and any
//! counterexample; fails on a counterexample, and on a `sometimes` property the bounds
//! must reach (`props::required_examples`) that the run did not reach. `leasehold-model [ci|deep|small]`; environment variables
//! `LEASEHOLD_MODEL_*` override single bounds (see `Params::from_env`), and
//! `LEASEHOLD_MODEL_THREADS` sets the checker's threads (default 2).

use std::process::ExitCode;

use leasehold_model::{check, Params};

fn main() -> ExitCode {
    let base = match std::env::args().nth(1).as_deref() {
        None | Some("ci") => Params::CI,
        Some("deep") => Params::DEEP,
        Some("small") => Params::SMALL,
        Some(other) => {
            eprintln!("unknown run {other:?}: use ci, deep or small");
            return ExitCode::from(2);
        }
    };
    let params = match Params::from_env(base) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bad bounds: {e}");
            return ExitCode::from(2);
        }
    };
    let threads = std::env::var("LEASEHOLD_MODEL_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let outcome = check(params, threads, false);
    print!("{}", outcome.report());
    if outcome.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
