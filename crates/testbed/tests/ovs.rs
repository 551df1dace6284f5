//! Integration tests on real Open vSwitch (userspace datapath) and network namespaces.
//! They need root and OVS: without them they are skipped (printed), unless `CI` is set,
//! in which case they fail. Test names start with `ovs_` so nextest can group them.

use std::io::Read as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use flowgate_testbed::load::LoadReport;
use flowgate_testbed::netns::{list_links, list_netns};
use flowgate_testbed::topo::{linear, single, tree};
use flowgate_testbed::{
    Bridge, Host, LinkKind, Ovs, Prefix, TopoOptions, cleanup_stale, require_root_ovs,
};

const TOOLS: &str = env!("CARGO_BIN_EXE_fg-testbed-tools");

/// Returns the test's prefix after removing leftovers of an earlier crashed run, or `None`
/// if the test is to be skipped.
fn setup(test: &str) -> Option<Prefix> {
    if !require_root_ovs(test) {
        return None;
    }
    let p = Prefix::for_test(test);
    if let Err(e) = cleanup_stale(p.as_str()) {
        panic!("cleanup_stale({p}) failed: {e}");
    }
    Some(p)
}

fn leftovers(prefix: &str) -> Result<Vec<String>> {
    let mut v: Vec<String> = Vec::new();
    v.extend(
        list_netns()?
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .map(|n| format!("netns {n}")),
    );
    v.extend(
        Ovs::list_bridges()?
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .map(|n| format!("bridge {n}")),
    );
    v.extend(
        list_links()?
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .map(|n| format!("link {n}")),
    );
    Ok(v)
}

fn start_httpd(h: &Host, name: &str, extra: &[&str]) -> Result<flowgate_testbed::ProcGuard> {
    let listen = format!("{}:8080", h.ip());
    let mut argv = vec![TOOLS, "httpd", "--listen", &listen, "--name", name];
    argv.extend_from_slice(extra);
    let mut p = h.spawn(&argv)?;
    p.wait_for_output("listening on", Duration::from_secs(10))?;
    Ok(p)
}

fn load_from(h: &Host, url: &str, extra: &[&str]) -> Result<LoadReport> {
    let mut argv = vec![TOOLS, "load", "--url", url, "--json"];
    argv.extend_from_slice(extra);
    let out = h.exec(&argv)?;
    ensure!(
        out.status.success(),
        "load failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("load report json")
}

#[test]
fn ovs_two_hosts_normal_ping_and_http() -> Result<()> {
    let Some(p) = setup("ovs_two_hosts_normal_ping_and_http") else {
        return Ok(());
    };
    let t = single(&TopoOptions::new(p.as_str()), 2)?;
    let (h1, h2) = (&t.hosts[0], &t.hosts[1]);
    assert_eq!((h1.ofport(), h2.ofport()), (1, 2));
    assert_eq!(h2.mac(), "00:00:00:00:00:02");
    t.add_flow_all("actions=NORMAL")?;
    let flows = t.bridges[0].dump_flows()?;
    assert!(flows.contains("actions=NORMAL"), "{flows}");

    assert!(h1.ping(h2.ip(), 2)?, "h1 cannot ping h2");

    // Our own server (through the tools binary) and a foreign one (python), via curl.
    let _srv = start_httpd(h2, "b2", &[])?;
    let out = h1.exec_checked(&["curl", "-s", "-i", "-m", "5", "http://10.0.0.2:8080/"])?;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.to_ascii_lowercase().contains("x-backend: b2"), "{out}");
    let _py = h1.spawn(&["python3", "-m", "http.server", "8000", "--bind", "10.0.0.1"])?;
    h2.wait_http("http://10.0.0.1:8000/", Duration::from_secs(10))?;

    // Keep-alive through the bridge: two URLs on one curl connection.
    let out = h1.exec_checked(&[
        "curl",
        "-sv",
        "-m",
        "5",
        "http://10.0.0.2:8080/a",
        "http://10.0.0.2:8080/b",
    ])?;
    assert_eq!(out.matches("b2").count(), 2, "{out}");
    Ok(())
}

