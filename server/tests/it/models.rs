//! Model folders on the real binary: ComfyUI's folder list.
//! See: issue 9, item 5.

use crate::binary::{start_with, temp_dir};
use crate::golden::golden;

async fn get(http: &reqwest::Client, addr: &str, path: &str) -> (u16, String) {
    let response = http.get(format!("http://{addr}{path}")).send().await.expect("kiln answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_9_models_lists_comfyuis_folders_in_its_order() {
    let data_dir = temp_dir("model-folders");
    let (_server, addr) = start_with(&data_dir, &[]);
    let (status, body) = get(&reqwest::Client::new(), &addr, "/models").await;
    assert_eq!(status, 200);
    let recorded = &golden("get_models")["response"]["body"]["json"];
    assert_eq!(recorded.as_array().map(Vec::len), Some(27));
    // The same names in the same order, byte for byte (Kiln writes JSON without spaces).
    assert_eq!(body, recorded.to_string());
    let _ = std::fs::remove_dir_all(&data_dir);
}
