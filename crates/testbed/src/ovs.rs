//! Open vSwitch: starting the daemons, bridges on the userspace datapath, ports, flows and
//! links between bridges.
//!
//! Bridges always use `datapath_type=netdev` (the machine has no kernel module),
//! `protocols=OpenFlow13`, `fail_mode=secure` (no flows until someone installs them) and
//! `other-config:disable-in-band=true`. Controllers are set in the same transaction that
//! creates the bridge, because changing them later wipes the flow table.

use std::fs::File;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::cmd;
use crate::error::{Error, Result};
use crate::link::{check_ifname, disable_ipv6};

const OVS_CTL: &str = "/usr/share/openvswitch/scripts/ovs-ctl";

/// `ovs-vsctl --timeout=30 ARGS...`, checked.
pub fn vsctl(args: &[&str]) -> Result<String> {
    let mut v = vec!["--timeout=30"];
    v.extend_from_slice(args);
    cmd::run("ovs-vsctl", &v)
}

/// `ovs-ofctl -O OpenFlow13 ARGS...`, checked.
pub fn ofctl(args: &[&str]) -> Result<String> {
    let mut v = vec!["-O", "OpenFlow13"];
    v.extend_from_slice(args);
    cmd::run("ovs-ofctl", &v)
}

/// `ovs-appctl ARGS...` (ovs-vswitchd's own commands: datapath flows, coverage
/// counters, conntrack), checked.
pub fn appctl(args: &[&str]) -> Result<String> {
    cmd::run("ovs-appctl", args)
}

/// The Open vSwitch daemons.
#[derive(Debug)]
pub struct Ovs;