#[test]
fn ovs_cleanup_on_drop_panic_and_stale() -> Result<()> {
    let Some(p) = setup("ovs_cleanup_on_drop_panic_and_stale") else {
        return Ok(());
    };
    let pre = p.as_str().to_owned();

    // 1. Normal drop, with a process running inside a namespace.
    let (pid, log1);
    {
        let t = linear(&TopoOptions::new(&pre).link_kind(LinkKind::Veth), 2, 1)?;
        let child = t.hosts[0].spawn(&["sleep", "300"])?;
        pid = child.id();
        log1 = child.log_path().to_path_buf();
        std::mem::forget(child); // even a leaked guard's process dies with the namespace
        assert!(leftovers(&pre)?.len() >= 4, "{:?}", leftovers(&pre)?);
        assert!(log1.exists());
    }
    assert_eq!(leftovers(&pre)?, Vec::<String>::new());
    // And its log with it.
    assert!(!log1.exists(), "{} left behind", log1.display());
    std::thread::sleep(Duration::from_millis(100));
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false);
    assert!(!alive, "process {pid} in the namespace survived");

    // 2. A panic while the topology is alive.
    let pre2 = pre.clone();
    let r = std::panic::catch_unwind(move || {
        let _t = single(&TopoOptions::new(&pre2), 2).expect("topology");
        panic!("test failure inside topology");
    });
    assert!(r.is_err());
    assert_eq!(leftovers(&pre)?, Vec::<String>::new());

    // 3. A "crash": guards leaked, then cleanup_stale.
    let br = Bridge::create(&format!("{pre}s9"), 9, &[])?;
    let h = Host::create(&pre, "h9", "10.0.0.9/24", &br, None)?;
    let sleeper = h.spawn(&["sleep", "300"])?;
    let log3 = sleeper.log_path().to_path_buf();
    std::mem::forget((br, h, sleeper));
    // netns + bridge + its veth + the tap device the userspace datapath makes for the bridge.
    assert_eq!(leftovers(&pre)?.len(), 4, "{:?}", leftovers(&pre)?);
    let cleaned = cleanup_stale(&pre)?;
    assert_eq!(cleaned.bridges, vec![format!("{pre}s9")]);
    assert_eq!(cleaned.namespaces, vec![format!("{pre}h9")]);
    assert_eq!(leftovers(&pre)?, Vec::<String>::new());
    assert!(!log3.exists(), "{} left behind", log3.display());
    Ok(())
}

#[test]
fn ovs_load_two_backends_through_bridge() -> Result<()> {
    let Some(p) = setup("ovs_load_two_backends_through_bridge") else {
        return Ok(());
    };
    let t = single(&TopoOptions::new(p.as_str()), 3)?;
    t.add_flow_all("actions=NORMAL")?;
    let (client, b2, b3) = (&t.hosts[0], &t.hosts[1], &t.hosts[2]);
    let _s2 = start_httpd(b2, "b2", &["--metrics"])?;
    let _s3 = start_httpd(
        b3,
        "b3",
        &["--concurrency", "1", "--queue", "0", "--delay-ms", "100"],
    )?;

    // Closed loop, new connection per request, 60 to b2.
    let r2 = load_from(
        client,
        "http://10.0.0.2:8080/",
        &["--requests", "60", "--concurrency", "4"],
    )?;
    assert_eq!((r2.sent, r2.ok, r2.failed), (60, 60, 0), "{r2}");
    assert_eq!(r2.per_backend.get("b2"), Some(&60));
    // Open loop, 40 to b3 at 20/s: each takes 100 ms with one slot, so none overlap... mostly.
    let r3 = load_from(
        client,
        "http://10.0.0.3:8080/",
        &["--requests", "40", "--rate", "8"],
    )?;
    assert_eq!((r3.sent, r3.ok + r3.failed), (40, 40), "{r3}");
    assert_eq!(r3.per_backend.get("b3"), Some(&40));
    assert_eq!(
        r3.ok + r3.errors.http_status.get(&503).copied().unwrap_or(0),
        40,
        "{r3}"
    );

    let mut total = r2.per_backend.clone();
    for (k, v) in &r3.per_backend {
        *total.entry(k.clone()).or_default() += v;
    }
    let all: u64 = total.values().sum();
    assert_eq!(all, 100);
    assert!((total["b2"] as f64 / all as f64 - 0.6).abs() < 1e-9);

    // Overload of b3 through the bridge: concurrent requests beyond one slot get 503.
    let r = load_from(
        client,
        "http://10.0.0.3:8080/",
        &["--requests", "12", "--concurrency", "4"],
    )?;
    assert!(
        r.errors.http_status.get(&503).copied().unwrap_or(0) >= 3,
        "{r}"
    );

    // Nothing listening: refused, counted.
    let r = load_from(client, "http://10.0.0.2:9/", &["--requests", "5"])?;
    assert_eq!(r.errors.connect_refused, 5, "{r}");

    // The metrics endpoint counted b2's 60 requests.
    let m = client.exec_checked(&["curl", "-s", "-m", "5", "http://10.0.0.2:8080/metrics"])?;
    assert!(
        m.contains("http_requests_total{backend=\"b2\",code=\"200\"} 60"),
        "{m}"
    );
    Ok(())
}

