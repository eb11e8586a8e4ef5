//! The binary's command line as one [`Command`]: the agent (the default, or `run`) with its
//! settings, or one of the tools — `inject`, `drain-check`, `await`, `install`, `credentials`,
//! `valkey-config`, `valkey-settings`, `check`, `status`, `pause`, `resume`, `switchover` — each with its own arguments and exit codes ([`crate::cli::exit`]).

pub mod config;
pub mod exit;
pub mod features;

use clap::{ArgMatches, Args, CommandFactory, FromArgMatches};

use crate::cli::config::{Cli, RawConfig};
use crate::commands::check::CheckArgs;
use crate::commands::credentials::CredentialsArgs;
use crate::commands::drain::DrainArgs;
use crate::commands::operate::{PauseArgs, ResumeArgs, SwitchoverArgs};
use crate::commands::settings::SettingsArgs;
use crate::commands::status::StatusArgs;
use crate::commands::valkey_config::ValkeyConfigArgs;
use crate::inject::InjectArgs;
use crate::restart::await_start::{AwaitArgs, InstallArgs};

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
    ValkeyConfig,
    ValkeySettings,
    Check,
    Status,
    Pause,
    Resume,
    Switchover,
}

impl Tool {
    /// Runs the tool; returns its exit code.
    pub fn run(self, args: &ArgMatches) -> i32 {
        match self {
            Tool::Inject => crate::inject::main(args),
            Tool::DrainCheck => crate::commands::drain::main(args),
            Tool::Await => crate::restart::await_start::main(args),
            Tool::Install => crate::restart::await_start::install(args),
            Tool::Credentials => crate::commands::credentials::main(args),
            Tool::ValkeyConfig => crate::commands::valkey_config::main(args),
            Tool::ValkeySettings => crate::commands::settings::main(args),
            Tool::Check => crate::commands::check::main(args),
            Tool::Status => crate::commands::status::main(args),
            Tool::Pause => crate::commands::operate::pause(args),
            Tool::Resume => crate::commands::operate::resume(args),
            Tool::Switchover => crate::commands::operate::switchover(args),
        }
    }
}

/// The live role label the agents keep, as the read-only tools (`drain-check`, `check`) take it.
#[derive(Debug, Clone, Args)]
pub struct RoleLabelArgs {
    /// The live role label the agents keep.
    #[arg(long, default_value = "valkey.io/role")]
    pub role_label: String,
    /// Its values, `<primary>,<replica>` (the agents' `SIDECAR_ROLE_VALUES`).
    #[arg(long, default_value = "primary,replica", value_parser = crate::cli::config::parse_role_values)]
    pub role_values: (String, String),
}

impl RoleLabelArgs {
    /// The agents' label policy, as far as the role goes.
    pub fn policy(&self) -> valkey_sidecar_core::labels::LabelPolicy {
        valkey_sidecar_core::labels::LabelPolicy {
            role_key: self.role_label.clone(),
            primary_value: self.role_values.0.clone(),
            replica_value: self.role_values.1.clone(),
            ..Default::default()
        }
    }
}

/// The frame of the tools that ask the API (`drain-check`, `credentials`, `check`): their
/// arguments (64 when bad), a one-thread runtime, and 69 with the error when the API or the
/// runtime cannot be had. `body` returns the exit code, or the error to print.
pub fn api_tool<A, F, Fut>(name: &str, matches: &ArgMatches, body: F) -> i32
where
    A: FromArgMatches,
    F: FnOnce(A) -> Fut,
    Fut: std::future::Future<Output = Result<i32, String>>,
{
    let args = match A::from_arg_matches(matches) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return crate::cli::exit::CONFIG;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(rt) => rt.block_on(body(args)),
        Err(e) => Err(e.to_string()),
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("valkey-sidecar {name}: {e}");
        crate::cli::exit::UNAVAILABLE
    })
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
        .subcommand(
            ValkeyConfigArgs::augment_args(clap::Command::new("valkey-config"))
                // The name before `maxmemory` joined: manifests rendered by older charts use it.
                .alias("valkey-auth")
                .about(
                    "Write the file Valkey includes: password hashes, the replication user, \
                     maxmemory from the memory limit (the chart's init container)",
                ),
        )
        .subcommand(
            SettingsArgs::augment_args(clap::Command::new("valkey-settings")).about(
                "Tell Valkey what changes under it: TLS files read again when rotated, the \
                 agent's zone as availability-zone (the chart's valkey-settings container, the \
                 pod's only holder of CONFIG SET)",
            ),
        )
        .subcommand(
            StatusArgs::augment_args(clap::Command::new("status")).about(
                "Show a Valkey deployment: each shard's pods with role, readiness, zone, node and \
             revision, the coordinator and its status, a roll in progress (also `kubectl \
             valkey-sidecar status` with this binary on PATH as `kubectl-valkey_sidecar`)",
            ),
        )
        .subcommand(PauseArgs::augment_args(clap::Command::new("pause")).about(
            "Maintenance mode: the coordinator makes no move of its own choosing (no fail-back, \
             balance, roll step or cordon hand-over) until `resume`; it still hands over the \
             primary of a pod being deleted, fails over a primary whose Valkey died, and makes \
             switchovers asked for. Labels and probes keep working",
        ))
        .subcommand(ResumeArgs::augment_args(clap::Command::new("resume")).about("End a pause"))
        .subcommand(
            SwitchoverArgs::augment_args(clap::Command::new("switchover")).about(
                "A planned, lossless hand-over of one shard's primary, made by the coordinator \
                 (to --to, else the best synced replica); waits for its answer. Exit 75 when \
                 refused as unsafe",
            ),
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
        Some(("valkey-config", args)) => Some((Tool::ValkeyConfig, args)),
        Some(("valkey-settings", args)) => Some((Tool::ValkeySettings, args)),
        Some(("check", args)) => Some((Tool::Check, args)),
        Some(("status", args)) => Some((Tool::Status, args)),
        Some(("pause", args)) => Some((Tool::Pause, args)),
        Some(("resume", args)) => Some((Tool::Resume, args)),
        Some(("switchover", args)) => Some((Tool::Switchover, args)),
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
        assert_eq!(tool(&["v", "pause", "--reason", "x"]), Some(Tool::Pause));
        assert_eq!(
            tool(&["v", "switchover", "--shard", "1", "--to", "p"]),
            Some(Tool::Switchover)
        );
    }
}
