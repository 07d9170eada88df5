//! The hub's routing rules, driven through channels.

use kiln_engine::exec::Event;
use kiln_engine::graph::NodeId;
use kiln_engine::nodes::{Preview, PreviewFormat};
use kiln_spec::types;

use super::{Connection, Frame, Hub};
use crate::ws::messages::{Audience, ProgressState, executing, message, preview_frames};

const PROMPT: &str = "11111111-2222-4333-8444-555555555555";

/// The workspace of the tests that have one.
const WS: &str = "default";

fn ws() -> std::sync::Arc<str> {
    WS.into()
}

fn prompt_id() -> uuid::Uuid {
    PROMPT.parse().expect("a UUID")
}

/// Every text frame waiting on a connection, parsed.
fn drain(connection: &mut Connection) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    while let Ok(Frame::Text(text)) = connection.frames.try_recv() {
        out.push(serde_json::from_str(&text).expect("JSON"));
    }
    out
}

/// Sends one preview of a prompt owned by `owner` and returns the event types of the binary frames `socket` got.
fn preview_types(hub: &Hub, socket: &mut Connection, owner: &str) -> Vec<u32> {
    let preview = Preview { format: PreviewFormat::Png, bytes: b"\x89PNG".to_vec() };
    let (plain, with_metadata) = preview_frames(prompt_id(), &NodeId::from("9"), &preview);
    hub.send_preview(WS, Some(owner), &plain, &with_metadata);
    binary_types(socket)
}

fn binary_types(connection: &mut Connection) -> Vec<u32> {
    let mut out = Vec::new();
    while let Ok(frame) = connection.frames.try_recv() {
        if let Frame::Binary(bytes) = frame {
            out.push(u32::from_be_bytes(bytes[..4].try_into().expect("a header")));
        }
    }
    out
}

fn types_of(frames: &[serde_json::Value]) -> Vec<&str> {
    frames.iter().map(|f| f["type"].as_str().unwrap_or("")).collect()
}

fn flags() -> types::FeatureFlags {
    crate::system::features(104_857_600)
}

