//! The fault log: each chaos test appends what its scenario came to (writes acknowledged and
//! lost, the longest two-writable-primary overlap, the time to recover) as one JSON line, and the
//! benchmark's fault table (`bench faults <log>`) reads the lines back. The tests already measure
//! all of it; the log only keeps it, so the table is rerun by rerunning the tests.
//!
//! Nothing is written unless `$VALKEY_TESTKIT_FAULT_LOG` names a file: an ordinary `cargo test`
//! is unaffected. A failure to write is printed and otherwise ignored, since the log must never
//! fail a test.
//!
//! ```no_run
//! use std::time::Duration;
//! use valkey_sidecar_testkit::faults::{Outcome, record};
//!
//! record(
//!     &Outcome::new(module_path!(), "primary Valkey killed")
//!         .writes(1200, 0)
//!         .recovery(Duration::from_millis(620))
//!         .note("recovery: kill → a replica writable and labelled"),
//! );
//! ```

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow};
use serde_json::{Value, json};

/// Names the file [`record`] appends to; unset, [`record`] does nothing.
pub const FAULT_LOG_ENV: &str = "VALKEY_TESTKIT_FAULT_LOG";

/// What one run of one chaos scenario came to; `None` where the scenario does not measure it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// What was done, in a few words ("primary cut off from the apiserver").
    pub scenario: String,
    /// The test binary that ran it (`module_path!()` in an integration test).
    pub test: String,
    /// Writes the scenario's writers got acknowledged.
    pub acked: Option<usize>,
    /// Acknowledged writes the final primary does not have.
    pub lost: Option<usize>,
    /// The longest time two nodes accepted writes at once.
    pub overlap: Option<Duration>,
    /// Writes a deposed primary acknowledged after the new primary took its first write.
    pub deposed: Option<usize>,
    /// The scenario's own time to writable or healthy again; `note` says from what to what.
    pub recovery: Option<Duration>,
    /// What `recovery` measures, and whatever else the scenario measured.
    pub note: String,
    /// The agent build the scenario ran (`release` or `debug`, from the binary's path; empty when
    /// the scenario ran no agent or the log predates the field).
    pub build: String,
}

impl Outcome {
    pub fn new(test: &str, scenario: &str) -> Outcome {
        Outcome {
            scenario: scenario.into(),
            test: test.into(),
            ..Outcome::default()
        }
    }

    /// Acknowledged and lost writes.
    pub fn writes(mut self, acked: usize, lost: usize) -> Outcome {
        self.acked = Some(acked);
        self.lost = Some(lost);
        self
    }

    pub fn overlap(mut self, longest: Duration) -> Outcome {
        self.overlap = Some(longest);
        self
    }

    pub fn deposed(mut self, acks: usize) -> Outcome {
        self.deposed = Some(acks);
        self
    }

    pub fn recovery(mut self, took: Duration) -> Outcome {
        self.recovery = Some(took);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Outcome {
        self.note = note.into();
        self
    }

    fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario,
            "test": self.test,
            "acked": self.acked,
            "lost": self.lost,
            "overlap_ms": self.overlap.map(millis),
            "deposed": self.deposed,
            "recovery_ms": self.recovery.map(millis),
            "note": self.note,
            "build": self.build,
        })
    }

    fn from_json(v: &Value) -> anyhow::Result<Outcome> {
        let text = |key: &str| v.get(key).and_then(Value::as_str).unwrap_or_default();
        let scenario = text("scenario");
        if scenario.is_empty() {
            return Err(anyhow!("no scenario"));
        }
        Ok(Outcome {
            scenario: scenario.into(),
            test: text("test").into(),
            acked: count(v, "acked")?,
            lost: count(v, "lost")?,
            overlap: duration(v, "overlap_ms")?,
            deposed: count(v, "deposed")?,
            recovery: duration(v, "recovery_ms")?,
            note: text("note").into(),
            build: text("build").into(),
        })
    }
}

/// A duration as the table shows it: "0 ms", "1.5 ms", "250 ms", "3.81 s" — enough digits to
/// compare scenarios, not the nanoseconds `{:?}` prints.
pub fn show(d: Duration) -> String {
    let ms = millis(d);
    match ms {
        0.0 => "0 ms".into(),
        ms if ms < 10.0 => format!("{ms:.1} ms"),
        ms if ms < 1000.0 => format!("{ms:.0} ms"),
        ms => format!("{:.2} s", ms / 1000.0),
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// An optional count: absent or `null` is `None`, anything but a whole number an error.
fn count(v: &Value, key: &str) -> anyhow::Result<Option<usize>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(n) => {
            let n = n
                .as_u64()
                .with_context(|| format!("{key}: {n} is no count"))?;
            Ok(Some(usize::try_from(n)?))
        }
    }
}

