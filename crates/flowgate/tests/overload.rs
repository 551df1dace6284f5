//! Overload control end to end: the real controller, real Open vSwitch (userspace
//! datapath), backends with a fixed concurrency limit, and open-loop clients.
//!
//! The pool's capacity is **configured**: `capacity_rps` = backends × concurrency × 1000 /
//! delay (20 requests/s here), the figure an operator reads off the servers' settings. A
//! closed-loop run with one worker per slot also measures it, for the record (it comes out
//! lower: each closed-loop cycle also pays for connection set-up).
//! Results are written as CSV and SVG to `target/overload/` (the path is printed), for
//! the lab to pick up.

mod support;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use flowgate_testbed::topo::{self, TopoOptions};
use flowgate_testbed::{Prefix, cleanup_stale, require_root_ovs};
use support::*;

const VIP: &str = "10.0.0.100";
/// Backends: `--delay-ms 200 --concurrency 2`: 10 requests/s each, 20 for the pool (rates
/// kept low so that a shared 2-core machine measures the pool, not its own CPU).
const DELAY_MS: u64 = 200;
const CONCURRENCY: u64 = 2;
/// Up to 200 requests wait at each backend (5 s of work): without control, queues grow.
const QUEUE: u64 = 200;
const TIMEOUT_MS: u64 = 3000;
const RUN_SECS: f64 = 10.0;

fn setup(test: &str) -> Option<Prefix> {
    if !require_root_ovs(test) {
        return None;
    }
    let p = Prefix::for_test(test);
    cleanup_stale(p.as_str()).expect("clean leftovers");
    Some(p)
}

fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/overload");
    std::fs::create_dir_all(&d).expect("output dir");
    d
}

/// One VIP service over `backends`. With `metrics`, the backends' own Prometheus
/// endpoints are scraped every 50 ms (through a root-namespace leg): their requests in
/// flight plus queued are the pool's buffer occupancy, ACCM's feedback, against
/// `max_active_connections` (the pool's slots plus two waiting).
fn overload_config(
    backends: &[std::net::Ipv4Addr],
    mode: &str,
    capacity: f64,
    ctl: &str,
    metrics: bool,
) -> String {
    let mut c = format!(
        "[openflow]\nlisten = \"127.0.0.1:0\"\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n\
         [controller.overload]\nmode = \"{ctl}\"\n\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n\
         [service.health]\nkind = \"none\"\n[service.metrics]\ninterval_ms = 50\n\
         [service.overload]\nmode = \"{mode}\"\n"
    );
    if mode != "off" {
        // The capacity is exact here (fixed delay, fixed concurrency): hold the load
        // between 95% and 100% of it rather than the default 90–100%.
        c += &format!("capacity_rps = {capacity:.1}\nlow_watermark = 0.95\n");
        if metrics {
            let slots = backends.len() as u64 * CONCURRENCY + 2;
            c += &format!("max_active_connections = {slots}\n");
        }
    }
    for b in backends {
        c += &format!("\n[[service.backend]]\naddress = \"{b}\"\n");
        if metrics {
            c += &format!("metrics = \"http://{b}:80/metrics\"\n");
        }
    }
    c
}

#[derive(Debug, Clone)]
struct Point {
    mode: String,
    offered: f64,
    sent: u64,
    ok: u64,
    goodput: f64,
    p50: f64,
    p99: f64,
    /// Refused and told at once: connection refused (RST to the SYN), reset, or 503.
    refused_prompt: u64,
    /// Left waiting: connect timeouts and response timeouts.
    timeouts: u64,
    /// The controller's view after the run.
    admitted_limit: Option<f64>,
    gap_refused: u64,
}

fn run_point(client: &flowgate_testbed::Host, mode: &str, rate: f64, ctl: &Ctl) -> Point {
    let n = (rate * RUN_SECS).round() as u64;
    let r = load(
        client,
        &format!("http://{VIP}/"),
        &[
            "--rate",
            &format!("{rate}"),
            "--requests",
            &n.to_string(),
            "--timeout-ms",
            &TIMEOUT_MS.to_string(),
            "--duration-secs",
            &format!("{}", RUN_SECS + 1.0),
        ],
    );
    let e = &r["errors"];
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let http: u64 = e["http_status"]
        .as_object()
        .map(|m| m.values().map(u).sum())
        .unwrap_or(0);
    let ov = ctl.get_json("/api/v1/overload");
    let s = &ov["services"][0]["overload"];
    Point {
        mode: mode.to_string(),
        offered: rate,
        sent: u(&r["sent"]),
        ok: u(&r["ok"]),
        // Successful responses per second of the experiment (until the last one ended).
        goodput: u(&r["ok"]) as f64 / r["elapsed_secs"].as_f64().unwrap_or(RUN_SECS).max(RUN_SECS),
        p50: r["latency_ms"]["p50"].as_f64().unwrap_or(f64::NAN),
        p99: r["latency_ms"]["p99"].as_f64().unwrap_or(f64::NAN),
        refused_prompt: u(&e["connect_refused"]) + u(&e["reset"]) + http,
        timeouts: u(&e["connect_timeout"]) + u(&e["timeout"]),
        admitted_limit: s["admitted_rate_limit"].as_f64(),
        gap_refused: u(&s["refused_total"]),
    }
}

