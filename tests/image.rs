//! The container image (`Dockerfile`), verified end to end without a Docker engine.
//!
//! The rules and readers are in [`valkey_sidecar_testkit::image`] (with their unit tests: every
//! rule refuses a mutation of the real files, the ELF reader refuses a dynamic executable); this
//! file applies them to the repository and to the binary the image would hold:
//! - The Dockerfile against the packaging rules: a build stage whose `cargo build` is the one in
//!   `scripts/static-build.sh`, and a final `FROM scratch` stage that copies exactly its
//!   `target/x86_64-unknown-linux-musl/release/valkey-sidecar`, runs it as a numeric non-root
//!   `USER` through an exec-form `ENTRYPOINT`.
//! - The binary `scripts/static-build.sh` builds (the Dockerfile's build, slow the first time): a
//!   static x86-64 ELF. This toolchain links the musl target as static-pie: `ET_DYN` with
//!   `DF_1_PIE`, a `PT_DYNAMIC` for its own relocations, but no `PT_INTERP` (no loader) and no
//!   `DT_NEEDED` (no shared library); a classic static `ET_EXEC` passes too.
//! - That binary run in what the image holds: an otherwise empty root directory (`chroot`) with the
//!   binary where the Dockerfile copies it, as the Dockerfile's `USER`, through its `ENTRYPOINT`,
//!   with an empty environment: `--help`, `--version`, and exit code 64 for a bad variable.
//! - The image size: the image is `scratch` plus one layer holding this one file, so the estimate is
//!   the binary plus the layer's tar overhead (one 512-byte header, padding to 512 bytes, the 1 KiB
//!   end-of-archive marker); it must stay within 10 MiB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Instant;

use valkey_sidecar_testkit::image::{
    Image, check_dockerfile, classify_elf, layer_tar_bytes, shell_words,
};

/// The packaging target for the image.
const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// The image the repository's Dockerfile describes; the test fails on any broken rule.
fn image() -> Image {
    check_dockerfile(&read("Dockerfile"), &read("scripts/static-build.sh"))
        .unwrap_or_else(|e| panic!("Dockerfile: {e}"))
}

#[test]
fn dockerfile_builds_a_static_binary_into_an_empty_image() {
    let image = image();
    println!("image: cargo {}", image.cargo[1..].join(" "));
    println!(
        "image: binary {} run as {}{} via {:?}",
        image.binary,
        image.uid,
        image.gid.map(|g| format!(":{g}")).unwrap_or_default(),
        image.entrypoint
    );
    assert_eq!(
        image.cargo,
        shell_words(
            "cargo build --release --locked --target x86_64-unknown-linux-musl -p valkey-sidecar --bin valkey-sidecar"
        )
    );
}

// ---------------------------------------------------------------------------------------------
// The static binary
// ---------------------------------------------------------------------------------------------

/// The binary `scripts/static-build.sh` builds, once per test process.
fn static_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(build_static_binary)
}

/// Runs `scripts/static-build.sh` and returns the binary it printed.
fn build_static_binary() -> PathBuf {
    let script = root().join("scripts/static-build.sh");
    let started = Instant::now();
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stderr}",
        script.display(),
        out.status
    );
    let path = printed_path(&String::from_utf8_lossy(&out.stdout));
    println!(
        "build: scripts/static-build.sh took {:.1}s ({})",
        started.elapsed().as_secs_f64(),
        finished_line(&stderr)
    );
    path
}

/// The script's stdout: the path of the binary and nothing else (its logs go to stderr).
fn printed_path(stdout: &str) -> PathBuf {
    let path = PathBuf::from(stdout.trim());
    assert!(
        stdout.lines().count() == 1 && path.is_absolute() && path.is_file(),
        "static-build.sh printed {stdout:?}, not the path of a file"
    );
    path
}

/// Cargo's last `Finished` line, for the log: it shows whether this run had to compile.
fn finished_line(stderr: &str) -> &str {
    stderr
        .lines()
        .rfind(|l| l.trim_start().starts_with("Finished"))
        .unwrap_or("")
        .trim()
}

#[test]
fn static_binary_is_a_static_elf() {
    let bin = static_binary();
    let data = std::fs::read(bin).unwrap();
    let linkage = classify_elf(&data).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    println!(
        "elf: {} is {linkage:?} (no PT_INTERP, no DT_NEEDED)",
        bin.display()
    );
}

// ---------------------------------------------------------------------------------------------
// The binary alone in the image's root
// ---------------------------------------------------------------------------------------------

/// A root directory holding only what the image holds: the binary, where the Dockerfile puts it.
fn image_root(image: &Image) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join(image.binary.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(static_binary(), &dest).unwrap();
    make_runnable(dir.path(), &dest);
    dir
}

