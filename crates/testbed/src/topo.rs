//! Mininet-like topologies: `single`, `linear`, `tree`.
//!
//! Naming follows Mininet: switches `s1..sN` with dpids 1..N, hosts `h1..hM` with
//! `10.0.0.i/24` and MAC `00:00:00:00:00:ii` (i = host number). Links are added in Mininet's
//! order, and every bridge numbers its ports 1, 2, ... in the order its links were added.
//! Interface names: bridge `PREFIXsN`, host namespace and bridge-side veth `PREFIXhN`,
//! inter-switch ports `PREFIXpAxB` (on sA, towards sB).

use std::net::Ipv4Addr;

use crate::error::{Error, Result};
use crate::netns::{Host, HostOptions};
use crate::ovs::{Bridge, Link, LinkKind};

/// How to build a topology.
#[derive(Debug, Clone)]
pub struct TopoOptions {
    /// Name prefix, e.g. from [`crate::Prefix`]; at most 8 characters so every name fits.
    pub prefix: String,
    /// Controller targets for every bridge, e.g. `["tcp:127.0.0.1:6653"]`. May be empty.
    pub controllers: Vec<String>,
    /// Patch ports (default) or veth pairs between switches.
    pub link_kind: LinkKind,
}

impl TopoOptions {
    /// Options with the given prefix, no controller, patch links.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            controllers: Vec::new(),
            link_kind: LinkKind::Patch,
        }
    }
    /// Sets the controllers.
    pub fn controllers(mut self, c: &[&str]) -> Self {
        self.controllers = c.iter().map(|s| (*s).to_owned()).collect();
        self
    }
    /// Sets the link kind.
    pub fn link_kind(mut self, k: LinkKind) -> Self {
        self.link_kind = k;
        self
    }
}

/// A built network. Dropping it removes everything: hosts (and their processes) first,
/// then links, then bridges.
#[derive(Debug)]
pub struct Topology {
    /// Hosts h1..hM.
    pub hosts: Vec<Host>,
    /// Inter-switch links in creation order.
    pub links: Vec<Link>,
    /// Switches s1..sN (dpid i for `s<i>`).
    pub bridges: Vec<Bridge>,
    /// The name prefix used.
    pub prefix: String,
}

impl Topology {
    fn new(opts: &TopoOptions) -> Result<Self> {
        if opts.prefix.len() > 8 {
            return Err(Error::Invalid(format!(
                "topology prefix `{}` longer than 8 characters",
                opts.prefix
            )));
        }
        Ok(Self {
            hosts: Vec::new(),
            links: Vec::new(),
            bridges: Vec::new(),
            prefix: opts.prefix.clone(),
        })
    }

    fn add_switch(&mut self, opts: &TopoOptions) -> Result<usize> {
        let n = self.bridges.len() + 1;
        let name = format!("{}s{n}", opts.prefix);
        self.bridges
            .push(Bridge::create(&name, n as u64, &opts.controllers)?);
        Ok(n - 1)
    }

    fn add_host(&mut self, opts: &TopoOptions, sw: usize) -> Result<usize> {
        let n = self.hosts.len() + 1;
        if n > 254 {
            return Err(Error::Invalid("more than 254 hosts".into()));
        }
        let hopts = HostOptions {
            mac: Some(format!("00:00:00:00:00:{n:02x}")),
            ..HostOptions::default()
        };
        let host = Host::create_with(
            &opts.prefix,
            &format!("h{n}"),
            &format!("10.0.0.{n}/24"),
            &self.bridges[sw],
            &hopts,
        )?;
        self.hosts.push(host);
        Ok(n - 1)
    }

    fn add_link(&mut self, opts: &TopoOptions, a: usize, b: usize) -> Result<()> {
        let p = &opts.prefix;
        let (an, bn) = (a + 1, b + 1);
        let link = Link::create(
            opts.link_kind,
            &self.bridges[a],
            &format!("{p}p{an}x{bn}"),
            &self.bridges[b],
            &format!("{p}p{bn}x{an}"),
        )?;
        self.links.push(link);
        Ok(())
    }

    /// Host by short name (`"h1"`).
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name() == name)
    }

    /// Switch by short name (`"s1"`).
    pub fn bridge(&self, name: &str) -> Option<&Bridge> {
        let full = format!("{}{name}", self.prefix);
        self.bridges.iter().find(|b| b.name() == full)
    }

    /// Installs `flow` (e.g. `"actions=NORMAL"`) on every bridge.
    pub fn add_flow_all(&self, flow: &str) -> Result<()> {
        self.bridges.iter().try_for_each(|b| b.add_flow(flow))
    }

    /// Pings every ordered pair of hosts once (after one warm-up try with `ping_until`);
    /// returns the pairs that failed, as `(src, dst)` short names.
    pub fn ping_all(&self) -> Result<Vec<(String, String)>> {
        let mut failed = Vec::new();
        for a in &self.hosts {
            for b in &self.hosts {
                if a.name() != b.name()
                    && !a.ping_until(b.ip(), std::time::Duration::from_secs(3))?
                {
                    failed.push((a.name().to_owned(), b.name().to_owned()));
                }
            }
        }
        Ok(failed)
    }

    /// IPs of all hosts in order.
    pub fn ips(&self) -> Vec<Ipv4Addr> {
        self.hosts.iter().map(Host::ip).collect()
    }
}

/// One switch `s1` with `n_hosts` hosts (ports 1..n).
pub fn single(opts: &TopoOptions, n_hosts: usize) -> Result<Topology> {
    let mut t = Topology::new(opts)?;
    let s = t.add_switch(opts)?;
    for _ in 0..n_hosts {
        t.add_host(opts, s)?;
    }
    Ok(t)
}

/// `n_switches` switches in a chain, each with `hosts_per_switch` hosts (Mininet's
/// `LinearTopo(k, n)`; hosts are numbered h1.. across switches in order).
pub fn linear(opts: &TopoOptions, n_switches: usize, hosts_per_switch: usize) -> Result<Topology> {
    let mut t = Topology::new(opts)?;
    let mut last: Option<usize> = None;
    for _ in 0..n_switches {
        let s = t.add_switch(opts)?;
        for _ in 0..hosts_per_switch {
            t.add_host(opts, s)?;
        }
        if let Some(l) = last {
            t.add_link(opts, s, l)?;
        }
        last = Some(s);
    }
    Ok(t)
}

/// A tree of switches `depth` levels deep with `fanout` children each, hosts at the
/// leaves (Mininet's `TreeTopo`; switches numbered in pre-order, s1 is the root).
pub fn tree(opts: &TopoOptions, depth: usize, fanout: usize) -> Result<Topology> {
    let mut t = Topology::new(opts)?;
    if depth == 0 {
        return Err(Error::Invalid("tree depth must be at least 1".into()));
    }
    add_tree(&mut t, opts, depth, fanout)?;
    Ok(t)
}

enum Node {
    Switch(usize),
    Host,
}

fn add_tree(t: &mut Topology, opts: &TopoOptions, depth: usize, fanout: usize) -> Result<Node> {
    if depth == 0 {
        return Ok(Node::Host);
    }
    let s = t.add_switch(opts)?;
    for _ in 0..fanout {
        // Build the child subtree first (as Mininet does), then link it to this switch.
        if depth == 1 {
            t.add_host(opts, s)?;
        } else if let Node::Switch(c) = add_tree(t, opts, depth - 1, fanout)? {
            t.add_link(opts, s, c)?;
        }
    }
    Ok(Node::Switch(s))
}