/// New connections offered at up to three times the pool's capacity with `off`,
/// `static` and `adaptive`: adaptive keeps goodput ≥ 90% of capacity and the p99 of
/// admitted requests within 3× the unloaded p99, better than the other two, and tells
/// every refused client at once.
#[test]
fn ovs_overload_three_modes() {
    let Some(p) = setup("ovs_overload_three_modes") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let leg = root_leg(&p, &t.bridges[0]);
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let client = &t.hosts[0];
    let args = [
        "--metrics",
        "--delay-ms",
        &DELAY_MS.to_string(),
        "--concurrency",
        &CONCURRENCY.to_string(),
        "--queue",
        &QUEUE.to_string(),
    ]
    .map(|s| s.to_string());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let _servers: Vec<_> = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{}", i + 2), &argv))
        .collect();
    let nominal = backends.len() as f64 * CONCURRENCY as f64 * 1000.0 / DELAY_MS as f64;

    let start = |mode: &str, capacity: f64| {
        let ctl = Ctl::start(
            &format!("overload-{mode}"),
            &overload_config(&backends, mode, capacity, "off", true),
        );
        t.bridges[0]
            .set_controller(&[ctl.target()])
            .expect("set controller");
        t.bridges[0]
            .wait_connected(Duration::from_secs(10))
            .expect("switch connects");
        // The leg is a host like any other; make it known so scrapes flow at once.
        for b in &backends {
            let _ = std::process::Command::new("ping")
                .args(["-c", "1", "-W", "1", "-I", leg.root_iface(), &b.to_string()])
                .output();
        }
        ctl.wait_backends_ready(Duration::from_secs(15));
        ctl
    };

    // Unloaded latency and the pool's measured capacity (closed loop, one worker per slot).
    let ctl = start("off", nominal);
    let unloaded = load(
        client,
        &format!("http://{VIP}/"),
        &["--rate", "10", "--requests", "40", "--timeout-ms", "3000"],
    );
    assert_eq!(unloaded["ok"], 40, "unloaded: {unloaded}");
    let unloaded_p99 = unloaded["latency_ms"]["p99"].as_f64().expect("p99");
    let slots = (backends.len() as u64 * CONCURRENCY).to_string();
    let sat = load(
        client,
        &format!("http://{VIP}/"),
        &[
            "--concurrency",
            &slots,
            "--requests",
            "300",
            "--timeout-ms",
            "3000",
        ],
    );
    let measured = sat["ok"].as_f64().unwrap_or(0.0) / sat["elapsed_secs"].as_f64().unwrap_or(1.0);
    eprintln!(
        "pool: configured {nominal:.1}/s, closed-loop measured {measured:.1}/s; unloaded p99 {unloaded_p99:.1} ms"
    );
    assert!(measured > 0.6 * nominal, "measured capacity {measured}");
    // The gate is configured with the capacity the pool really has on this machine (as an
    // operator would, or as the controller learns it), not the nominal one: a ceiling above
    // what the pool serves would let a queue build through the whole run.
    let capacity = measured.min(nominal);
    drop(ctl);

    let loads = [0.5, 1.5, 3.0];
    let mut points: Vec<Point> = Vec::new();
    for mode in ["off", "static", "adaptive"] {
        let ctl = start(mode, capacity);
        for &x in &loads {
            let pt = run_point(client, mode, (x * capacity).round(), &ctl);
            eprintln!("{pt:?}");
            points.push(pt);
            // Let the backends' queues drain before the next point.
            std::thread::sleep(Duration::from_millis(TIMEOUT_MS + 500));
        }
        if mode == "adaptive" {
            let (_, m) = ctl.get("/metrics");
            assert!(
                m.contains("flowgate_service_overload_mode{service=\"web\",mode=\"adaptive\"} 1"),
                "{m}"
            );
            assert!(m.contains("flowgate_service_overload_refused_total{service=\"web\"}"));
            let flows = t.bridges[0].dump_flows().expect("dump-flows");
            assert!(
                flows
                    .lines()
                    .any(|l| l.contains("priority=200") && l.contains("meter:16")),
                "the intercept rule carries the meter:\n{flows}"
            );
            let meters = t.bridges[0]
                .ofctl("dump-meters", &["-O", "OpenFlow13"])
                .unwrap_or_default();
            eprintln!("{meters}");
            assert!(
                meters.contains("meter=16") && meters.contains("pktps"),
                "{meters}"
            );
        }
        ctl.assert_no_openflow_errors();
    }
    write_results(&points, capacity, unloaded_p99);

    let at = |mode: &str| {
        points
            .iter()
            .find(|p| p.mode == mode && (p.offered - (3.0 * capacity).round()).abs() < 0.5)
            .cloned()
            .expect("point")
    };
    let (off, st, ad) = (at("off"), at("static"), at("adaptive"));
    assert!(
        ad.goodput >= 0.9 * capacity,
        "adaptive goodput {:.1}/s < 90% of {capacity:.1}/s: {ad:?}",
        ad.goodput
    );
    assert!(
        ad.p99 <= 3.0 * unloaded_p99,
        "adaptive p99 {:.1} ms > 3 × unloaded {unloaded_p99:.1} ms: {ad:?}",
        ad.p99
    );
    for other in [&off, &st] {
        assert!(
            ad.goodput > other.goodput,
            "goodput: adaptive {ad:?} vs {other:?}"
        );
        assert!(ad.p99 < other.p99, "p99: adaptive {ad:?} vs {other:?}");
    }
    // Every refused client was told at once: no timeouts; refusals are RSTs or 503s.
    assert_eq!(ad.timeouts, 0, "adaptive left clients waiting: {ad:?}");
    assert_eq!(ad.ok + ad.refused_prompt, ad.sent, "{ad:?}");
    assert!(ad.gap_refused > 0 && ad.admitted_limit.is_some(), "{ad:?}");
}

