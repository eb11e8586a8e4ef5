//! The report's headline figures, written once: each section that measures one appends a row to
//! the summary log (`$BENCH_SUMMARY_LOG`, one JSON object a line), and `bench summary <log>`
//! prints them as one Markdown block between [`BEGIN`] and [`END`]. `scripts/bench.sh` puts that
//! block near the top of `docs/benchmarks.md` and, through `bench readme`, into the README, so the
//! README quotes the run's own numbers and nothing else.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::faults::cell;
use crate::report::p50_p99;

/// Names the summary log; unset, [`record`] does nothing (a section run on its own).
pub const SUMMARY_LOG_ENV: &str = "BENCH_SUMMARY_LOG";
/// A line `bench.sh` sets to name the build measured (commit, agent version, profile).
pub const BUILD_ENV: &str = "BENCH_BUILD";
pub const BEGIN: &str = "<!-- bench-summary:begin -->";
pub const END: &str = "<!-- bench-summary:end -->";

/// The summary's rows in order, by the key their sections log them under, and what each is in
/// words (for the rows a run did not measure).
pub const KEYS: [(&str, &str); 11] = [
    ("labels", "the role label after a flip (`bench labels`)"),
    ("handover", "the cluster hand-over (`bench handover`)"),
    (
        "cluster-crash",
        "a crash in cluster mode (`bench handover`)",
    ),
    (
        "replication-kill",
        "a crash in replication mode (`bench failover`)",
    ),
    (
        "replication-power-off",
        "a node cut in replication mode (`bench failover`)",
    ),
    (
        "replication-partition",
        "a partition in replication mode against Sentinel, `min-replicas-max-lag 10` (`bench partition`)",
    ),
    (
        "replication-partition-lag1",
        "a partition in replication mode against Sentinel, `min-replicas-max-lag 1` (`bench partition`)",
    ),
    (
        "cluster-partition",
        "a partition in cluster mode against Valkey alone (`bench partition`)",
    ),
    (
        "switchover",
        "the replication switchover (`bench switchover`)",
    ),
    (
        "idle",
        "the idle footprint of the agent as deployed (`bench footprint`)",
    ),
    (
        "idle-bare",
        "the idle footprint of the bare agent (`bench footprint`)",
    ),
];

/// The README's seven rows (the report has them all): the labels, the hand-over and the crash it
/// exists for, the partitions in both modes, and the rows where it is behind.
pub const README_KEYS: [&str; 7] = [
    "labels",
    "handover",
    "cluster-crash",
    "replication-power-off",
    "replication-partition",
    "cluster-partition",
    "idle",
];

/// Which block to print: the report's (every row, with the alternatives' configurations) or the
/// README's (its seven rows, without them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    Report,
    Readme,
}

impl Shape {
    fn keys(self) -> Vec<&'static str> {
        match self {
            Shape::Report => KEYS.iter().map(|(k, _)| *k).collect(),
            Shape::Readme => README_KEYS.to_vec(),
        }
    }
}

/// One figure of a side: `p50` 140 `ms`, or `RSS` 6.6 `MiB`.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    pub name: String,
    pub value: f64,
    pub unit: String,
}

/// The agent's or the alternative's side of a row.
#[derive(Clone, Debug, PartialEq)]
pub struct Side {
    pub who: String,
    pub config: String,
    pub parts: Vec<Part>,
    /// Acknowledged writes lost, and of how many, where the row counts them.
    pub lost: Option<(usize, Option<usize>)>,
}

impl Side {
    /// p50 and p99 of `samples`, in ms (µs below a millisecond).
    pub fn timing(who: &str, config: &str, samples: &[Duration]) -> Side {
        let (p50, p99) = p50_p99(samples.to_vec());
        Side::pair(who, config, p50, p99)
    }

    /// A p50 and a p99 already taken, in ms (µs below a millisecond).
    pub fn pair(who: &str, config: &str, p50: Duration, p99: Duration) -> Side {
        let micro = p99 < Duration::from_millis(1);
        let (scale, unit) = if micro { (1e6, "µs") } else { (1e3, "ms") };
        let part = |name: &str, d: Duration| Part {
            name: name.into(),
            value: d.as_secs_f64() * scale,
            unit: unit.into(),
        };
        Side {
            who: who.into(),
            config: config.into(),
            parts: vec![part("p50", p50), part("p99", p99)],
            lost: None,
        }
    }

