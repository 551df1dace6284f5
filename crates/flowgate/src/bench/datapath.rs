//! `flowgate bench datapath`: HTTP requests/s and latency on one Open vSwitch bridge
//! (userspace datapath), the same client and the same three backends, through
//! (a) flowgate's VIP, (b) HAProxy `balance leastconn` and (c) nginx `least_conn` as proxies
//! on a fifth host, and (d) straight to one backend. The client is wrk with a Lua script
//! adding `Connection: close`, so every request is a new TCP connection (a new flow).
//!
//! h1 = client 10.0.0.1, h2..h4 = backends 10.0.0.2-4, h5 = proxy 10.0.0.5; VIP 10.0.0.100.
//! In `flowgate-partitioned` the backends answer the client directly (DSR): each holds the
//! VIP on its loopback and its server listens on the VIP too.
//! Needs root and Open vSwitch; everything it makes is removed when it ends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flowgate_testbed::topo::{self, TopoOptions};
use flowgate_testbed::{Host, Prefix, ProcGuard, cleanup_stale, ovs};

use super::Table;
use super::controller::TempDir;

/// The HTTP servers used as backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Nginx,
    FlowgateHttpd,
}

/// A data-path case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Case {
    /// flowgate's VIP (reactive: one controller round trip per connection).
    Flowgate,
    /// flowgate's VIP in `mode = "proactive"`: a select group + conntrack the controller
    /// keeps weighted from live load; new connections stay in the switch.
    FlowgateProactive,
    /// flowgate's VIP in `mode = "partitioned"`: one wildcard rule per client-port
    /// partition hands the connection's packets to the partition's backend by MAC, no
    /// rewrite, no conntrack; the backends hold the VIP and answer directly (DSR). The
    /// controller moves partitions between backends from live load.
    FlowgatePartitioned,
    /// HAProxy, `balance leastconn`, on its own host.
    Haproxy,
    /// nginx `least_conn` as a reverse proxy on its own host.
    Nginx,
    /// Straight to backend 10.0.0.2 (L2 forwarding, `actions=NORMAL`).
    Direct,
    /// No controller: the VIP as an OVS select group whose buckets DNAT with conntrack
    /// (the OVN load balancer's shape), installed with ovs-ofctl. The proactive design's
    /// data-path ceiling on this switch.
    OvsGroup,
    /// No controller, no conntrack: the VIP as an OVS select group whose buckets rewrite
    /// the destination (hash of the 5-tuple picks the bucket), static reverse rewrites per
    /// backend. What a stateless proactive mode would cost; a bucket change would move
    /// live connections, which is why flowgate's proactive mode pins them with conntrack.
    OvsHash,
    /// No controller, no conntrack: the `ovs-hash` group, whose chosen bucket also `learn`s
    /// an exact 5-tuple flow (Nicira NXAST_LEARN) recording the backend, with
    /// `fin_timeout`; later packets follow the learned flow, so bucket changes do not move
    /// live connections. Pinning without conntrack, at the price of a slow-path upcall and
    /// a flow-table change per new connection.
    OvsLearn,
    /// `ovs-learn` with the group's `hash` selection method over the 5-tuple instead of
    /// OVS's default `dp_hash` (no recirculation between the VIP rule and the bucket).
    OvsLearnHash,
    /// `ovs-hash` with the `hash` selection method over the 5-tuple: every new connection
    /// then takes a slow-path upcall (its datapath flow matches the exact 5-tuple) but
    /// changes no flow table. Separates the upcall's cost from `learn`'s.
    OvsHashFields,
}