fn write_results(points: &[Point], capacity: f64, unloaded_p99: f64) {
    let dir = out_dir();
    let mut csv = String::from(
        "mode,offered_rps,capacity_rps,sent,ok,goodput_rps,admitted_rps,p50_ms,p99_ms,unloaded_p99_ms,refused_prompt,timeouts,admitted_rate_limit,gap_refused\n",
    );
    for p in points {
        // Admitted: requests the pool took on (served, or failed after admission).
        let admitted = (p.sent - p.refused_prompt.min(p.sent)) as f64 / RUN_SECS;
        let _ = writeln!(
            csv,
            "{},{},{capacity:.1},{},{},{:.2},{admitted:.2},{:.1},{:.1},{unloaded_p99:.1},{},{},{},{}",
            p.mode,
            p.offered,
            p.sent,
            p.ok,
            p.goodput,
            p.p50,
            p.p99,
            p.refused_prompt,
            p.timeouts,
            p.admitted_limit
                .map_or(String::new(), |a| format!("{a:.1}")),
            p.gap_refused
        );
    }
    let path = dir.join("three_modes.csv");
    std::fs::write(&path, &csv).expect("write csv");
    eprintln!("overload results: {}", path.display());
    for (metric, title, f) in [
        (
            "goodput",
            "goodput (req/s)",
            (|p: &Point| p.goodput) as fn(&Point) -> f64,
        ),
        (
            "p99",
            "p99 latency of admitted requests (ms)",
            |p: &Point| p.p99,
        ),
        ("admitted", "admitted (req/s)", |p: &Point| {
            (p.sent - p.refused_prompt.min(p.sent)) as f64 / RUN_SECS
        }),
    ] {
        let svg = svg_chart(points, title, f);
        let path = dir.join(format!("three_modes_{metric}.svg"));
        std::fs::write(&path, svg).expect("write svg");
        eprintln!("overload figure: {}", path.display());
    }
}

/// A small SVG line chart: one line per mode, `f` against offered load.
fn svg_chart(points: &[Point], title: &str, f: fn(&Point) -> f64) -> String {
    let (w, h, m) = (480.0, 320.0, 50.0);
    let xmax = points.iter().map(|p| p.offered).fold(1.0, f64::max) * 1.05;
    let ymax = points
        .iter()
        .map(f)
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.1;
    let sx = |x: f64| m + x / xmax * (w - 2.0 * m);
    let sy = |y: f64| h - m - y / ymax * (h - 2.0 * m);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\">{title} vs offered load (req/s)</text>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\">{xmax:.0}</text><text x=\"5\" y=\"{}\">{ymax:.0}</text>\n",
        w / 2.0,
        h - m,
        w - m,
        h - m,
        h - m,
        w - m - 20.0,
        h - m + 15.0,
        m + 4.0,
    );
    for (i, (mode, colour)) in [
        ("off", "#d62728"),
        ("static", "#ff7f0e"),
        ("adaptive", "#2ca02c"),
    ]
    .iter()
    .enumerate()
    {
        let pts: Vec<String> = points
            .iter()
            .filter(|p| p.mode == *mode && f(p).is_finite())
            .map(|p| format!("{:.1},{:.1}", sx(p.offered), sy(f(p))))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" fill=\"{colour}\">{mode}</text>",
            pts.join(" "),
            w - m - 60.0,
            m + 14.0 * i as f64,
        );
    }
    s + "</svg>\n"
}

/// Second VIP: a service nobody floods, whose new connections must keep being served.
const VIP2: &str = "10.0.0.101";
const VIP3: &str = "10.0.0.102";

/// Raw SYN sender (Python, in the attacker's namespace): SYNs to `dst`:80 from many
/// source ports, for at most `secs` and 3 000 000 SYNs. Prints the count sent.
fn syn_flood_script(src: std::net::Ipv4Addr, dst: &str, secs: f64) -> String {
    format!(
        "import socket,struct,time,random\n\
s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP)\n\
src='{src}';dst='{dst}'\n\
ph0=socket.inet_aton(src)+socket.inet_aton(dst)\n\
def csum(b):\n  s=sum(struct.unpack('!%dH'%(len(b)//2),b));s=(s>>16)+(s&0xffff);s+=s>>16;return ~s&0xffff\n\
t0=time.time();n=0;base=random.randint(0,30000)\n\
while n<3000000 and time.time()-t0<{secs}:\n  sp=1024+(base+n)%64000\n  tcp=struct.pack('!HHIIBBHHH',sp,80,n,0,5<<4,0x02,65535,0,0)\n  c=csum(ph0+struct.pack('!BBH',0,6,20)+tcp)\n  s.sendto(tcp[:16]+struct.pack('!H',c)+tcp[18:],(dst,0));n+=1\n\
print(n)\n"
    )
}

