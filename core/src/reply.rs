//! A Valkey reply as plain data.
//!
//! The adapter converts the client library's value type into [`Reply`], so parsers here do not
//! depend on any client crate and fixtures captured from a real server can be replayed in tests.

/// One RESP value. Bulk and simple strings are both [`Reply::Text`]: no rule here cares which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Text(String),
    Error(String),
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// The text of a string reply.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Reply::Text(s) => Some(s),
            _ => None,
        }
    }

    /// An integer reply, or a string reply holding an integer (RESP2 sends some numbers as text).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            Reply::Text(s) => s.parse().ok(),
            _ => None,
        }
    }

    /// The elements of an array reply.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The error message of an error reply.
    pub fn as_error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    /// Key/value pairs of a map: a RESP3 map, or a RESP2 flat array `[k1, v1, k2, v2, ...]`.
    pub fn pairs(&self) -> Vec<(&str, &Reply)> {
        match self {
            Reply::Map(entries) => entries
                .iter()
                .filter_map(|(k, v)| Some((k.as_text()?, v)))
                .collect(),
            Reply::Array(items) => items
                .chunks_exact(2)
                .filter_map(|kv| Some((kv[0].as_text()?, &kv[1])))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The value under `key` in a map-like reply (see [`Reply::pairs`]).
    pub fn get(&self, key: &str) -> Option<&Reply> {
        self.pairs()
            .into_iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Reply {
        Reply::Text(s.into())
    }

    #[test]
    fn flat_arrays_read_as_maps() {
        let r = Reply::Array(vec![
            t("port"),
            Reply::Int(7),
            t("ip"),
            t("127.0.0.1"),
            t("odd"),
        ]);
        assert_eq!(r.get("port").and_then(Reply::as_int), Some(7));
        assert_eq!(r.get("ip").and_then(Reply::as_text), Some("127.0.0.1"));
        assert_eq!(r.get("odd"), None);
    }

    #[test]
    fn resp3_maps_read_as_maps() {
        let r = Reply::Map(vec![(t("role"), t("master"))]);
        assert_eq!(r.get("role").and_then(Reply::as_text), Some("master"));
    }

    #[test]
    fn numbers_in_text_parse() {
        assert_eq!(t("42").as_int(), Some(42));
        assert_eq!(t("x").as_int(), None);
        assert_eq!(Reply::Nil.as_int(), None);
    }
}
