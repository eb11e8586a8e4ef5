//! The GitHub workflows a maintainer keeps: `actionlint` (built from its Go module) with Debian's
//! shellcheck finds nothing in them and does find a planted mistake; CI runs exactly `.ci/run`,
//! the release exactly `scripts/release.sh`; every action is GitHub's own, pinned by commit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> &'static Path {
    valkey_sidecar_testkit::repo_root()
}

fn actionlint() -> PathBuf {
    if let Some(p) = std::env::var_os("ACTIONLINT_BIN") {
        return PathBuf::from(p);
    }
    let out = Command::new(root().join("scripts/go-tool-bin.sh"))
        .arg("actionlint")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/go-tool-bin.sh actionlint");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// actionlint on `workflow` (stdin), named like the real file so its checks apply.
fn lint(workflow: &str, name: &str) -> Output {
    let shellcheck = Command::new("shellcheck").arg("--version").output();
    assert!(
        shellcheck.is_ok_and(|o| o.status.success()),
        "shellcheck (Debian; scripts/install-deps.sh) is missing: the run steps would go unchecked"
    );
    let mut child = Command::new(actionlint())
        .args(["-no-color", "-oneline", "-stdin-filename", name, "-"])
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(workflow.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn workflows() -> Vec<(String, String)> {
    let dir = root().join(".github/workflows");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = format!(
                ".github/workflows/{}",
                p.file_name().unwrap().to_string_lossy()
            );
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn actionlint_finds_nothing_in_the_workflows_and_finds_a_planted_mistake() {
    let files = workflows();
    assert_eq!(
        files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [".github/workflows/ci.yml", ".github/workflows/release.yml"]
    );
    for (name, text) in &files {
        let out = lint(text, name);
        assert!(
            out.status.success(),
            "{name}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let (name, release) = &files[1];
    // An output the step does not have, and an unquoted variable in a run step (shellcheck).
    let planted = release
        .replace(
            "steps.publish.outputs.image_digest",
            "steps.publsh.outputs.image_digest",
        )
        .replace(
            "\"$REGISTRY/${GITHUB_REPOSITORY_OWNER,,}\"",
            "$REGISTRY/$GITHUB_REPOSITORY_OWNER",
        );
    assert_ne!(&planted, release);
    let out = lint(&planted, name);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("publsh"), "{said}");
    assert!(said.contains("SC2086"), "shellcheck did not run: {said}");
}

#[test]
fn ci_runs_the_test_command_and_the_release_runs_the_release_script() {
    let files = workflows();
    let run_lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("run: "))
            .map(str::to_owned)
            .collect()
    };
    let ci = run_lines(&files[0].1);
    assert_eq!(ci, ["sudo --preserve-env=HOME env \"PATH=$PATH\" .ci/run"]);
    let release = &files[1].1;
    assert!(
        release.contains("run: scripts/release.sh \"$REGISTRY/"),
        "{release}"
    );
    assert!(release.contains("tags: [\"v*.*.*\"]"), "{release}");
}

#[test]
fn every_action_is_githubs_own_pinned_by_commit() {
    for (name, text) in workflows() {
        for used in text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- uses: "))
        {
            let (action, rest) = used.split_once('@').unwrap();
            let sha = rest.split_whitespace().next().unwrap();
            assert!(action.starts_with("actions/"), "{name}: {used}");
            assert!(
                sha.len() == 40 && sha.chars().all(|c| c.is_ascii_hexdigit()),
                "{name}: {used} is not pinned by commit"
            );
        }
    }
}
