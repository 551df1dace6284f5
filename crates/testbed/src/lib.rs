//! Real test networks for flowgate: Open vSwitch bridges on the userspace datapath,
//! network namespaces joined by veth pairs, processes run inside namespaces, and the
//! clean-up of all of it (drop guards, plus [`cleanup_stale`] for a crashed run's leftovers
//! and [`sweep_orphans`] for those of any run whose process is gone).
//!
//! Also a backend HTTP server ([`httpd`]) and an HTTP load client ([`load`]), used through
//! the `fg-testbed-tools` binary (and the `flowgate httpd` / `flowgate load` subcommands).
//!
//! Everything that needs root and Open vSwitch goes through [`require_root_ovs`], which
//! skips (outside CI) or fails (with `CI` set) when they are missing.
//!
//! ```no_run
//! use flowgate_testbed::{cleanup_stale, require_root_ovs, topo, Prefix, TopoOptions};
//! # fn main() -> flowgate_testbed::Result<()> {
//! if !require_root_ovs("ovs_example") { return Ok(()) }
//! let p = Prefix::for_test("ovs_example");
//! cleanup_stale(p.as_str())?; // leftovers of a crashed earlier run
//! let opts = TopoOptions::new(p.as_str()).controllers(&["tcp:127.0.0.1:6653"]);
//! let t = topo::linear(&opts, 3, 1)?; // s1-s2-s3, h1..h3 = 10.0.0.1..3
//! let (h1, h3) = (&t.hosts[0], &t.hosts[2]);
//! let _srv = h3.spawn(&["/path/to/flowgate", "httpd", "--listen", "10.0.0.3:8080", "--name", "b3"])?;
//! let out = h1.exec(&["curl", "-s", "http://10.0.0.3:8080/"])?;
//! # let _ = out; Ok(())
//! # } // dropping `t` kills the processes and removes hosts, links and bridges
//! ```

pub mod cmd;
pub mod error;
pub mod httpd;
pub mod link;
pub mod load;
pub mod netns;
pub mod ovs;
pub mod rootleg;
pub mod scratch;
pub mod topo;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

pub use error::{Error, Result};
pub use netns::{Host, HostOptions, ProcGuard};
pub use ovs::{Bridge, Link, LinkKind, Ovs};
pub use scratch::ScratchDir;
pub use topo::{TopoOptions, Topology};

/// A short unique name prefix: `fg` + 4 hex digits (6 characters), leaving 9 characters of
/// an interface name for the role (`s1`, `h12`, `p3x12`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix(String);

impl Prefix {
    /// A deterministic prefix for a test name: a re-run of a crashed test gets the same
    /// prefix, so its [`cleanup_stale`] removes what the crash left.
    pub fn for_test(test_name: &str) -> Prefix {
        // FNV-1a, folded to 16 bits.
        let mut h: u32 = 0x811c_9dc5;
        for b in test_name.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        Prefix(format!("fg{:04x}", (h ^ (h >> 16)) & 0xffff))
    }

    /// A random prefix.
    pub fn random() -> Prefix {
        Prefix(format!("fg{:04x}", rand::random::<u16>()))
    }

    /// The prefix string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Prefix {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// What [`cleanup_stale`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleaned {
    /// Bridges deleted.
    pub bridges: Vec<String>,
    /// Namespaces deleted (after killing their processes).
    pub namespaces: Vec<String>,
    /// Root-namespace interfaces deleted.
    pub links: Vec<String>,
}

/// Removes every bridge, namespace (killing the processes inside) and root-namespace
/// interface whose name starts with `prefix`: the leftovers of a crashed earlier run.
/// Refuses prefixes shorter than 4 characters so it can't sweep other runs' networks.
///
/// First [`claim`]s `prefix` for this process, so a [`sweep_orphans`] elsewhere leaves
/// what this run builds alone while it lives.
pub fn cleanup_stale(prefix: &str) -> Result<Cleaned> {
    check_prefix(prefix)?;
    claim(prefix)?;
    remove_matching(|name| name.starts_with(prefix))
}

/// Refuses prefixes that could cover other runs' names (under 4 characters) or that can't
/// be a file name in the owners directory.
fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.len() < 4 {
        return Err(Error::Invalid(format!(
            "cleanup prefix `{prefix}` is too short (min 4)"
        )));
    }
    if !prefix.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Error::Invalid(format!(
            "prefix `{prefix}` must be ASCII letters and digits"
        )));
    }
    Ok(())
}

