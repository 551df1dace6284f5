//! Real test networks for flowgate: Open vSwitch bridges on the userspace datapath,
//! network namespaces joined by veth pairs, processes run inside namespaces, and the
//! clean-up of all of it (drop guards, plus [`cleanup_stale`] for a crashed run's leftovers).
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
pub mod load;
pub mod netns;
pub mod ovs;
pub mod rootleg;
pub mod topo;

pub use error::{Error, Result};
pub use netns::{Host, HostOptions, ProcGuard};
pub use ovs::{Bridge, Link, LinkKind, Ovs};
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
pub fn cleanup_stale(prefix: &str) -> Result<Cleaned> {
    if prefix.len() < 4 {
        return Err(Error::Invalid(format!(
            "cleanup prefix `{prefix}` is too short (min 4)"
        )));
    }
    let mut c = Cleaned::default();
    if Ovs::is_running() {
        for br in Ovs::list_bridges()? {
            if br.starts_with(prefix) {
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
            for port in ports.lines().filter(|p| p.starts_with(prefix)) {
                let _ = ovs::vsctl(&["--if-exists", "del-port", &br, port]);
            }
        }
    }
    for ns in netns::list_netns()? {
        if ns.starts_with(prefix) {
            netns::kill_netns_pids(&ns);
            cmd::run("ip", &["netns", "del", &ns])?;
            c.namespaces.push(ns);
        }
    }
    for l in netns::list_links()? {
        // Peers of deleted namespaces vanish on their own, a moment later.
        if l.starts_with(prefix)
            && !netns::wait_link_gone(&l, std::time::Duration::from_millis(500))
        {
            netns::del_link(&l)?;
            c.links.push(l);
        }
    }
    Ok(c)
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
        assert!(ovs::check_ifname("fg12abh1").is_ok());
        assert!(ovs::check_ifname("fg12abp123x1234").is_ok());
        assert!(ovs::check_ifname("fg12abp123x12345").is_err());
        assert!(ovs::check_ifname("a.b").is_err());
        assert!(ovs::check_ifname("").is_err());
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

    #[test]
    fn command_errors_carry_command_and_stderr() {
        let e = cmd::run("sh", &["-c", "echo boom >&2; exit 3"]).err();
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("sh -c"), "{msg}");
        assert!(msg.contains("boom"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
    }
}
