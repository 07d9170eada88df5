//! Issue #9, done-when: the real `kiln` binary replays all of ComfyUI's recorded exchanges
//! (`tests/golden/comfyui`) in the order they were recorded, on one fresh server, so counters (prompt numbers,
//! upload renames, SaveImage's file counter) carry from one case to the next as they did for ComfyUI.
//!
//! Each answer must match the recording: status, content type, the JSON body with its key order (volatile values
//! are replaced on both sides by the capture README's placeholders), and for websocket cases every frame in
//! order, the POST answer and the history entry. Where Kiln deliberately answers otherwise, [`differences`]
//! says how and why; the capture README lists the same cases.

use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;

use kiln_tests::key_order::{comfyui_shape, shape};

use crate::binary::{get_json, start, temp_dir};

pub(crate) use kiln_tests::golden;

/// Every capture, in the order the recorder sent it. The capture README lists them grouped; the prompt numbers
/// ComfyUI gave (11, 12, 20, 21, -22, 23–28; every prompt POST whose body is JSON and has no `number` takes one)
/// fix where the `POST /prompt` cases fall: 18 rejected prompts and two accepted ones took 0–19, so of the two
/// crashing cases only the one with no JSON body can come before 20; the other (a list as `prompt`, which takes a
/// number) came after the last websocket case. Both are put last.
const RECORDED_ORDER: &[&str] = &[
    "get_object_info_EmptyImage",
    "get_object_info_SaveImage",
    "get_object_info_LoadImage",
    "get_object_info_KSampler",
    "get_object_info_CheckpointLoaderSimple",
    "get_object_info_ImageScale",
    "get_object_info_ImageInvert",
    "get_object_info_PreviewImage",
    "get_object_info_NoSuchNode",
    "get_system_stats_shape",
    "get_features",
    "get_embeddings",
    "get_models",
    "get_models_checkpoints",
    "get_models_unknown",
    "get_unknown_route",
    "get_api_prefix_queue",
    "get_queue_idle",
    "get_prompt_idle",
    "get_history_empty",
    "get_history_unknown",
    "get_api_jobs_empty",
    "get_api_jobs_unknown",
    "get_api_jobs_bad_limit",
    "post_queue_clear",
    "post_queue_delete_unknown",
    "post_interrupt_no_body",
    "post_interrupt_unknown_prompt",
    "post_history_clear_missing",
    "post_prompt_no_prompt_key",
    "post_prompt_unknown_class_type",
    "post_prompt_unknown_class_type_with_title",
    "post_prompt_missing_class_type",
    "post_prompt_no_output_node",
    "post_prompt_empty_prompt",
    "post_prompt_required_input_missing",
    "post_prompt_required_link_input_missing",
    "post_prompt_int_above_max",
    "post_prompt_int_below_min",
    "post_prompt_int_not_a_number",
    "post_prompt_int_as_string_accepted",
    "post_prompt_int_as_float",
    "post_prompt_combo_not_in_list",
    "post_prompt_link_to_missing_node",
    "post_prompt_link_bad_output_index",
    "post_prompt_link_wrong_type",
    "post_prompt_cycle",
    "post_prompt_loadimage_missing_file",
    "post_prompt_bad_prompt_id",
    "post_prompt_partial_accept",
    "post_prompt_valid_client_prompt_id",
    "post_prompt_valid_number",
    "post_prompt_valid_front",
    "post_upload_image_first",
    "post_upload_image_same_name_same_content",
    "post_upload_image_same_name_diff_content",
    "post_upload_image_overwrite_true",
    "post_upload_image_subfolder",
    "post_upload_image_traversal",
    "post_upload_image_traversal_subfolder",
    "post_upload_image_empty_filename",
    "post_upload_image_no_file",
    "post_upload_image_corrupt",
    "get_object_info_LoadImage_after_uploads",
    "get_view_input_png",
    "get_view_annotated",
    "get_view_output_png",
    "get_view_missing",
    "get_view_no_filename",
    "get_view_traversal",
    "get_view_absolute",
    "get_view_traversal_subfolder",
    "get_view_bad_type",
    "ws_success",
    "ws_cached_rerun",
    "ws_success_feature_flags",
    "ws_binary_save_image_websocket",
    "ws_no_client_id_in_post",
    "ws_execution_error",
    "get_history_max_items_2",
    "get_api_jobs_limit_5",
    "get_queue_after",
    "get_prompt_after",
    "post_prompt_invalid_json_body",
    "post_prompt_prompt_is_list",
];

