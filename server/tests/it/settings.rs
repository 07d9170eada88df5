//! Settings written by many requests at once: every write is accepted and every key kept.

use crate::binary::{get_json, start, temp_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_written_at_once_keep_every_key() {
    let data_dir = temp_dir("openapi-settings");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let writes = (0..40).map(|i| {
        let http = http.clone();
        let url = format!("http://{addr}/api/settings");
        async move {
            let body = serde_json::json!({ format!("Kiln.Key{i}"): i });
            http.post(url).body(body.to_string()).send().await.expect("answers").status().as_u16()
        }
    });
    let statuses = futures::future::join_all(writes).await;
    assert!(statuses.iter().all(|s| *s == 200), "every write is accepted: {statuses:?}");
    let settings = get_json(&http, &addr, "/api/settings").await;
    for i in 0..40 {
        assert_eq!(settings[format!("Kiln.Key{i}")], i, "Kiln.Key{i} survived the other writes");
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}
