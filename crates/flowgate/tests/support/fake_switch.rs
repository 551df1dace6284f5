//! A switch played by hand over TCP, for the tests of what the controller does with
//! the bytes it is sent: OpenFlow 1.3 headers, the handshake, whole messages read back.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

// OpenFlow 1.3 message types (§7.1).
pub const OFPT_HELLO: u8 = 0;
pub const OFPT_ERROR: u8 = 1;
pub const OFPT_ECHO_REQUEST: u8 = 2;
pub const OFPT_ECHO_REPLY: u8 = 3;
pub const OFPT_FEATURES_REQUEST: u8 = 5;
pub const OFPT_FEATURES_REPLY: u8 = 6;
pub const OFPT_PACKET_IN: u8 = 10;
pub const OFPT_FLOW_REMOVED: u8 = 11;
pub const OFPT_PORT_STATUS: u8 = 12;

pub fn header(version: u8, ty: u8, len: u16, xid: u32) -> Vec<u8> {
    let mut v = vec![version, ty];
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(&xid.to_be_bytes());
    v
}

pub fn features_reply(xid: u32, dpid: u64) -> Vec<u8> {
    let mut v = header(4, OFPT_FEATURES_REPLY, 32, xid);
    v.extend_from_slice(&dpid.to_be_bytes());
    v.extend_from_slice(&256u32.to_be_bytes()); // n_buffers
    v.extend_from_slice(&[254, 0, 0, 0]); // n_tables, auxiliary_id, pad
    v.extend_from_slice(&0x4fu32.to_be_bytes()); // capabilities
    v.extend_from_slice(&0u32.to_be_bytes()); // reserved
    v
}

/// Reads one whole OpenFlow message: `Ok(None)` at EOF.
pub fn read_msg(s: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut h = [0u8; 8];
    match s.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = usize::from(u16::from_be_bytes([h[2], h[3]])).max(8);
    let mut m = h.to_vec();
    m.resize(len, 0);
    s.read_exact(&mut m[8..])?;
    Ok(Some(m))
}

pub fn xid_of(m: &[u8]) -> u32 {
    u32::from_be_bytes([m[4], m[5], m[6], m[7]])
}

/// A fake switch: HELLO, then answers FEATURES_REQUEST with `dpid`.
pub fn handshake(addr: SocketAddr, dpid: u64) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    s.write_all(&header(4, OFPT_HELLO, 8, 1)).expect("hello");
    loop {
        let m = read_msg(&mut s)
            .expect("read")
            .expect("controller closed during the handshake");
        match m[1] {
            OFPT_FEATURES_REQUEST => {
                s.write_all(&features_reply(xid_of(&m), dpid))
                    .expect("features reply");
                return s;
            }
            OFPT_ECHO_REQUEST => {
                let mut r = m.clone();
                r[1] = OFPT_ECHO_REPLY;
                s.write_all(&r).expect("echo reply");
            }
            _ => {}
        }
    }
}