/// Removes the bridges, ports, namespaces and root-namespace interfaces whose names
/// `doomed` accepts.
fn remove_matching(doomed: impl Fn(&str) -> bool) -> Result<Cleaned> {
    let mut c = Cleaned::default();
    if Ovs::is_running() {
        for br in Ovs::list_bridges()? {
            if doomed(&br) {
                ovs::vsctl(&["--if-exists", "del-br", &br])?;
                c.bridges.push(br);
            }
        }
        // Ports of ours left on other bridges (e.g. a Host on a bridge not of this prefix).
        // Other runs' bridges come and go meanwhile, so this part is best effort.
        for br in Ovs::list_bridges()? {
            let Ok(ports) = ovs::vsctl(&["list-ports", &br]) else {
                continue;
            };
            for port in ports.lines().filter(|p| doomed(p)) {
                let _ = ovs::vsctl(&["--if-exists", "del-port", &br, port]);
            }
        }
    }
    for ns in netns::list_netns()? {
        if doomed(&ns) {
            netns::kill_netns_pids(&ns);
            cmd::run("ip", &["netns", "del", &ns])?;
            netns::remove_logs_of(&ns);
            c.namespaces.push(ns);
        }
    }
    for l in netns::list_links()? {
        // Peers of deleted namespaces vanish on their own, a moment later.
        if doomed(&l) && !link::wait_link_gone(&l, std::time::Duration::from_millis(500)) {
            link::del_link(&l)?;
            c.links.push(l);
        }
    }
    Ok(c)
}

/// Where prefix owners keep their lock files (tmpfs: gone at reboot with the namespaces
/// and interfaces; a bridge that outlives a reboot is then reported as unowned).
pub const OWNERS_DIR: &str = "/run/flowgate-testbed/owners";

/// The lock files this process holds, by path: open for the life of the process.
static CLAIMS: Mutex<BTreeMap<PathBuf, File>> = Mutex::new(BTreeMap::new());

/// Records this process as the owner of `prefix` until it exits: it holds an exclusive
/// `flock` on `OWNERS_DIR/PREFIX`, which the kernel releases when the process dies however
/// it dies (SIGKILL included), so a sweep can tell a live run from a dead one without
/// trusting a pid that may have been reused. Waits while a sweep is removing that
/// prefix's leftovers. Claiming again from the same process does nothing.
pub fn claim(prefix: &str) -> Result<()> {
    check_prefix(prefix)?;
    claim_in(Path::new(OWNERS_DIR), prefix)
}

// File::lock is newer than the declared MSRV; the lab's lock already needs it (1.89).
#[allow(clippy::incompatible_msrv)]
fn claim_in(dir: &Path, prefix: &str) -> Result<()> {
    let path = dir.join(prefix);
    // Held across the blocking lock: two threads of one process opening the file twice
    // would otherwise lock each other out (flock is per open file, not per process).
    let mut claims = CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
    if claims.contains_key(&path) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let mut f = open_lock_file(&path)?;
    f.lock()?;
    // The pid is for a person looking at the directory; the lock is what counts. The file
    // is never unlinked, so every opener locks the same inode.
    f.set_len(0)?;
    writeln!(f, "{}", std::process::id())?;
    claims.insert(path, f);
    Ok(())
}

fn open_lock_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// What [`sweep_orphans`] found and did.
#[derive(Debug, Default)]
pub struct Swept {
    /// Claimed prefixes whose owner is gone, with what was removed for each.
    pub orphans: Vec<(String, Cleaned)>,
    /// Claimed prefixes whose owner still runs: untouched.
    pub live: Vec<String>,
    /// Claimed prefixes whose owner is gone but whose namespaces hold processes that still
    /// have their parent: a run that does not claim (an older build) may use the prefix
    /// now. Untouched.
    pub in_use: Vec<String>,
    /// `fg…` names that no claim covers (an older build's run, a network made by hand):
    /// untouched, for a person to judge.
    pub unowned: Vec<String>,
}

