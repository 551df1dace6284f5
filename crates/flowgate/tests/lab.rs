//! `flowgate lab` end to end: the real binary builds the paper's network on Open vSwitch,
//! runs Case B's quick scenario (Case A's reference arm and ISSLM, each under normal and
//! heavy load), and writes tables and plots; and it removes everything on Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flowgate_lab::measure::{Row, jain};
use flowgate_lab::report::parse_csv;
use flowgate_testbed::require_root_ovs;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flowgate-lab-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("out dir");
    d
}

/// Everything named with `prefix` that the lab may have made: namespaces, bridges,
/// root-namespace interfaces.
fn leftovers(prefix: &str) -> Vec<String> {
    let mut v = Vec::new();
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    for l in String::from_utf8_lossy(&ns.stdout).lines() {
        if l.starts_with(prefix) {
            v.push(format!("netns {l}"));
        }
    }
    let br = Command::new("ovs-vsctl")
        .args(["list-br"])
        .output()
        .expect("ovs-vsctl");
    for l in String::from_utf8_lossy(&br.stdout).lines() {
        if l.starts_with(prefix) {
            v.push(format!("bridge {l}"));
        }
    }
    for e in std::fs::read_dir("/sys/class/net")
        .expect("sysfs")
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(prefix) {
            v.push(format!("link {n}"));
        }
    }
    v
}

/// Runs the binary with a hard time limit; returns (success, output).
fn run_bounded(args: &[&str], limit: Duration) -> (bool, String) {
    let log = std::env::temp_dir().join(format!("flowgate-lab-run-{}.log", std::process::id()));
    let f = std::fs::File::create(&log).expect("log");
    let mut child = Command::new(FLOWGATE)
        .args(args)
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("log"))
        .stderr(f)
        .spawn()
        .expect("spawn flowgate lab");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(20));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    // The caller shows the output where it fails.
    let _ = std::fs::remove_file(&log);
    (status.is_some_and(|s| s.success()), out)
}

/// Runs `flowgate lab run SCENARIO --quick` into `out` with its names under `prefix`,
/// within `limit`; asserts that it succeeded and left nothing behind, and returns its
/// output (also shown: a run's own lines say where its time went).
fn run_quick(scenario: &str, prefix: &str, out: &Path, limit: Duration) -> String {
    let started = Instant::now();
    let (ok, log) = run_bounded(
        &[
            "lab",
            "run",
            scenario,
            "--quick",
            "--prefix",
            prefix,
            "--out",
            out.to_str().expect("utf-8 path"),
        ],
        limit,
    );
    assert!(ok, "flowgate lab run {scenario} failed:\n{log}");
    eprintln!("{scenario} quick took {:?}\n{log}", started.elapsed());
    assert!(
        leftovers(prefix).is_empty(),
        "left behind: {:?}",
        leftovers(prefix)
    );
    log
}

fn close(a: f64, b: f64, what: &str, r: &Row) {
    let tol = 1e-9 * a.abs().max(b.abs()).max(1.0);
    assert!(
        (a - b).abs() <= tol,
        "{what}: CSV has {a}, recomputed {b} ({} {})",
        r.arm,
        r.phase
    );
}

fn row<'a>(rows: &'a [Row], arm: &str, phase: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.arm == arm && r.phase == phase)
        .unwrap_or_else(|| panic!("no row {arm} {phase}: {rows:?}"))
}

/// `flowgate lab run case-b --quick` writes the tables and plots, and its figures are
/// measured (they move with the load, the shares come from real responses and agree with
/// the controller's decisions) and consistent (Eqs. 1-6 recomputed from the raw columns).
#[test]
fn ovs_lab_case_b_quick() {
    if !require_root_ovs("ovs_lab_case_b_quick") {
        return;
    }
    let out = out_dir("case-b");
    let log = run_quick("case-b", "fglbt", &out, Duration::from_secs(420));

    // Files.
    for f in [
        "case-b.csv",
        "case-b.md",
        "case-b.json",
        "case-b-iperf.csv",
        "case-b-bandwidth.svg",
        "case-b-transfer.svg",
        "case-b-bdmax.svg",
        "case-b-dtransfer.svg",
        "case-b-delay.svg",
        "case-b-shares.svg",
    ] {
        let p = out.join(f);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(text.len() > 100, "{f} is nearly empty");
        if f.ends_with(".svg") {
            assert!(text.contains("<svg"), "{f} is not an SVG");
        }
    }
    let md = std::fs::read_to_string(out.join("case-b.md")).expect("md");
    for paper in ["1.449", "5.561", "77.70", "14.44", "6.500"] {
        assert!(
            md.contains(paper),
            "the paper's figure {paper} beside ours:\n{md}"
        );
    }
    assert!(
        log.contains("| isslm | heavy |"),
        "the table is printed:\n{log}"
    );

    let rows = parse_csv(&std::fs::read_to_string(out.join("case-b.csv")).expect("csv"))
        .expect("CSV parses");
    assert_eq!(rows.len(), 4, "{rows:?}");
    check_measured(&rows);
    check_consistent(&rows);
    let _ = std::fs::remove_dir_all(&out);
}