/// An optional duration in milliseconds (fractions kept: overlaps are often below one).
fn duration(v: &Value, key: &str) -> anyhow::Result<Option<Duration>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(ms) => {
            let ms = ms
                .as_f64()
                .with_context(|| format!("{key}: {ms} is no number"))?;
            let d = Duration::try_from_secs_f64(ms / 1000.0)
                .with_context(|| format!("{key}: {ms} is no duration"))?;
            Ok(Some(d))
        }
    }
}

/// Appends `o` to the file `$VALKEY_TESTKIT_FAULT_LOG` names; does nothing when it is unset.
/// Never panics: a failure is printed to stderr, the test goes on.
pub fn record(o: &Outcome) {
    let Some(path) = std::env::var_os(FAULT_LOG_ENV) else {
        return;
    };
    let mut o = o.clone();
    if o.build.is_empty() {
        o.build = agent_build();
    }
    if let Err(e) = append(Path::new(&path), &o) {
        eprintln!(
            "fault log {}: could not record {:?}: {e:#}",
            path.to_string_lossy(),
            o.scenario
        );
    }
}

/// `release` or `debug`: the cargo profile directory the agent binary the pods run sits in (see
/// [`crate::k8s::sidecar_bin`]); `unknown` when it cannot be told.
pub fn agent_build() -> String {
    let Ok(bin) = crate::k8s::sidecar_bin() else {
        return "unknown".into();
    };
    let profile = bin.parent().and_then(|d| d.file_name());
    match profile.and_then(|p| p.to_str()) {
        Some(p @ ("release" | "debug")) => p.into(),
        _ => "unknown".into(),
    }
}

/// One `write` of one whole line to a file opened with `O_APPEND`: the kernel places each such
/// write at the end on its own, so tests running in parallel (threads or processes) cannot
/// interleave parts of their lines.
fn append(path: &Path, o: &Outcome) -> anyhow::Result<()> {
    let mut line = o.to_json().to_string();
    line.push('\n');
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(line.as_bytes())?;
    Ok(())
}

/// Every outcome in the log at `path`, in the order they were recorded; blank lines are skipped,
/// anything else that is not an outcome is an error naming its line.
pub fn read(path: &Path) -> anyhow::Result<Vec<Outcome>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the fault log {}", path.display()))?;
    parse(&text).with_context(|| format!("the fault log {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<Vec<Outcome>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).with_context(|| format!("line {}", i + 1))?;
            Outcome::from_json(&v).with_context(|| format!("line {}", i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn sample() -> Outcome {
        Outcome::new("k8s_split_brain", "primary frozen")
            .writes(1234, 0)
            .overlap(Duration::from_micros(1500))
            .recovery(Duration::from_millis(3800))
            .note("recovery: SIGSTOP → a replica promoted | labelled")
    }

    #[test]
    fn outcomes_survive_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.jsonl");
        let bare = Outcome::new("k8s_disruption", "two evictions at once");
        append(&path, &sample()).unwrap();
        append(&path, &bare).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "one line each: {text}");
        let back = read(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1], bare);
        let o = &back[0];
        assert_eq!((o.acked, o.lost), (Some(1234), Some(0)));
        let us = |d: Option<Duration>| d.map(|d| d.as_micros());
        assert_eq!(us(o.overlap), Some(1500));
        assert_eq!(us(o.recovery), Some(3_800_000));
        assert_eq!(o.note, sample().note);
    }

    #[test]
    fn durations_are_shown_to_a_useful_precision() {
        let shown = [0, 1_500, 250_400, 3_812_000].map(|us| show(Duration::from_micros(us)));
        assert_eq!(shown, ["0 ms", "1.5 ms", "250 ms", "3.81 s"]);
    }

    #[test]
    fn a_bad_line_is_named() {
        let err = parse("\n{\"scenario\":\"a\"}\n{\"scenario\":\"b\",\"lost\":-1}\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 3"), "{err:#}");
        assert!(
            parse("{\"lost\":1}").is_err(),
            "an outcome names its scenario"
        );
    }
}