/// Removes what runs that died without cleaning up left (a test SIGKILLed by its timeout,
/// a killed lab run): for every prefix [`claim`]ed on this machine whose owner process is
/// gone, its bridges, ports, namespaces (and their processes) and root-namespace
/// interfaces, such as a [`rootleg::RootLeg`] whose address and route would capture later
/// runs' traffic. A name that also starts with a live owner's prefix is left alone, and so
/// is every name no claim covers. Each dead prefix stays locked while it is swept, so a
/// run starting with that prefix meanwhile waits in [`claim`] instead of losing its network.
///
/// A run of a build older than the claims holds no lock, and a stale claim may carry its
/// prefix (deterministic per test). So a dead prefix is also left alone while any process
/// in its namespaces has a parent other than PID 1: a dead run's processes are orphans,
/// adopted by PID 1 (where a subreaper adopts them instead, such leftovers stay, reported in
/// [`Swept::in_use`]). A run of an old build that has no process in a namespace yet is
/// not recognised.
pub fn sweep_orphans() -> Result<Swept> {
    let dir = Path::new(OWNERS_DIR);
    let mut sw = Swept::default();
    // Hold the dead prefixes' locks until their names are gone.
    let mut dead: Vec<(String, File)> = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e.collect::<std::io::Result<Vec<_>>>()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    for e in entries {
        let prefix = e.file_name().to_string_lossy().into_owned();
        if check_prefix(&prefix).is_err() {
            continue;
        }
        match try_take_over(&e.path())? {
            Some(f) => dead.push((prefix, f)),
            None => sw.live.push(prefix),
        }
    }
    let mut names = netns::list_netns()?;
    names.extend(netns::list_links()?);
    if Ovs::is_running() {
        for br in Ovs::list_bridges()? {
            if let Ok(ports) = ovs::vsctl(&["list-ports", &br]) {
                names.extend(ports.lines().map(str::to_owned));
            }
            names.push(br);
        }
    }
    let dead_prefixes: Vec<String> = dead.iter().map(|(p, _)| p.clone()).collect();
    sw.unowned = unowned_names(&names, &dead_prefixes, &sw.live);
    for (prefix, _lock) in &dead {
        if netns_have_parented_process(names.iter().filter(|n| is_orphan(n, prefix, &sw.live))) {
            sw.in_use.push(prefix.clone());
            continue;
        }
        if names.iter().any(|n| is_orphan(n, prefix, &sw.live)) {
            let cleaned = remove_matching(|n| is_orphan(n, prefix, &sw.live))?;
            sw.orphans.push((prefix.clone(), cleaned));
        }
    }
    Ok(sw)
}

/// True if a process in one of the namespaces among `names` (other names are skipped) has
/// a live parent outside them other than PID 1.
fn netns_have_parented_process<'a>(names: impl Iterator<Item = &'a String>) -> bool {
    let mut pids = Vec::new();
    for n in names {
        if netns::netns_exists(n) {
            pids.extend(netns::netns_pids(n));
        }
    }
    pids.iter()
        .filter_map(|&p| netns::parent_pid(p))
        .any(|pp| pp > 1 && !pids.contains(&pp) && netns::parent_pid(pp).is_some())
}

/// `Some(lock)` if nobody holds the owner lock at `path` (its owner is gone), taking it.
#[allow(clippy::incompatible_msrv)]
fn try_take_over(path: &Path) -> Result<Option<File>> {
    let f = open_lock_file(path)?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

/// True if `name` belongs to the dead owner of `prefix` and to no live owner.
fn is_orphan(name: &str, prefix: &str, live: &[String]) -> bool {
    name.starts_with(prefix) && !live.iter().any(|l| name.starts_with(l.as_str()))
}

/// The `fg…` names (sorted, once each) that start with no claimed prefix.
fn unowned_names(names: &[String], dead: &[String], live: &[String]) -> Vec<String> {
    let mut v: Vec<String> = names
        .iter()
        .filter(|n| n.starts_with("fg"))
        .filter(|n| !dead.iter().chain(live).any(|p| n.starts_with(p.as_str())))
        .cloned()
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Why the machine can't run the OVS tests, or `None` if it can (root, `ip`, `ethtool`,
/// OVS installed and started by [`Ovs::ensure_running`]).
pub fn root_ovs_unavailable() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned));
    if uid.as_deref() != Some("0") {
        return Some("not running as root (effective uid is not 0)".into());
    }
    for prog in ["ip", "ethtool", "ovs-vsctl", "ovs-ofctl"] {
        if !cmd::have(prog) {
            return Some(format!("`{prog}` is not installed"));
        }
    }
    match Ovs::ensure_running() {
        Ok(()) => None,
        Err(e) => Some(format!("Open vSwitch could not be started: {e}")),
    }
}

