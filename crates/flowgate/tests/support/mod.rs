//! Shared harness for the end-to-end tests: the real `flowgate` binary as the controller,
//! real Open vSwitch (userspace datapath) and real hosts in network namespaces.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flowgate_testbed::rootleg::RootLeg;
use flowgate_testbed::{
    Bridge, Host, Prefix, ProcGuard, ScratchDir, cleanup_stale, require_root_ovs,
};

pub mod fake_switch;

pub const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

/// The start of a config whose controller listens on ports of its choosing (read back
/// from its ready file).
pub const LISTEN_ANY: &str =
    "[openflow]\nlisten = \"127.0.0.1:0\"\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n";

/// For an OVS test: its name prefix, once an earlier crashed run's leftovers are removed;
/// `None` (the test skips) without root and Open vSwitch.
pub fn setup(test: &str) -> Option<Prefix> {
    if !require_root_ovs(test) {
        return None;
    }
    let p = Prefix::for_test(test);
    cleanup_stale(p.as_str()).expect("clean leftovers");
    Some(p)
}

/// A controller process. Killed (SIGKILL) on drop.
pub struct Ctl {
    child: Option<Child>,
    pub openflow: SocketAddr,
    pub api: SocketAddr,
    /// Its config, ready file and logs; removed when the test passes.
    pub dir: ScratchDir,
    config: String,
    starts: u32,
}

impl Ctl {
    /// Start `flowgate controller` with `config`, where the listen addresses may use port 0.
    pub fn start(name: &str, config: &str) -> Ctl {
        let dir = ScratchDir::new(&format!("it-{name}")).expect("temp dir");
        failure::record();
        let mut ctl = Ctl {
            child: None,
            openflow: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            api: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            dir,
            config: config.to_string(),
            starts: 0,
        };
        ctl.spawn(config.to_string());
        ctl
    }

