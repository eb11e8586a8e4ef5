//! `INFO` text into fields.
//!
//! INFO is `key:value` lines grouped under `# Section` headers. Keys are unique across the
//! sections the agent asks for, so sections are dropped and the fields kept in one map.

use std::collections::BTreeMap;

/// The fields of one `INFO` reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    fields: BTreeMap<String, String>,
}

impl Info {
    /// Parses INFO text; lines that are not `key:value` are ignored rather than rejected, so a
    /// field added by a future Valkey never breaks the agent.
    pub fn parse(text: &str) -> Info {
        let fields = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Info { fields }
    }

    /// One field of INFO-style text (`key:value` lines), found without building a map of them
    /// all: for a reply read for one or two fields.
    pub fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// `key` as an unsigned integer.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.parse().ok()
    }

    /// `key` as a signed integer (some fields, e.g. `master_last_io_seconds_ago`, can be -1).
    pub fn i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.parse().ok()
    }

    /// `key` as a `0|1` flag.
    pub fn flag(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        }
    }

    /// Every field whose key starts with `prefix`, in key order (e.g. `slave0`, `slave1`).
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.fields
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Splits an INFO sub-record such as `ip=10.0.0.1,port=6379,state=online` into pairs.
pub fn record(value: &str) -> BTreeMap<&str, &str> {
    value
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_across_sections() {
        let info = Info::parse(
            "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\r\n# Persistence\r\nloading:0\r\n",
        );
        assert_eq!(info.get("role"), Some("master"));
        assert_eq!(info.u64("connected_slaves"), Some(1));
        assert_eq!(info.flag("loading"), Some(false));
        assert_eq!(info.get("missing"), None);
    }

    #[test]
    fn values_may_contain_colons() {
        let info = Info::parse("executable:/usr/bin/valkey:server\n");
        assert_eq!(info.get("executable"), Some("/usr/bin/valkey:server"));
    }

    #[test]
    fn prefix_iterates_in_order() {
        let info = Info::parse("slave1:b\nslave0:a\nslave_read_only:1\nrole:slave\n");
        let got: Vec<_> = info.with_prefix("slave").map(|(k, _)| k).collect();
        assert_eq!(got, vec!["slave0", "slave1", "slave_read_only"]);
    }

    #[test]
    fn records_split_into_pairs() {
        let r = record("ip=127.0.0.1,port=7001,state=online,offset=42,lag=0");
        assert_eq!(r.get("port"), Some(&"7001"));
        assert_eq!(r.get("offset"), Some(&"42"));
    }
}
