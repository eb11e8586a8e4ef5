//! `bench compare <previous> <new>`: the report's last section, the figures that got worse since
//! the previous report. Rows are matched by the first cell of their table row (with the second
//! where the first repeats in its table); a row counts where both reports give it a p50 / p99
//! pair or a single recovery time, and is listed when a figure got worse by more than 10 %, with
//! the reason from [`Round::reasons`] its name points to.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use crate::summary::{BEGIN, END};

/// The heading of the section; a report is read only up to it.
pub const HEADING: &str = "## Compared with the previous report";

/// Worse by more than this share is listed.
const THRESHOLD: f64 = 0.10;

/// What changed in the benchmark itself since the previous report: why a row got worse, by a
/// substring of its name (case-insensitive; every matching reason is given), and rows renamed
/// (new name, previous name) so they are still compared. A row no reason explains is a
/// regression to look into. Emptied after every report: a reason names a change of one round.
pub struct Round {
    pub reasons: &'static [(&'static str, &'static str)],
    pub renamed: &'static [(&'static str, &'static str)],
}

/// This round: cluster mode fails a crashed primary over itself and holds its restart.
pub const THIS_ROUND: Round = Round {
    reasons: &[
        ("killed", CRASH_FAILOVER),
        ("kill -9", CRASH_FAILOVER),
        ("crash", CRASH_FAILOVER),
    ],
    renamed: &[],
};

const CRASH_FAILOVER: &str = "cluster mode: the coordinator now fails a primary whose Valkey died over at once (`CLUSTER FAILOVER FORCE` once its socket closed and refused) and the chart holds the crashed primary's restart until a replica took over; in both modes a replica that lost its primary is polled every 10 ms for 10 s, so the new primary is labelled sooner";

const NO_REASON: &str = "no change of the benchmark explains it: a regression to look into";

/// What a figure measures, which says which way is worse.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Milliseconds: more is worse.
    Time,
    /// `12.3×`, the alternative ÷ the agent: less is worse.
    Ratio,
    /// A count (acknowledged writes lost): more is worse.
    Count,
}

/// One figure of one row: its p50 and p99, or a single value as `p50`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Figure {
    kind: Kind,
    p50: f64,
    p99: Option<f64>,
}

/// (row, figure column) → the figure, for the rows that are unambiguous in their report.
type Figures = BTreeMap<(String, String), Figure>;

/// `bench compare <previous> <new>`: prints the section.
pub fn run(previous: &Path, new: &Path) -> Result<()> {
    let read =
        |p: &Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    print!("{}", section(&read(previous)?, &read(new)?));
    Ok(())
}

/// The section for two report texts, with this round's changes.
pub fn section(previous: &str, new: &str) -> String {
    section_for(previous, new, &THIS_ROUND)
}