/// `flowgate lab run faults --quick`: server 4 answers no client (its SYN-ACKs dropped in
/// its namespace) and passes its health checks, under four handlings of the silence, on
/// real Open vSwitch with real clients. Neither: every connection the controller gave it
/// is lost. Eject: it is ejected in the normal phase and given nothing in the heavy one.
/// Redispatch: every connection it got in the normal phase is moved and served, 3 s late,
/// and every request of that phase is answered (in the heavy one, those behind a lagging
/// switch stay and are lost). Both: answered too, ejected, and nothing for it in the
/// heavy phase.
#[test]
fn ovs_lab_faults_quick() {
    if !require_root_ovs("ovs_lab_faults_quick") {
        return;
    }
    let out = out_dir("faults");
    run_quick("faults", "fglft", &out, Duration::from_secs(420));
    let md = std::fs::read_to_string(out.join("faults.md")).expect("md");
    assert!(md.contains("The fault, for every arm: server 4"), "{md}");
    assert!(
        !out.join("faults-bdmax.svg").exists() && out.join("faults-p99.svg").exists(),
        "no QoS pass, no QoS plots; the HTTP ones are drawn"
    );
    let rows = parse_csv(&std::fs::read_to_string(out.join("faults.csv")).expect("csv"))
        .expect("CSV parses");
    assert_eq!(rows.len(), 8, "{rows:?}");
    for r in &rows {
        assert_eq!(r.srv4, 0, "server 4 answered a client: {r:?}");
        assert_eq!(r.iperf_max_bps, None, "no QoS pass: {r:?}");
    }
    // A request the controller gave server 4 and did not move is lost.
    let lost_all = |r: &Row| {
        assert!(
            r.ctl_srv4 > 0 && r.timeouts >= r.ctl_srv4,
            "each of server 4's connections timed out: {r:?}"
        );
        assert_eq!(r.redispatched, 0, "{r:?}");
    };
    let neither = row(&rows, "neither", "normal");
    lost_all(neither);
    assert_eq!(neither.ejections, 0, "{neither:?}");
    lost_all(row(&rows, "neither", "heavy"));
    let eject = row(&rows, "eject", "normal");
    lost_all(eject);
    assert_eq!(eject.ejections, 1, "{eject:?}");
    // Ejected for 30 s: the heavy phase gives it nothing.
    assert_eq!(row(&rows, "eject", "heavy").ctl_srv4, 0);
    for arm in ["redispatch", "both"] {
        let r = row(&rows, arm, "normal");
        assert_eq!(r.ok, r.offered, "every request answered: {r:?}");
        assert!(
            r.ctl_srv4 > 0 && r.redispatched == r.ctl_srv4,
            "each of server 4's connections moved: {r:?}"
        );
        assert!(
            r.lat_p99_ms.is_some_and(|ms| ms >= 3_000.0),
            "a moved connection waits for its client's SYN at 3 s: {r:?}"
        );
    }
    assert_eq!(row(&rows, "redispatch", "normal").ejections, 0);
    // Under the heavy load each of server 4's connections is moved, or, where the switch
    // was behind since its decision, left there and lost; no other server's is moved.
    let h = row(&rows, "redispatch", "heavy");
    assert!(
        h.ctl_srv4 > 0 && h.redispatched > 0 && h.redispatched <= h.ctl_srv4,
        "{h:?}"
    );
    assert!(
        h.redispatched == h.ctl_srv4 || h.excused_switch_behind > 0,
        "a connection of server 4 not moved is one behind a lagging switch: {h:?}"
    );
    assert!(h.failed >= h.ctl_srv4 - h.redispatched, "{h:?}");
    assert_eq!(row(&rows, "both", "normal").ejections, 1);
    assert_eq!(row(&rows, "both", "heavy").ctl_srv4, 0);
    let _ = std::fs::remove_dir_all(&out);
}

