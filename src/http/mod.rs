//! The HTTP listeners: probes, role endpoints, status and metrics.
//!
//! Every answer is computed from the cached health state; no handler talks to Valkey or to the
//! Kubernetes API, so a blocked Valkey cannot stall a kubelet probe. The admin listener (loopback
//! only) serves the same routes and, in later versions, the mutating ones.

mod routes;
mod server;
mod status;

pub use routes::App;
pub use server::serve;
