//! The proactive mode end to end (`mode = "proactive"`): new connections are placed by an
//! OVS select group with conntrack DNAT, not by the controller; the controller steers
//! them through the bucket weights, and a drain never moves a live connection.

mod support;

use std::time::{Duration, Instant};

use flowgate_testbed::topo::{self, TopoOptions};
use support::*;

const VIP: &str = "10.0.0.100";
const TOKEN: &str = "proactive-token-0123456789";

/// An HTTP server on each of `hosts`, named `b2`, `b3`, ... as their addresses end.
fn servers(hosts: &[flowgate_testbed::Host]) -> Vec<flowgate_testbed::ProcGuard> {
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{}", i + 2), &[]))
        .collect()
}

/// In a `dump-flows`: the backends' rewrite rules of table 1 (`nw_dst` a backend), and
/// the hosts' L2 rules.
fn count_rules(flows: &str) -> Vec<usize> {
    let rewrites = flows
        .lines()
        .filter(|l| l.contains(" table=1,") && l.contains("priority=20,") && l.contains("nw_dst="))
        .count();
    vec![rewrites, l2_rules(flows)]
}

/// An API call with the token, no body.
fn with_token(ctl: &Ctl, method: &str, path: &str) -> (u16, String) {
    let auth = format!("Bearer {TOKEN}");
    http_request(
        ctl.api,
        method,
        path,
        &[("Authorization", auth.as_str())],
        "",
    )
}