/// How an answer is compared when Kiln deliberately differs from the recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Difference {
    /// Upstream crashes (plain-text 500); Kiln answers 400 with a JSON error naming the problem.
    ClearError,
    /// Same status; Kiln adds an `ErrorResponse` body where upstream sends none.
    BodyAdded,
    /// The values depend on the machine or the build: the same fields, in the same order.
    Shape,
    /// The body is an image Kiln encoded (a different encoder than PIL's): status and headers only.
    OwnImage,
    /// Kiln's combos list what it implements and what its folders hold: the recording's sampler and scheduler
    /// lists are cut to Kiln's (keeping their order, which must be Kiln's), and the file list is Kiln's own.
    /// Whole floats (`8.0`) compare by value: every JSON answer of Kiln writes them as integers (`8`), a
    /// difference no JSON client sees.
    OwnCombos,
    /// The recording's input folder held a file (`..%2Fevil.png`) no recorded request put there.
    RecordingArtifact,
    /// The error text is the decoder's, not PIL's (`cannot identify image file '<path>'`).
    DecoderMessage,
    /// Upstream fills `node_errors` from a Python set: its key order is arbitrary (PYTHONHASHSEED).
    SetOrder,
    /// An unknown path: the same empty 404, without upstream's `application/octet-stream` for a body it
    /// does not have.
    NoContentType,
}

/// The cases Kiln answers differently on purpose, and why; every other case must match.
fn differences(case: &str) -> Option<Difference> {
    Some(match case {
        "post_prompt_invalid_json_body"
        | "post_prompt_prompt_is_list"
        | "post_upload_image_empty_filename"
        | "post_upload_image_no_file" => Difference::ClearError,
        "post_upload_image_traversal" | "post_upload_image_traversal_subfolder" => {
            Difference::BodyAdded
        }
        "get_system_stats_shape" | "get_features" => Difference::Shape,
        "get_view_output_png" => Difference::OwnImage,
        "get_object_info_KSampler" | "get_object_info_CheckpointLoaderSimple" => {
            Difference::OwnCombos
        }
        "get_object_info_LoadImage_after_uploads" => Difference::RecordingArtifact,
        "ws_execution_error" | "get_history_max_items_2" | "get_api_jobs_limit_5" => {
            Difference::DecoderMessage
        }
        "post_prompt_cycle" => Difference::SetOrder,
        "get_unknown_route" => Difference::NoContentType,
        _ => return None,
    })
}

/// `value` with whole floats written as integers, as Kiln writes every JSON answer.
fn whole_floats_as_ints(value: Value) -> Value {
    match value {
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(whole_floats_as_ints).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, whole_floats_as_ints(v))).collect())
        }
        other => other,
    }
}

/// The upload bodies: ComfyUI's capture keeps only their sizes and hashes, so Kiln's replay uses its own.
struct Files {
    first: Vec<u8>,
    second: Vec<u8>,
}

impl Files {
    fn new() -> Files {
        let png = |rgb: [u8; 3]| {
            let image = image::RgbImage::from_pixel(1, 1, image::Rgb(rgb));
            let mut out = std::io::Cursor::new(Vec::new());
            image.write_to(&mut out, image::ImageFormat::Png).expect("a PNG");
            out.into_inner()
        };
        Files { first: png([10, 20, 30]), second: png([200, 100, 0]) }
    }

    /// The bytes a recorded upload sent, by its recorded sha256 (two distinct images, and the corrupt file).
    fn for_upload(&self, image: &Value) -> Vec<u8> {
        match image["sha256"].as_str() {
            Some("be21aef17f0baf04b1bf148f8a23bda4e879b346a64637fdd711bea012e646a8") => {
                self.first.clone()
            }
            Some("548c752266def8c110bdce0cb60c3095427d099a2d8b33100e11fc484cc1a4c3") => {
                self.second.clone()
            }
            _ => b"this is not a png".to_vec(),
        }
    }
}

