//! Where this repository is checked out, found when the tests run.
//!
//! `env!("CARGO_MANIFEST_DIR")` is fixed when a test binary is compiled, and cargo does not
//! rebuild a workspace that moved: its fingerprints are relative to the workspace. A clone
//! elsewhere that shares the build cache (CI's fresh clone beside a developer's checkout) would
//! otherwise run binaries that read the other checkout's chart, scripts and docs, or a path that
//! no longer exists.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The repository's root: the first directory holding `Cargo.lock` above the running test's
/// package (cargo and nextest set `CARGO_MANIFEST_DIR` when they run a test), else the one this
/// crate was compiled in (a binary started outside cargo, as the bench is).
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let compiled = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::env::var_os("CARGO_MANIFEST_DIR")
            .and_then(|dir| workspace_of(Path::new(&dir)))
            .unwrap_or(compiled)
    })
}

/// The nearest directory at or above `dir` that holds `Cargo.lock`.
fn workspace_of(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_holds_the_chart_and_the_scripts() {
        let root = repo_root();
        assert!(
            root.join("charts/valkey-sidecar/Chart.yaml").is_file(),
            "{root:?}"
        );
        assert!(root.join("scripts/test.sh").is_file(), "{root:?}");
    }

    #[test]
    fn a_package_below_the_root_finds_the_root() {
        let root = repo_root();
        assert_eq!(
            workspace_of(&root.join("testkit/src")).as_deref(),
            Some(root)
        );
        assert_eq!(workspace_of(Path::new("/")), None);
    }
}
