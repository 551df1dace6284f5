//! `flowgate bench memory`: the controller's resident memory per tracked connection.
//!
//! Each size runs in a fresh child process (this binary, `bench memory --child N`), so
//! one size's freed memory cannot hide the next one's growth. The child drives the core
//! directly: one switch, one VIP service with three backends learned by ARP, then `N`
//! new connections, each a TCP SYN PACKET_IN through `handle_message` (the same path as
//! the runtime), the answers dropped. RSS (VmRSS from /proc/self/status) is read before
//! and after. Each SYN's handling is timed too: the table's growth is where the longest
//! pauses of the PACKET_IN path were (a hash table that rehashes all at once), so the
//! distribution and the count of slow setups show whether a change brought them back.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use flowgate_core::{Config, Controller, Outbox};
use flowgate_packet::{self as packet, MacAddr};
use ofp::{Message, PacketIn};

use super::Table;

#[derive(Debug, Clone, clap::Args)]
pub struct MemoryArgs {
    /// Connection counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    pub conns: Vec<usize>,
    /// Connections per client address (clients differ in address and port). 1 by
    /// default, the most the controller could keep per client: every connection from an
    /// address of its own, as from clients on the Internet.
    #[arg(long, default_value_t = 1)]
    pub ports_per_client: usize,
    /// Write the results table here (Markdown).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Internal: measure one size in this process and print JSON.
    #[arg(long, hide = true)]
    pub child: Option<usize>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MemoryResult {
    pub connections: usize,
    pub tracked: usize,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub bytes_per_conn: f64,
    pub insert_secs: f64,
    /// One SYN's handling, in nanoseconds: p50, p99, p99.9, max.
    pub setup_ns: [u64; 4],
    /// SYNs whose handling took over 100 µs, and over 500 µs.
    pub over_100us: u64,
    pub over_500us: u64,
}

fn rss_kib() -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS in /proc/self/status")
}

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);

fn config() -> anyhow::Result<Config> {
    let mut c = String::from(
        "[openflow]\nlisten = \"127.0.0.1:0\"\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\nalgorithm = \"round-robin\"\n\n[service.health]\nkind = \"none\"\n",
    );
    for b in 2..=4 {
        c += &format!("\n[[service.backend]]\naddress = \"10.0.0.{b}\"\n");
    }
    Config::from_toml(&c, &|_| None).map_err(|e| anyhow::anyhow!("bench config: {e}"))
}

/// A table-miss PACKET_IN of `data` from `in_port`, as a switch sends it.
pub(crate) fn packet_in(in_port: u32, data: ofp::Bytes) -> Message {
    Message::PacketIn(PacketIn::table_miss(in_port, data))
}

/// Measure one size in this process.
pub fn measure_one(n: usize, ports_per_client: usize) -> anyhow::Result<MemoryResult> {
    let ppc = ports_per_client.clamp(1, 60_000);
    let cfg = config()?;
    let mut c = Controller::new(&cfg);
    let mut out = Outbox::new();
    let now = Instant::now();
    let dpid = 1;
    c.handle_switch_up(now, ofp::SwitchFeatures::emulated(dpid), &mut out);
    for b in 2..=4u8 {
        let mac = MacAddr([2, 0, 0, 0, 0, b]);
        let ip = Ipv4Addr::new(10, 0, 0, b);
        // Gratuitous: who-has its own address, from itself.
        let garp = packet::arp_request(mac, ip, ip);
        c.handle_message(now, dpid, &packet_in(u32::from(b), garp), &mut out);
    }
    out.drain().for_each(drop);
    let client_mac = MacAddr([2, 0, 0, 0, 0, 1]);
    let vmac = cfg.services[0].virtual_mac;
    // Each frame is built, handled and freed in turn, so only the controller's state
    // grows between the two readings.
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)
        .context("histogram")?;
    let (mut over_100us, mut over_500us) = (0u64, 0u64);
    let t0 = Instant::now();
    let before = rss_kib()?;
    for k in 0..n {
        let host = (k / ppc) as u32;
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(11, 0, 0, 0)) + host);
        let port = 1024 + (k % ppc) as u16;
        let f = packet_in(
            1,
            packet::tcp_syn(
                client_mac,
                vmac,
                SocketAddrV4::new(ip, port),
                SocketAddrV4::new(VIP, 80),
                k as u32,
            ),
        );
        let start = Instant::now();
        c.handle_message(now, dpid, &f, &mut out);
        let ns = start.elapsed().as_nanos() as u64;
        let _ = hist.record(ns.max(1));
        over_100us += u64::from(ns > 100_000);
        over_500us += u64::from(ns > 500_000);
        out.drain().for_each(drop);
    }
    let after = rss_kib()?;
    let tracked = c.connections().len();
    if tracked != n {
        bail!("{tracked} connections tracked after {n} SYNs");
    }
    Ok(MemoryResult {
        connections: n,
        tracked,
        rss_before_kib: before,
        rss_after_kib: after,
        bytes_per_conn: (after.saturating_sub(before) * 1024) as f64 / n as f64,
        insert_secs: t0.elapsed().as_secs_f64(),
        setup_ns: [
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.99),
            hist.value_at_quantile(0.999),
            hist.max(),
        ],
        over_100us,
        over_500us,
    })
}

pub fn run(args: &MemoryArgs) -> anyhow::Result<Vec<MemoryResult>> {
    if let Some(n) = args.child {
        let r = measure_one(n, args.ports_per_client)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(vec![r]);
    }
    let exe = std::env::current_exe()?;
    let mut results = Vec::new();
    for &n in &args.conns {
        let o = Command::new(&exe)
            .args(["bench", "memory", "--child"])
            .arg(n.to_string())
            .arg("--ports-per-client")
            .arg(args.ports_per_client.to_string())
            .output()
            .with_context(|| format!("run {}", exe.display()))?;
        if !o.status.success() {
            bail!(
                "memory child for {n} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let line = String::from_utf8_lossy(&o.stdout);
        let r: MemoryResult = serde_json::from_str(line.trim().lines().last().unwrap_or(""))?;
        eprintln!(
            "bench memory: {n} connections: RSS {} → {} KiB, {:.1} bytes/connection",
            r.rss_before_kib, r.rss_after_kib, r.bytes_per_conn
        );
        results.push(r);
    }
    Ok(results)
}

pub fn table(results: &[MemoryResult], ppc: usize) -> Table {
    let mut t = Table::new(&[
        "tracked connections",
        "clients (addresses)",
        "RSS before (KiB)",
        "RSS after (KiB)",
        "bytes / connection",
        "insert time (s)",
        "one SYN's handling µs: p50 / p99 / p99.9 / max",
        "SYNs over 100 µs / 500 µs",
    ]);
    for r in results {
        t.row(vec![
            r.connections.to_string(),
            r.connections.div_ceil(ppc.max(1)).to_string(),
            r.rss_before_kib.to_string(),
            r.rss_after_kib.to_string(),
            format!("{:.1}", r.bytes_per_conn),
            format!("{:.2}", r.insert_secs),
            r.setup_ns
                .iter()
                .map(|ns| format!("{:.1}", *ns as f64 / 1000.0))
                .collect::<Vec<_>>()
                .join(" / "),
            format!("{} / {}", r.over_100us, r.over_500us),
        ]);
    }
    t
}