/// A multipart body written out by hand, so file names reach the server exactly as recorded (`../evil.png`).
fn multipart(fields: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "kilnreplayboundary";
    let mut body = Vec::new();
    for (name, filename, content) in fields {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match filename {
            Some(filename) => body.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\nContent-Type: image/png\r\n\r\n"
                )
                .as_bytes(),
            ),
            None => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
            ),
        }
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// The recorded request as reqwest sends it.
fn request(
    http: &reqwest::Client,
    addr: &str,
    recorded: &Value,
    files: &Files,
) -> reqwest::RequestBuilder {
    let path = recorded["path"].as_str().expect("a path");
    let url = format!("http://{addr}{path}");
    let builder = match recorded["method"].as_str() {
        Some("POST") => http.post(&url),
        _ => http.get(&url),
    };
    if let Some(json) = recorded.get("json") {
        return builder.header("Content-Type", "application/json").body(json.to_string());
    }
    if let Some(raw) = recorded.get("raw_body") {
        let content_type = recorded["headers"]["Content-Type"].as_str().unwrap_or("text/plain");
        return builder
            .header("Content-Type", content_type)
            .body(raw.as_str().unwrap_or_default().to_owned());
    }
    if let Some(form) = recorded.get("multipart") {
        let image = &form["image"];
        let bytes = files.for_upload(image);
        let mut fields: Vec<(&str, Option<&str>, &[u8])> =
            vec![("image", image["filename"].as_str(), &bytes)];
        let overwrite = form["overwrite"].as_str().map(str::as_bytes);
        if let Some(overwrite) = overwrite {
            fields.push(("overwrite", None, overwrite));
        }
        let (content_type, body) = multipart(&fields);
        return builder.header("Content-Type", content_type).body(body);
    }
    if let Some(form) = recorded.get("multipart_raw") {
        let subfolder = form["subfolder"].as_str().map(str::as_bytes);
        let mut fields: Vec<(&str, Option<&str>, &[u8])> =
            vec![("image", form["filename"].as_str(), &files.first)];
        if let Some(subfolder) = subfolder {
            fields.push(("subfolder", None, subfolder));
        }
        let (content_type, body) = multipart(&fields);
        return builder.header("Content-Type", content_type).body(body);
    }
    builder
}

/// Replaces what varies from run to run with the capture README's placeholders: UUIDs (values and keys) by
/// `<PROMPT_ID_n>` in order of first appearance, times by `<KEY>`, the greeting's sid, Python tracebacks, and
/// `current_outputs` (upstream builds it from a set, so its order is arbitrary) sorted.
struct Normalizer {
    ids: Vec<String>,
}

impl Normalizer {
    fn new() -> Normalizer {
        Normalizer { ids: Vec::new() }
    }

    fn id(&mut self, text: &str) -> Option<String> {
        if text.starts_with("<PROMPT_ID_") {
            return Some(text.to_owned());
        }
        let parsed = text.parse::<uuid::Uuid>().ok()?;
        if parsed.hyphenated().to_string() != text {
            return None;
        }
        let index = match self.ids.iter().position(|i| i == text) {
            Some(index) => index,
            None => {
                self.ids.push(text.to_owned());
                self.ids.len() - 1
            }
        };
        Some(format!("<PROMPT_ID_{}>", index + 1))
    }

