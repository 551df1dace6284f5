//! `flowgate ofp decode|roundtrip FILE...`: the codec from the command line.

use std::path::PathBuf;

use bytes::BytesMut;

/// Print each message of each file as JSON, one per line. Fails on anything that is not
/// a sequence of whole, valid OpenFlow 1.3 messages.
pub fn decode(files: &[PathBuf]) -> anyhow::Result<()> {
    let mut failed = 0;
    for f in files {
        let data = std::fs::read(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        match ofp::decode_file_bytes(&data) {
            Ok(msgs) if msgs.is_empty() => {
                eprintln!("{}: holds no OpenFlow message", f.display());
                failed += 1;
            }
            Ok(msgs) => {
                for (xid, m) in msgs {
                    let json = serde_json::json!({ "file": f.display().to_string(), "xid": xid, "message": m });
                    println!("{json}");
                }
            }
            Err(e) => {
                eprintln!("{}: {e}", f.display());
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} file(s) did not decode", files.len());
    }
    Ok(())
}

/// Exit 0 only when every file holds exactly one valid message that re-encodes to the
/// same bytes; print one line naming each file that does not.
pub fn roundtrip(files: &[PathBuf]) -> anyhow::Result<()> {
    let mut bad = 0;
    for f in files {
        if let Err(why) = roundtrip_one(f) {
            println!("{}: {why}", f.display());
            bad += 1;
        }
    }
    if bad > 0 {
        anyhow::bail!("{bad} of {} file(s) failed the round trip", files.len());
    }
    Ok(())
}

fn roundtrip_one(f: &PathBuf) -> Result<(), String> {
    let data = std::fs::read(f).map_err(|e| e.to_string())?;
    let msgs = ofp::decode_file_bytes(&data).map_err(|e| e.to_string())?;
    let [(xid, msg)] = msgs.as_slice() else {
        return Err(format!("holds {} messages, not one", msgs.len()));
    };
    let mut out = BytesMut::new();
    ofp::encode(*xid, msg, &mut out).map_err(|e| format!("re-encoding failed: {e}"))?;
    if out[..] != data[..] {
        let at = out
            .iter()
            .zip(data.iter())
            .position(|(a, b)| a != b)
            .unwrap_or(out.len().min(data.len()));
        return Err(format!(
            "re-encoded bytes differ from byte {at} ({} vs {} bytes)",
            out.len(),
            data.len()
        ));
    }
    Ok(())
}
