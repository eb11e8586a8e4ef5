//! Where the machine's CPU goes: every process's CPU time from `/proc`, summed by what it is
//! (Valkey, the agents, the `valkey-settings` containers, the control plane, the test harness).
//! On 2 cores shared by everything, a figure of one class is only read right beside the others.

use std::collections::{BTreeMap, HashMap};

/// What a process is, for the breakdown. Ordered as the report lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    Valkey,
    Agent,
    Settings,
    ControlPlane,
    Harness,
    Other,
}

impl Class {
    pub fn label(self) -> &'static str {
        match self {
            Class::Valkey => "valkey-server",
            Class::Agent => "agents",
            Class::Settings => "valkey-settings containers",
            Class::ControlPlane => "apiserver, etcd, scheduler, controller-manager",
            Class::Harness => "the harness (kubelet, probes, writers: the bench process)",
            Class::Other => "everything else",
        }
    }

    /// By the process's name and, for the agent's binary, its sub-command.
    fn of(comm: &str, args: &[String]) -> Class {
        match comm {
            "valkey-server" => Class::Valkey,
            "valkey-sidecar" if args.iter().any(|a| a == "valkey-settings") => Class::Settings,
            "valkey-sidecar" => Class::Agent,
            "kube-apiserver" | "etcd" | "kube-scheduler" | "kube-controller" => Class::ControlPlane,
            "bench" => Class::Harness,
            _ => Class::Other,
        }
    }
}

/// Every live process's class and CPU ticks (user + system) so far.
#[derive(Debug, Default)]
pub struct Snapshot(HashMap<u32, (Class, u64)>);

impl Snapshot {
    pub fn take() -> Snapshot {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Snapshot::default();
        };
        let pids = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok());
        Snapshot(pids.filter_map(|pid| Some((pid, process(pid)?))).collect())
    }

    /// % of one core per class between `self` and the later `after`, over `secs`. A process
    /// born in between counts from zero; one that died in between is lost (a few at most).
    pub fn usage(&self, after: &Snapshot, secs: f64) -> BTreeMap<Class, f64> {
        let mut by_class = BTreeMap::new();
        for (pid, (class, ticks)) in &after.0 {
            let before = self.0.get(pid).map_or(0, |(_, t)| *t);
            let pct = ticks.saturating_sub(before) as f64 / TICKS_PER_S / secs * 100.0;
            *by_class.entry(*class).or_insert(0.0) += pct;
        }
        by_class
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on Linux).
pub const TICKS_PER_S: f64 = 100.0;

/// A process's name and CPU ticks (user + system) from the text of its `/proc/<pid>/stat`.
pub fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let mut next = || fields.next()?.parse::<u64>().ok();
    Some((comm, next()? + next()?))
}

/// A process's class and CPU ticks; `None` when it is gone or unreadable.
fn process(pid: u32) -> Option<(Class, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (comm, cpu) = parse_stat(&stat)?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some((Class::of(comm, &args), cpu))
}

/// `valkey-server 41.2 %, agents 36.3 %, …` in class order, the total first.
pub fn describe(usage: &BTreeMap<Class, f64>) -> String {
    let total: f64 = usage.values().sum();
    let parts: Vec<String> = usage
        .iter()
        .map(|(c, pct)| format!("{} {pct:.0} %", c.label()))
        .collect();
    format!("{total:.0} % of a core in all: {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_container_is_told_from_the_agent_by_its_sub_command() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let settings = args(&["/bin/valkey-sidecar", "valkey-settings"]);
        assert_eq!(Class::of("valkey-sidecar", &settings), Class::Settings);
        assert_eq!(
            Class::of("valkey-sidecar", &args(&["/bin/valkey-sidecar"])),
            Class::Agent
        );
        assert_eq!(Class::of("kube-controller", &[]), Class::ControlPlane);
        assert_eq!(Class::of("sh", &[]), Class::Other);
    }

    #[test]
    fn a_stat_line_gives_the_name_and_user_plus_system_ticks() {
        let stat = "42 (kube-controller) S 1 42 42 0 -1 4194560 100 0 0 0 70 30 0 0 20 0 9 0";
        assert_eq!(parse_stat(stat), Some(("kube-controller", 100)));
        assert_eq!(parse_stat("42 (x) S 1"), None);
    }

    #[test]
    fn this_process_is_seen_and_its_cpu_counted() {
        let me = std::process::id();
        let before = Snapshot::take();
        let ticks = |s: &Snapshot| s.0.get(&me).map(|(_, t)| *t);
        let start = ticks(&before).unwrap();
        // Busy until this process has been charged a few ticks, however loaded the machine.
        let t = std::time::Instant::now();
        let mut after = Snapshot::take();
        while ticks(&after).unwrap() < start + 3 && t.elapsed().as_secs() < 30 {
            for _ in 0..1_000_000 {
                std::hint::black_box(0u64);
            }
            after = Snapshot::take();
        }
        let usage = before.usage(&after, t.elapsed().as_secs_f64());
        assert!(usage.values().sum::<f64>() > 0.0, "{usage:?}");
        assert!(describe(&usage).contains("% of a core in all"));
    }
}
