//! The README quotes only what the current benchmark report holds: its benchmark summary is the
//! block `scripts/bench.sh` wrote into `docs/benchmarks.md` (copied verbatim between the same
//! markers), and nowhere else does it state a measured figure (a percentile, a ratio).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

const BEGIN: &str = "<!-- bench-summary:begin -->";
const END: &str = "<!-- bench-summary:end -->";

fn read(path: &str) -> String {
    let path = valkey_sidecar_testkit::repo_root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text between the markers, and the text around them.
fn split(text: &str) -> (&str, String) {
    let (before, rest) = text.split_once(BEGIN).expect("no begin marker");
    let (block, after) = rest.split_once(END).expect("no end marker");
    assert!(!after.contains(BEGIN), "a second summary block");
    (block, format!("{before}{after}"))
}

/// The README's block is the report's, cut down: the same build line, and every row one of the
/// report's (same measure) with only some of its cells.
#[test]
fn the_readme_summary_is_the_reports() {
    let report = read("docs/benchmarks.md");
    let readme = read("README.md");
    let (from_report, _) = split(&report);
    let (quoted, _) = split(&readme);
    let build = |block: &str| {
        block
            .lines()
            .find(|l| l.starts_with("Measured on"))
            .map(str::to_owned)
    };
    let stale = "README's benchmark summary differs from docs/benchmarks.md: run scripts/bench.sh (it writes both)";
    assert_eq!(build(quoted), build(from_report), "{stale}");
    let rows = table_rows(quoted);
    assert!(rows.len() >= 4, "the summary has a table: {quoted}");
    for row in rows {
        let theirs = table_rows(from_report)
            .into_iter()
            .find(|r| r[0] == row[0])
            .unwrap_or_else(|| panic!("{stale}: no report row {}", row[0]));
        for cell in &row {
            assert!(
                theirs.contains(cell),
                "{stale}: {cell} is not in the report's row {theirs:?}"
            );
        }
    }
}

/// The cells of every table row, header included.
fn table_rows(block: &str) -> Vec<Vec<String>> {
    block
        .lines()
        .filter(|l| l.starts_with("| "))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
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

/// `docs/configuration.md`'s settings table names every variable the agent reads, nothing more,
/// and each default as clap has it (a cell may go on after the default, e.g. what the chart sets).
#[test]
fn the_configuration_table_is_the_agents_settings() {
    use clap::CommandFactory;
    let documented = settings_table(&read("docs/configuration.md"));
    let command = valkey_sidecar::cli::config::Cli::command();
    let mut from_clap = Vec::new();
    for arg in command.get_arguments() {
        let Some(env) = arg.get_env() else { continue };
        let env = env.to_string_lossy().into_owned();
        let default = arg
            .get_default_values()
            .first()
            .map(|d| d.to_string_lossy().into_owned());
        from_clap.push(env.clone());
        let cell = documented
            .iter()
            .find(|(name, _)| *name == env)
            .unwrap_or_else(|| panic!("{env} is a setting but not in docs/configuration.md"));
        if let Some(default) = default {
            assert!(
                cell.1.starts_with(&format!("`{default}`")),
                "{env}: clap's default is `{default}`, the docs say {}",
                cell.1
            );
        }
    }
    for (name, _) in &documented {
        assert!(
            from_clap.contains(name),
            "docs/configuration.md names {name}, which the agent does not read"
        );
    }
    assert!(
        documented.len() >= 40,
        "the table was not read: {documented:?}"
    );
}

/// (variable, default cell) for every row of the settings table; a row `A` / `B` with defaults
/// `x` / `y` gives two.
fn settings_table(doc: &str) -> Vec<(String, String)> {
    let section = doc.split("## Settings").nth(1).expect("a Settings section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let names: Vec<&str> = cells[0].trim_start_matches("| ").split(" / ").collect();
        let defaults: Vec<&str> = cells[1].split(" / ").collect();
        for (i, name) in names.iter().enumerate() {
            let default = if defaults.len() == names.len() {
                defaults[i]
            } else {
                cells[1]
            };
            out.push((name.trim_matches('`').to_string(), default.to_string()));
        }
    }
    out
}

/// Every path the README's "Where things live" table names exists.
#[test]
fn the_readme_map_names_real_paths() {
    let readme = read("README.md");
    let table = readme
        .split("## Where things live")
        .nth(1)
        .expect("the section");
    let table = table.split("\n## ").next().unwrap_or(table);
    let mut checked = 0;
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split(" | ").next().unwrap_or_default();
        for path in first.split('`').skip(1).step_by(2) {
            let full = valkey_sidecar_testkit::repo_root().join(path);
            assert!(full.exists(), "README names {path}, which does not exist");
            checked += 1;
        }
    }
    assert!(checked >= 8, "the table was not read");
}

/// Every file or directory the architecture document and the contributor's guide name in code
/// spans (`src/k8s/lease.rs`, `core/tests/`, `scripts/bench.sh`) exists, and every module of the
/// crate map's `src/` rows (`k8s::{labeler, lease}`) is a file or directory of `src/`: a move that
/// forgets the map fails here.
#[test]
fn the_architecture_and_the_guide_name_real_paths() {
    let roots = [
        "src/",
        "core/",
        "tests/",
        "testkit/",
        "bench/",
        "scripts/",
        "charts/",
        "docs/",
        "examples/",
    ];
    let root = valkey_sidecar_testkit::repo_root();
    let mut checked = 0;
    for doc in ["docs/architecture.md", "CONTRIBUTING.md"] {
        let text = read(doc);
        let spans = text.split('`').skip(1).step_by(2);
        let paths = spans.filter(|p| roots.iter().any(|r| p.starts_with(r)));
        // Patterns and placeholders (`tests/k8s_<concern>.rs`, `docs/plots/*.svg`) name no file.
        let plain = paths.filter(|p| !p.contains(['<', '*', ' ', '{']));
        for path in plain {
            let path = path.trim_end_matches([':', ',', '.', ')']);
            assert!(
                root.join(path).exists(),
                "{doc} names {path}, which does not exist"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} paths read");
    let map = read("docs/architecture.md");
    let (_, core) = map
        .split_once("**`core/` (`valkey-sidecar-core`)**")
        .expect("core's map");
    let (core, agent) = core
        .split_once("**root (`valkey-sidecar`)**")
        .expect("the agent's map");
    let modules = crate_map_modules(core, &root.join("core/src"))
        + crate_map_modules(agent, &root.join("src"));
    assert!(modules >= 8, "only {modules} modules of the crate map read");
}

/// Checks the first column of one crate map's table (`a`, `b::c`, `d::{e, f}`, `g` (`mod`)) against
/// the files under `src`; how many modules it named.
fn crate_map_modules(map: &str, src: &Path) -> usize {
    let table = map
        .split("\n\n")
        .find(|t| t.contains("| Module |"))
        .expect("a table");
    let mut modules = 0;
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split(" | ").next().unwrap_or_default();
        for span in first.split('`').skip(1).step_by(2).filter(|s| *s != "mod") {
            let (dir, names) = match span.split_once("::{") {
                Some((dir, list)) => (dir.replace("::", "/"), list.trim_end_matches('}')),
                None => match span.rsplit_once("::") {
                    Some((dir, name)) => (dir.replace("::", "/"), name),
                    None => (String::new(), span),
                },
            };
            for name in names.split(", ") {
                let base = src.join(&dir).join(name);
                let found = base.with_extension("rs").exists() || base.is_dir();
                assert!(found, "the crate map names {span}: no {}", base.display());
                modules += 1;
            }
        }
    }
    modules
}

/// A template without the upgrade guards' `define`: the one place that reads the cluster, to refuse
/// an upgrade (`fail`) and never to change what is rendered — so `helm template` (no cluster)
/// renders the same as an install. Every line of it is a template action, none emits text.
fn without_upgrade_guards(text: &str) -> String {
    let start = "{{- define \"valkey-sidecar.upgradeGuards\" -}}";
    let Some(at) = text.find(start) else {
        return text.to_owned();
    };
    let rest = &text[at..];
    let close = "\n{{- end -}}\n{{- end -}}";
    let end = rest.find(close).expect("the guards' end") + close.len();
    let guard = &rest[..end];
    for line in guard.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.starts_with("{{"),
            "the upgrade guards emit text: {line}"
        );
    }
    format!("{}{}", &text[..at], &rest[end..])
}

