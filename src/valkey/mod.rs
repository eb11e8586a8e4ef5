//! The Valkey adapter: one self-healing connection and the per-tick observation.

pub mod conn;
pub mod observe;
pub mod tls;

pub use conn::{Connector, Session, ValkeyError};