    fn apply(&mut self, value: &Value, difference: Option<Difference>) -> Value {
        match value {
            Value::String(text) => Value::String(self.id(text).unwrap_or_else(|| text.clone())),
            Value::Array(items) => {
                Value::Array(items.iter().map(|i| self.apply(i, difference)).collect())
            }
            Value::Object(map) => {
                let is_error_event =
                    map.contains_key("node_type") && map.contains_key("exception_type");
                // `progress_state` numbers: ComfyUI sends `1` on its cached path and `1.0` otherwise; Kiln's
                // wire type is a JSON number, always written as a float. Compared by value.
                let is_node_progress = map.contains_key("state") && map.contains_key("max");
                // The `feature_flags` reply carries Kiln's own flags: the same fields, Kiln's values.
                if map.get("type").and_then(Value::as_str) == Some("feature_flags") {
                    return json!({"type": "feature_flags", "data": shape(&map["data"])});
                }
                let mut out = Map::new();
                for (key, v) in map {
                    let key_out = self.id(key).unwrap_or_else(|| key.clone());
                    let v = match key.as_str() {
                        "timestamp"
                        | "create_time"
                        | "execution_start_time"
                        | "execution_end_time"
                            if !v.is_null() =>
                        {
                            Value::String(format!("<{}>", key.to_uppercase()))
                        }
                        "sid" => Value::String("<SID>".to_owned()),
                        "traceback" => Value::String("<TRACEBACK>".to_owned()),
                        "current_outputs" => {
                            let mut ids: Vec<Value> = v.as_array().cloned().unwrap_or_default();
                            ids.sort_by_key(|i| i.to_string());
                            Value::Array(ids)
                        }
                        "value" | "max" if is_node_progress => {
                            v.as_f64().map_or(Value::Null, |n| json!(n))
                        }
                        "exception_message"
                            if is_error_event && difference == Some(Difference::DecoderMessage) =>
                        {
                            Value::String("<DECODER_MESSAGE>".to_owned())
                        }
                        _ => self.apply(v, difference),
                    };
                    out.insert(key_out, v);
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }
}

/// Compares one normalized document with the recording: values, then key order.
fn compare(case: &str, what: &str, got: &Value, expected: &Value, failures: &mut Vec<String>) {
    if got != expected {
        failures.push(format!("{case}: {what} differs\n  kiln:    {got}\n  comfyui: {expected}"));
        return;
    }
    for line in kiln_tests::key_order::differences(got, expected) {
        if differences(case) == Some(Difference::SetOrder) && line.starts_with("$.node_errors:") {
            continue;
        }
        failures.push(format!("{case}: {what} key order: {line}"));
    }
}

async fn replay_http(
    http: &reqwest::Client,
    addr: &str,
    case: &str,
    recorded: &Value,
    files: &Files,
    failures: &mut Vec<String>,
) {
    let difference = differences(case);
    let response =
        request(http, addr, &recorded["request"], files).send().await.expect("kiln answers");
    let status = response.status().as_u16();
    let header =
        |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let content_type = header("content-type");
    let disposition = header("content-disposition");
    let nosniff = header("x-content-type-options");
    let bytes = response.bytes().await.expect("a body").to_vec();
    let expected = &recorded["response"];
    let expected_status = expected["status"].as_u64().unwrap_or_default() as u16;
    let body = &expected["body"];

    if difference == Some(Difference::ClearError) {
        let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let named = parsed["message"].as_str().or(parsed["error"]["message"].as_str());
        if status != 400 || named.is_none_or(str::is_empty) {
            failures.push(format!(
                "{case}: expected a 400 with a JSON error naming the problem, got {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        return;
    }
    if status != expected_status {
        failures.push(format!(
            "{case}: status {status}, ComfyUI {expected_status}: {}",
            String::from_utf8_lossy(&bytes)
        ));
        return;
    }
    let recorded_type = expected["headers"]["Content-Type"].as_str();
    let type_differs =
        matches!(difference, Some(Difference::BodyAdded | Difference::NoContentType));
    if recorded_type.is_some() && !type_differs && content_type.as_deref() != recorded_type {
        failures.push(format!("{case}: Content-Type {content_type:?}, ComfyUI {recorded_type:?}"));
    }
    match body["kind"].as_str() {
        Some("json") => {
            let Ok(got) = serde_json::from_slice::<Value>(&bytes) else {
                failures.push(format!("{case}: not JSON: {}", String::from_utf8_lossy(&bytes)));
                return;
            };
            let mut want = body["json"].clone();
            match difference {
                Some(Difference::Shape) => {
                    let (ours, theirs) = (comfyui_shape(&got), shape(&want));
                    if ours != theirs {
                        failures.push(format!(
                            "{case}: fields differ\n  kiln:    {ours:?}\n  comfyui: {theirs:?}"
                        ));
                    }
                    return;
                }
                Some(Difference::OwnCombos) => {
                    for list in [
                        "/KSampler/input/required/sampler_name/0",
                        "/KSampler/input/required/scheduler/0",
                    ] {
                        let kiln = got.pointer(list).cloned().unwrap_or_default();
                        if let Some(recorded) = want.pointer_mut(list).and_then(Value::as_array_mut)
                        {
                            recorded.retain(|v| kiln.as_array().is_some_and(|k| k.contains(v)));
                        }
                    }
                    want = whole_floats_as_ints(want);
                    let files = "/CheckpointLoaderSimple/input/required/ckpt_name/0";
                    if let (Some(kiln), Some(recorded)) =
                        (got.pointer(files).cloned(), want.pointer_mut(files))
                    {
                        *recorded = kiln;
                    }
                }
                Some(Difference::RecordingArtifact) => {
                    if let Some(list) = want
                        .pointer_mut("/LoadImage/input/required/image/0")
                        .and_then(Value::as_array_mut)
                    {
                        list.retain(|f| f != "..%2Fevil.png");
                    }
                }
                _ => {}
            }
            let got = Normalizer::new().apply(&got, difference);
            let want = Normalizer::new().apply(&want, difference);
            compare(case, "body", &got, &want, failures);
        }
        Some("binary") => {
            // The uploaded file comes back as it was sent; an output is an image Kiln encoded.
            let uploaded = matches!(case, "get_view_input_png" | "get_view_annotated");
            if uploaded && bytes != files.second {
                failures.push(format!("{case}: not the bytes of the last upload of tiny.png"));
            } else if !bytes.starts_with(b"\x89PNG") {
                failures.push(format!("{case}: not a PNG"));
            }
            let recorded_disposition = expected["headers"]["Content-Disposition"].as_str();
            if disposition.as_deref() != recorded_disposition {
                failures.push(format!(
                    "{case}: Content-Disposition {disposition:?}, ComfyUI {recorded_disposition:?}"
                ));
            }
            if nosniff.as_deref() != Some("nosniff") {
                failures.push(format!("{case}: no X-Content-Type-Options: nosniff"));
            }
        }
        Some("text") => {
            let got = String::from_utf8_lossy(&bytes);
            if got != body["text"].as_str().unwrap_or_default() {
                failures.push(format!("{case}: text {got:?}, ComfyUI {}", body["text"]));
            }
        }
        _ => {
            if difference == Some(Difference::BodyAdded) {
                let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                if parsed["message"].as_str().is_none_or(str::is_empty) {
                    failures.push(format!("{case}: expected an ErrorResponse naming the problem"));
                }
            } else if !bytes.is_empty() {
                failures.push(format!(
                    "{case}: body {:?}, ComfyUI none",
                    String::from_utf8_lossy(&bytes)
                ));
            }
        }
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A frame as the capture describes it: text frames parsed, binary frames by event and image type.
fn describe(message: &Message) -> Option<Value> {
    match message {
        Message::Text(text) => Some(
            json!({"frame": "text", "message": serde_json::from_str::<Value>(text.as_str()).ok()?}),
        ),
        Message::Binary(bytes) if bytes.len() >= 8 => {
            let word =
                |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
            Some(json!({"frame": "binary", "event_type": word(0), "image_type": word(4)}))
        }
        _ => None,
    }
}

/// The frames a socket has received within `wait`, described.
async fn drain(socket: &mut Socket, wait: Duration, out: &mut Vec<Value>) {
    while let Ok(Some(Ok(message))) = tokio::time::timeout(wait, socket.next()).await {
        out.extend(describe(&message));
    }
}

async fn replay_ws(
    http: &reqwest::Client,
    addr: &str,
    case: &str,
    recorded: &Value,
    failures: &mut Vec<String>,
) {
    let difference = differences(case);
    let url = format!("ws://{addr}{}", recorded["ws_url"].as_str().expect("a ws url"));
    let (mut socket, _) = tokio_tungstenite::connect_async(url).await.expect("websocket");
    let mut frames = Vec::new();
    if recorded["client_sent_feature_flags"] == true {
        let flags = json!({"type": "feature_flags", "data": {"supports_preview_metadata": true}});
        socket.send(Message::Text(flags.to_string().into())).await.expect("flags sent");
    }
    drain(&mut socket, Duration::from_millis(300), &mut frames).await;
    let response = http
        .post(format!("http://{addr}/prompt"))
        .body(recorded["post_body"].to_string())
        .send()
        .await
        .expect("kiln answers");
    let post = json!({"status": response.status().as_u16(), "body": response.json::<Value>().await.expect("JSON")});
    let prompt_id = post["body"]["prompt_id"].as_str().unwrap_or_default().to_owned();
    // Until the final `executing {node: null}` for this prompt; a socket that does not own the prompt never gets
    // it, so for that case wait for the history entry instead.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = frames.iter().any(|f| {
            f["message"]["type"] == "executing"
                && f["message"]["data"]["node"].is_null()
                && f["message"]["data"]["prompt_id"] == prompt_id.as_str()
        });
        if done || tokio::time::Instant::now() > deadline {
            break;
        }
        if recorded["post_body"].get("client_id").is_none() {
            let history = get_json(http, addr, &format!("/history/{prompt_id}")).await;
            if history.get(&prompt_id).is_some() {
                drain(&mut socket, Duration::from_millis(300), &mut frames).await;
                break;
            }
        }
        drain(&mut socket, Duration::from_millis(50), &mut frames).await;
    }
    let history = get_json(http, addr, &format!("/history/{prompt_id}")).await;

    // One normalizer for the whole case, as the capture numbered ids per file: the POST answer first.
    let mut ours = Normalizer::new();
    let mut theirs = Normalizer::new();
    let got_post = ours.apply(&post, difference);
    let want_post = theirs.apply(&recorded["post_response"], difference);
    compare(case, "POST /prompt", &got_post, &want_post, failures);
    let want_frames: Vec<Value> = recorded["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| match m["frame"].as_str() {
            Some("binary") => json!({"frame": "binary", "event_type": m["event_type"], "image_type": m["image_type"]}),
            _ => json!({"frame": "text", "message": m["message"]}),
        })
        .collect();
    let got_frames = ours.apply(&Value::Array(frames), difference);
    let want_frames = theirs.apply(&Value::Array(want_frames), difference);
    compare(case, "websocket frames", &got_frames, &want_frames, failures);
    let got_history = ours.apply(&history, difference);
    let want_history = theirs.apply(&recorded["history_after"], difference);
    compare(case, "history", &got_history, &want_history, failures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_kiln_replays_every_recorded_exchange_in_order_like_comfyui() {
    let cases: Vec<String> = std::fs::read_dir(kiln_tests::golden_dir())
        .expect("the captures")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
        .collect();
    let mut listed: Vec<&str> = RECORDED_ORDER.to_vec();
    listed.sort_unstable();
    let mut present: Vec<&str> = cases.iter().map(String::as_str).collect();
    present.sort_unstable();
    assert_eq!(listed, present, "RECORDED_ORDER lists every capture once");

    let data_dir = temp_dir("golden-replay");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let files = Files::new();
    let mut failures = Vec::new();
    for case in RECORDED_ORDER {
        let recorded = golden(case);
        if case.starts_with("ws_") {
            replay_ws(&http, &addr, case, &recorded, &mut failures).await;
        } else {
            replay_http(&http, &addr, case, &recorded, &files, &mut failures).await;
        }
        // A prompt the case queued runs before the next case, as the recorder waited for each.
        wait_idle(&http, &addr).await;
    }
    assert!(
        failures.is_empty(),
        "{} differences from ComfyUI's recording:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Waits until nothing is queued or running.
async fn wait_idle(http: &reqwest::Client, addr: &str) {
    for _ in 0..500 {
        let info = get_json(http, addr, "/prompt").await;
        if info["exec_info"]["queue_remaining"] == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the queue did not empty");
}
