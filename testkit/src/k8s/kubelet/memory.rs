//! Memory limits enforced as a kubelet enforces them: a container with `resources.limits.memory`
//! runs in a memory cgroup of its own with that limit, so the kernel OOM-kills it past the limit
//! (reported `OOMKilled`, exit 137) and its peak usage can be read afterwards. The cgroups are
//! cgroup v1's memory controller below the harness's own (`/proc/self/cgroup`), named
//! `vtk-<harness pid>-<pod uid>-<container>`, and removed with the container.
//!
//! Where no writable memory controller exists the limit is not enforced: said once on stderr, and
//! [`peak_of_process`] (the process's `VmHWM`) is the only measure left.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// A container's memory cgroup.
#[derive(Debug)]
pub(crate) struct MemoryCgroup {
    dir: PathBuf,
    limit: u64,
}

impl MemoryCgroup {
    /// The cgroup of `pod_uid`'s container `name` limited to `limit` bytes; `None` where this host
    /// has no writable memory controller.
    pub fn create(pod_uid: &str, name: &str, limit: u64) -> Result<Option<Self>> {
        let Some(root) = root() else {
            return Ok(None);
        };
        let dir = root.join(format!("vtk-{}-{pod_uid}-{name}", std::process::id()));
        create_set(&dir, "memory.limit_in_bytes", limit)?;
        Ok(Some(Self { dir, limit }))
    }

    /// The file a process writes its pid to, to join.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The most memory the container's processes used at once, page cache included (what the
    /// limit counts).
    pub fn peak(&self) -> Option<u64> {
        read_number(&self.dir.join("memory.max_usage_in_bytes"))
    }

    /// How many processes the kernel killed for the limit so far.
    pub fn oom_kills(&self) -> u64 {
        let text = std::fs::read_to_string(self.dir.join("memory.oom_control")).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    /// Removed once empty; a process still inside keeps it (and the kernel refuses the removal).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Creates the cgroup `dir` (one left by an earlier container of the same name is reused) and
/// writes `value` to its `setting` file.
pub(crate) fn create_set(dir: &Path, setting: &str, value: u64) -> Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("creating {}", dir.display()));
        }
        _ => {}
    }
    std::fs::write(dir.join(setting), value.to_string())
        .with_context(|| format!("writing {setting} of {}", dir.display()))
}

/// The harness's own memory cgroup directory, if it can hold children.
fn root() -> Option<PathBuf> {
    static ROOT: OnceLock<Option<PathBuf>> = OnceLock::new();
    ROOT.get_or_init(|| match find_root() {
        Ok(dir) => Some(dir),
        Err(e) => {
            eprintln!("testkit kubelet: memory limits are not enforced: {e:#}");
            None
        }
    })
    .clone()
}

fn find_root() -> Result<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    // Lines are `<id>:<controllers>:<path>`.
    let path = own
        .lines()
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let controllers = parts.nth(1)?;
            let path = parts.next()?;
            let memory = controllers.split(',').any(|c| c == "memory");
            memory.then(|| path.trim_start_matches('/').to_owned())
        })
        .context("no cgroup v1 memory controller in /proc/self/cgroup")?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(path);
    let probe = dir.join(format!("vtk-{}-probe", std::process::id()));
    std::fs::create_dir(&probe).with_context(|| format!("creating {}", probe.display()))?;
    let limited = std::fs::write(probe.join("memory.limit_in_bytes"), "67108864");
    std::fs::remove_dir(&probe).with_context(|| format!("removing {}", probe.display()))?;
    limited.with_context(|| format!("limiting {}", probe.display()))?;
    Ok(dir)
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The peak resident set of process `pid` (`VmHWM`), in bytes.
pub(crate) fn peak_of_process(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A Kubernetes quantity (`256Mi`, `1.5Gi`, `500m`, `2`) in base units.
pub(crate) fn quantity(q: &str) -> Result<f64> {
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        _ => bail!("quantity {q:?}: unknown suffix {suffix:?}"),
    };
    let n: f64 = number
        .parse()
        .with_context(|| format!("quantity {q:?}: not a number"))?;
    Ok(n * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_base_units() {
        assert_eq!(quantity("256Mi").unwrap(), 268_435_456.0);
        assert_eq!(quantity("1.5Gi").unwrap(), 1_610_612_736.0);
        assert_eq!(quantity("250m").unwrap(), 0.25);
        assert_eq!(quantity("2").unwrap(), 2.0);
        assert_eq!(quantity("1k").unwrap(), 1000.0);
        assert!(quantity("1Xi").is_err());
        assert!(quantity("Mi").is_err());
    }
}
