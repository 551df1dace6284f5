//! A switch's session as the bytes come: the session reads the messages of a batch where
//! they lie in its buffer and drops them from it once the core has handled them, so each
//! must be handled once, in order, and a message cut between two reads when its rest comes.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::fake_switch::*;
use support::*;

const SERVICE: &str = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n";

/// The xids of the next `n` ECHO_REPLYs, in the order they come (other messages, the
/// answers to the PACKET_INs among them, are read and passed over).
fn echo_replies(s: &mut TcpStream, n: usize) -> Vec<u32> {
    let mut xids = Vec::new();
    while xids.len() < n {
        let m = read_msg(s)
            .expect("read (5 s timeout)")
            .expect("the session is open");
        if m[1] == OFPT_ECHO_REPLY {
            xids.push(xid_of(&m));
        }
    }
    xids
}

#[test]
fn the_messages_of_one_write_are_handled_once_each_in_order() {
    let ctl = Ctl::start("session-batch", &format!("{LISTEN_ANY}{SERVICE}"));
    let mut s = handshake(ctl.openflow, 0x5e55);
    let before = ctl.packet_ins();
    let decided = || {
        let (_, body) = ctl.get("/metrics");
        metric(&body, "flowgate_decision_latency_seconds_count").expect("the histogram's count")
            as u64
    };
    let decided_before = decided();

    // One write: three echo requests, each followed by a PACKET_IN, then the first 30
    // bytes of a fourth PACKET_IN.
    let mut chunk = Vec::new();
    for i in 0..3u16 {
        chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x2000 + u32::from(i)));
        chunk.extend_from_slice(&packet_in_syn(0x3000 + u32::from(i), 41_000 + i));
    }
    let last = packet_in_syn(0x3003, 41_003);
    let (head, rest) = last.split_at(30);
    chunk.extend_from_slice(head);
    s.write_all(&chunk).expect("write the batch");
    assert_eq!(echo_replies(&mut s, 3), [0x2000, 0x2001, 0x2002]);
    wait_until("the three whole PACKET_INs", Duration::from_secs(5), || {
        ctl.packet_ins() == before + 3
    });

    // The cut PACKET_IN's rest, and an echo behind it: both handled, nothing twice.
    let mut chunk = rest.to_vec();
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x2003));
    s.write_all(&chunk).expect("write the rest");
    assert_eq!(echo_replies(&mut s, 1), [0x2003]);
    wait_until("the fourth PACKET_IN", Duration::from_secs(5), || {
        ctl.packet_ins() == before + 4
    });
    // A later read of the session finds nothing of them left in its buffer.
    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x2004))
        .expect("write an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x2004]);
    assert_eq!(ctl.packet_ins(), before + 4, "a PACKET_IN handled twice");
    // Each decision's time reached the histogram (counted per batch, added at its end).
    assert_eq!(decided(), decided_before + 4);
}

// OpenFlow 1.3 message types (§7.1) the fake switch answers here.
const OFPT_ROLE_REQUEST: u8 = 24;
const OFPT_ROLE_REPLY: u8 = 25;

/// Reads until a ROLE_REQUEST, answers it with the role it asks for (§6.3.6), and returns
/// that role.
fn answer_role_request(s: &mut TcpStream) -> u32 {
    loop {
        let m = read_msg(s)
            .expect("read (5 s timeout)")
            .expect("the session is open");
        if m[1] == OFPT_ROLE_REQUEST {
            let mut reply = m.clone();
            reply[1] = OFPT_ROLE_REPLY;
            s.write_all(&reply).expect("role reply");
            return u32::from_be_bytes([m[8], m[9], m[10], m[11]]);
        }
    }
}

