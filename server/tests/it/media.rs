//! Video through the real binary: a workflow of CreateVideo → SaveVideo makes an MP4 listed under `images`
//! with `animated: [true]`; `/view` serves it as `video/mp4` with byte ranges (206, `Content-Range`,
//! `Accept-Ranges`, 416), as `<video>` elements ask for it; an uploaded MP4 is served the same way, and
//! LoadVideo reads it back.

use kiln_client::{Client, UploadOptions, types};
use serde_json::json;

use crate::binary::{start, temp_dir};

fn request(prompt: serde_json::Value) -> types::PromptRequest {
    serde_json::from_value(json!({"prompt": prompt})).expect("a prompt request")
}

/// `GET url` with an optional `Range`: status, the headers asked for, body.
async fn get(
    url: &str,
    range: Option<&str>,
    headers: &[&str],
) -> (u16, Vec<Option<String>>, Vec<u8>) {
    let client = reqwest::Client::new();
    let mut call = client.get(url);
    if let Some(range) = range {
        call = call.header("Range", range);
    }
    let response = call.send().await.expect("answers");
    let status = response.status().as_u16();
    let values = headers
        .iter()
        .map(|h| response.headers().get(*h).and_then(|v| v.to_str().ok()).map(str::to_owned))
        .collect();
    (status, values, response.bytes().await.expect("body").to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_and_uploaded_videos_are_served_with_byte_ranges() {
    let data_dir = temp_dir("media");
    let (_server, addr) = start(&data_dir);
    let kiln = Client::with_timeout(&format!("http://{addr}"), std::time::Duration::from_secs(120))
        .expect("client");
    let run = kiln
        .run_prompt(request(json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 4, "color": 0x3366aa}},
            "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 8.0}},
            "3": {"class_type": "SaveVideo", "inputs": {"video": ["2", 0], "filename_prefix": "video/range", "format": "auto", "codec": "auto"}},
        })))
        .await
        .expect("the prompt runs");
    assert_eq!(run.history.status.status_str, types::HistoryStatusStr::Success);
    let output = &run.history.outputs["3"];
    assert_eq!(output.animated, [true]);
    let file = &output.images[0];
    assert_eq!((file.filename.as_str(), file.subfolder.as_str()), ("range_00001_.mp4", "video"));

    let url =
        format!("http://{addr}/api/view?filename=range_00001_.mp4&subfolder=video&type=output");
    let names = ["content-type", "accept-ranges", "content-range", "content-length"];
    let (status, headers, whole) = get(&url, None, &names).await;
    assert_eq!(status, 200);
    assert_eq!(headers[0].as_deref(), Some("video/mp4"));
    assert_eq!(headers[1].as_deref(), Some("bytes"));
    assert_eq!(headers[2], None);
    assert_eq!(&whole[4..8], b"ftyp");
    let size = whole.len();

    let (status, headers, part) = get(&url, Some("bytes=0-99"), &names).await;
    assert_eq!(status, 206);
    assert_eq!(headers[0].as_deref(), Some("video/mp4"));
    assert_eq!(headers[1].as_deref(), Some("bytes"));
    assert_eq!(headers[2], Some(format!("bytes 0-99/{size}")));
    assert_eq!(headers[3].as_deref(), Some("100"));
    assert_eq!(part, whole[..100]);

    // What a <video> element asks first, a suffix, and a range past the end.
    let (status, headers, part) = get(&url, Some("bytes=0-"), &names).await;
    assert_eq!((status, headers[2].clone()), (206, Some(format!("bytes 0-{}/{size}", size - 1))));
    assert_eq!(part, whole);
    let (status, _, part) = get(&url, Some("bytes=-16"), &names).await;
    assert_eq!((status, part.as_slice()), (206, &whole[size - 16..]));
    let (status, headers, part) = get(&url, Some(&format!("bytes={size}-")), &names).await;
    assert_eq!((status, headers[2].clone()), (416, Some(format!("bytes */{size}"))));
    assert!(part.is_empty());
    let (status, _, _) = get(&url, Some("bytes=5-1"), &names).await;
    assert_eq!(status, 416);

    // An upload of the same file is served with ranges too, and LoadVideo reads it.
    let stored = kiln
        .upload_image("clip.mp4", whole.clone(), &UploadOptions::default())
        .await
        .expect("uploaded")
        .into_inner();
    assert_eq!(stored.name, "clip.mp4");
    let url = format!("http://{addr}/api/view?filename=clip.mp4&type=input");
    let (status, headers, part) = get(&url, Some("bytes=8-15"), &names).await;
    assert_eq!((status, headers[2].clone()), (206, Some(format!("bytes 8-15/{size}"))));
    assert_eq!(part, whole[8..16]);
    let run = kiln
        .run_prompt(request(json!({
            "1": {"class_type": "LoadVideo", "inputs": {"file": "clip.mp4"}},
            "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 2]}},
        })))
        .await
        .expect("the prompt runs");
    assert_eq!(run.history.status.status_str, types::HistoryStatusStr::Success);
    assert_eq!(run.history.outputs["3"].text, ["8.0"]);
}