fn check_measured(rows: &[Row]) {
    for r in rows {
        // Every request was issued; every response names the server that sent it.
        assert_eq!(
            r.sent, r.offered,
            "{} {}: all requests sent",
            r.arm, r.phase
        );
        let responses: u64 = r.shares().iter().sum();
        assert!(
            responses >= r.ok && responses <= r.sent,
            "{} {}: responses {responses} between ok {} and sent {}",
            r.arm,
            r.phase,
            r.ok,
            r.sent
        );
        // The controller's decisions and the servers' answers agree (each connection that
        // got a response was decided once, to the server that answered), also when a
        // client reuses the 4-tuple of a connection whose rules are still in the switch
        // (every SYN comes up to be decided: see `controller::rules::not_syn`).
        for (i, (resp, picks)) in r
            .shares()
            .iter()
            .zip([r.ctl_srv1, r.ctl_srv2, r.ctl_srv3, r.ctl_srv4])
            .enumerate()
        {
            assert!(
                *resp <= picks,
                "{} {}: srv{} answered {resp} but was picked {picks} times",
                r.arm,
                r.phase,
                i + 1
            );
        }
        assert!(
            r.iperf_bytes.is_some_and(|b| b > 0) && r.iperf_max_bps.is_some_and(|b| b > 0.0),
            "iperf3 ran: {r:?}"
        );
        assert!(
            r.ping_rtt_avg_ms.is_some_and(|t| t > 0.0),
            "ping ran: {r:?}"
        );
        assert_eq!(r.clients_failed, 0, "every load client reported: {r:?}");
        // Lost handshakes are counted in every row (each client reads its namespace's
        // `TCPSynRetrans`), so a tail of one-second requests can be told apart.
        assert!(
            r.syn_retransmits.is_some(),
            "SYNs sent again counted: {r:?}"
        );
        // Percentiles over all the phase's ok requests: ordered, and present when any
        // request was answered.
        let (p50, p95, p99) = (r.lat_p50_ms, r.lat_p95_ms, r.lat_p99_ms);
        assert_eq!(p50.is_some(), r.ok > 0, "{r:?}");
        assert!(p50 <= p95 && p95 <= p99, "{r:?}");
        assert!(r.wall_s >= r.duration_s * 0.9, "the phase lasted: {r:?}");
    }
    for arm in ["none", "isslm"] {
        let (n, h) = (row(rows, arm, "normal"), row(rows, arm, "heavy"));
        assert_eq!(h.offered, 10 * n.offered, "heavy is ten times normal");
        assert!(
            n.ok >= n.offered * 95 / 100,
            "{arm}: normal load is served: {n:?}"
        );
        // Ten times the load serves more. Without management everything goes to server 2,
        // which saturates at its own capacity: how far above the normal phase that is
        // depends on how fast this machine is at the moment (167-171/s against a normal 50
        // when idle, 93/s in a loaded CI run), so that arm is held to "more"; with ISSLM the
        // other servers take the rest, and it must serve at least twice the normal phase.
        let factor = if arm == "none" { 1.0 } else { 2.0 };
        assert!(
            h.ok_rps > factor * n.ok_rps,
            "{arm}: heavy throughput {} vs normal {}",
            h.ok_rps,
            n.ok_rps
        );
    }
    // Case A: everything on server 2, which cannot carry the heavy load.
    let a = row(rows, "none", "heavy");
    assert_eq!(a.shares()[1], a.shares().iter().sum::<u64>(), "{a:?}");
    assert!(
        a.failed > a.offered / 5,
        "server 2 overloads without ISSLM: {a:?}"
    );
    // Case B: ISSLM moves flows off server 2 and serves more.
    let b = row(rows, "isslm", "heavy");
    assert!(
        b.srv1 > 0 && b.srv3 > 0 && b.srv4 > 0,
        "ISSLM spreads the load: {b:?}"
    );
    assert!(
        b.ok > a.ok,
        "ISSLM serves more than no management: {} vs {}",
        b.ok,
        a.ok
    );
    assert!(b.jain > a.jain, "and more fairly: {} vs {}", b.jain, a.jain);
    // Connections moved off server 2 complete: a redirected connection is decided once
    // and carried both ways (it was decided twice, or reset, before the fix in
    // controller/vip.rs), and ISSLM sees the servers' real rates (with a 10 ms rate
    // window every server read as "over" and Jain stayed near 0.45).
    for (i, picks) in [(0, b.ctl_srv1), (2, b.ctl_srv3), (3, b.ctl_srv4)] {
        assert!(
            b.shares()[i] * 10 >= picks * 9,
            "srv{} answered {} of its {picks} connections: {b:?}",
            i + 1,
            b.shares()[i]
        );
    }
    assert!(b.jain > 0.7, "ISSLM spreads the heavy load: {b:?}");
    // Every connection placed off server 2 was an ISSLM move, and the moves are counted
    // by the search that found the target; without management nothing moves.
    let moves = |r: &Row| r.moved_by_load + r.moved_by_conns + r.moved_by_rt;
    let elsewhere = b.ctl_srv1 + b.ctl_srv3 + b.ctl_srv4;
    assert!(moves(b) >= elsewhere && elsewhere > 0, "moves: {b:?}");
    assert_eq!(moves(a), 0, "{a:?}");
}

