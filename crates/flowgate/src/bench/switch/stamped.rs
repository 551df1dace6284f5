//! Reads that say when their bytes reached this host: the kernel's software receive
//! timestamp (`SO_TIMESTAMPING` with `SOF_TIMESTAMPING_RX_SOFTWARE`).
//!
//! Why: one bench thread runs all the emulated switches, and it checks every answer it
//! reads. When several switches' answers arrive together (after any pause of the
//! controller), the last switch it gets to waits for the checks of all the others, and a
//! latency taken when the bench reads counts that wait as the controller's. The kernel
//! stamps a segment as it enters the receive path (for loopback, in the controller's
//! `write`), so a latency up to that stamp is the controller's and the network's alone,
//! as a latency counted from the probe's send already leaves out the bench's lateness
//! in sending it.
//!
//! TCP reports the stamp of the last segment a read took (`tcp_recv_timestamp`), so the
//! answers of an earlier segment in the same read get a later arrival than theirs: the
//! error is on the slow side.
//!
//! When no socket on the host has asked for stamps, the first to ask turns them on in
//! deferred work (`net_enable_timestamp` schedules `netstamp_work`), so segments that
//! arrive in the next moments may carry none. The bench's measured loops start after a
//! warm-up, and a run in which any of their reads came unstamped is reported as such.

use std::io;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, TimestampingFlag, recvmsg, setsockopt, sockopt,
};

/// Ask the kernel to stamp what `socket` receives, in software.
pub(super) fn enable(socket: &impl AsFd) -> io::Result<()> {
    let flags = TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE
        | TimestampingFlag::SOF_TIMESTAMPING_RX_SOFTWARE;
    setsockopt(socket, sockopt::Timestamping, &flags).map_err(io::Error::from)
}

/// Room for one `SCM_TIMESTAMPING` control message (three `timespec`s).
const CONTROL_LEN: usize = 128;

/// One read: its bytes into `buf`, and the kernel's stamp of the last segment read, on
/// the realtime clock (as time since the epoch), if it gave one. `Ok((0, _))` is the end
/// of the stream. Non-blocking: `WouldBlock` when there is nothing to read.
pub(super) fn recv(socket: &impl AsRawFd, buf: &mut [u8]) -> io::Result<(usize, Option<Duration>)> {
    let mut control = [0u8; CONTROL_LEN];
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let mut stamp = None;
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmTimestampsns(ts) = c {
                let (s, ns) = (ts.system.tv_sec(), ts.system.tv_nsec());
                // An unset stamp is all zeros.
                if s > 0 {
                    stamp = Some(Duration::new(s as u64, ns as u32));
                }
            }
        }
    }
    Ok((msg.bytes, stamp))
}

/// The monotonic instant of a realtime `stamp`, given one reading of both clocks taken
/// together (`now`, `now_real`): `now` less how long ago the stamp was. A stamp after
/// `now_real` (the realtime clock stepped back) is `now`.
pub(super) fn arrival(stamp: Duration, now: Instant, now_real: SystemTime) -> Instant {
    let since_epoch = now_real
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let ago = since_epoch.saturating_sub(stamp);
    now.checked_sub(ago).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    /// Waits for `bytes`, written to `client`, to be read whole from `server`.
    fn write_and_read(
        client: &mut TcpStream,
        server: &TcpStream,
        bytes: &[u8],
        wait: Duration,
    ) -> Option<Duration> {
        client.write_all(bytes).expect("write");
        std::thread::sleep(wait);
        let mut buf = [0u8; 64];
        let (n, stamp) = loop {
            match recv(server, &mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                r => break r.expect("recv"),
            }
        };
        assert_eq!(&buf[..n], bytes);
        stamp
    }

    /// Bytes written over loopback come with a stamp from between the write and the read,
    /// and `arrival` puts it on the monotonic clock in the same order.
    #[test]
    fn a_read_is_stamped_between_the_write_and_the_read() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        enable(&server).expect("SO_TIMESTAMPING");
        // Stamping may be turned on a moment after `enable` (see the module's docs): wait
        // for a first stamped read, for at most a second.
        let on = (0..100).any(|_| {
            write_and_read(&mut client, &server, b"probe", Duration::from_millis(10)).is_some()
        });
        assert!(
            on,
            "the kernel stamped no segment within a second of SO_TIMESTAMPING"
        );
        let before = (Instant::now(), SystemTime::now());
        let stamp = write_and_read(&mut client, &server, b"answers", Duration::from_millis(20));
        let now = Instant::now();
        let now_real = SystemTime::now();
        let read_by = Instant::now();
        let stamp = stamp.expect("the kernel stamped the segment");
        let real = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        assert!(
            real(before.1) <= stamp && stamp <= real(now_real),
            "{stamp:?}"
        );
        let at = arrival(stamp, now, now_real);
        // `arrival` takes the real time for the moment `now` was read, but it was read
        // after it, by up to `read_by - now` (a thread preempted between the two reads):
        // the segment is placed that much early at most, and a segment stamped just after
        // `before` then maps to an instant before it (a loaded CI run failed a bare
        // `before.0 <= at`). 100 µs more for the two clocks parting over the test (NTP
        // slews the real-time clock by up to 500 ppm; the monotonic one is not slewed).
        let slack = (read_by - now) + Duration::from_micros(100);
        assert!(
            before.0 <= at + slack && at <= now,
            "arrival {:?} before the write (slack {slack:?})",
            before.0.saturating_duration_since(at)
        );
        // It arrived before the 20 ms sleep, not when it was read.
        assert!(now - at >= Duration::from_millis(15), "{:?}", now - at);
    }

    #[test]
    fn a_stamp_ahead_of_the_clock_is_now() {
        let (now, now_real) = (Instant::now(), SystemTime::now());
        let ahead = now_real
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            + Duration::from_secs(1);
        assert_eq!(arrival(ahead, now, now_real), now);
        let behind = ahead - Duration::from_millis(1001);
        assert_eq!(
            arrival(behind, now, now_real),
            now - Duration::from_millis(1)
        );
    }
}
