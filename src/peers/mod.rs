//! The agents' view of each other: peer heartbeats over UDP ([`heartbeat`]: pings, answers,
//! the vouches that tell a primary it is not cut off, the failsafe's promises) and cluster mode's
//! fence of a primary cut off from most primaries ([`quorum`], `core::quorum`).

pub mod heartbeat;
pub mod quorum;