    fn spawn(&mut self, config: String) {
        self.starts += 1;
        let cfg_path = self.dir.join("flowgate.toml");
        std::fs::write(&cfg_path, &config).expect("write config");
        let ready = self.dir.join("ready.json");
        let _ = std::fs::remove_file(&ready);
        let log = std::fs::File::create(self.dir.join(format!("controller-{}.log", self.starts)))
            .expect("log");
        let child = Command::new(FLOWGATE)
            .args([
                "--log",
                "info,flowgate_core=debug",
                "controller",
                "--config",
            ])
            .arg(&cfg_path)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn flowgate controller");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let v: serde_json::Value = serde_json::from_str(&text).expect("ready file is JSON");
                self.openflow = v["openflow"]
                    .as_str()
                    .expect("openflow")
                    .parse()
                    .expect("addr");
                self.api = v["api"].as_str().expect("api").parse().expect("addr");
                break;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("controller exited early ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "controller did not become ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `tcp:127.0.0.1:PORT`, the target to give OVS.
    pub fn target(&self) -> String {
        format!("tcp:{}", self.openflow)
    }

    /// Makes this the controller of `bridges`, then waits until each has connected: until
    /// this controller lists its session (the switch's FEATURES_REPLY came). Open
    /// vSwitch's own `is_connected` column says so too, but it is refreshed only every few
    /// seconds: waiting on it took 0.2–5 s of each test's start.
    pub fn control(&self, bridges: &[Bridge]) {
        for b in bridges {
            b.set_controller(&[self.target()]).expect("set controller");
        }
        let listed = || {
            let have = self.switch_dpids();
            bridges.iter().all(|b| have.contains(&b.dpid()))
        };
        wait_until_explained(
            "the switches connected",
            Duration::from_secs(10),
            listed,
            || {
                format!(
                    "want {:?}; the controller lists {}",
                    bridges.iter().map(|b| b.name()).collect::<Vec<_>>(),
                    self.get_json("/api/v1/switches")
                )
            },
        );
    }

    /// Whether this controller has a session with `bridge` (`/api/v1/switches` lists its
    /// datapath id).
    pub fn lists_switch(&self, bridge: &Bridge) -> bool {
        self.switch_dpids().contains(&bridge.dpid())
    }

    /// The datapath ids of the switches this controller has sessions with.
    pub fn switch_dpids(&self) -> Vec<u64> {
        let switches = self.get_json("/api/v1/switches");
        let dpids = switches.as_array().into_iter().flatten();
        dpids
            .filter_map(|s| u64::from_str_radix(s["dpid"].as_str()?, 16).ok())
            .collect()
    }

    /// Kill the controller (SIGKILL: no goodbye to the switches) and start it again on the
    /// same ports.
    pub fn restart(&mut self) {
        self.kill();
        self.respawn(&self.config.clone());
    }

    /// Start the (killed) controller again on the same ports, with `config` from now on.
    pub fn respawn(&mut self, config: &str) {
        self.config = config.to_string();
        let cfg = pin_ports(config, self.openflow, self.api);
        self.spawn(cfg);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Reloads the controller with `config` (written to its file, then SIGHUP), once it
    /// says so in its log.
    pub fn reload_with(&self, config: &str) {
        let done = "SIGHUP: config reloaded";
        let before = self.log().matches(done).count();
        std::fs::write(self.dir.join("flowgate.toml"), config).expect("write config");
        signal(self.pid(), "HUP");
        wait_until("the reload", Duration::from_secs(10), || {
            self.log().matches(done).count() > before
        });
    }

    /// The controller's config file as it is now.
    pub fn config_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("flowgate.toml")).expect("config")
    }

    /// The controller's pid, from its ready file.
    pub fn pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.dir.join("ready.json")).expect("ready file");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        v["pid"].as_u64().expect("pid") as u32
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        for i in 1..=self.starts {
            s += &std::fs::read_to_string(self.dir.join(format!("controller-{i}.log")))
                .unwrap_or_default();
        }
        s
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.api, path)
    }

    /// PACKET_INs the controller has handled (`flowgate_packet_in_total`).
    pub fn packet_ins(&self) -> u64 {
        let (_, body) = self.get("/metrics");
        metric(&body, "flowgate_packet_in_total").expect("flowgate_packet_in_total") as u64
    }

    pub fn get_json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }

    /// Wait until every backend of every service is located and healthy.
    pub fn wait_backends_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.get_json("/api/v1/services");
            let all = v
                .as_array()
                .expect("list")
                .iter()
                .flat_map(|s| s["backends"].as_array().cloned().unwrap_or_default())
                .all(|b| b["located"] == true && b["healthy"] == true);
            if all {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "backends not ready: {v}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// OpenFlow ERRORs received from switches so far: any is a test failure.
    pub fn openflow_errors(&self) -> u64 {
        let (_, body) = self.get("/metrics");
        metric(&body, "flowgate_openflow_errors_total").unwrap_or(0.0) as u64
    }

    pub fn assert_no_openflow_errors(&self) {
        let n = self.openflow_errors();
        assert_eq!(
            n,
            0,
            "the switch answered with {n} OpenFlow ERROR(s):\n{}",
            self.log()
        );
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- controller log ({}) ---\n{}",
                self.dir.display(),
                abridged(&self.log(), 150, 300)
            );
            // Repeated after the log: CI keeps only the tail of a failed test's output.
            if let Some(failure) = failure::message() {
                eprintln!("--- the test failed: {failure} ---");
            }
        }
    }
}

/// `text` with only its first `head` and last `tail` lines where it has more: a flood's
/// debug log runs to hundreds of thousands of lines.
fn abridged(text: &str, head: usize, tail: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= head + tail {
        return text.to_string();
    }
    format!(
        "{}\n[... {} lines left out ...]\n{}",
        lines[..head].join("\n"),
        lines.len() - head - tail,
        lines[lines.len() - tail..].join("\n")
    )
}

/// The message of this thread's panic, for a harness that prints it again at the end.
mod failure {
    use std::cell::RefCell;
    use std::sync::Once;

    thread_local! {
        static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    /// Record panics from now on (the default hook still prints them where they happen).
    pub fn record() {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let default = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                LAST.with(|l| *l.borrow_mut() = Some(format!("{msg}{at}")));
                default(info);
            }));
        });
    }

    /// The message of the panic this thread is unwinding from, if recorded.
    pub fn message() -> Option<String> {
        LAST.with(|l| l.borrow().clone())
    }
}

/// Rewrite both `listen = "127.0.0.1:0"` lines to the given addresses.
fn pin_ports(cfg: &str, of: SocketAddr, api: SocketAddr) -> String {
    let mut out = String::new();
    let mut section = "";
    for line in cfg.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            section = if t == "[openflow]" {
                "openflow"
            } else if t == "[api]" {
                "api"
            } else {
                ""
            };
        }
        if t.starts_with("listen") && section == "openflow" {
            out += &format!("listen = \"{of}\"\n");
        } else if t.starts_with("listen") && section == "api" {
            out += &format!("listen = \"{api}\"\n");
        } else {
            out += line;
            out.push('\n');
        }
    }
    out
}

/// `kill -SIG pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid}");
}