/// For tests: `true` if root + OVS are available. Otherwise, when the `CI` environment
/// variable is unset, prints why the test is skipped and returns `false`; when `CI` is set,
/// panics (a CI machine must be able to run them).
pub fn require_root_ovs(test: &str) -> bool {
    match root_ovs_unavailable() {
        None => true,
        Some(reason) => {
            if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
                panic!("{test}: CI is set but the OVS testbed is unavailable: {reason}");
            }
            eprintln!("SKIPPED {test}: {reason} (set CI=1 to make this a failure)");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_short_and_stable() {
        let a = Prefix::for_test("two_hosts");
        assert_eq!(a, Prefix::for_test("two_hosts"));
        assert_eq!(a.as_str().len(), 6);
        assert!(a.as_str().starts_with("fg"));
        assert_ne!(Prefix::for_test("a"), Prefix::for_test("b"));
        assert_eq!(Prefix::random().as_str().len(), 6);
    }

    #[test]
    fn ifname_limits() {
        assert!(link::check_ifname("fg12abh1").is_ok());
        assert!(link::check_ifname("fg12abp123x1234").is_ok());
        assert!(link::check_ifname("fg12abp123x12345").is_err());
        assert!(link::check_ifname("a.b").is_err());
        assert!(link::check_ifname("").is_err());
    }

    #[test]
    fn cidr_parses() {
        assert_eq!(
            netns::parse_cidr("10.0.0.2/24").ok(),
            Some((
                "10.0.0.2"
                    .parse()
                    .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                24
            ))
        );
        assert!(netns::parse_cidr("10.0.0.2").is_err());
        assert!(netns::parse_cidr("10.0.0.2/33").is_err());
    }

    #[test]
    fn cleanup_refuses_short_prefix() {
        assert!(cleanup_stale("fg").is_err());
    }

    fn owners_dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fg-owners-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn claim_marks_owner_alive_until_it_dies() -> Result<()> {
        let dir = owners_dir("claim");
        // Claimed by this (live) process: not taken over, however often claimed.
        claim_in(&dir, "fgaaaa")?;
        claim_in(&dir, "fgaaaa")?;
        assert!(try_take_over(&dir.join("fgaaaa"))?.is_none());
        let pid = std::fs::read_to_string(dir.join("fgaaaa"))?;
        assert_eq!(pid.trim(), std::process::id().to_string());

        // A record whose owner finished: free.
        std::fs::write(dir.join("fgbbbb"), "1\n")?;
        assert!(try_take_over(&dir.join("fgbbbb"))?.is_some());

        // An owner holding the lock, then SIGKILLed: the kernel frees the lock. The owner is
        // one process (`sh` exec'ing `sleep` with the locked descriptor 9), so once it is
        // reaped nothing else holds the lock; `flock(1)` itself forks a child that might not
        // yet have closed its copy when the parent is killed.
        if cmd::have("flock") {
            let path = dir.join("fgcccc");
            let path_s = path.to_string_lossy().into_owned();
            let mut owner = std::process::Command::new("sh")
                .args([
                    "-c",
                    r#"exec 9>>"$0" && flock 9 && exec sleep 30"#,
                    path_s.as_str(),
                ])
                .spawn()?;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !path.exists() || try_take_over(&path)?.is_some() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "flock never took the lock"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(try_take_over(&path)?.is_none());
            owner.kill()?;
            owner.wait()?;
            assert!(try_take_over(&path)?.is_some());
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn sweep_spares_live_and_unowned_names() {
        let names: Vec<String> = [
            "fgdead1", "fgdeadh1", "fgdeadab", "fgdead", "fglive1", "fgzzzz1", "eth0", "fgde",
        ]
        .map(str::to_owned)
        .to_vec();
        // "fgdeadab" is a live run's prefix that happens to start with the dead one.
        let live = vec!["fglive".to_owned(), "fgdeadab".to_owned()];
        let doomed: Vec<&String> = names
            .iter()
            .filter(|n| is_orphan(n, "fgdead", &live))
            .collect();
        assert_eq!(doomed, ["fgdead1", "fgdeadh1", "fgdead"]);
        let dead = vec!["fgdead".to_owned()];
        assert_eq!(unowned_names(&names, &dead, &live), ["fgde", "fgzzzz1"]);
    }

    #[test]
    fn ppid_is_read_past_the_command_name() {
        assert_eq!(netns::ppid_from_stat("42 (httpd) S 7 42 42 0"), Some(7));
        assert_eq!(netns::ppid_from_stat("42 (a) b) (c) R 1 42"), Some(1));
        assert_eq!(netns::ppid_from_stat("42 (cut"), None);
        let me = netns::parent_pid(std::process::id());
        assert!(me.is_some_and(|p| p > 0), "{me:?}");
    }

    /// A process's log lasts as long as its guard: read while it runs, gone after (no
    /// namespace needed: the guard takes any command).
    #[test]
    fn a_process_log_goes_with_its_guard() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "echo started; exec sleep 30"]);
        let guard = netns::ProcGuard::spawn(cmd, "fgtest-log").expect("spawn");
        let log = guard.log_path().to_path_buf();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !guard.output().contains("started") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(guard.output(), "started\n");
        assert!(log.exists());
        drop(guard);
        assert!(!log.exists(), "{} left behind", log.display());
    }

    #[test]
    fn prefixes_must_be_plain() {
        assert!(check_prefix("fg12ab").is_ok());
        assert!(check_prefix("fglab").is_ok());
        assert!(check_prefix("fg/../x").is_err());
        assert!(claim("fg1").is_err());
    }

    #[test]
    fn command_errors_carry_command_and_stderr() {
        let e = cmd::run("sh", &["-c", "echo boom >&2; exit 3"]).err();
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("sh -c"), "{msg}");
        assert!(msg.contains("boom"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
    }
}