impl BackendKind {
    fn label(self) -> &'static str {
        match self {
            BackendKind::Nginx => "nginx",
            BackendKind::FlowgateHttpd => "flowgate httpd",
        }
    }
}

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::Flowgate => "flowgate VIP (reactive)",
            Case::FlowgateProactive => "flowgate VIP (proactive: group + conntrack)",
            Case::FlowgatePartitioned => {
                "flowgate VIP (partitioned: source-port wildcard rules, DSR backends)"
            }
            Case::Haproxy => "HAProxy leastconn (proxy host)",
            Case::Nginx => "nginx least_conn (proxy host)",
            Case::Direct => "direct to one backend",
            Case::OvsGroup => "OVS select group + conntrack (proactive, no controller)",
            Case::OvsHash => "OVS select group, stateless rewrite (no conntrack, no controller)",
            Case::OvsLearn => {
                "OVS select group + learn, stateless rewrite (no conntrack, no controller)"
            }
            Case::OvsLearnHash => {
                "OVS select group (hash method) + learn, stateless rewrite (no conntrack, no controller)"
            }
            Case::OvsHashFields => {
                "OVS select group (hash method), stateless rewrite (no conntrack, no controller)"
            }
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct DatapathArgs {
    /// Cases to measure, in order (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,haproxy,nginx,flowgate,flowgate-proactive,ovs-group"
    )]
    pub cases: Vec<Case>,
    /// Backend servers; giving both measures `direct` with each (which keeps up?).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "nginx")]
    pub backends: Vec<BackendKind>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// wrk connections (each request opens a new one: `Connection: close`).
    #[arg(long, default_value_t = 16)]
    pub connections: u32,
    /// wrk threads.
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// flowgate's balancing algorithm for the VIP.
    #[arg(long, default_value = "least-connections")]
    pub algorithm: String,
    /// Rounds: every case once per round, each round in a different (seeded) order; the
    /// table gives medians, and each path against direct round by round.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Write the results table here (Markdown).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// For the by-hand group cases (`ovs-group`, `ovs-hash*`, `ovs-learn*`): rewrite the
    /// group's bucket weights (`mod-group`) every this many ms while wrk runs, rotating
    /// which backend gets the most, to see whether live connections keep their backend
    /// (a moved one is reset: wrk counts socket errors). 0: never.
    #[arg(long, default_value_t = 0)]
    pub weight_churn_ms: u64,
    /// Keep connections open (no `Connection: close`): wrk's connections then live the
    /// whole run, the strongest test of pinning under `--weight-churn-ms`.
    #[arg(long)]
    pub keep_alive: bool,
    /// `flowgate-partitioned`: the VIP's `partition_bits` (2^bits partitions).
    #[arg(long, default_value_t = flowgate_core::config::DEFAULT_PARTITION_BITS, value_parser = clap::value_parser!(u8).range(1..=8))]
    pub partition_bits: u8,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CaseResult {
    pub case: String,
    pub backend: String,
    /// Median over the rounds.
    pub requests_per_sec: f64,
    /// Each round's requests/s, in round order.
    pub per_round: Vec<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub requests: u64,
    pub errors: String,
    /// flowgate only: PACKET_INs the controller handled during the run.
    pub packet_ins: Option<u64>,
}

const VIP: &str = "10.0.0.100";
const BACKENDS: [&str; 3] = ["10.0.0.2", "10.0.0.3", "10.0.0.4"];
const PROXY: &str = "10.0.0.5";

/// A backend's nginx config: `return 200 NAME` on `ip:80`, and on `vip:80` too when given
/// (a DSR backend, which holds the VIP on its loopback).
fn nginx_backend_conf(dir: &Path, ip: &str, vip: Option<&str>, name: &str) -> String {
    let vip_listen = vip.map_or(String::new(), |v| format!(" listen {v}:80 backlog=4096;"));
    format!(
        "worker_processes auto;\ndaemon off;\npid {d}/nginx-{name}.pid;\nerror_log {d}/nginx-{name}.err warn;\nevents {{ worker_connections 8192; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/tmp-{name};\n  proxy_temp_path {d}/tmp-{name};\n  fastcgi_temp_path {d}/tmp-{name};\n  uwsgi_temp_path {d}/tmp-{name};\n  scgi_temp_path {d}/tmp-{name};\n  server {{ listen {ip}:80 backlog=4096;{vip_listen} location / {{ return 200 \"{name}\\n\"; }} }}\n}}\n",
        d = dir.display()
    )
}

