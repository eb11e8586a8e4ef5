//! Reading `INFO` / `CLUSTER INFO` text.

/// The value of `key` in `INFO`-style text (`key:value` lines; `#` section headers and blank lines
/// are skipped). `None` if absent.
///
/// ```
/// let info = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n";
/// assert_eq!(valkey_sidecar_testkit::info_field(info, "master_link_status"), Some("up"));
/// ```
pub fn info_field<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    info.lines()
        .filter_map(|line| line.trim_end().split_once(':'))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::info_field;

    #[test]
    fn finds_fields_and_ignores_headers() {
        let info = "# Server\r\nprocess_id:42\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n";
        assert_eq!(info_field(info, "process_id"), Some("42"));
        assert_eq!(info_field(info, "cluster_enabled"), Some("1"));
        assert_eq!(info_field(info, "# Server"), None);
        assert_eq!(info_field(info, "missing"), None);
    }

    #[test]
    fn keeps_colons_inside_values() {
        let info = "slave0:ip=127.0.0.1,port=7001,state=online\n";
        assert_eq!(
            info_field(info, "slave0"),
            Some("ip=127.0.0.1,port=7001,state=online")
        );
    }
}
