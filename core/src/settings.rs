//! What the `valkey-settings` container tells Valkey at run time, and when.
//!
//! Two settings change under a running Valkey and must be pushed with `CONFIG SET`: its TLS files
//! (Valkey before 9.1 keeps the certificate it started with until told to read the files again)
//! and `availability-zone` (known only once the agent has read its Node). `CONFIG SET` cannot be
//! narrowed to one parameter by an ACL, so the right lives in a container of its own, which has no
//! network peer and no API token (docs/security.md); the agent hands the zone over in a file.
//!
//! What has been applied is known per connection: a Valkey that restarted forgot its `CONFIG
//! SET`s, and a new connection may be to a Valkey that did. So a fresh connection starts with
//! nothing applied, and both settings are pushed again: reading the TLS files once more is
//! harmless, and a container that was restarted may have missed a rotation.

/// What the files say now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// A fingerprint of the TLS files' contents; `None` when Valkey reloads them itself (9.1's
    /// `tls-auto-reload-interval`) or there is no TLS, or the files cannot be read.
    pub tls: Option<u64>,
    /// The zone the agent wrote; `None` until it knows one.
    pub zone: Option<String>,
}

/// What this connection has told Valkey.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub tls: Option<u64>,
    pub zone: Option<String>,
}

/// One `CONFIG SET` to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    /// Read the TLS files again (`tls-cert-file` and its companions set to the same paths).
    Tls(u64),
    /// `availability-zone`.
    Zone(String),
}

/// The pushes due, TLS first: a certificate about to expire matters more than a zone.
pub fn due(wanted: &Wanted, applied: &Applied) -> Vec<Push> {
    let tls = wanted
        .tls
        .filter(|t| applied.tls != Some(*t))
        .map(Push::Tls);
    let zone = wanted
        .zone
        .as_deref()
        .filter(|z| !z.is_empty() && applied.zone.as_deref() != Some(*z))
        .map(|z| Push::Zone(z.to_owned()));
    tls.into_iter().chain(zone).collect()
}

impl Applied {
    /// Records a push Valkey accepted.
    pub fn record(&mut self, push: &Push) {
        match push {
            Push::Tls(t) => self.tls = Some(*t),
            Push::Zone(z) => self.zone = Some(z.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(tls: Option<u64>, zone: Option<&str>) -> Wanted {
        Wanted {
            tls,
            zone: zone.map(str::to_owned),
        }
    }

    #[test]
    fn pushes_follow_what_changed_since_this_connection_applied_it() {
        let z = |s: &str| Push::Zone(s.into());
        let cases: [(Wanted, Applied, Vec<Push>); 7] = [
            // A fresh connection: everything known is pushed, TLS first.
            (
                wanted(Some(1), Some("a")),
                Applied::default(),
                vec![Push::Tls(1), z("a")],
            ),
            // Nothing new.
            (
                wanted(Some(1), Some("a")),
                Applied {
                    tls: Some(1),
                    zone: Some("a".into()),
                },
                vec![],
            ),
            // Rotated files.
            (
                wanted(Some(2), Some("a")),
                Applied {
                    tls: Some(1),
                    zone: Some("a".into()),
                },
                vec![Push::Tls(2)],
            ),
            // A new zone.
            (
                wanted(Some(1), Some("b")),
                Applied {
                    tls: Some(1),
                    zone: Some("a".into()),
                },
                vec![z("b")],
            ),
            // No TLS to reload, no zone known yet.
            (wanted(None, None), Applied::default(), vec![]),
            // An empty zone file is no zone.
            (wanted(None, Some("")), Applied::default(), vec![]),
            // Unreadable TLS files: nothing pushed, nothing forgotten.
            (
                wanted(None, Some("a")),
                Applied {
                    tls: Some(1),
                    zone: None,
                },
                vec![z("a")],
            ),
        ];
        for (w, a, expected) in cases {
            assert_eq!(due(&w, &a), expected, "{w:?} {a:?}");
        }
    }

    #[test]
    fn a_recorded_push_is_not_due_again() {
        let w = wanted(Some(7), Some("z"));
        let mut a = Applied::default();
        for push in due(&w, &a) {
            a.record(&push);
        }
        assert!(due(&w, &a).is_empty());
    }
}