/// Whether the controller closes `s` (EOF or reset) within `timeout`; reads and
/// discards what comes meanwhile.
fn closed_within(s: &mut TcpStream, timeout: Duration) -> bool {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    s.set_read_timeout(Some(Duration::from_millis(100))).ok();
    while start.elapsed() < timeout {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A switch that connects again while its old connection still looks open (half-open:
/// the controller has not seen it die): the new session is the switch's, the old one is
/// closed by the controller, and the old one's end leaves the new one's state alone. In
/// a cluster that state is the switch's role: had the old session's end wiped it, the
/// new session's PACKET_INs would be dropped as a standby's.
#[test]
fn a_switch_that_connects_again_keeps_its_new_session() {
    const DPID: u64 = 0x5e56;
    let cluster = format!(
        "[cluster]\nrole = \"domain\"\nname = \"session\"\ninstance = \"d1a\"\ndomain = \"d1\"\ndpids = [\"{DPID:016x}\"]\netcd = [\"memory:\"]\n"
    );
    let ctl = Ctl::start("session-again", &format!("{LISTEN_ANY}{SERVICE}{cluster}"));
    wait_until("mastership", Duration::from_secs(10), || {
        ctl.get_json("/api/v1/cluster")["mastership"] == "master"
    });
    let role =
        || ctl.get_json("/api/v1/cluster")["switches"][format!("{DPID:016x}")]["role"].clone();
    const MASTER: u32 = 2;

    let mut old = handshake(ctl.openflow, DPID);
    let old_port = old.local_addr().expect("addr").port();
    assert_eq!(answer_role_request(&mut old), MASTER);
    wait_until("the old session is master", Duration::from_secs(5), || {
        role() == "master"
    });

    let mut new = handshake(ctl.openflow, DPID);
    assert_eq!(answer_role_request(&mut new), MASTER);
    let old_closed = closed_within(&mut old, Duration::from_secs(3));
    // The old connection ends (if the controller has not ended it): its session's end
    // must leave the new one's role.
    drop(old);
    wait_until("the old session's end", Duration::from_secs(5), || {
        ctl.log_plain()
            .contains(&format!("peer=127.0.0.1:{old_port}"))
            && ctl.log_plain().matches("switch disconnected").count() == 1
    });
    wait_until("the new session is master", Duration::from_secs(5), || {
        role() == "master"
    });

    let before = ctl.packet_ins();
    new.write_all(&packet_in_syn(0x4000, 42_000))
        .expect("a SYN");
    new.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x4001))
        .expect("an echo");
    assert_eq!(echo_replies(&mut new, 1), [0x4001]);
    wait_until(
        "the new session's PACKET_IN reaches the core",
        Duration::from_secs(5),
        || ctl.packet_ins() == before + 1,
    );
    assert!(old_closed, "the controller left the replaced session open");
    assert_eq!(
        ctl.log_plain().matches("switch disconnected").count(),
        1,
        "only the old session ended"
    );
}

/// A peer that sends HELLO, then large ECHO_REQUESTs, and never reads: the controller's
/// replies fill the connection and its writes wait. The handshake's deadline (10 s)
/// covers those writes as well as the reads, and ends the session.
#[test]
fn a_peer_that_never_reads_is_closed_at_the_handshake_deadline() {
    let ctl = Ctl::start(
        "session-unread-handshake",
        &format!("{LISTEN_ANY}{SERVICE}"),
    );
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    // Small before the connection, so that the window it offers stays small.
    sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    sock.connect(&ctl.openflow.into()).expect("connect");
    let mut s: TcpStream = sock.into();
    let port = s.local_addr().expect("addr").port();
    let start = Instant::now();
    s.set_write_timeout(Some(Duration::from_millis(500))).ok();
    s.write_all(&header(4, OFPT_HELLO, 8, 1)).expect("hello");
    let mut echo = header(4, OFPT_ECHO_REQUEST, 60_008, 2);
    echo.resize(60_008, 0);
    // Until the controller stops reading (our write times out): it waits on its own.
    for _ in 0..400 {
        if s.write_all(&echo).is_err() {
            break;
        }
    }
    ctl.wait_log(
        &format!(
            "switch session ended peer=127.0.0.1:{port} error=timed out waiting for the handshake"
        ),
        Duration::from_secs(20),
    );
    assert!(
        start.elapsed() >= Duration::from_secs(9),
        "ended after {:?}, before its deadline",
        start.elapsed()
    );
}

/// Connections that never finish a handshake hold at most `MAX_HANDSHAKES` places: one
/// more is closed at once, and once they are gone a switch connects as ever.
#[test]
fn connections_beyond_the_handshake_cap_are_closed_at_once() {
    use flowgate::runtime::MAX_HANDSHAKES;
    let ctl = Ctl::start("session-handshake-cap", &format!("{LISTEN_ANY}{SERVICE}"));
    // Silent: each waits in its handshake (for the controller's 10 s deadline).
    let mut silent: Vec<TcpStream> = (0..MAX_HANDSHAKES)
        .map(|_| TcpStream::connect(ctl.openflow).expect("connect"))
        .collect();
    let mut over = TcpStream::connect(ctl.openflow).expect("connect");
    let start = Instant::now();
    assert!(
        closed_within(&mut over, Duration::from_secs(3)),
        "the connection over the cap is still open"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    ctl.wait_log(
        &format!("{MAX_HANDSHAKES} connections in their handshake: closing new ones"),
        Duration::from_secs(2),
    );
    // Each silent one is still in its handshake: it is given the controller's HELLO.
    for s in silent.iter_mut().take(3) {
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let hello = read_msg(s).expect("read").expect("open");
        assert_eq!(hello[1], OFPT_HELLO);
    }
    drop(silent);
    wait_until("the silent ones' ends", Duration::from_secs(5), || {
        ctl.log_plain().matches("switch session ended").count() == MAX_HANDSHAKES
    });
    let mut s = handshake(ctl.openflow, 0x5e57);
    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x7000))
        .expect("an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x7000]);
}
