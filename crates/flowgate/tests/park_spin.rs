//! `[runtime] spin_before_park_us`: the worker polls the switches' sockets before it
//! sleeps, and a message that arrives during the poll is read without waking it.

mod support;

use std::io::Write;
use std::time::Duration;

use support::fake_switch::*;
use support::*;

const SERVICE: &str = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n";

/// Echo requests 1 ms apart, each answered before the next: under the 10 ms poll, each
/// arrives while the worker polls.
fn echo_round_trips(ctl: &Ctl, n: u32) {
    let mut s = handshake(ctl.openflow, 0x5917);
    for xid in 0..n {
        s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x1000 + xid))
            .expect("echo request");
        loop {
            let m = read_msg(&mut s).expect("read").expect("open");
            if m[1] == OFPT_ECHO_REPLY && xid_of(&m) == 0x1000 + xid {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_worker_polls_the_switch_sockets_before_it_sleeps() {
    let ctl = Ctl::start(
        "park-spin",
        &format!(
            "{LISTEN_ANY}[runtime]\nworker_threads = 1\nspin_before_park_us = 10000\n\n{SERVICE}"
        ),
    );
    echo_round_trips(&ctl, 50);
    let body = ctl.get("/metrics").1;
    let polls = |end: &str| {
        metric_labelled(
            &body,
            "flowgate_worker_park_polls_total",
            &format!("end=\"{end}\""),
        )
        .unwrap_or_else(|| panic!("no {end} polls in /metrics:\n{body}"))
    };
    // Most echoes arrive during a poll; a few may not (the worker had other work, or
    // the host stalled this test for 10 ms), so not all 50 are required.
    assert!(polls("readable") >= 10.0, "{body}");
    // The worker runs out of work after each echo's reply (the next comes 1 ms later), so
    // each of the 50 is followed by a poll, however it ends.
    assert!(polls("readable") + polls("spent") >= 50.0, "{body}");

    // The runtime is built once: a reload that changes the budget says it needs a restart.
    let cfg = ctl.dir.join("flowgate.toml");
    let text = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(
        &cfg,
        text.replace("spin_before_park_us = 10000", "spin_before_park_us = 50"),
    )
    .expect("write config");
    signal(ctl.pid(), "HUP");
    wait_until("the reload's report", Duration::from_secs(10), || {
        ctl.log().contains("SIGHUP: config reloaded")
    });
    let log = strip_ansi(&ctl.log());
    let line = log
        .lines()
        .find(|l| l.contains("SIGHUP: config reloaded"))
        .unwrap_or_default();
    assert!(
        line.contains("runtime.spin_before_park_us"),
        "a restart is needed: {line}"
    );
}

#[test]
fn without_the_option_the_worker_sleeps_at_once() {
    let ctl = Ctl::start("park-spin-off", &format!("{LISTEN_ANY}{SERVICE}"));
    echo_round_trips(&ctl, 3);
    let body = ctl.get("/metrics").1;
    assert!(
        !body.contains("flowgate_worker_park_polls_total"),
        "no poller, no counts:\n{body}"
    );
}