/// What the chart's documents once said and the code no longer does: each phrase here was true of
/// an earlier chart (the node-index policy needed to bootstrap, pods to delete after a first
/// install, the coordinator waiting for Nodes, passwords generated by `lookup` in the render, the
/// default password in Valkey's arguments, the apiserver's addresses looked up at install).
#[test]
fn the_charts_docs_hold_no_stale_claim() {
    const STALE: &[&str] = &[
        "needed to bootstrap",
        "cannot bootstrap",
        "never bootstraps",
        "delete the pods",
        "delete those pods",
        "delete pods -n",
        "waits for that list before it acts",
        "waits for its watch of nodes",
        "no agent will hand a primary over",
        "helm's lookup",
        "lookup \"v1\"",
        "generated once (kept on upgrades)",
        "the chart generates `<name>-auth`",
        "off only with `sidecar_coordinator",
        "default password reaches valkey-server",
        "`requirepass` for the default user",
        "narrows it to the addresses (and ports) of the `kubernetes` service",
    ];
    let files = [
        "charts/valkey-sidecar/values.yaml",
        "charts/valkey-sidecar/README.md",
        "charts/valkey-sidecar/templates/NOTES.txt",
        "README.md",
        "docs/operations.md",
        "docs/configuration.md",
        "docs/architecture.md",
        "docs/security.md",
        "examples/README.md",
    ];
    for file in files {
        let text = read(file).to_lowercase();
        for phrase in STALE {
            assert!(!text.contains(phrase), "{file} still says {phrase:?}");
        }
    }
    let templates = valkey_sidecar_testkit::repo_root().join("charts/valkey-sidecar/templates");
    for entry in std::fs::read_dir(templates).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let text = without_upgrade_guards(&std::fs::read_to_string(&path).unwrap());
            assert!(
                !text.contains("lookup "),
                "{}: a render must not depend on the cluster",
                path.display()
            );
        }
    }
}