impl Ovs {
    /// True if `ovs-vsctl show` answers.
    pub fn is_running() -> bool {
        cmd::output("ovs-vsctl", &["--timeout=5", "show"])
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// Starts ovsdb-server and ovs-vswitchd with `ovs-ctl start` unless they already answer.
    ///
    /// Idempotent and safe from parallel tests and processes: the start is done under
    /// `flock` on a lock file, re-checking inside the lock.
    pub fn ensure_running() -> Result<()> {
        if Self::is_running() {
            return Ok(());
        }
        if !cmd::have("ovs-vsctl") || !cmd::have(OVS_CTL) {
            return Err(Error::Invalid(
                "Open vSwitch is not installed (ovs-vsctl / ovs-ctl missing)".into(),
            ));
        }
        let lock = std::env::temp_dir().join("flowgate-testbed-ovs-start.lock");
        let log_path = std::env::temp_dir().join("flowgate-testbed-ovs-start.log");
        let script = format!("ovs-vsctl --timeout=5 show >/dev/null 2>&1 || {OVS_CTL} start");
        // The daemons detach; give them a file, not a pipe, so nothing waits on our pipe.
        let log = File::create(&log_path)?;
        let mut c = if cmd::have("flock") {
            let mut c = Command::new("flock");
            c.arg("-w")
                .arg("120")
                .arg(&lock)
                .arg("sh")
                .arg("-c")
                .arg(&script);
            c
        } else {
            let mut c = Command::new("sh");
            c.arg("-c").arg(&script);
            c
        };
        let shown = format!("flock {} sh -c '{script}'", lock.display());
        let status = c
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .map_err(|source| Error::Spawn {
                cmd: shown.clone(),
                source,
            })?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Self::is_running() {
            if Instant::now() > deadline {
                let stderr = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(Error::Command {
                    cmd: shown,
                    status: status.to_string(),
                    stderr,
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// Waits for a round of ovs-vswitchd's revalidators that starts after this call
    /// (`ovs-appctl revalidator/wait`, as Open vSwitch's own tests use it): only then do
    /// the flows its datapath cached before a flow-table change act by the change. Until
    /// then a packet that matches a cached flow (a new connection's SYN, where the flow
    /// wildcards its ports) still does what the old rules said; the lag is up to
    /// `max-revalidator` (500 ms), more on a loaded machine.
    pub fn revalidated() -> Result<()> {
        appctl(&["revalidator/wait"]).map(|_| ())
    }

    /// Names of all bridges (`ovs-vsctl list-br`).
    pub fn list_bridges() -> Result<Vec<String>> {
        Ok(vsctl(&["list-br"])?
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.is_empty())
            .collect())
    }
}

/// An OVS bridge on the userspace datapath. Deleted on drop.
#[derive(Debug)]
pub struct Bridge {
    name: String,
    dpid: u64,
    next_ofport: AtomicU32,
    keep: bool,
}

impl Bridge {
    /// Creates (or re-creates, if a stale one has the same name) a bridge with the given
    /// datapath id and controllers (e.g. `"tcp:127.0.0.1:6653"`; may be empty).
    ///
    /// Each controller gets `max_backoff=1000` so the switch reconnects within a second.
    pub fn create(name: &str, dpid: u64, controllers: &[String]) -> Result<Bridge> {
        check_ifname(name)?;
        let dpid_s = format!("other-config:datapath-id={dpid:016x}");
        let mut args: Vec<String> = vec![
            "--if-exists".into(),
            "del-br".into(),
            name.into(),
            "--".into(),
            "add-br".into(),
            name.into(),
            "--".into(),
            "set".into(),
            "bridge".into(),
            name.into(),
            "datapath_type=netdev".into(),
            "protocols=OpenFlow13".into(),
            "fail_mode=secure".into(),
            dpid_s,
            "other-config:disable-in-band=true".into(),
        ];
        args.extend(controller_args(name, controllers));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        // Construct the guard first so a half-made bridge is removed on error.
        let br = Bridge {
            name: name.to_owned(),
            dpid,
            next_ofport: AtomicU32::new(1),
            keep: false,
        };
        vsctl(&refs)?;
        Ok(br)
    }

    /// The bridge name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The datapath id.
    pub fn dpid(&self) -> u64 {
        self.dpid
    }

    /// Replaces the controllers. Note: OVS wipes the flow table when controllers change.
    pub fn set_controller(&self, controllers: &[String]) -> Result<()> {
        let mut args: Vec<String> = vec!["del-controller".into(), self.name.clone()];
        args.extend(controller_args(&self.name, controllers));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        vsctl(&refs).map(drop)
    }

    /// True if at least one controller connection is up (`is_connected` in OVSDB).
    pub fn is_connected(&self) -> Result<bool> {
        let out = vsctl(&["get", "bridge", &self.name, "controller"])?;
        for uuid in out
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
        {
            let uuid = uuid.trim();
            if uuid.is_empty() {
                continue;
            }
            if vsctl(&["get", "controller", uuid, "is_connected"])?.trim() == "true" {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits until [`Bridge::is_connected`] or the timeout.
    pub fn wait_connected(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_connected()? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "bridge {} never connected to its controller",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Adds an existing interface as a port with the next free OpenFlow port number
    /// (pinned with `ofport_request`), and returns that number.
    pub fn add_port(&self, iface: &str) -> Result<u32> {
        let ofport = self.next_ofport.fetch_add(1, Ordering::SeqCst);
        self.add_port_with_ofport(iface, ofport)
    }

    /// Adds an interface as a port pinned to `ofport` and returns the number OVS gave it.
    pub fn add_port_with_ofport(&self, iface: &str, ofport: u32) -> Result<u32> {
        check_ifname(iface)?;
        self.bump_ofport(ofport);
        let req = format!("ofport_request={ofport}");
        vsctl(&[
            "add-port",
            &self.name,
            iface,
            "--",
            "set",
            "interface",
            iface,
            &req,
        ])?;
        self.ofport(iface)
    }

    fn bump_ofport(&self, used: u32) {
        self.next_ofport.fetch_max(used + 1, Ordering::SeqCst);
    }

    /// Next ofport [`Bridge::add_port`] would use; for builders that pin numbers.
    pub fn reserve_ofport(&self) -> u32 {
        self.next_ofport.fetch_add(1, Ordering::SeqCst)
    }

    /// The OpenFlow port number of `iface` on this bridge.
    pub fn ofport(&self, iface: &str) -> Result<u32> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = vsctl(&["get", "interface", iface, "ofport"])?;
            match out.trim().parse::<i64>() {
                Ok(n) if n > 0 => {
                    return u32::try_from(n).map_err(|_| Error::Parse {
                        cmd: format!("ovs-vsctl get interface {iface} ofport"),
                        detail: out.clone(),
                    });
                }
                // `[]` or -1 while vswitchd has not caught up (or the port failed).
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    let err = vsctl(&["get", "interface", iface, "error"]).unwrap_or_default();
                    return Err(Error::Parse {
                        cmd: format!("ovs-vsctl get interface {iface} ofport"),
                        detail: format!(
                            "no valid ofport ({}); interface error: {}",
                            out.trim(),
                            err.trim()
                        ),
                    });
                }
            }
        }
    }

    /// Removes a port (if present).
    pub fn del_port(&self, iface: &str) -> Result<()> {
        vsctl(&["--if-exists", "del-port", &self.name, iface]).map(drop)
    }

    /// `ovs-ofctl -O OpenFlow13 dump-flows BR`.
    pub fn dump_flows(&self) -> Result<String> {
        ofctl(&["dump-flows", &self.name])
    }

    /// `ovs-ofctl -O OpenFlow13 add-flow BR FLOW`, e.g. `"actions=NORMAL"`.
    pub fn add_flow(&self, flow: &str) -> Result<()> {
        ofctl(&["add-flow", &self.name, flow]).map(drop)
    }

    /// `ovs-ofctl -O OpenFlow13 del-flows BR`.
    pub fn del_flows(&self) -> Result<()> {
        ofctl(&["del-flows", &self.name]).map(drop)
    }

    /// Any other `ovs-ofctl -O OpenFlow13 SUBCMD BR ARGS...`.
    pub fn ofctl(&self, subcmd: &str, args: &[&str]) -> Result<String> {
        let mut v = vec![subcmd, self.name.as_str()];
        v.extend_from_slice(args);
        ofctl(&v)
    }

    /// Administratively brings a port down or up (`ovs-ofctl mod-port BR PORT down|up`);
    /// the controller sees an OFPT_PORT_STATUS.
    pub fn set_port_up(&self, iface: &str, up: bool) -> Result<()> {
        ofctl(&[
            "mod-port",
            &self.name,
            iface,
            if up { "up" } else { "down" },
        ])
        .map(drop)
    }

    /// Keeps the bridge after drop (for debugging a failed test by hand).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if !self.keep {
            cmd::run_quiet(
                "ovs-vsctl",
                &["--timeout=30", "--if-exists", "del-br", &self.name],
            );
            // The userspace datapath's tap device for the bridge's local port.
            crate::link::wait_link_gone(&self.name, Duration::from_secs(2));
        }
    }
}

fn controller_args(bridge: &str, controllers: &[String]) -> Vec<String> {
    let mut args = Vec::new();
    if controllers.is_empty() {
        return args;
    }
    let mut ids = Vec::new();
    for (i, target) in controllers.iter().enumerate() {
        let id = format!("@c{i}");
        args.extend([
            "--".into(),
            format!("--id={id}"),
            "create".into(),
            "controller".into(),
            format!("target=\"{target}\""),
            "max_backoff=1000".into(),
        ]);
        ids.push(id);
    }
    args.extend([
        "--".into(),
        "set".into(),
        "bridge".into(),
        bridge.into(),
        format!("controller={}", ids.join(",")),
    ]);
    args
}

/// How two bridges are wired together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum LinkKind {
    /// OVS patch ports: no kernel device, no checksum offload trouble, carries everything
    /// (LLDP included) and works in the userspace datapath. Link failure is simulated with
    /// [`Link::set_up`] (port mod), which OVS reports as a port status change.
    #[default]
    Patch,
    /// A veth pair with transmit checksum offload off on both ends; behaves like a cable
    /// (`ip link set down` on one end takes the link down).
    Veth,
}

/// One end of a link between bridges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEnd {
    /// Bridge name.
    pub bridge: String,
    /// Port (interface) name on that bridge.
    pub iface: String,
    /// OpenFlow port number.
    pub ofport: u32,
}

/// A link between two bridges. Drop removes the ports (and the veth pair).
#[derive(Debug)]
pub struct Link {
    /// Patch or veth.
    pub kind: LinkKind,
    /// End on the first bridge.
    pub a: LinkEnd,
    /// End on the second bridge.
    pub b: LinkEnd,
}

impl Link {
    /// Connects `a` and `b` with interfaces named `a_iface` (on `a`) and `b_iface` (on `b`).
    pub fn create(
        kind: LinkKind,
        a: &Bridge,
        a_iface: &str,
        b: &Bridge,
        b_iface: &str,
    ) -> Result<Link> {
        check_ifname(a_iface)?;
        check_ifname(b_iface)?;
        let pa = a.reserve_ofport();
        let pb = b.reserve_ofport();
        let mut link = Link {
            kind,
            a: LinkEnd {
                bridge: a.name().into(),
                iface: a_iface.into(),
                ofport: pa,
            },
            b: LinkEnd {
                bridge: b.name().into(),
                iface: b_iface.into(),
                ofport: pb,
            },
        };
        match kind {
            LinkKind::Patch => {
                let (ra, rb) = (
                    format!("ofport_request={pa}"),
                    format!("ofport_request={pb}"),
                );
                let (peer_a, peer_b) = (
                    format!("options:peer={b_iface}"),
                    format!("options:peer={a_iface}"),
                );
                vsctl(&[
                    "add-port",
                    a.name(),
                    a_iface,
                    "--",
                    "set",
                    "interface",
                    a_iface,
                    "type=patch",
                    &peer_a,
                    &ra,
                    "--",
                    "add-port",
                    b.name(),
                    b_iface,
                    "--",
                    "set",
                    "interface",
                    b_iface,
                    "type=patch",
                    &peer_b,
                    &rb,
                ])?;
            }
            LinkKind::Veth => {
                cmd::run(
                    "ip",
                    &[
                        "link", "add", a_iface, "type", "veth", "peer", "name", b_iface,
                    ],
                )?;
                for i in [a_iface, b_iface] {
                    disable_ipv6(i);
                    cmd::run("ethtool", &["-K", i, "tx", "off"])?;
                    cmd::run("ip", &["link", "set", i, "up"])?;
                }
                let (ra, rb) = (
                    format!("ofport_request={pa}"),
                    format!("ofport_request={pb}"),
                );
                vsctl(&[
                    "add-port",
                    a.name(),
                    a_iface,
                    "--",
                    "set",
                    "interface",
                    a_iface,
                    &ra,
                    "--",
                    "add-port",
                    b.name(),
                    b_iface,
                    "--",
                    "set",
                    "interface",
                    b_iface,
                    &rb,
                ])?;
            }
        }
        link.a.ofport = a.ofport(a_iface)?;
        link.b.ofport = b.ofport(b_iface)?;
        Ok(link)
    }

    /// Takes the link down or up. Veth: `ip link set` on the `a` end (carrier drops on both
    /// ends). Patch: `ovs-ofctl mod-port` on both ends.
    pub fn set_up(&self, up: bool) -> Result<()> {
        match self.kind {
            LinkKind::Veth => cmd::run(
                "ip",
                &["link", "set", &self.a.iface, if up { "up" } else { "down" }],
            )
            .map(drop),
            LinkKind::Patch => {
                for end in [&self.a, &self.b] {
                    ofctl(&[
                        "mod-port",
                        &end.bridge,
                        &end.iface,
                        if up { "up" } else { "down" },
                    ])?;
                }
                Ok(())
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        cmd::run_quiet(
            "ovs-vsctl",
            &[
                "--timeout=30",
                "--if-exists",
                "del-port",
                &self.a.bridge,
                &self.a.iface,
                "--",
                "--if-exists",
                "del-port",
                &self.b.bridge,
                &self.b.iface,
            ],
        );
        if self.kind == LinkKind::Veth && crate::link::link_exists(&self.a.iface) {
            let _ = crate::link::del_link(&self.a.iface);
            crate::link::wait_link_gone(&self.b.iface, Duration::from_secs(2));
        }
    }
}
