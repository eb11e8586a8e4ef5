//! The Valkey adapter: one self-healing connection and the per-tick observation.

mod capped;
pub mod conn;
pub mod observe;
pub mod tls;

pub use conn::{Connector, Session, ValkeyError};
