//! The format of the records agents share — the coordinator Lease and replication mode's shard
//! records: every write carries [`ANNOTATION`] = [`FORMAT`], and an agent reads a record only in a
//! format it knows. A record in a newer format (written by a newer agent whose fields this one
//! cannot read) is not half-understood: the agent takes no action on it, as on a record it could
//! not read at all, and says so. A record without the annotation is of the previous format (written
//! before formats were numbered), which this one reads unchanged.
//!
//! A format is raised only when a record changes in a way an older agent would misread; a release
//! that raises it reads both, so agents one release apart work together during a roll.

/// The record format this agent writes and the newest it reads.
pub const FORMAT: u32 = 1;
/// The annotation that carries a record's format.
pub const ANNOTATION: &str = "valkey.io/format";

/// Why a record is not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// Written in a newer format than [`FORMAT`].
    Newer(u32),
    /// The annotation is not a format number.
    Garbled(String),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Newer(n) => write!(
                f,
                "written in record format {n}, newer than this agent's {FORMAT}: it takes no \
                 action on it (upgrade the agent)"
            ),
            Unreadable::Garbled(v) => write!(f, "record format {v:?} is not a number"),
        }
    }
}

/// Whether a record with this format annotation (`None`: none) may be read.
pub fn check(annotation: Option<&str>) -> Result<(), Unreadable> {
    let Some(value) = annotation else {
        return Ok(());
    };
    // Bounded digits: a forged "99999999999" is garbled, not a format to compare.
    let format = (value.len() <= 9 && value.bytes().all(|b| b.is_ascii_digit()))
        .then(|| value.parse::<u32>().ok())
        .flatten()
        .ok_or_else(|| Unreadable::Garbled(value.chars().take(32).collect()))?;
    if format > FORMAT {
        return Err(Unreadable::Newer(format));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_previous_formats_are_read_newer_or_garbled_ones_are_not() {
        let cases = [
            (None, Ok(())),
            (Some("1"), Ok(())),
            (Some("0"), Ok(())),
            (Some("2"), Err(Unreadable::Newer(2))),
            (Some("999999999"), Err(Unreadable::Newer(999_999_999))),
            (
                Some("1000000000"),
                Err(Unreadable::Garbled("1000000000".into())),
            ),
            (Some(""), Err(Unreadable::Garbled(String::new()))),
            (Some("v2"), Err(Unreadable::Garbled("v2".into()))),
            (Some("-1"), Err(Unreadable::Garbled("-1".into()))),
        ];
        for (value, want) in cases {
            assert_eq!(check(value), want, "{value:?}");
        }
    }

    #[test]
    fn the_message_says_what_the_agent_does() {
        let text = Unreadable::Newer(2).to_string();
        assert!(
            text.contains("format 2, newer than this agent's 1"),
            "{text}"
        );
        assert!(text.contains("no action"), "{text}");
    }
}
