//! The pods' share of the CPU, as a kubelet sets it ([`super::KubeletOptions::pods_cpu_shares`]):
//! every container runs in one cgroup v1 `cpu` cgroup, the harness's `kubepods`, whose
//! `cpu.shares` weigh all pods together against each thread outside it.
//!
//! On a real node the kubelet and its runtime run outside `kubepods` (and the control plane on
//! machines of its own), so a node full of busy pods still answers the apiserver and renews its
//! Lease. Here one machine hosts the control plane, six kubelets and every pod: without this, a
//! hundred busy Valkeys and agents got as much CPU each as etcd or the apiserver, which then
//! answered requests in tens of seconds (the scale bench's 50 shards: 504s at a load of 170).
//! Named `vtk-<harness pid>-kubepods` below the harness's own `cpu` cgroup, removed on drop.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::memory::create_set;

/// The pods' `cpu` cgroup.
#[derive(Debug)]
pub(crate) struct KubePods {
    dir: PathBuf,
}

impl KubePods {
    /// Creates it with `shares` (`cpu.shares`: 1024 weighs as much as one thread at nice 0).
    /// Fails where no writable cgroup v1 `cpu` controller exists: a bench that asks for it
    /// must not measure something else.
    pub fn create(shares: u64) -> Result<Self> {
        let dir = own_cpu_cgroup()?.join(format!("vtk-{}-kubepods", std::process::id()));
        create_set(&dir, "cpu.shares", shares)?;
        Ok(Self { dir })
    }

    /// The file a process writes its pid to, to join.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for KubePods {
    /// Removed once empty (the kernel refuses while a process is inside).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The harness's own `cpu` cgroup directory: the v1 hierarchy's mount point
/// (`/proc/self/mounts`) joined with its path in it (`/proc/self/cgroup`).
fn own_cpu_cgroup() -> Result<PathBuf> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    let own = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    let mount = cpu_mount(&mounts).context("no cgroup v1 cpu controller is mounted")?;
    let path = cpu_path(&own).context("no cgroup v1 cpu controller in /proc/self/cgroup")?;
    Ok(Path::new(mount).join(path.trim_start_matches('/')))
}

/// Where the v1 hierarchy holding the `cpu` controller is mounted (alone, or as `cpu,cpuacct`).
fn cpu_mount(mounts: &str) -> Option<&str> {
    mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (at, kind, options) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
        (*kind == "cgroup" && options.split(',').any(|o| o == "cpu")).then_some(*at)
    })
}

/// This process's path in that hierarchy (lines are `<id>:<controllers>:<path>`).
fn cpu_path(own: &str) -> Option<&str> {
    own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let controllers = parts.nth(1)?;
        let path = parts.next()?;
        controllers.split(',').any(|c| c == "cpu").then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_hierarchy_is_found_alone_or_shared_with_cpuacct() {
        let alone = "cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n\
                     cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n";
        assert_eq!(cpu_mount(alone), Some("/sys/fs/cgroup/cpu"));
        let shared = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n\
                      cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n";
        assert_eq!(cpu_mount(shared), Some("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(cpu_mount("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"), None);
        let own = "2:cpuacct:/\n1:cpu,cpuacct:/system.slice/x\n0::/\n";
        assert_eq!(cpu_path(own), Some("/system.slice/x"));
        assert_eq!(cpu_path("0::/\n"), None);
    }
}
