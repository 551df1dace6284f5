//! Hostile peers on the OpenFlow port: garbage, a stalled message, a wrong version,
//! malformed messages (answered with OFPT_ERROR), a PACKET_IN flood and a switch that never
//! reads. Each may end only its own session; the real switch stays connected and the VIP
//! keeps serving.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flowgate_testbed::topo::{self, TopoOptions};
use support::fake_switch::*;
use support::*;

const VIP: &str = "10.0.0.100";
const FLOOD: usize = 300_000;
const RATE: f64 = 20_000.0;

/// Reads and discards until the controller closes the connection (EOF or reset); returns
/// how long that took, or `None` if it is still open at `timeout`.
fn wait_closed(s: &mut TcpStream, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < timeout {
        s.set_read_timeout(Some(Duration::from_millis(200))).ok();
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

/// A fake switch `dpid` sends a real SYN PACKET_IN and then a message of type `ty` whose
/// body is 4 bytes. §7.4.4: the controller answers it with OFPT_ERROR (OFPET_BAD_REQUEST /
/// OFPBRC_BAD_LEN, the message's xid, its bytes as data) and its session goes on: an
/// ECHO_REQUEST sent after it is answered. The fake switch then hangs up, and only then is
/// it gone (the caller checks that the controller is healthy).
fn malformed_after_a_syn(ctl: &mut Ctl, dpid: u64, ty: u8, what: &str) {
    let mut bad = handshake(ctl.openflow, dpid);
    let bad_port = bad.local_addr().expect("addr").port();
    wait_until(
        &format!("{dpid:#x} registered"),
        Duration::from_secs(5),
        || switch_count(ctl) == 2,
    );
    let before = undecodable_count(ctl);
    let mut chunk = packet_in_syn(7, 40_000 + (dpid & 0xff) as u16);
    chunk.extend_from_slice(&header(4, ty, 12, 8));
    chunk.extend_from_slice(&[0, 0, 0, 1]);
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 9));
    bad.write_all(&chunk).expect("send the malformed message");
    bad.set_read_timeout(Some(Duration::from_millis(200))).ok();
    let (mut error, mut echoed) = (None, false);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(error.is_some() && echoed) && Instant::now() < deadline {
        match read_msg(&mut bad) {
            Ok(Some(m)) if m[1] == OFPT_ERROR && xid_of(&m) == 8 => error = Some(m),
            Ok(Some(m)) if m[1] == OFPT_ECHO_REPLY && xid_of(&m) == 9 => echoed = true,
            Ok(Some(m)) if m[1] == OFPT_ECHO_REQUEST => {
                let mut reply = m.clone();
                reply[1] = OFPT_ECHO_REPLY;
                bad.write_all(&reply).expect("answer the controller's echo");
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!(
                "{what}: the controller closed the session:\n{}",
                ctl.log_plain()
            ),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("{what}: reading the session: {e}"),
        }
    }
    let error = error.unwrap_or_else(|| panic!("{what}: no OFPT_ERROR for the message in 5 s"));
    // ofp_error_msg: type OFPET_BAD_REQUEST (1), code OFPBRC_BAD_LEN (6), then the
    // offending message, all 12 bytes of it (fewer than 64).
    assert_eq!(
        &error[8..12],
        &[0, 1, 0, 6],
        "{what}: BAD_REQUEST / BAD_LEN: {error:02x?}"
    );
    assert_eq!(
        &error[12..],
        &chunk[chunk.len() - 20..chunk.len() - 8],
        "{what}: the data"
    );
    assert!(
        echoed,
        "{what}: the echo sent after the bad message was not answered"
    );
    assert_eq!(undecodable_count(ctl), before + 1, "{what}: counted once");
    assert_eq!(switch_count(ctl), 2, "{what}: the session was dropped");
    drop(bad);
    ctl.wait_log(
        &format!("switch disconnected peer=127.0.0.1:{bad_port}"),
        Duration::from_secs(3),
    );
    wait_until(&format!("{dpid:#x} gone"), Duration::from_secs(5), || {
        switch_count(ctl) == 1
    });
}

fn undecodable_count(ctl: &Ctl) -> u64 {
    metric(
        &ctl.get("/metrics").1,
        "flowgate_openflow_undecodable_total",
    )
    .unwrap_or(0.0) as u64
}

fn switch_count(ctl: &Ctl) -> u64 {
    metric(&ctl.get("/metrics").1, "flowgate_switches").unwrap_or(0.0) as u64
}

#[test]
fn ovs_hostile_switch_peers() {
    let Some(p) = setup("ovs_hostile_switch_peers") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let cfg = vip_config_openflow(
        VIP,
        "round-robin",
        &backends,
        "echo_interval_ms = 300\necho_timeout_ms = 900\npacket_in_rate = 20000\n",
    );
    let mut ctl = Ctl::start("hostile", &cfg);
    ctl.control(&t.bridges[..1]);
    let bridge = &t.bridges[0];
    let _servers: Vec<_> = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{}", i + 2), &[]))
        .collect();
    ctl.wait_backends_ready(Duration::from_secs(15));
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");

    // The real switch, its session and the VIP are unaffected.
    let healthy = |ctl: &mut Ctl, what: &str| {
        assert!(
            ctl.alive(),
            "controller died after {what}:\n{}",
            ctl.log_plain()
        );
        assert!(
            ctl.lists_switch(bridge),
            "real switch disconnected after {what}"
        );
        let r = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
        assert_eq!(r["ok"], 20, "HTTP through the VIP after {what}: {r}");
        let real = ctl
            .log_plain()
            .matches("dpid=0000000000000001 n_tables")
            .count();
        assert_eq!(
            real,
            1,
            "the real switch's session was never re-established after {what}:\n{}",
            ctl.log_plain()
        );
    };
    healthy(&mut ctl, "start-up");

    // (a) Garbage: an HTTP request on the OpenFlow port. Its "header" announces 21,536
    // bytes; the controller must not wait for them.
    let mut g = TcpStream::connect(ctl.openflow).expect("connect");
    let g_port = g.local_addr().expect("addr").port();
    g.write_all(b"GET / HTTP/1.1\r\nHost: flowgate\r\n\r\n")
        .expect("send garbage");
    let took = wait_closed(&mut g, Duration::from_secs(5));
    assert!(
        took.is_some(),
        "(a) the garbage session is still open after 5 s"
    );
    ctl.wait_log(
        &format!("switch session ended peer=127.0.0.1:{g_port}"),
        Duration::from_secs(3),
    );
    healthy(&mut ctl, "(a) garbage");

    // (b) A good handshake, then a header announcing 65,535 bytes that never come: the
    // keep-alive (echo every 300 ms, dead after 900 ms more) ends it.
    let mut s = handshake(ctl.openflow, 0xdead);
    let s_port = s.local_addr().expect("addr").port();
    wait_until("0xdead registered", Duration::from_secs(5), || {
        switch_count(&ctl) == 2
    });
    s.write_all(&[4, OFPT_PACKET_IN, 0xff, 0xff, 0, 0, 0, 9, 0, 0, 0, 0])
        .expect("partial");
    let took = wait_closed(&mut s, Duration::from_secs(6))
        .expect("(b) the stalled session is still open after 6 s");
    assert!(
        took >= Duration::from_millis(900),
        "(b) closed after {took:?}: before the echo timeout could have run out"
    );
    ctl.wait_log(
        &format!(
            "switch session ended peer=127.0.0.1:{s_port} error=timed out waiting for an echo reply"
        ),
        Duration::from_secs(3),
    );
    ctl.wait_log("dpid=000000000000dead n_tables", Duration::from_secs(1));
    wait_until("0xdead gone", Duration::from_secs(5), || {
        switch_count(&ctl) == 1
    });
    healthy(&mut ctl, "(b) stalled message");

    // (c) OpenFlow 1.0 HELLO without a version bitmap: HELLO_FAILED / INCOMPATIBLE, closed.
    let mut v1 = TcpStream::connect(ctl.openflow).expect("connect");
    v1.set_read_timeout(Some(Duration::from_secs(5))).ok();
    v1.write_all(&header(1, OFPT_HELLO, 8, 0x0102_0304))
        .expect("send v1 hello");
    let mut error = None;
    while let Ok(Some(m)) = read_msg(&mut v1) {
        if m[1] == OFPT_ERROR {
            error = Some(m);
            break;
        }
        assert_eq!(
            m[1], OFPT_HELLO,
            "(c) only HELLO before the ERROR: {m:02x?}"
        );
    }
    let error = error.expect("(c) an ERROR for the 1.0 HELLO");
    assert!(error.len() >= 12, "(c) ERROR too short: {error:02x?}");
    assert_eq!(
        &error[8..12],
        &[0, 0, 0, 0],
        "(c) OFPET_HELLO_FAILED / OFPHFC_INCOMPATIBLE: {error:02x?}"
    );
    assert_eq!(
        xid_of(&error),
        0x0102_0304,
        "(c) the ERROR answers the HELLO's xid"
    );
    assert!(
        wait_closed(&mut v1, Duration::from_secs(5)).is_some(),
        "(c) closed after the ERROR"
    );
    healthy(&mut ctl, "(c) version 1.0");

    // (c2) A good handshake, then a whole PACKET_IN that is malformed: after a real one,
    // one whose body is 4 bytes (§7.4.1 needs 32 before the match). The session decodes
    // PACKET_INs while the core handles its batch; this one is answered from there.
    malformed_after_a_syn(&mut ctl, 0xbad, OFPT_PACKET_IN, "(c2) malformed PACKET_IN");
    healthy(&mut ctl, "(c2) malformed PACKET_IN");
    // (c3) The same with a FLOW_REMOVED, which the session reads from the frame before
    // the batch reaches the core (§7.4.2 needs 40 bytes before the match).
    malformed_after_a_syn(
        &mut ctl,
        0xbad2,
        OFPT_FLOW_REMOVED,
        "(c3) malformed FLOW_REMOVED",
    );
    healthy(&mut ctl, "(c3) malformed FLOW_REMOVED");
    // (c4) The same with a rarer message, decoded whole as it is read (§7.4.3: a
    // PORT_STATUS needs 56 bytes).
    malformed_after_a_syn(
        &mut ctl,
        0xbad3,
        OFPT_PORT_STATUS,
        "(c4) malformed PORT_STATUS",
    );
    healthy(&mut ctl, "(c4) malformed PORT_STATUS");

    // (d) A flood of PACKET_INs (SYNs to the VIP) from a fake switch, with the real client
    // loading the VIP meanwhile.
    // The session's bucket starts full: its budget runs from the handshake.
    let session_start = Instant::now();
    let f = handshake(ctl.openflow, 0xbeef);
    wait_until("0xbeef registered", Duration::from_secs(5), || {
        switch_count(&ctl) == 2
    });
    let writer = Arc::new(Mutex::new(f.try_clone().expect("clone")));
    let done = Arc::new(AtomicBool::new(false));
    // Drain what the controller sends, and answer its echoes.
    let drainer = {
        let mut r = f.try_clone().expect("clone");
        let writer = writer.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            r.set_read_timeout(Some(Duration::from_millis(200))).ok();
            let mut n = 0u64;
            let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
            let mut tmp = vec![0u8; 64 * 1024];
            while !done.load(Ordering::Relaxed) {
                match r.read(&mut tmp) {
                    Ok(0) => break,
                    Ok(k) => buf.extend_from_slice(&tmp[..k]),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        continue;
                    }
                    Err(_) => break,
                }
                let mut at = 0;
                while buf.len() - at >= 8 {
                    let len = usize::from(u16::from_be_bytes([buf[at + 2], buf[at + 3]])).max(8);
                    if buf.len() - at < len {
                        break;
                    }
                    n += 1;
                    if buf[at + 1] == OFPT_ECHO_REQUEST {
                        let mut reply = buf[at..at + len].to_vec();
                        reply[1] = OFPT_ECHO_REPLY;
                        let _ = writer.lock().map(|mut w| w.write_all(&reply));
                    }
                    at += len;
                }
                buf.drain(..at);
            }
            n
        })
    };
    let chunk_msgs = 1000;
    let flood_start = Instant::now();
    let (report, flood_secs) = std::thread::scope(|sc| {
        let flood = sc.spawn(|| {
            let mut xid = 0x10_0000u32;
            for c in 0..FLOOD / chunk_msgs {
                let mut chunk = Vec::with_capacity(chunk_msgs * 100);
                for i in 0..chunk_msgs {
                    xid += 1;
                    let sport = 1024 + ((c * chunk_msgs + i) % 60_000) as u16;
                    chunk.extend_from_slice(&packet_in_syn(xid, sport));
                }
                writer
                    .lock()
                    .expect("writer")
                    .write_all(&chunk)
                    .expect("flood write");
            }
            flood_start.elapsed().as_secs_f64()
        });
        std::thread::sleep(Duration::from_millis(100));
        let report = load(client, &url, &["--requests", "200", "--concurrency", "2"]);
        (report, flood.join().expect("flood thread"))
    });
    eprintln!("flood of {FLOOD} PACKET_INs written in {flood_secs:.2} s");
    assert_eq!(
        report["ok"], 200,
        "(d) every request through the VIP during the flood: {report}"
    );

    // Every PACKET_IN was either handled (within the budget) or dropped and counted.
    let mut handled = 0.0;
    let mut dropped = 0.0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let body = ctl.get("/metrics").1;
        handled = metric_labelled(
            &body,
            "flowgate_switch_packet_in_total",
            "dpid=\"000000000000beef\"",
        )
        .unwrap_or(0.0);
        dropped =
            metric(&body, "flowgate_packet_in_dropped_total").expect("dropped PACKET_IN metric");
        if handled + dropped >= FLOOD as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let read_secs = session_start.elapsed().as_secs_f64();
    eprintln!("handled {handled}, dropped {dropped} (read within {read_secs:.2} s)");
    assert_eq!(
        handled + dropped,
        FLOOD as f64,
        "(d) every PACKET_IN handled or counted as dropped"
    );
    // A bucket of one second's worth, refilled at the rate, over the time the reading took.
    let budget = RATE * (read_secs + 1.0) * 1.02 + 100.0;
    assert!(
        handled <= budget,
        "(d) handled {handled} PACKET_INs, over the budget {budget:.0} for {read_secs:.2} s"
    );
    assert!(
        dropped > 0.0,
        "(d) the flood was throttled (nothing dropped)"
    );
    ctl.wait_log(
        "PACKET_IN flood: dropping beyond the session budget",
        Duration::from_secs(1),
    );

    done.store(true, Ordering::Relaxed);
    let _ = f.shutdown(Shutdown::Both);
    let received = drainer.join().expect("drainer");
    eprintln!("the fake switch received {received} messages");
    wait_until("0xbeef gone", Duration::from_secs(5), || {
        switch_count(&ctl) == 1
    });
    healthy(&mut ctl, "(d) PACKET_IN flood");

    // (e) A fake switch that sends PACKET_INs and never reads the answers. Once its queue
    // for that switch is full the controller reads on but drops its PACKET_INs (rather than
    // queueing answers without bound), and closes the session once the switch has taken
    // nothing for the keep-alive's interval and timeout together.
    let mut mute = handshake(ctl.openflow, 0xfeed);
    let mute_port = mute.local_addr().expect("addr").port();
    // A fixed, small receive buffer (no autotuning to megabytes): what the controller
    // queues is then bounded by its own threshold, which is what this case measures.
    let _ = socket2::SockRef::from(&mute).set_recv_buffer_size(64 * 1024);
    wait_until("0xfeed registered", Duration::from_secs(5), || {
        switch_count(&ctl) == 2
    });
    // Handled PACKET_INs, all switches (the per-switch count goes with the session); the
    // real switch is idle during this case.
    let handled_before = metric(&ctl.get("/metrics").1, "flowgate_packet_in_total").unwrap_or(0.0);
    mute.set_write_timeout(Some(Duration::from_millis(200)))
        .ok();
    let mute_start = Instant::now();
    let mut xid = 0x20_0000u32;
    let mut written = 0usize;
    // Writes until the controller closes the session (or stops reading: a write times out).
    'flood: while mute_start.elapsed() < Duration::from_secs(20) {
        let mut chunk = Vec::with_capacity(100 * 100);
        for i in 0..100 {
            xid += 1;
            chunk.extend_from_slice(&packet_in_syn(xid, 1024 + ((written + i) % 60_000) as u16));
        }
        let mut at = 0;
        while at < chunk.len() {
            match mute.write(&chunk[at..]) {
                Ok(0) => break 'flood,
                Ok(k) => at += k,
                // The controller stopped reading: has it closed the session yet? (The log
                // is read only then, not after every write.)
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if ctl
                        .log_plain()
                        .contains(&format!("peer=127.0.0.1:{mute_port} error="))
                    {
                        break 'flood;
                    }
                }
                Err(_) => break 'flood,
            }
        }
        written += 100;
    }
    let ended = format!(
        "switch session ended peer=127.0.0.1:{mute_port} error=the switch stopped reading its messages: "
    );
    ctl.wait_log(&ended, Duration::from_secs(10));
    let closed_after = mute_start.elapsed();
    ctl.wait_log(
        "dropping its PACKET_INs until it catches up",
        Duration::from_secs(1),
    );
    wait_until("0xfeed gone", Duration::from_secs(5), || {
        switch_count(&ctl) == 1
    });
    let log = ctl.log_plain();
    let queued: usize = log
        .split(&ended)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("(e) no queued byte count in the close:\n{log}"));
    let handled =
        metric(&ctl.get("/metrics").1, "flowgate_packet_in_total").unwrap_or(0.0) - handled_before;
    eprintln!(
        "(e) the mute switch wrote {written} PACKET_INs; {handled} handled; closed after {closed_after:?} with {queued} bytes queued"
    );
    assert!(
        handled > 1000.0,
        "(e) the mute switch's PACKET_INs were read: {handled}"
    );
    // What waits for it is the threshold (4 MiB) and at most one batch of 256 SYNs'
    // answers beyond it (under 1 KiB each), not the 32 MiB at which a session that handled
    // them regardless would be cut.
    assert!(
        queued > 1 << 20 && queued <= (4 << 20) + 256 * 1024,
        "(e) {queued} bytes queued for a switch that reads nothing"
    );
    // Behind, then 1.2 s (echo 300 ms + 900 ms) without progress before the close.
    assert!(
        closed_after >= Duration::from_millis(1200),
        "(e) closed after {closed_after:?}: before the switch could have shown it reads nothing"
    );
    let _ = mute.shutdown(Shutdown::Both);
    healthy(&mut ctl, "(e) a switch that reads nothing");
    ctl.assert_no_openflow_errors();
}