    pub fn lost(mut self, lost: usize, acked: Option<usize>) -> Side {
        self.lost = Some((lost, acked));
        self
    }

    fn to_json(&self) -> Value {
        let parts: Vec<Value> = self
            .parts
            .iter()
            .map(|p| json!({"name": p.name, "value": p.value, "unit": p.unit}))
            .collect();
        json!({
            "who": self.who,
            "config": self.config,
            "parts": parts,
            "lost": self.lost.map(|(l, _)| l),
            "acked": self.lost.and_then(|(_, a)| a),
        })
    }

    fn from_json(v: &Value) -> Result<Side> {
        let parts = v
            .get("parts")
            .and_then(Value::as_array)
            .context("no parts")?
            .iter()
            .map(|p| {
                Ok(Part {
                    name: text(p, "name"),
                    value: p.get("value").and_then(Value::as_f64).context("no value")?,
                    unit: text(p, "unit"),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let count = |k: &str| v.get(k).and_then(Value::as_u64).map(|n| n as usize);
        Ok(Side {
            who: text(v, "who"),
            config: text(v, "config"),
            parts,
            lost: count("lost").map(|l| (l, count("acked"))),
        })
    }

    /// `140 / 250 ms; 0 of 1,200 lost`, or `6.6 MiB RSS, 0.13 % CPU`.
    fn figure(&self) -> String {
        let same_unit = self.parts.windows(2).all(|w| w[0].unit == w[1].unit);
        let percentiles = self.parts.iter().all(|p| p.name.starts_with('p'));
        let mut out = if same_unit && percentiles {
            let values: Vec<String> = self.parts.iter().map(|p| number(p.value)).collect();
            let unit = self.parts.first().map_or("", |p| p.unit.as_str());
            format!("{} {unit}", values.join(" / "))
        } else {
            let parts: Vec<String> = self
                .parts
                .iter()
                .map(|p| format!("{} {} {}", number(p.value), p.unit, p.name))
                .collect();
            parts.join(", ")
        };
        if let Some((lost, acked)) = self.lost {
            match acked {
                Some(a) => out.push_str(&format!("; {} of {} lost", grouped(lost), grouped(a))),
                None => out.push_str(&format!("; {} lost", grouped(lost))),
            }
        }
        out
    }
}

/// One headline comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// One of the [`KEYS`].
    pub key: String,
    pub measure: String,
    pub ours: Side,
    /// `None`: nothing to compare with (the planner).
    pub theirs: Option<Side>,
    pub runs: String,
    /// Why the agent is behind, printed when it is.
    pub why: String,
}

impl Row {
    fn to_json(&self) -> Value {
        json!({
            "key": self.key,
            "measure": self.measure,
            "ours": self.ours.to_json(),
            "theirs": self.theirs.as_ref().map(Side::to_json),
            "runs": self.runs,
            "why": self.why,
        })
    }

    fn from_json(v: &Value) -> Result<Row> {
        let theirs = match v.get("theirs") {
            None | Some(Value::Null) => None,
            Some(t) => Some(Side::from_json(t)?),
        };
        Ok(Row {
            key: text(v, "key"),
            measure: text(v, "measure"),
            ours: Side::from_json(v.get("ours").context("no ours")?)?,
            theirs,
            runs: text(v, "runs"),
            why: text(v, "why"),
        })
    }

    /// The alternative's figures ÷ the agent's, part by part (above 1: the agent is faster or
    /// smaller).
    fn ratios(&self) -> Vec<f64> {
        let Some(theirs) = &self.theirs else {
            return Vec::new();
        };
        self.ours
            .parts
            .iter()
            .zip(&theirs.parts)
            .filter(|(a, b)| a.unit == b.unit && a.value > 0.0)
            .map(|(a, b)| b.value / a.value)
            .collect()
    }

    /// Behind: a ratio below 1, or more acknowledged writes lost than the alternative.
    fn behind(&self) -> bool {
        let slower = self.ratios().iter().any(|r| *r < 1.0);
        let lost = |s: &Side| s.lost.map(|(l, _)| l);
        let lost_more = match (lost(&self.ours), self.theirs.as_ref().and_then(lost)) {
            (Some(ours), Some(theirs)) => ours > theirs,
            (Some(ours), None) => ours > 0,
            _ => false,
        };
        slower || lost_more
    }

    fn markdown(&self, shape: Shape) -> String {
        let ratios = self.ratios();
        let ratio = match ratios.is_empty() {
            true => "–".to_string(),
            false => ratios
                .iter()
                .map(|r| show_ratio(*r))
                .collect::<Vec<_>>()
                .join(" / "),
        };
        let (theirs, config) = match &self.theirs {
            Some(t) => (format!("{}: {}", t.who, t.figure()), t.config.clone()),
            None => ("–".into(), "–".into()),
        };
        let config = match shape {
            Shape::Report => format!(" {} |", cell(&config)),
            Shape::Readme => String::new(),
        };
        format!(
            "| {} | {} | {} |{config} {ratio} | {} |",
            cell(&self.measure),
            cell(&format!("{}: {}", self.ours.who, self.ours.figure())),
            cell(&theirs),
            cell(&self.runs)
        )
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// As the report's tables show them: whole numbers from 10 up, else one or two decimals.
fn number(v: f64) -> String {
    match v.abs() {
        a if a >= 10.0 => format!("{v:.0}"),
        a if a >= 1.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// `1,301,865`.
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `20.0×`; below 1 in bold with two decimals, the agent being behind.
fn show_ratio(r: f64) -> String {
    match r < 1.0 {
        true => format!("**{r:.2}×**"),
        false => format!("{r:.1}×"),
    }
}

/// Appends `row` to the summary log, when `$BENCH_SUMMARY_LOG` names one. A failure to write is
/// printed, not raised: the section's own output must not be lost over its summary row.
pub fn record(row: &Row) {
    let Some(path) = std::env::var_os(SUMMARY_LOG_ENV) else {
        return;
    };
    let line = row.to_json().to_string() + "\n";
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("summary log {}: {e}", Path::new(&path).display());
    }
}

/// The rows of a summary log; a later row replaces an earlier one of the same key (a rerun).
pub fn read(path: &Path) -> Result<Vec<Row>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text)
}

fn parse(text: &str) -> Result<Vec<Row>> {
    let mut rows: Vec<Row> = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line).with_context(|| format!("line {}", n + 1))?;
        let row = Row::from_json(&v).with_context(|| format!("line {}", n + 1))?;
        rows.retain(|r| r.key != row.key);
        rows.push(row);
    }
    Ok(rows)
}

/// `bench summary <log>`: the block.
pub fn run(log: &Path, shape: Shape) -> Result<()> {
    // An empty log still gives a block (every row "not measured"), so the README keeps its
    // markers whatever ran.
    let rows = read(log)?;
    let build = std::env::var(BUILD_ENV).ok();
    print!("{}", block(&rows, build.as_deref(), shape));
    Ok(())
}

/// The Markdown block, markers included: the shape's rows in its order (others are not headline
/// figures), then why the agent is behind where it is, and which rows this run did not measure.
pub fn block(rows: &[Row], build: Option<&str>, shape: Shape) -> String {
    let mut out = format!("{BEGIN}\n");
    if let Some(b) = build {
        out.push_str(&format!("Measured on {b}.\n\n"));
    }
    out.push_str(match shape {
        Shape::Report => "| measure | the agent | the alternative | the alternative's configuration | ratio | runs |\n|---|---|---|---|---|---|\n",
        Shape::Readme => "| measure | the agent | the alternative | ratio | runs |\n|---|---|---|---|---|\n",
    });
    let keys = shape.keys();
    let ordered: Vec<&Row> = keys
        .iter()
        .filter_map(|k| rows.iter().find(|r| r.key == *k))
        .collect();
    for r in &ordered {
        out.push_str(&r.markdown(shape));
        out.push('\n');
    }
    out.push_str("\nRatio: the alternative's figure ÷ the agent's, figure by figure; above 1 the agent is faster (or smaller), in bold below 1, where it is behind.\n");
    if shape == Shape::Readme {
        out.push_str("Every row, and the alternatives' settings (the same safety settings as the agent's): [the report](docs/benchmarks.md).\n");
    }
    behind(&mut out, &ordered);
    let missing: Vec<&str> = KEYS
        .iter()
        .filter(|(k, _)| keys.contains(k) && !rows.iter().any(|r| r.key == *k))
        .map(|(_, what)| *what)
        .collect();
    if !missing.is_empty() {
        out.push_str(&format!(
            "\nNot measured in this run: {}.\n",
            missing.join(", ")
        ));
    }
    out.push_str(END);
    out.push('\n');
    out
}

/// "Where the agent is behind", with each row's reason, if any row is.
fn behind(out: &mut String, rows: &[&Row]) {
    let behind: Vec<&&Row> = rows.iter().filter(|r| r.behind()).collect();
    if behind.is_empty() {
        return;
    }
    out.push_str("\nWhere the agent is behind:\n\n");
    for r in behind {
        let why = if r.why.is_empty() {
            "no reason recorded"
        } else {
            &r.why
        };
        out.push_str(&format!("- {}: {why}\n", r.measure));
    }
}

/// `text` with its block between [`BEGIN`] and [`END`] (markers included) replaced by `block`;
/// an error unless `text` has exactly one such block, so a damaged README is never half-written.
pub fn splice(text: &str, block: &str) -> Result<String> {
    let block = block.trim();
    if !block.starts_with(BEGIN) || !block.ends_with(END) {
        bail!("the new block does not run from {BEGIN} to {END}");
    }
    let (Some(start), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        bail!("no {BEGIN} … {END} block to replace");
    };
    if end < start || text.matches(BEGIN).count() != 1 || text.matches(END).count() != 1 {
        bail!("expected exactly one {BEGIN} followed by one {END}");
    }
    let after = &text[end + END.len()..];
    Ok(format!("{}{block}{after}", &text[..start]))
}

/// `bench readme <block> <readme>`: replaces the README's summary block with the report's.
pub fn readme(block_path: &Path, readme_path: &Path) -> Result<()> {
    let block = std::fs::read_to_string(block_path)
        .with_context(|| format!("reading {}", block_path.display()))?;
    let text = std::fs::read_to_string(readme_path)
        .with_context(|| format!("reading {}", readme_path.display()))?;
    let new = splice(&text, &block).with_context(|| format!("in {}", readme_path.display()))?;
    // Written in place, so the file keeps its mode.
    std::fs::write(readme_path, new).with_context(|| format!("writing {}", readme_path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    fn labels_row() -> Row {
        Row {
            key: "labels".into(),
            measure: "role label → primary after a flip".into(),
            ours: Side::timing("agent", "poll 250ms", &ms(&[100, 140, 250])),
            theirs: Some(Side::timing(
                "poller",
                "`ROLE` every 5 s",
                &ms(&[2000, 2800, 5000]),
            )),
            runs: "2".into(),
            why: "never printed: the agent is ahead".into(),
        }
    }

    fn slow_row() -> Row {
        Row {
            key: "replication-power-off".into(),
            measure: "node powered off → writable".into(),
            ours: Side::timing("agent", "lease 4s", &ms(&[3000, 4000, 4600])).lost(0, Some(1000)),
            theirs: Some(
                Side::timing("Sentinel", "down-after 1000", &ms(&[1200, 1300, 1400]))
                    .lost(5, Some(900)),
            ),
            runs: "20".into(),
            why: "the agent waits out the lease".into(),
        }
    }

    #[test]
    fn rows_survive_the_log() {
        let text = format!("{}\n\n{}\n", labels_row().to_json(), slow_row().to_json());
        assert_eq!(parse(&text).unwrap(), vec![labels_row(), slow_row()]);
    }

    #[test]
    fn a_rerun_replaces_its_row() {
        let mut again = labels_row();
        again.runs = "30".into();
        let text = format!("{}\n{}\n", labels_row().to_json(), again.to_json());
        assert_eq!(parse(&text).unwrap(), vec![again]);
    }

    #[test]
    fn the_block_orders_rows_shows_ratios_and_says_where_the_agent_is_behind() {
        let block = block(&[slow_row(), labels_row()], Some("abc1234"), Shape::Report);
        assert!(
            block.starts_with(&format!("{BEGIN}\nMeasured on abc1234.\n")),
            "{block}"
        );
        assert!(block.trim_end().ends_with(END), "{block}");
        let rows: Vec<&str> = block.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 3, "{block}");
        assert!(rows[1].starts_with("| role label"), "{block}");
        assert!(rows[1].contains("agent: 140 / 250 ms"), "{block}");
        assert!(rows[1].contains("| 20.0× / 20.0× |"), "{block}");
        assert!(rows[2].contains("0 of 1,000 lost"), "{block}");
        assert!(rows[2].contains("**0.33×** / **0.30×**"), "{block}");
        assert!(
            block.contains("- node powered off → writable: the agent waits out the lease"),
            "{block}"
        );
        assert!(!block.contains("never printed"), "{block}");
        assert!(
            block.contains("Not measured in this run: the cluster hand-over (`bench handover`),"),
            "{block}"
        );
    }

    #[test]
    fn the_readme_block_keeps_its_rows_without_the_configurations() {
        let mut switchover = labels_row();
        switchover.key = "switchover".into();
        switchover.measure = "switchover pause".into();
        let block = block(
            &[slow_row(), labels_row(), switchover],
            Some("abc1234"),
            Shape::Readme,
        );
        let rows: Vec<&str> = block.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(
            rows[0],
            "| measure | the agent | the alternative | ratio | runs |"
        );
        assert_eq!(rows.len(), 3, "the switchover is not a README row: {block}");
        assert!(rows[1].starts_with("| role label"), "{block}");
        assert!(
            !block.contains("`ROLE` every 5 s"),
            "no configuration: {block}"
        );
        assert!(
            rows[2].ends_with("| **0.33×** / **0.30×** | 20 |"),
            "{block}"
        );
        assert!(block.contains("the agent waits out the lease"), "{block}");
        assert!(
            block.contains("[the report](docs/benchmarks.md)"),
            "{block}"
        );
        assert!(
            !block.contains("the replication switchover (`bench switchover`)"),
            "only the README's rows count as missing: {block}"
        );
    }

    #[test]
    fn the_figure_of_a_footprint_names_its_parts() {
        let side = Side {
            who: "agent".into(),
            config: String::new(),
            parts: vec![
                Part {
                    name: "RSS".into(),
                    value: 6.6,
                    unit: "MiB".into(),
                },
                Part {
                    name: "CPU".into(),
                    value: 0.13,
                    unit: "%".into(),
                },
            ],
            lost: None,
        };
        assert_eq!(side.figure(), "6.6 MiB RSS, 0.13 % CPU");
        assert_eq!(Side::timing("a", "", &ms(&[0])).figure(), "0.00 / 0.00 µs");
    }

    const README: &str = "# Title\n\n## Benchmarks\n\nSee the report.\n\n<!-- bench-summary:begin -->\nold\n<!-- bench-summary:end -->\n\n## Configuration\n";

    #[test]
    fn the_splice_replaces_the_block_and_nothing_else() {
        let block = format!("{BEGIN}\n| new |\n{END}\n");
        let out = splice(README, &block).unwrap();
        assert_eq!(
            out,
            "# Title\n\n## Benchmarks\n\nSee the report.\n\n<!-- bench-summary:begin -->\n| new |\n<!-- bench-summary:end -->\n\n## Configuration\n"
        );
        // Idempotent: splicing the same block again changes nothing.
        assert_eq!(splice(&out, &block).unwrap(), out);
    }

    #[test]
    fn the_splice_refuses_a_damaged_readme_or_block() {
        let block = format!("{BEGIN}\nx\n{END}");
        assert!(splice("no markers", &block).is_err());
        let twice = format!("{README}{BEGIN}\n{END}\n");
        assert!(splice(&twice, &block).is_err());
        let reversed = format!("{END}\n{BEGIN}\n");
        assert!(splice(&reversed, &block).is_err());
        assert!(splice(README, "no markers").is_err());
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(grouped(1_301_865), "1,301,865");
        assert_eq!(grouped(12), "12");
        assert_eq!(number(3109.4), "3109");
        assert_eq!(number(47.26), "47");
        assert_eq!(number(3.22), "3.2");
        assert_eq!(number(0.134), "0.13");
    }
}