fn section_for(previous: &str, new: &str, round: &Round) -> String {
    let mut out = format!("{HEADING}\n\n");
    let before = figures(previous);
    if before.is_empty() {
        out.push_str("No previous report with figures to compare with.\n");
        return out;
    }
    let now = figures(new);
    let mut compared = 0;
    let mut worse = Vec::new();
    for ((row, column), fig) in &now {
        let Some(old) = previous_figure(&before, row, column, round) else {
            continue;
        };
        if old.kind != fig.kind {
            continue;
        }
        compared += 1;
        worse.extend(worsened(row, column, old, *fig, round));
    }
    out.push_str(&format!(
        "Figures of rows present in both reports ({compared} compared; rows matched by their first cell) that got worse by more than 10 %, p50 and p99 each, with the change of the benchmark that explains it where one does:\n\n"
    ));
    if worse.is_empty() {
        out.push_str("None.\n");
        return out;
    }
    out.push_str("| row | figure | previous | now | change | why |\n|---|---|---|---|---|---|\n");
    for line in worse {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn previous_figure(before: &Figures, row: &str, column: &str, round: &Round) -> Option<Figure> {
    let key = |r: &str| (r.to_string(), column.to_string());
    before.get(&key(row)).copied().or_else(|| {
        let (_, old) = round.renamed.iter().find(|(new, _)| *new == row)?;
        before.get(&key(old)).copied()
    })
}

/// The lines for `row`'s figures that got worse (p50 and p99 each).
fn worsened(row: &str, column: &str, old: Figure, new: Figure, round: &Round) -> Vec<String> {
    let pairs = [
        ("p50", Some(old.p50), Some(new.p50)),
        ("p99", old.p99, new.p99),
    ];
    pairs
        .iter()
        .filter_map(|(which, a, b)| Some((*which, (*a)?, (*b)?)))
        .filter(|(_, a, b)| is_worse(new.kind, *a, *b))
        .map(|(which, a, b)| {
            let figure = match (column.is_empty(), new.p99.is_some()) {
                (true, true) => which.to_string(),
                (true, false) => "value".to_string(),
                (false, true) => format!("{column}, {which}"),
                (false, false) => column.to_string(),
            };
            format!(
                "| {row} | {figure} | {} | {} | {} | {} |",
                show(new.kind, a),
                show(new.kind, b),
                change(a, b),
                reason(row, round)
            )
        })
        .collect()
}

fn is_worse(kind: Kind, old: f64, new: f64) -> bool {
    match kind {
        Kind::Ratio => new < old * (1.0 - THRESHOLD),
        Kind::Time | Kind::Count => new > old * (1.0 + THRESHOLD) && new > old,
    }
}

fn show(kind: Kind, v: f64) -> String {
    match kind {
        Kind::Time if v < 1.0 => format!("{v:.3} ms"),
        Kind::Time => format!("{v:.0} ms"),
        Kind::Ratio => format!("{v:.1}×"),
        Kind::Count => format!("{v:.0}"),
    }
}

fn change(old: f64, new: f64) -> String {
    if old == 0.0 {
        return "from 0".into();
    }
    let pct = (new - old) / old * 100.0;
    format!("{pct:+.0} %")
}

/// Every reason whose key the row's name contains, else [`NO_REASON`].
fn reason(row: &str, round: &Round) -> String {
    let lower = row.to_lowercase();
    let mut reasons: Vec<&str> = Vec::new();
    for &(key, why) in round.reasons {
        if lower.contains(key) && !reasons.contains(&why) {
            reasons.push(why);
        }
    }
    match reasons.is_empty() {
        true => NO_REASON.into(),
        false => reasons.join("; "),
    }
}

/// Every figure of a report's tables, outside its summary block and before [`HEADING`]; rows
/// whose name repeats across the report are left out (they cannot be matched).
fn figures(report: &str) -> Figures {
    let body = report.split(HEADING).next().unwrap_or_default();
    let body = without_summary(body);
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut out = Figures::new();
    for table in tables(&body) {
        for (key, fig) in table_figures(&table) {
            *seen.entry(key.clone()).or_default() += 1;
            out.insert(key, fig);
        }
    }
    out.retain(|k, _| seen.get(k) == Some(&1));
    out
}

/// The text without the summary block: its rows repeat the detailed tables'.
fn without_summary(text: &str) -> String {
    match (text.find(BEGIN), text.find(END)) {
        (Some(a), Some(b)) if a < b => format!("{}{}", &text[..a], &text[b + END.len()..]),
        _ => text.to_string(),
    }
}

/// The Markdown tables of `text`, each as rows of cells (header first, separator dropped).
fn tables(text: &str) -> Vec<Vec<Vec<String>>> {
    let mut out: Vec<Vec<Vec<String>>> = Vec::new();
    let mut current: Vec<Vec<String>> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('|') {
            if !line.starts_with("|---") {
                current.push(cells(line));
            }
        } else if !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The cells of a table row; `\|` inside a cell is not a separator.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in inner.chars() {
        match (c, escaped) {
            ('|', false) => out.push(String::new()),
            _ => out.last_mut().into_iter().for_each(|s| s.push(c)),
        }
        escaped = c == '\\';
    }
    out.iter().map(|c| c.trim().to_string()).collect()
}

/// Which columns of a header hold figures: (column name, p50 column, p99 column); the p99
/// column is `None` for a single figure, the same column for a `p50 / p99` pair in one cell.
fn figure_columns(header: &[String]) -> Vec<(String, usize, Option<usize>)> {
    let first_word = |h: &String| h.split_whitespace().next().unwrap_or_default().to_string();
    let p50 = header.iter().position(|h| first_word(h) == "p50");
    let p99 = header.iter().position(|h| first_word(h) == "p99");
    let mut out = Vec::new();
    if let (Some(a), Some(b)) = (p50, p99) {
        out.push((String::new(), a, Some(b)));
    }
    for (i, h) in header.iter().enumerate() {
        if h.contains("p50 / p99") {
            out.push((h.clone(), i, Some(i)));
        } else if h == "recovery" {
            out.push((h.clone(), i, None));
        }
    }
    out
}

/// The unit a header names at its end (`p50 ms`, `writable p50 / p99 ms`).
fn header_unit(h: &str) -> &str {
    h.split_whitespace().last().unwrap_or_default()
}

/// The figures of one table, keyed by (row name, column name).
fn table_figures(table: &[Vec<String>]) -> Vec<((String, String), Figure)> {
    let Some((header, rows)) = table.split_first() else {
        return Vec::new();
    };
    let columns = figure_columns(header);
    if columns.is_empty() {
        return Vec::new();
    }
    let names = row_names(header, rows);
    let mut out = Vec::new();
    for (row, name) in rows.iter().zip(names) {
        let Some(name) = name else { continue };
        for (column, a, b) in &columns {
            if let Some(fig) = figure(row, header, *a, *b) {
                out.push(((name.clone(), column.clone()), fig));
            }
        }
    }
    out
}

/// Each row's name: its first cell (an empty one continues the row above; a bare number is
/// prefixed with the column's header), with the second cell added where the first repeats in
/// the table; `None` where even that repeats.
fn row_names(header: &[String], rows: &[Vec<String>]) -> Vec<Option<String>> {
    let mut last = String::new();
    let firsts: Vec<String> = rows
        .iter()
        .map(|r| {
            let first = r.first().cloned().unwrap_or_default();
            if !first.is_empty() {
                last = match first.parse::<f64>() {
                    Ok(_) => format!("{} {first}", header.first().map_or("", String::as_str)),
                    Err(_) => first,
                };
            }
            last.clone()
        })
        .collect();
    let count = |v: &[String], s: &String| v.iter().filter(|x| *x == s).count();
    let names: Vec<String> = firsts
        .iter()
        .zip(rows)
        .map(|(first, r)| match count(&firsts, first) {
            1 => first.clone(),
            _ => format!("{first} — {}", r.get(1).map_or("", String::as_str)),
        })
        .collect();
    names
        .iter()
        .map(|n| (count(&names, n) == 1).then(|| n.clone()))
        .collect()
}

/// The figure in `row` at columns `a` (p50 or the single value) and `b` (p99; the same column
/// when the cell holds `p50 / p99`).
fn figure(row: &[String], header: &[String], a: usize, b: Option<usize>) -> Option<Figure> {
    let unit = header_unit(header.get(a)?);
    let cell = row.get(a)?;
    let (p50, p99) = match b {
        Some(b) if b == a => {
            let (x, y) = cell.split_once(" / ")?;
            (value(x, unit)?, Some(value(y, unit)?))
        }
        Some(b) => (
            value(cell, unit)?,
            Some(value(row.get(b)?, header_unit(&header[b]))?),
        ),
        None => (value(cell, unit)?, None),
    };
    if p99.is_some_and(|v| v.0 != p50.0) {
        return None;
    }
    Some(Figure {
        kind: p50.0,
        p50: p50.1,
        p99: p99.map(|v| v.1),
    })
}

/// A cell's value as (kind, number in ms for times): `3109` (in the header's unit), `17.4 µs`,
/// `2.16 s`, `20.0×`, `**0.3×**`. Anything else (`–`, a sentence) is no figure.
fn value(cell: &str, header_unit: &str) -> Option<(Kind, f64)> {
    let cell = cell.trim().trim_matches('*').trim();
    let split = cell
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(cell.len());
    let (number, unit) = cell.split_at(split);
    let n: f64 = number.replace(',', "").parse().ok()?;
    let unit = match unit.trim() {
        "" => header_unit,
        u => u,
    };
    match unit {
        "×" => Some((Kind::Ratio, n)),
        "ms" => Some((Kind::Time, n)),
        "µs" => Some((Kind::Time, n / 1000.0)),
        "ns" => Some((Kind::Time, n / 1e6)),
        "s" => Some((Kind::Time, n * 1000.0)),
        // A header without a unit (`p50`) over plain numbers: counts.
        "p50" | "p99" | "" => Some((Kind::Count, n)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const PREVIOUS: &str = "# Benchmarks

### Cluster crash

| measure | runs | p50 ms | p99 ms | max ms |
|---|---|---|---|---|
| with the agents: kill -9 → replica writable | 20 | 3109 | 3845 | 3845 |
| longest write pause | 20 | 47 | 53 | 53 |

| configuration | runs | writable p50 / p99 ms | acknowledged writes lost |
|---|---|---|---|
| agent: primary's node cut (agent gone too), lease 4 s | 20 | 3954 / 4605 | 0 |
| Sentinel, `down-after-milliseconds 1000` | 20 | 1296 / 1374 | 752827 in 4 of 20 runs |

| pod | p50 | p99 |
|---|---|---|
| promoted | 20.0× | 19.9× |

| Sentinel config | measure | runs | p50 | p99 | max |
|---|---|---|---|---|---|
| `down-after 1000` | kill → writable (ms) | 20 | 1296 | 1374 | 1374 |
|  | acknowledged writes lost | 20 | 0 | 209094 | 209094 |

| shards | `plan::decide` p50 / p99 | calls |
|---|---|---|
| 10 | 17.4 µs / 29.6 µs | 2000 |

| scenario | test | recovery | note |
|---|---|---|---|
| primary's Valkey killed (cluster mode, labels) | `k8s_labels` | 3.19 s | x \\| y |
| something new-ish | `k8s_x` | 100 ms | – |
";

    const NEW: &str = "# Benchmarks

<!-- bench-summary:begin -->
| measure | the agent | p50 / p99 |
|---|---|---|
| longest write pause | a | 1 / 2 |
<!-- bench-summary:end -->

| measure | runs | p50 ms | p99 ms | max ms |
|---|---|---|---|---|
| with the agents: kill -9 → replica writable | 20 | 6100 | 6200 | 6200 |
| longest write pause | 20 | 50 | 80 | 80 |

| configuration | runs | writable p50 / p99 ms | acknowledged writes lost |
|---|---|---|---|
| agent: primary's node cut (agent gone too), lease 4 s | 20 | 3950 / 5200 | 0 |
| Sentinel, `down-after-milliseconds 1000`, `min-replicas-to-write 1`: primary's Valkey killed | 20 | 2600 / 2700 | 0 |

| pod | p50 | p99 |
|---|---|---|
| promoted | 15.0× | 19.5× |

| Sentinel config | measure | runs | p50 | p99 | max |
|---|---|---|---|---|---|
| `down-after 1000` | kill → writable (ms) | 20 | 1296 | 1374 | 1374 |
|  | acknowledged writes lost | 20 | 5 | 10 | 10 |

| shards | `plan::decide` p50 / p99 | calls |
|---|---|---|
| 10 | 17.0 µs / 40.1 µs | 2000 |

| scenario | test | recovery | note |
|---|---|---|---|
| primary's Valkey killed (cluster mode, labels) | `k8s_labels` | 6.20 s | x \\| y |
| something new-ish | `k8s_x` | 105 ms | – |

## Compared with the previous report

| row | figure | previous | now | change | why |
|---|---|---|---|---|---|
| longest write pause | p50 | 1 ms | 900 ms | x | y |
";

    fn lines(section: &str) -> Vec<&str> {
        section
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| row "))
            .collect()
    }

    const SENTINEL_MIN_REPLICAS: &str = "Sentinel's Valkeys now run `min-replicas-to-write 1` and `min-replicas-max-lag 10`, the chart's settings for ours: a promoted replica takes writes only once another replica follows it";
    const CRASH_RESTART: &str = "a crashed container is now restarted at once, as a real kubelet does (empty without persistence), and writes are read back only once it is back";
    const POWER_OFF: &str = "node faults are now real power-offs: the node's address goes silent and clients hang until their 1 s timeouts, where a SIGKILL refused them at once";
    const CHART_PODS: &str = "the pods are the chart's now: `cluster-node-timeout` 5 s instead of 2 s, probes at the chart's periods, `repl-diskless-sync-delay` 5 s, auth on";
    const WRITER_TIMEOUTS: &str = "writers now have 1 s timeouts: a write in flight to a node that went away waits up to 1 s before the writer tries the next";

    /// The round of the report of commit `e160287`, as it was: the test's reasons and renames.
    const ROUND: Round = Round {
        reasons: &[
            ("sentinel", SENTINEL_MIN_REPLICAS),
            ("killed", CRASH_RESTART),
            ("kill -9", CRASH_RESTART),
            ("sigkill", CRASH_RESTART),
            ("crash", CRASH_RESTART),
            ("node cut", POWER_OFF),
            ("power", POWER_OFF),
            ("cluster", CHART_PODS),
            ("hand-over", CHART_PODS),
            ("label", CHART_PODS),
            ("pod deleted", CHART_PODS),
            ("drain", CHART_PODS),
            ("pause", WRITER_TIMEOUTS),
        ],
        renamed: &[
            (
                "Sentinel, `down-after-milliseconds 1000`, `min-replicas-to-write 1`: primary's Valkey killed",
                "Sentinel, `down-after-milliseconds 1000`",
            ),
            (
                "Sentinel and Valkey defaults (`down-after-milliseconds 30000`, no `min-replicas-to-write`): primary's Valkey killed",
                "Sentinel, defaults (`down-after-milliseconds 30000`)",
            ),
            (
                "with the agents: kill -9 → a member writable",
                "with the agents: kill -9 → replica writable",
            ),
            (
                "Valkey alone: kill -9, restarted at once → a member writable",
                "Valkey alone: kill -9 → replica writable",
            ),
            (
                "cluster, no agent: SIGKILL, restarted at once",
                "cluster, no agent: SIGKILL",
            ),
        ],
    };

    #[test]
    fn this_round_explains_nothing_yet() {
        let out = section(PREVIOUS, NEW);
        assert!(!out.contains(SENTINEL_MIN_REPLICAS), "{out}");
        assert!(out.contains(NO_REASON), "{out}");
    }

    #[test]
    fn lists_what_got_worse_with_its_reason() {
        let out = section_for(PREVIOUS, NEW, &ROUND);
        assert!(out.starts_with(HEADING), "{out}");
        let rows = lines(&out);
        let expected = [
            format!("| Sentinel, `down-after-milliseconds 1000`, `min-replicas-to-write 1`: primary's Valkey killed | writable p50 / p99 ms, p50 | 1296 ms | 2600 ms | +101 % | {SENTINEL_MIN_REPLICAS}; {CRASH_RESTART} |"),
            format!("| Sentinel, `down-after-milliseconds 1000`, `min-replicas-to-write 1`: primary's Valkey killed | writable p50 / p99 ms, p99 | 1374 ms | 2700 ms | +97 % | {SENTINEL_MIN_REPLICAS}; {CRASH_RESTART} |"),
            "| `down-after 1000` — acknowledged writes lost | p50 | 0 | 5 | from 0 | no change of the benchmark explains it: a regression to look into |".to_string(),
            format!("| agent: primary's node cut (agent gone too), lease 4 s | writable p50 / p99 ms, p99 | 4605 ms | 5200 ms | +13 % | {POWER_OFF} |"),
            format!("| longest write pause | p99 | 53 ms | 80 ms | +51 % | {WRITER_TIMEOUTS} |"),
            format!("| primary's Valkey killed (cluster mode, labels) | recovery | 3190 ms | 6200 ms | +94 % | {CRASH_RESTART}; {CHART_PODS} |"),
            "| promoted | p50 | 20.0× | 15.0× | -25 % | no change of the benchmark explains it: a regression to look into |".to_string(),
            "| shards 10 | `plan::decide` p50 / p99, p99 | 0.030 ms | 0.040 ms | +35 % | no change of the benchmark explains it: a regression to look into |".to_string(),
            format!("| with the agents: kill -9 → replica writable | p50 | 3109 ms | 6100 ms | +96 % | {CRASH_RESTART} |"),
            format!("| with the agents: kill -9 → replica writable | p99 | 3845 ms | 6200 ms | +61 % | {CRASH_RESTART} |"),
        ];
        let mut want: Vec<&str> = expected.iter().map(String::as_str).collect();
        let mut got = rows.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "{out}");
        // Within 10 %, improved, or in the summary block / the old comparison: not listed.
        assert!(!out.contains("something new-ish"), "{out}");
        assert!(!out.contains("900 ms"), "{out}");
    }

    #[test]
    fn nothing_to_compare_says_so() {
        assert!(section("", NEW).contains("No previous report"));
        let same = section(NEW, NEW);
        assert!(same.contains("None."), "{same}");
        assert!(lines(&same).is_empty(), "{same}");
    }

    #[test]
    fn cells_keep_escaped_pipes() {
        assert_eq!(cells("| a | b \\| c | d |"), ["a", "b \\| c", "d"]);
    }

    #[test]
    fn values_carry_their_units() {
        assert_eq!(value("17.4 µs", "p50"), Some((Kind::Time, 0.0174)));
        assert_eq!(value("2.16 s", "recovery"), Some((Kind::Time, 2160.0)));
        assert_eq!(value("**0.3×**", "p50"), Some((Kind::Ratio, 0.3)));
        assert_eq!(value("3109", "ms"), Some((Kind::Time, 3109.0)));
        assert_eq!(value("–", "ms"), None);
        assert_eq!(value("no replica accepted a write within 10 s", "ms"), None);
    }
}
