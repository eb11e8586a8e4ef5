//! The `valkey-sidecar` binary: parse the command line, then run the agent (start logging,
//! validate its settings) or one of the tools (`inject`, `drain-check`, `await`, `install`).

use std::process::ExitCode;

use valkey_sidecar::cli::config::RawConfig;
use valkey_sidecar::cli::exit::{CONFIG, SOFTWARE};
use valkey_sidecar::cli::{self, Command};

fn main() -> ExitCode {
    match cli::parse() {
        Ok(Command::Agent(raw)) => run(*raw),
        // The tools are programs of their own: their own arguments and exit codes.
        Ok(Command::Tool(tool, args)) => exit(tool.run(&args)),
        Err(e) => usage_error(e),
    }
}

/// `--help` and `--version` are not errors; everything else clap rejects is bad configuration.
fn usage_error(e: clap::Error) -> ExitCode {
    let _ = e.print();
    if e.use_stderr() {
        exit(CONFIG)
    } else {
        ExitCode::SUCCESS
    }
}

fn run(raw: RawConfig) -> ExitCode {
    let config = match raw.validate() {
        Ok(c) => c,
        Err(e) => {
            eprint!("valkey-sidecar: {e}");
            return exit(CONFIG);
        }
    };
    valkey_sidecar::runtime::telemetry::init(config.log_format);
    // One thread: the agent's work is small and latency-bound, and a single-threaded runtime
    // keeps its memory footprint low. Nothing here blocks the thread (file reads use tokio::fs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(valkey_sidecar::agent::run(config)),
        Err(e) => {
            eprintln!("valkey-sidecar: cannot start the runtime: {e}");
            return exit(SOFTWARE);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            exit(e.exit_code())
        }
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
