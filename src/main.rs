//! The `valkey-sidecar` binary: parse configuration, start logging, run the agent (or `inject`,
//! `drain-check`, `await`, `install`).

use std::process::ExitCode;

use clap::FromArgMatches;
use valkey_sidecar::config::{Cli, Command, EXIT_CONFIG};

fn main() -> ExitCode {
    // `inject`, `drain-check`, `await` and `install` are tools of their own, not the agent:
    // their own arguments and exit codes.
    let matches = match valkey_sidecar::inject::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return usage_error(e),
    };
    match matches.subcommand() {
        Some(("inject", args)) => return exit(valkey_sidecar::inject::main(args)),
        Some(("drain-check", args)) => return exit(valkey_sidecar::drain::main(args)),
        Some(("await", args)) => return exit(valkey_sidecar::await_start::main(args)),
        Some(("install", args)) => return exit(valkey_sidecar::await_start::install(args)),
        _ => {}
    }
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => run(cli.agent),
    }
}

/// `--help` and `--version` are not errors; everything else clap rejects is bad configuration.
fn usage_error(e: clap::Error) -> ExitCode {
    let _ = e.print();
    if e.use_stderr() {
        exit(EXIT_CONFIG)
    } else {
        ExitCode::SUCCESS
    }
}

fn run(raw: valkey_sidecar::config::RawConfig) -> ExitCode {
    let config = match raw.validate() {
        Ok(c) => c,
        Err(e) => {
            eprint!("valkey-sidecar: {e}");
            return exit(EXIT_CONFIG);
        }
    };
    valkey_sidecar::telemetry::init(config.log_format);
    // One thread: the agent's work is small and latency-bound, and a single-threaded runtime
    // keeps its memory footprint low. Nothing here blocks the thread (file reads use tokio::fs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(valkey_sidecar::agent::run(config)),
        Err(e) => {
            eprintln!("valkey-sidecar: cannot start the runtime: {e}");
            return exit(70);
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
