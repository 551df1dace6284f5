//! Hosts: a network namespace with one veth into a bridge, and processes run inside it.
//!
//! Processes run in a namespace through `ip netns exec NS PROGRAM ARGS...` (no `setns`,
//! no unsafe code). Spawned processes lead their own process group, which is killed on drop.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cmd;
use crate::error::{Error, Result};
use crate::link::{check_ifname, del_link, disable_ipv6, link_exists, wait_link_gone};
use crate::ovs::Bridge;

/// Name of the host's interface inside its namespace.
pub const HOST_IFACE: &str = "eth0";

/// Options for [`Host::create_with`].
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// MAC of the host's interface (`aa:bb:cc:dd:ee:ff`); random if `None`.
    pub mac: Option<String>,
    /// Keep IPv6 enabled (off by default so no IPv6 chatter reaches the controller).
    pub ipv6: bool,
    /// Default gateway to add, if any.
    pub gateway: Option<Ipv4Addr>,
    /// Pin the host's port to this OpenFlow port number (next free one if `None`).
    pub ofport: Option<u32>,
}

/// A host: a network namespace `PREFIX+NAME` holding `eth0`, whose veth peer `PREFIX+NAME`
/// is a port on a bridge. Drop kills every process in the namespace and removes the
/// namespace, the veth and the port.
#[derive(Debug)]
pub struct Host {
    name: String,
    ns: String,
    veth: String,
    bridge: String,
    ip: Ipv4Addr,
    prefix_len: u8,
    mac: String,
    ofport: u32,
    keep: bool,
}

/// Parses `"10.0.0.2/24"`.
pub fn parse_cidr(cidr: &str) -> Result<(Ipv4Addr, u8)> {
    let bad = || Error::Invalid(format!("`{cidr}` is not an IPv4 CIDR like 10.0.0.2/24"));
    let (ip, len) = cidr.split_once('/').ok_or_else(bad)?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    if len > 32 {
        return Err(bad());
    }
    Ok((ip, len))
}

impl Host {
    /// Creates host `name` (ns and bridge-side veth are both called `prefix+name`, which
    /// must fit 15 characters) with address `ip_cidr` on `eth0`, attached to `bridge`.
    pub fn create(
        prefix: &str,
        name: &str,
        ip_cidr: &str,
        bridge: &Bridge,
        mac: Option<&str>,
    ) -> Result<Host> {
        let opts = HostOptions {
            mac: mac.map(str::to_owned),
            ..HostOptions::default()
        };
        Self::create_with(prefix, name, ip_cidr, bridge, &opts)
    }