/// The non-root user must be able to reach and run the binary: 0755 on it and every directory
/// from it up to `root`.
fn make_runnable(root: &Path, binary: &Path) {
    let mut dir = binary.parent();
    while let Some(d) = dir.filter(|d| d.starts_with(root)) {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir = d.parent();
    }
    std::fs::set_permissions(binary, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn chroot_bin() -> &'static str {
    ["/usr/sbin/chroot", "/usr/bin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("chroot")
}

/// Runs the image's ENTRYPOINT (plus `args`) as its USER in its root, with only `env`.
fn run_image(image: &Image, rootfs: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let user = format!("{}:{}", image.uid, image.gid.unwrap_or(image.uid));
    let mut cmd = Command::new(chroot_bin());
    cmd.env_clear()
        .arg(format!("--userspec={user}"))
        .arg(rootfs)
        .args(&image.entrypoint)
        .args(args)
        .envs(env.iter().copied());
    cmd.output()
        .unwrap_or_else(|e| panic!("running {}: {e}", chroot_bin()))
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn static_binary_runs_alone_as_the_image_user() {
    let image = image();
    let rootfs = image_root(&image);
    let entries: Vec<_> = walk(rootfs.path());
    assert_eq!(
        entries.len(),
        1,
        "the image root holds more than the binary: {entries:?}"
    );
    assert_help(&image, rootfs.path());
    assert_version(&image, rootfs.path());
    assert_bad_variable_exits_64(&image, rootfs.path());
}

fn assert_help(image: &Image, rootfs: &Path) {
    let help = run_image(image, rootfs, &["--help"], &[]);
    let stdout = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success(),
        "--help: {} {stdout} {}",
        help.status,
        String::from_utf8_lossy(&help.stderr)
    );
    assert!(
        stdout.contains("Usage: valkey-sidecar"),
        "--help printed: {stdout}"
    );
    assert!(stdout.contains("--valkey-addr"), "--help printed: {stdout}");
}

fn assert_version(image: &Image, rootfs: &Path) {
    let version = run_image(image, rootfs, &["--version"], &[]);
    let stdout = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.status.success(),
        "--version: {} {stdout}",
        version.status
    );
    assert_eq!(
        stdout.trim(),
        format!("valkey-sidecar {}", env!("CARGO_PKG_VERSION"))
    );
    println!(
        "run: {} --version as {}: {}",
        image.binary,
        image.uid,
        stdout.trim()
    );
}

/// A bad variable is a configuration error: exit code 64 (EX_USAGE) and the variable named.
fn assert_bad_variable_exits_64(image: &Image, rootfs: &Path) {
    let bad = run_image(image, rootfs, &[], &[("SIDECAR_MODE", "sentinel")]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(
        bad.status.code(),
        Some(64),
        "SIDECAR_MODE=sentinel: {stderr}"
    );
    assert!(
        stderr.contains("  SIDECAR_MODE=\"sentinel\""),
        "stderr: {stderr}"
    );
    println!(
        "run: SIDECAR_MODE=sentinel exits {:?}: {}",
        bad.status.code(),
        stderr.lines().nth(1).unwrap_or("").trim()
    );
}

// ---------------------------------------------------------------------------------------------
// The image size
// ---------------------------------------------------------------------------------------------

#[test]
fn image_size_is_within_budget() {
    let image = image();
    let size = std::fs::metadata(static_binary()).unwrap().len();
    let layer = layer_tar_bytes(size);
    print_estimate(size, layer);
    cross_check_with_tar(&image, layer);
    assert!(
        layer <= MAX_IMAGE_BYTES,
        "image estimate {layer} bytes ({:.2} MiB) is over the {} MiB target",
        layer as f64 / MIB,
        MAX_IMAGE_BYTES / 1024 / 1024
    );
}

fn print_estimate(size: u64, layer: u64) {
    println!("size: binary {size} bytes ({:.2} MiB)", size as f64 / MIB);
    println!(
        "size: image estimate {layer} bytes ({:.2} MiB): scratch has no layer, the one COPY layer is \
         the binary plus {} bytes of tar header, padding and end marker (config and manifest are a \
         few hundred bytes of metadata, not counted)",
        layer as f64 / MIB,
        layer - size
    );
}

/// Cross-checks the tar arithmetic with a real tar of the image root, when tar is at hand.
fn cross_check_with_tar(image: &Image, layer: u64) {
    let rootfs = image_root(image);
    let entry = image.binary.trim_start_matches('/');
    if let Ok(out) = Command::new("tar")
        .args(["--format=ustar", "--blocking-factor=1", "-cf", "-", "-C"])
        .arg(rootfs.path())
        .arg(entry)
        .output()
        && out.status.success()
    {
        assert_eq!(out.stdout.len() as u64, layer, "tar of the image root");
        println!(
            "size: tar of the image root: {} bytes (matches)",
            out.stdout.len()
        );
    }
}