fn check_consistent(rows: &[Row]) {
    let val = |v: Option<f64>, what: &str, r: &Row| {
        v.unwrap_or_else(|| panic!("{what} missing in {} {}: {r:?}", r.arm, r.phase))
    };
    for r in rows {
        let sh = r.shares().map(|v| v as f64);
        close(r.jain, jain(&sh), "Jain", r);
        close(r.ok_rps, r.ok as f64 / r.wall_s, "ok/s", r);
        let b = val(r.iperf_max_bps, "iperf_max_bps", r) / 1e9;
        let d = r.iperf_bytes.unwrap_or_default() as f64 / 1e9;
        let secs = val(r.iperf_secs, "iperf_secs", r);
        close(val(r.bdmax_gbps, "B_d(max)", r), b, "B_d(max)", r);
        close(val(r.dtransfer_gb, "D_Transfer", r), d, "D_Transfer", r);
        let th = val(r.th_gbps, "T_h", r);
        close(th, 8.0 * d / secs, "Eq. 1 T_h", r);
        let rtt = val(r.ping_rtt_avg_ms, "RTT", r);
        close(val(r.de2e_ms, "D_E-E", r), rtt / 2.0, "Eq. 4 D_E-E", r);
        close(
            val(r.tx_delay_ms, "Delay_Transmission", r),
            d * 8.0 / b * 1000.0,
            "Eq. 5 Delay_Transmission",
            r,
        );
        assert!(
            th <= b * 1.1,
            "the mean rate is not above the best interval's: {r:?}"
        );
    }
    // One normal-load baseline for Eqs. 2, 3 and 6, as in the paper: the first arm's
    // (`none`, Case A's) normal QoS pass, repeated in the other arm's normal row.
    let base = row(rows, "none", "normal");
    let again = row(rows, "isslm", "normal");
    assert_eq!(
        (again.iperf_bytes, again.iperf_max_bps, again.iperf_secs),
        (base.iperf_bytes, base.iperf_max_bps, base.iperf_secs),
        "the normal QoS pass is shared"
    );
    for arm in ["none", "isslm"] {
        let (n, h) = (row(rows, arm, "normal"), row(rows, arm, "heavy"));
        assert!(n.isl_pct.is_none() && n.dtransfer_pct.is_none() && n.diff_delay_ms.is_none());
        let (hb, nb) = (val(h.bdmax_gbps, "B", h), val(base.bdmax_gbps, "B", base));
        let (hd, nd) = (
            val(h.dtransfer_gb, "D", h),
            val(base.dtransfer_gb, "D", base),
        );
        let isl = 100.0 - 100.0 * hb / nb;
        let dtr = 100.0 - 100.0 * hd / nd;
        close(h.isl_pct.expect("%I_SL"), isl, "Eq. 2 %I_SL", h);
        close(
            h.dtransfer_pct.expect("%D_Transfer"),
            dtr,
            "Eq. 3 %D_Transfer",
            h,
        );
        close(
            h.diff_delay_ms.expect("Δ delay"),
            val(h.tx_delay_ms, "Delay_Tx", h) - val(base.tx_delay_ms, "Delay_Tx", base),
            "Eq. 6 differential delay",
            h,
        );
    }
}

