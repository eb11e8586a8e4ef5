//! A crashed primary's held restart (`core::restart`): the Valkey container's entrypoint
//! ([`await_start`]: `await` and `install`) asks its agent ([`guard`]) whether Valkey may start,
//! so an empty primary does not come back before a replica has taken over.

pub mod await_start;
pub mod guard;
