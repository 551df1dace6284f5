//! `/api/v1/stream`: server-sent events, one `snapshot` per interval with everything the
//! dashboard draws. Ends when the controller shuts down.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::views::{service_views, switch_views};
use super::{ApiState, error};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamQuery {
    interval_ms: Option<u64>,
}

/// One snapshot, as JSON text.
pub(crate) fn snapshot(st: &ApiState, seq: u64) -> String {
    let h = &st.handle;
    let (cum, sum) = h.decision_latency.snapshot();
    let decisions = cum[cum.len() - 1];
    let core = h.lock();
    let c = &core.controller;
    let events: Vec<_> = {
        let all: Vec<_> = c.events().collect();
        let skip = all.len().saturating_sub(30);
        all.into_iter().skip(skip).cloned().collect()
    };
    serde_json::json!({
        "seq": seq,
        "uptime_ms": h.started.elapsed().as_millis() as u64,
        "services": service_views(c),
        "switches": switch_views(h, c),
        "connections": c.connections().len(),
        "packet_in_total": c.counters().packet_in,
        "decision_latency": {
            "count": decisions,
            "mean_us": if decisions > 0 { sum * 1e6 / decisions as f64 } else { 0.0 },
        },
        "events": events,
        // The controller's own overload gate (ACCM on its PACKET_IN load).
        "controller_gate": c.controller_gap_view(),
    })
    .to_string()
}

pub(crate) async fn stream(State(st): State<ApiState>, Query(q): Query<StreamQuery>) -> Response {
    let every = q.interval_ms.unwrap_or(1000);
    if !(200..=10_000).contains(&every) {
        return error(
            StatusCode::BAD_REQUEST,
            "interval_ms must be between 200 and 10000",
        );
    }
    let mut interval = tokio::time::interval(Duration::from_millis(every));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = st.stop.clone();
    let s = futures_util::stream::unfold(
        (st, interval, stop, 0u64),
        |(st, mut interval, mut stop, seq)| async move {
            if *stop.borrow() {
                return None;
            }
            tokio::select! {
                _ = interval.tick() => {}
                _ = stop.changed() => return None,
            }
            let data = snapshot(&st, seq);
            let ev = Event::default()
                .event("snapshot")
                .id(seq.to_string())
                .data(data);
            Some((Ok::<Event, Infallible>(ev), (st, interval, stop, seq + 1)))
        },
    );
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