    /// [`Host::create`] with more options.
    pub fn create_with(
        prefix: &str,
        name: &str,
        ip_cidr: &str,
        bridge: &Bridge,
        opts: &HostOptions,
    ) -> Result<Host> {
        let (ip, prefix_len) = parse_cidr(ip_cidr)?;
        let full = format!("{prefix}{name}");
        check_ifname(&full)?;
        if let Some(mac) = &opts.mac {
            check_mac(mac)?;
        }
        // Guard first: whatever fails below, drop undoes what was made.
        let mut host = Host {
            name: name.to_owned(),
            ns: full.clone(),
            veth: full.clone(),
            bridge: bridge.name().to_owned(),
            ip,
            prefix_len,
            mac: String::new(),
            ofport: 0,
            keep: false,
        };
        if netns_exists(&full) {
            kill_netns_pids(&full);
            cmd::run_quiet("ip", &["netns", "del", &full]);
        }
        if link_exists(&full) && !wait_link_gone(&full, Duration::from_secs(2)) {
            del_link(&full)?;
        }
        cmd::run("ip", &["netns", "add", &full])?;
        cmd::run(
            "ip",
            &[
                "link", "add", &full, "type", "veth", "peer", "name", HOST_IFACE, "netns", &full,
            ],
        )?;
        if !opts.ipv6 {
            host.exec_checked(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
            host.exec_checked(&["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"])?;
            disable_ipv6(&full);
        }
        let ns = full.as_str();
        if let Some(mac) = &opts.mac {
            cmd::run("ip", &["-n", ns, "link", "set", HOST_IFACE, "address", mac])?;
        }
        cmd::run("ip", &["-n", ns, "addr", "add", ip_cidr, "dev", HOST_IFACE])?;
        cmd::run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        cmd::run("ip", &["-n", ns, "link", "set", HOST_IFACE, "up"])?;
        // The userspace datapath forwards frames as the veth hands them over: with transmit
        // checksum offload on, TCP segments leave with bad checksums. Turn it off both ends.
        host.exec_checked(&["ethtool", "-K", HOST_IFACE, "tx", "off"])?;
        cmd::run("ethtool", &["-K", &full, "tx", "off"])?;
        cmd::run("ip", &["link", "set", &full, "up"])?;
        if let Some(gw) = opts.gateway {
            let gw = gw.to_string();
            cmd::run("ip", &["-n", ns, "route", "add", "default", "via", &gw])?;
        }
        host.mac = host
            .exec_checked(&["cat", "/sys/class/net/eth0/address"])?
            .trim()
            .to_owned();
        host.ofport = match opts.ofport {
            Some(p) => bridge.add_port_with_ofport(&full, p)?,
            None => bridge.add_port(&full)?,
        };
        Ok(host)
    }

    /// The short name given at creation (e.g. `h1`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The namespace name (`prefix+name`).
    pub fn ns(&self) -> &str {
        &self.ns
    }
    /// The bridge-side veth name (same as the namespace name).
    pub fn bridge_iface(&self) -> &str {
        &self.veth
    }
    /// The bridge this host hangs off.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }
    /// IPv4 address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }
    /// Prefix length of the address.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }
    /// MAC address of `eth0`, lower-case `aa:bb:..`.
    pub fn mac(&self) -> &str {
        &self.mac
    }
    /// OpenFlow port number of the host's port on its bridge.
    pub fn ofport(&self) -> u32 {
        self.ofport
    }

    /// Unplug the host from its bridge and plug it into `to` (a virtual machine migrated
    /// to another hypervisor: its namespace, addresses and open sockets stay as they
    /// are). Returns its OpenFlow port number there.
    pub fn move_to(&mut self, to: &crate::ovs::Bridge) -> Result<u32> {
        crate::ovs::vsctl(&["--timeout=30", "del-port", &self.bridge, &self.veth])?;
        self.ofport = to.add_port(&self.veth)?;
        self.bridge = to.name().to_string();
        Ok(self.ofport)
    }

    /// The argv prefix that runs a program in this namespace.
    pub fn exec_prefix(&self) -> [&str; 3] {
        ["netns", "exec", &self.ns]
    }

    /// A [`Command`] running `argv` in this namespace (via `ip netns exec`).
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns])
            .args(argv)
            .stdin(Stdio::null());
        c
    }

    /// Runs `argv` in the namespace to completion; returns its output whatever the status.
    pub fn exec(&self, argv: &[&str]) -> Result<Output> {
        let mut v = vec!["netns", "exec", self.ns.as_str()];
        v.extend_from_slice(argv);
        cmd::output("ip", &v)
    }

    /// Like [`Host::exec`] but fails on a non-zero exit; returns stdout.
    pub fn exec_checked(&self, argv: &[&str]) -> Result<String> {
        let mut v = vec!["netns", "exec", self.ns.as_str()];
        v.extend_from_slice(argv);
        cmd::run("ip", &v)
    }

    /// Starts `argv` in the namespace, stdout and stderr going to a log file; the process
    /// (group) is killed when the guard drops.
    pub fn spawn(&self, argv: &[&str]) -> Result<ProcGuard> {
        ProcGuard::spawn(
            self.command(argv),
            &format!(
                "{}.{}",
                self.ns,
                argv.first().map(|a| basename(a)).unwrap_or("proc")
            ),
        )
    }

    /// `ping -c COUNT -W 1 -i 0.2 DST`; true if every probe was answered.
    pub fn ping(&self, dst: Ipv4Addr, count: u32) -> Result<bool> {
        let c = count.to_string();
        let d = dst.to_string();
        Ok(self
            .exec(&["ping", "-n", "-q", "-c", &c, "-W", "1", "-i", "0.2", &d])?
            .status
            .success())
    }

    /// Pings until one answer arrives or `timeout` passes (the first packets may go to a
    /// controller that is still learning).
    pub fn ping_until(&self, dst: Ipv4Addr, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.ping(dst, 1)? {
                return Ok(true);
            }
            if Instant::now() > deadline {
                return Ok(false);
            }
        }
    }

    /// Installs a static ARP entry (`ip neigh replace IP lladdr MAC dev eth0`).
    pub fn set_arp(&self, ip: Ipv4Addr, mac: &str) -> Result<()> {
        check_mac(mac)?;
        let ip = ip.to_string();
        cmd::run(
            "ip",
            &[
                "-n",
                &self.ns,
                "neigh",
                "replace",
                &ip,
                "lladdr",
                mac,
                "dev",
                HOST_IFACE,
                "nud",
                "permanent",
            ],
        )
        .map(drop)
    }

    /// Makes the host a direct-server-return backend for `vip`: the address on `lo` (so it
    /// accepts packets a load balancer hands it by MAC with the VIP still their destination,
    /// and answers from the VIP), while it never answers ARP for it (`arp_ignore=1`: only
    /// for addresses of the asking interface) nor uses it as the source of its own ARP
    /// requests (`arp_announce=2`), which would teach the network the VIP's MAC is its.
    /// The sysctls come first, so the host never answers for the VIP in between.
    pub fn add_loopback_vip(&self, vip: Ipv4Addr) -> Result<()> {
        self.exec_checked(&["sysctl", "-qw", "net.ipv4.conf.all.arp_ignore=1"])?;
        self.exec_checked(&["sysctl", "-qw", "net.ipv4.conf.all.arp_announce=2"])?;
        let addr = format!("{vip}/32");
        cmd::run("ip", &["-n", &self.ns, "addr", "add", &addr, "dev", "lo"]).map(drop)
    }

    /// Adds a route (`ip route add DEST via GW` or `dev eth0` when `via` is `None`).
    pub fn add_route(&self, dest: &str, via: Option<Ipv4Addr>) -> Result<()> {
        match via {
            Some(gw) => {
                let gw = gw.to_string();
                cmd::run("ip", &["-n", &self.ns, "route", "add", dest, "via", &gw]).map(drop)
            }
            None => cmd::run(
                "ip",
                &["-n", &self.ns, "route", "add", dest, "dev", HOST_IFACE],
            )
            .map(drop),
        }
    }

    /// Polls `url` with curl from inside this namespace until it answers 200 or `timeout`.
    pub fn wait_http(&self, url: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.exec(&[
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-m",
                "1",
                "-w",
                "%{http_code}",
                url,
            ])?;
            if String::from_utf8_lossy(&out.stdout).trim() == "200" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "{url} did not answer 200 from {} within {timeout:?}",
                    self.ns
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Leaves the namespace and veth in place after drop (debugging by hand).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        cmd::run_quiet(
            "ovs-vsctl",
            &[
                "--timeout=30",
                "--if-exists",
                "del-port",
                &self.bridge,
                &self.veth,
            ],
        );
        kill_netns_pids(&self.ns);
        cmd::run_quiet("ip", &["netns", "del", &self.ns]);
        if !std::thread::panicking() {
            remove_logs_of(&self.ns);
        }
        // Deleting the namespace destroys eth0 and with it the peer, but asynchronously:
        // wait for that so the name is free when drop returns, then insist.
        if !wait_link_gone(&self.veth, Duration::from_secs(3)) {
            let _ = del_link(&self.veth);
        }
    }
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn check_mac(mac: &str) -> Result<()> {
    let ok = mac.split(':').count() == 6
        && mac
            .split(':')
            .all(|b| b.len() == 2 && b.bytes().all(|c| c.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!("`{mac}` is not a MAC address")))
    }
}