#[test]
fn a_socket_is_greeted_with_status_and_its_sid() {
    let hub = Hub::default();
    let mut named = hub.connect(&ws(), Some("abc"), 2);
    let frames = drain(&mut named);
    assert_eq!(
        frames,
        [
            serde_json::json!({"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 2}}, "sid": "abc"}})
        ]
    );
    let mut anonymous = hub.connect(&ws(), None, 0);
    assert_eq!(anonymous.sid.len(), 32, "a random 32-hex id");
    assert_eq!(drain(&mut anonymous)[0]["data"]["sid"], anonymous.sid.as_str());
}

#[test]
fn owner_events_go_only_to_the_owner_and_are_dropped_without_one() {
    let hub = Hub::default();
    let mut owner = hub.connect(&ws(), Some("owner"), 0);
    let mut other = hub.connect(&ws(), Some("other"), 0);
    drain(&mut owner);
    drain(&mut other);
    let (start, audience) = message(prompt_id(), &Event::ExecutionStart, 1).expect("a message");
    assert_eq!(audience, Audience::Owner);
    hub.publish(WS, Some("owner"), &start, audience);
    hub.publish(WS, None, &start, audience);
    assert_eq!(types_of(&drain(&mut owner)), ["execution_start"]);
    assert!(drain(&mut other).is_empty());

    // progress goes to everyone when the prompt has no client id; status always does.
    let (progress, audience) =
        message(prompt_id(), &Event::Progress { node: NodeId::from("3"), value: 1.0, max: 4.0 }, 1)
            .expect("a message");
    hub.publish(WS, None, &progress, audience);
    hub.broadcast_status(|_| 0, false);
    assert_eq!(types_of(&drain(&mut owner)), ["progress", "status"]);
    assert_eq!(types_of(&drain(&mut other)), ["progress", "status"]);
}

#[test]
fn reusing_a_client_id_replaces_the_socket_and_a_late_close_does_not_unregister_the_new_one() {
    let hub = Hub::default();
    let mut first = hub.connect(&ws(), Some("tab"), 0);
    let mut second = hub.connect(&ws(), Some("tab"), 0);
    drain(&mut first);
    drain(&mut second);
    hub.disconnect(first.id);
    hub.publish(WS, Some("tab"), &executing(Some("1"), Some(prompt_id())), Audience::Owner);
    assert!(drain(&mut first).is_empty(), "the replaced socket stops receiving");
    assert_eq!(types_of(&drain(&mut second)), ["executing"]);
    assert_eq!(hub.len(), 1);
}

#[test]
fn only_the_first_client_message_is_read_as_feature_flags() {
    let hub = Hub::default();
    let mut socket = hub.connect(&ws(), Some("c"), 0);
    drain(&mut socket);
    let announce = r#"{"type": "feature_flags", "data": {"supports_preview_metadata": true}}"#;
    hub.client_text(socket.id, announce, &flags());
    hub.client_text(socket.id, announce, &flags());
    let frames = drain(&mut socket);
    assert_eq!(types_of(&frames), ["feature_flags"], "answered once");
    assert_eq!(frames[0]["data"]["max_upload_size"], 104857600);
    assert_eq!(preview_types(&hub, &mut socket, "c"), [4], "previews with metadata once announced");

    let mut late = hub.connect(&ws(), Some("d"), 0);
    hub.client_text(late.id, "hello", &flags());
    hub.client_text(late.id, announce, &flags());
    assert_eq!(
        types_of(&drain(&mut late)),
        ["status"],
        "a first message that is not feature_flags uses up the one read"
    );
    assert_eq!(preview_types(&hub, &mut late, "d"), [1], "a late announcement does not count");
}

#[test]
fn a_reconnecting_owner_resumes_on_the_running_node() {
    let hub = Hub::default();
    hub.set_running("p", &ws(), Some("tab"), Some("7"), true);
    let mut socket = hub.connect(&ws(), Some("tab"), 1);
    let frames = drain(&mut socket);
    assert_eq!(types_of(&frames), ["status", "executing"]);
    assert_eq!(
        frames[1]["data"],
        serde_json::json!({"node": "7", "display_node": "7"}),
        "no prompt_id on the resume frame"
    );
    let mut stranger = hub.connect(&ws(), Some("x"), 1);
    assert_eq!(types_of(&drain(&mut stranger)), ["status"]);
}

#[test]
fn the_final_executing_frame_has_a_null_node_and_the_prompt_id() {
    let frame = serde_json::to_value(executing(None, Some(prompt_id()))).expect("JSON");
    assert_eq!(
        frame,
        serde_json::json!({"type": "executing", "data": {"node": null, "prompt_id": PROMPT}})
    );
}

#[test]
fn progress_state_tracks_running_and_finished_nodes() {
    let mut state = ProgressState::default();
    state.update(prompt_id(), &Event::Executing { node: NodeId::from("1") });
    let message = state
        .update(prompt_id(), &Event::NodeFinished { node: NodeId::from("1") })
        .expect("a change");
    let value = serde_json::to_value(message).expect("JSON");
    assert_eq!(value["type"], "progress_state");
    assert_eq!(value["data"]["nodes"]["1"]["state"], "finished");
    assert!(state.update(prompt_id(), &Event::ExecutionSuccess).is_none());
    let failure = kiln_engine::exec::NodeFailure {
        node: NodeId::from("1"),
        class_type: "X".to_owned(),
        executed: vec![],
        message: "m".to_owned(),
        kind: kiln_engine::nodes::ErrorKind::Failed,
        current_inputs: Default::default(),
        current_outputs: vec![],
    };
    assert!(
        state.update(prompt_id(), &Event::ExecutionError(Box::new(failure))).is_none(),
        "no progress_state on errors"
    );
}

#[test]
fn previews_go_to_the_owner_as_type_4_when_negotiated_and_type_1_otherwise() {
    let hub = Hub::default();
    let mut modern = hub.connect(&ws(), Some("modern"), 0);
    let mut legacy = hub.connect(&ws(), Some("legacy"), 0);
    hub.client_text(
        modern.id,
        r#"{"type": "feature_flags", "data": {"supports_preview_metadata": true}}"#,
        &flags(),
    );
    drain(&mut modern);
    drain(&mut legacy);

    let preview = Preview { format: PreviewFormat::Jpeg, bytes: vec![0xff, 0xd8, 0xff] };
    let (plain, with_metadata) = preview_frames(prompt_id(), &NodeId::from("5"), &preview);
    assert_eq!(&plain[..8], &[0, 0, 0, 1, 0, 0, 0, 1], "type 1, format 1 (JPEG)");
    assert_eq!(&plain[8..], &[0xff, 0xd8, 0xff]);
    assert_eq!(&with_metadata[..4], &[0, 0, 0, 4]);
    let length = u32::from_be_bytes(with_metadata[4..8].try_into().expect("a length")) as usize;
    let metadata: serde_json::Value =
        serde_json::from_slice(&with_metadata[8..8 + length]).expect("JSON metadata");
    assert_eq!(
        metadata,
        serde_json::json!({"node_id": "5", "prompt_id": PROMPT, "display_node_id": "5",
            "parent_node_id": null, "real_node_id": "5", "image_type": "image/jpeg"})
    );
    assert_eq!(&with_metadata[8 + length..], &[0xff, 0xd8, 0xff]);

    hub.send_preview(WS, Some("legacy"), &plain, &with_metadata);
    assert_eq!(
        (binary_types(&mut modern), binary_types(&mut legacy)),
        (vec![], vec![1]),
        "owner only"
    );
    hub.send_preview(WS, None, &plain, &with_metadata);
    assert_eq!(
        (binary_types(&mut modern), binary_types(&mut legacy)),
        (vec![4], vec![1]),
        "every socket when the prompt has no client_id, each in its own format"
    );
}

/// Sends `count` binary frames of `size` bytes to every socket (a prompt without a client id), as the worker
/// does for previews.
fn flood(hub: &Hub, size: usize, count: usize) {
    let frame = bytes::Bytes::from(vec![0u8; size]);
    for _ in 0..count {
        hub.send_preview(WS, None, &frame, &frame);
    }
}

#[test]
fn a_client_that_stops_reading_is_dropped_after_a_bounded_backlog_and_the_others_keep_receiving() {
    use crate::ws::outbox::MAX_QUEUED_BYTES;
    let hub = Hub::default();
    let mut stalled = hub.connect(&ws(), Some("stalled"), 0);
    let mut reader = hub.connect(&ws(), Some("reader"), 0);
    drain(&mut stalled);
    drain(&mut reader);

    // Four times the budget in 1 MiB previews; the reader keeps up, the stalled client reads nothing.
    let size = 1 << 20;
    let mut received = 0;
    let mut held_at_most = 0;
    for _ in 0..4 * MAX_QUEUED_BYTES / size {
        flood(&hub, size, 1);
        held_at_most = held_at_most.max(stalled.frames.queued_bytes());
        received += binary_types(&mut reader).len();
    }
    assert_eq!(received, 4 * MAX_QUEUED_BYTES / size, "the reader got every preview");
    assert!(stalled.frames.overflowed(), "the stalled client was dropped");
    assert!(held_at_most <= MAX_QUEUED_BYTES, "held {held_at_most} bytes for it");
    assert_eq!(hub.len(), 1, "only the reader is left");

    // Its pump is told to close, and gives no more frames: what was queued is discarded.
    let dropped = stalled.frames.dropped();
    futures::executor::block_on(dropped);
    assert!(futures::executor::block_on(stalled.frames.recv()).is_none());

    // Its client id is free again, and a new socket under it receives.
    let mut again = hub.connect(&ws(), Some("stalled"), 0);
    hub.publish(WS, Some("stalled"), &executing(Some("1"), Some(prompt_id())), Audience::Owner);
    assert_eq!(types_of(&drain(&mut again)), ["status", "executing"]);
}

#[test]
fn a_frame_larger_than_the_budget_goes_out_when_nothing_waits() {
    use crate::ws::outbox::MAX_QUEUED_BYTES;
    let hub = Hub::default();
    let mut socket = hub.connect(&ws(), Some("big"), 0);
    drain(&mut socket);
    flood(&hub, MAX_QUEUED_BYTES + 1, 1);
    assert_eq!(binary_types(&mut socket), [0], "delivered");
    flood(&hub, MAX_QUEUED_BYTES + 1, 1);
    assert_eq!(hub.len(), 1, "still connected");
    // A second one while the first still waits is too much.
    flood(&hub, MAX_QUEUED_BYTES + 1, 1);
    assert_eq!(hub.len(), 0, "dropped");
}

#[test]
fn a_client_that_reads_is_never_dropped_however_much_it_is_sent() {
    use crate::ws::outbox::MAX_QUEUED_BYTES;
    let hub = Hub::default();
    let mut socket = hub.connect(&ws(), Some("steady"), 0);
    drain(&mut socket);
    let size = MAX_QUEUED_BYTES / 4;
    for _ in 0..40 {
        flood(&hub, size, 3);
        assert_eq!(binary_types(&mut socket).len(), 3);
    }
    assert_eq!(hub.len(), 1);
}

#[test]
fn messages_stay_in_their_workspace_even_under_the_same_client_id() {
    let hub = Hub::default();
    let (a, b): (std::sync::Arc<str>, std::sync::Arc<str>) = ("a".into(), "b".into());
    let mut owner = hub.connect(&a, Some("tab"), 0);
    // Another workspace registers the same client id: it must not take over, or hear, the first one.
    let mut intruder = hub.connect(&b, Some("tab"), 0);
    drain(&mut owner);
    drain(&mut intruder);
    hub.publish("a", Some("tab"), &executing(Some("1"), Some(prompt_id())), Audience::Owner);
    hub.publish("a", None, &executing(Some("2"), Some(prompt_id())), Audience::All);
    let preview = Preview { format: PreviewFormat::Png, bytes: b"\x89PNG".to_vec() };
    let (plain, with_metadata) = preview_frames(prompt_id(), &NodeId::from("9"), &preview);
    hub.send_preview("a", None, &plain, &with_metadata);
    assert_eq!(drain(&mut owner).len(), 2);
    assert!(intruder.frames.try_recv().is_err(), "nothing of workspace a reaches b");
    // Each workspace's status carries its own counter.
    hub.broadcast_status(|workspace| if workspace == "a" { 3 } else { 0 }, true);
    let counter = |socket: &mut Connection| {
        drain(socket)[0]["data"]["status"]["exec_info"]["queue_remaining"].clone()
    };
    assert_eq!(counter(&mut owner), 3);
    // With several tenants, a workspace whose counter did not change (since its greeting) hears nothing.
    assert!(drain(&mut intruder).is_empty(), "b's counter did not change");
    hub.broadcast_status(|workspace| if workspace == "a" { 2 } else { 1 }, true);
    assert_eq!(counter(&mut owner), 2);
    assert_eq!(counter(&mut intruder), 1);
    // Without tenants (the local runtime), every change is announced, as ComfyUI does.
    hub.broadcast_status(|workspace| if workspace == "a" { 2 } else { 1 }, false);
    assert_eq!(counter(&mut owner), 2);
    // A prompt running in a, re-announced to a reconnecting owner of a only.
    hub.set_running("p", &a, Some("tab"), Some("7"), true);
    let mut stranger = hub.connect(&b, Some("tab"), 0);
    assert_eq!(drain(&mut stranger).len(), 1, "only its status");
}