/// New connections the controller saw on the 4-tuple of an earlier one it still held.
pub fn reopened(ctl: &Ctl) -> u64 {
    metric(
        &ctl.get("/metrics").1,
        "flowgate_connections_reopened_total",
    )
    .unwrap_or(0.0) as u64
}

/// Asserts that `shares` of `total` requests are round robin's over `n` backends. A client
/// port reused while the controller still holds the earlier connection keeps that one's
/// backend (as a consistent hash gives a reused 5-tuple), so each of the `reopened` such
/// connections may have gone to any backend, and the rest alternate.
pub fn assert_round_robin(shares: &[(String, u64)], total: u64, n: usize, reopened: u64) {
    let rest = total.saturating_sub(reopened);
    let lo = rest / n as u64;
    let hi = rest.div_ceil(n as u64) + reopened;
    assert!(
        shares.len() == n
            && shares.iter().map(|s| s.1).sum::<u64>() == total
            && shares.iter().all(|s| (lo..=hi).contains(&s.1)),
        "round robin over {n} backends, {total} requests, {reopened} reopened 4-tuple(s): each {lo}..={hi}; {shares:?}"
    );
}

/// The value of an unlabelled metric in a Prometheus text body.
pub fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// A minimal HTTP/1.1 GET over loopback (the API).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, &[], "")
}

pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to API");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes()).expect("send");
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).expect("read");
    let text = String::from_utf8_lossy(&resp).to_string();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = match text.find("\r\n\r\n") {
        Some(i) => decode_chunked_if_needed(&text[..i], &text[i + 4..]),
        None => String::new(),
    };
    (status, body)
}

fn decode_chunked_if_needed(head: &str, body: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_string();
    }
    dechunk(body)
}

/// The data of a chunked HTTP/1.1 body.
pub fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some(i) = rest.find("\r\n") {
        let n = usize::from_str_radix(rest[..i].trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out += &rest[i + 2..i + 2 + n];
        rest = &rest[i + 2 + n + 2..];
    }
    out
}

/// Start `flowgate httpd` on a host.
pub fn httpd(host: &Host, name: &str, extra: &[&str]) -> ProcGuard {
    httpd_on(host, &format!("{}:80", host.ip()), name, extra)
}

/// [`httpd`] listening on `listen` (`0.0.0.0:80` for one that also answers at a VIP on
/// its loopback).
pub fn httpd_on(host: &Host, listen: &str, name: &str, extra: &[&str]) -> ProcGuard {
    let mut argv = vec![FLOWGATE, "httpd", "--listen", listen, "--name", name];
    argv.extend_from_slice(extra);
    let g = host.spawn(&argv).expect("spawn httpd");
    host.wait_http(
        &format!("http://{}/health", host.ip()),
        Duration::from_secs(10),
    )
    .ok();
    g
}

/// Run `flowgate load` on a host and return its JSON report.
pub fn load(host: &Host, url: &str, args: &[&str]) -> serde_json::Value {
    let mut argv = vec![FLOWGATE, "load", "--url", url, "--json"];
    argv.extend_from_slice(args);
    let out = host.exec(&argv).expect("run load");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "load failed: {}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("load report not JSON ({e}): {text}"))
}