/// True if a network namespace of that name exists.
pub fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// Names of all network namespaces (`ip netns list`).
pub fn list_netns() -> Result<Vec<String>> {
    Ok(cmd::run("ip", &["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// Names of all interfaces in the root namespace.
pub fn list_links() -> Result<Vec<String>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/sys/class/net")? {
        v.push(e?.file_name().to_string_lossy().into_owned());
    }
    Ok(v)
}

/// The processes in namespace `ns` (`ip netns pids`); none if it can't be read.
pub fn netns_pids(ns: &str) -> Vec<u32> {
    let Ok(out) = cmd::run("ip", &["netns", "pids", ns]) else {
        return Vec::new();
    };
    out.split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// SIGKILLs every process in namespace `ns` (`ip netns pids`).
pub fn kill_netns_pids(ns: &str) {
    let pids: Vec<String> = netns_pids(ns).iter().map(u32::to_string).collect();
    if pids.is_empty() {
        return;
    }
    let mut args = vec!["-KILL"];
    args.extend(pids.iter().map(String::as_str));
    cmd::run_quiet("kill", &args);
}

/// The parent of process `pid`, from `/proc/PID/stat`; `None` if it is gone.
pub fn parent_pid(pid: u32) -> Option<u32> {
    ppid_from_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
pub(crate) fn ppid_from_stat(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

static SPAWN_SEQ: AtomicU64 = AtomicU64::new(0);

/// Where [`ProcGuard`]s write their processes' output.
fn log_dir() -> PathBuf {
    std::env::temp_dir().join("flowgate-testbed")
}

/// Removes the logs of the processes started in namespace `ns` ([`Host::spawn`] names
/// them `NS.COMMAND-PID-N.log`; no interface name holds a `.`, so another namespace's
/// never match): the namespace is gone and its processes with it, including those whose
/// guards were leaked by a crash.
pub(crate) fn remove_logs_of(ns: &str) {
    let Ok(dir) = std::fs::read_dir(log_dir()) else {
        return;
    };
    let lead = format!("{ns}.");
    for e in dir.flatten() {
        if e.file_name().to_str().is_some_and(|n| n.starts_with(&lead)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A child process (in its own process group) killed with its group on drop.
/// Its stdout and stderr go to [`ProcGuard::log_path`], a file under the temporary folder
/// that goes with the guard, unless the thread is panicking (a failed test's servers
/// and clients keep theirs): every run used to leave each of its processes' logs behind,
/// thousands a day on a machine that runs the tests.
#[derive(Debug)]
pub struct ProcGuard {
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl ProcGuard {
    /// Spawns `command` in a new process group with output to a log file named after `tag`.
    pub fn spawn(mut command: Command, tag: &str) -> Result<ProcGuard> {
        let dir = log_dir();
        std::fs::create_dir_all(&dir)?;
        let n = SPAWN_SEQ.fetch_add(1, Ordering::Relaxed);
        let log = dir.join(format!("{tag}-{}-{n}.log", std::process::id()));
        let f = File::create(&log)?;
        command.stdout(f.try_clone()?).stderr(f).process_group(0);
        let shown = format!("{command:?}");
        let child = command
            .spawn()
            .map_err(|source| Error::Spawn { cmd: shown, source })?;
        Ok(ProcGuard {
            child,
            log,
            exited: None,
        })
    }

    /// The process id (also the process group id).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Where stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `Some(status)` once the process has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait()?;
        }
        Ok(self.exited)
    }

    /// Waits until the output contains `needle`; fails if the process exits first or on
    /// timeout (the error includes the output).
    pub fn wait_for_output(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.output();
            if out.contains(needle) {
                return Ok(());
            }
            if let Some(st) = self.try_wait()? {
                return Err(Error::Command {
                    cmd: format!("{:?}", self.child),
                    status: st.to_string(),
                    stderr: out,
                });
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "`{needle}` not printed within {timeout:?}; output: {out}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for exit up to `timeout`, then kills the group. Returns the status if it exited.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(Some(st));
            }
            if Instant::now() > deadline {
                self.kill();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM to the group, waits up to 2 s for the leader, then SIGKILLs the group.
    /// The group is only signalled while its leader is not yet reaped, so the id cannot
    /// have been reused by an unrelated process.
    pub fn kill(&mut self) {
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        let pg = format!("-{}", self.child.id());
        cmd::run_quiet("kill", &["-TERM", "--", &pg]);
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if matches!(self.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        cmd::run_quiet("kill", &["-KILL", "--", &pg]);
        let _ = self.child.kill();
        if let Ok(st) = self.child.wait() {
            self.exited = Some(st);
        }
    }
}

impl Drop for ProcGuard {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