/// The packets the rules of a `dump-flows` for which `which` holds have carried.
fn n_packets(flows: &str, which: impl Fn(&str) -> bool) -> u64 {
    flows
        .lines()
        .filter(|l| which(l))
        .filter_map(|l| {
            l.split("n_packets=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Table 1 (conntrack's) holds only its catch-alls, which stay once the last proactive
/// service is gone.
fn table_1_idle(flows: &str) -> bool {
    let rules: Vec<&str> = flows.lines().filter(|l| l.contains(" table=1,")).collect();
    rules.len() == 3
        && rules.iter().all(|l| {
            l.contains("priority=5,ct_state=+inv+trk actions=drop")
                || l.contains("priority=1,ct_state=+trk actions=resubmit(,0)")
                || (l.contains("priority=6,ct_state=+inv+trk,tcp,")
                    && l.contains("tcp_flags=+syn+ack actions=resubmit(,0)"))
        })
}

/// An HTTP server on each of `hosts` sending at most 1 MB/s (so a download lasts), on
/// every address of the host (so also at a VIP on its loopback, as the partitioned mode
/// has it).
fn slow_servers(hosts: &[flowgate_testbed::Host]) -> Vec<flowgate_testbed::ProcGuard> {
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            httpd_on(
                h,
                "0.0.0.0:80",
                &format!("b{}", i + 2),
                &["--rate-bytes-per-sec", "1000000"],
            )
        })
        .collect()
}

/// A client and two slow backends on one switch, a proactive service `web` of both (with
/// `extra` in its section and the API token): the controller once the group has both
/// buckets and the client has warmed up.
fn proactive_pair(
    p: &flowgate_testbed::Prefix,
    name: &str,
    extra: &str,
) -> (
    topo::Topology,
    Ctl,
    String,
    Vec<flowgate_testbed::ProcGuard>,
) {
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let cfg = vip_config(
        VIP,
        "round-robin",
        &backends,
        &format!("mode = \"proactive\"\n{extra}"),
    )
    .replacen("[api]\n", &format!("[api]\ntoken = \"{TOKEN}\"\n"), 1);
    let ctl = Ctl::start(name, &cfg);
    ctl.control(&t.bridges[..1]);
    let servers = slow_servers(&t.hosts[1..]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    wait_until("the select group", Duration::from_secs(10), || {
        let g = t.bridges[0].ofctl("dump-groups", &[]).unwrap_or_default();
        g.matches("nat(dst=").count() == 2
    });
    let warm = load(
        &t.hosts[0],
        &format!("http://{VIP}/"),
        &["--requests", "4", "--concurrency", "1"],
    );
    assert_eq!(warm["ok"], 4, "{warm}");
    (t, ctl, cfg, servers)
}

#[test]
fn ovs_proactive_vip_serves_and_rebalances() {
    let Some(p) = setup("ovs_proactive_vip_serves_and_rebalances") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let cfg = vip_config(
        VIP,
        "least-connections",
        &backends,
        "mode = \"proactive\"\n",
    )
    .replacen("[api]\n", &format!("[api]\ntoken = \"{TOKEN}\"\n"), 1);
    let ctl = Ctl::start("proactive", &cfg);
    ctl.control(&t.bridges[..1]);
    let br = &t.bridges[0];
    let _servers = slow_servers(&t.hosts[1..]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");

    // The group holds one DNAT bucket per backend once all three are located.
    let mut groups = String::new();
    wait_until("the select group", Duration::from_secs(10), || {
        groups = br.ofctl("dump-groups", &[]).unwrap_or_default();
        groups.contains("type=select") && groups.matches("nat(dst=").count() == 3
    });
    for b in &backends {
        assert!(
            groups.contains(&format!("nat(dst={b}:80)")),
            "a bucket DNATs to {b}:\n{groups}"
        );
    }
    // Warm up: the client's ARP for the VIP and L2 learning go through the controller.
    let warm = load(client, &url, &["--requests", "3", "--concurrency", "1"]);
    assert_eq!(warm["ok"], 3, "{warm}");

    let before = ctl.packet_ins();
    let report = load(client, &url, &["--requests", "300", "--concurrency", "4"]);
    let during = ctl.packet_ins() - before;
    assert_spread_off_controller("proactive", &report, during, || {
        br.dump_flows().unwrap_or_default()
    });
    let flows = br.dump_flows().expect("dump-flows");
    assert!(
        flows.contains("table=1") && flows.contains("ct_state=+new+trk"),
        "the proactive path in table 1:\n{flows}"
    );
    assert!(
        flows.contains("ct(table=1,zone=26215,nat)") && flows.contains("resubmit(,0)"),
        "both directions through conntrack, forwarding by table 0's L2 rules:\n{flows}"
    );
    assert!(
        !flows.contains(&format!(
            "priority=200,tcp,nw_dst={VIP},tp_dst=80 actions=CONTROLLER"
        )),
        "no intercept rule for the proactive VIP:\n{flows}"
    );

    // A long download (8 MB at 1 MB/s), then drain the backend carrying it.
    let dl = Download::start(client, &format!("http://{VIP}/bytes/8000000"));
    let busy = download_carrier(&t.hosts[1..]);
    let (st, body) = with_token(
        &ctl,
        "POST",
        &format!("/api/v1/services/web/backends/{busy}/drain"),
    );
    assert_eq!(st, 200, "drain {busy}: {body}");
    // Its bucket's weight goes to 0 within a refresh or two.
    let t0 = Instant::now();
    let mut groups = String::new();
    wait_until(
        "the drained bucket's weight 0",
        Duration::from_secs(5),
        || {
            groups = br.ofctl("dump-groups", &[]).unwrap_or_default();
            groups
                .split("bucket=")
                .any(|b| b.contains(&format!("nat(dst={busy}:80)")) && b.contains("weight:0"))
        },
    );
    eprintln!(
        "drained bucket at weight 0 after {:?}:\n{groups}",
        t0.elapsed()
    );

    let after = load(client, &url, &["--requests", "60", "--concurrency", "2"]);
    assert_eq!(after["ok"], 60, "{after}");
    let sh = shares(&after);
    let busy_name = format!(
        "b{}",
        busy.rsplit('.').next().unwrap().parse::<u8>().unwrap()
    );
    assert!(
        sh.iter().all(|(n, _)| *n != busy_name),
        "new connections avoid the drained {busy} ({busy_name}): {sh:?}"
    );
    assert_eq!(sh.len(), 2, "the two others serve: {sh:?}");

    dl.finishes(8_000_000, "the download on the drained backend");
    ctl.assert_no_openflow_errors();

    // A controller restart: the switch reconnects and is resynced (stale groups deleted by
    // id range, the group and the rules re-added); a download in flight across it keeps
    // its backend (conntrack holds it) and finishes. Through the restart and the switch's
    // reconnect grace, the switch keeps the rules it has: every dump of its flows shows
    // the backends' rewrite rules (table 1) and the hosts' L2 rules.
    let full = count_rules(&br.dump_flows().expect("dump-flows"));
    assert!(
        full[0] == 3 && full[1] >= 4,
        "the rewrites and the hosts' L2 rules: {full:?}"
    );
    let watch = RuleWatch::start(br.name(), full.clone(), count_rules);
    let mut ctl = ctl;
    let dl = Download::start(client, &format!("http://{VIP}/bytes/4000000"));
    wait_until(
        "the second download's backend",
        Duration::from_secs(10),
        || carrier(&t.hosts[1..]).is_some(),
    );
    ctl.restart();
    br.wait_connected(Duration::from_secs(10))
        .expect("switch reconnects");
    ctl.wait_backends_ready(Duration::from_secs(15));
    wait_until(
        "the group after the resync",
        Duration::from_secs(10),
        || {
            let g = br.ofctl("dump-groups", &[]).unwrap_or_default();
            g.matches("group_id=").count() == 1 && g.matches("nat(dst=").count() == 3
        },
    );
    // Past the grace (3 s by default), the stale rules are deleted: table 1 holds the
    // new-connection rule, two per backend (a direct connection's commit, the rewrite),
    // the reply rule and the three catch-alls.
    std::thread::sleep(Duration::from_secs(4));
    let w = watch.stop();
    eprintln!(
        "across the restart, from (rewrites, L2 rules) {full:?}: {w:?}; PACKET_INs at the new \
         controller: {}",
        ctl.packet_ins()
    );
    assert!(
        w.dumps >= 20,
        "the watch dumped the flows {} times",
        w.dumps
    );
    assert_eq!(
        w.fewest, full,
        "(backend rewrites, L2 rules) in the fewest of {} dumps across the restart",
        w.dumps
    );
    let table1 = || {
        let flows = br.dump_flows().unwrap_or_default();
        let n = flows.lines().filter(|l| l.contains(" table=1,")).count();
        (n, flows)
    };
    let (n, flows) = table1();
    assert_eq!(n, 11, "table 1 after the grace:\n{flows}");
    let again = load(client, &url, &["--requests", "30", "--concurrency", "2"]);
    assert_eq!(again["ok"], 30, "{again}");
    let (n, flows) = table1();
    assert_eq!(n, 11, "table 1 after the load:\n{flows}");
    dl.finishes(4_000_000, "the download across the controller restart");
    ctl.assert_no_openflow_errors();
}

/// A proactive service's backends stay reachable at their own addresses: the controller's
/// HTTP health checks (from a leg in the root namespace, across the bridge) find them up,
/// and a client reaches one directly, while the VIP serves through conntrack. Table 0
/// sends every segment from a backend's service port through conntrack to undo the DNAT;
/// a connection that did not come by the VIP must pass there too.
#[test]
fn ovs_proactive_backends_answer_at_their_own_addresses() {
    let Some(p) = setup("ovs_proactive_backends_answer_at_their_own_addresses") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let leg = root_leg(&p, &t.bridges[0]);
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let cfg = format!(
        "{LISTEN_ANY}[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         algorithm = \"round-robin\"\nmode = \"proactive\"\n[service.health]\nkind = \"http\"\n\
         path = \"/health\"\ninterval_ms = 200\n{}",
        backend_entries(&backends, false)
    );
    let ctl = Ctl::start("proactive-direct", &cfg);
    ctl.control(&t.bridges[..1]);
    let _servers = servers(&t.hosts[1..]);
    announce_leg(&leg, &backends[0].to_string());
    ctl.wait_backends_ready(Duration::from_secs(20));
    let client = &t.hosts[0];
    let via_vip = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "20", "--concurrency", "2"],
    );
    assert_eq!(via_vip["ok"], 20, "{via_vip}");
    for (i, b) in backends.iter().enumerate() {
        let direct = load(
            client,
            &format!("http://{b}/"),
            &["--requests", "5", "--concurrency", "1"],
        );
        assert_eq!(direct["ok"], 5, "{b} at its own address: {direct}");
        let served: Vec<&String> = direct["per_backend"]
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        assert_eq!(
            served,
            [&format!("b{}", i + 2)],
            "{b} itself answers: {direct}"
        );
    }
    // Still healthy after the checks of a few more intervals.
    std::thread::sleep(Duration::from_secs(2));
    ctl.wait_backends_ready(Duration::from_secs(1));
    ctl.assert_no_openflow_errors();
}

/// Two proactive services, two VIPs on one port, share their backends: each VIP's
/// connections are placed by its own group and answered from its own VIP (conntrack
/// remembers which address each connection came to); the backends' rules are the same
/// for both services.
#[test]
fn ovs_proactive_services_share_their_backends() {
    let Some(p) = setup("ovs_proactive_services_share_their_backends") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let service = |name: &str, vip: &str| {
        format!(
            "[[service]]\nname = \"{name}\"\nvip = \"{vip}\"\nport = 80\n\
             algorithm = \"round-robin\"\nmode = \"proactive\"\n[service.health]\n\
             kind = \"none\"\n{}",
            backend_entries(&backends, false)
        )
    };
    let cfg = format!(
        "{LISTEN_ANY}{}{}",
        service("web", VIP),
        service("api", "10.0.0.101")
    );
    let ctl = Ctl::start("proactive-shared", &cfg);
    ctl.control(&t.bridges[..1]);
    let _servers = servers(&t.hosts[1..]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let client = &t.hosts[0];
    for vip in [VIP, "10.0.0.101"] {
        let r = load(
            client,
            &format!("http://{vip}/"),
            &["--requests", "40", "--concurrency", "2"],
        );
        assert_eq!(r["ok"], 40, "{vip}: {r}");
        assert_eq!(shares(&r).len(), 2, "{vip}: both backends serve: {r}");
    }
    ctl.assert_no_openflow_errors();
}

/// In a `dump-flows`: what the rules for new connections to `vip` name, the meter of a
/// reactive service's intercept rule (`meter:N`) or the group of a proactive one's
/// (`group:N`).
fn named_by(flows: &str, vip: &str, what: &str) -> Vec<String> {
    let mut v: Vec<String> = flows
        .lines()
        .filter(|l| l.contains(&format!("nw_dst={vip},")) || l.contains(&format!("nw_dst={vip} ")))
        .filter_map(|l| {
            let at = l.find(what)?;
            let rest = &l[at + what.len()..];
            Some(rest.chars().take_while(char::is_ascii_hexdigit).collect())
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A reload that reverses the services' order on real Open vSwitch: the gapped reactive
/// service's intercept rule names its own meter, and the proactive service's rules their
/// own select group, before and after; both serve, and the switch reports no OpenFlow
/// error. Named by their place in the file, the two traded meter and group ids.
#[test]
fn ovs_a_reordering_reload_leaves_meters_and_groups_with_their_services() {
    let Some(p) = setup("ovs_a_reordering_reload_leaves_meters_and_groups_with_their_services")
    else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let web = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n\
         [service.overload]\nmode = \"adaptive\"\ncapacity_rps = 10000\n{}",
        backend_entries(&[t.hosts[1].ip()], false)
    );
    let api = format!(
        "[[service]]\nname = \"api\"\nvip = \"10.0.0.101\"\nport = 80\nmode = \"proactive\"\n\
         [service.health]\nkind = \"none\"\n{}",
        backend_entries(&[t.hosts[2].ip()], false)
    );
    let ctl = Ctl::start("proactive-reorder", &format!("{LISTEN_ANY}{web}{api}"));
    ctl.control(&t.bridges[..1]);
    let _servers = servers(&t.hosts[1..]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let client = &t.hosts[0];
    let serve = |what: &str| {
        for vip in [VIP, "10.0.0.101"] {
            let r = load(
                client,
                &format!("http://{vip}/"),
                &["--requests", "20", "--concurrency", "2"],
            );
            assert_eq!(r["ok"], 20, "{what}, {vip}: {r}");
        }
    };
    serve("before");
    let br = &t.bridges[0];
    let flows = br.dump_flows().expect("flows");
    let meter = named_by(&flows, VIP, "meter:");
    let group = named_by(&flows, "10.0.0.101", "group:");
    assert_eq!(meter.len(), 1, "web's intercept carries a meter: {flows}");
    assert_eq!(group.len(), 1, "api's rules name a group: {flows}");

    ctl.reload_with(&format!("{LISTEN_ANY}{api}{web}"));
    // The reload's rules are in once api's carry the other generation bit in their cookie
    // (the intercept rules went before them, on the same connection).
    let cookies = |flows: &str| named_by(flows, "10.0.0.101", "cookie=0x");
    let before = cookies(&flows);
    wait_until("the reload's rules", Duration::from_secs(10), || {
        let now = cookies(&br.dump_flows().unwrap_or_default());
        !now.is_empty() && now != before
    });
    serve("after");
    let flows = br.dump_flows().expect("flows");
    assert_eq!(named_by(&flows, VIP, "meter:"), meter, "{flows}");
    assert_eq!(named_by(&flows, "10.0.0.101", "group:"), group, "{flows}");
    ctl.assert_no_openflow_errors();
}

/// A backend removed from a proactive pool (`DELETE .../backends/B`) keeps carrying the
/// download it serves: its rules stay, retiring, until its traffic has been idle for the
/// service's idle timeout, and then the switch removes them. New connections go to the
/// others at once. Deleted with the pool's other changes, the rules took the download
/// with them (its packets met no rewrite and went up to the controller).
#[test]
fn ovs_proactive_removal_keeps_the_removed_backends_connections() {
    let Some(p) = setup("ovs_proactive_removal_keeps_the_removed_backends_connections") else {
        return;
    };
    let (t, ctl, _, _servers) = proactive_pair(&p, "proactive-removal", "idle_timeout_secs = 2\n");
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");
    // A download of 5 MB at 1 MB/s; its backend leaves the pool while it runs.
    let dl = Download::start(client, &format!("http://{VIP}/bytes/5000000"));
    let busy = download_carrier(&t.hosts[1..]);
    let (st, body) = with_token(
        &ctl,
        "DELETE",
        &format!("/api/v1/services/web/backends/{busy}"),
    );
    assert_eq!(st, 200, "remove {busy}: {body}");
    wait_until("one bucket", Duration::from_secs(5), || {
        let g = br.ofctl("dump-groups", &[]).unwrap_or_default();
        g.matches("nat(dst=").count() == 1 && !g.contains(&format!("nat(dst={busy}:80)"))
    });
    let names_busy = |flows: &str| {
        flows
            .lines()
            .filter(|l| {
                l.contains(&format!("nw_src={busy},")) || l.contains(&format!("nw_dst={busy},"))
            })
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // The two that carry the download (its answers to conntrack, its rewrite after it)
    // are there, retiring; the two for connections to its own address had carried
    // nothing for longer than the timeout, and Open vSwitch's replacement keeps a rule's
    // last use (§6.4 without OFPFF_RESET_COUNTS), so they may be gone already.
    let retiring = names_busy(&br.dump_flows().expect("flows"));
    let carrying = |l: &&String| {
        (l.contains("table=0") && l.contains(&format!("nw_src={busy},")))
            || (l.contains("table=1") && l.contains("ct_state=+trk,tcp,nw_dst="))
    };
    assert_eq!(
        retiring.iter().filter(carrying).count(),
        2,
        "its rules, retiring: {retiring:#?}"
    );
    assert!(
        retiring.iter().all(|l| l.contains("idle_timeout=2")),
        "{retiring:#?}"
    );

    let after = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
    assert_eq!(after["ok"], 20, "{after}");
    assert_eq!(shares(&after).len(), 1, "only the staying backend: {after}");

    dl.finishes(5_000_000, "the download on the removed backend");
    // Idle for 2 s, its rules go.
    wait_until(
        "the retiring rules' idle timeout",
        Duration::from_secs(15),
        || names_busy(&br.dump_flows().unwrap_or_default()).is_empty(),
    );
    ctl.assert_no_openflow_errors();
}

/// [`proactive_pair`] with an idle timeout of 2 s, once the switch is past its reconnect
/// grace (a reload in it would leave the group's rule placing new connections).
fn settled_pair(
    p: &flowgate_testbed::Prefix,
    name: &str,
) -> (
    topo::Topology,
    Ctl,
    String,
    Vec<flowgate_testbed::ProcGuard>,
) {
    let pair = proactive_pair(p, name, "idle_timeout_secs = 2\n");
    pair.1.wait_past_grace();
    pair
}

/// A reload that takes a service out of the proactive mode (to the reactive one) keeps the
/// download in flight on it: its VIP's conntrack rule stays, retiring, a priority above
/// the reactive intercept, with its backends' rules, until their traffic has been idle
/// for the idle timeout. New connections go up to the controller and are placed there.
#[test]
fn ovs_proactive_to_reactive_keeps_live_connections() {
    let Some(p) = setup("ovs_proactive_to_reactive_keeps_live_connections") else {
        return;
    };
    let (t, ctl, cfg, _servers) = settled_pair(&p, "proactive-to-reactive");
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");
    let dl = Download::start(client, &format!("http://{VIP}/bytes/5000000"));
    wait_until("the download's backend", Duration::from_secs(10), || {
        carrier(&t.hosts[1..]).is_some()
    });
    ctl.reload_with(&cfg.replace("mode = \"proactive\"\n", ""));
    let retiring_vip = |flows: &str| rules_at(flows, 251, VIP) > 0;
    wait_until("the retiring VIP rule", Duration::from_secs(5), || {
        retiring_vip(&br.dump_flows().unwrap_or_default())
    });
    // The flow table has changed; the datapath's cached flows follow it at the
    // revalidators' next round (until then, a SYN to the VIP could still meet a cached
    // flow into the old group, as it once did in CI).
    flowgate_testbed::Ovs::revalidated().expect("revalidator/wait");

    // New connections are the controller's now.
    let before = ctl.packet_ins();
    let after = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
    assert_eq!(after["ok"], 20, "{after}");
    assert!(
        ctl.packet_ins() > before,
        "reactive: new connections come up\n{}\n{}",
        br.dump_flows().unwrap_or_default(),
        flowgate_testbed::ovs::appctl(&["dpctl/dump-flows"]).unwrap_or_default()
    );

    dl.finishes(5_000_000, "the download from before the reload");
    // Each new connection's SYN meets the VIP's retiring rule; it goes all the same, with
    // its reply rule, once the download's answers have been idle for 2 s.
    let end = Duration::from_secs(15);
    wait_under_load("the retiring rules' end", end, client, &url, br, |flows| {
        !retiring_vip(flows) && table_1_idle(flows)
    });
    ctl.assert_no_openflow_errors();
}

/// A proactive service turned reactive and gapped (an OFF period's rule at the switch drops
/// its new connections) keeps the download in flight on it moving: the VIP's retiring
/// conntrack rule sits above the gap rule, so the download's segments pass conntrack to
/// their backend while new connections' SYNs, tracked, meet the gap. Below it, the gap
/// dropped the download's ACKs too: it stalled for the OFF period, its answers went idle,
/// its retiring rules with them, and it never moved again.
#[test]
fn ovs_a_gap_after_the_proactive_mode_spares_its_connections() {
    let Some(p) = setup("ovs_a_gap_after_the_proactive_mode_spares_its_connections") else {
        return;
    };
    let (t, ctl, cfg, _servers) = settled_pair(&p, "proactive-gap");
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");
    // 6 MB at 1 MB/s; curl gives up if it stalls for 2 s (an OFF period lasts 3).
    let dl = Download::start_unstalled(client, &format!("http://{VIP}/bytes/6000000"), 2);
    download_carrier(&t.hosts[1..]);
    // Reactive, with a static gap of 3 s as soon as new connections come faster than one
    // every 2 s: each admitted one puts a 3 s OFF rule on the switch.
    let gapped = "[service.overload]\nmode = \"static\"\ncapacity_rps = 0.5\n\
                  gaps_ms = \"0,3000\"\noff_rule_min_gap_ms = 1000\n\
                  [service.health]\n";
    let reactive =
        cfg.replace("mode = \"proactive\"\n", "")
            .replacen("[service.health]\n", gapped, 1);
    ctl.reload_with(&reactive);
    wait_until("the retiring VIP rule", Duration::from_secs(5), || {
        rules_at(&br.dump_flows().unwrap_or_default(), 251, VIP) > 0
    });

    // New connections at 4/s for 3 s, while the switch is watched for the gap's rule.
    let mut gap_seen = false;
    let tried = std::thread::scope(|s| {
        let tried = s.spawn(|| {
            load(
                client,
                &url,
                &[
                    "--rate",
                    "4",
                    "--requests",
                    "12",
                    "--timeout-ms",
                    "1000",
                    "--duration-secs",
                    "5",
                ],
            )
        });
        while !tried.is_finished() {
            gap_seen |= rules_at(&br.dump_flows().unwrap_or_default(), 250, VIP) > 0;
            std::thread::sleep(Duration::from_millis(50));
        }
        tried.join().expect("load")
    });
    assert!(tried["ok"].as_u64().unwrap_or(0) >= 1, "{tried}");
    assert!(
        gap_seen,
        "an OFF period's rule went to the switch: {tried}\n{}",
        ctl.log()
    );
    dl.finishes(
        6_000_000,
        "the download from before the reload, through the gap",
    );
    ctl.assert_no_openflow_errors();
}

/// A reload that turns a proactive service partitioned keeps the download in flight on it:
/// its VIP's conntrack rule retires above the partition rules (below them, the download's
/// packets went to a partition's owner with the VIP as their destination, which reset
/// it), while new connections pass conntrack uncommitted and go on by the partitions,
/// straight to the backends holding the VIP. The retiring rules live as long as the old connections'
/// answers: new connections keep meeting the VIP's rule, and it still goes once the
/// download is over.
#[test]
fn ovs_proactive_to_partitioned_keeps_live_connections() {
    let Some(p) = setup("ovs_proactive_to_partitioned_keeps_live_connections") else {
        return;
    };
    let (t, ctl, cfg, _servers) = settled_pair(&p, "proactive-to-partitioned");
    // Direct return, as the partitioned mode has it: the backends hold the VIP.
    for h in &t.hosts[1..] {
        h.add_loopback_vip(VIP.parse().expect("vip"))
            .expect("VIP on lo");
    }
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");
    let dl = Download::start(client, &format!("http://{VIP}/bytes/5000000"));
    download_carrier(&t.hosts[1..]);
    let partitioned = "mode = \"partitioned\"\npartition_bits = 2\n";
    ctl.reload_with(&cfg.replace("mode = \"proactive\"\n", partitioned));
    let at = |flows: &str, prio: u16| rules_at(flows, prio, VIP);
    let mut retiring_above = false;
    wait_until("the partition rules", Duration::from_secs(10), || {
        let flows = br.dump_flows().unwrap_or_default();
        retiring_above |= at(&flows, 241) == 1;
        at(&flows, 220) == 4
    });

    // New connections go by the partitions (after a first few through the controller
    // while the backends' partitions were placed).
    let after = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
    let flows = br.dump_flows().unwrap_or_default();
    assert_eq!(after["ok"], 20, "{after}\n{flows}\n{}", ctl.log());
    dl.finishes(5_000_000, "the download from before the reload");
    assert!(
        retiring_above,
        "the VIP's conntrack rule retired above the partitions"
    );

    // New connections keep arriving and meeting the VIP's retiring rule; it goes all the
    // same, with its reply rule, once the download's answers have been idle for 2 s (by
    // its own idle timeout, it would never go).
    let before = ctl.packet_ins();
    let end = Duration::from_secs(20);
    wait_under_load("the retiring rules' end", end, client, &url, br, |flows| {
        at(flows, 241) == 0 && table_1_idle(flows)
    });
    assert_eq!(
        ctl.packet_ins(),
        before,
        "partitioned: no new connection comes up"
    );
    let flows = br.dump_flows().unwrap_or_default();
    let carried = n_packets(&flows, |l| l.contains("priority=220,"));
    assert!(carried > 0, "the partition rules carried them: {flows}");
    ctl.assert_no_openflow_errors();
}

/// A retiring VIP rule whose reply rule ends while no controller is connected (so its end
/// is heard by none) goes when the switch connects to one again: the controller asks the
/// switch for its retiring rules and deletes a VIP rule that has lost its reply rule.
/// New connections kept it alive meanwhile (their SYNs pass it); left, it would send every
/// new connection's SYN through conntrack for good. Its pass for the invalid in table 1,
/// which has no timeout of its own, goes with it.
#[test]
fn ovs_a_retiring_vip_rule_whose_end_went_unheard_goes_at_reconnect() {
    let Some(p) = setup("ovs_a_retiring_vip_rule_whose_end_went_unheard_goes_at_reconnect") else {
        return;
    };
    let (t, mut ctl, cfg, _servers) = settled_pair(&p, "retiring-unheard");
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");
    let reactive = cfg.replace("mode = \"proactive\"\n", "");
    // Connections just before the reload, so that their reply rules (idle for 2 s, then
    // gone) are there to keep the VIP's rule retiring rather than removed at once.
    let just_before = load(client, &url, &["--requests", "4", "--concurrency", "1"]);
    assert_eq!(just_before["ok"], 4, "{just_before}");
    ctl.reload_with(&reactive);
    let retiring_vip = |flows: &str| rules_at(flows, 251, VIP) > 0;
    let in_table_1 = |flows: &str, side: &str| {
        flows
            .lines()
            .any(|l| l.contains(" table=1,") && l.contains(&format!("{side}={VIP},")))
    };
    let reply_rule = |flows: &str| in_table_1(flows, "nw_src");
    let pass = |flows: &str| in_table_1(flows, "nw_dst");
    wait_until("the retiring rules", Duration::from_secs(5), || {
        let flows = br.dump_flows().unwrap_or_default();
        retiring_vip(&flows) && reply_rule(&flows) && pass(&flows)
    });

    // No controller: new connections' SYNs keep the VIP's rule alive (and get no answer),
    // while its reply rule, which no packet passes, ends.
    ctl.kill();
    wait_until("the reply rule's end", Duration::from_secs(10), || {
        let _ = client.exec(&["curl", "-s", "-o", "/dev/null", "-m", "0.3", &url]);
        !reply_rule(&br.dump_flows().unwrap_or_default())
    });
    let flows = br.dump_flows().unwrap_or_default();
    assert!(
        retiring_vip(&flows),
        "new connections kept the VIP's retiring rule"
    );
    assert!(
        pass(&flows),
        "the VIP's pass for the invalid lives as long: {flows}"
    );

    ctl.respawn(&reactive);
    let end = Duration::from_secs(10);
    wait_under_load(
        "the retiring VIP rule's end",
        end,
        client,
        &url,
        br,
        |flows| !retiring_vip(flows) && !pass(flows),
    );
    ctl.assert_no_openflow_errors();
}

/// A backend removed while no controller was connected keeps its connections: the
/// controller started without it retires its rules when the switch reports them, where
/// the delete of the earlier run's generation at the end of the switch's grace took them.
#[test]
fn ovs_a_backend_removed_while_the_controller_was_down_keeps_its_connections() {
    let Some(p) =
        setup("ovs_a_backend_removed_while_the_controller_was_down_keeps_its_connections")
    else {
        return;
    };
    let (t, mut ctl, cfg, _servers) = settled_pair(&p, "removed-while-down");
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let dl = Download::start(client, &format!("http://{VIP}/bytes/8000000"));
    let busy = download_carrier(&t.hosts[1..]);
    let other = t.hosts[1..]
        .iter()
        .map(|h| h.ip().to_string())
        .find(|a| *a != busy)
        .expect("two backends");

    // The controller goes, and comes back without the download's backend.
    ctl.kill();
    let entry = format!("\n[[service.backend]]\naddress = \"{busy}\"\n");
    assert!(cfg.contains(&entry), "{cfg}");
    ctl.respawn(&cfg.replace(&entry, "\n"));
    br.wait_connected(Duration::from_secs(10))
        .expect("switch reconnects");
    let names_busy = |flows: &str| {
        flows
            .lines()
            .filter(|l| {
                l.contains(&format!("nw_src={busy},")) || l.contains(&format!("nw_dst={busy},"))
            })
            .count()
    };
    wait_until("its rules, retiring", Duration::from_secs(5), || {
        let flows = br.dump_flows().unwrap_or_default();
        flows
            .lines()
            .filter(|l| {
                l.contains(&format!("nw_dst={busy},")) || l.contains(&format!("nw_src={busy},"))
            })
            .all(|l| l.contains("idle_timeout=2"))
            && names_busy(&flows) > 0
    });

    dl.finishes(8_000_000, "the download on the removed backend");
    let after = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "20", "--concurrency", "2"],
    );
    assert_eq!(after["ok"], 20, "{after}");
    let name = format!("b{}", other.rsplit('.').next().unwrap_or_default());
    assert_eq!(after["per_backend"][&name], 20, "all to {name}: {after}");
    wait_until("its rules' end", Duration::from_secs(15), || {
        names_busy(&br.dump_flows().unwrap_or_default()) == 0
    });
    ctl.assert_no_openflow_errors();
}