/// Two raw SYN senders from `attacker` to `vip` for `secs` seconds each.
fn syn_flood(attacker: &flowgate_testbed::Host, vip: &str, secs: f64) -> Vec<std::process::Child> {
    let script = syn_flood_script(attacker.ip(), vip, secs);
    (0..2)
        .map(|_| {
            attacker
                .command(&["python3", "-c", &script])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("flood sender")
        })
        .collect()
}

/// Waits for a flood's senders: the SYNs they sent.
fn flood_sent(senders: Vec<std::process::Child>) -> u64 {
    senders
        .into_iter()
        .map(|s| {
            let out = s.wait_with_output().expect("sender");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum()
}

/// `flowgate load --json` on `host`, in the background ([`load_report`] waits for it).
fn spawn_load(host: &flowgate_testbed::Host, url: &str, args: &[&str]) -> std::process::Child {
    let mut argv = vec![FLOWGATE, "load", "--url", url, "--json"];
    argv.extend_from_slice(args);
    host.command(&argv)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("load client")
}

/// What a [`spawn_load`] reported once it ended.
fn load_report(c: std::process::Child) -> serde_json::Value {
    let out = c.wait_with_output().expect("load client");
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// One of ovs-vswitchd's coverage counters (`ovs-appctl coverage/read-counter`).
fn ovs_coverage(counter: &str) -> Option<u64> {
    flowgate_testbed::ovs::appctl(&["coverage/read-counter", counter])
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What /metrics said about the controller's own overload state at one instant.
#[derive(Debug, Clone, Copy)]
struct FloodSample {
    t: f64,
    handled: f64,
    util: f64,
    queueing_ms: f64,
    standing_ms: f64,
    limit: f64,
    load: f64,
    outflow: f64,
    outflow_delay_ms: f64,
    rtt_ms: f64,
    meter_dropped: f64,
    refused: f64,
    packet_in_total: f64,
}

/// A flood of PACKET_INs beyond what the controller serves: SYNs to one VIP from many
/// source ports (raw sockets in a namespace), with that service's own overload control
/// **off**, so that only the controller's gap stands between the flood and the controller:
/// its measured load (busy fraction, queueing delay, bytes the switch has not taken, the
/// channel's round trip)
/// drives its admitted PACKET_IN rate, split over services max-min fair at the
/// controller's gate and enforced by the intercept and table-miss meters, whose drops the
/// controller reads back from METER_STATS. Shows: the switch stays connected (no echo
/// timeout, no reconnection), an established keep-alive connection and the new
/// connections of a second, unflooded service keep being served, the handled PACKET_IN
/// rate stays near the maximum the controller measured, and its queueing delay stays
/// bounded.
#[test]
fn ovs_overload_packet_in_flood() {
    let Some(p) = setup("ovs_overload_packet_in_flood") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let backend = t.hosts[1].ip();
    let mut config = overload_config(&[backend], "off", 0.0, "adaptive", false);
    config += &format!(
        "\n[[service]]\nname = \"api\"\nvip = \"{VIP2}\"\nport = 80\nalgorithm = \"round-robin\"\n\
         [service.health]\nkind = \"none\"\n\n[[service.backend]]\naddress = \"{backend}\"\n"
    );
    let ctl = Ctl::start("overload-flood", &config);
    t.bridges[0]
        .set_controller(&[ctl.target()])
        .expect("set controller");
    t.bridges[0]
        .wait_connected(Duration::from_secs(10))
        .expect("switch connects");
    let _s = httpd(&t.hosts[1], "b2", &["--delay-ms", "20"]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let attacker = &t.hosts[0];
    let user = &t.hosts[2];
    // Both know the VIPs' MAC before the flood.
    for (h, vip) in [(attacker, VIP), (user, VIP), (user, VIP2)] {
        let r = load(h, &format!("http://{vip}/"), &["--requests", "2"]);
        assert_eq!(r["ok"], 2, "{r}");
    }

    // An established keep-alive connection to the flooded service, through the flood.
    let keepalive = spawn_load(
        user,
        &format!("http://{VIP}/"),
        &[
            "--concurrency",
            "1",
            "--requests",
            "300",
            "--new-connection-per-request",
            "false",
            "--timeout-ms",
            "3000",
            "--duration-secs",
            "12",
        ],
    );
    // New connections to the other service, 5 a second (open loop), through the flood.
    let fresh = spawn_load(
        user,
        &format!("http://{VIP2}/"),
        &[
            "--rate",
            "5",
            "--requests",
            "45",
            "--timeout-ms",
            "3000",
            "--duration-secs",
            "12",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));

    // Two raw SYN senders, 8 s each: the flood lasts the whole sampling window, which
    // starts once the controller sees it (on a busy host the flood's first PACKET_INs came
    // 3.8–4.2 s after the senders started, with the two cores busy elsewhere).
    let packet_ins = || metric(&ctl.get("/metrics").1, "flowgate_packet_in_total").unwrap_or(0.0);
    let before = packet_ins();
    let senders = syn_flood(attacker, VIP, 8.0);
    let overflow_before = ovs_coverage("rconn_overflow");
    let spawned = Instant::now();
    while packet_ins() < before + 500.0 && spawned.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let t0 = Instant::now();
    eprintln!(
        "the flood reached the controller {:.2} s after its senders started",
        spawned.elapsed().as_secs_f64()
    );
    let mut samples = Vec::new();
    let mut connected_throughout = true;
    let mut ofctl_band_drops = 0u64;
    while t0.elapsed() < Duration::from_secs(7) {
        std::thread::sleep(Duration::from_millis(400));
        let (_, m) = ctl.get("/metrics");
        let g = |name: &str| metric(&m, name).unwrap_or(0.0);
        samples.push(FloodSample {
            t: t0.elapsed().as_secs_f64(),
            handled: g("flowgate_controller_packet_in_rate"),
            util: g("flowgate_controller_packet_in_utilization"),
            queueing_ms: g("flowgate_controller_packet_in_queueing_seconds") * 1000.0,
            standing_ms: g("flowgate_controller_packet_in_standing_queue_seconds") * 1000.0,
            limit: g("flowgate_controller_overload_admitted_rate_limit"),
            load: g("flowgate_controller_overload_load"),
            outflow: g("flowgate_controller_outflow_bytes"),
            outflow_delay_ms: g("flowgate_controller_outflow_delay_seconds") * 1000.0,
            rtt_ms: g("flowgate_controller_channel_rtt_seconds") * 1000.0,
            meter_dropped: g("flowgate_controller_overload_meter_dropped_total"),
            refused: g("flowgate_controller_overload_refused_total"),
            packet_in_total: g("flowgate_packet_in_total"),
        });
        connected_throughout &= t.bridges[0].is_connected().unwrap_or(false);
        {
            // OVS's own view of the meters' drops (the counts restart whenever the
            // controller modifies a meter, so the largest reading of a few is kept).
            let ms = t.bridges[0]
                .ofctl("meter-stats", &["-O", "OpenFlow13"])
                .unwrap_or_default();
            let drops: u64 = ms
                .lines()
                .filter_map(|l| l.trim().strip_prefix("0: packet_count:"))
                .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
                .sum();
            if drops > ofctl_band_drops {
                eprintln!(
                    "ovs-ofctl meter-stats at {:.1} s:\n{ms}",
                    t0.elapsed().as_secs_f64()
                );
                ofctl_band_drops = drops;
            }
        }
    }
    let sent = flood_sent(senders);
    let (ka, fr) = (load_report(keepalive), load_report(fresh));
    let (_, m) = ctl.get("/metrics");
    let max_rate = metric(&m, "flowgate_controller_packet_in_max_rate").unwrap_or(0.0);
    let ov = ctl.get_json("/api/v1/overload");
    let mut csv = String::from(
        "t_s,packet_in_rate,utilization,queueing_ms,standing_ms,admitted_limit,load,outflow_bytes,outflow_delay_ms,channel_rtt_ms,meter_dropped_total,gate_refused_total,packet_in_total\n",
    );
    for x in &samples {
        let _ = writeln!(
            csv,
            "{:.2},{:.0},{:.3},{:.2},{:.2},{:.0},{:.2},{:.0},{:.1},{:.1},{:.0},{:.0},{:.0}",
            x.t,
            x.handled,
            x.util,
            x.queueing_ms,
            x.standing_ms,
            x.limit,
            x.load,
            x.outflow,
            x.outflow_delay_ms,
            x.rtt_ms,
            x.meter_dropped,
            x.refused,
            x.packet_in_total
        );
    }
    let path = out_dir().join("packet_in_flood.csv");
    std::fs::write(&path, &csv).expect("csv");
    let log = ctl.log();
    let connects = log.matches("switch connected").count();
    eprintln!(
        "flood: {sent} SYNs sent; measured max handled {max_rate:.0}/s; switch sessions {connects}; samples at {}:\n{csv}\n{ov}\nkeep-alive: {ka}\nnew connections to {VIP2}: {fr}",
        path.display()
    );

    // Where a SYN the controller passed on can still be lost: the backend's own queues
    // (the flooded service's admitted SYNs reach the same host).
    let backend_tcp = t.hosts[1]
        .exec_checked(&[
            "nstat",
            "-az",
            "TcpExtListen*",
            "TcpExtTCPReqQFullDrop",
            "TcpExtSyncookies*",
            "TcpExtTCPBacklogDrop",
        ])
        .unwrap_or_default();
    eprintln!("backend's TCP counters:\n{backend_tcp}");
    // PACKET_INs Open vSwitch dropped because its queue to the controller was full (100
    // per connection); the counter is the daemon's, so parallel tests add to it.
    eprintln!(
        "ovs rconn_overflow during the flood: {:?}",
        ovs_coverage("rconn_overflow")
            .zip(overflow_before)
            .map(|(a, b)| a.saturating_sub(b))
    );
    assert!(sent > 10_000, "the flood was sent: {sent}");
    // The switch stayed connected: no echo timeout, no reconnection.
    assert!(connected_throughout, "the switch stayed connected");
    assert_eq!(connects, 1, "one session, never re-established");
    assert!(!log.contains("switch disconnected"), "no disconnection");
    assert!(
        ka["ok"].as_u64().unwrap_or(0) >= 100 && ka["failed"].as_u64() == Some(0),
        "the established connection was served throughout: {ka}"
    );
    let (fr_ok, fr_sent) = (
        fr["ok"].as_u64().unwrap_or(0),
        fr["sent"].as_u64().unwrap_or(0),
    );
    assert!(
        fr_sent >= 30 && fr_ok as f64 >= 0.9 * fr_sent as f64,
        "new connections of the unflooded service were served: {fr}"
    );
    // None of them was dropped by the controller's gate: it holds a service to the fair
    // level, the flooded one's share (held to what it asked, 2 of 45 were dropped on a
    // busy host, and their clients waited 1 s to send their SYN again).
    let api_refused = ov["services"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "api"))
        .map(|s| s["overload"]["controller_refused_total"].clone());
    assert_eq!(
        api_refused,
        Some(serde_json::json!(0)),
        "the controller's gate let all of the unflooded service's SYNs through: {ov}"
    );
    // And served on their first SYN: a client retransmits a SYN after 1 s. When the
    // session's reader did not yield to its writer, the answers (and the meters that hold
    // the flood back) waited in the controller's queue: p95 1.7–2.8 s in 10 of 10 runs;
    // since, 111–419 ms in 13, then 1,376 and 1,384 ms in a red CI run (the switch's own
    // queues, which the outflow does not see); with the channel's round trip probed and
    // held under 50 ms, 144–486 ms in 9; under 20 ms (the default), 71–210 ms in 9.
    let p95 = fr["latency_ms"]["p95"].as_f64().unwrap_or(f64::MAX);
    assert!(
        p95 < 1000.0,
        "the unflooded service's connections were set up on their first SYN (p95 {p95} ms): {fr}"
    );
    // The controller's own gap engaged: it limited its admitted rate, its gate refused
    // flood SYNs, and the switch's meters dropped PACKET_INs, which it read back.
    let flood: Vec<&FloodSample> = samples.iter().filter(|x| x.t > 1.0 && x.t <= 7.0).collect();
    assert!(
        flood.iter().any(|x| x.limit > 0.0),
        "the controller gapped itself: {samples:?}"
    );
    let last = samples.last().expect("samples");
    assert!(last.meter_dropped > 0.0, "METER_STATS fed back: {last:?}");
    // The control channel's round trip was probed, and Open vSwitch answered the echoes:
    // an unanswered one reads its age, which by the median window would be seconds
    // (answered, the median read 0.3–3.1 ms in 25 runs of stop 35).
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rtt_median = median(samples.iter().map(|x| x.rtt_ms).collect());
    assert!(
        samples.iter().any(|x| x.rtt_ms > 0.0) && rtt_median < 1000.0,
        "the channel's round trip was measured (median {rtt_median:.1} ms): {samples:?}"
    );
    // `ovs-ofctl meter-stats` shows the same band counts, but OVS restarts them on every
    // OFPMC_MODIFY (the meters change every few hundred ms here), so a reading taken just
    // after a modification shows zero: printed for the record, not asserted.
    eprintln!("largest band drop count read with ovs-ofctl: {ofctl_band_drops}");
    eprintln!(
        "flood window (1-7 s): handled {:.0}/s on average, measured maximum {max_rate:.0}/s; queueing max {:.1} ms",
        flood.iter().map(|x| x.handled).sum::<f64>() / flood.len().max(1) as f64,
        flood.iter().map(|x| x.queueing_ms).fold(0.0, f64::max)
    );
    // The handled rate holds rather than collapsing. Not asserted against the controller's
    // measured maximum (printed above): that is the burst OVS delivers before the meters
    // bind, and it ranged from 500 to 117 000/s over runs on this machine, while once the
    // gap holds OVS is the limit, not the controller (busy 2–50% of the time): OVS's upcall
    // path shares two cores with the raw-socket senders and other work, and delivers
    // 2 000–30 000 PACKET_INs/s from one window to the next. What a collapse looks like,
    // and what is asserted not to happen: handling stops (two windows running at zero),
    // the rate sinks over the flood (the second half's mean below a quarter of the
    // first's), or the controller saturates (busy all of the median window).
    let mean = |lo: f64, hi: f64| {
        let v: Vec<f64> = flood
            .iter()
            .filter(|x| x.t > lo && x.t <= hi)
            .map(|x| x.handled)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let (early, late) = (mean(1.0, 4.0), mean(4.0, 7.0));
    assert!(
        early > 0.0 && late >= early / 4.0,
        "PACKET_IN handling sank: {early:.0}/s then {late:.0}/s"
    );
    assert!(
        flood
            .windows(2)
            .all(|w| w[0].handled > 0.0 || w[1].handled > 0.0),
        "PACKET_IN handling stopped: {flood:?}"
    );
    let mut u: Vec<f64> = flood.iter().map(|x| x.util).collect();
    u.sort_by(f64::total_cmp);
    assert!(u[u.len() / 2] < 0.99, "the controller saturated: {u:?}");
    // Queueing delay bounded. The law holds the standing queue (each window's least
    // batch delay, CoDel's signal) at its 5 ms target: the median window's within 4× it.
    // The worst batch of a window is a burst measure: with the gate admitting the law's
    // rate the controller runs near its 90 % target, so single batches wait tens of ms
    // (debug build), and a stall of the whole machine can push one beyond 100 ms (seen in
    // CI: two such windows 3 s apart, each with no standing queue). A queue that builds
    // shows in every window after it, in both measures: so no two windows in a row beyond
    // 100 ms.
    let smed = median(flood.iter().map(|x| x.standing_ms).collect());
    let q: Vec<f64> = flood.iter().map(|x| x.queueing_ms).collect();
    let over = q.iter().filter(|&&x| x > 100.0).count();
    let over_in_a_row = q
        .windows(2)
        .filter(|w| w[0] > 100.0 && w[1] > 100.0)
        .count();
    assert!(
        smed <= 20.0 && over_in_a_row == 0,
        "queueing delay: standing median {smed:.1} ms, {over} windows' worst over 100 ms ({over_in_a_row} in a row): {flood:?}"
    );
    // After the flood, new connections are served again.
    std::thread::sleep(Duration::from_secs(2));
    let r = load(
        user,
        &format!("http://{VIP}/"),
        &["--requests", "20", "--timeout-ms", "3000"],
    );
    assert_eq!(r["ok"], 20, "served after the flood: {r}");
    ctl.assert_no_openflow_errors();
}

/// While the controller gaps a flooded service's new flows, it defers each connection it
/// admits to the client's ACK: its SYN goes straight to the backend's port, and the
/// backend's SYN-ACK must come up (the reply-catch rule) to be rewritten. Here that
/// backend also serves a proactive service on the same port, whose rules send every
/// segment from it through conntrack first, where a SYN-ACK of a connection conntrack
/// never saw begin is invalid. The real clients' deferred handshakes must still complete.
#[test]
fn ovs_deferred_handshakes_reach_a_backend_that_a_proactive_service_shares() {
    let Some(p) = setup("ovs_deferred_handshakes_reach_a_backend_that_a_proactive_service_shares")
    else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let backend = t.hosts[1].ip();
    let mut config = overload_config(&[backend], "off", 0.0, "adaptive", false);
    config += &format!(
        "\n[[service]]\nname = \"pro\"\nvip = \"{VIP3}\"\nport = 80\nalgorithm = \"round-robin\"\n\
         mode = \"proactive\"\n[service.health]\nkind = \"none\"\n\n\
         [[service.backend]]\naddress = \"{backend}\"\n"
    );
    let ctl = Ctl::start("overload-shared", &config);
    ctl.control(&t.bridges[..1]);
    let _s = httpd(&t.hosts[1], "b2", &[]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let attacker = &t.hosts[0];
    let user = &t.hosts[2];
    for (h, vip) in [(attacker, VIP), (user, VIP), (user, VIP3)] {
        let r = load(h, &format!("http://{vip}/"), &["--requests", "2"]);
        assert_eq!(r["ok"], 2, "{vip}: {r}");
    }

    // Real clients of the flooded service, 10 a second, through the flood.
    let users = spawn_load(
        user,
        &format!("http://{VIP}/"),
        &[
            "--rate",
            "10",
            "--requests",
            "60",
            "--timeout-ms",
            "3000",
            "--duration-secs",
            "10",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let syns = flood_sent(syn_flood(attacker, VIP, 6.0));
    assert!(syns > 10_000, "the flood was sent: {syns}");
    let served = load_report(users);
    let (_, m) = ctl.get("/metrics");
    let handshakes = |what: &str| {
        let name = format!("flowgate_service_handshakes_{what}_total");
        metric_labelled(&m, &name, "service=\"web\"").unwrap_or(0.0)
    };
    let (deferred, completed) = (handshakes("deferred"), handshakes("completed"));
    eprintln!("web: {deferred} handshakes deferred, {completed} completed; clients: {served}");
    assert!(deferred > 0.0, "the flooded service deferred: {served}");
    // Only real clients complete (the flood's source answers each SYN-ACK with a RST).
    // Dropped as invalid, none completed and 53 of 60 clients timed out; passed on to the
    // reply catch, 49 and 53 completed and every client was served (two runs).
    assert!(
        completed >= 10.0,
        "deferred handshakes completed ({completed} of {deferred}): {served}"
    );
    let (ok, sent) = (
        served["ok"].as_u64().unwrap_or(0),
        served["sent"].as_u64().unwrap_or(0),
    );
    assert!(
        sent >= 50 && ok as f64 >= 0.8 * sent as f64,
        "real clients were served through the flood: {served}"
    );
    ctl.assert_no_openflow_errors();
}

/// The probes' xid (`runtime::channel_rtt::PROBE_XID`).
const PROBE_XID: u32 = 0xec41;

/// How long until the controller sends `s` a round-trip probe (answered, as a switch
/// would), or `None` if none comes within `within`.
fn next_probe(s: &mut std::net::TcpStream, within: Duration) -> Option<Duration> {
    use std::io::Write as _;
    let start = Instant::now();
    loop {
        let left = within.checked_sub(start.elapsed())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("read timeout");
        let m = match fake_switch::read_msg(s) {
            Ok(Some(m)) => m,
            Ok(None) => panic!("the controller closed the session"),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(e) => panic!("read: {e}"),
        };
        if m[1] == fake_switch::OFPT_ECHO_REQUEST {
            let mut r = m.clone();
            r[1] = fake_switch::OFPT_ECHO_REPLY;
            s.write_all(&r).expect("echo reply");
            if fake_switch::xid_of(&m) == PROBE_XID {
                return Some(start.elapsed());
            }
        }
    }
}

/// A reload that turns the overload control on starts the round-trip probes of a switch
/// that sends nothing at once, not at its session's next keep-alive (30 s here); one that
/// turns it off stops them. The default config probes too, every 125 ms, for passive
/// outlier detection (`outlier_max_channel_rtt_ms`); 0 there and the control off: none.
#[test]
fn a_reload_starts_and_stops_an_idle_switchs_round_trip_probes() {
    let default = "[openflow]\nlisten = \"127.0.0.1:0\"\necho_interval_ms = 30000\necho_timeout_ms = 60000\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n";
    let base = &format!("{default}\n[controller]\noutlier_max_channel_rtt_ms = 0\n");
    let adaptive =
        format!("{base}\n[controller.overload]\nmode = \"adaptive\"\ninterval_ms = 100\n");
    let mut ctl = Ctl::start("rtt-reload", base);
    let mut s = fake_switch::handshake(ctl.openflow, 0x7e10);
    assert_eq!(
        next_probe(&mut s, Duration::from_secs(1)),
        None,
        "no probe while the overload control is off"
    );

    ctl.reload_with(&adaptive);
    // The reload's log line comes after the sessions were told: the probe may already be
    // here, and a probe every 25 ms (a quarter of the interval) follows each reply.
    let first = next_probe(&mut s, Duration::from_secs(5));
    assert!(
        first.is_some(),
        "no probe within 5 s of the reload:\n{}",
        ctl.log()
    );
    for i in 0..3 {
        assert!(
            next_probe(&mut s, Duration::from_secs(2)).is_some(),
            "probe {} after the reload did not come:\n{}",
            i + 2,
            ctl.log()
        );
    }

    // The reading reaches the core with the switch's next message that goes there (a
    // host's gratuitous ARP), and the API shows it.
    let rtt = || ctl.get_json("/api/v1/switches")[0]["channel_rtt_ms"].clone();
    std::io::Write::write_all(
        &mut s,
        &fake_switch::packet_in_garp(0x77, 1, [2, 0, 0, 0, 0, 0x42], [10, 0, 0, 0x42]),
    )
    .expect("PACKET_IN");
    wait_until("the round trip read", Duration::from_secs(5), || {
        rtt().as_f64().is_some_and(|ms| ms > 0.0)
    });

    ctl.reload_with(base);
    // One probe may have been on its way when the reload landed (a slow host may hold it
    // a while): at most a few come before a quiet 300 ms.
    for _ in 0..3 {
        if next_probe(&mut s, Duration::from_millis(300)).is_none() {
            break;
        }
    }
    assert_eq!(
        next_probe(&mut s, Duration::from_secs(1)),
        None,
        "probes after the reload turned the control off"
    );
    // Nothing measures the round trip now: the last reading is not shown as today's.
    assert_eq!(rtt(), serde_json::Value::Null, "after the probes stopped");

    ctl.reload_with(default);
    for i in 0..4 {
        assert!(
            next_probe(&mut s, Duration::from_secs(2)).is_some(),
            "probe {} for the verdicts did not come:\n{}",
            i + 1,
            ctl.log()
        );
    }
    ctl.kill();
}

/// A switch that keeps its session busy (an ECHO_REQUEST of its own every 50 ms, each
/// answered) but answers none of the controller's: how long the controller keeps the
/// session, up to `within`.
fn session_kept_by_a_switch_that_never_answers(ctl: &Ctl, within: Duration) -> Duration {
    use std::io::Write as _;
    let mut s = fake_switch::handshake(ctl.openflow, 0x7e11);
    s.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("read timeout");
    let start = Instant::now();
    let mut xid = 0x5000u32;
    while start.elapsed() < within {
        xid += 1;
        if s.write_all(&fake_switch::header(
            4,
            fake_switch::OFPT_ECHO_REQUEST,
            8,
            xid,
        ))
        .is_err()
        {
            return start.elapsed();
        }
        loop {
            match fake_switch::read_msg(&mut s) {
                Ok(Some(_)) => {}
                Ok(None) => return start.elapsed(),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break;
                }
                Err(_) => return start.elapsed(),
            }
        }
    }
    start.elapsed()
}

/// An ECHO_REQUEST must be answered (§7.5.2). A switch that answers none of the
/// round-trip probes is closed once one has waited the keep-alive's timeout, however busy
/// it keeps its session (its probe's age would otherwise read as the channel's round trip
/// and hold every switch's new flows to the least rate); with the overload control off
/// (no probes), the same switch is kept.
#[test]
fn a_switch_that_never_answers_the_round_trip_probe_is_closed() {
    let base = "[openflow]\nlisten = \"127.0.0.1:0\"\necho_interval_ms = 300\necho_timeout_ms = 900\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n";
    let off = Ctl::start("rtt-unanswered-off", base);
    let kept = session_kept_by_a_switch_that_never_answers(&off, Duration::from_secs(3));
    assert!(
        kept >= Duration::from_secs(3),
        "without probes, a busy switch is kept (closed after {kept:?}):\n{}",
        off.log()
    );
    let on = Ctl::start(
        "rtt-unanswered-on",
        &format!("{base}\n[controller.overload]\nmode = \"adaptive\"\ninterval_ms = 100\n"),
    );
    let kept = session_kept_by_a_switch_that_never_answers(&on, Duration::from_secs(10));
    assert!(
        kept < Duration::from_secs(5),
        "the session of a switch that answers no probe was kept {kept:?}:\n{}",
        on.log()
    );
    wait_until("the reason in the log", Duration::from_secs(5), || {
        on.log().contains("an echo reply to the round-trip probe")
    });
}
