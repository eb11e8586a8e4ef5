//! The tools the binary carries beside the agent, each its own subcommand: `drain-check`
//! ([`drain`]), the chart's credentials Job ([`credentials`]), Valkey's init container
//! ([`valkey_config`]) and its settings container ([`settings`]), the chart's `helm test`
//! ([`check`]), `status` ([`status`]), and `pause`, `resume` and `switchover` ([`operate`],
//! requests on the coordinator Lease).

pub mod check;
pub mod credentials;
pub mod drain;
pub mod operate;
pub mod settings;
pub mod status;
pub mod valkey_config;
