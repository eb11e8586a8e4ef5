//! Every exit code of the binary and its commands, in one place: sysexits.h's where one fits, so
//! scripts and init systems can tell a configuration to fix from a dependency to wait for.

/// Done, or (`drain-check`, `inject --check`) the answer is yes.
pub const OK: i32 = 0;
/// The answer is no: `drain-check`, the node cannot be drained now; `inject --check`, the
/// manifests would change.
pub const NO: i32 = 1;
/// `EX_USAGE`: bad flags or configuration; every bad variable is named.
pub const CONFIG: i32 = 64;
/// `EX_DATAERR`: `inject` input that is not a manifest it can change.
pub const DATA: i32 = 65;
/// `EX_NOINPUT`: `inject` input that cannot be read.
pub const NO_INPUT: i32 = 66;
/// `EX_UNAVAILABLE`: Valkey, the apiserver or the signal handlers could not be had at start.
pub const UNAVAILABLE: i32 = 69;
/// `EX_SOFTWARE`: the runtime could not start.
pub const SOFTWARE: i32 = 70;
/// `EX_IOERR`: `inject` output that cannot be written.
pub const IO: i32 = 74;
/// `EX_TEMPFAIL`: `switchover` refused as unsafe now (no synced replica, one pending already);
/// try again once the cause is gone.
pub const REFUSED: i32 = 75;
/// A second signal cut the graceful stop short (128 + SIGINT, as shells report).
pub const ABORTED: i32 = 130;
