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
pub const OFPT_PACKET_OUT: u8 = 13;

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

/// The MAC the controller gives the first service's VIP unless configured (`virtual_mac`).
pub const VIP_MAC: [u8; 6] = [0x02, 0x66, 0x67, 0x00, 0x00, 0x01];

fn csum(data: &[u8]) -> u16 {
    let mut s: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// A TCP SYN from 10.0.0.77:`sport` to the VIP, as a PACKET_IN from port 1 (§7.4.1).
pub fn packet_in_syn(xid: u32, sport: u16) -> Vec<u8> {
    let src = [10, 0, 0, 77];
    let dst = [10, 0, 0, 100];
    let mut tcp = Vec::with_capacity(20);
    tcp.extend_from_slice(&sport.to_be_bytes());
    tcp.extend_from_slice(&80u16.to_be_bytes());
    tcp.extend_from_slice(&u32::from(sport).wrapping_mul(7919).to_be_bytes()); // seq
    tcp.extend_from_slice(&0u32.to_be_bytes()); // ack
    tcp.extend_from_slice(&[0x50, 0x02]); // data offset 5, SYN
    tcp.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]); // window, checksum, urgent
    let mut pseudo = Vec::with_capacity(32);
    pseudo.extend_from_slice(&src);
    pseudo.extend_from_slice(&dst);
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    pseudo.extend_from_slice(&tcp);
    let c = csum(&pseudo).to_be_bytes();
    tcp[16] = c[0];
    tcp[17] = c[1];
    let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = csum(&ip).to_be_bytes();
    ip[10] = c[0];
    ip[11] = c[1];
    let mut frame = Vec::with_capacity(54);
    frame.extend_from_slice(&VIP_MAC);
    frame.extend_from_slice(&[0x02, 0, 0, 0, 0xbe, 0xef]);
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(&ip);
    frame.extend_from_slice(&tcp);

    packet_in(xid, 1, &frame)
}

/// `frame` as a table-miss PACKET_IN from `in_port`, unbuffered (§7.4.1).
pub fn packet_in(xid: u32, in_port: u32, frame: &[u8]) -> Vec<u8> {
    let len = 8 + 16 + 16 + 2 + frame.len();
    let mut v = header(4, OFPT_PACKET_IN, len as u16, xid);
    v.extend_from_slice(&0xffff_ffffu32.to_be_bytes()); // buffer_id: NO_BUFFER
    v.extend_from_slice(&(frame.len() as u16).to_be_bytes()); // total_len
    v.extend_from_slice(&[0, 0]); // reason NO_MATCH, table 0
    v.extend_from_slice(&u64::MAX.to_be_bytes()); // cookie
    // ofp_match: OXM, length 12 (in_port), padded to 16.
    v.extend_from_slice(&[0, 1, 0, 12, 0x80, 0x00, 0x00, 0x04]);
    v.extend_from_slice(&in_port.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0, 0]);
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(frame);
    assert_eq!(v.len(), len);
    v
}

/// A gratuitous ARP request of `ip` at `mac`, as a PACKET_IN from `in_port`: how the
/// controller learns where a host is.
pub fn packet_in_garp(xid: u32, in_port: u32, mac: [u8; 6], ip: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06]);
    f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]); // Ethernet, IPv4, request
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&ip);
    packet_in(xid, in_port, &f)
}
