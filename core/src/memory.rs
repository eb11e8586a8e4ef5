//! `maxmemory` from the Valkey container's memory limit. Valkey counts only its dataset (and
//! normal clients' buffers) against `maxmemory`; what it does not count still lives in the same
//! cgroup: the replicas' output buffers and the backlog, the copy-on-write pages of a full sync's
//! fork (diskless or not, the child forks the dataset), the allocator's fragmentation and the
//! process itself. So Valkey gets a share of the limit, never all of it, and a growing dataset is
//! refused (`OOM command not allowed`) or evicted before the kernel kills the container.

/// The share of the limit Valkey gets by default, in percent.
pub const DEFAULT_PERCENT: u8 = 75;
/// Below this a share leaves Valkey almost nothing; above it too little for a full sync's fork.
pub const PERCENT_RANGE: std::ops::RangeInclusive<u8> = 10..=95;

/// `percent` of `limit` bytes, rounded down, without overflow for any limit.
pub fn maxmemory(limit: u64, percent: u8) -> u64 {
    let p = u64::from(percent);
    limit / 100 * p + limit % 100 * p / 100
}

/// The limit as the downward API gives it (`resourceFieldRef`, divisor 1: whole bytes).
pub fn parse_limit(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("a memory limit of 0 bytes".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a number of bytes")),
    }
}

/// The configuration line Valkey includes.
pub fn maxmemory_conf(bytes: u64) -> String {
    format!("maxmemory {bytes}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_the_limit_rounded_down() {
        let mib = 1024 * 1024;
        assert_eq!(maxmemory(256 * mib, 75), 192 * mib);
        assert_eq!(maxmemory(101, 50), 50);
        assert_eq!(maxmemory(u64::MAX, 95), u64::MAX / 100 * 95 + 15 * 95 / 100);
    }

    #[test]
    fn the_limit_is_whole_bytes() {
        assert_eq!(parse_limit("268435456\n"), Ok(268_435_456));
        assert!(parse_limit("256Mi").is_err());
        assert!(parse_limit("0").is_err());
        assert!(parse_limit("").is_err());
    }
}