#[test]
fn ovs_linear3_normal_ping_end_to_end() -> Result<()> {
    let Some(p) = setup("ovs_linear3_normal_ping_end_to_end") else {
        return Ok(());
    };
    let t = linear(&TopoOptions::new(p.as_str()), 3, 1)?;
    assert_eq!(
        t.bridges.iter().map(Bridge::dpid).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    // Mininet's port order: host first, then the link to the previous switch.
    let ports: Vec<(u32, u32)> = t.links.iter().map(|l| (l.a.ofport, l.b.ofport)).collect();
    assert_eq!(ports, vec![(2, 2), (2, 3)]);
    let show = t.bridges[1].ofctl("show", &[])?;
    assert!(show.contains("dpid:0000000000000002"), "{show}");
    t.add_flow_all("actions=NORMAL")?;
    let failed = t.ping_all()?;
    assert!(failed.is_empty(), "failed pairs: {failed:?}");
    Ok(())
}

#[test]
fn ovs_veth_links_and_tree_carry_tcp() -> Result<()> {
    let Some(p) = setup("ovs_veth_links_and_tree_carry_tcp") else {
        return Ok(());
    };
    let t = tree(
        &TopoOptions::new(p.as_str()).link_kind(LinkKind::Veth),
        2,
        2,
    )?;
    assert_eq!((t.bridges.len(), t.hosts.len(), t.links.len()), (3, 4, 2));
    t.add_flow_all("actions=NORMAL")?;
    let (h1, h4) = (&t.hosts[0], &t.hosts[3]);
    assert!(
        h1.ping_until(h4.ip(), Duration::from_secs(5))?,
        "h1 cannot ping h4"
    );
    let _s = start_httpd(h4, "b4", &["--rate-bytes-per-sec", "2000000"])?;
    // A 1 MB download across two veth links: TCP with checksums that the receiver accepts.
    let r = load_from(
        h1,
        "http://10.0.0.4:8080/bytes/1000000",
        &["--requests", "1"],
    )?;
    assert_eq!((r.ok, r.bytes), (1, 1_000_000), "{r}");
    Ok(())
}

#[test]
fn ovs_bridge_connects_to_controller() -> Result<()> {
    let Some(p) = setup("ovs_bridge_connects_to_controller") else {
        return Ok(());
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    l.set_nonblocking(true)?;
    let target = format!("tcp:{}", l.local_addr()?);
    let br = Bridge::create(&format!("{p}s1"), 0xab, &[target])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sock = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e).context("switch never connected"),
        }
    };
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut hello = [0u8; 8];
    sock.read_exact(&mut hello)?;
    // OFPT_HELLO (type 0) with version 0x04 = OpenFlow 1.3.
    assert_eq!((hello[0], hello[1]), (0x04, 0x00), "{hello:?}");
    drop(br);
    assert_eq!(leftovers(p.as_str())?, Vec::<String>::new());
    Ok(())
}
