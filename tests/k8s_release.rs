//! What a platform team pulls, made and pulled here:
//! - the aarch64 binary (arm64 node pools) is a static executable of at most 10 MiB that runs under
//!   Debian's `qemu-aarch64-static` beside a real valkey-server and answers `/readyz`;
//! - `scripts/release.sh` publishes into a real OCI registry on loopback (`crane registry serve`):
//!   an image index with one image per platform in the Dockerfile's layout, and the chart; then
//!   `helm install oci://…` with no chart directory installs a replicated shard that pulls its
//!   agent image from that registry, and `helm test` passes. The x86_64 layer's binary is
//!   byte-identical to the one the harness kubelet runs in every Kubernetes-level test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use valkey_sidecar_testkit::k8s::{Stage, StageOptions, sidecar_bin};
use valkey_sidecar_testkit::{
    Agent, AgentOptions, ServerOptions, ValkeyServer, as_from_a_shell, free_port,
};

const SECOND: Duration = Duration::from_secs(1);
const BUDGET: u64 = 10 * 1024 * 1024;
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn root() -> &'static Path {
    valkey_sidecar_testkit::repo_root()
}

/// Runs a repository script and returns the last line it printed (a path).
fn script(name: &str, args: &[&str]) -> String {
    let out = as_from_a_shell(&mut Command::new(root().join("scripts").join(name)))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/{name} {args:?}: {}",
        out.status
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout.lines().last().unwrap_or_default().to_owned()
}

/// `$VALKEY_SIDECAR_BIN_AARCH64` (the test command sets it), else built here.
fn aarch64_bin() -> PathBuf {
    std::env::var_os("VALKEY_SIDECAR_BIN_AARCH64")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(script("static-build.sh", &["aarch64"])))
}

fn crane() -> PathBuf {
    std::env::var_os("CRANE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(script("go-tool-bin.sh", &["crane"])))
}

fn qemu() -> &'static str {
    let found = Command::new("qemu-aarch64-static")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "qemu-aarch64-static (Debian's qemu-user-static; scripts/install-deps.sh) is missing"
    );
    "qemu-aarch64-static"
}

/// `e_machine` of an ELF file, and whether it asks for a program interpreter (a dynamic loader).
fn elf_machine_and_interp(path: &Path) -> (u16, bool) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is not ELF", path.display());
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    let out = Command::new("readelf")
        .arg("-lW")
        .arg(path)
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&out.stdout);
    (machine, headers.contains("INTERP"))
}

