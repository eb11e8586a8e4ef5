//! The container image (`Dockerfile`), verified end to end without a Docker engine:
//! - The Dockerfile: a build stage pinned by digest whose `RUN cargo build` is exactly the one in
//!   `scripts/static-build.sh`, and a final stage that is exactly `FROM scratch`, one `COPY` of
//!   that build's `target/x86_64-unknown-linux-musl/release/valkey-sidecar`, a numeric non-root
//!   `USER` and an exec-form `ENTRYPOINT` naming the copied file.
//! - The binary `scripts/static-build.sh` builds (the Dockerfile's build, slow the first time), run
//!   in what the image holds: a root directory with nothing but the binary where the Dockerfile
//!   copies it (`chroot`), as the Dockerfile's `USER`, through its `ENTRYPOINT`, with an empty
//!   environment: `--help`, `--version`, and exit code 64 for a bad variable. An empty root has no
//!   loader and no shared library, so a binary that runs there is static.
//! - The image size: `scratch` plus one layer holding this one file, so the estimate is the binary
//!   plus the layer's tar overhead (one 512-byte header, padding to 512 bytes, the 1 KiB
//!   end-of-archive marker), cross-checked with a real `tar` where there is one; at most 10 MiB.
//! - Its relocations packed (RELR, `.cargo/config.toml`): less of it resident in every agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Instant;

use valkey_sidecar_testkit::as_from_a_shell;

/// The packaging target for the image.
const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;
/// Where the build stage leaves the binary the final stage copies.
const BUILT: &str = "/src/target/x86_64-unknown-linux-musl/release/valkey-sidecar";

fn root() -> &'static Path {
    valkey_sidecar_testkit::repo_root()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// What the final stage says about the image.
struct Image {
    /// Where the binary is copied to, and what the ENTRYPOINT runs.
    binary: String,
    uid: u32,
    gid: u32,
}

/// The Dockerfile's instructions, one per entry, continuation lines joined and comments dropped.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (text, continued) = match line.strip_suffix('\\') {
            Some(t) => (t, true),
            None => (line, false),
        };
        current.push_str(text.trim());
        current.push(' ');
        if !continued {
            out.push(words(&current).join(" "));
            current.clear();
        }
    }
    out
}

fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

/// The image the repository's Dockerfile describes; panics naming the rule it breaks.
fn image() -> Image {
    let all = instructions(&read("Dockerfile"));
    let last_from = all
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .expect("a FROM");
    let (build, last) = all.split_at(last_from);
    let from = build.first().expect("a build stage");
    assert!(
        from.starts_with("FROM ") && from.contains("@sha256:") && from.ends_with(" AS build"),
        "the build stage's base is pinned by digest and named build: {from}"
    );
    let cargo = format!("RUN {}", script_cargo_build());
    assert!(
        build.contains(&cargo),
        "the build stage runs {cargo}: {build:?}"
    );
    let [scratch, copy, user, entrypoint] = last else {
        panic!("the final stage is FROM, COPY, USER, ENTRYPOINT: {last:?}");
    };
    assert_eq!(scratch, "FROM scratch");
    let binary = copy
        .strip_prefix(&format!("COPY --from=build {BUILT} "))
        .unwrap_or_else(|| panic!("the final stage copies the built binary alone: {copy}"));
    assert_eq!(
        *entrypoint,
        format!("ENTRYPOINT [\"{binary}\"]"),
        "exec form, the copied file"
    );
    let ids = user.strip_prefix("USER ").expect("USER");
    let (uid, gid) = ids.split_once(':').unwrap_or((ids, ids));
    let (uid, gid): (u32, u32) = (
        uid.parse().expect("numeric uid"),
        gid.parse().expect("numeric gid"),
    );
    assert!(uid != 0 && gid != 0, "not root: {user}");
    Image {
        binary: binary.to_owned(),
        uid,
        gid,
    }
}

/// `scripts/static-build.sh`'s `cargo build`, without its redirection.
fn script_cargo_build() -> String {
    let script = read("scripts/static-build.sh");
    let line = script
        .lines()
        .find(|l| l.starts_with("cargo build "))
        .expect("static-build.sh runs cargo build");
    words(line.trim_end_matches(">&2")).join(" ")
}

#[test]
fn dockerfile_builds_a_static_binary_into_an_empty_image() {
    let image = image();
    println!("image: {} run as {}:{}", image.binary, image.uid, image.gid);
    assert_eq!(
        script_cargo_build(),
        "cargo build --release --locked --target x86_64-unknown-linux-musl -p valkey-sidecar --bin valkey-sidecar"
    );
}

#[test]
fn the_dockerfile_reader_joins_lines_and_drops_comments() {
    let text = "# c\nFROM a AS build\nRUN x \\\n && y\n\nUSER 1:2\n";
    assert_eq!(
        instructions(text),
        ["FROM a AS build", "RUN x && y", "USER 1:2"]
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
    let out = as_from_a_shell(&mut Command::new(&script))
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
    let user = format!("{}:{}", image.uid, image.gid);
    let mut cmd = Command::new(chroot_bin());
    cmd.env_clear()
        .arg(format!("--userspec={user}"))
        .arg(rootfs)
        .arg(&image.binary)
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

/// `.cargo/config.toml` packs the relative relocations (RELR): the start-up reads a 5 KiB table
/// instead of a 356 KiB one that stays resident in every agent. `readelf` (binutils) reads the
/// sections; the image's binary must still start (the test above), so musl applied them.
#[test]
fn the_static_binary_packs_its_relocations() {
    let out = Command::new("readelf")
        .args(["-SW"])
        .arg(static_binary())
        .output()
        .expect("readelf (binutils) runs");
    let sections = String::from_utf8_lossy(&out.stdout);
    let size_of = |name: &str| {
        sections
            .lines()
            .find(|l| l.contains(&format!(" {name} ")))
            .and_then(|l| l.split_whitespace().skip_while(|w| *w != name).nth(4))
            .map(|hex| u64::from_str_radix(hex, 16).expect("a hex size"))
    };
    let relr = size_of(".relr.dyn").expect("a .relr.dyn section");
    let rela = size_of(".rela.dyn").unwrap_or(0);
    assert!(
        relr > 0 && rela < 16 * 1024,
        ".relr.dyn {relr} B, .rela.dyn {rela} B: {sections}"
    );
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

/// The one layer a `COPY` of one file of `size` bytes makes: a 512-byte header, the content
/// padded to 512 bytes, and the 1 KiB end-of-archive marker.
fn layer_tar_bytes(size: u64) -> u64 {
    512 + size.div_ceil(512) * 512 + 1024
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
