//! A root-namespace leg on a bridge: a veth pair whose one end (`PREFIX+NAME`) stays in the
//! root namespace with an address in the test subnet, the other (`PREFIX+NAME+b`) is a port
//! on the bridge. It lets a process in the root namespace (the controller's health and
//! response-time probes) reach hosts in the test network.
//!
//! The leg's own traffic is not the controller's business: [`RootLeg::bypass_flows`] gives
//! the OpenFlow rules (cookie [`ROOTLEG_COOKIE`], priority 65000) that carry everything to
//! or from the leg's address with the switch's `NORMAL` L2 pipeline, so the controller
//! neither intercepts the probes (a service without a VIP intercepts every new connection
//! to a backend) nor learns the leg as a host. Install them on every bridge of the path.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::cmd;
use crate::error::Result;
use crate::link::{check_ifname, del_link, link_exists, wait_link_gone};
use crate::netns::parse_cidr;
use crate::ovs::Bridge;

/// Cookie of the bypass rules: kind byte 0xfe, which no flowgate rule kind uses, so the
/// controller's cookie-masked resync deletes never touch them.
pub const ROOTLEG_COOKIE: u64 = 0xfe00_0000_0000_0001;

/// A veth leg from the root namespace into a bridge. Drop removes the port and the pair.
#[derive(Debug)]
pub struct RootLeg {
    root_iface: String,
    bridge_iface: String,
    bridge: String,
    ip: Ipv4Addr,
    prefix_len: u8,
    keep: bool,
}

impl RootLeg {
    /// Creates leg `prefix+name` (root end) / `prefix+name+"b"` (bridge end) with address
    /// `ip_cidr` (e.g. `"100.0.0.254/24"`) on the root end, attached to `bridge`.
    pub fn create(prefix: &str, name: &str, ip_cidr: &str, bridge: &Bridge) -> Result<RootLeg> {
        let (ip, prefix_len) = parse_cidr(ip_cidr)?;
        let root_iface = format!("{prefix}{name}");
        let bridge_iface = format!("{prefix}{name}b");
        check_ifname(&root_iface)?;
        check_ifname(&bridge_iface)?;
        let leg = RootLeg {
            root_iface: root_iface.clone(),
            bridge_iface: bridge_iface.clone(),
            bridge: bridge.name().to_owned(),
            ip,
            prefix_len,
            keep: false,
        };
        for l in [&root_iface, &bridge_iface] {
            if link_exists(l) && !wait_link_gone(l, Duration::from_millis(200)) {
                del_link(l)?;
            }
        }
        cmd::run(
            "ip",
            &[
                "link",
                "add",
                &root_iface,
                "type",
                "veth",
                "peer",
                "name",
                &bridge_iface,
            ],
        )?;
        // No IPv6 chatter on either end; no checksum offload (the userspace datapath
        // forwards what a veth hands it as is, so TCP would fail).
        for l in [&root_iface, &bridge_iface] {
            cmd::run_quiet(
                "sysctl",
                &["-qw", &format!("net.ipv6.conf.{l}.disable_ipv6=1")],
            );
            cmd::run("ethtool", &["-K", l, "tx", "off"])?;
        }
        cmd::run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{ip}/{prefix_len}"),
                "dev",
                &root_iface,
            ],
        )?;
        cmd::run("ip", &["link", "set", &root_iface, "up"])?;
        cmd::run("ip", &["link", "set", &bridge_iface, "up"])?;
        bridge.add_port(&bridge_iface)?;
        Ok(leg)
    }

    /// The leg's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The prefix length of the leg's address.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// The root-namespace interface.
    pub fn root_iface(&self) -> &str {
        &self.root_iface
    }

    /// The bridge port.
    pub fn bridge_iface(&self) -> &str {
        &self.bridge_iface
    }

    /// The `ovs-ofctl add-flow` specs that carry the leg's IPv4 and ARP traffic with
    /// `NORMAL`, above every controller rule.
    pub fn bypass_flows(&self) -> Vec<String> {
        let ip = self.ip;
        let c = format!("cookie={ROOTLEG_COOKIE:#x},priority=65000");
        vec![
            format!("{c},ip,nw_src={ip},actions=NORMAL"),
            format!("{c},ip,nw_dst={ip},actions=NORMAL"),
            format!("{c},arp,arp_spa={ip},actions=NORMAL"),
            format!("{c},arp,arp_tpa={ip},actions=NORMAL"),
        ]
    }

    /// Installs [`RootLeg::bypass_flows`] on `bridge`.
    pub fn install_bypass(&self, bridge: &Bridge) -> Result<()> {
        for f in self.bypass_flows() {
            bridge.add_flow(&f)?;
        }
        Ok(())
    }

    /// Leaves the leg in place after drop (debugging by hand).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for RootLeg {
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
                &self.bridge_iface,
            ],
        );
        cmd::run_quiet("ip", &["link", "del", &self.root_iface]);
        wait_link_gone(&self.bridge_iface, Duration::from_secs(2));
    }
}