#[test]
fn the_aarch64_binary_is_static_small_and_runs_under_qemu_beside_valkey() {
    const EM_AARCH64: u16 = 183;
    let bin = aarch64_bin();
    let size = std::fs::metadata(&bin).unwrap().len();
    println!("aarch64 binary: {size} bytes ({})", bin.display());
    assert!(size <= BUDGET, "{size} bytes > 10 MiB");
    assert_eq!(elf_machine_and_interp(&bin), (EM_AARCH64, false));
    // Rust's aarch64 musl target links a static non-PIE executable: x86_64's budget of a packed
    // relocation table holds trivially, as there is no table at all for the start-up to read.
    let relocations = Command::new("readelf")
        .arg("-rW")
        .arg(&bin)
        .output()
        .unwrap();
    let relocations = String::from_utf8_lossy(&relocations.stdout);
    assert!(
        relocations.contains("There are no relocations in this file."),
        "{relocations}"
    );
    let run = |arg: &str| {
        let out = Command::new(qemu()).arg(&bin).arg(arg).output().unwrap();
        assert!(out.status.success(), "{arg}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(run("--version").contains(&format!("valkey-sidecar {VERSION}")));
    assert!(run("--help").contains("Usage:"));
    let server = ValkeyServer::start(ServerOptions::default()).unwrap();
    let opts = AgentOptions::new(&bin, server.addr(), "replication")
        .arg("--poll-interval", "100ms")
        .under(qemu());
    let agent = Agent::start(opts).unwrap();
    let took = agent.wait_code("/readyz", 200, 30 * SECOND).unwrap();
    println!("aarch64 agent under qemu: /readyz 200 after {took:?}");
    assert_eq!(agent.status().unwrap()["role"], "primary");
    assert!(agent.get("/metrics").unwrap().1.contains("valkey_sidecar_"));
}

/// A registry on loopback, in memory with blobs on disk; killed on drop.
struct Registry {
    child: Child,
    addr: String,
    _blobs: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        let blobs = tempfile::tempdir().unwrap();
        let port = free_port([127, 0, 0, 1].into()).unwrap();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(crane())
            .args(["registry", "serve", "--address", &addr, "--disk"])
            .arg(blobs.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let registry = Registry {
            child,
            addr,
            _blobs: blobs,
        };
        for _ in 0..100 {
            if std::net::TcpStream::connect(&registry.addr).is_ok() {
                return registry;
            }
            std::thread::sleep(SECOND / 10);
        }
        panic!("crane registry serve did not listen on {}", registry.addr);
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn crane_out(args: &[&str]) -> Vec<u8> {
    let out = Command::new(crane()).args(args).output().unwrap();
    assert!(out.status.success(), "crane {args:?}: {out:?}");
    out.stdout
}

fn crane_json(args: &[&str]) -> Value {
    serde_json::from_slice(&crane_out(args)).unwrap()
}

/// `release.sh`'s `key=value` lines.
fn release(prefix: &str) -> std::collections::BTreeMap<String, String> {
    let out = as_from_a_shell(&mut Command::new(root().join("scripts/release.sh")))
        .arg(prefix)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "release.sh: {}", out.status);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The Dockerfile's final-stage `USER` and `ENTRYPOINT` path, which every published image keeps.
fn dockerfile_user_and_entrypoint() -> (String, String) {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let last = |prefix: &str| {
        text.lines()
            .rev()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap()
            .trim()
            .to_owned()
    };
    let entry = last("ENTRYPOINT [\"").trim_end_matches("\"]").to_owned();
    (last("USER "), entry)
}

/// The one file of a platform's image, checked against the Dockerfile's layout; returns its bytes.
fn platform_binary(image: &str, platform: &str) -> Vec<u8> {
    let (user, entry) = dockerfile_user_and_entrypoint();
    let config = crane_json(&["config", "--platform", platform, image]);
    assert_eq!(config["config"]["User"], user.as_str(), "{config}");
    assert_eq!(
        config["config"]["Entrypoint"][0],
        entry.as_str(),
        "{config}"
    );
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(revision.len() >= 40, "{labels}");
    let dir = tempfile::tempdir().unwrap();
    let tarball = dir.path().join("root.tar");
    std::fs::write(
        &tarball,
        crane_out(&["export", "--platform", platform, image, "-"]),
    )
    .unwrap();
    let tar = |args: &[&str]| {
        let out = Command::new("tar")
            .args(args)
            .arg(&tarball)
            .output()
            .unwrap();
        assert!(out.status.success(), "tar {args:?}: {out:?}");
        out.stdout
    };
    // `-rwxr-xr-x 0/0 9127928 2026-12-03 23:32 valkey-sidecar`: one file, root's, mode 0755.
    let listing = String::from_utf8(tar(&["--numeric-owner", "-tvf"])).unwrap();
    let rows: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let [row] = rows.as_slice() else {
        panic!("one file in the image's root: {listing}");
    };
    assert_eq!((row[0], row[1]), ("-rwxr-xr-x", "0/0"), "{listing}");
    let path = row[5];
    // The one file, to stdout.
    let bytes = tar(&["-xOf"]);
    assert_eq!(format!("/{path}"), entry, "the entrypoint is the file");
    let manifest = crane_json(&["manifest", "--platform", platform, image]);
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    let pulled = layers[0]["size"].as_u64().unwrap();
    assert!(pulled <= BUDGET, "{platform}: a {pulled} B layer");
    println!(
        "{platform}: /{path}, {} bytes; the image pulls {pulled} bytes (one gzip layer)",
        bytes.len()
    );
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_into_a_local_registry_installs_with_helm_from_oci() {
    let registry = Registry::start();
    let prefix = format!("{}/valkey-sidecar", registry.addr);
    let out = release(&prefix);
    let image = format!("{prefix}/valkey-sidecar:{VERSION}");
    assert_eq!(out["image"], image);
    let index = crane_json(&["manifest", &image]);
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let platforms: Vec<String> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}/{}", m["platform"]["os"], m["platform"]["architecture"]))
        .collect();
    assert_eq!(platforms, ["\"linux\"/\"amd64\"", "\"linux\"/\"arm64\""]);
    let amd64 = platform_binary(&image, "linux/amd64");
    let kubelets = std::fs::read(sidecar_bin().unwrap()).unwrap();
    assert!(
        amd64 == kubelets,
        "the x86_64 layer differs from the binary the harness kubelet runs"
    );
    assert!(platform_binary(&image, "linux/arm64") == std::fs::read(aarch64_bin()).unwrap());

    // Nothing of the chart on disk: helm pulls it from the registry; its default image is there.
    let mut opts = StageOptions::replication("from-oci", 1);
    opts.helm_install = true;
    opts.chart = vec![
        out["chart"].clone(),
        "--version".into(),
        VERSION.into(),
        "--plain-http".into(),
    ];
    let stage = Stage::start(opts).await.unwrap();
    for pod in stage.pod_objects().await.unwrap() {
        let spec = pod.spec.unwrap();
        let agent = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .find(|c| c.name == "valkey-sidecar")
            .expect("the agent container");
        assert_eq!(agent.image.as_deref(), Some(image.as_str()));
    }
    let tested = stage.helm_test().await.unwrap();
    assert!(tested.contains("Succeeded"), "{tested}");
}