/// Per-backend request counts from a load report.
pub fn shares(report: &serde_json::Value) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = report["per_backend"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A switch-placed VIP (proactive or partitioned) served `report`'s 300 requests from
/// all three backends, each at least a tenth, with at most 10 PACKET_INs (`during`) in
/// all: new connections stayed off the controller. `flows` is shown on failure.
pub fn assert_spread_off_controller(
    mode: &str,
    report: &serde_json::Value,
    during: u64,
    flows: impl FnOnce() -> String,
) {
    assert_eq!(report["ok"], 300, "every request succeeds: {report}");
    let sh = shares(report);
    eprintln!("{mode} shares {sh:?}, PACKET_INs during 300 requests: {during}");
    assert_eq!(sh.len(), 3, "all three backends served: {sh:?}");
    for (name, n) in &sh {
        assert!(*n >= 30, "{name} served only {n} of 300: {sh:?}");
    }
    assert!(
        during <= 10,
        "new connections stayed off the controller: {during} PACKET_INs for 300 requests\n{}",
        flows()
    );
}

pub fn wait_until(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    wait_until_explained(what, timeout, f, String::new);
}

/// [`wait_until`], whose timeout also says what `explain` finds then: the state that a
/// failure seen once in CI needs to be placed.
pub fn wait_until_explained(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() >= deadline {
            panic!("timed out waiting for {what}\n{}", explain());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A config with one VIP service over `backends`, listening on port 0.
pub fn vip_config(
    vip: &str,
    algorithm: &str,
    backends: &[std::net::Ipv4Addr],
    extra_service: &str,
) -> String {
    format!(
        "{LISTEN_ANY}[[service]]\nname = \"web\"\nvip = \"{vip}\"\nport = 80\nalgorithm = \"{algorithm}\"\n{extra_service}\n[service.health]\nkind = \"none\"\n{}",
        backend_entries(backends, false)
    )
}

/// `[[service.backend]]` entries for `backends`; with `metrics`, each is scraped at
/// `http://ADDRESS:80/metrics`.
pub fn backend_entries<'a>(
    backends: impl IntoIterator<Item = &'a std::net::Ipv4Addr>,
    metrics: bool,
) -> String {
    let mut c = String::new();
    for b in backends {
        c += &format!("\n[[service.backend]]\naddress = \"{b}\"\n");
        if metrics {
            c += &format!("metrics = \"http://{b}:80/metrics\"\n");
        }
    }
    c
}

/// A leg from the root namespace (where the controller's health checks and scrapes run)
/// into `bridge`, at 10.0.0.250/24, named under the test's prefix.
pub fn root_leg(p: &Prefix, bridge: &Bridge) -> RootLeg {
    RootLeg::create(p.as_str(), "leg", "10.0.0.250/24", bridge).expect("root leg")
}

/// One ping from the root leg to `to`: the controller learns the leg like any host, so
/// its probes flow at once.
pub fn announce_leg(leg: &RootLeg, to: &str) {
    let _ = Command::new("ping")
        .args(["-c", "1", "-W", "1", "-I", leg.root_iface(), to])
        .output();
}

pub fn temp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

impl Ctl {
    /// True while the controller process is running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// The controller's log without ANSI colour codes, for matching `key=value` fields.
    pub fn log_plain(&self) -> String {
        strip_ansi(&self.log())
    }

    /// Returns once a switch of this controller (since its first start) is past its
    /// reconnect grace (3 s from its connection), in which the controller deletes no rule:
    /// a reload in it leaves the proactive group's rule placing new connections until it
    /// ends. Read from its log: a clock started with the test guessed it (3.5 s), and the
    /// switch once connected 0.55 s after the controller started, the reload came first
    /// and two new connections met no rule.
    pub fn wait_past_grace(&self) {
        self.wait_log("reconnect grace over", Duration::from_secs(10));
    }

    /// Waits for a log line containing `needle`: the log is written a moment after what
    /// it reports (the ready file, an API answer), so a test that reads it must wait.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log_plain().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?}:\n{}",
                self.log_plain()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Removes ANSI escape sequences (`ESC [ ... letter`) from a text.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for n in chars.by_ref() {
                if n.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of a labelled metric sample, e.g. `metric_labelled(body,
/// "flowgate_switch_packet_in_total", "dpid=\"000000000000beef\"")`.
pub fn metric_labelled(body: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
}

/// A config with one VIP service (as [`vip_config`]) plus extra `[openflow]` keys
/// (`"echo_interval_ms = 300\n..."`).
pub fn vip_config_openflow(
    vip: &str,
    algorithm: &str,
    backends: &[std::net::Ipv4Addr],
    openflow_extra: &str,
) -> String {
    vip_config(vip, algorithm, backends, "").replacen(
        "[openflow]\n",
        &format!("[openflow]\n{openflow_extra}"),
        1,
    )
}

/// In a `dump-flows`: the hosts' L2 rules (priority 100, on `dl_dst`).
pub fn l2_rules(flows: &str) -> usize {
    flows
        .lines()
        .filter(|l| l.contains("priority=100,dl_dst="))
        .count()
}

/// What a [`RuleWatch`] saw.
#[derive(Debug)]
pub struct Watched {
    pub dumps: usize,
    /// The fewest of each counted kind of rule, over all dumps.
    pub fewest: Vec<usize>,
    /// Dumps with fewer of any kind than the bridge held at the start, and the time from
    /// the first such dump to the end of the last.
    pub short: usize,
    pub short_span: Duration,
}

/// Dumps a bridge's flows every 20 ms on a thread, counting rules in each with `count`
/// (one number per kind of rule): whether a bridge kept its rules across a controller's
/// restart or failover, which no request's success shows while the rules come back
/// within a retransmission.
pub struct RuleWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Watched>,
}

impl RuleWatch {
    /// Watch `bridge`; `full` is what `count` gives for its flows at the start.
    pub fn start(bridge: &str, full: Vec<usize>, count: fn(&str) -> Vec<usize>) -> RuleWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let bridge = bridge.to_string();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut w = Watched {
                dumps: 0,
                fewest: vec![usize::MAX; full.len()],
                short: 0,
                short_span: Duration::ZERO,
            };
            let mut first_short = None;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                if let Ok(flows) = flowgate_testbed::ovs::ofctl(&["dump-flows", &bridge]) {
                    let n = count(&flows);
                    for (f, &c) in w.fewest.iter_mut().zip(&n) {
                        *f = (*f).min(c);
                    }
                    w.dumps += 1;
                    if n.iter().zip(&full).any(|(c, f)| c < f) {
                        w.short += 1;
                        let since = *first_short.get_or_insert(t);
                        w.short_span = since.elapsed();
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            w
        });
        RuleWatch { stop, thread }
    }

    pub fn stop(self) -> Watched {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the watch")
    }
}

/// `concurrency` keep-alive connections from `host` to `url`, used back to back for
/// `secs` seconds (a request may take up to `timeout_ms`): what a change in the network
/// must not break.
pub fn keepalive_load(
    host: &Host,
    url: &str,
    concurrency: u32,
    secs: u32,
    timeout_ms: u32,
) -> serde_json::Value {
    let (c, s, t) = (
        concurrency.to_string(),
        secs.to_string(),
        timeout_ms.to_string(),
    );
    load(
        host,
        url,
        &[
            "--new-connection-per-request",
            "false",
            "--concurrency",
            &c,
            "--requests",
            "1000000",
            "--duration-secs",
            &s,
            "--timeout-ms",
            &t,
        ],
    )
}

/// A download of `url` by `client` (curl, up to 60 s), and what it got once it ends:
/// `"200 <bytes>"` when it finished.
pub struct Download(std::process::Child);

impl Download {
    pub fn start(client: &Host, url: &str) -> Download {
        Self::start_with(client, url, &[])
    }

    /// A download that curl gives up once it has moved no byte for `secs` seconds (so
    /// that it does not finish, and [`Download::finishes`] fails, if it stalls that long).
    pub fn start_unstalled(client: &Host, url: &str, secs: u32) -> Download {
        let secs = secs.to_string();
        Self::start_with(client, url, &["--speed-limit", "1", "--speed-time", &secs])
    }

    fn start_with(client: &Host, url: &str, extra: &[&str]) -> Download {
        let args = ["curl", "-s", "-o", "/dev/null", "-m", "60"];
        let w = ["-w", "%{http_code} %{size_download}", url];
        let child = client
            .command(&[&args[..], extra, &w[..]].concat())
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl");
        Download(child)
    }

    pub fn outcome(self) -> String {
        let out = self.0.wait_with_output().expect("curl finishes");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Asserts that the download of `bytes` finished: `what` is the one it is.
    pub fn finishes(self, bytes: u64, what: &str) {
        let text = self.outcome();
        assert_eq!(
            text,
            format!("200 {bytes}"),
            "{what} finished (curl: {text})"
        );
    }
}

/// Waits until `done` holds of `bridge`'s flows, while `client` opens 4 new connections to
/// `url` a round (every one must succeed): rules that must end although new connections
/// keep coming.
pub fn wait_under_load(
    what: &str,
    timeout: Duration,
    client: &Host,
    url: &str,
    bridge: &Bridge,
    done: impl Fn(&str) -> bool,
) {
    wait_until(what, timeout, || {
        let more = load(client, url, &["--requests", "4", "--concurrency", "1"]);
        assert_eq!(more["ok"], 4, "new connections: {more}");
        done(&bridge.dump_flows().unwrap_or_default())
    });
}

/// Which backend host holds an established connection on port 80 (a download's).
pub fn carrier(hosts: &[Host]) -> Option<String> {
    hosts.iter().find_map(|h| {
        let out = h
            .exec_checked(&["ss", "-Htn", "state", "established", "( sport = :80 )"])
            .unwrap_or_default();
        (!out.trim().is_empty()).then(|| h.ip().to_string())
    })
}

/// The backend (its address) that holds the download in flight, once one does.
pub fn download_carrier(backends: &[Host]) -> String {
    let mut busy = None;
    wait_until("the download's backend", Duration::from_secs(10), || {
        busy = carrier(backends);
        busy.is_some()
    });
    busy.unwrap_or_default()
}

/// How many of a `dump-flows`' rules have `priority` and match `nw_dst=addr`.
pub fn rules_at(flows: &str, priority: u16, addr: &str) -> usize {
    let (p, a) = (format!("priority={priority},"), format!("nw_dst={addr},"));
    flows
        .lines()
        .filter(|l| l.contains(&p) && l.contains(&a))
        .count()
}
