//! The network of the paper's Fig. 9 on Open vSwitch and network namespaces.
//!
//! Three switches: `s1` (clients h1..h15), `s2` (clients h16..h30) and `s3` (the four HTTP
//! servers), wired s1–s3 and s2–s3 with OVS patch ports. Servers `sv1..sv4` have the
//! paper's addresses 100.0.0.1..4; client `hN` has 100.0.0.(10+N); the controller's root
//! leg on `s3` has 100.0.0.254, all in 100.0.0.0/24. With fewer clients (`--quick`) the
//! first half goes on s1 and the rest on s2.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use flowgate_testbed::netns::HostOptions;
use flowgate_testbed::rootleg::RootLeg;
use flowgate_testbed::{Bridge, Host, Link, LinkKind, ProcGuard};

use crate::scenario::{Fault, Params};

/// The servers' addresses (the paper's).
pub const SERVERS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(100, 0, 0, 1),
    Ipv4Addr::new(100, 0, 0, 2),
    Ipv4Addr::new(100, 0, 0, 3),
    Ipv4Addr::new(100, 0, 0, 4),
];
/// The server every client addresses (the paper's S_er-2).
pub const REQUESTED: Ipv4Addr = SERVERS[1];
/// The controller's leg into the network.
pub const LEG_CIDR: &str = "100.0.0.254/24";
/// The iperf3 port on server 2.
pub const IPERF_PORT: u16 = 5201;

/// Client address of client index `i` (0-based).
pub fn client_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(100, 0, 0, 11 + i as u8)
}

/// The built network. Field order is drop order: processes, hosts, the leg, links,
/// bridges.
#[derive(Debug)]
pub struct LabNet {
    /// httpd on each server, iperf3 server on server 2.
    pub procs: Vec<ProcGuard>,
    /// Clients h1..hN.
    pub clients: Vec<Host>,
    /// Servers sv1..sv4.
    pub servers: Vec<Host>,
    /// The controller's root leg (on s3).
    pub leg: Option<RootLeg>,
    /// s1–s3 and s2–s3.
    pub links: Vec<Link>,
    /// s1, s2, s3.
    pub bridges: Vec<Bridge>,
}

impl LabNet {
    /// Builds the switches (connected to `controller`), the hosts and the leg, and starts
    /// the servers (`flowgate httpd` with the capacity model of `p`) and iperf3.
    pub fn build(
        prefix: &str,
        controller: &str,
        p: &Params,
        flowgate: &Path,
        mut step: impl FnMut(&str),
    ) -> Result<LabNet> {
        let mut net = LabNet {
            procs: Vec::new(),
            clients: Vec::new(),
            servers: Vec::new(),
            leg: None,
            links: Vec::new(),
            bridges: Vec::new(),
        };
        let ctl = [controller.to_owned()];
        for i in 1..=3u64 {
            net.bridges
                .push(Bridge::create(&format!("{prefix}s{i}"), i, &ctl).context("bridge")?);
        }
        crate::signal::check()?;
        for (a, b) in [(0usize, 2usize), (1, 2)] {
            let (an, bn) = (a + 1, b + 1);
            net.links.push(
                Link::create(
                    LinkKind::Patch,
                    &net.bridges[a],
                    &format!("{prefix}p{an}x{bn}"),
                    &net.bridges[b],
                    &format!("{prefix}p{bn}x{an}"),
                )
                .context("link")?,
            );
        }
        for (i, ip) in SERVERS.iter().enumerate() {
            step(&format!("server sv{} {ip}", i + 1));
            let opts = HostOptions {
                mac: Some(format!("00:00:00:00:01:{:02x}", i + 1)),
                ..HostOptions::default()
            };
            let h = Host::create_with(
                prefix,
                &format!("sv{}", i + 1),
                &format!("{ip}/24"),
                &net.bridges[2],
                &opts,
            )
            .context("server host")?;
            net.servers.push(h);
            crate::signal::check()?;
        }
        let half = p.clients.div_ceil(2);
        for i in 0..p.clients {
            step(&format!("client h{} {}", i + 1, client_ip(i)));
            let opts = HostOptions {
                mac: Some(format!("00:00:00:00:02:{:02x}", i + 1)),
                ..HostOptions::default()
            };
            let sw = if i < half { 0 } else { 1 };
            let h = Host::create_with(
                prefix,
                &format!("h{}", i + 1),
                &format!("{}/24", client_ip(i)),
                &net.bridges[sw],
                &opts,
            )
            .context("client host")?;
            net.clients.push(h);
            crate::signal::check()?;
        }
        step("controller leg");
        let leg = RootLeg::create(prefix, "rl", LEG_CIDR, &net.bridges[2]).context("root leg")?;
        for b in &net.bridges {
            leg.install_bypass(b).context("leg bypass flows")?;
        }
        net.leg = Some(leg);
        step("servers");
        for (i, h) in net.servers.iter().enumerate() {
            let name = format!("srv{}", i + 1);
            net.procs.push(spawn_httpd(
                flowgate,
                h,
                &name,
                p.server_delay_ms,
                p.server_concurrency as u64,
                p.server_queue as u64,
            )?);
        }
        net.procs.push(spawn_iperf_server(&net.servers[1])?);
        wait_httpd(&net.servers)?;
        Ok(net)
    }

