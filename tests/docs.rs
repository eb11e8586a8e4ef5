//! The README quotes only what the current benchmark report holds: its benchmark summary is the
//! block `scripts/bench.sh` wrote into `docs/benchmarks.md` (copied verbatim between the same
//! markers), and nowhere else does it state a measured figure (a percentile, a ratio).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

const BEGIN: &str = "<!-- bench-summary:begin -->";
const END: &str = "<!-- bench-summary:end -->";

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text between the markers, and the text around them.
fn split(text: &str) -> (&str, String) {
    let (before, rest) = text.split_once(BEGIN).expect("no begin marker");
    let (block, after) = rest.split_once(END).expect("no end marker");
    assert!(!after.contains(BEGIN), "a second summary block");
    (block, format!("{before}{after}"))
}

#[test]
fn the_readme_summary_is_the_reports() {
    let report = read("docs/benchmarks.md");
    let readme = read("README.md");
    let (from_report, _) = split(&report);
    let (quoted, _) = split(&readme);
    assert_eq!(
        quoted.trim(),
        from_report.trim(),
        "README's benchmark summary differs from docs/benchmarks.md: run scripts/bench.sh (it writes both)"
    );
    assert!(
        quoted.lines().filter(|l| l.starts_with('|')).count() >= 4,
        "the summary has a table: {quoted}"
    );
}

#[test]
fn the_readme_states_no_other_measured_figure() {
    let readme = read("README.md");
    let (_, outside) = split(&readme);
    for (n, line) in outside.lines().enumerate() {
        let lower = line.to_lowercase();
        for token in ["p50", "p99", "p90", "median"] {
            assert!(
                !lower.contains(token),
                "README line {}: a measured figure outside the generated summary: {line}",
                n + 1
            );
        }
        assert!(
            !has_ratio(line),
            "README line {}: a ratio outside the generated summary: {line}",
            n + 1
        );
    }
}

/// `12×`, `1.5×`: a speed-up claim (a shape such as `3 × 2` has spaces around the sign).
fn has_ratio(line: &str) -> bool {
    let chars: Vec<char> = line.chars().collect();
    chars
        .windows(2)
        .any(|w| w[0].is_ascii_digit() && w[1] == '×')
}

#[test]
fn ratios_are_recognised() {
    assert!(has_ratio("the agent is 20.0× faster"));
    assert!(!has_ratio("3 shards × 2 replicas"));
    assert!(!has_ratio("a 3 × 2 cluster"));
}
