//! Output for `flowgate ofp decode`: one JSON object per message.

use crate::msg::Message;

/// Decode a buffer of concatenated messages and render each as a one-line JSON object
/// `{"xid":..,"type":"OFPT_..","msg":{..}}`.
#[cfg(feature = "serde")]
pub fn to_json_lines(data: &[u8]) -> Result<Vec<String>, crate::error::DecodeError> {
    let msgs = crate::framing::decode_file_bytes(data)?;
    Ok(msgs.iter().map(|(xid, m)| message_json(*xid, m)).collect())
}

/// One message as a JSON object string.
#[cfg(feature = "serde")]
pub fn message_json(xid: u32, msg: &Message) -> String {
    #[derive(serde::Serialize)]
    struct Out<'a> {
        xid: u32,
        #[serde(rename = "type")]
        typ: &'static str,
        msg: &'a Message,
    }
    serde_json::to_string(&Out {
        xid,
        typ: msg.msg_type().name(),
        msg,
    })
    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// A one-line summary (`OFPT_FLOW_MOD xid=7 len=...`) without serde.
pub fn summary(xid: u32, msg: &Message) -> String {
    format!("{} xid={xid}", msg.msg_type().name())
}