/// `flowgate lab run case-c --quick --failover` (49.4 s here): the four domains, two
/// global controllers and etcd, and a third phase whose second pass kills the active
/// global controller (its first is the control). The standby takes over, the domains serve
/// through the gap, and the report's request windows account for exactly the requests the
/// failover rows count. `--failover` with any other scenario is refused before anything is
/// built.
#[test]
fn ovs_lab_case_c_failover() {
    if !require_root_ovs("ovs_lab_case_c_failover") {
        return;
    }
    let out = out_dir("case-c-failover");
    let prefix = "fglcf";
    let started = Instant::now();
    let (ok, log) = run_bounded(
        &[
            "lab",
            "run",
            "case-c",
            "--quick",
            "--failover",
            "--prefix",
            prefix,
            "--out",
            out.to_str().expect("utf-8 path"),
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "flowgate lab run failed:\n{log}");
    eprintln!(
        "case-c quick --failover took {:?}\n{log}",
        started.elapsed()
    );
    assert!(
        leftovers(prefix).is_empty(),
        "left behind: {:?}",
        leftovers(prefix)
    );

    let rows = parse_csv(&std::fs::read_to_string(out.join("case-c.csv")).expect("csv"))
        .expect("CSV parses");
    // d1..d4 and all, in each of the three phases.
    assert_eq!(rows.len(), 15, "{rows:?}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("case-c.json")).expect("json"))
            .expect("JSON parses");
    let f: flowgate_lab::failover::Failover =
        serde_json::from_value(json["failover"].clone()).expect("the run's failover");

    // Killed a quarter into the 4 s pass; the standby took over within a few leases (2 s).
    assert!(
        (0.5..=1.5).contains(&f.killed_at_s),
        "killed {} s into the pass",
        f.killed_at_s
    );
    let takeover = f.takeover_ms.expect("the standby took over");
    assert!(takeover <= 6000, "the standby took {takeover} ms");
    let md = std::fs::read_to_string(out.join("case-c.md")).expect("md");
    assert!(
        md.contains("C_p1 killed, C_p2 \"master\""),
        "C_p2 active at the end:\n{md}"
    );
    assert!(
        md.contains("#### Failover of the global controller"),
        "{md}"
    );
    assert!(
        md.contains(&format!(
            "The standby C_p2 was active {takeover} ms after the kill"
        )),
        "{md}"
    );

    // The windows: three per pass, back to back over the pass.
    assert_eq!(f.windows.len(), 6, "{:?}", f.windows);
    let all = row(&rows, "all", "failover");
    for pass in ["control", "failover"] {
        let w: Vec<_> = f.windows.iter().filter(|w| w.pass == pass).collect();
        assert_eq!(w.len(), 3, "{pass}: {w:?}");
        assert_eq!((w[0].from_s, w[0].to_s), (0.0, f.killed_at_s), "{w:?}");
        assert_eq!(w[1].to_s, w[2].from_s, "{w:?}");
        let sum =
            |g: fn(&flowgate_lab::failover::Window) -> u64| w.iter().map(|x| g(x)).sum::<u64>();
        // Every request of the pass, counted once: the failover rows are the second
        // pass's, and the control ran the same schedule (all of it sent at this size).
        if pass == "failover" {
            assert_eq!(sum(|x| x.due), all.sent, "{pass}: {w:?} against {all:?}");
            assert_eq!(sum(|x| x.ok), all.ok, "{pass}: {w:?} against {all:?}");
            assert_eq!(
                sum(|x| x.failed),
                all.failed,
                "{pass}: {w:?} against {all:?}"
            );
        } else {
            assert_eq!(sum(|x| x.due), all.offered, "{pass}: {w:?}");
            assert_eq!(
                sum(|x| x.ok) + sum(|x| x.failed),
                all.offered,
                "{pass}: {w:?}"
            );
        }
    }
    // With no active global controller the domains still decide: requests due in the gap
    // were answered.
    let gap = f
        .windows
        .iter()
        .find(|w| w.pass == "failover" && w.window == "no active global")
        .expect("the gap");
    assert!(gap.due > 0 && gap.ok > 0, "{gap:?}");
    // What the domains sampled across the gap (every 250 ms over about 2 s and a second
    // after); a spill in force at the kill is either kept or named.
    assert!(f.samples_in_gap >= 4, "{f:?}");
    assert!(
        f.spill_dropped
            .iter()
            .all(|d| f.spilling_at_kill.contains(d)),
        "{f:?}"
    );
    for d in ["d1", "d2", "d3", "d4"] {
        assert!(row(&rows, d, "failover").ok > 0, "{d} served nothing");
    }
    let _ = std::fs::remove_dir_all(&out);

    // Another scenario: refused, with the reason, before anything is built.
    let other = out_dir("case-a-failover");
    let (ok, log) = run_bounded(
        &[
            "lab",
            "run",
            "case-a",
            "--quick",
            "--failover",
            "--prefix",
            prefix,
            "--out",
            other.to_str().expect("utf-8 path"),
        ],
        Duration::from_secs(60),
    );
    assert!(!ok, "--failover with case-a ran:\n{log}");
    assert!(log.contains("--failover applies to case-c only"), "{log}");
    assert!(leftovers(prefix).is_empty());
    let _ = std::fs::remove_dir_all(&other);
}

/// `flowgate lab run case-a --quick --runs 2` (52-84 s here): two runs, each in its own
/// directory with its own seed, and a summary whose every figure is the median and range
/// of what the two runs' own CSVs hold; `flowgate lab summarize` of the same two runs
/// writes the same summary, and refuses a run of another scenario with the reason.
#[test]
fn ovs_lab_runs_and_summarize() {
    if !require_root_ovs("ovs_lab_runs_and_summarize") {
        return;
    }
    let out = out_dir("runs");
    let dir = out.to_str().expect("utf-8 path");
    let prefix = "fglrp";
    let (ok, log) = run_bounded(
        &[
            "lab", "run", "case-a", "--quick", "--runs", "2", "--seed", "7", "--prefix", prefix,
            "--out", dir,
        ],
        Duration::from_secs(420),
    );
    assert!(ok, "flowgate lab run --runs 2 failed:\n{log}");
    assert!(
        leftovers(prefix).is_empty(),
        "left behind: {:?}",
        leftovers(prefix)
    );
    assert!(
        log.contains("case-a (quick): 2 runs"),
        "the summary is printed:\n{log}"
    );

    // Each run: its own directory, its own seed, its own rows.
    let mut runs = Vec::new();
    for (i, seed) in [(1, 7), (2, 8)] {
        let d = out.join(format!("run-{i}"));
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(d.join("case-a.json")).expect("the run's JSON"),
        )
        .expect("JSON");
        assert_eq!(json["seed"], seed, "run {i}'s seed");
        let md = std::fs::read_to_string(d.join("case-a.md")).expect("the run's table");
        assert!(md.contains(&format!("--seed {seed}")), "its command: {md}");
        let rows = parse_csv(&std::fs::read_to_string(d.join("case-a.csv")).expect("csv"))
            .expect("CSV parses");
        assert_eq!(rows.len(), 2, "{rows:?}");
        runs.push(rows);
    }

    // The summary's CSV, line by line, against the runs' own figures.
    let summary = std::fs::read_to_string(out.join("case-a-runs.csv")).expect("summary CSV");
    let figure = |arm: &str, phase: &str, key: &str| -> Vec<String> {
        let head = format!("case-a,true,{arm},{phase},{key},");
        let line = summary
            .lines()
            .find(|l| l.starts_with(&head))
            .unwrap_or_else(|| panic!("no {head} in\n{summary}"));
        line.split(',').skip(5).map(str::to_owned).collect()
    };
    type Get = fn(&Row) -> Option<f64>;
    let checked: [(&str, Get); 5] = [
        ("ok", |r| Some(r.ok as f64)),
        ("ok_rps", |r| Some(r.ok_rps)),
        ("lat_p99_ms", |r| r.lat_p99_ms),
        ("bdmax_gbps", |r| r.bdmax_gbps),
        ("isl_pct", |r| r.isl_pct),
    ];
    for phase in ["normal", "heavy"] {
        for (key, get) in checked {
            let vals: Vec<Option<f64>> = runs
                .iter()
                .map(|rows| get(row(rows, "none", phase)))
                .collect();
            let cols = figure("none", phase, key);
            let num = |s: &str| {
                s.parse::<f64>()
                    .unwrap_or_else(|e| panic!("{key} {phase}: {s}: {e}"))
            };
            let got: Vec<Option<f64>> = cols[4]
                .split(';')
                .map(|v| (!v.is_empty()).then(|| num(v)))
                .collect();
            assert_eq!(got, vals, "{key} {phase}: each run's value, in order");
            let present: Vec<f64> = vals.iter().flatten().copied().collect();
            assert_eq!(cols[0], present.len().to_string(), "{key} {phase}: n");
            if key == "isl_pct" && phase == "normal" {
                assert!(
                    present.is_empty() && cols[1].is_empty(),
                    "no %I_SL at normal load"
                );
                continue;
            }
            let (lo, hi) = (present[0].min(present[1]), present[0].max(present[1]));
            close(
                num(&cols[1]),
                (lo + hi) / 2.0,
                key,
                row(&runs[0], "none", phase),
            );
            close(num(&cols[2]), lo, key, row(&runs[0], "none", phase));
            close(num(&cols[3]), hi, key, row(&runs[0], "none", phase));
        }
    }
    let md = std::fs::read_to_string(out.join("case-a-runs.md")).expect("summary table");
    assert!(md.contains("| none | heavy | "), "{md}");
    // The runs are named relative to the summary, with their seeds.
    assert!(
        md.contains("- `run-1/case-a.json` (seed 7)")
            && md.contains("- `run-2/case-a.json` (seed 8)"),
        "{md}"
    );
    assert!(out.join("case-a-runs.json").exists());

    // The same two runs read back by `lab summarize` give the same summary.
    let again = out.join("again");
    let summarize = |second: &Path| {
        run_bounded(
            &[
                "lab",
                "summarize",
                out.join("run-1").to_str().expect("utf-8"),
                second.to_str().expect("utf-8"),
                "--out",
                again.to_str().expect("utf-8"),
            ],
            Duration::from_secs(30),
        )
    };
    let run2 = out.join("run-2/case-a.json");
    let (ok, log) = summarize(&run2);
    assert!(ok, "lab summarize failed:\n{log}");
    assert_eq!(
        std::fs::read_to_string(again.join("case-a-runs.csv")).expect("csv"),
        summary
    );
    // A run of another scenario is refused, with which and why.
    let other = out.join("other.json");
    let text = std::fs::read_to_string(&run2).expect("json").replacen(
        "\"scenario\": \"case-a\"",
        "\"scenario\": \"case-b\"",
        1,
    );
    std::fs::write(&other, text).expect("write");
    let (ok, log) = summarize(&other);
    assert!(!ok, "runs of two scenarios are not summarised:\n{log}");
    assert!(
        log.contains("other.json: case-b --quick where") && log.contains("case-a --quick"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Ctrl-C in the middle of a run: the lab stops, and no namespace, bridge, interface or
/// controller process of it is left.
#[test]
fn ovs_lab_ctrl_c_cleans_up() {
    if !require_root_ovs("ovs_lab_ctrl_c_cleans_up") {
        return;
    }
    let out = out_dir("ctrl-c");
    let prefix = "fglbc";
    let log = out.join("run.log");
    let f = std::fs::File::create(&log).expect("log");
    let mut child = Command::new(FLOWGATE)
        .args([
            "lab", "run", "case-b", "--quick", "--prefix", prefix, "--out",
        ])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(f.try_clone().expect("log"))
        .stderr(f)
        .spawn()
        .expect("spawn");
    // Wait (bounded: another lab run may hold the lab lock) until the network is being
    // used: the controller is up and clients exist.
    let deadline = Instant::now() + Duration::from_secs(400);
    loop {
        let n = leftovers(prefix)
            .iter()
            .filter(|l| l.starts_with("netns"))
            .count();
        if n >= 10 {
            break;
        }
        if let Some(st) = child.try_wait().expect("wait") {
            panic!(
                "lab exited ({st}) before the network was built:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the network never came up");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(6));
    let pids = controller_pids(&out.join("logs"));
    assert!(!pids.is_empty(), "a controller was started");
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the lab did not stop within 90 s of Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "an interrupted run fails:\n{text}");
    assert!(text.contains("interrupted"), "says why:\n{text}");
    assert!(
        leftovers(prefix).is_empty(),
        "left behind after Ctrl-C: {:?}",
        leftovers(prefix)
    );
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "controller {pid} still runs"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

fn controller_pids(dir: &Path) -> Vec<u64> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.to_string_lossy().ends_with(".ready.json")
            && let Ok(t) = std::fs::read_to_string(&p)
            && let Ok(j) = serde_json::from_str::<serde_json::Value>(&t)
            && let Some(pid) = j["pid"].as_u64()
        {
            v.push(pid);
        }
    }
    v
}

/// `flowgate lab run overload --quick` (about 75 s here): the three modes at three offered
/// loads, with the table, the CSV and the three plots. The figures are measured and
/// consistent (the controller's admitted count never exceeds what the client opened; the
/// client's successes never exceed what the controller admitted), `off` refuses nothing,
/// and at three times capacity `adaptive` refuses, tells the refused at once more often
/// than `off` (whose clients time out) and serves more than `off`. The issue's stricter
/// targets (90 % of capacity, p99 within 3× unloaded) are `ovs_overload_three_modes`'s.
#[test]
fn ovs_lab_overload_quick() {
    if !require_root_ovs("ovs_lab_overload_quick") {
        return;
    }
    let out = out_dir("overload");
    // About 75 s of work; the rest is room for another lab run holding the lab lock.
    let log = run_quick("overload", "fglbo", &out, Duration::from_secs(600));
    for f in [
        "overload.csv",
        "overload.md",
        "overload.json",
        "overload-admitted.svg",
        "overload-goodput.svg",
        "overload-p99.svg",
    ] {
        let p = out.join(f);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(text.len() > 100, "{f} is nearly empty");
        if f.ends_with(".svg") {
            assert!(text.contains("<svg") && text.contains("adaptive"), "{f}");
        }
    }
    assert!(
        log.contains("| adaptive | 3 |"),
        "the table is printed:\n{log}"
    );
    let csv = std::fs::read_to_string(out.join("overload.csv")).expect("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let rows: Vec<std::collections::HashMap<&str, &str>> = lines
        .map(|l| header.iter().copied().zip(l.split(',')).collect())
        .collect();
    assert_eq!(rows.len(), 9, "3 modes × 3 loads: {csv}");
    let num = |r: &std::collections::HashMap<&str, &str>, k: &str| -> f64 {
        r.get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {r:?}"))
    };
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("overload.json")).expect("json"))
            .expect("JSON parses");
    let run_secs = json["overload"]["params"]["run_secs"]
        .as_f64()
        .expect("run_secs");
    for r in &rows {
        let (sent, okn) = (num(r, "sent"), num(r, "ok"));
        let expect = (num(r, "offered_rps") * run_secs).round().max(1.0);
        assert_eq!(sent, expect, "every request of the point was sent: {r:?}");
        assert!(okn <= num(r, "ctl_admitted"), "ok ≤ admitted: {r:?}");
        assert!(num(r, "ctl_admitted") <= sent, "admitted ≤ sent: {r:?}");
        assert!(
            okn + num(r, "refused_prompt") + num(r, "timeouts") <= sent,
            "{r:?}"
        );
        if r["mode"] == "off" {
            assert_eq!(num(r, "ctl_refused"), 0.0, "off refuses nothing: {r:?}");
        }
    }
    let at3 = |m: &str| {
        rows.iter()
            .find(|r| r["mode"] == m && r["multiple"] == "3")
            .unwrap_or_else(|| panic!("no {m} row at 3×: {csv}"))
    };
    let (off, ad) = (at3("off"), at3("adaptive"));
    assert!(num(ad, "ctl_refused") > 0.0, "adaptive gaps at 3×: {ad:?}");
    assert!(
        num(ad, "goodput_rps") > num(off, "goodput_rps"),
        "adaptive serves more than off at 3×: {ad:?} vs {off:?}"
    );
    assert!(
        num(ad, "timeouts") < num(off, "timeouts"),
        "adaptive leaves fewer clients waiting than off: {ad:?} vs {off:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