    /// Puts `fault` in the network: an nftables rule in the server's namespace drops
    /// every TCP segment its web server sends to a client (their SYN-ACKs and the
    /// retransmissions of them), and nothing it sends the controller's leg, whose health
    /// checks it still passes.
    pub fn inject(&self, fault: Fault) -> Result<()> {
        let Fault::SilentToClients(i) = fault;
        let server = self
            .servers
            .get(i)
            .with_context(|| format!("no server {i} to silence"))?;
        let clients = format!(
            "{}-{}",
            client_ip(0),
            client_ip(self.clients.len().saturating_sub(1))
        );
        let table = ["nft", "add", "table", "inet", "fault"];
        let chain = [
            "nft",
            "add",
            "chain",
            "inet",
            "fault",
            "out",
            "{ type filter hook output priority 0; policy accept; }",
        ];
        let rule = [
            "nft", "add", "rule", "inet", "fault", "out", "ip", "daddr", &clients, "tcp", "sport",
            "80", "drop",
        ];
        for argv in [&table[..], &chain[..], &rule[..]] {
            server
                .exec_checked(argv)
                .with_context(|| format!("silencing {}: {}", server.ip(), argv.join(" ")))?;
        }
        Ok(())
    }

    /// Re-installs the leg's bypass rules (after a controller change, to be safe).
    pub fn reinstall_bypass(&self) -> Result<()> {
        if let Some(leg) = &self.leg {
            for b in &self.bridges {
                leg.install_bypass(b)?;
            }
        }
        Ok(())
    }
}

/// Starts `flowgate httpd` as backend `name` on `host`'s port 80, with its capacity model:
/// `delay_ms` of service time per request, `concurrency` workers, `queue` waiting places;
/// it exports metrics.
pub fn spawn_httpd(
    flowgate: &Path,
    host: &Host,
    name: &str,
    delay_ms: u64,
    concurrency: u64,
    queue: u64,
) -> Result<ProcGuard> {
    let fg = flowgate.to_string_lossy();
    let listen = format!("{}:80", host.ip());
    let (delay, conc, queue) = (
        delay_ms.to_string(),
        concurrency.to_string(),
        queue.to_string(),
    );
    let argv = [
        &*fg,
        "--log",
        "warn",
        "httpd",
        "--listen",
        &listen,
        "--name",
        name,
        "--delay-ms",
        &delay,
        "--concurrency",
        &conc,
        "--queue",
        &queue,
        "--metrics",
    ];
    host.spawn(&argv).context("httpd")
}

/// Starts an iperf3 server on `host`'s [`IPERF_PORT`].
pub fn spawn_iperf_server(host: &Host) -> Result<ProcGuard> {
    let port = IPERF_PORT.to_string();
    host.spawn(&["iperf3", "-s", "-p", &port])
        .context("iperf3 server")
}

/// Waits until every server's httpd answers on its own address (checked from the server's
/// namespace, so no controller is involved).
pub fn wait_httpd<'a>(servers: impl IntoIterator<Item = &'a Host>) -> Result<()> {
    for h in servers {
        h.wait_http(
            &format!("http://{}/health", h.ip()),
            Duration::from_secs(15),
        )
        .context("httpd up")?;
    }
    Ok(())
}
