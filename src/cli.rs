//! The binary's command line as one [`Command`]: the agent (the default, or `run`) with its
//! settings, or one of the tools — `inject`, `drain-check`, `await`, `install`, `credentials`,
//! `check` — each with its own
//! arguments and exit codes ([`crate::exit`]).

use clap::{ArgMatches, Args, CommandFactory, FromArgMatches};

use crate::await_start::{AwaitArgs, InstallArgs};
use crate::check::CheckArgs;
use crate::config::{Cli, RawConfig};
use crate::credentials::CredentialsArgs;
use crate::drain::DrainArgs;
use crate::inject::InjectArgs;

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Run the agent with these settings (validated by [`RawConfig::validate`]).
    Agent(Box<RawConfig>),
    /// A tool, with its own arguments (parsed by the tool, which returns its exit code).
    Tool(Tool, ArgMatches),
}

/// The tools beside the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Inject,
    DrainCheck,
    Await,
    Install,
    Credentials,
    Check,
}

impl Tool {
    /// Runs the tool; returns its exit code.
    pub fn run(self, args: &ArgMatches) -> i32 {
        match self {
            Tool::Inject => crate::inject::main(args),
            Tool::DrainCheck => crate::drain::main(args),
            Tool::Await => crate::await_start::main(args),
            Tool::Install => crate::await_start::install(args),
            Tool::Credentials => crate::credentials::main(args),
            Tool::Check => crate::check::main(args),
        }
    }
}

/// The whole command line: the agent's, with the tools as subcommands.
pub fn command() -> clap::Command {
    Cli::command()
        .subcommand(InjectArgs::augment_args(clap::Command::new("inject")))
        .subcommand(DrainArgs::augment_args(clap::Command::new("drain-check")))
        .subcommand(AwaitArgs::augment_args(clap::Command::new("await")).about(
            "Hold Valkey's start until the agent allows it, then become the command after --",
        ))
        .subcommand(
            InstallArgs::augment_args(clap::Command::new("install"))
                .about("Copy this binary to PATH (for the Valkey container's await)"),
        )
        .subcommand(
            CredentialsArgs::augment_args(clap::Command::new("credentials"))
                .about("Make or update the chart's auth Secret in the cluster (the chart's Job)"),
        )
        .subcommand(CheckArgs::augment_args(clap::Command::new("check")).about(
            "Is this Valkey deployment healthy: one labelled primary per shard, every pod Ready, \
             the coordinator Lease held (`helm test`)",
        ))
}

/// Parses the process's arguments; an error is clap's (usage, `--help`, `--version`).
pub fn parse() -> Result<Command, clap::Error> {
    from(command().try_get_matches()?)
}

fn from(matches: ArgMatches) -> Result<Command, clap::Error> {
    let tool = match matches.subcommand() {
        Some(("inject", args)) => Some((Tool::Inject, args)),
        Some(("drain-check", args)) => Some((Tool::DrainCheck, args)),
        Some(("await", args)) => Some((Tool::Await, args)),
        Some(("install", args)) => Some((Tool::Install, args)),
        Some(("credentials", args)) => Some((Tool::Credentials, args)),
        Some(("check", args)) => Some((Tool::Check, args)),
        _ => None,
    };
    if let Some((tool, args)) = tool {
        return Ok(Command::Tool(tool, args.clone()));
    }
    let cli = Cli::from_arg_matches(&matches)?;
    Ok(Command::Agent(Box::new(cli.agent)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> Command {
        let matches = command().try_get_matches_from(args);
        from(matches.unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_agent_is_the_default_and_run() {
        assert!(matches!(parsed(&["valkey-sidecar"]), Command::Agent(_)));
        assert!(matches!(
            parsed(&["valkey-sidecar", "run"]),
            Command::Agent(_)
        ));
    }

    #[test]
    fn each_tool_is_its_subcommand() {
        let tool = |args: &[&str]| match parsed(args) {
            Command::Tool(t, _) => Some(t),
            Command::Agent(_) => None,
        };
        assert_eq!(
            tool(&["v", "drain-check", "node-1"]),
            Some(Tool::DrainCheck)
        );
        assert_eq!(tool(&["v", "inject", "x.yaml"]), Some(Tool::Inject));
        assert_eq!(tool(&["v", "install", "/x"]), Some(Tool::Install));
    }
}
