//! A switch's session as the bytes come: the session reads the messages of a batch where
//! they lie in its buffer and drops them from it once the core has handled them, so each
//! must be handled once, in order, and a message cut between two reads when its rest comes.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

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