fn nginx_proxy_conf(dir: &Path) -> String {
    let servers: String = BACKENDS
        .iter()
        .map(|b| format!("    server {b}:80;\n"))
        .collect();
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx-proxy.pid;\nerror_log {d}/nginx-proxy.err warn;\nevents {{ worker_connections 8192; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/tmp-proxy;\n  proxy_temp_path {d}/tmp-proxy;\n  fastcgi_temp_path {d}/tmp-proxy;\n  uwsgi_temp_path {d}/tmp-proxy;\n  scgi_temp_path {d}/tmp-proxy;\n  upstream pool {{\n    least_conn;\n{servers}  }}\n  server {{ listen {PROXY}:80 backlog=4096; location / {{ proxy_pass http://pool; }} }}\n}}\n",
        d = dir.display()
    )
}

fn haproxy_conf() -> String {
    let servers: String = BACKENDS
        .iter()
        .enumerate()
        .map(|(i, b)| format!("    server b{} {b}:80\n", i + 2))
        .collect();
    format!(
        "global\n    maxconn 8000\n    nbthread 1\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n    option http-server-close\nfrontend web\n    bind {PROXY}:80\n    default_backend pool\nbackend pool\n    balance leastconn\n{servers}"
    )
}

const WRK_LUA: &str = "wrk.headers[\"Connection\"] = \"close\"\n";

fn flowgate_exe() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("FLOWGATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    Ok(std::env::current_exe()?)
}

/// Parse wrk's `--latency` output.
pub fn parse_wrk(out: &str) -> anyhow::Result<(f64, f64, f64, u64, String)> {
    let to_ms = |v: &str| -> Option<f64> {
        let v = v.trim();
        let (num, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic())?);
        let n: f64 = num.parse().ok()?;
        Some(match unit {
            "us" => n / 1000.0,
            "ms" => n,
            "s" => n * 1000.0,
            "m" => n * 60_000.0,
            _ => return None,
        })
    };
    let mut rps = None;
    let mut p50 = None;
    let mut p99 = None;
    let mut requests = 0;
    let mut errors = Vec::new();
    for l in out.lines() {
        let t = l.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            rps = v.trim().parse().ok();
        } else if let Some(v) = t.strip_prefix("50%") {
            p50 = to_ms(v);
        } else if let Some(v) = t.strip_prefix("99%") {
            p99 = to_ms(v);
        } else if t.contains("requests in") {
            requests = t
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        } else if t.starts_with("Socket errors") || t.starts_with("Non-2xx") {
            errors.push(t.to_string());
        }
    }
    Ok((
        rps.context("no Requests/sec in wrk's output")?,
        p50.unwrap_or(f64::NAN),
        p99.unwrap_or(f64::NAN),
        requests,
        if errors.is_empty() {
            "none".into()
        } else {
            errors.join("; ")
        },
    ))
}

fn wrk(client: &Host, args: &DatapathArgs, url: &str, lua: &Path) -> anyhow::Result<String> {
    let d = format!("{}s", args.duration);
    let c = args.connections.to_string();
    let t = args.threads.to_string();
    let lua = lua.to_string_lossy().to_string();
    let mut argv = vec!["wrk", "-t", &t, "-c", &c, "-d", &d, "--latency"];
    if !args.keep_alive {
        argv.extend(["-s", lua.as_str()]);
    }
    argv.push(url);
    let o = client.exec(&argv).context("wrk")?;
    let s = String::from_utf8_lossy(&o.stdout).to_string();
    if !o.status.success() {
        bail!("wrk failed: {s}{}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(s)
}

fn wait_http(client: &Host, url: &str, timeout: Duration) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if let Ok(o) = client.exec(&[
            "curl",
            "-s",
            "-m",
            "1",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            url,
        ]) && String::from_utf8_lossy(&o.stdout).trim() == "200"
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("{url} did not answer within {timeout:?}")
}

struct Controller {
    child: Child,
    api: String,
    openflow: String,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Controller {
    /// The VIP's partitions (`partitions` of `/api/v1/services`), for a partitioned one.
    fn partitions(&self) -> Option<serde_json::Value> {
        let o = Command::new("curl")
            .args([
                "-s",
                "-m",
                "2",
                &format!("http://{}/api/v1/services", self.api),
            ])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        Some(v.get(0)?.get("partitions")?.clone())
    }

    fn packet_ins(&self) -> Option<u64> {
        let o = Command::new("curl")
            .args(["-s", "-m", "2", &format!("http://{}/metrics", self.api)])
            .output()
            .ok()?;
        String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
            let rest = l.strip_prefix("flowgate_packet_in_total")?;
            rest.split_whitespace()
                .last()?
                .parse::<f64>()
                .ok()
                .map(|v| v as u64)
        })
    }
}

/// A partitioned VIP's `transition_secs`: the partitions the first backend located took
/// all of move to the others through the controller for this long, which the bench waits
/// out before measuring (the default, 60 s, would add a minute to every run).
const PARTITION_TRANSITION_SECS: u64 = 2;

fn start_flowgate(
    dir: &Path,
    algorithm: &str,
    mode: &str,
    partition_bits: u8,
) -> anyhow::Result<Controller> {
    let partition = if mode == "partitioned" {
        format!(
            "transition_secs = {PARTITION_TRANSITION_SECS}\npartition_bits = {partition_bits}\n"
        )
    } else {
        String::new()
    };
    let mut cfg = format!(
        "[openflow]\nlisten = \"127.0.0.1:0\"\npacket_in_rate = 100000000\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"{algorithm}\"\nmode = \"{mode}\"\n{partition}\n[service.health]\nkind = \"none\"\n"
    );
    for b in BACKENDS {
        cfg += &format!("\n[[service.backend]]\naddress = \"{b}\"\n");
    }
    let path = dir.join("flowgate.toml");
    std::fs::write(&path, cfg)?;
    let ready = dir.join("ready.json");
    // A run may start several controllers in the same directory: never read the last
    // one's ready file.
    let _ = std::fs::remove_file(&ready);
    let log = std::fs::File::create(dir.join("flowgate.log"))?;
    let child = Command::new(flowgate_exe()?)
        .args(["--log", "warn", "controller", "--config"])
        .arg(&path)
        .arg("--ready-file")
        .arg(&ready)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("start flowgate")?;
    let mut c = Controller {
        child,
        api: String::new(),
        openflow: String::new(),
    };
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(&ready) {
            let v: serde_json::Value = serde_json::from_str(&s)?;
            c.api = v["api"].as_str().unwrap_or("").to_string();
            c.openflow = v["openflow"].as_str().unwrap_or("").to_string();
            return Ok(c);
        }
        if let Some(st) = c.child.try_wait()? {
            bail!("flowgate exited: {st}");
        }
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("flowgate did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

const VIP_MAC: &str = "02:66:67:00:00:01";

/// Lets `ovs-ofctl -O OpenFlow15` in for the cases whose group needs it ([`group_cmd`]).
fn set_protocols(br: &flowgate_testbed::Bridge, case: Case) -> anyhow::Result<()> {
    if matches!(case, Case::OvsLearnHash | Case::OvsHashFields) {
        flowgate_testbed::ovs::vsctl(&[
            "set",
            "bridge",
            br.name(),
            "protocols=OpenFlow13,OpenFlow15",
        ])?;
    }
    Ok(())
}

/// `add-group` / `mod-group` of group 1. `ovs-learn-hash` asks for OVS's `hash` selection
/// method over the 5-tuple, which only OpenFlow 1.5 can carry (`ovs-ofctl -O OpenFlow13`
/// drops `selection_method` silently, leaving OVS's default, `dp_hash`).
fn group_cmd(
    br: &flowgate_testbed::Bridge,
    cmd: &str,
    case: Case,
    buckets: &[String],
) -> anyhow::Result<()> {
    if matches!(case, Case::OvsLearnHash | Case::OvsHashFields) {
        let spec = format!(
            "group_id=1,type=select,selection_method=hash,fields(ip_src,ip_dst,tcp_src,tcp_dst),{}",
            buckets.join(",")
        );
        let o = Command::new("ovs-ofctl")
            .args(["-O", "OpenFlow15", cmd, br.name(), &spec])
            .output()?;
        if !o.status.success() {
            bail!("ovs-ofctl {cmd}: {}", String::from_utf8_lossy(&o.stderr));
        }
        return Ok(());
    }
    br.ofctl(
        cmd,
        &[&format!("group_id=1,type=select,{}", buckets.join(","))],
    )?;
    Ok(())
}

/// The VIP in the switch alone: new connections pick a bucket of a select group, which
/// commits them to conntrack with a DNAT to its backend; later packets, both ways, follow
/// the conntrack entry (so a connection never moves when the buckets change).
fn install_group_lb(br: &flowgate_testbed::Bridge, t: &topo::Topology) -> anyhow::Result<()> {
    add_even_group(br, t, Case::OvsGroup)?;
    let client_port = t.hosts[0].ofport();
    let mut flows = vec![
        format!("table=0,priority=50,tcp,nw_dst={VIP},tp_dst=80,actions=ct(zone=1,nat,table=1)"),
        "table=0,priority=0,actions=NORMAL".to_string(),
        "table=1,priority=10,ct_state=+new+trk,tcp,actions=group:1".to_string(),
        "table=1,priority=10,ct_state=+est+trk,tcp,actions=goto_table:3".to_string(),
        "table=1,priority=10,ct_state=+rel+trk,tcp,actions=goto_table:3".to_string(),
        format!(
            "table=2,priority=10,ct_state=+trk,tcp,actions=set_field:{VIP_MAC}->eth_src,output:{client_port}"
        ),
    ];
    for (i, b) in BACKENDS.iter().enumerate() {
        let h = &t.hosts[i + 1];
        flows.push(format!(
            "table=0,priority=50,tcp,nw_src={b},tp_src=80,actions=ct(zone=1,nat,table=2)"
        ));
        flows.push(format!(
            "table=3,priority=10,ip,nw_dst={b},actions=set_field:{}->eth_dst,output:{}",
            h.mac(),
            h.ofport()
        ));
    }
    add_flows(br, &flows)
}

/// The VIP without conntrack: the select group's bucket (OVS hashes the flow to pick it,
/// so a connection stays on one bucket while the buckets stay the same) rewrites the
/// destination to its backend; each backend's answers get the VIP back as their source.
fn install_stateless_lb(
    br: &flowgate_testbed::Bridge,
    t: &topo::Topology,
    case: Case,
) -> anyhow::Result<()> {
    add_even_group(br, t, case)?;
    let mut flows = vec![
        format!("priority=50,tcp,nw_dst={VIP},tp_dst=80,actions=group:1"),
        "priority=0,actions=NORMAL".to_string(),
    ];
    flows.extend(reverse_rewrites(t));
    add_flows(br, &flows)
}

/// Group 1 for a by-hand case, every backend's bucket at the same weight (after letting in
/// the OpenFlow version the case's group needs).
fn add_even_group(
    br: &flowgate_testbed::Bridge,
    t: &topo::Topology,
    case: Case,
) -> anyhow::Result<()> {
    set_protocols(br, case)?;
    group_cmd(
        br,
        "add-group",
        case,
        &group_buckets(case, t, &EVEN_WEIGHTS),
    )
}

/// Adds each flow, stopping at the first that OVS refuses.
fn add_flows(br: &flowgate_testbed::Bridge, flows: &[String]) -> anyhow::Result<()> {
    for f in flows {
        br.add_flow(f)?;
    }
    Ok(())
}

/// Each backend's answers to the client get the VIP back as their source (stateless).
fn reverse_rewrites(t: &topo::Topology) -> Vec<String> {
    let client_port = t.hosts[0].ofport();
    BACKENDS
        .iter()
        .map(|b| {
            format!(
                "priority=50,tcp,nw_src={b},tp_src=80,nw_dst=10.0.0.1,actions=set_field:{VIP}->ip_src,set_field:{VIP_MAC}->eth_src,output:{client_port}"
            )
        })
        .collect()
}

/// How long a learned connection flow lives without packets (a FIN or RST cuts it to 1 s).
const LEARN_IDLE_S: u32 = 300;

/// The VIP without conntrack, pinned by `learn`: table 0 sends VIP traffic through table 1
/// (learned exact 5-tuple flows that load the chosen backend's number into reg0) and then
/// table 2, which forwards by reg0 or, for reg0 = 0 (no learned flow: a new connection),
/// to the select group. A bucket only sets reg0 and resubmits to table 3, which learns the
/// connection's flow into table 1, then rewrites and forwards like `ovs-hash`. (`learn`
/// cannot sit in the bucket itself: OVS 3.1 accepts it there but executes a bucket as an
/// action set, and `ofproto/trace` shows the `learn` silently left out.) The
/// learned flow carries `fin_timeout`, so it goes a second after the connection's FIN or
/// RST is seen. Answers: as `ovs-hash`.
fn install_learn_lb(
    br: &flowgate_testbed::Bridge,
    t: &topo::Topology,
    case: Case,
) -> anyhow::Result<()> {
    add_even_group(br, t, case)?;
    let mut flows = vec![
        format!("table=0,priority=50,tcp,nw_dst={VIP},tp_dst=80,actions=resubmit(,1),resubmit(,2)"),
        "table=0,priority=0,actions=NORMAL".to_string(),
        "table=2,priority=10,tcp,reg0=0,actions=group:1".to_string(),
    ];
    for (i, b) in BACKENDS.iter().enumerate() {
        let h = &t.hosts[i + 1];
        let k = i + 1;
        let fwd = format!(
            "set_field:{}->eth_dst,set_field:{b}->ip_dst,output:{}",
            h.mac(),
            h.ofport()
        );
        flows.push(format!("table=2,priority=10,tcp,reg0={k},actions={fwd}"));
        flows.push(format!(
            "table=3,priority=10,tcp,reg0={k},actions=learn(table=1,idle_timeout={LEARN_IDLE_S},fin_idle_timeout=1,priority=10,eth_type=0x800,nw_proto=6,NXM_OF_IP_SRC[],NXM_OF_IP_DST[],NXM_OF_TCP_SRC[],NXM_OF_TCP_DST[],load:{k}->NXM_NX_REG0[]),{fwd}"
        ));
    }
    flows.extend(reverse_rewrites(t));
    add_flows(br, &flows)
}

const EVEN_WEIGHTS: [u16; 3] = [100, 100, 100];

/// Group 1's buckets for a by-hand group case, with these weights (one per backend).
fn group_buckets(case: Case, t: &topo::Topology, weights: &[u16; 3]) -> Vec<String> {
    BACKENDS
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let h = &t.hosts[i + 1];
            let w = weights[i];
            let (mac, port) = (h.mac(), h.ofport());
            let fwd = format!("set_field:{mac}->eth_dst,set_field:{b}->ip_dst,output:{port}");
            match case {
                Case::OvsGroup => {
                    format!("bucket=weight:{w},actions=ct(commit,zone=1,nat(dst={b}:80),table=3)")
                }
                Case::OvsLearn | Case::OvsLearnHash => {
                    format!(
                        "bucket=weight:{w},actions=set_field:{}->reg0,resubmit(,3)",
                        i + 1
                    )
                }
                _ => format!("bucket=weight:{w},actions={fwd}"),
            }
        })
        .collect()
}

/// While `stop` is unset, every `every`: rewrite group 1's weights, giving the most to
/// each backend in turn. Returns how many `mod-group`s it sent.
fn churn_weights(
    br: &flowgate_testbed::Bridge,
    case: Case,
    t: &topo::Topology,
    every: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<u64> {
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(every);
        let mut w = [10u16; 3];
        w[(n % 3) as usize] = 100;
        let buckets = group_buckets(case, t, &w);
        group_cmd(br, "mod-group", case, &buckets)?;
        n += 1;
    }
    Ok(n)
}

/// The three backend servers; with `dsr`, each also serves the VIP (which the caller has
/// put on its loopback).
fn start_backends(
    t: &topo::Topology,
    kind: BackendKind,
    dir: &Path,
    dsr: bool,
) -> anyhow::Result<Vec<ProcGuard>> {
    let mut v = Vec::new();
    for (i, ip) in BACKENDS.iter().enumerate() {
        let h = &t.hosts[i + 1];
        let name = format!("b{}", i + 2);
        match kind {
            BackendKind::Nginx => {
                let conf = dir.join(format!("nginx-{name}.conf"));
                std::fs::create_dir_all(dir.join(format!("tmp-{name}")))?;
                let vip = dsr.then_some(VIP);
                std::fs::write(&conf, nginx_backend_conf(dir, ip, vip, &name))?;
                let conf = conf.to_string_lossy().to_string();
                let d = dir.to_string_lossy().to_string();
                v.push(h.spawn(&["nginx", "-p", &d, "-c", &conf])?);
            }
            BackendKind::FlowgateHttpd => {
                let exe = flowgate_exe()?.to_string_lossy().to_string();
                // httpd takes one address: the wildcard covers the VIP on lo as well.
                let listen = if dsr {
                    "0.0.0.0:80".to_string()
                } else {
                    format!("{ip}:80")
                };
                v.push(h.spawn(&[
                    &exe, "--log", "warn", "httpd", "--listen", &listen, "--name", &name,
                ])?);
            }
        }
    }
    Ok(v)
}

pub fn run(args: &DatapathArgs) -> anyhow::Result<Vec<CaseResult>> {
    if let Some(why) = flowgate_testbed_unavailable() {
        bail!("the data-path bench needs root and Open vSwitch: {why}");
    }
    let dir = TempDir::new("datapath")?;
    let lua = dir.0.join("close.lua");
    std::fs::write(&lua, WRK_LUA)?;
    let mut runs: Vec<(Case, BackendKind, Measured)> = Vec::new();
    for round in 0..args.rounds.max(1) {
        let order = round_order(&args.cases, round);
        eprintln!(
            "bench datapath: round {} of {}: {order:?}",
            round + 1,
            args.rounds.max(1)
        );
        for (bi, &kind) in args.backends.iter().enumerate() {
            for &case in &order {
                // With several backend kinds, only `direct` is repeated for the others.
                if bi > 0 && case != Case::Direct {
                    continue;
                }
                let m = measure(args, case, kind, &dir.0, &lua)?;
                runs.push((case, kind, m));
            }
        }
    }
    Ok(summarise(args, &runs))
}

/// The order of round `round`: the given order first, then seeded shuffles, so that no
/// case always follows the same one (what ran before a case must not decide its figure).
fn round_order(cases: &[Case], round: u32) -> Vec<Case> {
    let mut v = cases.to_vec();
    if round == 0 {
        return v;
    }
    // splitmix64 from the round number: plenty for a permutation of a handful of cases.
    let mut x = u64::from(round);
    for i in (1..v.len()).rev() {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        v.swap(i, (z % (i as u64 + 1)) as usize);
    }
    v
}

/// One case's wrk run.
struct Measured {
    requests_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    requests: u64,
    errors: String,
    packet_ins: Option<u64>,
}

/// Measure one case on a network of its own: fresh namespaces (so no client TIME_WAIT
/// sockets or ARP entries from the case before), a fresh bridge, fresh backends, and the
/// VIP's conntrack zone flushed (the userspace datapath's conntrack outlives bridges).
/// Earlier runs on one shared network made a case's figure depend on what ran before it
/// (direct: 20k/s when first, 5.5k/s after four other cases).
fn measure(
    args: &DatapathArgs,
    case: Case,
    kind: BackendKind,
    dir: &Path,
    lua: &Path,
) -> anyhow::Result<Measured> {
    let backend_label = kind.label();
    let p = Prefix::for_test("bench_datapath");
    cleanup_stale(p.as_str())?;
    let _ = ovs::appctl(&["dpctl/flush-conntrack", "zone=1"]);
    let t = topo::single(&TopoOptions::new(p.as_str()), 5)?;
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let proxy_host = &t.hosts[4];
    // Every request is a new connection from the same client (and, through a proxy, from
    // the proxy): at thousands per second the default 28k ephemeral ports, each held 60 s
    // in TIME_WAIT, run out within seconds and connect() stalls. Widen the range and let
    // TIME_WAIT ports be reused (RFC 7323 timestamps), in these namespaces only.
    for h in [client, proxy_host] {
        h.exec_checked(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535"])?;
        h.exec_checked(&["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])?;
    }
    let dsr = case == Case::FlowgatePartitioned;
    if dsr {
        for h in &t.hosts[1..=BACKENDS.len()] {
            h.add_loopback_vip(VIP.parse()?)?;
        }
    }
    let _servers = start_backends(&t, kind, dir, dsr)?;
    let mut ctl = None;
    let mut _proxy = None;
    let url = match case {
        Case::Direct => {
            br.add_flow("priority=0,actions=NORMAL")?;
            format!("http://{}/", BACKENDS[0])
        }
        Case::Haproxy => {
            br.add_flow("priority=0,actions=NORMAL")?;
            let conf = dir.join("haproxy.cfg");
            std::fs::write(&conf, haproxy_conf())?;
            let conf = conf.to_string_lossy().to_string();
            _proxy = Some(proxy_host.spawn(&["haproxy", "-db", "-f", &conf])?);
            format!("http://{PROXY}/")
        }
        Case::Nginx => {
            br.add_flow("priority=0,actions=NORMAL")?;
            let conf = dir.join("nginx-proxy.conf");
            std::fs::create_dir_all(dir.join("tmp-proxy"))?;
            std::fs::write(&conf, nginx_proxy_conf(dir))?;
            let conf = conf.to_string_lossy().to_string();
            let d = dir.to_string_lossy().to_string();
            _proxy = Some(proxy_host.spawn(&["nginx", "-p", &d, "-c", &conf])?);
            format!("http://{PROXY}/")
        }
        Case::OvsHash | Case::OvsHashFields => {
            install_stateless_lb(br, &t, case)?;
            client.set_arp(VIP.parse()?, VIP_MAC)?;
            format!("http://{VIP}/")
        }
        Case::OvsLearn | Case::OvsLearnHash => {
            install_learn_lb(br, &t, case)?;
            client.set_arp(VIP.parse()?, VIP_MAC)?;
            format!("http://{VIP}/")
        }
        Case::OvsGroup => {
            install_group_lb(br, &t)?;
            client.set_arp(VIP.parse()?, VIP_MAC)?;
            format!("http://{VIP}/")
        }
        Case::Flowgate | Case::FlowgateProactive | Case::FlowgatePartitioned => {
            let (algorithm, mode) = match case {
                Case::Flowgate => (args.algorithm.as_str(), "reactive"),
                _ => {
                    // ISSLM (and `none`) decide per connection: proactive and partitioned
                    // modes take the load-weighted others.
                    let a = if matches!(args.algorithm.as_str(), "isslm" | "none") {
                        "least-connections"
                    } else {
                        args.algorithm.as_str()
                    };
                    let mode = if case == Case::FlowgateProactive {
                        "proactive"
                    } else {
                        "partitioned"
                    };
                    (a, mode)
                }
            };
            let c = start_flowgate(dir, algorithm, mode, args.partition_bits)?;
            br.set_controller(&[format!("tcp:{}", c.openflow)])?;
            br.wait_connected(Duration::from_secs(10))?;
            ctl = Some(c);
            format!("http://{VIP}/")
        }
    };
    if let Err(e) = wait_http(client, &url, Duration::from_secs(20)) {
        let proxy_log = _proxy.as_ref().map(|p| p.output()).unwrap_or_default();
        bail!("{case:?} with {backend_label} backends: {e}\n{proxy_log}");
    }
    if let Some(c) = ctl.as_ref().filter(|_| dsr) {
        wait_partitions_settled(c, Duration::from_secs(10 + 2 * PARTITION_TRANSITION_SECS))?;
    }
    let pi_before = ctl.as_ref().and_then(|c| c.packet_ins());
    eprintln!(
        "bench datapath: {case:?} ({backend_label} backends) for {} s",
        args.duration
    );
    let churn = args.weight_churn_ms > 0
        && matches!(
            case,
            Case::OvsGroup
                | Case::OvsHash
                | Case::OvsHashFields
                | Case::OvsLearn
                | Case::OvsLearnHash
        );
    let out = if churn {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let every = Duration::from_millis(args.weight_churn_ms);
        let (out, mods) = std::thread::scope(|s| {
            let h = s.spawn(|| churn_weights(br, case, &t, every, &stop));
            let out = wrk(client, args, &url, lua);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let mods = h
                .join()
                .map_err(|_| anyhow::anyhow!("weight churn panicked"));
            (out, mods)
        });
        let mods = mods??;
        eprintln!("bench datapath: {case:?}: {mods} weight changes (mod-group) during the run");
        out?
    } else {
        wrk(client, args, &url, lua)?
    };
    let pi_after = ctl.as_ref().and_then(|c| c.packet_ins());
    if let Some(p) = ctl.as_ref().filter(|_| dsr).and_then(|c| c.partitions()) {
        eprintln!("bench datapath: {case:?}: partitions after the run: {p}");
    }
    let (requests_per_sec, p50_ms, p99_ms, requests, errors) = parse_wrk(&out)?;
    eprintln!("bench datapath: {case:?}: {requests_per_sec:.0} requests/s");
    Ok(Measured {
        requests_per_sec,
        p50_ms,
        p99_ms,
        requests,
        errors,
        packet_ins: match (pi_before, pi_after) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        },
    })
}

/// Waits until every backend owns partitions and none is moving (a moving partition's
/// packets go through the controller): the steady state the case measures. (The first
/// backend located owns every partition until the others are.)
fn wait_partitions_settled(ctl: &Controller, timeout: Duration) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        let p = ctl.partitions().unwrap_or_default();
        let owned: Vec<u64> = p["owned"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default();
        if p["moving"].as_u64() == Some(0)
            && owned.len() == BACKENDS.len()
            && owned.iter().all(|&n| n > 0)
        {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            bail!("partitions not settled within {timeout:?}: {p}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One row per (case, backends): medians over the rounds, and every round's rate.
fn summarise(args: &DatapathArgs, runs: &[(Case, BackendKind, Measured)]) -> Vec<CaseResult> {
    let mut out = Vec::new();
    for &kind in &args.backends {
        for &case in &args.cases {
            let ms: Vec<&Measured> = runs
                .iter()
                .filter(|(c, k, _)| *c == case && *k == kind)
                .map(|(_, _, m)| m)
                .collect();
            if ms.is_empty() {
                continue;
            }
            let mut errors: Vec<&str> = ms.iter().map(|m| m.errors.as_str()).collect();
            errors.sort_unstable();
            errors.dedup();
            if errors.len() > 1 {
                errors.retain(|e| *e != "none");
            }
            out.push(CaseResult {
                case: case.label().into(),
                backend: kind.label().into(),
                requests_per_sec: median(ms.iter().map(|m| m.requests_per_sec).collect()),
                per_round: ms.iter().map(|m| m.requests_per_sec).collect(),
                p50_ms: median(ms.iter().map(|m| m.p50_ms).collect()),
                p99_ms: median(ms.iter().map(|m| m.p99_ms).collect()),
                requests: ms.iter().map(|m| m.requests).sum(),
                errors: errors.join("; "),
                packet_ins: ms.iter().map(|m| m.packet_ins).sum::<Option<u64>>(),
            });
        }
    }
    out
}

fn flowgate_testbed_unavailable() -> Option<String> {
    // Same checks as the tests' `require_root_ovs`, without skipping.
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(str::to_string))
        });
    if uid.as_deref() != Some("0") {
        return Some("not root".into());
    }
    for prog in ["ovs-vsctl", "wrk", "curl"] {
        if Command::new(prog).arg("--version").output().is_err() {
            return Some(format!("{prog} not found"));
        }
    }
    None
}

/// A path's rate against direct's in the same round, each round: the median, the lowest
/// and the highest. Rounds run every case within a minute or two, so the host's drift
/// over the whole run (2× within minutes on a shared VM) falls mostly outside each ratio,
/// which it does not for a ratio of the two medians. `None` with fewer than one round of
/// each.
fn paired_ratios(path: &CaseResult, direct: &CaseResult) -> Option<(f64, f64, f64)> {
    let ratios: Vec<f64> = path
        .per_round
        .iter()
        .zip(&direct.per_round)
        .filter(|(_, d)| **d > 0.0)
        .map(|(p, d)| p / d)
        .collect();
    let lo = ratios.iter().copied().reduce(f64::min)?;
    let hi = ratios.iter().copied().reduce(f64::max)?;
    Some((median(ratios), lo, hi))
}

pub fn table(results: &[CaseResult]) -> Table {
    // Each path against direct with the same backends.
    let direct_of = |backend: &str| {
        results
            .iter()
            .find(|r| r.case.starts_with("direct") && r.backend == backend)
    };
    let direct = |backend: &str| direct_of(backend).map(|r| r.requests_per_sec);
    let mut t = Table::new(&[
        "path",
        "backends",
        "requests/s (median)",
        "each round",
        "vs direct (medians)",
        "vs direct, round by round: median (lowest–highest)",
        "p50 ms",
        "p99 ms",
        "requests",
        "errors",
        "PACKET_INs / request",
    ]);
    for r in results {
        t.row(vec![
            r.case.clone(),
            r.backend.clone(),
            super::fmt_rate(r.requests_per_sec),
            r.per_round
                .iter()
                .map(|&v| super::fmt_rate(v))
                .collect::<Vec<_>>()
                .join(" / "),
            direct(&r.backend).map_or("–".into(), |d| {
                format!("{:.0}%", 100.0 * r.requests_per_sec / d)
            }),
            direct_of(&r.backend)
                .and_then(|d| paired_ratios(r, d))
                .map_or("–".into(), |(m, lo, hi)| {
                    format!("{:.0}% ({:.0}–{:.0}%)", 100.0 * m, 100.0 * lo, 100.0 * hi)
                }),
            format!("{:.2}", r.p50_ms),
            format!("{:.2}", r.p99_ms),
            r.requests.to_string(),
            r.errors.clone(),
            r.packet_ins.map_or("–".into(), |p| {
                format!("{:.1}", p as f64 / r.requests.max(1) as f64)
            }),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(per_round: &[f64]) -> CaseResult {
        CaseResult {
            case: "c".into(),
            backend: "nginx".into(),
            requests_per_sec: median(per_round.to_vec()),
            per_round: per_round.to_vec(),
            p50_ms: 0.0,
            p99_ms: 0.0,
            requests: 0,
            errors: "none".into(),
            packet_ins: None,
        }
    }

    #[test]
    fn paths_are_set_against_direct_round_by_round() {
        // Direct drifts from 10k to 20k over the run; the path is 90 % of it each round.
        let direct = result(&[10_000.0, 20_000.0, 15_000.0]);
        let path = result(&[9_000.0, 18_000.0, 13_500.0]);
        let (m, lo, hi) = paired_ratios(&path, &direct).expect("three rounds");
        assert!((m - 0.9).abs() < 1e-9 && (lo - 0.9).abs() < 1e-9 && (hi - 0.9).abs() < 1e-9);
        // A round that direct did not finish (0 requests/s) is left out, not divided by.
        let direct = result(&[10_000.0, 0.0, 20_000.0]);
        let path = result(&[5_000.0, 7_000.0, 30_000.0]);
        assert_eq!(paired_ratios(&path, &direct), Some((1.0, 0.5, 1.5)));
        assert_eq!(paired_ratios(&path, &result(&[])), None);
    }
}
